"""v2 message codec: requests (client encodes, server decodes) and responses (the reverse).

Every encoder returns one complete frame: `length i32 | header u32 | fields`.
The header is `(version << 24) | (op << 16) | flags`; version 0 is the oldest
format, where the whole int is the op code and there are no flags.

`decode_request` is strict, because it faces untrusted clients: a body that
is too short or too long for its op, an unknown op, negative ids (except READ
entry -1), or a WRITE_LAC whose LAC buffer names another ledger or LAC raise
RequestDecodeError (EBADREQ) carrying the ids it could read; a version above 2
raises RequestVersionError (EBADVERSION). Both leave the framing intact, so the
server answers with `error_response_for(err)` and keeps the connection.
`decode_response` raises ResponseDecodeError (a ProtocolError): a bookie that
sends malformed responses gets its connection dropped.

The ADD fast path (FrameDecoder.feed_requests, bk/proto/framing.py) decodes
adds in the native kernel; `_decode_add` below accepts exactly the frames the
kernel accepts, so both paths give equal results.
"""
from __future__ import annotations

import struct

from bk import _native
from bk.formats import wire as layout
from bk.proto.constants import OpCode, StatusCode
from bk.formats.wire import (
    ADD_ENTRY_OFFSET, ADD_KEY_OFFSET, ADD_REQUEST_MIN_BYTES, ADD_RESPONSE_BYTES, BATCH_READ_ENTRY_LENGTH_BYTES,
    BATCH_READ_REQUEST_BYTES, BATCH_READ_RESPONSE_HEADER_BYTES, ENTRY_HEADER_LENGTH, FLAG_DO_FENCING,
    GET_BOOKIE_INFO_REQUEST_BYTES, GET_BOOKIE_INFO_RESPONSE_BYTES, PACKET_HEADER_BYTES, ID_BYTES, LAC_HEADER_LENGTH,
    MASTER_KEY_LENGTH, MAX_ACCEPTED_VERSION, PROTOCOL_VERSION, READ_LAC_REQUEST_BYTES,
    READ_LAC_RESPONSE_MIN_BYTES, READ_REQUEST_BYTES, READ_RESPONSE_HEADER_BYTES, RESPONSE_IDS_OFFSET,
    WRITE_LAC_BUF_OFFSET, WRITE_LAC_IDS_OFFSET, WRITE_LAC_REQUEST_MIN_BYTES, WRITE_LAC_RESPONSE_BYTES,
)
from bk.proto.messages import (
    AddRequest, AddResponse, AuthRequest, AuthResponse, BatchReadRequest, BatchReadResponse,
    GetBookieInfoRequest, GetBookieInfoResponse, MessageEncodeError, ReadLacRequest, ReadLacResponse,
    ReadRequest, ReadResponse, RequestDecodeError, RequestVersionError, ResponseDecodeError,
    WriteLacRequest, WriteLacResponse,
)

_codec = _native.load("codec")

ADD, READ, AUTH, READ_LAC, WRITE_LAC, INFO, BATCH = (
    int(OpCode.ADD_ENTRY), int(OpCode.READ_ENTRY), int(OpCode.AUTH), int(OpCode.READ_LAC),
    int(OpCode.WRITE_LAC), int(OpCode.GET_BOOKIE_INFO), int(OpCode.BATCH_READ_ENTRY))
EOK = int(StatusCode.EOK)
_UNKNOWN_ID = -1  # ids an error answer could not learn; no real request uses them

_u32 = layout.HEADER
_i32 = layout.FRAME_LENGTH
_qq = layout.IDS
_q = layout.ID
_frame_header = layout.FRAME_HEAD
_read_req = layout.READ_REQUEST_FRAME
_batch_req = layout.BATCH_READ_REQUEST_FRAME
_batch_req_body = layout.BATCH_READ_REQUEST_BODY
_ledger_req = layout.LEDGER_REQUEST_FRAME  # READ_LAC, GET_BOOKIE_INFO
_write_lac_fields = layout.IDS
_rc_ids = layout.RESPONSE_IDS_FRAME  # ADD and READ responses, generic error answer
_rc_ids_body = layout.RESPONSE_IDS_BODY
_batch_resp = layout.BATCH_READ_RESPONSE_FRAME
_batch_resp_body = layout.BATCH_READ_RESPONSE_BODY
_rc_ledger = layout.RESPONSE_LEDGER_FRAME  # WRITE_LAC response, READ_LAC response head
_rc_ledger_body = layout.RESPONSE_LEDGER_BODY
_info_resp = layout.GET_BOOKIE_INFO_RESPONSE_FRAME


# ---------------------------------------------------------------- header
split_header = layout.split_header


def encode_header(version: int, op: int, flags: int = 0) -> int:
    """layout.pack_header, raising MessageEncodeError."""
    try:
        return layout.pack_header(version, op, flags)
    except ValueError as e:
        raise MessageEncodeError(str(e)) from None


def _frame(body_parts) -> bytes:
    body = b"".join(body_parts)
    return _i32.pack(len(body)) + body


def _check_key(key, what: str) -> None:
    if key is None or len(key) != MASTER_KEY_LENGTH:
        raise MessageEncodeError(f"{what} needs a {MASTER_KEY_LENGTH}-byte master key")


# ---------------------------------------------------------------- requests: encode (client)
def _encode_add(m: AddRequest) -> bytes:
    _check_key(m.master_key, "ADD")
    if m.ledger_id < 0 or m.entry_id < 0:
        raise MessageEncodeError(f"ADD needs ledger id and entry id >= 0, got {m.ledger_id}/{m.entry_id}")
    if len(m.body) < ENTRY_HEADER_LENGTH:
        raise MessageEncodeError(f"ADD body of {len(m.body)} bytes is no digest-framed entry "
                                 f"(>= {ENTRY_HEADER_LENGTH} bytes)")
    if _qq.unpack_from(m.body, 0) != (m.ledger_id, m.entry_id):
        raise MessageEncodeError(
            f"ADD for {m.ledger_id}/{m.entry_id} carries an entry framed for {_qq.unpack_from(m.body, 0)}")
    h = encode_header(m.version, ADD, m.flags)
    return b"".join((_frame_header.pack(ADD_ENTRY_OFFSET + len(m.body), h), m.master_key, m.body))


def _encode_fencing_key(flags: int, key, what: str) -> bytes:
    if flags & FLAG_DO_FENCING:
        _check_key(key, f"a fencing {what}")
        return bytes(key)
    if key is not None:
        raise MessageEncodeError(f"a {what} carries a master key only with FLAG_DO_FENCING")
    return b""


def _encode_read(m: ReadRequest) -> bytes:
    key = _encode_fencing_key(m.flags, m.master_key, "READ")
    if m.ledger_id < 0 or m.entry_id < -1:
        raise MessageEncodeError(f"READ needs ledger id >= 0 and entry id >= -1, got {m.ledger_id}/{m.entry_id}")
    h = encode_header(m.version, READ, m.flags)
    return _read_req.pack(READ_REQUEST_BYTES + len(key), h, m.ledger_id, m.entry_id) + key


def _encode_batch_read(m: BatchReadRequest) -> bytes:
    key = _encode_fencing_key(m.flags, m.master_key, "BATCH_READ")
    if m.ledger_id < 0 or m.start_entry_id < 0 or m.max_count < 0 or m.max_size < 0:
        raise MessageEncodeError("BATCH_READ needs ledger id, start entry id, max_count and max_size >= 0")
    h = encode_header(m.version, BATCH, m.flags)
    return _batch_req.pack(BATCH_READ_REQUEST_BYTES + len(key), h, m.ledger_id, m.start_entry_id,
                           m.request_id, m.max_count, m.max_size) + key


def _encode_auth(m: AuthRequest) -> bytes:
    return _frame((_u32.pack(encode_header(m.version, AUTH, m.flags)), m.payload))


def _encode_read_lac(m: ReadLacRequest) -> bytes:
    if m.ledger_id < 0:
        raise MessageEncodeError(f"READ_LAC needs ledger id >= 0, got {m.ledger_id}")
    return _ledger_req.pack(READ_LAC_REQUEST_BYTES, encode_header(m.version, READ_LAC, m.flags), m.ledger_id)


def _encode_write_lac(m: WriteLacRequest) -> bytes:
    _check_key(m.master_key, "WRITE_LAC")
    if m.ledger_id < 0 or m.lac < -1:
        raise MessageEncodeError(f"WRITE_LAC needs ledger id >= 0 and lac >= -1, got {m.ledger_id}/{m.lac}")
    if len(m.lac_buf) < LAC_HEADER_LENGTH or _qq.unpack_from(m.lac_buf, 0) != (m.ledger_id, m.lac):
        raise MessageEncodeError("WRITE_LAC's lac_buf must be the framed LAC buffer of the same ledger and lac")
    h = encode_header(m.version, WRITE_LAC, m.flags)
    return _frame((_u32.pack(h), m.master_key, _write_lac_fields.pack(m.ledger_id, m.lac), m.lac_buf))


def _encode_info(m: GetBookieInfoRequest) -> bytes:
    return _ledger_req.pack(GET_BOOKIE_INFO_REQUEST_BYTES, encode_header(m.version, INFO, m.flags),
                            m.requested_info)


_REQUEST_ENCODERS = {
    AddRequest: _encode_add, ReadRequest: _encode_read, BatchReadRequest: _encode_batch_read,
    AuthRequest: _encode_auth, ReadLacRequest: _encode_read_lac, WriteLacRequest: _encode_write_lac,
    GetBookieInfoRequest: _encode_info,
}


def encode_request(msg) -> bytes:
    """One complete request frame for any request message."""
    enc = _REQUEST_ENCODERS.get(type(msg))
    if enc is None:
        raise MessageEncodeError(f"not a request message: {type(msg).__name__}")
    try:
        return enc(msg)
    except (struct.error, TypeError) as e:
        raise MessageEncodeError(f"cannot encode {type(msg).__name__}: {e}") from None


# ---------------------------------------------------------------- requests: decode (server)
def _bad(msg: str, op: int, version: int, flags: int, **ids):
    return RequestDecodeError(msg, op=op, version=version, flags=flags, **ids)


def _decode_add(f, n, version, flags):
    ids = {}
    if n >= ADD_ENTRY_OFFSET + 2 * ID_BYTES:
        ledger_id, entry_id = _qq.unpack_from(f, ADD_ENTRY_OFFSET)
        ids = {"ledger_id": ledger_id, "entry_id": entry_id}
    if n < ADD_REQUEST_MIN_BYTES:
        raise _bad(f"ADD request of {n} bytes is shorter than {ADD_REQUEST_MIN_BYTES} "
                   "(header, master key, entry header)", ADD, version, flags, **ids)
    if ledger_id < 0 or entry_id < 0:
        raise _bad(f"ADD of ledger {ledger_id} entry {entry_id}: negative ids are not accepted",
                   ADD, version, flags, **ids)
    return AddRequest(flags, bytes(f[ADD_KEY_OFFSET:ADD_ENTRY_OFFSET]), ledger_id, entry_id,
                      bytes(f[ADD_ENTRY_OFFSET:]), version)


def _fencing_key(f, n, fixed, flags, what, op, version, ids):
    want = fixed + (MASTER_KEY_LENGTH if flags & FLAG_DO_FENCING else 0)
    if n != want:
        raise _bad(f"{what} request of {n} bytes, expected {want}", op, version, flags, **ids)
    return bytes(f[fixed:]) if flags & FLAG_DO_FENCING else None


def _decode_read(f, n, version, flags):
    ids = {}
    if n >= READ_REQUEST_BYTES:
        ledger_id, entry_id = _qq.unpack_from(f, PACKET_HEADER_BYTES)
        ids = {"ledger_id": ledger_id, "entry_id": entry_id}
    key = _fencing_key(f, n, READ_REQUEST_BYTES, flags, "READ", READ, version, ids)
    if ledger_id < 0 or entry_id < -1:
        raise _bad(f"READ of ledger {ledger_id} entry {entry_id}: ids must be >= 0 (entry -1 = last)",
                   READ, version, flags, **ids)
    return ReadRequest(flags, ledger_id, entry_id, key, version)


def _decode_batch_read(f, n, version, flags):
    ids = {}
    if n >= BATCH_READ_REQUEST_BYTES:
        _, ledger_id, start, request_id, max_count, max_size = _batch_req_body.unpack_from(f, 0)
        ids = {"ledger_id": ledger_id, "entry_id": start, "request_id": request_id}
    key = _fencing_key(f, n, BATCH_READ_REQUEST_BYTES, flags, "BATCH_READ", BATCH, version, ids)
    if ledger_id < 0 or start < 0 or max_count < 0 or max_size < 0:
        raise _bad(f"BATCH_READ of ledger {ledger_id} from {start} (max {max_count} entries, "
                   f"{max_size} bytes): negative values are not accepted", BATCH, version, flags, **ids)
    return BatchReadRequest(flags, ledger_id, start, request_id, max_count, max_size, key, version)


def _decode_auth(f, n, version, flags):
    return AuthRequest(flags, bytes(f[PACKET_HEADER_BYTES:]), version)


def _decode_read_lac(f, n, version, flags):
    ids = {"ledger_id": _q.unpack_from(f, PACKET_HEADER_BYTES)[0]} if n >= READ_LAC_REQUEST_BYTES else {}
    if n != READ_LAC_REQUEST_BYTES or ids["ledger_id"] < 0:
        raise _bad(f"READ_LAC request of {n} bytes (expected {READ_LAC_REQUEST_BYTES}) "
                   "or negative ledger id", READ_LAC, version, flags, **ids)
    return ReadLacRequest(flags, ids["ledger_id"], version)


def _decode_write_lac(f, n, version, flags):
    ids = {}
    if n >= WRITE_LAC_BUF_OFFSET:
        ledger_id, lac = _write_lac_fields.unpack_from(f, WRITE_LAC_IDS_OFFSET)
        ids = {"ledger_id": ledger_id}
    if n < WRITE_LAC_REQUEST_MIN_BYTES:
        raise _bad(f"WRITE_LAC request of {n} bytes is shorter than {WRITE_LAC_REQUEST_MIN_BYTES}",
                   WRITE_LAC, version, flags, **ids)
    if ledger_id < 0 or lac < -1:
        raise _bad(f"WRITE_LAC of ledger {ledger_id} lac {lac}: ledger id must be >= 0, lac >= -1",
                   WRITE_LAC, version, flags, **ids)
    if _qq.unpack_from(f, WRITE_LAC_BUF_OFFSET) != (ledger_id, lac):
        raise _bad(f"WRITE_LAC of ledger {ledger_id} lac {lac} carries a LAC buffer for "
                   f"{_qq.unpack_from(f, WRITE_LAC_BUF_OFFSET)}", WRITE_LAC, version, flags, **ids)
    return WriteLacRequest(flags, bytes(f[ADD_KEY_OFFSET:WRITE_LAC_IDS_OFFSET]), ledger_id, lac,
                           bytes(f[WRITE_LAC_BUF_OFFSET:]), version)


def _decode_info(f, n, version, flags):
    if n != GET_BOOKIE_INFO_REQUEST_BYTES:
        raise _bad(f"GET_BOOKIE_INFO request of {n} bytes, expected {GET_BOOKIE_INFO_REQUEST_BYTES}",
                   INFO, version, flags)
    return GetBookieInfoRequest(flags, _q.unpack_from(f, PACKET_HEADER_BYTES)[0], version)


_REQUEST_DECODERS = {
    ADD: _decode_add, READ: _decode_read, BATCH: _decode_batch_read, AUTH: _decode_auth,
    READ_LAC: _decode_read_lac, WRITE_LAC: _decode_write_lac, INFO: _decode_info,
}


def _readable_ids(f, n: int, op: int) -> dict:
    """Ids at their v2 offsets, for answering a request whose version is unsupported."""
    if op == ADD and n >= ADD_ENTRY_OFFSET + 2 * ID_BYTES:
        return dict(zip(("ledger_id", "entry_id"), _qq.unpack_from(f, ADD_ENTRY_OFFSET)))
    if op in (READ, BATCH) and n >= READ_REQUEST_BYTES:
        ids = dict(zip(("ledger_id", "entry_id"), _qq.unpack_from(f, PACKET_HEADER_BYTES)))
        if op == BATCH and n >= READ_REQUEST_BYTES + ID_BYTES:
            ids["request_id"] = _q.unpack_from(f, READ_REQUEST_BYTES)[0]
        return ids
    if op == READ_LAC and n >= READ_LAC_REQUEST_BYTES:
        return {"ledger_id": _q.unpack_from(f, PACKET_HEADER_BYTES)[0]}
    if op == WRITE_LAC and n >= WRITE_LAC_IDS_OFFSET + ID_BYTES:
        return {"ledger_id": _q.unpack_from(f, WRITE_LAC_IDS_OFFSET)[0]}
    return {}


def decode_request(frame) -> object:
    """The request message in one frame body (bytes or memoryview, without the length)."""
    n = len(frame)
    if n < PACKET_HEADER_BYTES:
        raise RequestDecodeError(f"request frame of {n} bytes has no header")
    version, op, flags = split_header(_u32.unpack_from(frame, 0)[0])
    known_op = op if op <= 0xFF else None
    if version > MAX_ACCEPTED_VERSION:
        raise RequestVersionError(f"protocol version {version} is not supported (0..{MAX_ACCEPTED_VERSION})",
                                  op=known_op, version=version, flags=flags, **_readable_ids(frame, n, op))
    decoder = _REQUEST_DECODERS.get(op)
    if decoder is None:
        raise RequestDecodeError(f"unknown op code {op}", op=known_op, version=version, flags=flags)
    return decoder(frame, n, version, flags)


# ---------------------------------------------------------------- responses: encode (server)
def _encode_add_response(m: AddResponse, h: int) -> bytes:
    return _rc_ids.pack(ADD_RESPONSE_BYTES, h, m.rc, m.ledger_id, m.entry_id)


# The READ and BATCH_READ encoders return a list of buffers with the entries themselves when
# those are large: encode_response joins it, encode_response_parts hands it to a writev uncopied.
# Small entries are joined here: a 1 KiB entry costs less to copy than as an iovec of its own
# (`bench.forms --reads`, 1 KiB entries: 107-110k entries/s as parts, 115-118k joined).
_PART_MIN_ENTRY_BYTES = 16 * 1024


def _encode_read_response(m: ReadResponse, h: int) -> bytes | list:
    if (m.body is not None) != (m.rc == EOK):
        raise MessageEncodeError("a READ response carries a body exactly when rc is EOK")
    head = _rc_ids.pack(READ_RESPONSE_HEADER_BYTES + (len(m.body) if m.body is not None else 0),
                        h, m.rc, m.ledger_id, m.entry_id)
    if m.body is None:
        return head
    return [head, m.body] if len(m.body) >= _PART_MIN_ENTRY_BYTES else head + m.body


def _encode_batch_read_response(m: BatchReadResponse, h: int) -> bytes | list:
    if m.rc != EOK and m.entries:
        raise MessageEncodeError("a BATCH_READ error response carries no entries")
    if not isinstance(m.entries, list):
        # Entries already in the answer's `length | entry` layout (an entry log's span of
        # records, bk.entrylog.files.FileSpan): sent as they are, after the header.
        return [_batch_resp.pack(BATCH_READ_RESPONSE_HEADER_BYTES + len(m.entries), h, m.rc, m.ledger_id,
                                 m.start_entry_id, m.request_id), m.entries]
    parts = [b""]  # the header goes first once the length is known
    size = 0
    for entry in m.entries:
        parts.append(_i32.pack(len(entry)))  # BATCH_READ_ENTRY_LENGTH_BYTES
        parts.append(entry)
        size += 4 + len(entry)
    parts[0] = _batch_resp.pack(BATCH_READ_RESPONSE_HEADER_BYTES + size, h, m.rc, m.ledger_id, m.start_entry_id,
                                m.request_id)
    count = len(m.entries)
    return parts if count and size >= count * (4 + _PART_MIN_ENTRY_BYTES) else b"".join(parts)


def _encode_auth_response(m: AuthResponse, h: int) -> bytes:
    return _frame((_u32.pack(h), m.payload))


def _encode_read_lac_response(m: ReadLacResponse, h: int) -> bytes:
    lac_buf = m.lac_buf if m.lac_buf is not None else b""
    last_entry = m.last_entry if m.last_entry is not None else b""
    return _frame((_rc_ledger_body.pack(h, m.rc, m.ledger_id), _i32.pack(len(lac_buf)), lac_buf,
                   _i32.pack(len(last_entry)), last_entry))


def _encode_write_lac_response(m: WriteLacResponse, h: int) -> bytes:
    return _rc_ledger.pack(WRITE_LAC_RESPONSE_BYTES, h, m.rc, m.ledger_id)


def _encode_info_response(m: GetBookieInfoResponse, h: int) -> bytes:
    return _info_resp.pack(GET_BOOKIE_INFO_RESPONSE_BYTES, h, m.rc, m.free_disk_bytes, m.total_disk_bytes)


_RESPONSE_ENCODERS = {
    AddResponse: (ADD, _encode_add_response), ReadResponse: (READ, _encode_read_response),
    BatchReadResponse: (BATCH, _encode_batch_read_response), AuthResponse: (AUTH, _encode_auth_response),
    ReadLacResponse: (READ_LAC, _encode_read_lac_response),
    WriteLacResponse: (WRITE_LAC, _encode_write_lac_response),
    GetBookieInfoResponse: (INFO, _encode_info_response),
}


def _encode_response(msg, version: int):
    found = _RESPONSE_ENCODERS.get(type(msg))
    if found is None:
        raise MessageEncodeError(f"not a response message: {type(msg).__name__}")
    op, enc = found
    try:
        return enc(msg, encode_header(version, op))
    except (struct.error, TypeError) as e:
        raise MessageEncodeError(f"cannot encode {type(msg).__name__}: {e}") from None


def encode_response(msg, version: int = PROTOCOL_VERSION) -> bytes:
    """One complete response frame; `version` should echo the request's version."""
    out = _encode_response(msg, version)
    return out if type(out) is bytes else b"".join(out)


def encode_response_parts(msg, version: int = PROTOCOL_VERSION) -> list:
    """encode_response's frame as a list of buffers that concatenate to it, for a writev: a
    READ or BATCH_READ answer's entries are parts of their own, not copied into one frame."""
    out = _encode_response(msg, version)
    return [out] if type(out) is bytes else out


def encode_add_responses(rows, version: int = PROTOCOL_VERSION) -> bytes:
    """One buffer holding an ADD response frame per (rc, ledger_id, entry_id), in order."""
    try:
        return _codec.encode_add_responses(rows, version)
    except (OverflowError, TypeError, ValueError) as e:
        raise MessageEncodeError(f"cannot encode ADD responses: {e}") from None


def encode_add_acks(reqs, rc: int, version: int = PROTOCOL_VERSION) -> bytes:
    """encode_add_responses for one status `rc` over AddRequests: a frame per request
    with its ledger and entry ids, in order (the bookie's batch completion)."""
    try:
        return _codec.encode_add_acks(reqs, rc, version)
    except (OverflowError, TypeError, ValueError, IndexError) as e:
        raise MessageEncodeError(f"cannot encode ADD responses: {e}") from None


def encode_error_response(op: int | None, rc: int, ledger_id: int | None = None, entry_id: int | None = None,
                          request_id: int | None = None, version: int = PROTOCOL_VERSION) -> bytes:
    """The error answer to a request of `op`, in that op's response layout.

    Unknown ids are sent as -1. An unknown op (or None) gets BookKeeper's
    generic error layout `header | rc | ledger_id | entry_id`. AUTH has no error
    layout: a server refuses a bad AUTH by closing the connection.
    """
    if rc == EOK:
        raise MessageEncodeError("an error response needs a non-zero rc")
    lid = _UNKNOWN_ID if ledger_id is None else ledger_id
    eid = _UNKNOWN_ID if entry_id is None else entry_id
    if op == ADD:
        return encode_response(AddResponse(rc, lid, eid), version)
    if op == READ:
        return encode_response(ReadResponse(rc, lid, eid), version)
    if op == BATCH:
        rid = _UNKNOWN_ID if request_id is None else request_id
        return encode_response(BatchReadResponse(rc, lid, eid, rid, []), version)
    if op == READ_LAC:
        return encode_response(ReadLacResponse(rc, lid), version)
    if op == WRITE_LAC:
        return encode_response(WriteLacResponse(rc, lid), version)
    if op == INFO:
        return encode_response(GetBookieInfoResponse(rc), version)
    if op == AUTH:
        raise MessageEncodeError("AUTH has no error response: close the connection instead")
    try:
        return _rc_ids.pack(ADD_RESPONSE_BYTES, encode_header(version, op or 0), rc, lid, eid)
    except struct.error as e:
        raise MessageEncodeError(f"cannot encode error response: {e}") from None


def error_response_for(err: RequestDecodeError) -> bytes:
    """The answer to a request that failed to decode (EBADREQ or EBADVERSION).

    Raises MessageEncodeError for AUTH (no error layout): close the connection.
    """
    version = err.version if err.version is not None and err.version <= MAX_ACCEPTED_VERSION else PROTOCOL_VERSION
    return encode_error_response(err.op, err.code, err.ledger_id, err.entry_id, err.request_id, version)


# ---------------------------------------------------------------- responses: decode (client)
def _short(what: str, n: int, want) -> ResponseDecodeError:
    return ResponseDecodeError(f"{what} response of {n} bytes, expected {want}")


def _decode_add_response(f, n):
    if n != ADD_RESPONSE_BYTES:
        raise _short("ADD", n, ADD_RESPONSE_BYTES)
    _, rc, ledger_id, entry_id = _rc_ids_body.unpack_from(f, 0)
    return AddResponse(rc, ledger_id, entry_id)


def _decode_read_response(f, n):
    if n < READ_RESPONSE_HEADER_BYTES:
        raise _short("READ", n, f">= {READ_RESPONSE_HEADER_BYTES}")
    _, rc, ledger_id, entry_id = _rc_ids_body.unpack_from(f, 0)
    if rc != EOK:
        if n != READ_RESPONSE_HEADER_BYTES:
            raise ResponseDecodeError(f"READ error response (rc {rc}) with {n - READ_RESPONSE_HEADER_BYTES} "
                                      "trailing bytes")
        return ReadResponse(rc, ledger_id, entry_id, None)
    return ReadResponse(rc, ledger_id, entry_id, f[READ_RESPONSE_HEADER_BYTES:])


def _decode_batch_read_response(f, n):
    if n < BATCH_READ_RESPONSE_HEADER_BYTES:
        raise _short("BATCH_READ", n, f">= {BATCH_READ_RESPONSE_HEADER_BYTES}")
    _, rc, ledger_id, start, request_id = _batch_resp_body.unpack_from(f, 0)
    entries = []
    pos = BATCH_READ_RESPONSE_HEADER_BYTES
    while pos < n:
        if n - pos < BATCH_READ_ENTRY_LENGTH_BYTES:
            raise ResponseDecodeError(f"BATCH_READ response: {n - pos} stray bytes after the entries")
        (ln,) = _i32.unpack_from(f, pos)
        pos += BATCH_READ_ENTRY_LENGTH_BYTES
        if ln < 0 or ln > n - pos:
            raise ResponseDecodeError(f"BATCH_READ response: entry length {ln} at {pos} overruns the frame")
        entries.append(f[pos:pos + ln])
        pos += ln
    if rc != EOK and entries:
        raise ResponseDecodeError(f"BATCH_READ error response (rc {rc}) carries entries")
    return BatchReadResponse(rc, ledger_id, start, request_id, entries)


def _decode_auth_response(f, n):
    return AuthResponse(bytes(f[PACKET_HEADER_BYTES:]))


def _sized(f, n, pos, what):
    """A `len(4) bytes(len)` field at pos -> (bytes or None when empty, next pos)."""
    if n - pos < _i32.size:
        raise ResponseDecodeError(f"READ_LAC response: no length for {what}")
    (ln,) = _i32.unpack_from(f, pos)
    pos += _i32.size
    if ln < 0 or ln > n - pos:
        raise ResponseDecodeError(f"READ_LAC response: {what} length {ln} overruns the frame")
    return (bytes(f[pos:pos + ln]) if ln else None), pos + ln


def _decode_read_lac_response(f, n):
    if n < READ_LAC_RESPONSE_MIN_BYTES:
        raise _short("READ_LAC", n, f">= {READ_LAC_RESPONSE_MIN_BYTES}")
    _, rc, ledger_id = _rc_ledger_body.unpack_from(f, 0)
    lac_buf, pos = _sized(f, n, RESPONSE_IDS_OFFSET + ID_BYTES, "lac_buf")
    last_entry, pos = _sized(f, n, pos, "last_entry")
    if pos != n:
        raise ResponseDecodeError(f"READ_LAC response: {n - pos} trailing bytes")
    return ReadLacResponse(rc, ledger_id, lac_buf, last_entry)


def _decode_write_lac_response(f, n):
    if n != WRITE_LAC_RESPONSE_BYTES:
        raise _short("WRITE_LAC", n, WRITE_LAC_RESPONSE_BYTES)
    _, rc, ledger_id = _rc_ledger_body.unpack_from(f, 0)
    return WriteLacResponse(rc, ledger_id)


def _decode_info_response(f, n):
    if n != GET_BOOKIE_INFO_RESPONSE_BYTES:
        raise _short("GET_BOOKIE_INFO", n, GET_BOOKIE_INFO_RESPONSE_BYTES)
    _, rc, free, total = _rc_ids_body.unpack_from(f, 0)
    return GetBookieInfoResponse(rc, free, total)


_RESPONSE_DECODERS = {
    ADD: _decode_add_response, READ: _decode_read_response, BATCH: _decode_batch_read_response,
    AUTH: _decode_auth_response, READ_LAC: _decode_read_lac_response,
    WRITE_LAC: _decode_write_lac_response, INFO: _decode_info_response,
}


def decode_response(frame) -> object:
    """The response message in one frame body (without the length).

    A READ body and batch entries are slices of `frame`: copies when it is bytes, views when
    it is a memoryview, so pass a view only of a buffer nobody writes again (FrameDecoder's
    feeds do: 64 KiB entries are not copied on their way to the digest check)."""
    n = len(frame)
    if n < PACKET_HEADER_BYTES:
        raise ResponseDecodeError(f"response frame of {n} bytes has no header")
    version, op, _ = split_header(_u32.unpack_from(frame, 0)[0])
    if version > MAX_ACCEPTED_VERSION:
        raise ResponseDecodeError(f"response with protocol version {version}")
    decoder = _RESPONSE_DECODERS.get(op)
    if decoder is None:
        raise ResponseDecodeError(f"response with unknown op code {op}")
    return decoder(frame, n)
