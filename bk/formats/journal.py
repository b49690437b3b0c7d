"""Journal file and record layouts (STORAGE.md, "Journal files"); bk/journal/records.py reads
and writes them, the journal kernels (bk/_native/_journal.pyx, journal_py.py) frame and scan them.

Format 1 (still read): a JOURNAL_V1_HEADER_BYTES (16) header
`BKJN | version u32 = 1 | file_id u64`, then records back to back.

Format 2 (written by default): a header block of `alignment` bytes (a power of two, 512 to
1 MiB) starting `BKJN | version u32 = 2 | file_id u64 | alignment u32` (JOURNAL_V2_HEADER_BYTES,
20), then zeros; records from offset `alignment` on. Every group ends on an alignment boundary
(a PADDING filler record fills the gap); a finished file ends with a FILE_END filler record.

A record: `length u32 | crc32c(seed, body) u32 | body` (JOURNAL_RECORD_HEAD_BYTES, 8, then
`length` bytes; seed 0 in format 1, the file's seed in format 2). A body always starts with
`ledger_id i64 | entry_id i64` (entry.ENTRY_IDS_BYTES): an entry record is the stored entry
itself; a meta-record puts a negative meta id where the entry id is; filler records have ledger
id JOURNAL_FILLER_LEDGER (-1, never a ledger's: ids are >= 0). All integers big-endian.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

from bk.formats.entry import ENTRY_IDS_BYTES

JOURNAL_MAGIC = b"BKJN"
JOURNAL_FORMAT_V1 = 1
JOURNAL_FORMAT_V2 = 2
JOURNAL_FORMATS = (JOURNAL_FORMAT_V1, JOURNAL_FORMAT_V2)
JOURNAL_V1_HEADER = struct.Struct(">4sIQ")  # magic version file_id
JOURNAL_V2_HEADER = struct.Struct(">4sIQI")  # magic version file_id alignment
JOURNAL_V1_HEADER_BYTES = 16  # format 1's whole header; format 2's block is `alignment` bytes
JOURNAL_V2_HEADER_BYTES = 20  # the fields at the start of format 2's header block
JOURNAL_ALIGNMENT_OFFSET = 16  # where format 2's alignment field sits
JOURNAL_MIN_ALIGNMENT = 512  # a disk sector
JOURNAL_MAX_ALIGNMENT = 1 << 20

JOURNAL_RECORD_HEAD = struct.Struct(">II")  # length crc32c
JOURNAL_RECORD_HEAD_BYTES = 8
JOURNAL_MIN_BODY_BYTES = ENTRY_IDS_BYTES  # ledger_id i64 + entry_id i64

# BookKeeper's meta-record ids (stored where an entry record has its entry id).
JOURNAL_META_MASTER_KEY = -0x1000
JOURNAL_META_FENCE = -0x2000
JOURNAL_META_EXPLICIT_LAC = -0x8000

# Format 2 filler records (ledger id JOURNAL_FILLER_LEDGER): skipped by replay, never handed on.
JOURNAL_FILLER_LEDGER = -1
JOURNAL_FILLER_PADDING = -0x100  # fills a group up to the alignment boundary
JOURNAL_FILLER_FILE_END = -0x200  # nothing after it in this file is journal data
JOURNAL_FILLER_BYTES = JOURNAL_RECORD_HEAD_BYTES + JOURNAL_MIN_BODY_BYTES  # the smallest filler record

# Records are bounded by the wire frame size; the floor keeps files written with a larger
# frame setting readable after the setting is lowered.
JOURNAL_MAX_RECORD_FLOOR_BYTES = 64 * 1024 * 1024

# What the journal kernels' scan_records reports (both kernels return these numbers).
JOURNAL_SCAN_CLEAN = 0  # records end exactly at `end`
JOURNAL_SCAN_SHORT = 1  # a short or truncated record at `stop`
JOURNAL_SCAN_BAD_LENGTH = 2  # length 0 or > max_record_bytes at `stop`
JOURNAL_SCAN_BAD_CRC = 3  # CRC mismatch at `stop`

JOURNAL_FILE_SUFFIX = ".txn"  # <journal_dir>/current/<file_id hex>.txn


class LogMark(NamedTuple):
    """A journal position: records at or after it are replayed. Ordered by (file_id, offset).
    The index persists it as its LOG_MARK_VALUE (bk/formats/index.py)."""

    file_id: int
    offset: int


CYTHON_NAMES = ("JOURNAL_RECORD_HEAD_BYTES", "JOURNAL_SCAN_CLEAN", "JOURNAL_SCAN_SHORT", "JOURNAL_SCAN_BAD_LENGTH",
                "JOURNAL_SCAN_BAD_CRC")
