"""Journal replay: read records from a log mark, cut a torn tail, refuse corruption.

Rules (STORAGE.md): a record that is short, has a zero or oversized length, or
fails its CRC ends the valid data. If it sits in the last journal file and no
valid record follows it in that file, it is a torn tail: the writer never got
that group fsynced, so nothing after it was acknowledged; the file is truncated
there and the cut reported as `path@offset`. Anything else (a later file exists,
or valid records follow the bad bytes) is corruption: CorruptedStorageError
naming the file and offset, and the bookie does not start.

Format 2 files (records.py) are written in place, so their tail holds zeros or,
in a recycled file, records from its previous life; records are checked with the
file's CRC seed, so old ones fail like garbage and are never replayed. A file
ends at its FILE_END record. The last file may lack one (the bookie crashed, or
stopped: its writer never rotated): its data ends at the first record that
fails, under the same torn-tail rule, and replay closes it with a durable
FILE_END there (the next start writes a later file). Stopping at a zeroed tail
is how such a file normally ends, so that is no cut and is not reported.
PADDING and FILE_END records are never handed to `on_record`.

Files are read in chunks with pread, so `on_record` receives memoryviews of
private bytes objects that stay valid after the callback returns.
"""
from __future__ import annotations

import logging
import mmap
import os
from typing import Callable, NamedTuple

from bk.errors import CorruptedStorageError, StorageError
from bk.fileio import DurableFile
from bk.formats.journal import (JOURNAL_RECORD_HEAD, JOURNAL_RECORD_HEAD_BYTES, JOURNAL_SCAN_BAD_CRC,
                                JOURNAL_SCAN_BAD_LENGTH, JOURNAL_SCAN_CLEAN, JOURNAL_SCAN_SHORT,
                                JOURNAL_V1_HEADER_BYTES, JOURNAL_V2_HEADER_BYTES)
from bk.journal.records import (
    FILE_END,
    FILLER_LEDGER,
    FORMAT_V1,
    MIN_BODY_BYTES,
    LogMark,
    check_header,
    file_seed,
    list_files,
    parse_ids,
)

logger = logging.getLogger(__name__)

CHUNK_BYTES = 8 * 1024 * 1024
_ZERO_HEAD = bytes(JOURNAL_RECORD_HEAD_BYTES)


def _zero_head(data, pos: int) -> bool:
    """A record head of zeros at `pos`: the preallocated or zeroed tail of a file, not damage."""
    return data[pos:pos + JOURNAL_RECORD_HEAD_BYTES] == _ZERO_HEAD


_WHY = {JOURNAL_SCAN_SHORT: "truncated record", JOURNAL_SCAN_BAD_LENGTH: "bad record length",
        JOURNAL_SCAN_BAD_CRC: "record CRC mismatch"}

OnRecord = Callable[[int, int, memoryview], None]


class ReplayResult(NamedTuple):
    records: int  # records handed to on_record
    end_mark: LogMark  # just after the last valid record replayed (the mark itself if none)
    cut_tail: str | None  # "path@offset" when a torn tail was cut


def replay_journal(journal_dir: str, mark: LogMark, on_record: OnRecord, *,
                   kernel, max_record_bytes: int) -> ReplayResult:
    """Replay every record at or after `mark`, in journal order (see module docstring)."""
    files = [(fid, path) for fid, path in list_files(journal_dir) if fid >= mark.file_id]
    records = 0
    end_mark = mark
    cut_tail = None
    for i, (file_id, path) in enumerate(files):
        if i and file_id != files[i - 1][0] + 1:
            missing = files[i - 1][0] + 1
            raise CorruptedStorageError(
                f"journal file {missing:x}.txn is missing between {files[i - 1][1]} and {path}",
                path=path, offset=0)
        start = mark.offset if file_id == mark.file_id else 0
        reader = _FileReplay(path, file_id, is_last=i == len(files) - 1,
                             kernel=kernel, max_record_bytes=max_record_bytes)
        count, end_offset, cut = reader.run(start, on_record)
        records += count
        end_mark = LogMark(file_id, end_offset)
        if cut is not None:
            cut_tail = cut
    return ReplayResult(records, end_mark, cut_tail)


def scan_journal_file(path: str, file_id: int, on_record: OnRecord, *, kernel,
                      max_record_bytes: int) -> tuple[int, int, str | None]:
    """Read one journal file's records WITHOUT changing it (admin tools: `bk shell readjournal`):
    (records, offset after the last valid one, "path@offset (why)" where bad data starts, or None)."""
    return _ReadOnlyFileReplay(path, file_id, is_last=True, kernel=kernel,
                               max_record_bytes=max_record_bytes).run(0, on_record)


class _FileReplay:
    __slots__ = ("path", "file_id", "is_last", "kernel", "max_record_bytes", "version", "seed")

    def __init__(self, path: str, file_id: int, *, is_last: bool, kernel, max_record_bytes: int):
        self.path = path
        self.file_id = file_id
        self.is_last = is_last
        self.kernel = kernel
        self.max_record_bytes = max_record_bytes
        self.version = FORMAT_V1
        self.seed = 0

    def run(self, start: int, on_record: OnRecord) -> tuple[int, int, str | None]:
        """(records replayed, offset after the last valid record, cut report or None)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            _io_error(e, "opening", self.path)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                return 0, 0, None  # created, crashed before the header: nothing in it
            if size < JOURNAL_V1_HEADER_BYTES:
                if not self.is_last:
                    check_header(os.pread(fd, JOURNAL_V1_HEADER_BYTES, 0), self.file_id, self.path)
                # an interrupted file creation: the header never became durable
                return 0, 0, self._cut(0, f"truncated file header ({size} bytes)")
            self.version, data_start = check_header(os.pread(fd, JOURNAL_V2_HEADER_BYTES, 0), self.file_id, self.path)
            if self.version != FORMAT_V1:
                self.seed = file_seed(self.file_id)
                if size < data_start:
                    if not self.is_last:
                        raise CorruptedStorageError(
                            f"journal file {self.path}: {size} bytes, shorter than its header block "
                            f"({data_start})", path=self.path, offset=size)
                    return 0, 0, self._cut(0, "truncated header block")
            start = max(start, data_start)
            if start > size:
                logger.warning("journal log mark %s@%d is beyond the end of the file (%d bytes); "
                               "nothing to replay from it", self.path, start, size)
                return 0, start, None
            return self._scan(fd, start, size, on_record)
        finally:
            os.close(fd)

    def _scan(self, fd: int, pos: int, size: int, on_record: OnRecord) -> tuple[int, int, str | None]:
        scan = self.kernel.scan_records
        seed = self.seed
        count = 0
        want = CHUNK_BYTES
        while pos < size:
            data = _pread_all(fd, min(want, size - pos), pos, self.path)
            want = CHUNK_BYTES
            found, stop, status = scan(data, 0, len(data), self.max_record_bytes, seed)
            view = memoryview(data)
            for body_offset, body_len in found:
                body = view[body_offset:body_offset + body_len]
                if body_len < MIN_BODY_BYTES:
                    # the CRC matched, so these bytes were written as they are
                    raise CorruptedStorageError(
                        f"journal file {self.path}: record of {body_len} bytes at offset "
                        f"{pos + body_offset - JOURNAL_RECORD_HEAD_BYTES} is too short for ledger and entry ids",
                        path=self.path, offset=pos + body_offset - JOURNAL_RECORD_HEAD_BYTES)
                ledger_id, entry_id = parse_ids(body)
                if ledger_id == FILLER_LEDGER:  # format 2 filler: padding, or the file's end
                    if entry_id == FILE_END:
                        return count, pos + body_offset - JOURNAL_RECORD_HEAD_BYTES, None
                    continue
                on_record(ledger_id, entry_id, body)
                count += 1
            if status == JOURNAL_SCAN_CLEAN:
                pos += stop
                continue
            if status == JOURNAL_SCAN_SHORT and pos + len(data) < size:
                # the chunk ended inside a record, not the file: read it whole next time
                pos += stop
                if len(data) - stop >= 4:
                    want = max(CHUNK_BYTES, JOURNAL_RECORD_HEAD_BYTES + JOURNAL_RECORD_HEAD.unpack_from(data, stop)[0])
                continue
            if self.version != FORMAT_V1:
                return count, pos + stop, self._end_v2(fd, pos + stop, size, data, stop, status)
            return count, pos + stop, self._bad_record(fd, pos + stop, size, _WHY[status])
        if self.version != FORMAT_V1:  # the data fills the file, and no FILE_END
            return count, pos, self._end_v2(fd, pos, size, b"", 0, 0)
        return count, pos, None

    def _end_v2(self, fd: int, offset: int, size: int, data: bytes, stop: int, status: int) -> str | None:
        """A format 2 file's data stops at `offset` without a FILE_END record."""
        zeros = status == JOURNAL_SCAN_BAD_LENGTH and _zero_head(data, stop)
        why = "end of the data" if status == JOURNAL_SCAN_CLEAN else "zeroed tail" if zeros else _WHY[status]
        if not self.is_last:
            raise CorruptedStorageError(
                f"journal file {self.path}: {why} at offset {offset} without its end record, "
                f"and later journal files exist", path=self.path, offset=offset)
        follow = _find_valid_after(fd, self.path, offset + 1, size, self.kernel, self.max_record_bytes, self.seed)
        if follow >= 0:
            raise CorruptedStorageError(
                f"journal file {self.path}: {why} at offset {offset}, "
                f"but a valid record follows at offset {follow}",
                path=self.path, offset=offset)
        return self._close_v2(fd, offset, size, why, report=not (status == JOURNAL_SCAN_CLEAN or zeros))

    def _close_v2(self, fd: int, offset: int, size: int, why: str, report: bool = True) -> str | None:
        """Write a durable FILE_END at `offset` (the file is done: a later one follows)."""
        from bk.journal.inplace import file_end_record
        f = DurableFile(self.path, create=False)
        try:
            f.size = offset
            f.write(file_end_record(self.kernel.frame_records, self.seed))
            f.fsync()
        finally:
            f.close()
        if not report:
            return None
        report_at = f"{self.path}@{offset}"
        logger.warning("journal: torn tail at %s (%s) closed with an end record; records from there "
                       "were never acknowledged", report_at, why)
        return report_at

    def _bad_record(self, fd: int, offset: int, size: int, why: str) -> str:
        """Cut a torn tail at `offset` and return its report, or raise for corruption."""
        if not self.is_last:
            raise CorruptedStorageError(
                f"journal file {self.path}: {why} at offset {offset}, and later journal files exist",
                path=self.path, offset=offset)
        follow = _find_valid_after(fd, self.path, offset + 1, size, self.kernel, self.max_record_bytes)
        if follow >= 0:
            raise CorruptedStorageError(
                f"journal file {self.path}: {why} at offset {offset}, "
                f"but a valid record follows at offset {follow}",
                path=self.path, offset=offset)
        return self._cut(offset, why)

    def _cut(self, offset: int, why: str) -> str:
        report = f"{self.path}@{offset}"
        f = DurableFile(self.path, create=False)
        try:
            f.truncate(offset)
        finally:
            f.close()
        logger.warning("journal: cut torn tail %s (%s); records from there were never acknowledged",
                       report, why)
        return report


class _ReadOnlyFileReplay(_FileReplay):
    """Reports where a bad tail starts instead of cutting it, and never raises for it."""
    __slots__ = ()

    def _bad_record(self, fd: int, offset: int, size: int, why: str) -> str:
        return self._cut(offset, why)

    def _end_v2(self, fd: int, offset: int, size: int, data: bytes, stop: int, status: int) -> str | None:
        if status == JOURNAL_SCAN_CLEAN or (status == JOURNAL_SCAN_BAD_LENGTH and _zero_head(data, stop)):
            return None  # the zeroed tail of a file still being written
        return self._cut(offset, _WHY[status])

    def _close_v2(self, fd: int, offset: int, size: int, why: str, report: bool = True) -> str | None:
        return self._cut(offset, why)

    def _cut(self, offset: int, why: str) -> str:
        return f"{self.path}@{offset} ({why})"


def _io_error(e: OSError, what: str, path: str):
    raise StorageError(f"I/O error while {what} journal file {path}: {e.strerror}") from e


def _pread_all(fd: int, n: int, offset: int, path: str) -> bytes:
    try:
        data = os.pread(fd, n, offset)
        if len(data) < n:  # pread may return less; short of EOF, keep reading
            parts = [data]
            got = len(data)
            while got < n:
                more = os.pread(fd, n - got, offset + got)
                if not more:
                    break
                parts.append(more)
                got += len(more)
            data = b"".join(parts)
    except OSError as e:
        _io_error(e, "reading", path)
    return data


def _find_valid_after(fd: int, path: str, start: int, size: int, kernel, max_record_bytes: int,
                      seed: int = 0) -> int:
    """Offset of the first valid record in [start, size), or -1 (maps the file, no copy)."""
    if size - start < JOURNAL_RECORD_HEAD_BYTES + 1:
        return -1
    try:
        mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    except OSError as e:
        _io_error(e, "mapping", path)
    try:
        return kernel.find_valid_record(mm, start, size, max_record_bytes, seed)
    finally:
        mm.close()
