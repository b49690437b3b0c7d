"""Journal file and record formats (STORAGE.md, "Journal files").

Format 1 (still read): a 16-byte header `BKJN | version u32 = 1 | file_id u64`,
then records `length u32 | crc32c(body) u32 | body` back to back, appended.

Format 2 (written by default, `journal_format_version_to_write`): a header block
of `alignment` bytes, `BKJN | version u32 = 2 | file_id u64 | alignment u32`
then zeros; records from offset `alignment` on, `length u32 | crc32c(seed, body)
u32 | body`, with `seed = file_seed(file_id)`. The file is written in place:
preallocated (zeros) or recycled (an old journal file renamed and given a new
header), so its tail holds zeros or records from a previous life; those fail
the CRC under this file's seed and are never replayed. Every group ends on an
alignment boundary (a PADDING record fills the gap), and a file that is done
with (rotated, or replayed after a crash) ends with a FILE_END record: replay
of a file that is not the last stops only there.

A body always starts with `ledger_id i64 | entry_id i64`: an entry record is the
stored entry itself; a meta-record puts a negative meta id where the entry id is;
the format-2 filler records have ledger id -1 (never a ledger's: ids are >= 0).
Files are `<journal_dir>/current/<file_id hex>.txn`.
"""
from __future__ import annotations

import os
import re
import struct
from typing import NamedTuple

from bk.config import BookieConfig
from bk._native import load
from bk.errors import CorruptedStorageError

_crc32c = load("journal").crc32c

MAGIC = b"BKJN"
FORMAT_V1 = 1
FORMAT_V2 = 2
FORMAT_VERSION = FORMAT_V2  # the newest this code writes (format 1 is still read and writable)
FORMATS = (FORMAT_V1, FORMAT_V2)
HEADER_BYTES = 16  # format 1's header; format 2's header block is `alignment` bytes
V2_HEADER_BYTES = 20
RECORD_HEADER_BYTES = 8  # length u32 + crc32c u32
MIN_BODY_BYTES = 16  # ledger_id i64 + entry_id i64

# BookKeeper's meta-record ids (stored where an entry record has its entry id).
MASTER_KEY = -0x1000
FENCE = -0x2000
EXPLICIT_LAC = -0x8000
META_IDS = frozenset((MASTER_KEY, FENCE, EXPLICIT_LAC))

# Format 2 filler records (ledger id FILLER_LEDGER): skipped by replay, never handed on.
FILLER_LEDGER = -1
PADDING = -0x100  # fills a group up to the alignment boundary
FILE_END = -0x200  # nothing after it in this file is journal data
FILLER_BYTES = RECORD_HEADER_BYTES + MIN_BODY_BYTES  # the smallest filler record
# Records are bounded by the wire frame size; the floor keeps files written with
# a larger frame setting readable after the setting is lowered.
MAX_RECORD_FLOOR_BYTES = 64 * 1024 * 1024

_header = struct.Struct(">4sIQ")
_header_v2 = struct.Struct(">4sIQI")
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
    """Format 1's header."""
    return _header.pack(MAGIC, FORMAT_V1, file_id)


def encode_header_v2(file_id: int, alignment: int) -> bytes:
    """Format 2's header block (`alignment` bytes)."""
    head = _header_v2.pack(MAGIC, FORMAT_V2, file_id, alignment)
    return head + bytes(alignment - len(head))


def file_seed(file_id: int) -> int:
    """The CRC seed of format 2 file `file_id`: never 0 (format 1's), differs per id."""
    return _crc32c(b"BKJN" + file_id.to_bytes(8, "big")) or 1


def filler_body(kind: int, nbytes: int) -> bytes:
    """Body of a filler record (PADDING or FILE_END) whose framed size is `nbytes`."""
    return _ids.pack(FILLER_LEDGER, kind) + bytes(nbytes - FILLER_BYTES)


def check_header(data: bytes, file_id: int, path: str) -> tuple[int, int]:
    """(format version, offset of the first record) of journal file `file_id`'s header
    `data` (at least V2_HEADER_BYTES when the file has them); CorruptedStorageError if bad."""
    if len(data) < HEADER_BYTES:
        raise CorruptedStorageError(
            f"journal file {path}: header is {len(data)} bytes, expected {HEADER_BYTES}", path=path, offset=0)
    magic, version, header_id = _header.unpack_from(data, 0)
    if magic != MAGIC:
        raise CorruptedStorageError(f"journal file {path}: bad magic {magic!r} at offset 0", path=path, offset=0)
    if version not in FORMATS:
        raise CorruptedStorageError(
            f"journal file {path}: unsupported format version {version} at offset 4", path=path, offset=4)
    if header_id != file_id:
        raise CorruptedStorageError(
            f"journal file {path}: header names file id {header_id:x}, the file name says {file_id:x}",
            path=path, offset=8)
    if version == FORMAT_V1:
        return version, HEADER_BYTES
    if len(data) < V2_HEADER_BYTES:
        raise CorruptedStorageError(
            f"journal file {path}: format 2 header is {len(data)} bytes, expected {V2_HEADER_BYTES}",
            path=path, offset=0)
    alignment = _header_v2.unpack_from(data, 0)[3]
    if not valid_alignment(alignment):
        raise CorruptedStorageError(
            f"journal file {path}: bad alignment {alignment} in the header at offset 16", path=path, offset=16)
    return version, alignment


def valid_alignment(n: int) -> bool:
    """A power of two from 512 (a disk sector) to 1 MiB."""
    return 512 <= n <= 1 << 20 and n & (n - 1) == 0


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
