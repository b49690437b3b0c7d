"""BATCH_READ answers sent from the entry logs as they lie there.

An entry log's records (`size u32 | entry`, STORAGE.md) are a BATCH_READ answer's items
(`length u32 | entry`, PROTOCOL.md) byte for byte: a run of one ledger's consecutive entries
stored back to back is the answer's body as it is. read_span finds such a run (each record's
head checked against the index, as read_entry checks one) and hands it out unread:

- FileSpan when its first page is in the page cache: os.sendfile sends it from there, with
  no copy in the bookie;
- BufferSpan when it is not: one O_DIRECT read into a reused aligned buffer (DirectBuffers),
  written from there. On this virtio disk the page cache read cold logs at 1.3-1.8 GB/s and
  O_DIRECT into reused memory at 2.5-2.8 (docs/BENCHMARKS.md, ninth and tenth rounds).

Both hold a resource until the connection has written them or copied what is left
(bk.server.connection): a reference on the log's fd, or the buffer.
"""
from __future__ import annotations

import errno
import mmap
import os
import threading

from bk import fileio
from bk.formats import entrylog as fmt
from bk.entrylog.files import ReadHandle, ReadFiles, read_error
from bk.errors import CorruptedStorageError, StorageError

DIRECT_ALIGN = 4096  # O_DIRECT offsets, lengths and buffers are multiples of this
_HEAD_BYTES = fmt.LOG_RECORD_HEAD_BYTES  # a record's size and ids
_FADV_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", None)
_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", 0)


class FileSpan:
    """Records of an entry log answered as they lie on disk (BATCH_READ: an entry log's
    `size | entry` records are the answer's `length | entry` items byte for byte), sent by
    os.sendfile from the page cache instead of being read into memory and written again.

    Holds a reader's reference on its log's fd (ReadFiles.acquire) until release(): the fd
    stays valid even if the log is deleted meanwhile (compaction), and the bytes at the span
    never change (logs are append-only). len() is its byte count, so it is counted like the
    buffers it travels with."""

    __slots__ = ("fd", "offset", "length", "count", "path", "_handle", "_files")

    def __init__(self, files: "ReadFiles", handle: ReadHandle, offset: int, length: int, count: int):
        self.fd = handle.fd
        self.path = handle.path
        self.offset = offset
        self.length = length
        self.count = count  # records in the span
        self._handle = handle
        self._files = files

    def __len__(self) -> int:
        return self.length

    def advance(self, n: int) -> None:
        """The first n bytes were sent."""
        self.offset += n
        self.length -= n

    def read(self) -> bytes:
        """The span's bytes (a pread; StorageError on an I/O error or a short file)."""
        try:
            buf = os.pread(self.fd, self.length, self.offset)
        except OSError as e:
            raise read_error(self.path, self.offset, e) from e
        if len(buf) != self.length:
            raise CorruptedStorageError(f"{self.path}@{self.offset}: {self.length} bytes expected, "
                                        f"{len(buf)} read", path=self.path, offset=self.offset)
        return buf

    def release(self) -> None:
        """Give the fd back (once; later calls do nothing)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            self._files.release(handle)


class DirectBuffers:
    """A free list of page-aligned buffers (anonymous mmaps) that O_DIRECT reads fill.

    Reused, not allocated per read: on the virtio disk a read into fresh memory ran at 0.93
    GB/s where one into reused memory ran at 2.5-2.8 (docs/BENCHMARKS.md, ninth round), and
    the page cache, which takes fresh pages for every cold read, at 1.3-1.8. At most `count`
    buffers exist; get() answers None when all are lent (the caller reads another way)."""

    def __init__(self, size: int, count: int):
        self.size = -(-size // DIRECT_ALIGN) * DIRECT_ALIGN
        self._count = count
        self._made = 0
        self._free: list[mmap.mmap] = []
        self._lock = threading.Lock()

    def get(self) -> mmap.mmap | None:
        with self._lock:
            if self._free:
                return self._free.pop()
            if self._made >= self._count:
                return None
            self._made += 1
        return mmap.mmap(-1, self.size)

    def put(self, buf: mmap.mmap) -> None:
        with self._lock:
            self._free.append(buf)


class BufferSpan:
    """Records of an entry log read by O_DIRECT into a DirectBuffers buffer, answered from it
    (the same `length | entry` layout as FileSpan). `view` is what is left to send; release()
    gives the buffer back, once: only after the last byte of it was written or copied."""

    __slots__ = ("view", "count", "_buf", "_pool")

    def __init__(self, pool: DirectBuffers, buf: mmap.mmap, start: int, length: int, count: int):
        self.view = memoryview(buf)[start:start + length].toreadonly()
        self.count = count
        self._buf = buf
        self._pool = pool

    def __len__(self) -> int:
        return self.view.nbytes

    def advance(self, n: int) -> None:
        """The first n bytes were sent."""
        self.view = self.view[n:]

    def read(self) -> bytes:
        """What is left to send, copied (for the transport: the buffer goes back to the pool)."""
        return bytes(self.view)

    def release(self) -> None:
        buf, self._buf = self._buf, None
        if buf is not None:
            self.view.release()
            self._pool.put(buf)


def _page_cached(fd: int, offset: int) -> bool:
    """Whether the page at `offset` is in the page cache; True where that cannot be asked.
    cachestat(2) asks without reading. preadv2 with RWF_NOWAIT (the fall-back, kernels before
    6.5) answers EAGAIN for a page not cached, but the kernel starts reading it first: each
    cold read then cost the disk a second request (seen on cold random READs: two per read)."""
    if _cachestat is not None:
        cached = _cachestat(fd, offset)
        if cached is not None:
            return cached
    try:
        os.preadv(fd, [bytearray(1)], offset, _RWF_NOWAIT)
    except BlockingIOError:
        return False
    except (OSError, ValueError):
        return True
    return True


def _make_cachestat():
    """cachestat(2) through ctypes (no Python wrapper): fn(fd, offset) -> whether that page is
    cached, or None when the call failed (then the caller asks preadv2). None off Linux."""
    if not hasattr(os, "RWF_NOWAIT"):  # Linux only
        return None
    try:
        import ctypes
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    u64 = ctypes.c_uint64
    range_t, stat_t = u64 * 2, u64 * 5  # cachestat_range {off, len}; cachestat {nr_cache, ...}
    nr = 451  # __NR_cachestat in the generic and x86_64 tables
    broken = []

    def cachestat(fd: int, offset: int) -> bool | None:
        if broken:
            return None
        rng, st = range_t(offset - offset % DIRECT_ALIGN, DIRECT_ALIGN), stat_t()
        if syscall(nr, fd, ctypes.byref(rng), ctypes.byref(st), 0) != 0:
            if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):
                broken.append(True)  # an older kernel, or a seccomp filter: ask preadv2 from now on
            return None
        return st[0] > 0
    return cachestat


_cachestat = _make_cachestat()


def read_span(el, ledger_id: int, entry_id: int, locations: list, max_bytes: int,
              hint_bytes: int = 0) -> FileSpan | BufferSpan | None:
    """The records of entries entry_id, entry_id + 1, ... that lie back to back in one log
    from locations[0] on (`locations`: the index's, one per entry, None = not stored), within
    max_bytes (at least one record), for a BATCH_READ answer: a BufferSpan when they were
    not in the page cache (read by O_DIRECT into a reused buffer), else a FileSpan (not read:
    os.sendfile sends them from the page cache). None if locations[0] is None.

    Each record's head (size, ids) is checked, as read_entry checks one: the span ends
    before the first record that is not the next entry where the index places it. A bad
    first record raises CorruptedStorageError (read_entry's errors); a bad later one only
    ends the span, and the read that asks for it next gets the error.
    `hint_bytes`: also ask the kernel for the log's next bytes (FileSpan only, see _hint)."""
    if not locations or locations[0] is None:
        return None
    log_id, offset = fmt.split_location(locations[0])
    end = el._records_end(log_id)
    h = el._files.acquire(log_id)
    try:
        if offset < fmt.LOG_HEADER_BYTES:
            raise CorruptedStorageError(f"location {locations[0]:#x} points into the header of {h.path}",
                                        path=h.path, offset=offset, ledger_id=ledger_id, entry_id=entry_id)
        if fileio.faults is not None:
            fileio.check_read(h.path)
        want = min(len(locations) * _record_guess(el, ledger_id, locations), max_bytes, end - offset)
        if not _page_cached(h.fd, offset):
            span = _read_span_direct(el, h, ledger_id, entry_id, locations, offset, want, end, max_bytes)
            if span is not None:
                return span
        if _FADV_WILLNEED is not None and want > 0:
            try:  # the span's pages in one request; the head reads below wait for theirs
                os.posix_fadvise(h.fd, offset, want, _FADV_WILLNEED)
            except OSError:
                pass  # a hint
        count, stop = _span_records(el, h.path, ledger_id, entry_id, locations, offset, end, max_bytes,
                                    lambda pos: el.pread(h, _HEAD_BYTES, pos))
        if hint_bytes > 0:
            el._hint(h, stop, hint_bytes, end)
        span = FileSpan(el._files, h, offset, stop - offset, count)
        h = None  # the span holds the reference now
        return span
    finally:
        if h is not None:
            el._files.release(h)


def _record_guess(el, ledger_id: int, locations: list) -> int:
    """About how many bytes one of the run's records takes (size prefix included): the
    ledger's last record read, else the distance to the second entry if it follows in the
    same log, else a page (a longer first record is read again by the page-cache path)."""
    record = el._record_sizes.get(ledger_id)
    if record is None:
        if len(locations) > 1 and locations[1] is not None and 0 < locations[1] - locations[0] < 1 << 32:
            return locations[1] - locations[0]
        return DIRECT_ALIGN
    return record


def _read_span_direct(el, h, ledger_id: int, entry_id: int, locations: list, offset: int, want: int,
                      end: int, max_bytes: int) -> BufferSpan | None:
    """read_span's O_DIRECT read; None (nothing read or lent) where it cannot serve: no
    O_DIRECT on this file system, every buffer lent, or a first record the read missed."""
    pool = el._direct_buffers
    dfd = el._files.direct_fd(h)
    if dfd < 0:
        return None
    buf = pool.get()
    if buf is None:
        return None
    start = offset - offset % DIRECT_ALIGN
    stop = min(start + pool.size, -(-(offset + max(want, _HEAD_BYTES)) // DIRECT_ALIGN) * DIRECT_ALIGN)
    try:
        n = os.preadv(dfd, [memoryview(buf)[:stop - start]], start)
    except OSError as e:
        pool.put(buf)
        raise read_error(h.path, start, e) from e
    limit = min(start + n, end)

    def head(pos: int):
        if pos + _HEAD_BYTES > limit:
            return b""  # _check_record: a short head
        return buf[pos - start:pos - start + _HEAD_BYTES]
    try:
        count, stop = _span_records(el, h.path, ledger_id, entry_id, locations, offset, limit, max_bytes, head)
    except CorruptedStorageError:
        pool.put(buf)
        if limit < end:
            return None  # the first record runs past what was read: the page cache path reads it
        raise
    return BufferSpan(pool, buf, offset - start, stop - offset, count)


def _span_records(el, path: str, ledger_id: int, entry_id: int, locations: list, offset: int, end: int,
                  max_bytes: int, head) -> tuple[int, int]:
    """How many records from `offset` on (before `end`) are entries entry_id.. where `locations`
    place them, within max_bytes (at least one), and where they stop; `head(pos)` gives the
    head bytes of the record at pos. The first one is checked strictly (raises)."""
    log_id = fmt.split_location(locations[0])[0]
    pos = offset
    count = 0
    last = 0
    for i, location in enumerate(locations):
        if i and location != fmt.make_location(log_id, pos):
            break  # not stored, or stored elsewhere: the span ends here
        try:
            size = el._check_entry_record(path, pos, head(pos), ledger_id, entry_id + i)
            if pos + fmt.LOG_SIZE_FIELD_BYTES + size > end:
                raise CorruptedStorageError(f"{path}@{pos}: record of {size} bytes is cut short",
                                            path=path, offset=pos, ledger_id=ledger_id, entry_id=entry_id + i)
        except StorageError:
            if i == 0:
                raise
            break
        if count and pos + fmt.LOG_SIZE_FIELD_BYTES + size - offset > max_bytes:
            break
        pos += fmt.LOG_SIZE_FIELD_BYTES + size
        count += 1
        last = size
    el._remember_size(ledger_id, fmt.LOG_SIZE_FIELD_BYTES + last)
    return count, pos
