"""Read side helpers of the EntryLogger: a thread-safe cache of read fds, and LogScan.

Read fds are separate from the writer's fd (O_RDONLY, one per log) and shared by
all reader threads: `os.pread` needs no seek, so one fd serves many threads. An fd
is closed only when no reader holds it (reference count), so a log deleted or
evicted while a read is in flight never has its fd number reused under the read.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Callable, Iterator

from bk.errors import CorruptedStorageError, StorageError
from bk.formats.entrylog import LOG_HEADER_BYTES, LOG_SIZE_FIELD
from bk.formats.entrylog import LOG_SCAN_BAD_SIZE as SCAN_BAD_SIZE, LOG_SCAN_CLEAN as SCAN_CLEAN
from bk.formats.entrylog import LOG_SCAN_TRUNCATED as SCAN_TRUNCATED, LOG_SIZE_FIELD_BYTES as _F

MAX_OPEN_READ_FILES = 256
_O_DIRECT = getattr(os, "O_DIRECT", 0)
_FADV_RANDOM = getattr(os, "POSIX_FADV_RANDOM", None)
SCAN_CHUNK_BYTES = 4 * 1024 * 1024

SCAN_REASONS = {SCAN_TRUNCATED: "torn tail", SCAN_BAD_SIZE: "bad size field"}  # why a scan stopped short


def read_error(path: str, offset: int, e: OSError) -> StorageError:
    """What a failed read of an entry log at offset is, however it was read (pread, O_DIRECT,
    sendfile's fall-back, the bookie's io_uring)."""
    return StorageError(f"I/O error reading {path}@{offset}: {e.strerror}")


class ReadHandle:
    __slots__ = ("log_id", "path", "fd", "dfd", "refs", "doomed", "hinted")

    def __init__(self, log_id: int, path: str, fd: int):
        self.log_id = log_id
        self.path = path
        self.fd = fd
        self.dfd = -1  # the O_DIRECT fd (direct_fd), -1 not opened yet, -2 refused by the file system
        self.refs = 0
        self.doomed = False  # close once the last reader releases it
        self.hinted = (0, 0)  # the byte range last asked for with WILLNEED (EntryLogger._hint)


class ReadFiles:
    """log id -> open read fd, LRU-bounded; acquire()/release() around every pread."""

    def __init__(self, path_of: Callable[[int], str | None], max_open: int = MAX_OPEN_READ_FILES):
        self._path_of = path_of
        self._max_open = max_open
        self._lock = threading.Lock()
        self._open: OrderedDict[int, ReadHandle] = OrderedDict()
        self._closed = False

    def acquire(self, log_id: int) -> ReadHandle:
        with self._lock:
            if self._closed:
                raise StorageError("entry logger is closed")
            h = self._open.get(log_id)
            if h is None:
                path = self._path_of(log_id)
                if path is None:
                    raise CorruptedStorageError(f"entry log {log_id:x} does not exist", offset=None)
                try:
                    fd = os.open(path, os.O_RDONLY)
                except FileNotFoundError:
                    raise CorruptedStorageError(f"entry log {path} is missing", path=path) from None
                except OSError as e:
                    raise StorageError(f"cannot open entry log {path}: {e.strerror}") from e
                if _FADV_RANDOM is not None:
                    # No kernel readahead on these fds: the bookie reads ahead itself (its read
                    # cache) and asks for what a scan needs next (WILLNEED, read_run). The
                    # kernel's readahead on top read more than a random read needs and, on a
                    # virtio disk, made 1 MiB reads slower (docs/STORAGE.md, reads).
                    try:
                        os.posix_fadvise(fd, 0, 0, _FADV_RANDOM)
                    except OSError:
                        pass  # a hint
                h = ReadHandle(log_id, path, fd)
                self._open[log_id] = h
                self._evict_locked()
            else:
                self._open.move_to_end(log_id)
            h.refs += 1
            return h

    def release(self, h: ReadHandle) -> None:
        with self._lock:
            h.refs -= 1
            if h.doomed and h.refs == 0:
                self._close_fd(h)

    def forget(self, log_id: int) -> None:
        """Drop a log's fd (deleted log); closed now or by its last reader."""
        with self._lock:
            h = self._open.pop(log_id, None)
            if h is not None:
                h.doomed = True
                if h.refs == 0:
                    self._close_fd(h)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for h in self._open.values():
                h.doomed = True
                if h.refs == 0:
                    self._close_fd(h)
            self._open.clear()

    def open_count(self) -> int:
        with self._lock:
            return len(self._open)

    def _evict_locked(self) -> None:
        # Oldest first; a handle in use is left open (the cap may be exceeded briefly).
        if len(self._open) <= self._max_open:
            return
        for log_id in list(self._open):
            if len(self._open) <= self._max_open:
                break
            h = self._open[log_id]
            if h.refs == 0:
                del self._open[log_id]
                self._close_fd(h)

    def direct_fd(self, h: ReadHandle) -> int:
        """h's log opened with O_DIRECT (once), or -1 where the file system refuses it (tmpfs).
        Only while the caller holds a reference on h (the fd is closed with h's)."""
        if h.dfd == -1 and _O_DIRECT:
            try:
                fd = os.open(h.path, os.O_RDONLY | _O_DIRECT)
            except OSError:
                fd = -2
            with self._lock:
                if h.dfd == -1 and h.fd >= 0:
                    h.dfd, fd = fd, -1
            if fd >= 0:  # another reader opened it first
                os.close(fd)
        return h.dfd if h.dfd >= 0 else -1

    @staticmethod
    def _close_fd(h: ReadHandle) -> None:
        for name in ("fd", "dfd"):
            fd = getattr(h, name)
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
            setattr(h, name, -1)


class LogScan:
    """Iterator over one log's records: (ledger_id, entry_id, location, size).

    Records are read in SCAN_CHUNK_BYTES chunks and parsed by the entrylog kernel;
    a record straddling two chunks is re-read at the start of the next one, and a
    record bigger than a chunk gets a chunk of its own size. After the iteration
    ends, `status` says why (SCAN_CLEAN: reached `end_offset`; SCAN_TRUNCATED:
    the last record runs past the end of the data, e.g. torn by a crash;
    SCAN_BAD_SIZE: a size field out of range) and `stop_offset` where.
    With `with_entries` each item has a fifth element, the entry's bytes (compaction).
    """

    def __init__(self, kernel, path: str, log_id: int, end_offset: int, max_entry_bytes: int,
                 chunk_bytes: int = SCAN_CHUNK_BYTES, with_entries: bool = False):
        self.with_entries = with_entries
        self.path = path
        self.log_id = log_id
        self.end_offset = end_offset
        self.status: int | None = None  # set when the iteration is over
        self.stop_offset: int | None = None
        self._kernel = kernel
        self._max_entry_bytes = max_entry_bytes
        self._chunk_bytes = max(chunk_bytes, 64)
        self._it = self._records()

    def __iter__(self) -> "LogScan":
        return self

    def __next__(self) -> tuple:
        return next(self._it)

    def _records(self) -> Iterator[tuple]:
        end = self.end_offset
        if end < LOG_HEADER_BYTES:  # crash before the header was written whole
            self.status, self.stop_offset = (SCAN_TRUNCATED if end > 0 else SCAN_CLEAN), 0
            return
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise StorageError(f"cannot open entry log {self.path}: {e.strerror}") from e
        loc_base = self.log_id << 32
        scan_log = self._kernel.scan_log
        pos = LOG_HEADER_BYTES
        want = self._chunk_bytes
        try:
            while pos < end:
                request = min(want, end - pos)
                try:
                    buf = os.pread(fd, request, pos)
                except OSError as e:
                    raise StorageError(f"I/O error reading entry log {self.path}: {e.strerror}") from e
                if not buf:  # file shorter than expected: a torn tail
                    self.status, self.stop_offset = SCAN_TRUNCATED, pos
                    return
                n = len(buf)
                if n < request:  # file ends before `end`: what is there is all there is
                    end = pos + n
                records, stop, status = scan_log(buf, 0, n, self._max_entry_bytes)
                if self.with_entries:
                    for off, size, ledger_id, entry_id in records:
                        yield ledger_id, entry_id, loc_base | (pos + off), size, buf[off + _F:off + _F + size]
                else:
                    for off, size, ledger_id, entry_id in records:
                        yield ledger_id, entry_id, loc_base | (pos + off), size
                if status == SCAN_CLEAN:
                    pos += n
                    want = self._chunk_bytes
                    continue
                if status == SCAN_BAD_SIZE or pos + n >= end:
                    self.status, self.stop_offset = status, pos + stop
                    return
                # SCAN_TRUNCATED inside the data: the record continues in the next chunk
                if stop == 0:
                    size = LOG_SIZE_FIELD.unpack_from(buf)[0]  # n >= _F here, checked size range
                    want = max(self._chunk_bytes, _F + size)
                else:
                    want = self._chunk_bytes
                pos += stop
            self.status, self.stop_offset = SCAN_CLEAN, pos
        finally:
            os.close(fd)
