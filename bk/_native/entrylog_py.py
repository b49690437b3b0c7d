"""Entry-log byte kernel, pure-Python twin of `_entrylog.pyx` (same API, same results).

Record layout (STORAGE.md "Entry logs"): `size u32 BE | entry (size bytes)`,
and every entry begins with `ledger_id i64 BE | entry_id i64 BE`.

frame_entries(entries, base_offset) -> (frame: bytes, offsets: list[int])
    Builds the records back to back. offsets[i] = base_offset + position of
    record i's size field in `frame`. The caller may fold the log id into
    base_offset (`(log_id << 32) | file_offset`) to get locations directly.
    Raises TypeError for a non bytes-like entry, ValueError for one of 2**32
    bytes or more (its size would not fit the u32 size field).

scan_log(buf, start, end, max_entry_bytes) -> (records, stop_offset, status)
    Walks the records of buf[start:end]. records is a list of
    (offset, size, ledger_id, entry_id) with offset the position of the size
    field in `buf`. Scanning stops at the first record that is not whole:
      status 0 (CLEAN)     the records end exactly at `end`; stop_offset == end
      status 1 (TRUNCATED) the record at stop_offset runs past `end` (torn tail,
                           or only the start of a record is in this chunk)
      status 2 (BAD_SIZE)  the size at stop_offset is < 16 (cannot hold the ids)
                           or > max_entry_bytes
    Raises ValueError when not 0 <= start <= end <= len(buf).
"""
from __future__ import annotations

import struct

SCAN_CLEAN = 0
SCAN_TRUNCATED = 1
SCAN_BAD_SIZE = 2
MIN_ENTRY_BYTES = 16  # ledger id + entry id

_U32 = struct.Struct(">I")
_SIZE_IDS = struct.Struct(">Iqq")
_MAX_SIZE = 0xFFFFFFFF


def frame_entries(entries: list, base_offset: int) -> tuple[bytes, list[int]]:
    sizes = []
    for e in entries:
        n = memoryview(e).nbytes  # TypeError for non-buffers, like the native kernel
        if n > _MAX_SIZE:
            raise ValueError(f"entry of {n} bytes does not fit a u32 size field")
        sizes.append(n)
    parts = []
    offsets = []
    pos = base_offset
    pack = _U32.pack
    for e, n in zip(entries, sizes):
        offsets.append(pos)
        parts.append(pack(n))
        parts.append(e)
        pos += 4 + n
    return b"".join(parts), offsets


def scan_log(buf, start: int, end: int, max_entry_bytes: int) -> tuple[list, int, int]:
    view = memoryview(buf).cast("B")
    if not 0 <= start <= end <= view.nbytes:
        raise ValueError(f"bad scan range [{start}, {end}) for a buffer of {view.nbytes} bytes")
    records = []
    pos = start
    unpack = _SIZE_IDS.unpack_from
    unpack_size = _U32.unpack_from
    while pos < end:
        if end - pos < 4:
            return records, pos, SCAN_TRUNCATED
        (size,) = unpack_size(view, pos)
        if size < MIN_ENTRY_BYTES or size > max_entry_bytes:
            return records, pos, SCAN_BAD_SIZE
        if end - pos - 4 < size:
            return records, pos, SCAN_TRUNCATED
        _, ledger_id, entry_id = unpack(view, pos)
        records.append((pos, size, ledger_id, entry_id))
        pos += 4 + size
    return records, pos, SCAN_CLEAN
