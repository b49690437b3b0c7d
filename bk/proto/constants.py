"""BookKeeper wire enums: op codes, status codes (v2 and v3), flags, sizes (PROTOCOL.md).

Names keep BookKeeper's spellings so a BookKeeper reader finds them
(`OpCode.ADD_ENTRY`, `StatusCode.EFENCED`). Nothing is defined twice: op codes,
flags and sizes come from bk.formats.wire (the one layout package, shared with
Cython), digest lengths from bk.formats.entry, and the status table from the BookieError classes of bk.errors (each
carries its v2 `code` and its v3 `v3_code`).
"""
from __future__ import annotations

from enum import IntEnum

from bk.errors import STATUS_CLASSES
from bk.formats import entry as _entry, wire as layout
from bk.formats.entry import DigestType  # noqa: F401  (re-exported: the ledger metadata enum)
from bk.formats.wire import (  # noqa: F401  (re-exported names)
    ADD_REQUEST_MIN_BYTES, ADD_RESPONSE_BYTES, BATCH_READ_REQUEST_BYTES, BATCH_READ_RESPONSE_HEADER_BYTES,
    BOOKIE_INFO_FREE_DISK_SPACE, BOOKIE_INFO_TOTAL_DISK_CAPACITY, BOOKIE_PORT, DEFAULT_MAX_FRAME_SIZE_BYTES,
    ENTRY_HEADER_LENGTH, FLAG_DO_FENCING, FLAG_HIGH_PRIORITY, FLAG_NONE, FLAG_RECOVERY_ADD, FRAME_LENGTH_BYTES,
    GET_BOOKIE_INFO_REQUEST_BYTES, GET_BOOKIE_INFO_RESPONSE_BYTES, INVALID_ENTRY_ID,
    LAC_HEADER_LENGTH, MASTER_KEY_LENGTH, MAX_ACCEPTED_VERSION, PROTOCOL_VERSION, READ_LAC_REQUEST_BYTES,
    READ_REQUEST_BYTES, READ_RESPONSE_HEADER_BYTES, WRITE_LAC_REQUEST_MIN_BYTES, WRITE_LAC_RESPONSE_BYTES,
)

OpCode = IntEnum("OpCode", sorted(((name[3:], getattr(layout, name)) for name in dir(layout) if name.startswith("OP_")),
                                  key=lambda item: item[1]))
OpCode.__doc__ = "v2 op codes (the header's op byte)."

# The v2 status table, from bk.errors' classes (EOK has no exception class).
StatusCode = IntEnum("StatusCode", [("EOK", 0)] + sorted(((cls.name, cls.code) for cls in STATUS_CLASSES),
                                                        key=lambda item: item[1]))
StatusCode.__doc__ = "v2 return codes; V3_STATUS maps each to its v3 protobuf StatusCode value."

# v2 code -> v3 protobuf StatusCode value, and back.
V3_STATUS: dict[StatusCode, int] = {StatusCode.EOK: 0, **{StatusCode(cls.code): cls.v3_code for cls in STATUS_CLASSES}}
V2_STATUS_BY_V3: dict[int, StatusCode] = {v3: v2 for v2, v3 in V3_STATUS.items()}


# Digest bytes after the ENTRY_HEADER_LENGTH header of a digest-framed entry (pure: spark/ reads it).
DIGEST_LENGTH_BYTES = {DigestType(number): n for number, n in _entry.DIGEST_LENGTH_BY_TYPE.items()}
