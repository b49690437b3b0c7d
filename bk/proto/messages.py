"""The version-neutral request and answer messages, and the errors the codec raises.

The v2 messages are the v2 layouts' fields; the v3 edge (bk.proto.v3) converts the same
messages to and from protobuf, and adds the v3-only operations' (LongPollReadRequest,
ForceLedgerRequest, GetListOfEntriesRequest and their answers). The bookie's operations
(bk.server.operations) take and return only these.

Messages are NamedTuples: immutable, cheap to build (the codec's ADD fast path
builds them straight from kernel tuples laid out in field order), comparable in
tests. Every v2 request class carries its op code as the class attribute `op`
and the header `version` it arrived with (a server answers in that version).

Decoded bodies never change under their holder: `AddRequest.body` and LAC
buffers are `bytes`; `ReadResponse.body` and batch entries decoded by
FrameDecoder are read-only memoryviews of the frame's buffer, which nothing
writes again (framing.py), so they keep that frame alive while held: copy
what you keep for long (the client hands `bytes` payloads to applications).
"""
from __future__ import annotations

import struct
from typing import NamedTuple

from bk.errors import BadRequestError, BadVersionError, BKError, ProtocolError
from bk.proto.constants import PROTOCOL_VERSION, OpCode, StatusCode
from bk.formats.wire import ENTRY_LAC_OFFSET

_lac = struct.Struct(">q")


def _safe_repr(msg) -> str:
    """repr without secrets or bulk: keys become `<key>`, byte bodies their length."""
    parts = []
    for name, value in zip(msg._fields, msg):
        if name == "master_key" and value is not None:
            value = "<key>"
        elif isinstance(value, (bytes, bytearray, memoryview)):
            value = f"<{len(value)} bytes>"
        elif isinstance(value, list):
            value = f"<{len(value)} entries>"
        else:
            value = repr(value)
        parts.append(f"{name}={value}")
    return f"{type(msg).__name__}({', '.join(parts)})"


# ---------------------------------------------------------------- requests
class AddRequest(NamedTuple):
    """ADD: `body` is the whole digest-framed entry; its first 16 bytes are the ids."""

    flags: int
    master_key: bytes
    ledger_id: int
    entry_id: int
    body: bytes
    version: int = PROTOCOL_VERSION
    op = OpCode.ADD_ENTRY
    __repr__ = _safe_repr

    @property
    def last_add_confirmed(self) -> int:
        """The writer's LAC piggybacked in the entry header (byte offset 16)."""
        return _lac.unpack_from(self.body, ENTRY_LAC_OFFSET)[0]


class ReadRequest(NamedTuple):
    """READ: entry_id -1 asks for the last entry; master_key is set iff fencing."""

    flags: int
    ledger_id: int
    entry_id: int
    master_key: bytes | None = None
    version: int = PROTOCOL_VERSION
    op = OpCode.READ_ENTRY
    __repr__ = _safe_repr


class BatchReadRequest(NamedTuple):
    flags: int
    ledger_id: int
    start_entry_id: int
    request_id: int
    max_count: int
    max_size: int
    master_key: bytes | None = None
    version: int = PROTOCOL_VERSION
    op = OpCode.BATCH_READ_ENTRY
    __repr__ = _safe_repr

    @property
    def entry_id(self) -> int:  # uniform access for error answers and logs
        return self.start_entry_id


class AuthRequest(NamedTuple):
    """AUTH: an opaque auth-plugin payload (BookKeeper's AuthMessage bytes)."""

    flags: int
    payload: bytes
    version: int = PROTOCOL_VERSION
    op = OpCode.AUTH
    __repr__ = _safe_repr


class ReadLacRequest(NamedTuple):
    """READ_LAC (project extension, PROTOCOL-EXTENSIONS.md)."""

    flags: int
    ledger_id: int
    version: int = PROTOCOL_VERSION
    op = OpCode.READ_LAC
    __repr__ = _safe_repr


class WriteLacRequest(NamedTuple):
    """WRITE_LAC (project extension): `lac_buf` is the client's digest-framed LAC buffer."""

    flags: int
    master_key: bytes
    ledger_id: int
    lac: int
    lac_buf: bytes
    version: int = PROTOCOL_VERSION
    op = OpCode.WRITE_LAC
    __repr__ = _safe_repr


class GetBookieInfoRequest(NamedTuple):
    """GET_BOOKIE_INFO (project extension): requested_info is a BOOKIE_INFO_* bit mask."""

    flags: int
    requested_info: int
    version: int = PROTOCOL_VERSION
    op = OpCode.GET_BOOKIE_INFO
    __repr__ = _safe_repr


# ---------------------------------------------------------------- responses
class AddResponse(NamedTuple):
    rc: int
    ledger_id: int
    entry_id: int
    op = OpCode.ADD_ENTRY
    __repr__ = _safe_repr


class ReadResponse(NamedTuple):
    """`body` is the stored entry when rc is EOK, else None."""

    rc: int
    ledger_id: int
    entry_id: int
    body: bytes | None = None
    op = OpCode.READ_ENTRY
    __repr__ = _safe_repr


class BatchReadResponse(NamedTuple):
    rc: int
    ledger_id: int
    start_entry_id: int
    request_id: int
    entries: list
    op = OpCode.BATCH_READ_ENTRY
    __repr__ = _safe_repr


class AuthResponse(NamedTuple):
    payload: bytes
    op = OpCode.AUTH
    __repr__ = _safe_repr


class ReadLacResponse(NamedTuple):
    """Either buffer is None when the bookie has none (encoded as length 0)."""

    rc: int
    ledger_id: int
    lac_buf: bytes | None = None
    last_entry: bytes | None = None
    op = OpCode.READ_LAC
    __repr__ = _safe_repr


class WriteLacResponse(NamedTuple):
    rc: int
    ledger_id: int
    op = OpCode.WRITE_LAC
    __repr__ = _safe_repr


class GetBookieInfoResponse(NamedTuple):
    rc: int
    free_disk_bytes: int = 0
    total_disk_bytes: int = 0
    op = OpCode.GET_BOOKIE_INFO
    __repr__ = _safe_repr


# ---------------------------------------------------------------- v3-only operations
# Requests and answers with no v2 layout: the v3 edge (bk.proto.v3) converts them, and the
# bookie's operations (bk.server.operations) take and return them like the ones above.
class LongPollReadRequest(NamedTuple):
    """A READ that waits until the bookie's LAC passes `previous_lac` (at most `timeout_ms`);
    `piggyback`: answer with the entry previous_lac + 1 (entry_id is then -1)."""

    ledger_id: int
    entry_id: int
    previous_lac: int
    timeout_ms: int
    piggyback: bool
    __repr__ = _safe_repr


class LongPollReadResponse(NamedTuple):
    """The answer to a LongPollReadRequest, carrying the bookie's LAC `max_lac`. `body` is the
    entry previous_lac + 1 when the bookie piggybacked it (`entry_id` names it), the entry asked
    for without piggyback; the bookie sends None for no body, a client reads it as b""."""

    rc: int
    ledger_id: int
    entry_id: int
    body: bytes | None
    max_lac: int | None
    __repr__ = _safe_repr


class ForceLedgerRequest(NamedTuple):
    """FORCE_LEDGER: make every deferred-sync add of the ledger acknowledged before it durable."""

    ledger_id: int
    __repr__ = _safe_repr


class ForceLedgerResponse(NamedTuple):
    rc: int
    ledger_id: int
    __repr__ = _safe_repr


class GetListOfEntriesRequest(NamedTuple):
    """GET_LIST_OF_ENTRIES_OF_LEDGER: which entries of the ledger this bookie stores."""

    ledger_id: int
    __repr__ = _safe_repr


class GetListOfEntriesResponse(NamedTuple):
    """`entry_ids`: the stored entry ids, ascending (v3 sends them as availability bytes)."""

    rc: int
    ledger_id: int
    entry_ids: list | None = None
    __repr__ = _safe_repr


REQUEST_TYPES = (AddRequest, ReadRequest, BatchReadRequest, AuthRequest, ReadLacRequest,
                 WriteLacRequest, GetBookieInfoRequest)
RESPONSE_TYPES = (AddResponse, ReadResponse, BatchReadResponse, AuthResponse, ReadLacResponse,
                  WriteLacResponse, GetBookieInfoResponse)


# ---------------------------------------------------------------- errors
class RequestDecodeError(BadRequestError):
    """A request frame whose content is malformed: answer `code` (EBADREQ) and keep the connection.

    Carries whatever could be read before the problem, so the answer can name
    the op, ledger and entry (None when unknown). The framing is intact: the
    next frame of the connection decodes normally.
    """

    def __init__(self, message: str, *, op: int | None = None, ledger_id: int | None = None,
                 entry_id: int | None = None, request_id: int | None = None,
                 version: int | None = None, flags: int = 0):
        self.op = op
        self.request_id = request_id
        self.version = version
        self.flags = flags
        super().__init__(message, ledger_id=ledger_id, entry_id=entry_id)


class RequestVersionError(RequestDecodeError, BadVersionError):
    """The header's protocol version is not 0..2: answer EBADVERSION (code 103)."""

    code, name = int(StatusCode.EBADVERSION), "EBADVERSION"


class ResponseDecodeError(ProtocolError):
    """A malformed response: the client drops that bookie connection."""


class BadFrameLengthError(ProtocolError):
    """A frame length prefix that is negative or above the maximum: close the connection.

    `frames` holds what the same feed call completed before the bad prefix
    (already decoded the way that call decodes), so nothing before it is lost.
    """

    def __init__(self, message: str, *, length: int, max_frame_size_bytes: int, frames: list | None = None):
        self.length = length
        self.max_frame_size_bytes = max_frame_size_bytes
        self.frames = frames if frames is not None else []
        super().__init__(message)


class MessageEncodeError(BKError, ValueError):
    """A message that cannot be put on the wire (bad key length, ids out of range, ...)."""
