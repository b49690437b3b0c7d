"""Wire codec byte kernel (pure Python twin of bk/_native/_codec.pyx).

Same functions, same results as the native kernel; see its docstring for the
contracts. A frame is `length i32 BE | body`; a v2 body starts with the header
int `(version << 24) | (op << 16) | flags` (version 0: the whole int is the op).
"""
from __future__ import annotations

import struct

import google_crc32c

# The one layout module (a leaf: importing it loads nothing else of bk.proto).
import bk.proto.layout as _layout
from bk.proto.layout import (
    ADD_ENTRY_OFFSET, ADD_KEY_OFFSET, ADD_REQUEST_MIN_BYTES, ADD_RESPONSE_BYTES, ENTRY_HEADER, ENTRY_IDS_LAC,
    FLAG_RECOVERY_ADD, FRAME_LENGTH, MASTER_KEY_LENGTH, MAX_ACCEPTED_VERSION, OP_ADD_ENTRY, pack_header,
)

ERR_OK = 0
ERR_NEGATIVE_LENGTH = 1
ERR_FRAME_TOO_LARGE = 2

_OP_ADD = OP_ADD_ENTRY
_KEY_LEN = MASTER_KEY_LENGTH
_ADD_MIN = ADD_REQUEST_MIN_BYTES
_ADD_RESPONSE = ADD_RESPONSE_BYTES
_MAX_VERSION = MAX_ACCEPTED_VERSION
_MAX_U32 = 0xFFFFFFFF
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1

_length = FRAME_LENGTH
# header, master key (skipped), ledger id, entry id: an ADD request body up to the entry's ids
_add_ids = struct.Struct(f">I{ADD_ENTRY_OFFSET - ADD_KEY_OFFSET}xqq")
_add_response_body = struct.Struct(">Iiqq")  # header rc ledger_id entry_id (ADD_RESPONSE_BYTES)


_new = tuple.__new__


def _check_record(record) -> None:
    if record is tuple:
        return
    if not (isinstance(record, type) and issubclass(record, tuple)
            and record.__basicsize__ == tuple.__basicsize__ and record.__dictoffset__ == 0):
        raise TypeError(f"record must be tuple or a field-less tuple subclass, got {record!r}")


def _view(buf, start: int, max_frame: int) -> memoryview:
    mv = memoryview(buf).cast("B")
    n = len(mv)
    if start < 0 or start > n:
        raise ValueError(f"start {start} outside buffer of {n} bytes")
    if max_frame < 0:
        raise ValueError("max_frame must be >= 0")
    return mv


# Each scanner walks frames with the same rule as the native `_next_frame`: a
# length prefix is judged as soon as its 4 bytes are present (negative -> 1,
# above max_frame -> 2), and a frame is taken only when its whole body is there.


def split_frames(buf, start: int, max_frame: int):
    mv = _view(buf, start, max_frame)
    n, pos, out, err = len(mv), start, [], ERR_OK
    unpack = _length.unpack_from
    while n - pos >= 4:
        (ln,) = unpack(mv, pos)
        if ln < 0 or ln > max_frame:
            err = ERR_NEGATIVE_LENGTH if ln < 0 else ERR_FRAME_TOO_LARGE
            break
        if n - pos - 4 < ln:
            break
        out.append((pos + 4, ln))
        pos += 4 + ln
    return out, pos, err


def scan_add_requests(buf, start: int, max_frame: int, record=tuple):
    _check_record(record)
    mv = _view(buf, start, max_frame)
    # Slicing bytes is the cheapest way to copy out keys and bodies in Python.
    data = buf if type(buf) is bytes else mv.tobytes()
    n, pos, out, deferred, err = len(mv), start, [], [], ERR_OK
    unpack, unpack_ids, append = _length.unpack_from, _add_ids.unpack_from, out.append
    key = None
    while n - pos >= 4:
        (ln,) = unpack(data, pos)
        if ln < 0 or ln > max_frame:
            err = ERR_NEGATIVE_LENGTH if ln < 0 else ERR_FRAME_TOO_LARGE
            break
        if n - pos - 4 < ln:
            break
        off = pos + 4
        pos = off + ln
        if ln >= _ADD_MIN:
            h, ledger_id, entry_id = unpack_ids(data, off)
            version = h >> 24
            op, flags = (h, 0) if version == 0 else ((h >> 16) & 0xFF, h & 0xFFFF)
            if version <= _MAX_VERSION and op == _OP_ADD and ledger_id >= 0 and entry_id >= 0:
                # Adds of one connection nearly always carry one ledger's key.
                k = data[off + ADD_KEY_OFFSET:off + ADD_ENTRY_OFFSET]
                if k != key:
                    key = k
                append(_new(record, (flags, key, ledger_id, entry_id, data[off + ADD_ENTRY_OFFSET:pos], version)))
                continue
        deferred.append(len(out))
        append((off, ln))
    return out, pos, err, deferred


def scan_add_responses(buf, start: int, max_frame: int, record=tuple):
    _check_record(record)
    mv = _view(buf, start, max_frame)
    n, pos, out, deferred, err = len(mv), start, [], [], ERR_OK
    unpack, unpack_body = _length.unpack_from, _add_response_body.unpack_from
    while n - pos >= 4:
        (ln,) = unpack(mv, pos)
        if ln < 0 or ln > max_frame:
            err = ERR_NEGATIVE_LENGTH if ln < 0 else ERR_FRAME_TOO_LARGE
            break
        if n - pos - 4 < ln:
            break
        off = pos + 4
        pos = off + ln
        if ln == _ADD_RESPONSE:
            h, rc, ledger_id, entry_id = unpack_body(mv, off)
            version = h >> 24
            op = h if version == 0 else (h >> 16) & 0xFF
            if version <= _MAX_VERSION and op == _OP_ADD:
                out.append(_new(record, (rc, ledger_id, entry_id)))
                continue
        deferred.append(len(out))
        out.append((off, ln))
    return out, pos, err, deferred


_FLAG_RECOVERY_ADD = FLAG_RECOVERY_ADD
_entry_header = ENTRY_IDS_LAC  # ledger id, entry id, LAC


def scan_add_run(reqs):
    items = reqs if type(reqs) is list else list(reqs)
    unpack = _entry_header.unpack_from
    out, start, n = [], 0, len(items)
    seg_key = seg_ledger = seg_recovery = top = None  # the open segment (seg_key None: none open)
    for i, req in enumerate(items):
        plain = False
        if isinstance(req, tuple) and len(req) >= 5:
            if len(req) == 6:
                flags, key, ledger_id, entry_id, body, _ = req
            else:
                flags, key, ledger_id, entry_id, body = req[:5]
            if (type(body) is bytes and len(body) >= _entry_header.size and type(key) is bytes and isinstance(flags, int)
                    and isinstance(ledger_id, int) and isinstance(entry_id, int)
                    and _I64_MIN <= flags <= _I64_MAX):
                # ids equal to the body's i64 fields are in range by that
                body_ledger, body_entry, lac = unpack(body)
                plain = entry_id >= 0 and body_ledger == ledger_id and body_entry == entry_id
        if plain:
            recovery = flags & _FLAG_RECOVERY_ADD
            if key is seg_key and ledger_id == seg_ledger and recovery == seg_recovery:
                if lac > top:
                    top = lac
                continue
            if seg_key is not None:
                out.append((start, i, top))
            seg_key, seg_ledger, seg_recovery, start, top = key, ledger_id, recovery, i, lac
            continue
        if seg_key is not None:
            out.append((start, i, top))
            seg_key = None
        out.append((i, i + 1, None))
    if seg_key is not None:
        out.append((start, n, top))
    return out


def encode_add_responses(items, version: int = 2) -> bytes:
    rows = list(items)
    if not 0 <= version <= _MAX_VERSION:
        raise ValueError(f"protocol version {version} is not 0..{_MAX_VERSION}")
    header = pack_header(version, _OP_ADD)
    flat = []
    extend = flat.extend
    for rc, ledger_id, entry_id in rows:
        extend((_ADD_RESPONSE, header, rc, ledger_id, entry_id))
    try:
        # One pack call for the whole batch; struct checks every range.
        return struct.pack(">" + "iIiqq" * len(rows), *flat)
    except struct.error:
        pass
    for rc, ledger_id, entry_id in rows:  # name the offending value like the native kernel
        for v in (rc, ledger_id, entry_id):
            if not isinstance(v, int):
                raise TypeError(f"an integer is required, got {type(v).__name__}")
        if not _I32_MIN <= rc <= _I32_MAX:
            raise OverflowError(f"rc {rc} does not fit in 32 bits")
        if not (_I64_MIN <= ledger_id <= _I64_MAX and _I64_MIN <= entry_id <= _I64_MAX):
            raise OverflowError("ledger and entry ids must fit in signed 64 bits")
    raise OverflowError("an ADD response value is out of range")


def encode_add_acks(reqs, rc: int, version: int = 2) -> bytes:
    if not isinstance(rc, int):
        raise TypeError(f"an integer is required, got {type(rc).__name__}")
    if not _I32_MIN <= rc <= _I32_MAX:
        raise OverflowError(f"rc {rc} does not fit in 32 bits")
    return encode_add_responses([(rc, req[2], req[3]) for req in reqs], version)


def crc32c(data, crc: int = 0) -> int:
    if not 0 <= crc <= _MAX_U32:
        raise ValueError("crc must fit in 32 bits")
    # google_crc32c wants read-only bytes; other buffers are copied once.
    return google_crc32c.extend(crc, data if type(data) is bytes else bytes(data))


_add_frame_head = struct.Struct(f">iI{MASTER_KEY_LENGTH}sqqqqI")  # length header key entry-header crc32c


def frame_add_crc32c(header: int, master_key: bytes, ledger_id: int, entry_id: int, lac: int,
                     total_length: int, payload) -> bytes:
    if type(master_key) is not bytes or len(master_key) != _KEY_LEN:
        raise ValueError(f"master key must be {_KEY_LEN} bytes")
    payload = bytes(payload) if type(payload) is not bytes else payload
    entry_header = ENTRY_HEADER.pack(ledger_id, entry_id, lac, total_length)
    crc = google_crc32c.extend(google_crc32c.value(entry_header), payload)
    head = _add_frame_head.pack(_add_frame_head.size - FRAME_LENGTH.size + len(payload), header, master_key,
                                ledger_id, entry_id, lac, total_length, crc)
    return head + payload


# ---------------------------------------------------------------- v3 (protobuf) ADD kernels
# Twins of _codec.pyx's v3 kernels (its comment says which frames are taken and which deferred).
_L = _layout
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


def _header_ok(h: dict) -> bool:
    return ("version" in h and "operation" in h and "txn" in h and 1 <= h["version"] <= _L.PROTOCOL_VERSION_V3
            and h.get("priority", 0) <= 0xFFFFFFFF and h["operation"] == _L.V3_OP_ADD_ENTRY)


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _v3_add_request(d, off: int, end: int):
    """(flags, key bounds, ledger, entry, body bounds, txn, priority) of a plain v3 ADD, else _Defer."""
    top, h, a = {}, {}, {}
    pos = off
    while pos < end:
        tag, pos = _get_varint(d, pos, end)
        ln, pos = _get_varint(d, pos, end)
        if tag not in (_TAG_HEADER, _TAG_ADD) or tag in top or ln > end - pos:
            raise _Defer
        top[tag] = True
        _fields(d, pos, pos + ln, _HEADER_TAGS if tag == _TAG_HEADER else _ADD_TAGS, h if tag == _TAG_HEADER else a)
        pos += ln
    if len(top) != 2 or not _header_ok(h) or not all(k in a for k in ("ledger", "entry", "key", "body")):
        raise _Defer
    ledger, entry = _signed(a["ledger"]), _signed(a["entry"])
    key = a["key"]
    if ("flag" in a and a["flag"] != _L.V3_ADD_FLAG_RECOVERY_ADD) or ledger < 0 or entry < 0 \
            or key[1] - key[0] != MASTER_KEY_LENGTH:
        raise _Defer
    return (FLAG_RECOVERY_ADD if "flag" in a else 0), key, ledger, entry, a["body"], h["txn"], h.get("priority", 0)


def _walk_frames(buf, start: int, max_frame: int):
    """(data, [(body offset, body end)], end, err): split_frames over an immutable copy."""
    data = buf if type(buf) is bytes else _view(buf, start, max_frame).tobytes()
    frames, end, err = split_frames(data, start, max_frame)
    return data, [(off, off + ln) for off, ln in frames], end, err


def scan_v3_add_requests(buf, start: int, max_frame: int, record=tuple):
    _check_record(record)
    data, frames, end, err = _walk_frames(buf, start, max_frame)
    out, deferred = [], []
    key = None
    for off, pos in frames:
        ln = pos - off
        try:
            flags, (k0, k1), ledger, entry, (b0, b1), txn, priority = _v3_add_request(data, off, pos)
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


def _v3_add_response_fields(d, off: int, end: int):
    top, h, a = {}, {}, {}
    status = None
    pos = off
    while pos < end:
        tag, pos = _get_varint(d, pos, end)
        v, pos = _get_varint(d, pos, end)
        if tag == _TAG_STATUS and status is None:
            status = v
            continue
        if tag not in (_TAG_HEADER, _TAG_ADD) or tag in top or v > end - pos:
            raise _Defer
        top[tag] = True
        _fields(d, pos, pos + v, _HEADER_TAGS if tag == _TAG_HEADER else _ADD_RESPONSE_TAGS,
                h if tag == _TAG_HEADER else a)
        pos += v
    if status is None or len(top) != 2 or not _header_ok(h) or len(a) != 3:
        raise _Defer
    return status, a["status"], _signed(a["ledger"]), _signed(a["entry"])


def scan_v3_add_responses(buf, start: int, max_frame: int, status_map: dict, record=tuple):
    _check_record(record)
    data, frames, end, err = _walk_frames(buf, start, max_frame)
    out, deferred = [], []
    for off, pos in frames:
        ln = pos - off
        try:
            status, add_status, ledger, entry = _v3_add_response_fields(data, off, pos)
        except _Defer:
            status = None
        rc = status_map.get(add_status) if status is not None and status in status_map else None
        if rc is None:
            deferred.append(len(out))
            out.append((off, ln))
            continue
        out.append(_new(record, (rc, ledger, entry)))
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
           + (v(_L.V3_ADD_FLAG << 3) + v(_L.V3_ADD_FLAG_RECOVERY_ADD) if h & FLAG_RECOVERY_ADD else b""))
    out = v(_TAG_HEADER) + v(len(header)) + header + v(_TAG_ADD) + v(len(add)) + add
    return FRAME_LENGTH.pack(len(out)) + out
