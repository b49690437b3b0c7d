"""EntryLogger: append-only entry log files, rotation, reads by location, scan, ledgers map.

Threads: add_entries(), flush() and close() run on the flush thread only (one
writer); read_entry(), read_run(), scan(), ledgers_map(), log_ids() run on any
thread. Records are written to the file (pwrite) as soon as they are appended,
so readers see them through the page cache before flush() makes them durable.

Writing a batch: the kernel checks sizes, frames at most _FRAME_MAX_BYTES at a
time (small entries copied into one buffer; a batch of big ones written as
size field + entry buffers with pwritev, no copy) and counts per-ledger bytes
in runs, so add_entries takes no Python step per entry.

Invariants:
- `_written_end` is the end of the last whole record of the current log; readers
  never look past it (a write in progress or a failed one is invisible to them).
- Only the current log is ever appended to. A log found at start without a ledgers
  map (not closed: crash) stays as it is, readable by location and by scan.
- Log ids are unique across all ledger dirs; a new log takes highest + 1.
- A log whose fsync failed is never written or fsynced again (fsyncgate,
  docs/DISK-FAULTS.md): what it got since its last good fsync may be gone, and a
  later fsync that succeeds would not prove otherwise. It is abandoned and the next
  add_entries opens a new log. Nothing indexed points into its unsynced part: the
  index is committed only after flush() returned, in the transaction the failure
  aborted, so the caller (the checkpoint) writes the same entries again, from
  memory, into the new log. Its older records (fsynced before) stay readable.
"""
from __future__ import annotations

import bisect
import logging
import os
import threading
from typing import Callable, NamedTuple, Sequence

from bk._native import load as load_kernel
from bk.config import BookieConfig
from bk.formats import entrylog as fmt
from bk.entrylog import reads, spans
from bk.entrylog.files import SCAN_CLEAN, SCAN_REASONS, LogScan, ReadFiles, read_error
from bk.entrylog.usage import EntryLogMetadata
from bk.errors import ConfigError, CorruptedStorageError, StorageError, SyncFailedError
from bk import fileio
from bk.fileio import IOV_MAX, DiskUsage, DurableFile, disk_space, ensure_dir, remove_file

log = logging.getLogger("bk.entrylog")

_FADV_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", None)
_READ_GUESS_BYTES = 4096  # first pread of read_entry: size + ids + most small entries
_RECORD_SIZES_MAX = 4096  # ledgers whose last record size read_entry remembers (cleared beyond)
_FRAME_MAX_BYTES = 8 * 1024 * 1024  # add_entries frames at most this much at a time
_F = fmt.LOG_SIZE_FIELD_BYTES  # the record size field before every entry
SPLIT_MIN_ENTRY_BYTES = 16 * 1024  # from this average entry size a batch is written without copying
# The fdatasync step while the checkpoint is behind (`behind()`): bigger groups get more
# of the disk (this VM's disk: 361 MB/s of write + fdatasync in 256 KiB groups, 705 in
# 1 MiB, 718 in 2 MiB, 666 in 4 MiB).
BEHIND_FLUSH_BYTES = 2 * 1024 * 1024


def _never() -> bool:
    return False


def _dir_space(path: str) -> DiskUsage:
    """Disk space of the filesystem holding `path` (tests replace this function)."""
    return disk_space(path)


class _LogInfo(NamedTuple):
    records_end: int  # records live in [HEADER_BYTES, records_end)
    map_offset: int  # 0: no ledgers map (open, or never closed)
    map_count: int


class EntryLogger:
    def __init__(self, ledger_dirs: Sequence[str], config: BookieConfig, *, first_log_id: int = 0):
        """`first_log_id`: the lowest id a new log may take (one past the highest log the index
        names, bk.bookie.log_check: a log lost with its directory must not be reborn)."""
        if not ledger_dirs:
            raise ConfigError("EntryLogger needs at least one ledger dir")
        if config.entry_log_size_limit_bytes > fmt.MAX_OFFSET:
            raise ConfigError(
                f"bad value for 'entry_log_size_limit_bytes': {config.entry_log_size_limit_bytes} "
                f"(must be below 4GiB: a location keeps the offset in 32 bits)")
        self._config = config
        self._ledger_dirs = [str(d) for d in ledger_dirs]
        self._limit_bytes = config.entry_log_size_limit_bytes
        # The steps only keep journal fsyncs on the same disk short; with the journal off
        # (BP-46) no add waits on an fsync, and the steps only cost big-entry throughput.
        self._flush_bytes = config.entry_log_flush_bytes if config.journal_write_data else 0
        self._drop_pages = config.entry_log_remove_pages_from_cache
        # frames no bigger than the flush step, so a step is one write + one fdatasync
        self._frame_max = min(_FRAME_MAX_BYTES, self._flush_bytes) if self._flush_bytes else _FRAME_MAX_BYTES
        self._behind_flush_bytes = max(self._flush_bytes, BEHIND_FLUSH_BYTES)
        # Set by the owner of the checkpoint (LedgerStorage): True while the writes are
        # falling behind the adds, then the steps grow to BEHIND_FLUSH_BYTES. Small steps
        # keep journal fsyncs short when there is slack; when there is none, the adds
        # are about to wait for the write cache, which is far worse than a slower fsync.
        self.behind: Callable[[], bool] = _never
        self.max_entry_bytes = config.max_frame_size_bytes
        self._kernel = load_kernel("entrylog")
        # ledger id -> bytes of its last record read (size prefix included): read_entry's
        # guess, and how much a read-ahead of n records reads (record_bytes). Any thread; a
        # stale or lost guess costs one more pread, a few bytes more or a shorter read-ahead.
        self._record_sizes: dict[int, int] = {}
        self._lock = threading.Lock()  # guards _paths, _info, _current_usage, current_log_id
        self._paths: dict[int, str] = {}
        self._info: dict[int, _LogInfo] = {}  # filled lazily for non-current logs
        self._unsynced: list[tuple[int, DurableFile]] = []  # abandoned logs still to fsync
        self._closed = False
        for d in self._ledger_dirs:
            ensure_dir(fmt.log_dir(d))
            for name in os.listdir(fmt.log_dir(d)):
                log_id = fmt.parse_log_file_name(name)
                if log_id is None:
                    continue
                path = os.path.join(fmt.log_dir(d), name)
                if log_id in self._paths:
                    raise CorruptedStorageError(
                        f"entry log {log_id:x} exists twice: {self._paths[log_id]} and {path}", path=path)
                self._paths[log_id] = path
        # Ids only grow within a process, even if GC deletes the highest log: a
        # stale location must never name a reused log id. Across restarts the caller
        # says which ids the index still names (a wiped ledger dir took their files).
        self._next_log_id = max(max(self._paths, default=-1) + 1, first_log_id)
        self._files = ReadFiles(self._path_of)
        # BATCH_READ answers of cold records are read by O_DIRECT into these (read_span)
        self._direct_buffers = spans.DirectBuffers(config.max_frame_size_bytes + 2 * spans.DIRECT_ALIGN,
                                                   2 * config.num_read_worker_threads)
        self.current_log_id: int | None = None
        self._current: DurableFile | None = None
        self._current_usage: dict[int, int] = {}
        self._written_end = 0
        self.rotations = 0  # logs closed because the next record passed entry_log_size_limit_bytes
        self._open_new_log()

    # ------------------------------------------------------------ writing
    @property
    def frame_bytes(self) -> int:
        """The most add_entries writes at once (the fdatasync step when the journal is on)."""
        return self._frame_max

    record_overhead_bytes = _F  # what a record adds to its entry: the size field

    def add_entries(self, entries: list) -> list[int]:
        """Append entries (each `ledger_id | entry_id | ...`); returns their locations.

        Validates every entry before writing any. Rotates to a new log whenever
        the next record would take the current one past entry_log_size_limit_bytes
        (a record bigger than the limit gets a log of its own). Frames at most
        _FRAME_MAX_BYTES at a time (bounded extra memory; the kernel copies big
        frames without holding the GIL); batches of big entries are not copied.
        """
        if self._closed:
            raise StorageError("entry logger is closed")
        if not entries:
            return []
        if type(entries) is not list:
            entries = list(entries)
        kernel = self._kernel
        total, bad = kernel.check_sizes(entries, fmt.LOG_MIN_ENTRY_BYTES, self.max_entry_bytes)
        if bad >= 0:
            raise ValueError(f"entry {bad} of the batch is {len(entries[bad])} bytes; entries must be "
                             f"{fmt.LOG_MIN_ENTRY_BYTES}..{self.max_entry_bytes} bytes (max_frame_size_bytes)")
        # Big entries are not copied into a frame: each record goes out as its size
        # field and the entry itself, two buffers of one pwritev.
        split = total >= SPLIT_MIN_ENTRY_BYTES * len(entries)
        out: list[int] = []
        start, n = 0, len(entries)
        while start < n:
            if self._current is None:
                self._open_new_log()
            # Fold the log id into the base, so the kernel's offsets are locations.
            base = (self.current_log_id << 32) | self._written_end
            if split:
                heads, locs, stop = kernel.record_headers(entries, start, base, self._frame_max)
                heads = memoryview(heads)
                data: list | memoryview = []
                for j in range(stop - start):
                    data += (heads[_F * j:_F * (j + 1)], entries[start + j])
                nbytes = len(heads) + sum(map(len, entries[start:stop]))
            else:
                frame, locs, stop = kernel.frame_slice(entries, start, base, self._frame_max)
                data, nbytes = memoryview(frame), len(frame)
            self._add_framed(entries, start, data, nbytes, locs, out)
            start = stop
        return out

    def _add_framed(self, entries: list, start: int, data, nbytes: int, locs: list[int], out: list[int]) -> None:
        """Write the records of entries[start:start + len(locs)], framed at `locs` in
        the current log, rotating where the size limit falls; appends the final
        locations to `out`. `data` is the framed bytes (a memoryview of `nbytes`), or
        a list of two buffers per record (size field, entry)."""
        split = type(data) is list
        i, n = start, start + len(locs)
        while True:
            log_base = self.current_log_id << 32
            limit_loc = log_base + self._limit_bytes
            if locs[0] + nbytes <= limit_loc:
                k = len(locs)
            else:  # records 0..k-1 end at or before the limit
                k = bisect.bisect_right(locs, limit_loc, 1) - 1
                if k == 0 and self._written_end == fmt.LOG_HEADER_BYTES:
                    k = 1
            if k:
                if k == len(locs):
                    self._append(data, entries, i, n)
                    out += locs
                    return
                cut = locs[k] - locs[0]
                self._append(data[:2 * k] if split else data[:cut], entries, i, i + k)
                out += locs[:k]
                data = data[2 * k:] if split else data[cut:]
                nbytes, locs, i = nbytes - cut, locs[k:], i + k
            if i == n:
                return
            self._rotate()
            shift = ((self.current_log_id << 32) | self._written_end) - locs[0]
            locs = [x + shift for x in locs]

    def _append(self, data, entries: list, start: int, stop: int) -> None:
        """Write one run of whole records (`data`: entries[start:stop] framed, as one
        buffer or a list of buffers) to the current log, then account them in its
        ledgers map."""
        f = self._current
        try:
            if type(data) is list:
                for j in range(0, len(data), IOV_MAX):  # pwritev takes at most IOV_MAX buffers
                    f.writev(data[j:j + IOV_MAX])
            else:
                f.write(data)
        except StorageError:
            self._abandon_current()
            raise
        # Per-ledger bytes from runs of equal ledger ids (batches come sorted by
        # ledger, so this is a few runs, counted by the kernel).
        usage = self._kernel.ledger_runs(entries, start, stop)
        with self._lock:
            cur = self._current_usage
            for lid, nbytes in usage:
                cur[lid] = cur.get(lid, 0) + nbytes
            self._written_end = f.size
        unsynced = f.size - f.synced_size
        if self._flush_bytes and unsynced >= self._flush_bytes and (
                unsynced >= self._behind_flush_bytes or not self.behind()):
            # in steps, so the disk never queues a whole checkpoint at once (a journal
            # fsync on the same disk waits behind it); a failure is flush()'s failure
            try:
                f.fsync()
            except SyncFailedError:
                self._abandon_current(poisoned=True)
                raise
            if self._drop_pages:
                f.drop_synced_pages()

    def flush(self) -> None:
        """Make everything appended so far durable (write + fdatasync)."""
        if self._closed:
            raise StorageError("entry logger is closed")
        while self._unsynced:
            log_id, f = self._unsynced[0]
            try:
                f.fsync()
            except SyncFailedError:  # poisoned: never fsynced again (module docstring)
                with self._lock:
                    self._unsynced.pop(0)
                f.close()
                log.error("entry log %s: fsync failed; abandoned for good", f.path)
                raise
            f.close()
            with self._lock:
                self._unsynced.pop(0)
        if self._current is not None:
            try:
                self._current.fsync()
            except SyncFailedError:
                self._abandon_current(poisoned=True)
                raise
            if self._drop_pages:
                self._current.drop_synced_pages()

    def _rotate(self) -> None:
        self._close_current()
        self._open_new_log()
        self.rotations += 1

    def _open_new_log(self) -> None:
        log_id = self._next_log_id
        if log_id > fmt.MAX_LOG_ID:
            raise StorageError(f"entry log ids are exhausted (highest is {log_id - 1:x})")
        d = self._pick_dir()
        path = os.path.join(fmt.log_dir(d), fmt.log_file_name(log_id))
        f = None
        try:
            f = DurableFile(path, create=True)
            f.write(fmt.encode_header(log_id))
        except StorageError:
            if f is not None:
                f.close()
            # the id is used up even when its file could not be removed: a retry must
            # not meet its own leftover (O_EXCL) and fail for ever
            self._next_log_id = log_id + 1
            if os.path.exists(path):
                try:
                    remove_file(path)
                except (OSError, StorageError) as e:
                    log.warning("could not remove the unfinished entry log %s: %s", path, e)
            raise
        with self._lock:
            self._next_log_id = log_id + 1
            self._paths[log_id] = path
            self._info.pop(log_id, None)
            self._current = f
            self._current_usage = {}
            self._written_end = f.size
            self.current_log_id = log_id
        log.info("new entry log %s", path)

    def _pick_dir(self) -> str:
        """The ledger dir with the most free space among those under the usage threshold.

        When every dir is over the threshold the one with the most free space is
        still used (with a warning): data already acknowledged through the journal
        must reach the entry log even on a read-only bookie.
        """
        space = [(_dir_space(fmt.log_dir(d)), d) for d in self._ledger_dirs]
        ok = [(s.free_bytes, d) for s, d in space if s.usage <= self._config.disk_usage_threshold]
        if ok:
            return max(ok, key=lambda t: t[0])[1]
        log.warning("all ledger dirs are over disk_usage_threshold=%s; new entry log on the emptiest",
                    self._config.disk_usage_threshold)
        return max(space, key=lambda t: t[0].free_bytes)[1]

    def _close_current(self) -> None:
        """Close the current log: ledgers map + CRC appended, header updated, fsynced."""
        f, log_id = self._current, self.current_log_id
        if f is None:
            return
        records_end = self._written_end
        with self._lock:
            usage = dict(self._current_usage)
            # From here readers see it as a closed log whose map is not readable yet.
            self._info[log_id] = _LogInfo(records_end, 0, 0)
            self._current = None
        map_offset = 0
        try:
            f.write(fmt.encode_ledgers_map(usage))
            f.pwrite_at(fmt.encode_map_fields(records_end, len(usage)), fmt.header_map_fields_offset())
            map_offset = records_end
        except StorageError as e:  # keep the records; the log just has no map (scan fallback)
            log.warning("could not write the ledgers map of %s: %s", f.path, e)
            self._truncate_quietly(f, records_end)
        try:
            f.fsync()
        except SyncFailedError:
            # poisoned: never fsynced again, and its ledgers map cannot be trusted either
            # (it was written after the last good fsync): readers scan it like a crashed log
            f.close()
            log.error("entry log %s: fsync at close failed; abandoned for good", f.path)
            raise
        except StorageError:
            with self._lock:
                self._unsynced.append((log_id, f))
            raise
        f.close()
        with self._lock:
            self._info[log_id] = _LogInfo(records_end, map_offset, len(usage) if map_offset else 0)

    def _abandon_current(self, poisoned: bool = False) -> None:
        """After a failed write: cut the partial record, keep the log unclosed, and let
        the next add_entries start a new log (possibly in another dir). After a failed
        fsync (`poisoned`) the log is only closed: no fsync is owed to it any more,
        none could prove anything (module docstring)."""
        f, log_id = self._current, self.current_log_id
        if not poisoned:
            self._truncate_quietly(f, self._written_end)
        with self._lock:
            self._info[log_id] = _LogInfo(self._written_end, 0, 0)
            self._current = None
            if not poisoned:
                self._unsynced.append((log_id, f))  # flush() still owes these records an fsync
        if poisoned:
            f.close()
        log.error("entry log %s abandoned after a failed %s", f.path, "fsync" if poisoned else "write")

    @staticmethod
    def _truncate_quietly(f: DurableFile, size: int) -> None:
        try:
            os.ftruncate(f.fd, size)
            f.size = size
        except OSError as e:
            log.warning("could not truncate %s to %d: %s", f.path, size, e.strerror)

    # ------------------------------------------------------------ reading
    def read_entry(self, ledger_id: int, entry_id: int, location: int) -> bytes:
        """The entry at `location`, checked to be (ledger_id, entry_id).

        Any mismatch (ids, size out of range, short file, missing log) is
        CorruptedStorageError: the index said the entry is there.
        """
        return reads.drive(self.entry_steps(ledger_id, entry_id, location), self.pread)

    def entry_steps(self, ledger_id: int, entry_id: int, location: int) -> reads.Steps:
        """read_entry as steps (bk.entrylog.reads): yields its preads, returns the entry."""
        log_id, offset = fmt.split_location(location)
        h = self._files.acquire(log_id)
        try:
            if offset < fmt.LOG_HEADER_BYTES:
                raise CorruptedStorageError(f"location {location:#x} points into the header of {h.path}",
                                            path=h.path, offset=offset, ledger_id=ledger_id, entry_id=entry_id)
            # One pread for the whole record when the ledger's last record had its size: with
            # no kernel readahead (ReadFiles), a second pread is a second trip to the disk.
            buf = yield reads.Pread(h, max(self._record_sizes.get(ledger_id, 0), _READ_GUESS_BYTES), offset)
            size = self._check_entry_record(h.path, offset, buf, ledger_id, entry_id)
            need = fmt.LOG_SIZE_FIELD_BYTES + size
            self._remember_size(ledger_id, need)
            if len(buf) >= need:
                return buf[fmt.LOG_SIZE_FIELD_BYTES:need]
            rest = yield reads.Pread(h, need - len(buf), offset + len(buf))
            if len(buf) + len(rest) < need:
                raise CorruptedStorageError(f"{h.path}@{offset}: record of {size} bytes is cut short",
                                            path=h.path, offset=offset, ledger_id=ledger_id, entry_id=entry_id)
            return b"".join((buf[fmt.LOG_SIZE_FIELD_BYTES:], rest))
        finally:
            self._files.release(h)

    def read_run(self, location: int, max_count: int, max_bytes: int,
                 hint_bytes: int = 0) -> list[tuple[int, int, bytes, int]]:
        """Up to max_count whole records from `location` on, within about max_bytes
        (at least one record): [(ledger_id, entry_id, entry, location)]. For read-ahead.
        Entries are read-only views of the one bytes buffer read (no copy): they keep it all
        alive, so a caller keeping only a few of them long should copy those.
        `hint_bytes`: also ask the kernel for the log's next bytes, in blocks of that
        size (a scan's next read-aheads, see _hint); only a hint, never an error."""
        if max_count <= 0:
            return []
        log_id, offset = fmt.split_location(location)
        end = self._records_end(log_id)
        if offset >= end:
            return []
        h = self._files.acquire(log_id)
        try:
            buf = self.pread(h, min(max(max_bytes, _READ_GUESS_BYTES), end - offset), offset)
            if hint_bytes > 0:
                self._hint(h, offset + len(buf), hint_bytes, end)
            records, stop, status = self._kernel.scan_log(buf, 0, len(buf), self.max_entry_bytes)
            if not records:
                size, _, _ = self._check_record(h.path, offset, buf)  # raises on a bad size / short head
                if fmt.LOG_SIZE_FIELD_BYTES + size <= end - offset:  # one record bigger than max_bytes
                    buf = self.pread(h, fmt.LOG_SIZE_FIELD_BYTES + size, offset)
                    records, stop, status = self._kernel.scan_log(buf, 0, len(buf), self.max_entry_bytes)
                if not records:
                    raise CorruptedStorageError(f"{h.path}@{offset}: record of {size} bytes is cut short",
                                                path=h.path, offset=offset)
        finally:
            self._files.release(h)
        out = []
        used = 0
        mv = memoryview(buf)  # buf is bytes: the views are read-only
        for off, size, lid, eid in records[:max_count]:
            if out and used + size > max_bytes:
                break
            used += size
            out.append((lid, eid, mv[off + _F:off + _F + size], location + off))
        self._remember_size(out[0][0], fmt.LOG_SIZE_FIELD_BYTES + len(out[0][2]))
        return out

    def read_span(self, ledger_id: int, entry_id: int, locations: list, max_bytes: int,
                  hint_bytes: int = 0):
        """A BATCH_READ answer's entries as the log lays them out (bk.entrylog.spans.read_span)."""
        return spans.read_span(self, ledger_id, entry_id, locations, max_bytes, hint_bytes)

    def record_bytes(self, ledger_id: int) -> int | None:
        """The size of the ledger's last record read (size prefix included), if remembered:
        a read-ahead of n records needs about n times this, not a whole max_bytes."""
        return self._record_sizes.get(ledger_id)

    def _remember_size(self, ledger_id: int, need: int) -> None:
        sizes = self._record_sizes
        if sizes.get(ledger_id) != need:
            if len(sizes) >= _RECORD_SIZES_MAX:
                sizes.clear()
            sizes[ledger_id] = need

    @staticmethod
    def _hint(h, after: int, hint_bytes: int, end: int) -> None:
        """Ask the kernel for the hint_bytes-aligned blocks after the next one past `after`
        (two of them): a block is asked for whole the first time, so the disk gets large
        requests; a block already cached or in flight costs a page-cache lookup."""
        start = (after // hint_bytes + 1) * hint_bytes
        stop = min(start + 2 * hint_bytes, end)
        if start >= stop or _FADV_WILLNEED is None:
            return
        # Each call costs a page-cache walk of the whole range (~27 us for 8 MiB, cached), so what
        # the previous hint of this file covered is not asked again: a scan's read-aheads inside
        # one block ask nothing, the first past it asks one new block. (Threads share the handle;
        # a race only repeats or skips a hint.)
        last_start, last_stop = h.hinted
        h.hinted = (start, stop)
        if last_start <= start < last_stop:
            start = max(start, last_stop)
            if start >= stop:
                return
        try:
            os.posix_fadvise(h.fd, start, stop - start, _FADV_WILLNEED)
        except OSError:
            pass  # a hint; the read that needs those bytes reports any real error

    def pread(self, h, n: int, offset: int) -> bytes:
        """n bytes of the held log h from offset (fewer at its end); StorageError on failure."""
        try:
            if fileio.faults is not None:
                fileio.check_read(h.path)
            return os.pread(h.fd, n, offset)
        except OSError as e:
            raise read_error(h.path, offset, e) from e

    @staticmethod
    def _file_size(h) -> int:
        try:
            return os.fstat(h.fd).st_size
        except OSError as e:
            raise StorageError(f"I/O error reading {h.path}: {e.strerror}") from e

    def _check_entry_record(self, path: str, offset: int, buf, ledger_id: int, entry_id: int) -> int:
        """The size of the record at offset whose head is buf's start, which must hold entry
        (ledger_id, entry_id): the index placed it there (CorruptedStorageError otherwise)."""
        size, lid, eid = self._check_record(path, offset, buf)
        if (lid, eid) != (ledger_id, entry_id):
            raise CorruptedStorageError(
                f"{path}@{offset}: record holds ledger {lid} entry {eid}, expected ledger {ledger_id} entry {entry_id}",
                path=path, offset=offset, ledger_id=ledger_id, entry_id=entry_id)
        return size

    def _check_record(self, path: str, offset: int, buf: bytes) -> tuple[int, int, int]:
        if len(buf) < fmt.LOG_SIZE_FIELD_BYTES + fmt.LOG_MIN_ENTRY_BYTES:
            raise CorruptedStorageError(f"{path}@{offset}: short read ({len(buf)} bytes) of a record head",
                                        path=path, offset=offset)
        size = fmt.LOG_SIZE_FIELD.unpack_from(buf)[0]
        if not fmt.LOG_MIN_ENTRY_BYTES <= size <= self.max_entry_bytes:
            raise CorruptedStorageError(f"{path}@{offset}: record size {size} out of range "
                                        f"{fmt.LOG_MIN_ENTRY_BYTES}..{self.max_entry_bytes}", path=path, offset=offset)
        lid, eid = fmt.entry_ids(memoryview(buf)[4:20])
        return size, lid, eid

    # ------------------------------------------------------------ logs
    def log_ids(self) -> list[int]:
        with self._lock:
            return sorted(self._paths)

    def log_path(self, log_id: int) -> str | None:
        return self._path_of(log_id)

    def scan(self, log_id: int, with_entries: bool = False) -> LogScan:
        """Iterate (ledger_id, entry_id, location, size[, entry]) over a log's records;
        the returned LogScan tells after the loop whether the data ended clean."""
        path = self._path_of(log_id)
        if path is None:
            raise StorageError(f"no entry log {log_id:x}")
        return LogScan(self._kernel, path, log_id, self._records_end(log_id), self.max_entry_bytes,
                       with_entries=with_entries)

    def closed_log_ids(self) -> list[int]:
        """Logs GC may look at: every log but the current one and those still owed an
        fsync (abandoned after a failed write). Nothing is ever appended to these."""
        with self._lock:
            busy = {log_id for log_id, _ in self._unsynced}
            if self._current is not None:
                busy.add(self.current_log_id)
            return sorted(log_id for log_id in self._paths if log_id not in busy)

    def log_file_bytes(self, log_id: int) -> int:
        """The log file's size on disk (0 when it is gone)."""
        path = self._path_of(log_id)
        try:
            return os.path.getsize(path) if path else 0
        except OSError:
            return 0

    def ledgers_map(self, log_id: int) -> dict[int, int]:
        """ledger id -> bytes of its records in the log (size fields included): the
        `ledgers` of log_metadata, which says too whether they are the whole log."""
        return self.log_metadata(log_id).ledgers

    def log_metadata(self, log_id: int) -> EntryLogMetadata:
        """The log's usage. The current log answers from memory ("memory"); a closed log
        from its stored map after checking its CRC ("map"); a log without a valid map
        (crash) by scanning it ("scan"). A scan that did not end clean (a bad size
        field, a torn tail) sets `damage`: the ledgers it lists are only those before
        that point, so they are not the log's contents (bk.bookie.gc never deletes or
        compacts such a log on them; it asks the index). So does a map the header names
        that fails its check: the scan then stops at the header's map offset, which is
        suspect too (a wrong header, apache/bookkeeper#4607), so even a clean end there
        may leave records unseen."""
        with self._lock:
            if log_id == self.current_log_id and self._current is not None:
                return EntryLogMetadata.from_ledgers_map(log_id, self._current_usage, "memory")
        path = self._path_of(log_id)
        if path is None:
            raise StorageError(f"no entry log {log_id:x}")
        info = self._log_info(log_id)
        stored, unusable = self._stored_map(log_id, info)
        if stored is not None:
            return EntryLogMetadata.from_ledgers_map(log_id, stored)
        if unusable:
            log.warning("ledgers map of %s is unusable (%s); scanning the log", path, unusable)
        usage: dict[int, int] = {}
        scan = self.scan(log_id)
        for lid, _, _, size in scan:
            usage[lid] = usage.get(lid, 0) + size + fmt.LOG_SIZE_FIELD_BYTES
        meta = EntryLogMetadata.from_ledgers_map(log_id, usage, "scan")
        if scan.status != SCAN_CLEAN:
            meta.damage = f"{SCAN_REASONS.get(scan.status, scan.status)} at offset {scan.stop_offset}"
        elif unusable:
            meta.damage = f"ledgers map unusable ({unusable}) at offset {info.map_offset}"
        if meta.damage:
            log.warning("scan of %s stopped: %s", path, meta.damage)
        return meta

    def map_unusable(self, log_id: int) -> str:
        """Why the ledgers map the closed log's header names fails its check ("" when it
        names none or the map is whole): then the log's records end is not known either
        (the scan stops at the header's offset), and compaction asks the index."""
        with self._lock:
            if log_id == self.current_log_id and self._current is not None:
                return ""
        return self._stored_map(log_id, self._log_info(log_id))[1]

    def _stored_map(self, log_id: int, info: _LogInfo) -> tuple[dict[int, int] | None, str]:
        """(the ledgers map the header names, "") or (None, why it is unusable), (None, "")
        when the header names none."""
        if not info.map_offset:
            return None, ""
        need = fmt.ledgers_map_bytes(info.map_count)
        h = self._files.acquire(log_id)
        try:
            # a count the file cannot hold is a corrupt header: never read (allocate) by it
            raw = self.pread(h, need, info.map_offset) if need <= self._file_size(h) - info.map_offset else b""
        finally:
            self._files.release(h)
        try:
            return fmt.decode_ledgers_map(raw, info.map_count), ""
        except ValueError as e:
            return None, str(e)

    def record_sizes(self, locations) -> list[int | None]:
        """The size field of the record at each location (entry bytes, as written), or
        None where it cannot be read or is out of range: what the index names in a log
        that cannot be scanned to its end."""
        return [self._record_head(location, None) for location in locations]

    def holds_entry(self, ledger_id: int, entry_id: int, location: int) -> bool:
        """Whether the record at `location` is whole and holds (ledger_id, entry_id): its
        size in range, its ids, and all its bytes inside the log's records. What a repair
        asks before it counts an entry as stored (the index saying so is not enough: a
        garbled record answers EIO for good). An unreadable record is not held."""
        size = self._record_head(location, (ledger_id, entry_id))
        if size is None:
            return False
        log_id, offset = fmt.split_location(location)
        try:
            return offset + fmt.LOG_SIZE_FIELD_BYTES + size <= self._records_end(log_id)
        except StorageError:
            return False

    def _record_head(self, location: int, ids: tuple[int, int] | None) -> int | None:
        """The size of the record at location, checked (and its ids, when given); None
        when it is missing, unreadable or fails a check."""
        log_id, offset = fmt.split_location(location)
        try:
            h = self._files.acquire(log_id)
        except StorageError:
            return None
        try:
            head = self.pread(h, fmt.LOG_SIZE_FIELD_BYTES + fmt.LOG_MIN_ENTRY_BYTES, offset)
            if ids is None:
                return self._check_record(h.path, offset, head)[0]
            return self._check_entry_record(h.path, offset, head, *ids)
        except StorageError:
            return None
        finally:
            self._files.release(h)

    def delete_log(self, log_id: int) -> bool:
        """Delete a log that is not the current one (GC). False if it did not exist."""
        with self._lock:
            if log_id == self.current_log_id:
                raise ValueError(f"entry log {log_id:x} is the current log")
            path = self._paths.pop(log_id, None)
            self._info.pop(log_id, None)
        if path is None:
            return False
        self._files.forget(log_id)
        remove_file(path)
        log.info("deleted entry log %s", path)
        return True

    def disk_usage(self) -> dict[str, DiskUsage]:
        return {d: _dir_space(fmt.log_dir(d)) for d in self._ledger_dirs}

    def close(self) -> None:
        """Close the current log properly (ledgers map) and every read fd."""
        if self._closed:
            return
        try:
            self.flush()
            self._close_current()
        finally:
            self._closed = True
            self._files.close()
            for _, f in self._unsynced:
                f.close()

    # ------------------------------------------------------------ internals
    def _path_of(self, log_id: int) -> str | None:
        with self._lock:
            return self._paths.get(log_id)

    def _records_end(self, log_id: int) -> int:
        with self._lock:
            if log_id == self.current_log_id and self._current is not None:
                return self._written_end
        return self._log_info(log_id).records_end

    def _log_info(self, log_id: int) -> _LogInfo:
        with self._lock:
            info = self._info.get(log_id)
            path = self._paths.get(log_id)
        if info is not None:
            return info
        if path is None:
            raise StorageError(f"no entry log {log_id:x}")
        try:
            with open(path, "rb") as fh:
                head = fh.read(fmt.LOG_HEADER_BYTES)
                file_size = os.fstat(fh.fileno()).st_size
        except OSError as e:
            raise StorageError(f"cannot read entry log {path}: {e.strerror}") from e
        try:
            header = fmt.decode_header(head)
        except fmt.HeaderError as e:
            log.warning("entry log %s has a bad header (%s); treating it as unclosed", path, e)
            header = fmt.LogHeader(log_id, 0, 0)
        if header.log_id != log_id:
            log.warning("entry log %s says it is log %x", path, header.log_id)
        if header.map_offset and header.map_offset <= file_size:
            info = _LogInfo(header.map_offset, header.map_offset, header.map_count)
        else:  # never closed: records run to the end of the file (possibly torn)
            info = _LogInfo(file_size, 0, 0)
        with self._lock:
            if log_id in self._paths and log_id != self.current_log_id:
                self._info.setdefault(log_id, info)
        return info
