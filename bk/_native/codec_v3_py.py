"""Wire codec kernel for v3 (protobuf) ADDs and plain READs (pure Python twin of bk/_native/_codec_v3.pyx).

Same functions, same results as the native kernel; see its docstring for the contracts and
_codec_v3.pyx's comment for which frames are taken and which deferred.
"""
from __future__ import annotations

# The one wire layout module (bk/formats: a leaf package that imports nothing else of bk).
import bk.formats.wire as _L
from bk.formats.wire import (ADD_ENTRY_OFFSET, ADD_KEY_OFFSET, ADD_REQUEST_MIN_BYTES, FLAG_DEFERRED_SYNC,
                             FLAG_RECOVERY_ADD, FRAME_LENGTH, MASTER_KEY_LENGTH, READ_REQUEST_BODY,
                             READ_REQUEST_BYTES)

from .codec_py import (_I64_MAX, _I64_MIN, _MAX_VERSION, _OP_ADD, _add_ids, _check_record, _length, _new,
                       _view, split_frames)


_TAG_HEADER = (_L.V3_FIELD_HEADER << 3) | _L.V3_WIRE_LEN
_TAG_STATUS = (_L.V3_FIELD_STATUS << 3) | _L.V3_WIRE_VARINT
_TAG_ADD = (_L.V3_FIELD_ADD << 3) | _L.V3_WIRE_LEN
_HEADER_TAGS = {(_L.V3_HEADER_VERSION << 3) | _L.V3_WIRE_VARINT: "version",
                (_L.V3_HEADER_OPERATION << 3) | _L.V3_WIRE_VARINT: "operation",
                (_L.V3_HEADER_TXN_ID << 3) | _L.V3_WIRE_VARINT: "txn",
                (_L.V3_HEADER_PRIORITY << 3) | _L.V3_WIRE_VARINT: "priority"}
_ADD_TAGS = {(_L.V3_ADD_LEDGER_ID << 3) | _L.V3_WIRE_VARINT: "ledger",
             (_L.V3_ADD_ENTRY_ID << 3) | _L.V3_WIRE_VARINT: "entry",
             (_L.V3_ADD_MASTER_KEY << 3) | _L.V3_WIRE_LEN: "key",
             (_L.V3_ADD_BODY << 3) | _L.V3_WIRE_LEN: "body",
             (_L.V3_ADD_WRITE_FLAGS << 3) | _L.V3_WIRE_VARINT: "write_flags",
             (_L.V3_ADD_FLAG << 3) | _L.V3_WIRE_VARINT: "flag"}
_ADD_RESPONSE_TAGS = {(_L.V3_ADD_RESPONSE_STATUS << 3) | _L.V3_WIRE_VARINT: "status",
                      (_L.V3_ADD_RESPONSE_LEDGER_ID << 3) | _L.V3_WIRE_VARINT: "ledger",
                      (_L.V3_ADD_RESPONSE_ENTRY_ID << 3) | _L.V3_WIRE_VARINT: "entry"}
_U64 = (1 << 64) - 1
_TAG_READ = (100 << 3) | _L.V3_WIRE_LEN  # Request.readRequest
_READ_TAGS = {(1 << 3) | _L.V3_WIRE_VARINT: "ledger",  # ReadRequest.ledgerId, .entryId
              (2 << 3) | _L.V3_WIRE_VARINT: "entry"}
_V3_OP_READ_ENTRY = 1  # OperationType.READ_ENTRY
_READ_RESPONSE_TAGS = {(1 << 3) | _L.V3_WIRE_VARINT: "status",  # ReadResponse.status, .ledgerId, .entryId, .body
                       (2 << 3) | _L.V3_WIRE_VARINT: "ledger",
                       (3 << 3) | _L.V3_WIRE_VARINT: "entry",
                       (4 << 3) | _L.V3_WIRE_LEN: "body"}


class _Defer(Exception):
    pass


def _get_varint(d, pos: int, end: int) -> tuple[int, int]:
    v = 0
    for i in range(10):
        if pos + i >= end:
            raise _Defer
        b = d[pos + i]
        v |= (b & 0x7F) << (7 * i)
        if not b & 0x80:
            if i == 9 and b > 1:
                raise _Defer
            return v, pos + i + 1
    raise _Defer


def _put_varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _fields(d, pos: int, end: int, tags: dict, into: dict) -> None:
    """Each field of [pos, end) named by `tags` into `into` (ints, or (start, end) for LEN fields)."""
    while pos < end:
        tag, pos = _get_varint(d, pos, end)
        v, pos = _get_varint(d, pos, end)
        name = tags.get(tag)
        if name is None or name in into:
            raise _Defer
        if tag & 7 == _L.V3_WIRE_LEN:
            if v > end - pos:
                raise _Defer
            into[name] = (pos, pos + v)
            pos += v
        else:
            into[name] = v


def _header_ok(h: dict, op: int = _L.V3_OP_ADD_ENTRY) -> bool:
    return ("version" in h and "operation" in h and "txn" in h and 1 <= h["version"] <= _L.PROTOCOL_VERSION_V3
            and h.get("priority", 0) <= 0xFFFFFFFF and h["operation"] == op)


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _request_fields(d, off: int, end: int, body_tag: int, body_tags: dict):
    """(header fields, body fields, header bytes) of a Request of a header and the body
    `body_tag` alone, each once (either order), else _Defer."""
    top, h, body = {}, {}, {}
    hb = None
    pos = off
    while pos < end:
        tag, pos = _get_varint(d, pos, end)
        ln, pos = _get_varint(d, pos, end)
        if tag not in (_TAG_HEADER, body_tag) or tag in top or ln > end - pos:
            raise _Defer
        top[tag] = True
        if tag == _TAG_HEADER:
            _fields(d, pos, pos + ln, _HEADER_TAGS, h)
            hb = d[pos:pos + ln]
        else:
            _fields(d, pos, pos + ln, body_tags, body)
        pos += ln
    if len(top) != 2:
        raise _Defer
    return h, body, hb


def _v3_add_request(d, off: int, end: int):
    """(flags, key bounds, ledger, entry, body bounds, txn, priority) of a plain v3 ADD, else _Defer."""
    h, a, _ = _request_fields(d, off, end, _TAG_ADD, _ADD_TAGS)
    if not _header_ok(h) or not all(k in a for k in ("ledger", "entry", "key", "body")):
        raise _Defer
    ledger, entry = _signed(a["ledger"]), _signed(a["entry"])
    key = a["key"]
    if ("flag" in a and a["flag"] != _L.V3_ADD_FLAG_RECOVERY_ADD) or ledger < 0 or entry < 0 \
            or key[1] - key[0] != MASTER_KEY_LENGTH:
        raise _Defer
    flags = (FLAG_RECOVERY_ADD if "flag" in a else 0) | (
        FLAG_DEFERRED_SYNC if a.get("write_flags", 0) & _L.V3_WRITE_FLAG_DEFERRED_SYNC else 0)
    return flags, key, ledger, entry, a["body"], h["txn"], h.get("priority", 0)


def _v3_read_request(d, off: int, end: int):
    """(ledger, entry, header bytes) of a plain v3 READ (see _codec_v3.pyx), else _Defer."""
    h, r, hb = _request_fields(d, off, end, _TAG_READ, _READ_TAGS)
    if not _header_ok(h, _V3_OP_READ_ENTRY) or len(r) != 2:
        raise _Defer
    ledger, entry = _signed(r["ledger"]), _signed(r["entry"])
    if ledger < 0 or entry < 0:
        raise _Defer
    v = _put_varint
    canonical = (v(_L.V3_HEADER_VERSION << 3) + v(h["version"]) + v(_L.V3_HEADER_OPERATION << 3)
                 + v(h["operation"]) + v(_L.V3_HEADER_TXN_ID << 3) + v(h["txn"])
                 + (v(_L.V3_HEADER_PRIORITY << 3) + v(h["priority"]) if "priority" in h else b""))
    if canonical != hb:  # the answer echoes the header as the protobuf library writes it
        raise _Defer
    return ledger, entry, bytes(hb)


def _walk_frames(buf, start: int, max_frame: int):
    """(data, [(body offset, body end)], end, err): split_frames over an immutable copy."""
    data = buf if type(buf) is bytes else _view(buf, start, max_frame).tobytes()
    frames, end, err = split_frames(data, start, max_frame)
    return data, [(off, off + ln) for off, ln in frames], end, err


def scan_v3_add_requests(buf, start: int, max_frame: int, record=tuple, read_record=None):
    _check_record(record)
    if read_record is not None:
        _check_record(read_record)
    data, frames, end, err = _walk_frames(buf, start, max_frame)
    out, deferred = [], []
    key = None
    for off, pos in frames:
        ln = pos - off
        try:
            flags, (k0, k1), ledger, entry, (b0, b1), txn, priority = _v3_add_request(data, off, pos)
        except _Defer:
            try:
                if read_record is None:
                    raise _Defer
                out.append(_new(read_record, _v3_read_request(data, off, pos)))
            except _Defer:
                deferred.append(len(out))
                out.append((off, ln))
            continue
        k = data[k0:k1]
        if k != key:
            key = k
        out.append(_new(record, (flags, key, ledger, entry, data[b0:b1], _L.PROTOCOL_VERSION_V3, txn, priority)))
    return out, end, err, deferred


def _v3_header(txn: int, priority: int) -> bytes:
    """The BKPacketHeader of a v3 ADD (the message's bytes, without its tag and length)."""
    v = _put_varint
    return (v(_L.V3_HEADER_VERSION << 3) + v(_L.PROTOCOL_VERSION_V3) + v(_L.V3_HEADER_OPERATION << 3)
            + v(_L.V3_OP_ADD_ENTRY) + v(_L.V3_HEADER_TXN_ID << 3) + v(txn)
            + (v(_L.V3_HEADER_PRIORITY << 3) + v(priority) if priority else b""))


def _v3_add_response(txn: int, priority: int, status: int, ledger: int, entry: int) -> bytes:
    v = _put_varint
    header = _v3_header(txn, priority)
    add = (v(_L.V3_ADD_RESPONSE_STATUS << 3) + v(status) + v(_L.V3_ADD_RESPONSE_LEDGER_ID << 3) + v(ledger & _U64)
           + v(_L.V3_ADD_RESPONSE_ENTRY_ID << 3) + v(entry & _U64))
    body = (v(_TAG_HEADER) + v(len(header)) + header + v(_TAG_STATUS) + v(status)
            + v(_TAG_ADD) + v(len(add)) + add)
    return _length.pack(len(body)) + body


def encode_v3_add_responses(reqs, status: int) -> bytes:
    if not 0 <= status <= _U64:
        raise OverflowError(f"status {status} out of range")
    out = []
    for req in reqs:
        ledger, entry, txn, priority = req[2], req[3], req[6], req[7]
        for x in (ledger, entry):
            if not _I64_MIN <= x <= _I64_MAX:
                raise OverflowError("ledger and entry ids must fit in signed 64 bits")
        if not (0 <= txn <= _U64 and 0 <= priority <= _U64):
            raise OverflowError("txn id and priority must fit in unsigned 64 bits")
        out.append(_v3_add_response(txn, priority, status, ledger, entry))
    return b"".join(out)


def _v3_response_fields(d, off: int, end: int, reads: bool):
    """(status, body status, ledger, entry, entry bounds or None, operation) of a plain v3 ADD
    Response, or with `reads` of a plain READ Response (see _codec_v3.pyx), else _Defer."""
    top, h, a = {}, {}, {}
    status = body_tag = None
    pos = off
    while pos < end:
        tag, pos = _get_varint(d, pos, end)
        v, pos = _get_varint(d, pos, end)
        if tag == _TAG_STATUS and status is None:
            status = v
            continue
        if tag not in (_TAG_HEADER, _TAG_ADD) + ((_TAG_READ,) if reads else ()) or v > end - pos:
            raise _Defer
        if tag != _TAG_HEADER:
            if body_tag is not None:
                raise _Defer
            body_tag = tag
        elif tag in top:
            raise _Defer
        top[tag] = True
        _fields(d, pos, pos + v, _HEADER_TAGS if tag == _TAG_HEADER else
                _ADD_RESPONSE_TAGS if tag == _TAG_ADD else _READ_RESPONSE_TAGS, h if tag == _TAG_HEADER else a)
        pos += v
    op = _L.V3_OP_ADD_ENTRY if body_tag == _TAG_ADD else _V3_OP_READ_ENTRY
    if status is None or len(top) != 2 or not _header_ok(h, op) or not all(k in a for k in ("status", "ledger", "entry")):
        raise _Defer
    return status, a["status"], _signed(a["ledger"]), _signed(a["entry"]), a.get("body"), op


def scan_v3_add_responses(buf, start: int, max_frame: int, status_map: dict, record=tuple, read_record=None):
    _check_record(record)
    if read_record is not None:
        _check_record(read_record)
    data, frames, end, err = _walk_frames(buf, start, max_frame)
    out, deferred = [], []
    for off, pos in frames:
        ln = pos - off
        try:
            status, body_status, ledger, entry, body, op = _v3_response_fields(data, off, pos, read_record is not None)
        except _Defer:
            status = None
        rc = status_map.get(body_status) if status is not None and status in status_map else None
        if rc is None:
            deferred.append(len(out))
            out.append((off, ln))
        elif op == _L.V3_OP_ADD_ENTRY:
            out.append(_new(record, (rc, ledger, entry)))
        else:
            out.append(_new(read_record, (rc, ledger, entry, None if rc != 0 else
                                          data[body[0]:body[1]] if body is not None else b"")))
    return out, end, err, deferred


def v3_add_request_from_v2(frame, txn_id: int):
    data = bytes(frame)
    n = len(data)
    if n < FRAME_LENGTH.size + ADD_REQUEST_MIN_BYTES or FRAME_LENGTH.unpack_from(data)[0] != n - FRAME_LENGTH.size:
        return None
    h, ledger, entry = _add_ids.unpack_from(data, FRAME_LENGTH.size)
    if not 1 <= h >> 24 <= _MAX_VERSION or (h >> 16) & 0xFF != _OP_ADD or ledger < 0 or entry < 0:
        return None
    if not 0 <= txn_id <= _U64:
        raise OverflowError("txn id must fit in unsigned 64 bits")
    v = _put_varint
    f = FRAME_LENGTH.size
    body = data[f + ADD_ENTRY_OFFSET:]
    header = _v3_header(txn_id, 0)
    add = (v(_L.V3_ADD_LEDGER_ID << 3) + v(ledger) + v(_L.V3_ADD_ENTRY_ID << 3) + v(entry)
           + v((_L.V3_ADD_MASTER_KEY << 3) | _L.V3_WIRE_LEN) + v(MASTER_KEY_LENGTH)
           + data[f + ADD_KEY_OFFSET:f + ADD_ENTRY_OFFSET]
           + v((_L.V3_ADD_BODY << 3) | _L.V3_WIRE_LEN) + v(len(body)) + body
           + (v(_L.V3_ADD_WRITE_FLAGS << 3) + v(_L.V3_WRITE_FLAG_DEFERRED_SYNC) if h & FLAG_DEFERRED_SYNC else b"")
           + (v(_L.V3_ADD_FLAG << 3) + v(_L.V3_ADD_FLAG_RECOVERY_ADD) if h & FLAG_RECOVERY_ADD else b""))
    out = v(_TAG_HEADER) + v(len(header)) + header + v(_TAG_ADD) + v(len(add)) + add
    return FRAME_LENGTH.pack(len(out)) + out


def v3_read_request_from_v2(frame, txn_id: int):
    data = bytes(frame)
    if len(data) != FRAME_LENGTH.size + READ_REQUEST_BYTES or FRAME_LENGTH.unpack_from(data)[0] != READ_REQUEST_BYTES:
        return None
    h, ledger, entry = READ_REQUEST_BODY.unpack_from(data, FRAME_LENGTH.size)
    if not 1 <= h >> 24 <= _MAX_VERSION or (h >> 16) & 0xFF != _L.OP_READ_ENTRY or h & 0xFFFF or ledger < 0 or entry < 0:
        return None
    if not 0 <= txn_id <= _U64:
        raise OverflowError("txn id must fit in unsigned 64 bits")
    v = _put_varint
    header = (v(_L.V3_HEADER_VERSION << 3) + v(_L.PROTOCOL_VERSION_V3) + v(_L.V3_HEADER_OPERATION << 3)
              + v(_V3_OP_READ_ENTRY) + v(_L.V3_HEADER_TXN_ID << 3) + v(txn_id))
    read = v(1 << 3) + v(ledger) + v(2 << 3) + v(entry)  # ReadRequest.ledgerId, .entryId
    out = v(_TAG_HEADER) + v(len(header)) + header + v(_TAG_READ) + v(len(read)) + read
    return FRAME_LENGTH.pack(len(out)) + out
