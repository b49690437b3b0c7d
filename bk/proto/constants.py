"""BookKeeper v2 wire constants: op codes, status codes, flags, sizes (PROTOCOL.md).

Names keep BookKeeper's spellings so a BookKeeper reader finds them
(`OpCode.ADD_ENTRY`, `StatusCode.EFENCED`). Status values are the v2 codes;
`V3_STATUS` maps them to the v3 protobuf `StatusCode` values for later.
"""
from __future__ import annotations

from enum import IntEnum

PROTOCOL_VERSION = 2
# A server accepts header versions 0..MAX_ACCEPTED_VERSION; version 0 is the
# oldest format where the whole header int is the op code.
MAX_ACCEPTED_VERSION = 2

DEFAULT_MAX_FRAME_SIZE_BYTES = 5 * 1024 * 1024
BOOKIE_PORT = 3181


class OpCode(IntEnum):
    ADD_ENTRY = 1
    READ_ENTRY = 2
    AUTH = 3
    READ_LAC = 4
    WRITE_LAC = 5
    GET_BOOKIE_INFO = 6
    BATCH_READ_ENTRY = 7


class StatusCode(IntEnum):
    EOK = 0
    ENOLEDGER = 1
    ENOENTRY = 2
    EBADREQ = 100
    EIO = 101
    EUA = 102
    EBADVERSION = 103
    EFENCED = 104
    EREADONLY = 105
    ETOOMANYREQUESTS = 106
    EUNKNOWNLEDGERSTATE = 107


# v2 code -> v3 protobuf StatusCode value (PROTOCOL.md table).
V3_STATUS: dict[StatusCode, int] = {
    StatusCode.EOK: 0,
    StatusCode.ENOLEDGER: 402,
    StatusCode.ENOENTRY: 403,
    StatusCode.EBADREQ: 404,
    StatusCode.EIO: 501,
    StatusCode.EUA: 502,
    StatusCode.EBADVERSION: 503,
    StatusCode.EFENCED: 504,
    StatusCode.EREADONLY: 505,
    StatusCode.ETOOMANYREQUESTS: 506,
    StatusCode.EUNKNOWNLEDGERSTATE: 507,
}
V2_STATUS_BY_V3: dict[int, StatusCode] = {v3: v2 for v2, v3 in V3_STATUS.items()}

# Header flags (low 16 bits of the v2 header).
FLAG_NONE = 0x0000
FLAG_DO_FENCING = 0x0001
FLAG_RECOVERY_ADD = 0x0002
FLAG_HIGH_PRIORITY = 0x0004

# GET_BOOKIE_INFO requested_info bits (BookKeeper's GetBookieInfoRequest.Flags).
BOOKIE_INFO_FREE_DISK_SPACE = 0x01
BOOKIE_INFO_TOTAL_DISK_SPACE = 0x02

MASTER_KEY_LENGTH = 20
# Digest-framed entry: ledger_id(8) entry_id(8) last_add_confirmed(8) length(8).
ENTRY_HEADER_LENGTH = 32
# Explicit LAC buffer: ledger_id(8) lac(8), then the digest.
LAC_HEADER_LENGTH = 16
FRAME_LENGTH_BYTES = 4
HEADER_BYTES = 4

# Fixed frame-body sizes of the v2 layouts (after the 4-byte frame length).
ADD_REQUEST_MIN_BYTES = HEADER_BYTES + MASTER_KEY_LENGTH + ENTRY_HEADER_LENGTH  # 56
ADD_RESPONSE_BYTES = 24
READ_REQUEST_BYTES = 20  # + MASTER_KEY_LENGTH when fencing
READ_RESPONSE_HEADER_BYTES = 24
BATCH_READ_REQUEST_BYTES = 40  # + MASTER_KEY_LENGTH when fencing
BATCH_READ_RESPONSE_HEADER_BYTES = 32
READ_LAC_REQUEST_BYTES = 12
WRITE_LAC_REQUEST_MIN_BYTES = HEADER_BYTES + MASTER_KEY_LENGTH + 16 + LAC_HEADER_LENGTH  # 56
WRITE_LAC_RESPONSE_BYTES = 16
GET_BOOKIE_INFO_REQUEST_BYTES = 12
GET_BOOKIE_INFO_RESPONSE_BYTES = 24

INVALID_ENTRY_ID = -1  # READ of entry -1 = "the last entry you have"


class DigestType(IntEnum):
    """Entry digest types (bk.proto.digest computes them). Values are the ledger metadata
    enum (METADATA.md: CRC32=1, HMAC=2, CRC32C=3, DUMMY=4)."""

    CRC32 = 1
    MAC = 2
    HMAC = 2  # METADATA.md's spelling of MAC
    CRC32C = 3
    DUMMY = 4


# Digest bytes after the ENTRY_HEADER_LENGTH header of a digest-framed entry.
DIGEST_LENGTH_BYTES = {DigestType.CRC32: 8, DigestType.MAC: 20, DigestType.CRC32C: 4, DigestType.DUMMY: 0}
