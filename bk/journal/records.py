"""Journal file and record formats (STORAGE.md, "Journal files").

File: a 16-byte header `BKJN | version u32 = 1 | file_id u64`, then records
`length u32 | crc32c u32 | body` back to back (framed by the `journal` kernel).
A body always starts with `ledger_id i64 | entry_id i64`: an entry record is the
stored entry itself; a meta-record puts a negative meta id where the entry id is.
Files are `<journal_dir>/current/<file_id hex>.txn`.
"""
from __future__ import annotations

import os
import re
import struct
from typing import NamedTuple

from bk.config import BookieConfig
from bk.errors import CorruptedStorageError

MAGIC = b"BKJN"
FORMAT_VERSION = 1
HEADER_BYTES = 16
RECORD_HEADER_BYTES = 8  # length u32 + crc32c u32
MIN_BODY_BYTES = 16  # ledger_id i64 + entry_id i64

# BookKeeper's meta-record ids (stored where an entry record has its entry id).
MASTER_KEY = -0x1000
FENCE = -0x2000
EXPLICIT_LAC = -0x8000
META_IDS = frozenset((MASTER_KEY, FENCE, EXPLICIT_LAC))

# Records are bounded by the wire frame size; the floor keeps files written with
# a larger frame setting readable after the setting is lowered.
MAX_RECORD_FLOOR_BYTES = 64 * 1024 * 1024

_header = struct.Struct(">4sIQ")
_ids = struct.Struct(">qq")
_NAME_RE = re.compile(r"^([0-9a-f]+)\.txn$")


class LogMark(NamedTuple):
    """A journal position: records at or after it are replayed. Ordered by (file_id, offset)."""

    file_id: int
    offset: int


def max_record_bytes(config: BookieConfig) -> int:
    """Largest record body log() accepts and replay considers a sane length."""
    return max(config.max_frame_size_bytes, MAX_RECORD_FLOOR_BYTES)


def meta_body(ledger_id: int, meta_id: int, data: bytes = b"") -> bytes:
    """A meta-record body: `ledger_id | meta_id | data` (meta_id one of META_IDS)."""
    if meta_id not in META_IDS:
        raise ValueError(f"unknown journal meta id {meta_id}")
    return _ids.pack(ledger_id, meta_id) + bytes(data)


def parse_ids(body) -> tuple[int, int]:
    """(ledger_id, entry_id) at the start of a record body (entry_id < 0 for meta)."""
    return _ids.unpack_from(body, 0)


def encode_header(file_id: int) -> bytes:
    return _header.pack(MAGIC, FORMAT_VERSION, file_id)


def check_header(data: bytes, file_id: int, path: str) -> None:
    """Raise CorruptedStorageError unless `data` is the header of journal file `file_id`."""
    if len(data) < HEADER_BYTES:
        raise CorruptedStorageError(
            f"journal file {path}: header is {len(data)} bytes, expected {HEADER_BYTES}", path=path, offset=0)
    magic, version, header_id = _header.unpack_from(data, 0)
    if magic != MAGIC:
        raise CorruptedStorageError(f"journal file {path}: bad magic {magic!r} at offset 0", path=path, offset=0)
    if version != FORMAT_VERSION:
        raise CorruptedStorageError(
            f"journal file {path}: unsupported format version {version} at offset 4", path=path, offset=4)
    if header_id != file_id:
        raise CorruptedStorageError(
            f"journal file {path}: header names file id {header_id:x}, the file name says {file_id:x}",
            path=path, offset=8)


def current_dir(journal_dir: str) -> str:
    return os.path.join(journal_dir, "current")


def file_path(journal_dir: str, file_id: int) -> str:
    return os.path.join(current_dir(journal_dir), f"{file_id:x}.txn")


def list_files(journal_dir: str) -> list[tuple[int, str]]:
    """(file_id, path) of every journal file, in id order; [] if the directory is missing."""
    cur = current_dir(journal_dir)
    try:
        names = os.listdir(cur)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        m = _NAME_RE.match(name)
        if m:
            out.append((int(m.group(1), 16), os.path.join(cur, name)))
    out.sort()
    return out
