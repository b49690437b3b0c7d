"""BookKeeper's v3 wire protocol: BookkeeperProtocol.proto's messages, built at runtime (no protoc).

A v3 frame is `length(4) | Request` or `length(4) | Response`, one protobuf
message (proto2) per frame; every request carries a BKPacketHeader (version 3,
operation, txnId) and a response echoes it, so v3 answers are matched by txnId.
The message and field names and numbers below are BookkeeperProtocol.proto's
(facts, declared as data in `_MESSAGES`); the classes come from a private
descriptor pool, as bk/meta/formats.py builds the metadata messages.

A bookie tells v2 from v3 per connection by trying to parse the first frame as
a v3 Request (bk/server/v3.py): a v2 frame never parses, since its first byte
(the header's version, 0..2) is a protobuf tag of field number 0.

Status codes are the v3 column of the one status table (bk.errors classes'
`v3_code`, V3_STATUS); bk's layers speak v2 codes and convert at this edge.
"""
from __future__ import annotations

import struct
from enum import IntEnum
from typing import NamedTuple

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, EncodeError

from bk import _native
from bk.errors import BadRequestError, NoSuchEntryError, ProtocolError
from bk.proto.constants import V2_STATUS_BY_V3, V3_STATUS, StatusCode
from bk.formats import wire as L
from bk.formats.wire import (FLAG_DEFERRED_SYNC, FLAG_DO_FENCING, FLAG_RECOVERY_ADD, FRAME_LENGTH, IDS as LAC_IDS,
                             LAC_HEADER_LENGTH, MASTER_KEY_LENGTH)
from bk.proto.messages import (AddRequest, AddResponse, ForceLedgerRequest, ForceLedgerResponse, GetBookieInfoRequest,
                               GetBookieInfoResponse, GetListOfEntriesRequest, GetListOfEntriesResponse,
                               LongPollReadRequest, LongPollReadResponse, MessageEncodeError, ReadLacRequest,
                               ReadLacResponse, ReadRequest, ReadResponse, ResponseDecodeError, WriteLacRequest,
                               WriteLacResponse, _safe_repr)

_F = descriptor_pb2.FieldDescriptorProto
_LABELS = {"required": _F.LABEL_REQUIRED, "optional": _F.LABEL_OPTIONAL, "repeated": _F.LABEL_REPEATED}
_SCALARS = {"int32": _F.TYPE_INT32, "int64": _F.TYPE_INT64, "uint32": _F.TYPE_UINT32, "uint64": _F.TYPE_UINT64,
            "bytes": _F.TYPE_BYTES, "string": _F.TYPE_STRING}
_PACKAGE = "bk.proto.v3"

PROTOCOL_VERSION_V3 = L.PROTOCOL_VERSION_V3


class OperationType(IntEnum):
    """BookkeeperProtocol.proto's OperationType (not the v2 op codes)."""

    READ_ENTRY = 1
    ADD_ENTRY = L.V3_OP_ADD_ENTRY
    RANGE_READ_ENTRY = 3  # declared, "not supported yet" by BookKeeper either
    RANGE_ADD_ENTRY = 4
    AUTH = 5
    WRITE_LAC = 6
    READ_LAC = 7
    GET_BOOKIE_INFO = 8
    START_TLS = 9
    FORCE_LEDGER = 10
    GET_LIST_OF_ENTRIES_OF_LEDGER = 11
    BATCH_READ_ENTRY = 12


# Flag enums nested in the request messages
READ_FLAG_FENCE_LEDGER = 1
READ_FLAG_ENTRY_PIGGYBACK = 2
ADD_FLAG_RECOVERY_ADD = L.V3_ADD_FLAG_RECOVERY_ADD
WRITE_FLAG_DEFERRED_SYNC = L.V3_WRITE_FLAG_DEFERRED_SYNC  # AddRequest.writeFlags bit (WriteFlag.DEFERRED_SYNC)

_ENUMS = {
    "ProtocolVersion": {"VERSION_ONE": 1, "VERSION_TWO": 2, "VERSION_THREE": 3},
    "StatusCode": {"EOK": 0, **{StatusCode(v2).name: v3 for v2, v3 in V3_STATUS.items() if v3}},
    "OperationType": {op.name: op.value for op in OperationType},
}
# message -> [(field, number, label, type)]; a type that is not a scalar names a message or enum
_MESSAGES = {
    "BKPacketHeader": [("version", L.V3_HEADER_VERSION, "required", "ProtocolVersion"),
                       ("operation", L.V3_HEADER_OPERATION, "required", "OperationType"),
                       ("txnId", L.V3_HEADER_TXN_ID, "required", "uint64"),
                       ("priority", L.V3_HEADER_PRIORITY, "optional", "uint32")],
    "ContextPair": [("key", 1, "required", "string"), ("value", 2, "required", "string")],
    "ReadRequest": [("flag", 100, "optional", "ReadRequest.Flag"), ("ledgerId", 1, "required", "int64"),
                    ("entryId", 2, "required", "int64"), ("masterKey", 3, "optional", "bytes"),
                    ("previousLAC", 4, "optional", "int64"), ("timeOut", 5, "optional", "int64")],
    "AddRequest": [("flag", L.V3_ADD_FLAG, "optional", "AddRequest.Flag"),
                   ("ledgerId", L.V3_ADD_LEDGER_ID, "required", "int64"),
                   ("entryId", L.V3_ADD_ENTRY_ID, "required", "int64"),
                   ("masterKey", L.V3_ADD_MASTER_KEY, "required", "bytes"), ("body", L.V3_ADD_BODY, "required", "bytes"),
                   ("writeFlags", L.V3_ADD_WRITE_FLAGS, "optional", "int32")],
    "StartTLSRequest": [],
    "WriteLacRequest": [("ledgerId", 1, "required", "int64"), ("lac", 2, "required", "int64"),
                        ("masterKey", 3, "required", "bytes"), ("body", 4, "required", "bytes")],
    "ForceLedgerRequest": [("ledgerId", 1, "required", "int64")],
    "ReadLacRequest": [("ledgerId", 1, "required", "int64")],
    "GetBookieInfoRequest": [("requested", 1, "optional", "int64")],
    "GetListOfEntriesOfLedgerRequest": [("ledgerId", 1, "required", "int64")],
    "AuthMessage": [("authPluginName", 1, "required", "string"), ("payload", 2, "required", "bytes")],
    "ReadResponse": [("status", 1, "required", "StatusCode"), ("ledgerId", 2, "required", "int64"),
                     ("entryId", 3, "required", "int64"), ("body", 4, "optional", "bytes"),
                     ("maxLAC", 5, "optional", "int64"), ("lacUpdateTimestamp", 6, "optional", "int64")],
    "AddResponse": [("status", L.V3_ADD_RESPONSE_STATUS, "required", "StatusCode"),
                    ("ledgerId", L.V3_ADD_RESPONSE_LEDGER_ID, "required", "int64"),
                    ("entryId", L.V3_ADD_RESPONSE_ENTRY_ID, "required", "int64")],
    "WriteLacResponse": [("status", 1, "required", "StatusCode"), ("ledgerId", 2, "required", "int64")],
    "ForceLedgerResponse": [("status", 1, "required", "StatusCode"), ("ledgerId", 2, "required", "int64")],
    "ReadLacResponse": [("status", 1, "required", "StatusCode"), ("ledgerId", 2, "required", "int64"),
                        ("lacBody", 3, "optional", "bytes"), ("lastEntryBody", 4, "optional", "bytes")],
    "GetBookieInfoResponse": [("status", 1, "required", "StatusCode"), ("totalDiskCapacity", 2, "optional", "int64"),
                              ("freeDiskSpace", 3, "optional", "int64"), ("journalIoUtil", 4, "optional", "int32"),
                              ("ledgerIoUtil", 5, "optional", "int32"), ("cpuUsedRate", 6, "optional", "int32"),
                              ("writeBytePerSecond", 7, "optional", "int64")],
    "GetListOfEntriesOfLedgerResponse": [("status", 1, "required", "StatusCode"),
                                         ("ledgerId", 2, "required", "int64"),
                                         ("availabilityOfEntriesOfLedger", 3, "optional", "bytes")],
    "StartTLSResponse": [],
}
_NESTED_ENUMS = {"ReadRequest": {"Flag": {"FENCE_LEDGER": 1, "ENTRY_PIGGYBACK": 2}},
                 "AddRequest": {"Flag": {"RECOVERY_ADD": 1}},
                 "GetBookieInfoRequest": {"Flags": {"TOTAL_DISK_CAPACITY": 0x01, "FREE_DISK_SPACE": 0x02}}}
# (field, number, message) of the one-of-a-kind bodies of Request and Response
_REQUEST_BODIES = [("readRequest", 100, "ReadRequest"), ("addRequest", L.V3_FIELD_ADD, "AddRequest"),
                   ("authRequest", 102, "AuthMessage"), ("writeLacRequest", 103, "WriteLacRequest"),
                   ("readLacRequest", 104, "ReadLacRequest"), ("getBookieInfoRequest", 105, "GetBookieInfoRequest"),
                   ("startTLSRequest", 106, "StartTLSRequest"), ("forceLedgerRequest", 107, "ForceLedgerRequest"),
                   ("getListOfEntriesOfLedgerRequest", 108, "GetListOfEntriesOfLedgerRequest")]
_RESPONSE_BODIES = [("readResponse", 100, "ReadResponse"), ("addResponse", L.V3_FIELD_ADD, "AddResponse"),
                    ("authResponse", 102, "AuthMessage"), ("writeLacResponse", 103, "WriteLacResponse"),
                    ("readLacResponse", 104, "ReadLacResponse"), ("getBookieInfoResponse", 105, "GetBookieInfoResponse"),
                    ("startTLSResponse", 106, "StartTLSResponse"), ("forceLedgerResponse", 107, "ForceLedgerResponse"),
                    ("getListOfEntriesOfLedgerResponse", 108, "GetListOfEntriesOfLedgerResponse")]
_MESSAGES["Request"] = ([("header", L.V3_FIELD_HEADER, "required", "BKPacketHeader")]
                        + [(f, n, "optional", m) for f, n, m in _REQUEST_BODIES]
                        + [("requestContext", 200, "repeated", "ContextPair")])
_MESSAGES["Response"] = ([("header", L.V3_FIELD_HEADER, "required", "BKPacketHeader"),
                          ("status", L.V3_FIELD_STATUS, "required", "StatusCode")]
                         + [(f, n, "optional", m) for f, n, m in _RESPONSE_BODIES])

# Which body field each operation uses (BookieRequestProcessor's dispatch)
REQUEST_BODY = {OperationType.READ_ENTRY: "readRequest", OperationType.ADD_ENTRY: "addRequest",
                OperationType.AUTH: "authRequest", OperationType.WRITE_LAC: "writeLacRequest",
                OperationType.READ_LAC: "readLacRequest", OperationType.GET_BOOKIE_INFO: "getBookieInfoRequest",
                OperationType.START_TLS: "startTLSRequest", OperationType.FORCE_LEDGER: "forceLedgerRequest",
                OperationType.GET_LIST_OF_ENTRIES_OF_LEDGER: "getListOfEntriesOfLedgerRequest"}
RESPONSE_BODY = {op: body.replace("Request", "Response") for op, body in REQUEST_BODY.items()}
RESPONSE_BODY[OperationType.AUTH] = "authResponse"


def _build_file() -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto(name="bk/proto/BookkeeperProtocol.proto", package=_PACKAGE,
                                             syntax="proto2")
    enum_names = set(_ENUMS) | {f"{m}.{e}" for m, nested in _NESTED_ENUMS.items() for e in nested}
    for name, values in _ENUMS.items():
        e = fdp.enum_type.add(name=name)
        for value_name, number in values.items():
            e.value.add(name=value_name, number=number)
    for name, fields in _MESSAGES.items():
        msg = fdp.message_type.add(name=name)
        for enum_name, values in _NESTED_ENUMS.get(name, {}).items():
            e = msg.enum_type.add(name=enum_name)
            for value_name, number in values.items():
                e.value.add(name=value_name, number=number)
        for field_name, number, label, ftype in fields:
            f = msg.field.add(name=field_name, number=number, label=_LABELS[label])
            if ftype in _SCALARS:
                f.type = _SCALARS[ftype]
            else:
                f.type = _F.TYPE_ENUM if ftype in enum_names else _F.TYPE_MESSAGE
                f.type_name = f".{_PACKAGE}.{ftype}"
    return fdp


_codec = _native.load("codec_v3")
_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_build_file())


def _cls(name: str):
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PACKAGE}.{name}"))


# The protobuf classes bk uses by name (the others are reached as fields of these).
Request = _cls("Request")
Response = _cls("Response")
AuthMessage = _cls("AuthMessage")


class V3DecodeError(ProtocolError):
    """Bytes that are no v3 Request/Response (malformed protobuf or a missing required field)."""


class V3RequestError(BadRequestError):
    """A v3 Request that parsed but cannot be served as asked (EBADREQ with its header)."""


# ---------------------------------------------------------------- frames
def parse(cls, frame):
    """A message of `cls` from one frame body; V3DecodeError when it is not one."""
    msg = cls()
    try:
        msg.ParseFromString(frame if type(frame) is bytes else bytes(frame))
    except (DecodeError, ValueError, TypeError, RuntimeError) as e:
        raise V3DecodeError(f"not a v3 {cls.DESCRIPTOR.name}: {e}") from None
    if not msg.IsInitialized():
        raise V3DecodeError(f"v3 {cls.DESCRIPTOR.name} without " + ", ".join(msg.FindInitializationErrors()))
    return msg


def frame(msg) -> bytes:
    """`length | serialized message`: one complete v3 frame."""
    try:
        body = msg.SerializeToString()
    except EncodeError as e:
        raise V3DecodeError(f"cannot encode {msg.DESCRIPTOR.name}: {e}") from None
    return FRAME_LENGTH.pack(len(body)) + body


def v3_status(v2_code: int) -> int:
    """The v3 StatusCode of a v2 return code (unknown codes: EIO)."""
    return V3_STATUS.get(v2_code, V3_STATUS[StatusCode.EIO])


def v2_status(v3_code: int) -> int:
    """The v2 return code of a v3 StatusCode (unknown codes: EIO)."""
    return int(V2_STATUS_BY_V3.get(v3_code, StatusCode.EIO))


def response_for(header, v2_code: int = 0):
    """A Response echoing a request's header (version, operation, txnId, priority) with a status."""
    resp = Response()
    resp.header.CopyFrom(header)
    resp.status = v3_status(v2_code)
    return resp


def error_response(req, v2_code: int):
    """The error answer to `req` in its operation's layout: Response.status and the body's status
    (with the ledger and entry ids the body carries), as BookKeeper's processors answer."""
    resp = response_for(req.header, v2_code)
    op = req.header.operation
    body_name = RESPONSE_BODY.get(op)
    if body_name is None or op in (OperationType.AUTH, OperationType.START_TLS):
        return resp
    body = getattr(resp, body_name)
    body.status = resp.status
    asked = getattr(req, REQUEST_BODY[op])
    for field in ("ledgerId", "entryId"):
        if field in body.DESCRIPTOR.fields_by_name:
            body.__setattr__(field, getattr(asked, field) if field in asked.DESCRIPTOR.fields_by_name else -1)
    return resp


# ---------------------------------------------------------------- the ADD hot path
class V3AddRequest(NamedTuple):
    """A v3 ADD in the shape of messages.AddRequest (same first six fields, so the bookie's
    batch path and the processor take it as they take a v2 add), plus what its answer echoes."""

    flags: int  # v2 header flags: FLAG_RECOVERY_ADD (AddRequest.flag RECOVERY_ADD), FLAG_DEFERRED_SYNC (writeFlags)
    master_key: bytes
    ledger_id: int
    entry_id: int
    body: bytes
    version: int  # PROTOCOL_VERSION_V3
    txn_id: int
    priority: int = 0
    __repr__ = _safe_repr


class V3ReadRequest(NamedTuple):
    """A plain v3 READ (header and readRequest {ledgerId, entryId} alone) as the codec kernel
    decodes it, without the protobuf library: `header` is the BKPacketHeader's bytes, which
    its answer echoes (the kernel takes a frame only when they are what the library writes)."""

    ledger_id: int
    entry_id: int
    header: bytes
    __repr__ = _safe_repr


def read_request(rec: V3ReadRequest):
    """The protobuf Request a V3ReadRequest stands for (the paths other than a cached answer:
    a miss, a refusal, an unauthenticated connection)."""
    req = Request()
    req.header.ParseFromString(rec.header)
    r = req.readRequest
    r.ledgerId, r.entryId = rec.ledger_id, rec.entry_id
    return req


def add_record(req, key_cache: list) -> "V3AddRequest | bytes":
    """The V3AddRequest of a parsed ADD Request, or the bytes of its EBADREQ answer.

    `key_cache` is a one-slot list holding the last master key object: equal keys of one
    connection become one object, which lets the bookie check a run's key once (it
    compares key objects by identity first)."""
    add = req.addRequest
    key = add.masterKey
    if add.ledgerId < 0 or add.entryId < 0 or len(key) != MASTER_KEY_LENGTH:
        return frame(error_response(req, BadRequestError.code))
    if key != key_cache[0]:
        key_cache[0] = key
    header = req.header
    # proto2 enum fields read as their first value when unset: presence decides (as Java's hasFlag)
    recovery = add.HasField("flag") and add.flag == ADD_FLAG_RECOVERY_ADD
    flags = (FLAG_RECOVERY_ADD if recovery else 0) | (
        FLAG_DEFERRED_SYNC if add.writeFlags & WRITE_FLAG_DEFERRED_SYNC else 0)
    return V3AddRequest(flags, key_cache[0], add.ledgerId,
                        add.entryId, add.body, PROTOCOL_VERSION_V3, header.txnId, header.priority)


def request_item(req, key_cache: list):
    """What a server dispatches for a parsed Request: a V3AddRequest for an ADD with its body (or
    the bytes of its EBADREQ answer), the Request itself for every other operation."""
    if req.header.operation == OperationType.ADD_ENTRY and req.HasField("addRequest"):
        return add_record(req, key_cache)
    return req


def encode_add_responses(reqs, v2_code: int) -> bytes:
    """One buffer of v3 ADD answer frames, one per V3AddRequest, all with status `v2_code`
    (the codec kernel; tests hold it byte for byte to the protobuf library's serialization)."""
    return _codec.encode_v3_add_responses(reqs, v3_status(v2_code))


# `(frame, txn_id) -> bytes | None`: the v3 Request frame of a plain v2 ADD, or of a plain v2 READ
# (no flags, ids >= 0), or None for other frames; the kernel's functions themselves (a client
# calls them once per request)
v3_add_request_from_v2 = _codec.v3_add_request_from_v2
v3_read_request_from_v2 = _codec.v3_read_request_from_v2


# ---------------------------------------------------------------- neutral messages <-> v3
# One row per operation: how its neutral request (bk.proto.messages) fills the Request's body
# and is read back from it, and the same for its answer. The bookie reads requests and writes
# answers (bk.server.v3: the handlers of bk.server.operations serve the neutral messages), a
# client writes requests and reads answers (bk.client.wire_v3, FrameDecoder.feed_v3_responses).
# What a v3 request must satisfy is checked here (V3RequestError: EBADREQ), as the v2 codec
# checks its layouts.
def _check(ok: bool, what: str, body) -> None:
    if not ok:
        raise V3RequestError(f"v3 {body.DESCRIPTOR.name} {what}")


def _add_to_v3(m: AddRequest, b) -> None:
    b.ledgerId, b.entryId, b.masterKey, b.body = m.ledger_id, m.entry_id, m.master_key, m.body
    if m.flags & FLAG_RECOVERY_ADD:
        b.flag = ADD_FLAG_RECOVERY_ADD
    if m.flags & FLAG_DEFERRED_SYNC:
        b.writeFlags = WRITE_FLAG_DEFERRED_SYNC


def _ids_to_v3(a, b) -> None:  # AddResponse, ReadResponse, LongPollReadResponse
    b.status, b.ledgerId, b.entryId = v3_status(a.rc), a.ledger_id, a.entry_id
    if a.rc == 0 and getattr(a, "body", None) is not None:
        b.body = bytes(a.body)  # protobuf takes bytes only (a read-ahead entry is a view)
    if getattr(a, "max_lac", None) is not None:
        b.maxLAC = a.max_lac


def _read_to_v3(m: ReadRequest, r) -> None:
    r.ledgerId, r.entryId = m.ledger_id, m.entry_id
    if m.flags & FLAG_DO_FENCING:
        r.flag, r.masterKey = READ_FLAG_FENCE_LEDGER, m.master_key


def _long_poll_to_v3(m: LongPollReadRequest, r) -> None:
    r.ledgerId, r.entryId, r.previousLAC, r.timeOut = m.ledger_id, m.entry_id, m.previous_lac, m.timeout_ms
    if m.piggyback:
        r.flag = READ_FLAG_ENTRY_PIGGYBACK


def _read_from_v3(r):
    """A fencing ReadRequest, a LongPollReadRequest (previousLAC, no fencing: BookKeeper's
    isLongPollReadRequest) or a plain ReadRequest."""
    ledger_id, entry_id = r.ledgerId, r.entryId
    _check(ledger_id >= 0 and entry_id >= -1, "with a negative id", r)
    if not r.HasField("flag"):  # an unset proto2 enum reads as its first value: presence decides
        if r.HasField("previousLAC"):
            return LongPollReadRequest(ledger_id, entry_id, r.previousLAC, r.timeOut if r.HasField("timeOut") else 0,
                                       False)
        return ReadRequest(0, ledger_id, entry_id, None, PROTOCOL_VERSION_V3)
    if r.flag == READ_FLAG_FENCE_LEDGER:
        _check(len(r.masterKey) == MASTER_KEY_LENGTH, "fencing without a master key", r)
        return ReadRequest(FLAG_DO_FENCING, ledger_id, entry_id, r.masterKey, PROTOCOL_VERSION_V3)
    piggyback = r.flag == READ_FLAG_ENTRY_PIGGYBACK
    _check(not piggyback or (r.HasField("previousLAC") and entry_id == -1), "piggyback without previousLAC", r)
    if r.HasField("previousLAC"):
        return LongPollReadRequest(ledger_id, entry_id, r.previousLAC, r.timeOut if r.HasField("timeOut") else 0,
                                   piggyback)
    return ReadRequest(0, ledger_id, entry_id, None, PROTOCOL_VERSION_V3)


def _read_answer_from_v3(b, rc: int):
    body = (b.body if b.HasField("body") else b"") if rc == 0 else None
    if b.HasField("maxLAC"):  # the answer to a long poll (only those carry the bookie's LAC)
        return LongPollReadResponse(rc, b.ledgerId, b.entryId, body, b.maxLAC)
    return ReadResponse(rc, b.ledgerId, b.entryId, body)


def _ledger_to_v3(m, b) -> None:  # READ_LAC, FORCE_LEDGER, GET_LIST_OF_ENTRIES_OF_LEDGER
    b.ledgerId = m.ledger_id


def _ledger_from_v3(make):
    def from_v3(b):
        _check(b.ledgerId >= 0, "with a negative ledger id", b)
        return make(b.ledgerId)
    return from_v3


def _status_ledger_to_v3(a, b) -> None:  # WRITE_LAC, FORCE_LEDGER
    b.status, b.ledgerId = v3_status(a.rc), a.ledger_id


def _read_lac_answer_to_v3(a: ReadLacResponse, b) -> None:
    rc = a.rc
    if rc == 0 and a.lac_buf is None and a.last_entry is None:
        rc = NoSuchEntryError.code  # neither buffer: ENOENTRY, as BookKeeper's ReadLacProcessorV3
    b.status, b.ledgerId = v3_status(rc), a.ledger_id
    if a.lac_buf is not None:
        b.lacBody = a.lac_buf
    if a.last_entry is not None:
        b.lastEntryBody = bytes(a.last_entry)


def _write_lac_to_v3(m: WriteLacRequest, w) -> None:
    w.ledgerId, w.lac, w.masterKey, w.body = m.ledger_id, m.lac, m.master_key, m.lac_buf


def _write_lac_from_v3(w) -> WriteLacRequest:
    _check(w.ledgerId >= 0 and w.lac >= -1 and len(w.masterKey) == MASTER_KEY_LENGTH, "with a bad id or key", w)
    _check(len(w.body) >= LAC_HEADER_LENGTH and LAC_IDS.unpack_from(w.body) == (w.ledgerId, w.lac),
           "whose LAC buffer names other ids", w)
    return WriteLacRequest(0, w.masterKey, w.ledgerId, w.lac, w.body, PROTOCOL_VERSION_V3)


def _info_to_v3(m: GetBookieInfoRequest, b) -> None:
    b.requested = m.requested_info


def _info_answer_to_v3(a: GetBookieInfoResponse, b) -> None:
    b.status = v3_status(a.rc)
    if a.rc == 0:
        b.totalDiskCapacity, b.freeDiskSpace = a.total_disk_bytes, a.free_disk_bytes


def _entries_answer_to_v3(a: GetListOfEntriesResponse, b) -> None:
    b.status, b.ledgerId = v3_status(a.rc), a.ledger_id
    if a.rc == 0:
        b.availabilityOfEntriesOfLedger = encode_entries_availability(a.entry_ids)


class _Conversion(NamedTuple):
    op: OperationType
    requests: dict  # neutral request type -> fills the Request's body from it
    request_from_v3: object  # body -> neutral request; None: not through here (ADD: add_record)
    answers: dict  # neutral answer type -> fills the Response's body from it
    answer_from_v3: object  # (body, v2 rc) -> neutral answer; None: bk's client never asks it


_OPERATIONS = (
    _Conversion(OperationType.ADD_ENTRY, {AddRequest: _add_to_v3}, None, {AddResponse: _ids_to_v3},
                lambda b, rc: AddResponse(rc, b.ledgerId, b.entryId)),
    _Conversion(OperationType.READ_ENTRY, {ReadRequest: _read_to_v3, LongPollReadRequest: _long_poll_to_v3},
                _read_from_v3, {ReadResponse: _ids_to_v3, LongPollReadResponse: _ids_to_v3}, _read_answer_from_v3),
    _Conversion(OperationType.READ_LAC, {ReadLacRequest: _ledger_to_v3},
                _ledger_from_v3(lambda ledger_id: ReadLacRequest(0, ledger_id, PROTOCOL_VERSION_V3)),
                {ReadLacResponse: _read_lac_answer_to_v3},
                lambda b, rc: ReadLacResponse(rc, b.ledgerId, b.lacBody or None, b.lastEntryBody or None)),
    _Conversion(OperationType.WRITE_LAC, {WriteLacRequest: _write_lac_to_v3}, _write_lac_from_v3,
                {WriteLacResponse: _status_ledger_to_v3}, lambda b, rc: WriteLacResponse(rc, b.ledgerId)),
    _Conversion(OperationType.GET_BOOKIE_INFO, {GetBookieInfoRequest: _info_to_v3},
                lambda b: GetBookieInfoRequest(0, b.requested, PROTOCOL_VERSION_V3),
                {GetBookieInfoResponse: _info_answer_to_v3},
                lambda b, rc: GetBookieInfoResponse(rc, b.freeDiskSpace, b.totalDiskCapacity)),
    _Conversion(OperationType.FORCE_LEDGER, {ForceLedgerRequest: _ledger_to_v3}, _ledger_from_v3(ForceLedgerRequest),
                {ForceLedgerResponse: _status_ledger_to_v3}, lambda b, rc: ForceLedgerResponse(rc, b.ledgerId)),
    _Conversion(OperationType.GET_LIST_OF_ENTRIES_OF_LEDGER, {GetListOfEntriesRequest: _ledger_to_v3},
                _ledger_from_v3(GetListOfEntriesRequest), {GetListOfEntriesResponse: _entries_answer_to_v3}, None),
)
_REQUEST_TO_V3 = {t: (c.op, fill) for c in _OPERATIONS for t, fill in c.requests.items()}
_ANSWER_TO_V3 = {t: (RESPONSE_BODY[c.op], fill) for c in _OPERATIONS for t, fill in c.answers.items()}
_BY_OP = {c.op: c for c in _OPERATIONS}
_FROM_V3 = {c.op: (REQUEST_BODY[c.op], c.request_from_v3) for c in _OPERATIONS if c.request_from_v3 is not None}
# The operations a bookie serves through bk.server.operations (ADD takes the add path; AUTH and
# START_TLS are the connection's)
SERVED = frozenset(_FROM_V3)


def request_to_v3(msg, txn_id: int):
    """The v3 Request asking what the neutral request `msg` asks; MessageEncodeError for a
    request with no v3 form (BATCH_READ, AUTH: the connection set-up writes AUTH itself)."""
    entry = _REQUEST_TO_V3.get(type(msg))
    if entry is None:
        raise MessageEncodeError(f"{type(msg).__name__} has no v3 form")
    op, fill = entry
    req = Request()
    h = req.header
    h.version, h.operation, h.txnId = PROTOCOL_VERSION_V3, op, txn_id
    fill(msg, getattr(req, REQUEST_BODY[op]))
    return req


def request_from_v3(req):
    """The neutral request of a v3 Request of a SERVED operation whose body is present;
    V3RequestError (EBADREQ) when its fields cannot be served as asked."""
    body, convert = _FROM_V3[req.header.operation]
    return convert(getattr(req, body))


def response_to_v3(header, answer):
    """The v3 Response carrying the neutral `answer` to the request with `header`: the body's
    status is also the Response's, as BookKeeper's processors answer."""
    name, fill = _ANSWER_TO_V3[type(answer)]
    resp = Response()
    resp.header.CopyFrom(header)
    body = getattr(resp, name)
    fill(answer, body)
    resp.status = body.status
    return resp


def response_to_v2(body):
    """The neutral answer of a v3 Response frame body (what a client's request table matches:
    ADD/READ by ledger and entry, LAC and info by ledger); ResponseDecodeError when malformed."""
    try:
        resp = parse(Response, body)
    except V3DecodeError as e:
        raise ResponseDecodeError(str(e)) from None
    op = resp.header.operation
    name = RESPONSE_BODY.get(op)
    b = getattr(resp, name) if name is not None and resp.HasField(name) else None
    if b is None:
        if op == OperationType.GET_BOOKIE_INFO:
            return GetBookieInfoResponse(v2_status(resp.status))
        raise ResponseDecodeError(f"v3 answer to operation {op} with status {resp.status} and no body")
    conversion = _BY_OP.get(op)
    if conversion is None or conversion.answer_from_v3 is None:
        raise ResponseDecodeError(f"v3 answer to operation {op}: bk's client never asks it")
    return conversion.answer_from_v3(b, v2_status(b.status))

# ---------------------------------------------------------------- AvailabilityOfEntriesOfLedger
# GET_LIST_OF_ENTRIES_OF_LEDGER's answer (BookKeeper's AvailabilityOfEntriesOfLedger bytes): a
# 64-byte header `version i32 (0) | group count i32 | zeros`, then per sequence group
# `first_sequence_start i64 | last_sequence_start i64 | sequence_size i32 | sequence_period i32`:
# sequences of `sequence_size` consecutive entries starting every `sequence_period` entries
# from first to last start (period 0: one sequence).
AVAILABILITY_HEADER_BYTES = 64
_availability_head = struct.Struct(">ii")
_sequence_group = struct.Struct(">qqii")
_MAX_SEQUENCE = (1 << 31) - 1


def encode_entries_availability(entry_ids) -> bytes:
    """The availability bytes of sorted, distinct entry ids: one group per run of consecutive ids
    (a valid encoding; BookKeeper's writer also merges equally spaced runs of equal size)."""
    groups = []
    start = prev = None
    for e in entry_ids:
        if start is not None and e == prev + 1 and e - start < _MAX_SEQUENCE:
            prev = e
            continue
        if start is not None:
            groups.append(_sequence_group.pack(start, start, prev - start + 1, 0))
        start = prev = e
    if start is not None:
        groups.append(_sequence_group.pack(start, start, prev - start + 1, 0))
    head = _availability_head.pack(0, len(groups)).ljust(AVAILABILITY_HEADER_BYTES, b"\0")
    return head + b"".join(groups)


MAX_AVAILABLE_ENTRIES = 1 << 20  # what decode_entries_availability lists at most by default (~40 MB of ints)


def decode_entries_availability(data: bytes, max_entries: int = MAX_AVAILABLE_ENTRIES) -> list[int]:
    """Entry ids of availability bytes (any valid grouping); V3DecodeError when malformed or
    when they name more than `max_entries` ids (a 24-byte group can name 2**63: the count is
    checked before any list is built)."""
    if len(data) < AVAILABILITY_HEADER_BYTES:
        raise V3DecodeError(f"availability of {len(data)} bytes has no 64-byte header")
    version, count = _availability_head.unpack_from(data)
    if version != 0 or count < 0 or len(data) < AVAILABILITY_HEADER_BYTES + count * _sequence_group.size:
        raise V3DecodeError(f"availability header version {version} with {count} groups over {len(data)} bytes")
    out = []
    for i in range(count):
        first, last, size, period = _sequence_group.unpack_from(data, AVAILABILITY_HEADER_BYTES + i * _sequence_group.size)
        if size < 1 or last < first or (last > first and period < size):
            raise V3DecodeError(f"bad sequence group ({first}, {last}, {size}, {period})")
        total = len(out) + size * ((last - first) // period + 1 if last > first else 1)
        if total > max_entries:
            raise V3DecodeError(f"availability names more than {max_entries} entries")
        start = first
        while True:
            out.extend(range(start, start + size))
            if start >= last:
                break
            start += period
    return out
