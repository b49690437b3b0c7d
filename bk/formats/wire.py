"""Every v2 wire layout, defined once: op codes, flags, sizes, offsets, the header packer.

This module is the single definition (ARCHITECTURE.md, "One source of truth per
format"). Python code imports the names; Cython kernels get the integers at
compile time from `bk/_native/formats.pxi` (the WL_ names), which is *generated*
from CYTHON_NAMES below by bk/formats/pxi.py (setup.py rewrites it before every
build, and tests/unit/test_formats.py fails when the committed copy is stale).
The digest-framed entry the ADD carries and the master key's length are
bk/formats/entry.py's; they are re-exported here because every frame uses them.

v2 header: `(version << 24) | (op << 16) | flags`; version 0 is the oldest form
where the whole int is the op code and there are no flags (PROTOCOL.md).
All integers on the wire are big-endian.
"""
from __future__ import annotations

import struct

from bk.formats.entry import (  # noqa: F401  (re-exported: every frame layout uses them)
    CRC32_DIGEST_LENGTH, CRC32C_DIGEST_LENGTH, DUMMY_DIGEST_LENGTH, ENTRY_HEADER, ENTRY_HEADER_LENGTH, ENTRY_IDS_LAC,
    ENTRY_LAC_OFFSET, LAC_HEADER_LENGTH, MAC_DIGEST_LENGTH, MASTER_KEY_LENGTH,
)

# ---------------------------------------------------------------- versions
PROTOCOL_VERSION = 2  # what bk sends in v2 frames
MAX_ACCEPTED_VERSION = 2  # a v2 server accepts header versions 0..2
PROTOCOL_VERSION_V3 = 3  # BKPacketHeader.version of a v3 (protobuf) frame

# ---------------------------------------------------------------- op codes (v2 header byte 2)
OP_ADD_ENTRY = 1
OP_READ_ENTRY = 2
OP_AUTH = 3
OP_READ_LAC = 4  # project extensions (docs/PROTOCOL-EXTENSIONS.md); BookKeeper serves these only in v3
OP_WRITE_LAC = 5
OP_GET_BOOKIE_INFO = 6
OP_BATCH_READ_ENTRY = 7

# ---------------------------------------------------------------- header flags (low 16 bits)
FLAG_NONE = 0x0000
FLAG_DO_FENCING = 0x0001  # READ / BATCH_READ: fence the ledger (carries the master key)
FLAG_RECOVERY_ADD = 0x0002  # ADD: written by recovery, accepted on a fenced ledger
FLAG_HIGH_PRIORITY = 0x0004
# bk's own, never in a v2 frame on the wire: a v2-shaped ADD (the client's frame, the bookie's
# V3AddRequest record) whose v3 form carries AddRequest.writeFlags DEFERRED_SYNC (BookKeeper's
# v2 protocol has no write flags). The v3 ADD kernels translate it both ways.
FLAG_DEFERRED_SYNC = 0x0008

# GetBookieInfoRequest.Flags of BookkeeperProtocol.proto (the `requested` bit mask)
BOOKIE_INFO_TOTAL_DISK_CAPACITY = 0x01
BOOKIE_INFO_FREE_DISK_SPACE = 0x02

# ---------------------------------------------------------------- field sizes
FRAME_LENGTH_BYTES = 4  # i32 before every frame body; does not count itself
PACKET_HEADER_BYTES = 4  # the v2 header int (BookKeeper's PacketHeader)
RC_BYTES = 4
ID_BYTES = 8  # ledger ids, entry ids, request ids, LACs: i64

# ---------------------------------------------------------------- offsets inside a frame body
ADD_KEY_OFFSET = PACKET_HEADER_BYTES  # ADD request: header | master_key | entry
ADD_ENTRY_OFFSET = PACKET_HEADER_BYTES + MASTER_KEY_LENGTH  # 24: the entry (its ids are its first 16 bytes)
RESPONSE_RC_OFFSET = PACKET_HEADER_BYTES  # every v2 response: header | rc | ...
RESPONSE_IDS_OFFSET = PACKET_HEADER_BYTES + RC_BYTES  # 8: ledger_id, then entry_id
WRITE_LAC_IDS_OFFSET = PACKET_HEADER_BYTES + MASTER_KEY_LENGTH  # 24: ledger_id lac
WRITE_LAC_BUF_OFFSET = WRITE_LAC_IDS_OFFSET + 2 * ID_BYTES  # 40

# ---------------------------------------------------------------- fixed frame-body sizes
ADD_REQUEST_MIN_BYTES = ADD_ENTRY_OFFSET + ENTRY_HEADER_LENGTH  # 56
# header | rc | ledger_id | entry_id: the ADD response, the READ response head, the generic error answer
RESPONSE_IDS_BYTES = RESPONSE_IDS_OFFSET + 2 * ID_BYTES  # 24
ADD_RESPONSE_BYTES = RESPONSE_IDS_BYTES
READ_RESPONSE_HEADER_BYTES = RESPONSE_IDS_BYTES
READ_REQUEST_BYTES = PACKET_HEADER_BYTES + 2 * ID_BYTES  # 20, + MASTER_KEY_LENGTH when fencing
# header ledger_id start_entry_id request_id max_count(4) max_size(8)
BATCH_READ_REQUEST_BYTES = PACKET_HEADER_BYTES + 3 * ID_BYTES + 4 + 8  # 40, + MASTER_KEY_LENGTH when fencing
# header rc ledger_id start_entry_id request_id, then repeated len(4) entry
BATCH_READ_RESPONSE_HEADER_BYTES = RESPONSE_IDS_OFFSET + 3 * ID_BYTES  # 32
BATCH_READ_ENTRY_LENGTH_BYTES = 4
READ_LAC_REQUEST_BYTES = PACKET_HEADER_BYTES + ID_BYTES  # 12
READ_LAC_RESPONSE_MIN_BYTES = RESPONSE_IDS_OFFSET + ID_BYTES + 4 + 4  # 24: two empty sized buffers
WRITE_LAC_REQUEST_MIN_BYTES = WRITE_LAC_BUF_OFFSET + LAC_HEADER_LENGTH  # 56
WRITE_LAC_RESPONSE_BYTES = RESPONSE_IDS_OFFSET + ID_BYTES  # 16
GET_BOOKIE_INFO_REQUEST_BYTES = PACKET_HEADER_BYTES + 8  # 12
GET_BOOKIE_INFO_RESPONSE_BYTES = RESPONSE_IDS_OFFSET + 8 + 8  # 24

DEFAULT_MAX_FRAME_SIZE_BYTES = 5 * 1024 * 1024
BOOKIE_PORT = 3181
INVALID_ENTRY_ID = -1  # READ of entry -1 = "the last entry you have"


# ---------------------------------------------------------------- header packer
def pack_header(version: int, op: int, flags: int = 0) -> int:
    """The v2 header int; ValueError on a version above 2, an op or flags out of range,
    or flags in a version 0 header (which is just the op code)."""
    if not 0 <= version <= MAX_ACCEPTED_VERSION:
        raise ValueError(f"protocol version {version} is not 0..{MAX_ACCEPTED_VERSION}")
    if not 0 <= op <= 0xFF or not 0 <= flags <= 0xFFFF:
        raise ValueError(f"op {op} or flags {flags} out of range")
    if version == 0:
        if flags:
            raise ValueError("a version 0 header cannot carry flags")
        return op
    return (version << 24) | (op << 16) | flags


def split_header(header: int) -> tuple[int, int, int]:
    """(version, op, flags) of a header read as an unsigned 32-bit int."""
    version = header >> 24
    if version == 0:
        return 0, header, 0
    return version, (header >> 16) & 0xFF, header & 0xFFFF


ADD_HEADER = pack_header(PROTOCOL_VERSION, OP_ADD_ENTRY)
ADD_RECOVERY_HEADER = pack_header(PROTOCOL_VERSION, OP_ADD_ENTRY, FLAG_RECOVERY_ADD)
READ_HEADER = pack_header(PROTOCOL_VERSION, OP_READ_ENTRY)

# ---------------------------------------------------------------- struct layouts
FRAME_HEAD = struct.Struct(">iI")  # length, header: the start of every v2 frame
HEADER = struct.Struct(">I")
FRAME_LENGTH = struct.Struct(">i")
IDS = struct.Struct(">qq")  # two i64: (ledger_id, entry_id) or (ledger_id, lac)
ID = struct.Struct(">q")  # one i64
READ_REQUEST_FRAME = struct.Struct(">iIqq")  # length header ledger_id entry_id
READ_REQUEST_BODY = struct.Struct(">Iqq")  # header ledger_id entry_id (READ_REQUEST_BYTES)
# length header ledger_id start_entry_id request_id max_count max_size; _BODY: without the length
BATCH_READ_REQUEST_FRAME = struct.Struct(">iIqqqiq")
BATCH_READ_REQUEST_BODY = struct.Struct(">Iqqqiq")
LEDGER_REQUEST_FRAME = struct.Struct(">iIq")  # length header ledger_id: READ_LAC, GET_BOOKIE_INFO
# length header rc ledger_id entry_id: the ADD response, the READ response head, the generic error
# answer (RESPONSE_IDS_BYTES after the length)
RESPONSE_IDS_FRAME = struct.Struct(">iIiqq")
RESPONSE_IDS_BODY = struct.Struct(">Iiqq")
BATCH_READ_RESPONSE_FRAME = struct.Struct(">iIiqqq")  # length header rc ledger_id start_entry_id request_id
BATCH_READ_RESPONSE_BODY = struct.Struct(">Iiqqq")
RESPONSE_LEDGER_FRAME = struct.Struct(">iIiq")  # length header rc ledger_id: WRITE_LAC, READ_LAC's head
RESPONSE_LEDGER_BODY = struct.Struct(">Iiq")
GET_BOOKIE_INFO_RESPONSE_FRAME = struct.Struct(">iIiqq")  # length header rc total_disk free_disk


# ---------------------------------------------------------------- v3: the ADD's protobuf fields
# BookkeeperProtocol.proto's numbers for what the v3 ADD kernels read and write without the
# protobuf library (bk/proto/v3.py declares the same fields with these names).
V3_OP_ADD_ENTRY = 2  # OperationType.ADD_ENTRY
V3_ADD_FLAG_RECOVERY_ADD = 1  # AddRequest.Flag.RECOVERY_ADD
V3_WRITE_FLAG_DEFERRED_SYNC = 1  # AddRequest.writeFlags bit (BookKeeper's WriteFlag.DEFERRED_SYNC)
V3_FIELD_HEADER = 1  # Request.header, Response.header (BKPacketHeader)
V3_FIELD_STATUS = 2  # Response.status
V3_FIELD_ADD = 101  # Request.addRequest, Response.addResponse
V3_HEADER_VERSION = 1  # BKPacketHeader.version, .operation, .txnId, .priority
V3_HEADER_OPERATION = 2
V3_HEADER_TXN_ID = 3
V3_HEADER_PRIORITY = 4
V3_ADD_LEDGER_ID = 1  # AddRequest.ledgerId, .entryId, .masterKey, .body, .writeFlags, .flag
V3_ADD_ENTRY_ID = 2
V3_ADD_MASTER_KEY = 3
V3_ADD_BODY = 4
V3_ADD_WRITE_FLAGS = 5
V3_ADD_FLAG = 100
V3_ADD_RESPONSE_STATUS = 1  # AddResponse.status, .ledgerId, .entryId
V3_ADD_RESPONSE_LEDGER_ID = 2
V3_ADD_RESPONSE_ENTRY_ID = 3
V3_WIRE_VARINT = 0  # protobuf wire types
V3_WIRE_LEN = 2


# ---------------------------------------------------------------- the Cython view of this module
# Names the kernels use as C constants, prefixed WL_ (bk/_native/formats.pxi).
CYTHON_NAMES = (
    "MAX_ACCEPTED_VERSION", "OP_ADD_ENTRY", "OP_READ_ENTRY", "FLAG_DO_FENCING", "READ_REQUEST_BYTES",
    "FLAG_RECOVERY_ADD", "FLAG_DEFERRED_SYNC", "PACKET_HEADER_BYTES",
    "MASTER_KEY_LENGTH",
    "ENTRY_HEADER_LENGTH", "ENTRY_LAC_OFFSET", "ADD_KEY_OFFSET", "ADD_ENTRY_OFFSET", "ADD_REQUEST_MIN_BYTES",
    "ADD_RESPONSE_BYTES", "RESPONSE_RC_OFFSET", "RESPONSE_IDS_OFFSET", "FRAME_LENGTH_BYTES", "ID_BYTES",
    "READ_RESPONSE_HEADER_BYTES",
    "CRC32C_DIGEST_LENGTH", "PROTOCOL_VERSION_V3", "V3_OP_ADD_ENTRY", "V3_ADD_FLAG_RECOVERY_ADD", "V3_FIELD_HEADER",
    "V3_FIELD_STATUS", "V3_FIELD_ADD", "V3_HEADER_VERSION", "V3_HEADER_OPERATION", "V3_HEADER_TXN_ID",
    "V3_HEADER_PRIORITY", "V3_ADD_LEDGER_ID", "V3_ADD_ENTRY_ID", "V3_ADD_MASTER_KEY", "V3_ADD_BODY",
    "V3_ADD_WRITE_FLAGS", "V3_ADD_FLAG", "V3_ADD_RESPONSE_STATUS", "V3_ADD_RESPONSE_LEDGER_ID",
    "V3_ADD_RESPONSE_ENTRY_ID", "V3_WIRE_VARINT", "V3_WIRE_LEN", "V3_WRITE_FLAG_DEFERRED_SYNC",
)
