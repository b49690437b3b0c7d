"""Index byte kernel, pure-Python twin of `_index.pyx` (same API, same results).

Location records of the LMDB index (STORAGE.md "Index (LMDB)"; defined in
bk/formats/index.py): key
`ledger_id u64 BE | entry_id u64 BE` (ids 0..2**63-1, so byte order is
(ledger, entry) order), value `location u64 BE`.

pack_locations(ledger_ids, entry_ids, locations) -> (packed, ascending)
    Three lists of equal length (parallel columns) packed into one bytes
    object of RECORD_BYTES (24) per location: the 16-byte key then the 8-byte
    value. ascending is True when every key is strictly greater than the one
    before (an empty or one-item batch is ascending).
    Raises ValueError when the lists differ in length or an id is outside
    0..2**63-1 or a location outside 0..2**64-1, TypeError when an element
    is not an int (anything with __index__ counts as an int); the first bad
    element in (ledger id, entry id, location) order is the one reported.

location_items(packed, start, stop) -> iterator of (key: bytes, value: bytes)
    The records [start, stop) of `packed` as 2-tuples, made one at a time, for
    LMDB's putmulti: a batch never exists as a list of tuples, so it costs no
    memory per location and nothing for the cyclic GC. Raises ValueError when
    `packed` is not whole records or the range is outside it.
"""
from __future__ import annotations

import operator
import struct

from bk.formats.index import LOCATION_KEY_BYTES as KEY_BYTES
from bk.formats.index import LOCATION_RECORD as _RECORD
from bk.formats.index import LOCATION_RECORD_BYTES as RECORD_BYTES
from bk.formats.index import MAX_ID, MAX_LOCATION


def _first_bad(ledger_ids: list, entry_ids: list, locations: list) -> Exception:
    """The error the native kernel raises for the first bad element (slow path)."""
    for lid, eid, loc in zip(ledger_ids, entry_ids, locations):
        for name, x, top in (("ledger id", lid, MAX_ID), ("entry id", eid, MAX_ID), ("location", loc, MAX_LOCATION)):
            try:
                v = operator.index(x)
            except TypeError:
                return TypeError(f"{name} must be an int, not {type(x).__name__}")
            if not 0 <= v <= top:
                return ValueError(f"{name} {v} is outside 0..{top}")
    return ValueError("bad location columns")  # not reached: the caller saw a bad element


def pack_locations(ledger_ids: list, entry_ids: list, locations: list) -> tuple[bytes, bool]:
    n = len(ledger_ids)
    if len(entry_ids) != n or len(locations) != n:
        raise ValueError(f"location columns differ in length: {n}, {len(entry_ids)}, {len(locations)}")
    try:
        records = list(map(_RECORD.pack, ledger_ids, entry_ids, locations))
    except (struct.error, TypeError, OverflowError):
        raise _first_bad(ledger_ids, entry_ids, locations) from None
    packed = b"".join(records)
    # ids above MAX_ID packed as u64 have their top bit set: checked at C speed on the join
    if packed and (max(packed[0::RECORD_BYTES]) >= 0x80 or max(packed[KEY_BYTES // 2::RECORD_BYTES]) >= 0x80):
        raise _first_bad(ledger_ids, entry_ids, locations)
    keys = [r[:KEY_BYTES] for r in records]
    ascending = all(map(operator.lt, keys, keys[1:]))
    return packed, ascending


def location_items(packed, start: int, stop: int):
    packed = bytes(packed)
    n, rest = divmod(len(packed), RECORD_BYTES)
    if rest:
        raise ValueError(f"packed locations of {len(packed)} bytes are not whole {RECORD_BYTES}-byte records")
    if not 0 <= start <= stop <= n:
        raise ValueError(f"bad record range [{start}, {stop}) of {n} records")
    return ((packed[i:i + KEY_BYTES], packed[i + KEY_BYTES:i + RECORD_BYTES])
            for i in range(start * RECORD_BYTES, stop * RECORD_BYTES, RECORD_BYTES))
