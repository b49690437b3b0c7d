"""Index byte kernel, pure-Python twin of `_index.pyx` (same API, same results).

Location records of the LMDB index (STORAGE.md "Index (LMDB)"): key
`ledger_id u64 BE | entry_id u64 BE` (ids 0..2**63-1, so byte order is
(ledger, entry) order), value `location u64 BE`.

location_items(ledger_ids, entry_ids, locations) -> (items, ascending)
    Three lists of equal length (parallel columns). items is a list of
    (key: bytes, value: bytes) 2-tuples, ready for LMDB's putmulti; ascending
    is True when every key is strictly greater than the one before (an empty
    or one-item list is ascending).
    Raises ValueError when the lists differ in length or an id is outside
    0..2**63-1 or a location outside 0..2**64-1, TypeError when an element
    is not an int (anything with __index__ counts as an int).
"""
from __future__ import annotations

import operator
import struct

MAX_ID = (1 << 63) - 1
MAX_LOCATION = (1 << 64) - 1

_KEY = struct.Struct(">QQ")
_VALUE = struct.Struct(">Q")


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


def location_items(ledger_ids: list, entry_ids: list, locations: list) -> tuple[list, bool]:
    n = len(ledger_ids)
    if len(entry_ids) != n or len(locations) != n:
        raise ValueError(f"location columns differ in length: {n}, {len(entry_ids)}, {len(locations)}")
    try:
        keys = list(map(_KEY.pack, ledger_ids, entry_ids))
        values = list(map(_VALUE.pack, locations))
    except (struct.error, TypeError, OverflowError):
        raise _first_bad(ledger_ids, entry_ids, locations) from None
    # ids above MAX_ID packed as u64 have their top bit set: checked at C speed on one join
    joined = b"".join(keys)
    if joined and (max(joined[0::16]) >= 0x80 or max(joined[8::16]) >= 0x80):
        raise _first_bad(ledger_ids, entry_ids, locations)
    ascending = all(map(operator.lt, keys, keys[1:]))
    return list(zip(keys, values)), ascending
