"""Wire codec byte kernel (pure Python twin of bk/_native/_codec.pyx).

Same functions, same results as the native kernel; see its docstring for the
contracts. A frame is `length i32 BE | body`; a v2 body starts with the header
int `(version << 24) | (op << 16) | flags` (version 0: the whole int is the op).
"""
from __future__ import annotations

import struct

import google_crc32c

# The one wire layout module (bk/formats: a leaf package that imports nothing else of bk).
from bk.formats.wire import (
    ADD_ENTRY_OFFSET, ADD_KEY_OFFSET, ADD_REQUEST_MIN_BYTES, ADD_RESPONSE_BYTES, CRC32C_DIGEST_LENGTH, ENTRY_HEADER,
    ENTRY_IDS_LAC,
    FLAG_DO_FENCING, FLAG_RECOVERY_ADD, FRAME_LENGTH, MASTER_KEY_LENGTH, MAX_ACCEPTED_VERSION, OP_ADD_ENTRY,
    OP_READ_ENTRY, READ_REQUEST_BODY, READ_REQUEST_BYTES, READ_RESPONSE_HEADER_BYTES, RESPONSE_IDS_BODY, pack_header,
)

ERR_OK = 0
ERR_NEGATIVE_LENGTH = 1
ERR_FRAME_TOO_LARGE = 2

_OP_ADD = OP_ADD_ENTRY
_OP_READ = OP_READ_ENTRY
_KEY_LEN = MASTER_KEY_LENGTH
_ADD_MIN = ADD_REQUEST_MIN_BYTES
_ADD_RESPONSE = ADD_RESPONSE_BYTES
_MAX_VERSION = MAX_ACCEPTED_VERSION
_MAX_U32 = 0xFFFFFFFF
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1

_length = FRAME_LENGTH
# header, master key (skipped), ledger id, entry id: an ADD request body up to the entry's ids
_read_ids = READ_REQUEST_BODY  # a READ request's header, ledger id, entry id
_add_ids = struct.Struct(f">I{ADD_ENTRY_OFFSET - ADD_KEY_OFFSET}xqq")
_add_response_body = RESPONSE_IDS_BODY  # header rc ledger_id entry_id (ADD_RESPONSE_BYTES)


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


def scan_add_requests(buf, start: int, max_frame: int, record=tuple, read_record=None):
    if read_record is not None:
        _check_record(read_record)
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
        elif ln == READ_REQUEST_BYTES and read_record is not None:
            h, ledger_id, entry_id = _read_ids.unpack_from(data, off)
            version = h >> 24
            op, flags = (h, 0) if version == 0 else ((h >> 16) & 0xFF, h & 0xFFFF)
            if version <= _MAX_VERSION and op == _OP_READ and not flags & FLAG_DO_FENCING and ledger_id >= 0 \
                    and entry_id >= -1:
                append(_new(read_record, (flags, ledger_id, entry_id, None, version)))
                continue
        deferred.append(len(out))
        append((off, ln))
    return out, pos, err, deferred


def scan_add_responses(buf, start: int, max_frame: int, record=tuple, read_record=None):
    _check_record(record)
    if read_record is not None:
        _check_record(read_record)
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
        if ln >= _ADD_RESPONSE:  # == READ_RESPONSE_HEADER_BYTES: header rc ids
            h, rc, ledger_id, entry_id = unpack_body(mv, off)
            version = h >> 24
            op = h if version == 0 else (h >> 16) & 0xFF
            if version <= _MAX_VERSION and op == _OP_ADD and ln == _ADD_RESPONSE:
                out.append(_new(record, (rc, ledger_id, entry_id)))
                continue
            if version <= _MAX_VERSION and op == _OP_READ and read_record is not None and (
                    rc == 0 or ln == READ_RESPONSE_HEADER_BYTES):
                body = mv[off + READ_RESPONSE_HEADER_BYTES:pos] if rc == 0 else None
                out.append(_new(read_record, (rc, ledger_id, entry_id, body)))
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


def crc32c_entry_ids(data):
    mv = memoryview(data).cast("B")
    head = ENTRY_HEADER.size
    if len(mv) < head + CRC32C_DIGEST_LENGTH:
        return None
    if crc32c(mv[head + CRC32C_DIGEST_LENGTH:], crc32c(mv[:head])) != int.from_bytes(mv[head:head + CRC32C_DIGEST_LENGTH], "big"):
        return None
    return ENTRY_HEADER.unpack_from(mv, 0)

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
