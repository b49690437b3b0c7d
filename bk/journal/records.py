"""Journal files: headers, meta-records, file names (STORAGE.md, "Journal files").

The byte layouts are bk/formats/journal.py's (one home for every format); this module
writes and checks them, and turns a bad header into CorruptedStorageError.

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

from bk.config import BookieConfig
from bk._native import load
from bk.errors import CorruptedStorageError
from bk.formats.entry import ENTRY_IDS as _ids
from bk.formats.journal import (JOURNAL_ALIGNMENT_OFFSET, JOURNAL_FILE_SUFFIX, JOURNAL_FILLER_BYTES,
                                JOURNAL_FILLER_FILE_END, JOURNAL_FILLER_LEDGER, JOURNAL_FILLER_PADDING,
                                JOURNAL_FORMAT_V1, JOURNAL_FORMAT_V2, JOURNAL_FORMATS, JOURNAL_MAGIC,
                                JOURNAL_MAX_ALIGNMENT, JOURNAL_MAX_RECORD_FLOOR_BYTES, JOURNAL_META_EXPLICIT_LAC,
                                JOURNAL_META_FENCE, JOURNAL_META_MASTER_KEY, JOURNAL_MIN_ALIGNMENT,
                                JOURNAL_MIN_BODY_BYTES, JOURNAL_V1_HEADER, JOURNAL_V1_HEADER_BYTES, JOURNAL_V2_HEADER,
                                JOURNAL_V2_HEADER_BYTES, LogMark)

_crc32c = load("journal").crc32c

# The names the journal package has always used, bound to the one definition.
FORMAT_V1 = JOURNAL_FORMAT_V1
FORMAT_V2 = JOURNAL_FORMAT_V2
FORMAT_VERSION = FORMAT_V2  # the newest this code writes (format 1 is still read and writable)
FORMATS = JOURNAL_FORMATS
MIN_BODY_BYTES = JOURNAL_MIN_BODY_BYTES  # ledger_id i64 + entry_id i64
MASTER_KEY = JOURNAL_META_MASTER_KEY  # BookKeeper's meta-record ids
FENCE = JOURNAL_META_FENCE
EXPLICIT_LAC = JOURNAL_META_EXPLICIT_LAC
META_IDS = frozenset((MASTER_KEY, FENCE, EXPLICIT_LAC))
FILLER_LEDGER = JOURNAL_FILLER_LEDGER  # format 2 filler records: skipped by replay, never handed on
PADDING = JOURNAL_FILLER_PADDING
FILE_END = JOURNAL_FILLER_FILE_END
FILLER_BYTES = JOURNAL_FILLER_BYTES

_NAME_RE = re.compile(r"^([0-9a-f]+)" + re.escape(JOURNAL_FILE_SUFFIX) + "$")


def max_record_bytes(config: BookieConfig) -> int:
    """Largest record body log() accepts and replay considers a sane length."""
    return max(config.max_frame_size_bytes, JOURNAL_MAX_RECORD_FLOOR_BYTES)


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
    return JOURNAL_V1_HEADER.pack(JOURNAL_MAGIC, FORMAT_V1, file_id)


def encode_header_v2(file_id: int, alignment: int) -> bytes:
    """Format 2's header block (`alignment` bytes)."""
    head = JOURNAL_V2_HEADER.pack(JOURNAL_MAGIC, FORMAT_V2, file_id, alignment)
    return head + bytes(alignment - len(head))


def file_seed(file_id: int) -> int:
    """The CRC seed of format 2 file `file_id`: never 0 (format 1's), differs per id."""
    return _crc32c(JOURNAL_MAGIC + file_id.to_bytes(8, "big")) or 1


def filler_body(kind: int, nbytes: int) -> bytes:
    """Body of a filler record (PADDING or FILE_END) whose framed size is `nbytes`."""
    return _ids.pack(FILLER_LEDGER, kind) + bytes(nbytes - FILLER_BYTES)


def check_header(data: bytes, file_id: int, path: str) -> tuple[int, int]:
    """(format version, offset of the first record) of journal file `file_id`'s header
    `data` (at least JOURNAL_V2_HEADER_BYTES when the file has them); CorruptedStorageError if bad."""
    if len(data) < JOURNAL_V1_HEADER_BYTES:
        raise CorruptedStorageError(
            f"journal file {path}: header is {len(data)} bytes, expected {JOURNAL_V1_HEADER_BYTES}",
            path=path, offset=0)
    magic, version, header_id = JOURNAL_V1_HEADER.unpack_from(data, 0)
    if magic != JOURNAL_MAGIC:
        raise CorruptedStorageError(f"journal file {path}: bad magic {magic!r} at offset 0", path=path, offset=0)
    if version not in FORMATS:
        raise CorruptedStorageError(
            f"journal file {path}: unsupported format version {version} at offset 4", path=path, offset=4)
    if header_id != file_id:
        raise CorruptedStorageError(
            f"journal file {path}: header names file id {header_id:x}, the file name says {file_id:x}",
            path=path, offset=8)
    if version == FORMAT_V1:
        return version, JOURNAL_V1_HEADER_BYTES
    if len(data) < JOURNAL_V2_HEADER_BYTES:
        raise CorruptedStorageError(
            f"journal file {path}: format 2 header is {len(data)} bytes, expected {JOURNAL_V2_HEADER_BYTES}",
            path=path, offset=0)
    alignment = JOURNAL_V2_HEADER.unpack_from(data, 0)[3]
    if not valid_alignment(alignment):
        raise CorruptedStorageError(
            f"journal file {path}: bad alignment {alignment} in the header at offset {JOURNAL_ALIGNMENT_OFFSET}",
            path=path, offset=JOURNAL_ALIGNMENT_OFFSET)
    return version, alignment


def valid_alignment(n: int) -> bool:
    """A power of two from 512 (a disk sector) to 1 MiB."""
    return JOURNAL_MIN_ALIGNMENT <= n <= JOURNAL_MAX_ALIGNMENT and n & (n - 1) == 0


def current_dir(journal_dir: str) -> str:
    return os.path.join(journal_dir, "current")


def file_path(journal_dir: str, file_id: int) -> str:
    return os.path.join(current_dir(journal_dir), f"{file_id:x}{JOURNAL_FILE_SUFFIX}")


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
