"""Journal: one writer thread per journal directory, group commit, rotation, gc.

Threads. `log()` runs on the event loop (any thread works, but the loop is the
hot caller): it extends a flat list by `body, cb, ctx` (one atomic `extend`
under the GIL, no per-record tuple kept alive for the cyclic GC to walk) and,
only when the writer is parked waiting for work, sets an Event to wake it. No
lock, no Condition notify per record. Only the writer removes from the queue,
and only a prefix of whole records (`del q[:k]`), while log() only appends, so
the two never race. `log_many()` queues a whole run of records (the bookie's
add batch) with one extend and ONE completion, on the run's last record. The
writer thread owns the open file and everything else.

Group commit (STORAGE.md). The writer drains the queue into a group and keeps
draining until the group holds `journal_buffered_writes_threshold_bytes` (a deep
queue is taken in threshold-sized groups, so a group's buffer stays bounded),
or its oldest record has waited `journal_max_group_wait_ms`, or (with
`journal_flush_when_queue_empty`) the queue is empty. While it waits for the
group to fill it blocks on the Event until the deadline, and log() wakes it
early only when the queue holds what would fill the group (`_fill_len`, one
integer compare per record, no wake per record, no polling). Then: one write, one fdatasync (none when `journal_sync_data` is
false), and ONE `loop.call_soon_threadsafe` that runs every completion of the
group in order. Small records are framed into one buffer by the kernel; a
batch of big ones (SPLIT_MIN_BODY_BYTES on average) is written as each
record's 8-byte header and its body, separate pwritev buffers, so a body is
never copied in user space (same bytes on disk). Records that arrive during the fsync form the next group; their
wait is counted from the previous drain, so after a slow fsync the next group
is flushed at once (adaptive grouping, no per-record timestamps).

In place (format 2, the default; bk/journal/inplace.py): records framed with the
file's CRC seed, groups padded to `journal_alignment_size`, written into space zeroed
ahead; a rotated file ends with a durable FILE_END before the next file exists.

Failure (docs/DISK-FAULTS.md). A failed fsync, an I/O error on write or a failed
rotation fails the group's callbacks and puts the journal in a failed state: every
queued and later record fails with StorageError; nothing is acknowledged after an
I/O error (after a failed fsync the data it covered may be gone from the page cache,
so no later fsync could vouch for it: fsyncgate). A write that finds the disk full
(DiskFullError) fails only its group: the file is cut back to the group's start (no
partial record stays in front of later ones) and later groups are tried again.
`on_error(exc)` (set by the Bookie) is called from the writer thread on every
failure, so the bookie can turn read-only and say why.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from bk import metrics
from bk._native import load
from bk.config import BookieConfig
from bk.errors import BadRequestError, DiskFullError, StorageError
from bk.fileio import IOV_MAX, DurableFile, ensure_dir, remove_file
from bk.journal import inplace
from bk.journal.records import (
    FORMAT_V1,
    MIN_BODY_BYTES,
    LogMark,
    current_dir,
    encode_header,
    file_path,
    file_seed,
    list_files,
    max_record_bytes,
)
from bk.journal.replay import OnRecord, ReplayResult, replay_journal

logger = logging.getLogger(__name__)

Callback = Callable[[Any, BaseException | None], None]

SPLIT_MIN_BODY_BYTES = 16 * 1024  # from this average body size a batch is written without copying


FIELDS = 3  # a queued record is `body, cb, ctx`, flat in the queue and in a group's items
_BYTES_ONLY = {bytes}
# every length within bounds in one C pass (the entry-log kernel's generic size check)
_check_sizes = load("entrylog").check_sizes


def _no_completion(ctx, exc) -> None:
    """The callback of every record of a `log_many` run but its last (see log_many)."""


def _complete(items: list, exc: BaseException | None) -> None:
    """Run every completion of a group (flat `body, cb, ctx, ...`), in order; one bad
    callback does not stop the rest. Records without a completion of their own
    (inside a log_many run) are skipped without a call."""
    for cb, ctx in zip(items[1::FIELDS], items[2::FIELDS]):
        if cb is _no_completion:
            continue
        try:
            cb(ctx, exc)
        except Exception:  # noqa: BLE001 - a callback's bug must not lose other acks
            logger.exception("journal completion callback %r failed", cb)


class Journal:
    """The bookie's write-ahead journal for one journal directory (see module docstring)."""

    def __init__(self, journal_dir: str, config: BookieConfig, *, loop=None, index: int = 0):
        self.journal_dir = journal_dir
        self.index = index
        self._loop = loop
        self._sync_data = config.journal_sync_data
        self._max_wait_s = config.journal_max_group_wait_ms / 1000.0
        self._threshold_bytes = max(1, config.journal_buffered_writes_threshold_bytes)
        self._flush_when_empty = config.journal_flush_when_queue_empty
        self._drop_pages = config.journal_remove_pages_from_cache and config.journal_sync_data
        self._max_file_bytes = config.journal_max_size_bytes
        self._max_record_bytes = max_record_bytes(config)
        self._kernel = load("journal")
        self._frame = self._kernel.frame_records
        self._version = config.journal_format_version_to_write
        self._alignment = config.journal_alignment_size
        # a step is at most the file size limit: small files do not zero 16 MiB each
        self._prealloc_bytes = min(config.journal_pre_alloc_size_mb * 1024 * 1024,
                                   -(-config.journal_max_size_bytes // self._alignment) * self._alignment)
        self._reuse_files = config.journal_reuse_files
        self._seed = 0  # the current file's CRC seed (0 in format 1)
        self._alloc_end = 0  # format 2: the current file is zeroed and durable up to here

        self._queue: list = []  # flat: body, cb, ctx, body, cb, ctx, ...
        # Records the writer took from the queue (counted BEFORE taking them) and records
        # it has written or failed: wait_written's barrier (writer thread writes both).
        self._taken = 0
        self._processed = 0
        self._idle = False  # the writer is parked on _wake; log() must set it
        self._wake = threading.Event()
        # while the writer waits for a group to fill: wake it once the queue is this long
        # (0: it is not waiting for that); written by both threads under the GIL
        self._fill_len = 0
        self._stopping = False
        # log() fails at once when this is set (journal failed, stopped or not started)
        self._reject: BaseException | None = StorageError(f"journal {journal_dir} is not started")

        self._file: DurableFile | None = None
        self._file_id = 0
        self._mark = LogMark(0, 0)
        self._min_next_file_id = 1  # raised by replay so new files sort after the replayed ones
        self._thread: threading.Thread | None = None
        self._failed: BaseException | None = None
        self.on_error: Callable[[StorageError], None] | None = None  # writer thread; see the docstring
        # counters for benchmarks and monitoring (writer thread writes, anyone reads)
        self.groups_written = 0
        self.rotations = 0  # files closed because they reached journal_max_size_bytes
        self.records_written = 0
        self.bytes_written = 0

    # ------------------------------------------------------------------ public API
    def replay(self, mark: LogMark, on_record: OnRecord) -> ReplayResult:
        """Replay records at or after `mark` (before start()); see bk.journal.replay."""
        if self._thread is not None:
            raise RuntimeError("Journal.replay() must run before start()")
        result = replay_journal(self.journal_dir, LogMark(*mark), on_record,
                                kernel=self._kernel, max_record_bytes=self._max_record_bytes)
        self._min_next_file_id = max(self._min_next_file_id, result.end_mark.file_id + 1)
        self._mark = result.end_mark
        return result

    def start(self) -> None:
        """Open a new journal file (highest existing id + 1) and start the writer thread."""
        if self._thread is not None or self._stopping:
            raise RuntimeError("Journal already started (a stopped Journal is not restarted: make a new one)")
        ensure_dir(current_dir(self.journal_dir))
        existing = list_files(self.journal_dir)
        next_id = max(self._min_next_file_id, existing[-1][0] + 1 if existing else 1)
        self._open_file(next_id)
        self._reject = None
        self._thread = threading.Thread(target=self._run, name=f"bk-journal-{self.index}", daemon=True)
        self._thread.start()

    def log(self, body, cb: Callback, ctx: Any) -> None:
        """Queue one record; cb(ctx, None) once its group is durable, cb(ctx, exc) on failure."""
        # hot path (once per add on the loop): one check, one list extend, and a
        # wakeup only when the writer is parked
        if self._reject is None and MIN_BODY_BYTES <= len(body) <= self._max_record_bytes:
            queue = self._queue
            queue.extend((body, cb, ctx))
            if self._idle or (self._fill_len and len(queue) >= self._fill_len):
                self._wake_writer()
            return
        self._log_rejected(body, cb, ctx)

    def log_many(self, bodies: list, cb: Callback, ctx: Any) -> None:
        """Queue a run of records, in order, with ONE completion: cb(ctx, None) once the
        group holding the LAST record is durable, cb(ctx, exc) if any record of the run fails.

        Why one completion is enough: groups are written and fsynced in queue order,
        so when the last record's group is durable every earlier record is too; and
        a write/fsync error puts the journal in its failed state, which fails every
        later record, the last one included. The other records carry
        `_no_completion`. `bodies` must be `bytes` (the framing kernel reads any
        bytes object, so no record of the run can be failed alone, which would go
        unreported); a run with a body of another type or a bad size raises
        BadRequestError and queues nothing.
        """
        n = len(bodies)
        if not n:
            raise BadRequestError("log_many needs at least one record")
        if set(map(type, bodies)) != _BYTES_ONLY:
            raise BadRequestError("log_many record bodies must be bytes")
        _total, bad = _check_sizes(bodies if type(bodies) is list else list(bodies),
                                   MIN_BODY_BYTES, self._max_record_bytes)
        if bad >= 0:
            raise BadRequestError(
                f"journal record body {bad} of the run is {len(bodies[bad])} bytes; each must hold ledger and "
                f"entry ids ({MIN_BODY_BYTES} bytes) and be at most {self._max_record_bytes} bytes")
        if self._reject is not None:
            self._fail_now(cb, ctx, self._reject)
            return
        flat = [None, _no_completion, None] * n
        flat[0::FIELDS] = bodies
        flat[-2] = cb
        flat[-1] = ctx
        queue = self._queue
        queue.extend(flat)  # one atomic extend: the writer sees whole records only
        if self._idle or (self._fill_len and len(queue) >= self._fill_len):
            self._wake_writer()

    def _wake_writer(self) -> None:
        """The writer is parked (idle) or waits for a group that the queue now fills."""
        self._idle = False
        self._fill_len = 0
        self._wake.set()

    def _log_rejected(self, body, cb: Callback, ctx: Any) -> None:
        n = len(body)
        if n < MIN_BODY_BYTES or n > self._max_record_bytes:
            raise BadRequestError(
                f"journal record body is {n} bytes; it must hold ledger and entry ids "
                f"({MIN_BODY_BYTES} bytes) and be at most {self._max_record_bytes} bytes")
        self._fail_now(cb, ctx, self._reject)

    def queued_records(self) -> int:
        """Records waiting for the writer (a racy read, for monitoring)."""
        return len(self._queue) // FIELDS

    def wait_written(self, timeout_s: float) -> bool:
        """Block (any thread but the loop's) until every record queued before this call
        has been written (the mark lies after it) or failed; False on timeout. A ledger
        deleted locally waits for this before its checkpoint: a checkpoint whose mark
        were read before the ledger's master-key record was written would leave that
        record to be replayed after a crash, bringing the deleted ledger back."""
        # The queue first, then _taken: the writer counts _taken up before it empties the
        # queue, so a batch taken in between is counted once or twice, never missed.
        queued = len(self._queue) // FIELDS
        target = self._taken + queued
        deadline = time.monotonic() + timeout_s
        while self._processed < target and self._failed is None:
            if not self._queue:
                # Every record queued before the call is taken, so counted in _taken by now:
                # a batch counted twice above must not keep a quiet journal waiting.
                target = min(target, self._taken)
                if self._processed >= target:
                    break
            thread = self._thread
            if thread is None or not thread.is_alive():
                return self._processed >= target
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.0005)
        return True

    def last_mark(self) -> LogMark:
        """Position just after the last record handed to write()."""
        return self._mark

    def gc(self, mark: LogMark) -> int:
        """Delete journal files wholly behind `mark` (id < mark.file_id); returns how many."""
        keep_from = min(mark.file_id, self._file_id) if self._file is not None else mark.file_id
        removed = 0
        for file_id, path in list_files(self.journal_dir):
            if file_id >= keep_from:
                break
            if self._reuse_files and self._version != FORMAT_V1:
                inplace.retire(self.journal_dir, path, file_id)
            else:
                remove_file(path)
            removed += 1
        return removed

    def stop(self) -> None:
        """Write and fsync everything queued, close the file, join the writer thread."""
        thread = self._thread
        if thread is None:
            return
        if self._reject is None:
            self._reject = StorageError(f"journal {self.journal_dir} is stopped")
        self._stopping = True
        self._wake.set()
        thread.join()
        self._thread = None
        # a log() that raced with stop() may have queued after the writer's last drain
        self._fail_queued(self._reject)
        if self._file is not None:
            if self._version != FORMAT_V1 and self._failed is None:
                inplace.close_cleanly(self._file, self._frame, self._seed)
            self._file.close()
            self._file = None

    @property
    def failed(self) -> BaseException | None:
        """The I/O error that stopped the journal, if any."""
        return self._failed

    @property
    def current_file_id(self) -> int:
        return self._file_id

    # ------------------------------------------------------------------ writer thread
    def _run(self) -> None:
        queue = self._queue
        frame = self._frame
        monotonic = time.monotonic
        wake = self._wake
        max_wait_s = self._max_wait_s
        threshold = self._threshold_bytes
        flush_when_empty = self._flush_when_empty
        oldest = monotonic()  # estimate of when the oldest queued record arrived
        avg_bytes = 9  # recent framed bytes per record: with the head record's size, sizes batches
        while True:
            if not queue:
                if self._stopping:
                    return
                if self._alloc_end and self._failed is None and self._zero_ahead():
                    continue  # records may have come while it zeroed: look again before parking
                self._wake.clear()
                self._idle = True
                if not queue and not self._stopping:  # re-check: a log() may have raced
                    self._wake.wait()
                self._idle = False
                oldest = monotonic()
                continue
            if self._failed is not None:
                self._fail_queued(self._failed)
                continue
            items: list = []
            buffers: list = []
            group_bytes = 0
            deadline = oldest + max_wait_s
            while True:
                n = len(queue) // FIELDS
                if n:
                    # take what fits the threshold (by the recent record size), not the
                    # whole queue: bounds the group buffer when a deep queue of big records waits
                    head = len(queue[0]) + 8
                    fit = (threshold - group_bytes) // (head if head > avg_bytes else avg_bytes) + 1
                    k = FIELDS * (n if n < fit else fit)
                    self._taken += k // FIELDS  # before the take: wait_written may over-count, never under
                    taken = queue[:k]
                    del queue[:k]
                    nbytes = self._frame_batch(taken, frame, buffers)
                    if taken:
                        avg_bytes = nbytes * FIELDS // len(taken) or 1
                    items += taken
                    group_bytes += nbytes
                    if queue and group_bytes < threshold:
                        continue  # more is queued: keep taking before any wait
                if group_bytes >= threshold or self._stopping:
                    break
                if flush_when_empty and not queue:
                    break
                now = monotonic()
                if now >= deadline:
                    break
                # Block until the deadline, or until log() sees the queue hold what
                # fills the group. Clear first, then publish _fill_len, then re-check
                # the queue: a record queued at any point either is seen here or
                # finds _fill_len set and wakes us.
                wake.clear()
                want = FIELDS * ((threshold - group_bytes) // avg_bytes + 1)
                self._fill_len = want
                if len(queue) < want and not self._stopping:
                    wake.wait(deadline - now)
                self._fill_len = 0
            group_oldest = oldest
            if not queue:
                # records queued from here on arrived after this drain; leftovers
                # (a full group left them behind) keep the older estimate
                oldest = monotonic()
            if items:
                self._write_group(items, buffers, group_bytes, group_oldest)
                self._processed += len(items) // FIELDS

    def _frame_batch(self, taken: list, frame, buffers: list) -> int:
        """Frame the bodies of `taken` (flat records) onto `buffers`; returns the bytes
        added. Small records are copied into one frame; big ones (SPLIT_MIN_BODY_BYTES
        on average) get only their headers built, and each header and body is its own
        buffer for pwritev: no copy of the body, no big fresh buffer to fault in.
        A record whose body the kernel cannot read is failed alone and removed from `taken`."""
        bodies = taken[0::FIELDS]
        try:
            if sum(map(len, bodies)) < SPLIT_MIN_BODY_BYTES * len(bodies):
                buf = frame(bodies, self._seed)
                buffers.append(buf)
                return len(buf)
            heads = memoryview(self._kernel.frame_headers(bodies, self._seed))
            nbytes = len(heads)
            for i, body in enumerate(bodies):
                buffers += (heads[8 * i:8 * i + 8], body)
                nbytes += len(body)
            return nbytes
        except (TypeError, ValueError, BufferError):
            pass
        good, parts = [], []
        for i in range(0, len(taken), FIELDS):
            record = taken[i:i + FIELDS]
            try:
                parts.append(frame([record[0]], self._seed))
                good += record
            except (TypeError, ValueError, BufferError) as e:
                self._deliver(record, BadRequestError(f"journal record body is not bytes-like: {e}"))
        taken[:] = good
        buf = b"".join(parts)
        if buf:
            buffers.append(buf)
        return len(buf)

    def _write_group(self, items: list, buffers: list, group_bytes: int, oldest: float = 0.0) -> None:
        if not group_bytes:  # every record of the group was rejected by _frame_batch
            return
        f = self._file
        group_start = f.size
        started = time.monotonic()
        try:
            if self._version != FORMAT_V1:  # padded to the alignment, into zeroed space
                buffers, self._alloc_end = inplace.prepare_group(
                    f, buffers, group_bytes, self._alignment, self._alloc_end, self._prealloc_bytes,
                    self._frame, self._seed)
            if len(buffers) == 1:
                f.write(buffers[0])
            else:
                for i in range(0, len(buffers), IOV_MAX):  # pwritev takes at most IOV_MAX buffers
                    f.writev(buffers[i:i + IOV_MAX])
            self._mark = LogMark(self._file_id, f.size)
            if self._sync_data:
                f.fsync()
                if self._drop_pages:  # replay reads the file again; nothing else does
                    f.drop_synced_pages()
        except StorageError as e:
            if not (isinstance(e, DiskFullError) and self._cut_back(f, group_start)):
                self._enter_failed(e)
            self._deliver(items, e)
            self._measure(started, oldest, len(items) // FIELDS, group_bytes, False)
            self._report(e)
            return
        except Exception as e:  # noqa: BLE001 - a bug below us must still fail, not hang, the adds
            err = StorageError(f"unexpected error writing journal file {f.path}: {e!r}")
            err.__cause__ = e
            self._enter_failed(err)
            self._deliver(items, err)
            self._measure(started, oldest, len(items) // FIELDS, group_bytes, False)
            self._report(err)
            return
        records = len(items) // FIELDS
        self.groups_written += 1
        self.records_written += records
        self.bytes_written += group_bytes
        self._deliver(items, None)
        self._measure(started, oldest, records, group_bytes, True)
        if f.size >= self._max_file_bytes:
            try:
                self._rotate()
            except DiskFullError as e:  # the old file stays current: rotation is tried after the next group
                logger.warning("journal %s: cannot rotate (%s); writing on in %s", self.journal_dir, e, f.path)
                self._report(e)
            except Exception as e:  # noqa: BLE001 - no file to write to: fail later records
                if not isinstance(e, StorageError):
                    e = StorageError(f"unexpected error rotating journal {self.journal_dir}: {e!r}")
                self._enter_failed(e)
                self._report(e)

    def _cut_back(self, f: DurableFile, size: int) -> bool:
        """After a write found the disk full: cut the file back to `size` (the group's
        start), so no partial record sits in front of later ones (replay would stop at
        it). True when the file is whole again and the journal can go on."""
        try:
            f.truncate(size)
        except StorageError as e:
            logger.error("journal %s: cannot cut %s back to %d after a full disk: %s",
                         self.journal_dir, f.path, size, e)
            return False
        self._alloc_end = min(self._alloc_end, size)
        self._mark = LogMark(self._file_id, size)
        return True

    def _report(self, exc: StorageError) -> None:
        on_error = self.on_error
        if on_error is not None:
            try:
                on_error(exc)
            except Exception:  # noqa: BLE001 - the listener's bug must not kill the writer
                logger.exception("journal on_error listener failed")

    def _zero_ahead(self) -> bool:
        """Idle: zero (and fsync) one piece ahead of the write position (format 2). True if it did."""
        end, self._alloc_end = self._alloc_end, inplace.zero_ahead(self._file, self._alloc_end, self._prealloc_bytes)
        return end != self._alloc_end

    @staticmethod
    def _measure(started: float, oldest: float, records: int, group_bytes: int, ok: bool) -> None:
        """A group's metrics, once per group (writer thread). JOURNAL_ADD_ENTRY has no
        per-record timestamps to go by: each record counts the wait of the group's
        oldest one (from `oldest`, the drain estimate of _run), an upper bound."""
        now = time.monotonic()
        metrics.JOURNAL_SYNC.record_many(1, (now - started) * 1000.0, ok)
        if oldest:
            metrics.JOURNAL_ADD_ENTRY.record_many(records, (now - oldest) * 1000.0, ok)
        if ok:
            metrics.JOURNAL_FORCE_WRITE_BATCH_ENTRIES.record(records)
            metrics.JOURNAL_FORCE_WRITE_BATCH_BYTES.record(group_bytes)
            metrics.JOURNAL_WRITE_BYTES.inc(group_bytes)

    def _rotate(self) -> None:
        """Open the next file first: when that fails the old one stays current."""
        old = self._file
        if self._version != FORMAT_V1:
            inplace.end_file(old, self._frame, self._seed)  # before the next file exists
        self._open_file(self._file_id + 1)
        old.close()
        self.rotations += 1

    def _open_file(self, file_id: int) -> None:
        """Create journal file `file_id` with its header, durable before any record.
        On failure the file is removed again: a header-less newest file would stop replay."""
        if self._version != FORMAT_V1:
            f, self._alloc_end = inplace.open_file(
                self.journal_dir, file_id, self._alignment, self._prealloc_bytes,
                reuse=self._reuse_files, sync_data=self._sync_data)
        else:
            path = file_path(self.journal_dir, file_id)
            f = None
            try:
                f = DurableFile(path, create=True, sync_data=self._sync_data)
                f.write(encode_header(file_id))
                f.fsync()
            except StorageError:
                if f is not None:
                    f.close()
                inplace.remove_unfinished(path, self.journal_dir)
                raise
        self._file = f
        self._file_id = file_id
        self._seed = file_seed(file_id) if self._version != FORMAT_V1 else 0
        self._mark = LogMark(file_id, f.size)

    def _enter_failed(self, exc: StorageError) -> None:
        logger.error("journal %s failed, no more records will be acknowledged: %s", self.journal_dir, exc)
        self._failed = exc
        later = StorageError(f"journal {self.journal_dir} failed earlier: {exc}")
        later.__cause__ = exc
        self._reject = later

    def _fail_queued(self, exc: BaseException) -> None:
        queue = self._queue
        k = len(queue) // FIELDS * FIELDS
        if k:
            self._taken += k // FIELDS
            taken = queue[:k]
            del queue[:k]
            self._deliver(taken, exc)
            self._processed += k // FIELDS

    def _deliver(self, items: list, exc: BaseException | None) -> None:
        loop = self._loop
        if loop is None:
            _complete(items, exc)
            return
        try:
            loop.call_soon_threadsafe(_complete, items, exc)
        except RuntimeError:  # the loop is closed: nobody is left to tell
            logger.error("journal: event loop closed, dropping %d completions", len(items))

    def _fail_now(self, cb: Callback, ctx: Any, exc: BaseException) -> None:
        self._deliver([None, cb, ctx], exc)

    def __repr__(self) -> str:
        return f"Journal({self.journal_dir!r}, file={self._file_id:x}, mark={self._mark})"


__all__ = ["Journal", "FIELDS"]
