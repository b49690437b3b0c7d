"""Entry-log byte formats (STORAGE.md "Entry logs"): header, locations, ledgers map.

Pure module: no `bk._native`, no I/O, so analysis jobs (spark/) can import it.

Layout of one log file:
    0      header, HEADER_BYTES = 1024: magic b"BKLO" | version u32 = 1 | log id u64 |
           ledgers-map offset u64 (0 while open) | ledgers-map count u32 | zeros
    1024   records: size u32 | entry (size bytes); entry = ledger_id i64 | entry_id i64 | ...
    M      (closed logs only) ledgers map: count x (ledger_id i64 | bytes u64) | crc32c u32
All integers big-endian. The map counts, per ledger, the bytes of its records
including their 4-byte size fields (what GC would reclaim by deleting the ledger).
"""
from __future__ import annotations

import os
import struct
from typing import NamedTuple

import google_crc32c

MAGIC = b"BKLO"
VERSION = 1
HEADER_BYTES = 1024
SIZE_FIELD_BYTES = 4
MIN_ENTRY_BYTES = 16  # an entry starts with ledger id + entry id
MAX_LOG_ID = 0xFFFFFFFF  # a location keeps the log id in its high 32 bits
MAX_OFFSET = 0xFFFFFFFF  # ... and the record offset in its low 32 bits
LOG_SUFFIX = ".log"

_HEADER = struct.Struct(">4sIQQI")
_MAP_ITEM = struct.Struct(">qQ")
_CRC = struct.Struct(">I")
_IDS = struct.Struct(">qq")


class LogHeader(NamedTuple):
    log_id: int
    map_offset: int  # 0 while the log is open (or was never closed: crash)
    map_count: int


class HeaderError(ValueError):
    """The first bytes of a file are not a valid entry-log header."""


def encode_header(log_id: int, map_offset: int = 0, map_count: int = 0) -> bytes:
    head = _HEADER.pack(MAGIC, VERSION, log_id, map_offset, map_count)
    return head + bytes(HEADER_BYTES - len(head))


def decode_header(buf: bytes) -> LogHeader:
    if len(buf) < _HEADER.size:
        raise HeaderError(f"header is {len(buf)} bytes, need {_HEADER.size}")
    magic, version, log_id, map_offset, map_count = _HEADER.unpack_from(buf)
    if magic != MAGIC:
        raise HeaderError(f"bad magic {magic!r}")
    if version != VERSION:
        raise HeaderError(f"unsupported version {version}")
    if map_offset and map_offset < HEADER_BYTES:
        raise HeaderError(f"ledgers-map offset {map_offset} is inside the header")
    return LogHeader(log_id, map_offset, map_count)


def header_map_fields_offset() -> int:
    """Where map offset + count start inside the header (for the in-place update)."""
    return 4 + 4 + 8


def encode_map_fields(map_offset: int, map_count: int) -> bytes:
    return struct.pack(">QI", map_offset, map_count)


# ------------------------------------------------------------------ locations
def make_location(log_id: int, offset: int) -> int:
    if not 0 <= log_id <= MAX_LOG_ID or not 0 <= offset <= MAX_OFFSET:
        raise ValueError(f"log id {log_id} / offset {offset} do not fit a location")
    return (log_id << 32) | offset


def split_location(location: int) -> tuple[int, int]:
    """(log_id, offset of the record's size field)."""
    return location >> 32, location & 0xFFFFFFFF


def entry_ids(entry) -> tuple[int, int]:
    return _IDS.unpack_from(entry)


# ------------------------------------------------------------------ ledgers map
def encode_ledgers_map(usage: dict[int, int]) -> bytes:
    """count x (ledger_id | bytes), sorted by ledger id, then their crc32c."""
    body = b"".join(_MAP_ITEM.pack(lid, n) for lid, n in sorted(usage.items()))
    return body + _CRC.pack(google_crc32c.value(body))


def ledgers_map_bytes(count: int) -> int:
    return count * _MAP_ITEM.size + _CRC.size


def decode_ledgers_map(buf: bytes, count: int) -> dict[int, int]:
    """Raises ValueError when the bytes are short or fail their CRC."""
    need = ledgers_map_bytes(count)
    if len(buf) < need:
        raise ValueError(f"ledgers map is {len(buf)} bytes, expected {need}")
    body = bytes(buf[: need - _CRC.size])
    (crc,) = _CRC.unpack_from(buf, need - _CRC.size)
    if google_crc32c.value(body) != crc:
        raise ValueError("ledgers map fails its crc32c")
    return {lid: n for lid, n in _MAP_ITEM.iter_unpack(body)}


# ------------------------------------------------------------------ file names
def log_file_name(log_id: int) -> str:
    return f"{log_id:x}{LOG_SUFFIX}"


def parse_log_file_name(name: str) -> int | None:
    """The log id of `<hex>.log`, or None for any other name."""
    if not name.endswith(LOG_SUFFIX):
        return None
    stem = name[: -len(LOG_SUFFIX)]
    if not stem or any(c not in "0123456789abcdef" for c in stem):
        return None
    log_id = int(stem, 16)
    return log_id if log_id <= MAX_LOG_ID and log_file_name(log_id) == name else None


def log_dir(ledger_dir: str) -> str:
    return os.path.join(ledger_dir, "current")
