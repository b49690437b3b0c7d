"""Entry-log byte kernel, pure-Python twin of `_entrylog.pyx` (same API, same results).

Record layout (STORAGE.md "Entry logs"; defined in bk/formats/entrylog.py):
`size u32 BE | entry (size bytes)`, and every entry begins with
`ledger_id i64 BE | entry_id i64 BE`.

frame_entries(entries, base_offset) -> (frame: bytes, offsets: list[int])
    Builds the records back to back. offsets[i] = base_offset + position of
    record i's size field in `frame`. The caller may fold the log id into
    base_offset (`(log_id << 32) | file_offset`) to get locations directly.
    Raises TypeError for a non bytes-like entry, ValueError for one of 2**32
    bytes or more (its size would not fit the u32 size field).

frame_slice(entries, start, base_offset, max_frame_bytes) -> (frame, offsets, stop)
    frame_entries(entries[start:stop], base_offset) for the longest run from
    `start` whose frame is at most max_frame_bytes, but always at least one
    entry (stop == start only when start == len(entries)). Bounds the memory
    of framing a big batch. Raises ValueError when start is outside
    0..len(entries), and like frame_entries for a bad entry in the run.

record_headers(entries, start, base_offset, max_frame_bytes) -> (headers, offsets, stop)
    The run frame_slice would take, without copying the entries: headers is
    the 4-byte size field of each record back to back (4 * (stop - start)
    bytes), offsets and stop as frame_slice gives them. Writing header i then
    entries[start + i] for each i gives frame_slice's frame (big entries go to
    the file as separate buffers, with no copy). Same errors as frame_slice.

check_sizes(entries, min_bytes, max_bytes) -> (total_bytes, first_bad)
    Checks that every entry is min_bytes..max_bytes long, in order. first_bad
    is -1 when all are, and total_bytes is then the sum of their sizes;
    otherwise first_bad is the index of the first one that is not (and
    total_bytes the sum of the sizes before it). TypeError for a non
    bytes-like entry met before any bad size.

ledger_runs(entries, start, stop) -> list[(ledger_id, framed_bytes)]
    Runs of consecutive entries of entries[start:stop] with the same ledger id
    (their first 8 bytes, signed big-endian): one (ledger_id, bytes) per run,
    bytes = sum of 4 + len(entry) over the run (the records' bytes in a log).
    A batch sorted by ledger gives one item per ledger. Raises ValueError for
    a bad range or an entry shorter than 8 bytes, TypeError for a non
    bytes-like entry.

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

preads(reads) -> list[bytes | int]
    Per (fd, n, offset) of `reads`, the n bytes from offset (fewer at the file's end), or the
    errno of its failure as an int. The native kernel does them all with the GIL released once.
"""
from __future__ import annotations

import os

from bk.formats.entrylog import LOG_MIN_ENTRY_BYTES as MIN_ENTRY_BYTES
from bk.formats.entrylog import LOG_RECORD_HEAD as _SIZE_IDS  # a record's size field, then its entry's two ids
from bk.formats.entrylog import LOG_SCAN_BAD_SIZE as SCAN_BAD_SIZE
from bk.formats.entrylog import LOG_SCAN_CLEAN as SCAN_CLEAN
from bk.formats.entrylog import LOG_SCAN_TRUNCATED as SCAN_TRUNCATED
from bk.formats.entrylog import LOG_SIZE_FIELD as _U32
from bk.formats.entrylog import LOG_SIZE_FIELD_BYTES as _F

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
        pos += _F + n
    return b"".join(parts), offsets


def _size_of(e) -> int:
    return len(e) if type(e) is bytes else memoryview(e).nbytes  # TypeError for non-buffers


def frame_slice(entries: list, start: int, base_offset: int, max_frame_bytes: int) -> tuple[bytes, list[int], int]:
    n = len(entries)
    if not 0 <= start <= n:
        raise ValueError(f"start {start} is outside 0..{n}")
    stop, total = start, 0
    while stop < n:
        size = _size_of(entries[stop])
        if size > _MAX_SIZE:
            raise ValueError(f"entry of {size} bytes does not fit a u32 size field")
        if stop > start and total + _F + size > max_frame_bytes:
            break
        total += _F + size
        stop += 1
    frame, offsets = frame_entries(entries[start:stop], base_offset)
    return frame, offsets, stop


def record_headers(entries: list, start: int, base_offset: int, max_frame_bytes: int) -> tuple[bytes, list[int], int]:
    n = len(entries)
    if not 0 <= start <= n:
        raise ValueError(f"start {start} is outside 0..{n}")
    stop, total = start, 0
    while stop < n:
        size = _size_of(entries[stop])
        if size > _MAX_SIZE:
            raise ValueError(f"entry of {size} bytes does not fit a u32 size field")
        if stop > start and total + _F + size > max_frame_bytes:
            break
        total += _F + size
        stop += 1
    sizes = [_size_of(e) for e in entries[start:stop]]
    offsets = []
    pos = base_offset
    for size in sizes:
        offsets.append(pos)
        pos += _F + size
    return b"".join(map(_U32.pack, sizes)), offsets, stop


def check_sizes(entries: list, min_bytes: int, max_bytes: int) -> tuple[int, int]:
    total = 0
    for i, e in enumerate(entries):
        size = _size_of(e)
        if not min_bytes <= size <= max_bytes:
            return total, i
        total += size
    return total, -1


def ledger_runs(entries: list, start: int, stop: int) -> list[tuple[int, int]]:
    if not 0 <= start <= stop <= len(entries):
        raise ValueError(f"bad range [{start}, {stop}) of {len(entries)} entries")
    runs: list[tuple[int, int]] = []
    prev = None
    run_bytes = 0
    for i in range(start, stop):
        e = entries[i]
        size = _size_of(e)
        if size < 8:
            raise ValueError(f"entry {i} is {size} bytes, shorter than its ledger id")
        head = bytes(e[:8]) if type(e) is not bytes else e[:8]
        if head == prev:
            run_bytes += _F + size
            continue
        if prev is not None:
            runs.append((int.from_bytes(prev, "big", signed=True), run_bytes))
        prev, run_bytes = head, _F + size
    if prev is not None:
        runs.append((int.from_bytes(prev, "big", signed=True), run_bytes))
    return runs


def scan_log(buf, start: int, end: int, max_entry_bytes: int) -> tuple[list, int, int]:
    view = memoryview(buf).cast("B")
    if not 0 <= start <= end <= view.nbytes:
        raise ValueError(f"bad scan range [{start}, {end}) for a buffer of {view.nbytes} bytes")
    records = []
    pos = start
    unpack = _SIZE_IDS.unpack_from
    unpack_size = _U32.unpack_from
    while pos < end:
        if end - pos < _F:
            return records, pos, SCAN_TRUNCATED
        (size,) = unpack_size(view, pos)
        if size < MIN_ENTRY_BYTES or size > max_entry_bytes:
            return records, pos, SCAN_BAD_SIZE
        if end - pos - _F < size:
            return records, pos, SCAN_TRUNCATED
        _, ledger_id, entry_id = unpack(view, pos)
        records.append((pos, size, ledger_id, entry_id))
        pos += _F + size
    return records, pos, SCAN_CLEAN


def preads(reads: list) -> list:
    out: list = []
    for fd, n, offset in reads:
        if n < 0 or offset < 0:
            raise ValueError(f"bad read ({fd}, {n}, {offset})")
        try:
            data = b""
            while len(data) < n:  # os.pread may return less before the end (a signal)
                part = os.pread(fd, n - len(data), offset + len(data))
                if not part:
                    break
                data += part
            out.append(data)
        except OSError as e:
            out.append(e.errno)
    return out
