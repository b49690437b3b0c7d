"""Journal byte kernel (pure Python twin of bk/_native/_journal.pyx).

A journal record is `length u32 BE | crc32c(seed, body) u32 BE | body` (seed 0 in
format 1 files, the file's seed in format 2: records.py; the layout is
bk/formats/journal.py's). Same functions, same results as the native kernel;
CRCs come from google_crc32c.

scan_records status: 0 clean end exactly at `end`, 1 short/truncated record at
`stop`, 2 length 0 or > max_record_bytes at `stop`, 3 CRC mismatch at `stop`.
"""
from __future__ import annotations

import re

import google_crc32c

from bk.formats.journal import (JOURNAL_RECORD_HEAD as _head, JOURNAL_RECORD_HEAD_BYTES as _HEAD,
                                JOURNAL_SCAN_BAD_CRC as STATUS_BAD_CRC, JOURNAL_SCAN_BAD_LENGTH as STATUS_BAD_LENGTH,
                                JOURNAL_SCAN_CLEAN as STATUS_CLEAN, JOURNAL_SCAN_SHORT as STATUS_SHORT)

_MAX_U32 = 0xFFFFFFFF
_extend = google_crc32c.extend
_NONZERO = re.compile(rb"[^\x00]")


def _check_seed(seed: int) -> None:
    if not 0 <= seed <= _MAX_U32:
        raise ValueError("seed must fit in 32 bits")


def _as_bytes(data) -> bytes:
    # google_crc32c wants read-only bytes; memoryview/bytearray are copied once.
    return data if type(data) is bytes else bytes(data)


def crc32c(data, crc: int = 0) -> int:
    """CRC32C of `data` continuing from `crc` (google_crc32c.extend semantics)."""
    if not 0 <= crc <= _MAX_U32:
        raise ValueError("crc must fit in 32 bits")
    return _extend(crc, _as_bytes(data))


crc32c_table = crc32c  # the native kernel's table-path test hook; one path here


def frame_records(bodies, seed: int = 0) -> bytes:
    """Frame every body (bytes-like) as `length | crc32c(seed, body) | body`, back to back."""
    _check_seed(seed)
    parts = []
    pack = _head.pack
    for i, body in enumerate(bodies):
        body = _as_bytes(body)
        n = len(body)
        if n > _MAX_U32:
            raise ValueError(f"journal record body {i} is {n} bytes; the length field is 32 bits")
        parts.append(pack(n, _extend(seed, body)))
        parts.append(body)
    return b"".join(parts)


def frame_headers(bodies, seed: int = 0) -> bytes:
    """Only the `length | crc32c(seed, body)` header of every body (bytes-like), back to back."""
    _check_seed(seed)
    parts = []
    pack = _head.pack
    for i, body in enumerate(bodies):
        body = _as_bytes(body)
        n = len(body)
        if n > _MAX_U32:
            raise ValueError(f"journal record body {i} is {n} bytes; the length field is 32 bits")
        parts.append(pack(n, _extend(seed, body)))
    return b"".join(parts)


def _check_range(size: int, start: int, end: int, max_record_bytes: int, seed: int) -> None:
    _check_seed(seed)
    if start < 0 or end < start or end > size:
        raise ValueError(f"bad scan range [{start}, {end}) for a buffer of {size} bytes")
    if max_record_bytes <= 0:
        raise ValueError("max_record_bytes must be positive")


def _check_one(view: memoryview, pos: int, end: int, max_record_bytes: int, seed: int) -> tuple[int, int]:
    """(status, body_len) of the record at `pos`; status 0 means valid."""
    if end - pos < _HEAD:
        return STATUS_SHORT, 0
    length, crc = _head.unpack_from(view, pos)
    if length == 0 or length > max_record_bytes:
        return STATUS_BAD_LENGTH, 0
    if end - pos - _HEAD < length:
        return STATUS_SHORT, 0
    if _extend(seed, bytes(view[pos + _HEAD:pos + _HEAD + length])) != crc:
        return STATUS_BAD_CRC, 0
    return STATUS_CLEAN, length


def scan_records(buf, start: int, end: int, max_record_bytes: int, seed: int = 0):
    """Validate records in buf[start:end] -> (list[(body_offset, body_len)], stop, status)."""
    view = memoryview(buf).cast("B")
    _check_range(len(view), start, end, max_record_bytes, seed)
    records = []
    pos = start
    status = STATUS_CLEAN
    while pos < end:
        status, length = _check_one(view, pos, end, max_record_bytes, seed)
        if status:
            break
        records.append((pos + _HEAD, length))
        pos += _HEAD + length
    return records, pos, status


def find_valid_record(buf, start: int, end: int, max_record_bytes: int, seed: int = 0) -> int:
    """First offset in [start, end) holding a whole valid record, or -1."""
    view = memoryview(buf).cast("B")
    _check_range(len(view), start, end, max_record_bytes, seed)
    pos = start
    while pos + _HEAD < end:
        if view[pos:pos + 4] == b"\0\0\0\0":
            # a zero length is never valid: skip a zero run at C speed (a preallocated
            # tail is megabytes of zeros); a record may start up to 3 bytes before
            # the next nonzero byte
            hit = _NONZERO.search(buf, pos, end)
            if hit is None:
                return -1
            pos = max(pos + 1, hit.start() - 3)
            continue
        if _check_one(view, pos, end, max_record_bytes, seed)[0] == STATUS_CLEAN:
            return pos
        pos += 1
    return -1
