"""Entry-log byte formats (STORAGE.md "Entry logs"): header, records, locations, ledgers map.

Pure module: no `bk._native`, no I/O, so analysis jobs (spark/) can import it. The entry-log
kernels (bk/_native/_entrylog.pyx, entrylog_py.py) frame and scan records with these names.

Layout of one log file:
    0      header, LOG_HEADER_BYTES = 1024: magic b"BKLO" | version u32 = 1 | log id u64 |
           ledgers-map offset u64 (0 while open) | ledgers-map count u32 | zeros
    1024   records: size u32 (LOG_SIZE_FIELD_BYTES) | entry (size bytes, at least
           LOG_MIN_ENTRY_BYTES); entry = ledger_id i64 | entry_id i64 | ... (entry.py)
    M      (closed logs only) ledgers map: count x (ledger_id i64 | bytes u64) | crc32c u32
All integers big-endian. The map counts, per ledger, the bytes of its records
including their 4-byte size fields (what GC would reclaim by deleting the ledger).
"""
from __future__ import annotations

import os
import struct
from typing import NamedTuple


from bk.formats.entry import ENTRY_IDS, ENTRY_IDS_BYTES

LOG_MAGIC = b"BKLO"
LOG_VERSION = 1
LOG_HEADER_BYTES = 1024
LOG_SIZE_FIELD_BYTES = 4
LOG_MIN_ENTRY_BYTES = ENTRY_IDS_BYTES  # an entry starts with ledger id + entry id
LOG_RECORD_HEAD_BYTES = LOG_SIZE_FIELD_BYTES + LOG_MIN_ENTRY_BYTES  # a record's size and ids
MAX_LOG_ID = 0xFFFFFFFF  # a location keeps the log id in its high 32 bits
MAX_OFFSET = 0xFFFFFFFF  # ... and the record offset in its low 32 bits
LOG_SUFFIX = ".log"

LOG_HEADER = struct.Struct(">4sIQQI")  # magic version log_id map_offset map_count
LOG_MAP_FIELDS = struct.Struct(">QI")  # map_offset map_count, rewritten in place when a log closes
LOG_MAP_FIELDS_OFFSET = 16  # after magic and version
LOG_SIZE_FIELD = struct.Struct(">I")
LOG_RECORD_HEAD = struct.Struct(">Iqq")  # size, then the entry's ledger_id and entry_id (LOG_RECORD_HEAD_BYTES)
LEDGERS_MAP_ITEM = struct.Struct(">qQ")  # ledger_id bytes
LEDGERS_MAP_CRC = struct.Struct(">I")

# What a scan of records reports (the entry-log kernels' scan_log and LogScan).
LOG_SCAN_CLEAN = 0  # the records end exactly at the end of the range
LOG_SCAN_TRUNCATED = 1  # the record at the stop offset runs past the end (a torn tail)
LOG_SCAN_BAD_SIZE = 2  # the size at the stop offset is < LOG_MIN_ENTRY_BYTES or too large

CYTHON_NAMES = ("LOG_SIZE_FIELD_BYTES", "LOG_MIN_ENTRY_BYTES", "LOG_SCAN_CLEAN", "LOG_SCAN_TRUNCATED",
                "LOG_SCAN_BAD_SIZE")


class LogHeader(NamedTuple):
    log_id: int
    map_offset: int  # 0 while the log is open (or was never closed: crash)
    map_count: int


class HeaderError(ValueError):
    """The first bytes of a file are not a valid entry-log header."""


def encode_header(log_id: int, map_offset: int = 0, map_count: int = 0) -> bytes:
    head = LOG_HEADER.pack(LOG_MAGIC, LOG_VERSION, log_id, map_offset, map_count)
    return head + bytes(LOG_HEADER_BYTES - len(head))


def decode_header(buf: bytes) -> LogHeader:
    if len(buf) < LOG_HEADER.size:
        raise HeaderError(f"header is {len(buf)} bytes, need {LOG_HEADER.size}")
    magic, version, log_id, map_offset, map_count = LOG_HEADER.unpack_from(buf)
    if magic != LOG_MAGIC:
        raise HeaderError(f"bad magic {magic!r}")
    if version != LOG_VERSION:
        raise HeaderError(f"unsupported version {version}")
    if map_offset and map_offset < LOG_HEADER_BYTES:
        raise HeaderError(f"ledgers-map offset {map_offset} is inside the header")
    return LogHeader(log_id, map_offset, map_count)


def header_map_fields_offset() -> int:
    """Where map offset + count start inside the header (for the in-place update)."""
    return LOG_MAP_FIELDS_OFFSET


def encode_map_fields(map_offset: int, map_count: int) -> bytes:
    return LOG_MAP_FIELDS.pack(map_offset, map_count)


# ------------------------------------------------------------------ locations
def make_location(log_id: int, offset: int) -> int:
    if not 0 <= log_id <= MAX_LOG_ID or not 0 <= offset <= MAX_OFFSET:
        raise ValueError(f"log id {log_id} / offset {offset} do not fit a location")
    return (log_id << 32) | offset


def split_location(location: int) -> tuple[int, int]:
    """(log_id, offset of the record's size field)."""
    return location >> 32, location & 0xFFFFFFFF


def entry_ids(entry) -> tuple[int, int]:
    return ENTRY_IDS.unpack_from(entry)


# ------------------------------------------------------------------ ledgers map
def encode_ledgers_map(usage: dict[int, int]) -> bytes:
    """count x (ledger_id | bytes), sorted by ledger id, then their crc32c."""
    import google_crc32c  # here, not at the top: setup.py loads bk/formats in a build env without it
    body = b"".join(LEDGERS_MAP_ITEM.pack(lid, n) for lid, n in sorted(usage.items()))
    return body + LEDGERS_MAP_CRC.pack(google_crc32c.value(body))


def ledgers_map_bytes(count: int) -> int:
    return count * LEDGERS_MAP_ITEM.size + LEDGERS_MAP_CRC.size


def decode_ledgers_map(buf: bytes, count: int) -> dict[int, int]:
    """Raises ValueError when the bytes are short or fail their CRC."""
    import google_crc32c  # see encode_ledgers_map
    need = ledgers_map_bytes(count)
    if len(buf) < need:
        raise ValueError(f"ledgers map is {len(buf)} bytes, expected {need}")
    body = bytes(buf[: need - LEDGERS_MAP_CRC.size])
    (crc,) = LEDGERS_MAP_CRC.unpack_from(buf, need - LEDGERS_MAP_CRC.size)
    if google_crc32c.value(body) != crc:
        raise ValueError("ledgers map fails its crc32c")
    return {lid: n for lid, n in LEDGERS_MAP_ITEM.iter_unpack(body)}


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
