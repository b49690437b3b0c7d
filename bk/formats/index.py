"""Byte layouts of the LMDB index (STORAGE.md "Index (LMDB)"): keys and values.

bk/index/state.py encodes and checks them (LedgerState, log marks, flags); the index kernels
(bk/_native/_index.pyx, index_py.py) pack location records with these names.

    locations  key ledger_id u64 | entry_id u64 (LOCATION_KEY, LOCATION_KEY_BYTES; ids are
               0..MAX_ID, so byte order is (ledger, entry) order)   value location u64
               (LOCATION_VALUE). The kernels pack key then value as one LOCATION_RECORD
               (LOCATION_RECORD_BYTES) per location for LMDB's putmulti.
    ledgers    key ledger_id u64 (LEDGER_KEY)   value flags u8 (LEDGER_FLAG_*) | key_len u8 |
               master_key | explicit_lac_len u32 | explicit_lac (LEDGER_RECORD_MIN_BYTES when
               both are empty)
    state      b"unclean_shutdown", b"needs_integrity_check" -> b"1" (STATE_FLAG_TRUE);
               b"logmark/<journal index>" -> file_id u64 | offset u64 (LOG_MARK_VALUE);
               b"compacting/<log id>" -> b"" (a compaction of that entry log started: GC.md)
"""
from __future__ import annotations

import struct

MAX_ID = (1 << 63) - 1  # ledger and entry ids stored in the index
MAX_LOCATION = (1 << 64) - 1

LOCATION_KEY = struct.Struct(">QQ")  # unsigned packing rejects negative ids
LOCATION_KEY_BYTES = 16
LOCATION_VALUE = struct.Struct(">Q")
LOCATION_VALUE_BYTES = 8
LOCATION_RECORD = struct.Struct(">QQQ")  # key then value, as the kernels pack them
LOCATION_RECORD_BYTES = LOCATION_KEY_BYTES + LOCATION_VALUE_BYTES  # 24

LEDGER_KEY = struct.Struct(">Q")
LEDGER_FLAG_EXISTS = 1
LEDGER_FLAG_FENCED = 2
LEDGER_FLAG_LIMBO = 4
LEDGER_FLAGS_KNOWN = LEDGER_FLAG_EXISTS | LEDGER_FLAG_FENCED | LEDGER_FLAG_LIMBO
LEDGER_MAX_KEY_BYTES = 255  # the master key's length is a u8
LEDGER_LAC_LENGTH = struct.Struct(">I")  # the explicit LAC's length
LEDGER_RECORD_MIN_BYTES = 2 + 4  # flags, key_len, lac_len

LOG_MARK_VALUE = struct.Struct(">QQ")  # file_id offset
LOG_MARK_PREFIX = b"logmark/"
COMPACTING_PREFIX = b"compacting/"
STATE_UNCLEAN_SHUTDOWN = "unclean_shutdown"
STATE_NEEDS_INTEGRITY_CHECK = "needs_integrity_check"
STATE_FLAG_TRUE = b"1"

CYTHON_NAMES = ("LOCATION_KEY_BYTES", "LOCATION_VALUE_BYTES", "LOCATION_RECORD_BYTES")
