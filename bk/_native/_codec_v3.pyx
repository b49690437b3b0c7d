# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Wire codec kernel for v3 (protobuf) ADDs and plain READs (native). Pure twin: bk/_native/codec_v3_py.py.

scan_v3_add_requests(buf, start, max_frame, record=tuple, read_record=None) -> (items, end, err, deferred)
    As _codec.scan_add_requests for v3 frames: a plain v3 ADD Request comes back as a `record` of
    `(flags, master_key, ledger_id, entry_id, body, 3, txn_id, priority)` (V3AddRequest's
    layout; flags FLAG_RECOVERY_ADD for AddRequest.flag RECOVERY_ADD, | FLAG_DEFERRED_SYNC for
    writeFlags DEFERRED_SYNC); with `read_record`, a plain v3 READ Request (header and a
    readRequest of ledgerId >= 0 and entryId >= 0 alone: no flag, masterKey, previousLAC or
    timeOut) as a `read_record` of `(ledger_id, entry_id, header)`, header the BKPacketHeader's
    bytes exactly as the protobuf library re-serializes them (the frame is deferred when its
    bytes differ: field order, padded varints); any other frame as
    `(body_offset, body_len)` listed in `deferred`.
scan_v3_add_responses(buf, start, max_frame, status_map, record=tuple, read_record=None) -> (items, end, err, deferred)
    A plain v3 ADD Response comes back as `(rc, ledger_id, entry_id)` with rc =
    status_map[addResponse.status] (v3 -> v2 codes; a status outside the map defers the frame);
    with `read_record`, a plain v3 READ Response (header of operation READ_ENTRY, status, and a
    readResponse of status, ledgerId, entryId and maybe body: no maxLAC, lacUpdateTimestamp or
    unknown field) as a `read_record` of `(rc, ledger_id, entry_id, body)`, rc =
    status_map[readResponse.status], body the entry's bytes when rc is EOK (b"" when absent), else
    None: what bk.proto.v3.response_to_v2 makes of it.
encode_v3_add_responses(reqs, status) -> bytes
    One v3 ADD Response frame per V3AddRequest-shaped tuple (ids and txn id, priority echoed),
    with the v3 `status` in Response.status and AddResponse.status.
v3_add_request_from_v2(frame, txn_id) -> bytes | None
    The v3 ADD Request frame of a v2 ADD request frame (length prefix included), or None.
    FLAG_RECOVERY_ADD becomes AddRequest.flag RECOVERY_ADD, FLAG_DEFERRED_SYNC writeFlags DEFERRED_SYNC.
v3_read_request_from_v2(frame, txn_id) -> bytes | None
    The v3 READ Request frame of a plain v2 READ request frame (no flags, ids >= 0), or None.
"""
include "codec_base.pxi"

# ---------------------------------------------------------------- v3 (protobuf) ADD kernels
# The ADD's messages of BookkeeperProtocol.proto, read and written without the protobuf library
# (field numbers: the WL_V3_* names of bk/formats/wire.py). A frame is taken only when it is
# exactly what the fast path expects - each known field once, with its wire type, every required
# field present, enum values known, varints well formed - and is deferred otherwise: the caller's
# slow path (the protobuf library) then decides, so both give equal results.

cdef enum:
    _TAG_HEADER = (WL_V3_FIELD_HEADER << 3) | WL_V3_WIRE_LEN
    _TAG_STATUS = (WL_V3_FIELD_STATUS << 3) | WL_V3_WIRE_VARINT
    _TAG_ADD = (WL_V3_FIELD_ADD << 3) | WL_V3_WIRE_LEN
    _TAG_H_VERSION = (WL_V3_HEADER_VERSION << 3) | WL_V3_WIRE_VARINT
    _TAG_H_OPERATION = (WL_V3_HEADER_OPERATION << 3) | WL_V3_WIRE_VARINT
    _TAG_H_TXN = (WL_V3_HEADER_TXN_ID << 3) | WL_V3_WIRE_VARINT
    _TAG_H_PRIORITY = (WL_V3_HEADER_PRIORITY << 3) | WL_V3_WIRE_VARINT
    _TAG_A_LEDGER = (WL_V3_ADD_LEDGER_ID << 3) | WL_V3_WIRE_VARINT
    _TAG_A_ENTRY = (WL_V3_ADD_ENTRY_ID << 3) | WL_V3_WIRE_VARINT
    _TAG_A_KEY = (WL_V3_ADD_MASTER_KEY << 3) | WL_V3_WIRE_LEN
    _TAG_A_BODY = (WL_V3_ADD_BODY << 3) | WL_V3_WIRE_LEN
    _TAG_A_WRITE_FLAGS = (WL_V3_ADD_WRITE_FLAGS << 3) | WL_V3_WIRE_VARINT
    _TAG_A_FLAG = (WL_V3_ADD_FLAG << 3) | WL_V3_WIRE_VARINT
    _TAG_R_STATUS = (WL_V3_ADD_RESPONSE_STATUS << 3) | WL_V3_WIRE_VARINT
    _TAG_R_LEDGER = (WL_V3_ADD_RESPONSE_LEDGER_ID << 3) | WL_V3_WIRE_VARINT
    _TAG_R_ENTRY = (WL_V3_ADD_RESPONSE_ENTRY_ID << 3) | WL_V3_WIRE_VARINT
    _MAX_VARINT = 10
    # The READ's numbers (BookkeeperProtocol.proto; the reads kernel names its answer's the same way)
    _TAG_READ = (100 << 3) | WL_V3_WIRE_LEN  # Request.readRequest
    _TAG_RD_LEDGER = (1 << 3) | WL_V3_WIRE_VARINT  # ReadRequest.ledgerId, .entryId
    _TAG_RD_ENTRY = (2 << 3) | WL_V3_WIRE_VARINT
    _V3_OP_READ_ENTRY = 1  # OperationType.READ_ENTRY
    _TAG_RR_STATUS = (1 << 3) | WL_V3_WIRE_VARINT  # ReadResponse.status, .ledgerId, .entryId, .body
    _TAG_RR_LEDGER = (2 << 3) | WL_V3_WIRE_VARINT
    _TAG_RR_ENTRY = (3 << 3) | WL_V3_WIRE_VARINT
    _TAG_RR_BODY = (4 << 3) | WL_V3_WIRE_LEN


cdef inline Py_ssize_t _get_varint(const unsigned char *p, Py_ssize_t n, uint64_t *out) noexcept nogil:
    """Length of the varint at p (n bytes readable) with its value in *out; 0 if malformed or cut."""
    cdef uint64_t v = 0
    cdef Py_ssize_t i
    for i in range(_MAX_VARINT):
        if i >= n:
            return 0
        v |= (<uint64_t>(p[i] & 0x7f)) << (7 * i)
        if not p[i] & 0x80:
            if i == _MAX_VARINT - 1 and p[i] > 1:
                return 0
            out[0] = v
            return i + 1
    return 0


cdef inline bint _get_pair(const unsigned char *p, Py_ssize_t end, Py_ssize_t *pos, uint64_t *tag,
                           uint64_t *v) noexcept nogil:
    """A field's tag and its varint (a value, or a LEN field's length) at *pos, which moves past them."""
    cdef Py_ssize_t k = _get_varint(p + pos[0], end - pos[0], tag)
    if not k:
        return False
    pos[0] += k
    k = _get_varint(p + pos[0], end - pos[0], v)
    if not k:
        return False
    pos[0] += k
    return True


cdef inline unsigned char *_put_v3_header(unsigned char *p, Py_ssize_t header_len, uint64_t operation,
                                          uint64_t txn, uint64_t priority) noexcept nogil:
    """`header` (field 1) of a v3 Request or Response: version 3, operation, txnId, priority."""
    p = _put_varint(p, _TAG_HEADER)
    p = _put_varint(p, header_len)
    p = _put_varint(p, _TAG_H_VERSION)
    p = _put_varint(p, WL_PROTOCOL_VERSION_V3)
    p = _put_varint(p, _TAG_H_OPERATION)
    p = _put_varint(p, operation)
    p = _put_varint(p, _TAG_H_TXN)
    p = _put_varint(p, txn)
    if priority:
        p = _put_varint(p, _TAG_H_PRIORITY)
        p = _put_varint(p, priority)
    return p


cdef struct _V3Add:
    uint64_t version, operation, txn, priority, ledger, entry, flag, write_flags
    const unsigned char *key
    const unsigned char *body
    const unsigned char *header
    Py_ssize_t key_len, body_len, header_len
    unsigned int seen


cdef enum:
    _S_VERSION = 1 << 0
    _S_OPERATION = 1 << 1
    _S_TXN = 1 << 2
    _S_PRIORITY = 1 << 3
    _S_LEDGER = 1 << 4
    _S_ENTRY = 1 << 5
    _S_KEY = 1 << 6
    _S_BODY = 1 << 7
    _S_WRITE_FLAGS = 1 << 8
    _S_FLAG = 1 << 9
    _S_HEADER = 1 << 10
    _S_ADD = 1 << 11
    _S_STATUS = 1 << 12


cdef inline bint _once(_V3Add *a, unsigned int bit) noexcept nogil:
    if a.seen & bit:
        return False
    a.seen |= bit
    return True


cdef bint _parse_header(const unsigned char *p, Py_ssize_t n, _V3Add *a) noexcept nogil:
    cdef Py_ssize_t pos = 0, k
    cdef uint64_t tag, v
    while pos < n:
        if not _get_pair(p, n, &pos, &tag, &v):
            return False
        if tag == _TAG_H_VERSION and _once(a, _S_VERSION):
            a.version = v
        elif tag == _TAG_H_OPERATION and _once(a, _S_OPERATION):
            a.operation = v
        elif tag == _TAG_H_TXN and _once(a, _S_TXN):
            a.txn = v
        elif tag == _TAG_H_PRIORITY and _once(a, _S_PRIORITY):
            a.priority = v
        else:
            return False
    # proto2 closed enums: an unknown version or operation would not be set by the library
    return ((a.seen & (_S_VERSION | _S_OPERATION | _S_TXN)) == (_S_VERSION | _S_OPERATION | _S_TXN)
            and 1 <= a.version <= WL_PROTOCOL_VERSION_V3 and a.priority <= _MAX_U32_C)


cdef enum:
    _MAX_U32_C = 0xFFFFFFFF


cdef bint _parse_add(const unsigned char *p, Py_ssize_t n, _V3Add *a) noexcept nogil:
    cdef Py_ssize_t pos = 0, k
    cdef uint64_t tag, v
    while pos < n:
        if not _get_pair(p, n, &pos, &tag, &v):
            return False
        if tag == _TAG_A_KEY or tag == _TAG_A_BODY:
            if v > <uint64_t>(n - pos):
                return False
            if tag == _TAG_A_KEY and _once(a, _S_KEY):
                a.key, a.key_len = p + pos, <Py_ssize_t>v
            elif tag == _TAG_A_BODY and _once(a, _S_BODY):
                a.body, a.body_len = p + pos, <Py_ssize_t>v
            else:
                return False
            pos += <Py_ssize_t>v
        elif tag == _TAG_A_LEDGER and _once(a, _S_LEDGER):
            a.ledger = v
        elif tag == _TAG_A_ENTRY and _once(a, _S_ENTRY):
            a.entry = v
        elif tag == _TAG_A_WRITE_FLAGS and _once(a, _S_WRITE_FLAGS):
            a.write_flags = v  # int32: DEFERRED_SYNC becomes FLAG_DEFERRED_SYNC in the record
        elif tag == _TAG_A_FLAG and _once(a, _S_FLAG):
            a.flag = v
        else:
            return False
    return ((a.seen & (_S_LEDGER | _S_ENTRY | _S_KEY | _S_BODY)) == (_S_LEDGER | _S_ENTRY | _S_KEY | _S_BODY)
            and (not a.seen & _S_FLAG or a.flag == WL_V3_ADD_FLAG_RECOVERY_ADD)
            and <int64_t>a.ledger >= 0 and <int64_t>a.entry >= 0 and a.key_len == WL_MASTER_KEY_LENGTH)


cdef bint _parse_read(const unsigned char *p, Py_ssize_t n, _V3Add *a) noexcept nogil:
    """A ReadRequest of ledgerId and entryId alone (each once, either order, both >= 0)."""
    cdef Py_ssize_t pos = 0
    cdef uint64_t tag, v
    while pos < n:
        if not _get_pair(p, n, &pos, &tag, &v):
            return False
        if tag == _TAG_RD_LEDGER and _once(a, _S_LEDGER):
            a.ledger = v
        elif tag == _TAG_RD_ENTRY and _once(a, _S_ENTRY):
            a.entry = v
        else:
            return False  # flag, masterKey, previousLAC, timeOut, unknown fields: the full path
    return ((a.seen & (_S_LEDGER | _S_ENTRY)) == (_S_LEDGER | _S_ENTRY)
            and <int64_t>a.ledger >= 0 and <int64_t>a.entry >= 0)


cdef bint _canonical_header(const unsigned char *h, Py_ssize_t n, _V3Add *a) noexcept nogil:
    """True when the header's bytes h[:n] are what the protobuf library writes for it (fields
    in number order, shortest varints): the answer echoes them as they came."""
    cdef unsigned char out[64]
    cdef unsigned char *p = out
    if n > 60:
        return False
    p = _put_varint(p, _TAG_H_VERSION)
    p = _put_varint(p, a.version)
    p = _put_varint(p, _TAG_H_OPERATION)
    p = _put_varint(p, a.operation)
    p = _put_varint(p, _TAG_H_TXN)
    p = _put_varint(p, a.txn)
    if a.seen & _S_PRIORITY:  # uint32 (_parse_header checked its range): written even when 0
        p = _put_varint(p, _TAG_H_PRIORITY)
        p = _put_varint(p, a.priority)
    return p - out == n and memcmp(out, h, n) == 0


cdef bint _parse_v3_request(const unsigned char *f, Py_ssize_t n, _V3Add *a, bint read) noexcept nogil:
    """A plain v3 ADD Request (read False) or plain READ Request (read True, see above) into *a;
    a.header / a.header_len point at its header's bytes."""
    cdef Py_ssize_t pos = 0
    cdef uint64_t tag, ln
    cdef uint64_t body_tag = _TAG_READ if read else _TAG_ADD
    a.seen = 0
    a.priority = 0
    a.flag = 0
    a.write_flags = 0
    while pos < n:
        if not _get_pair(f, n, &pos, &tag, &ln) or (tag != _TAG_HEADER and tag != body_tag):
            return False
        if ln > <uint64_t>(n - pos):
            return False
        if tag == _TAG_HEADER:
            if not _once(a, _S_HEADER) or not _parse_header(f + pos, <Py_ssize_t>ln, a):
                return False
            a.header, a.header_len = f + pos, <Py_ssize_t>ln
        elif not _once(a, _S_ADD) or not (_parse_read(f + pos, <Py_ssize_t>ln, a) if read
                                          else _parse_add(f + pos, <Py_ssize_t>ln, a)):
            return False
        pos += <Py_ssize_t>ln
    if (a.seen & (_S_HEADER | _S_ADD)) != (_S_HEADER | _S_ADD):
        return False
    if read:
        return a.operation == _V3_OP_READ_ENTRY and _canonical_header(a.header, a.header_len, a)
    return a.operation == WL_V3_OP_ADD_ENTRY


cdef inline Py_ssize_t _v3_add_response_size(uint64_t status, uint64_t txn, uint64_t priority, uint64_t ledger,
                                              uint64_t entry, Py_ssize_t *header_len,
                                              Py_ssize_t *add_len) noexcept nogil:
    header_len[0] = 2 + 2 + 1 + _varint_size(txn) + ((1 + _varint_size(priority)) if priority else 0)
    add_len[0] = 1 + _varint_size(status) + 1 + _varint_size(ledger) + 1 + _varint_size(entry)
    return (1 + _varint_size(header_len[0]) + header_len[0] + 1 + _varint_size(status)
            + 2 + _varint_size(add_len[0]) + add_len[0])


cdef inline void _v3_ids(object req, uint64_t *v) except *:
    """v = [ledger id, entry id, txn id, priority] of a V3AddRequest-shaped tuple."""
    if isinstance(req, tuple) and PyTuple_GET_SIZE(req) >= 8:
        # PyTuple_GET_ITEM: a NamedTuple's generic item lookup goes through Python
        v[0] = <uint64_t><int64_t><object>PyTuple_GET_ITEM(req, 2)
        v[1] = <uint64_t><int64_t><object>PyTuple_GET_ITEM(req, 3)
        v[2] = <uint64_t><object>PyTuple_GET_ITEM(req, 6)
        v[3] = <uint64_t><object>PyTuple_GET_ITEM(req, 7)
    else:
        v[0] = <uint64_t><int64_t>req[2]
        v[1] = <uint64_t><int64_t>req[3]
        v[2] = <uint64_t>req[6]
        v[3] = <uint64_t>req[7]


@cython.boundscheck(True)
def encode_v3_add_responses(reqs, uint64_t status):
    cdef list items = reqs if type(reqs) is list else list(reqs)
    cdef Py_ssize_t i, n = len(items), total = 0, hl, al, size
    cdef uint64_t v[4]
    cdef bytes out
    cdef unsigned char *p
    for i in range(n):  # sizes first: one allocation for the batch
        _v3_ids(items[i], v)
        total += 4 + _v3_add_response_size(status, v[2], v[3], v[0], v[1], &hl, &al)
    out = PyBytes_FromStringAndSize(NULL, total)
    p = <unsigned char *>PyBytes_AS_STRING(out)
    for i in range(n):
        _v3_ids(items[i], v)
        size = _v3_add_response_size(status, v[2], v[3], v[0], v[1], &hl, &al)
        _put_u32(p, <uint32_t>size)
        p = _put_v3_header(p + 4, hl, WL_V3_OP_ADD_ENTRY, v[2], v[3])
        p = _put_varint(p, _TAG_STATUS)
        p = _put_varint(p, status)
        p = _put_varint(p, _TAG_ADD)
        p = _put_varint(p, al)
        p = _put_varint(p, _TAG_R_STATUS)
        p = _put_varint(p, status)
        p = _put_varint(p, _TAG_R_LEDGER)
        p = _put_varint(p, v[0])
        p = _put_varint(p, _TAG_R_ENTRY)
        p = _put_varint(p, v[1])
    return out


cdef bint _parse_v3_response(const unsigned char *f, Py_ssize_t n, _V3Add *a, uint64_t *status,
                             bint reads) noexcept nogil:
    """A plain v3 ADD Response: header (op ADD), status, addResponse {status, ledgerId, entryId};
    or, with `reads`, a plain READ Response: header (op READ_ENTRY), status, readResponse
    {status, ledgerId, entryId, body?}. a.flag carries the body's status, a.operation says which
    (the body's tag must match the header's operation), a.body the entry (absent: a.body NULL)."""
    cdef Py_ssize_t pos = 0, sub_end
    cdef uint64_t tag, v, body_tag = 0
    a.seen = 0
    a.priority = 0
    a.body = NULL
    a.body_len = 0
    while pos < n:
        if not _get_pair(f, n, &pos, &tag, &v):
            return False
        if tag == _TAG_STATUS:
            if not _once(a, _S_STATUS):
                return False
            status[0] = v
            continue
        if v > <uint64_t>(n - pos):
            return False
        if tag == _TAG_HEADER:
            if not _once(a, _S_HEADER) or not _parse_header(f + pos, <Py_ssize_t>v, a):
                return False
            pos += <Py_ssize_t>v
            continue
        if not (tag == _TAG_ADD or (reads and tag == _TAG_READ)) or not _once(a, _S_ADD):
            return False
        body_tag = tag
        sub_end = pos + <Py_ssize_t>v
        while pos < sub_end:
            if not _get_pair(f, sub_end, &pos, &tag, &v):
                return False
            if tag == _TAG_R_STATUS and _once(a, _S_FLAG):  # AddResponse's and ReadResponse's: 1, 2, 3
                a.flag = v
            elif tag == _TAG_R_LEDGER and _once(a, _S_LEDGER):
                a.ledger = v
            elif tag == _TAG_R_ENTRY and _once(a, _S_ENTRY):
                a.entry = v
            elif body_tag == _TAG_READ and tag == _TAG_RR_BODY and _once(a, _S_BODY):
                if v > <uint64_t>(sub_end - pos):
                    return False
                a.body, a.body_len = f + pos, <Py_ssize_t>v
                pos += <Py_ssize_t>v
            else:
                return False  # maxLAC, lacUpdateTimestamp (a long poll's answer), unknown: the library
    if ((a.seen & (_S_HEADER | _S_STATUS | _S_ADD | _S_FLAG | _S_LEDGER | _S_ENTRY))
            != (_S_HEADER | _S_STATUS | _S_ADD | _S_FLAG | _S_LEDGER | _S_ENTRY)):
        return False
    if body_tag == _TAG_READ:
        return a.operation == _V3_OP_READ_ENTRY
    return a.operation == WL_V3_OP_ADD_ENTRY


cdef _scan_v3(buf, Py_ssize_t start, Py_ssize_t max_frame, record, dict status_map, read_record=None):
    """scan_v3_add_requests (status_map None) or scan_v3_add_responses: one walk, one record kind."""
    cdef Py_buffer view
    cdef const unsigned char *b
    cdef Py_ssize_t n, pos, length = 0
    cdef int st = -1
    cdef _V3Add a
    cdef uint64_t status = 0
    cdef list out = []
    cdef list deferred = []
    cdef bytes key = None
    cdef object rec, rc
    cdef object eok = status_map.get(0) if status_map is not None else None
    _check_record(record)
    if read_record is not None:
        _check_record(read_record)
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        n = view.len
        _check_args(n, start, max_frame)
        b = <const unsigned char *>view.buf
        pos = start
        while True:
            st = _next_frame(b, n, pos, max_frame, &length)
            if st != 0:
                break
            rec = None
            if status_map is None:
                if _parse_v3_request(b + pos + 4, length, &a, False):
                    if key is None or memcmp(PyBytes_AS_STRING(key), a.key, WL_MASTER_KEY_LENGTH) != 0:
                        key = PyBytes_FromStringAndSize(<const char *>a.key, WL_MASTER_KEY_LENGTH)
                    rec = bk_codec_new_record(record, 8)
                    _put(rec, 0, (WL_FLAG_RECOVERY_ADD if a.seen & _S_FLAG else 0)
                         | (WL_FLAG_DEFERRED_SYNC if a.write_flags & WL_V3_WRITE_FLAG_DEFERRED_SYNC else 0))
                    _put(rec, 1, key)
                    _put(rec, 2, <int64_t>a.ledger)
                    _put(rec, 3, <int64_t>a.entry)
                    _put(rec, 4, PyBytes_FromStringAndSize(<const char *>a.body, a.body_len))
                    _put(rec, 5, WL_PROTOCOL_VERSION_V3)
                    _put(rec, 6, a.txn)
                    _put(rec, 7, a.priority)
                elif read_record is not None and _parse_v3_request(b + pos + 4, length, &a, True):
                    rec = bk_codec_new_record(read_record, 3)
                    _put(rec, 0, <int64_t>a.ledger)
                    _put(rec, 1, <int64_t>a.entry)
                    _put(rec, 2, PyBytes_FromStringAndSize(<const char *>a.header, a.header_len))
            elif _parse_v3_response(b + pos + 4, length, &a, &status, read_record is not None):
                # the common answer, EOK (0) twice, without two dict lookups
                rc = eok if status == 0 and a.flag == 0 else (
                    status_map.get(a.flag) if status in status_map else None)
                if rc is None:
                    pass
                elif a.operation == WL_V3_OP_ADD_ENTRY:
                    rec = bk_codec_new_record(record, 3)
                    _put(rec, 0, rc)
                    _put(rec, 1, <int64_t>a.ledger)
                    _put(rec, 2, <int64_t>a.entry)
                else:
                    rec = bk_codec_new_record(read_record, 4)
                    _put(rec, 0, rc)
                    _put(rec, 1, <int64_t>a.ledger)
                    _put(rec, 2, <int64_t>a.entry)
                    _put(rec, 3, None if rc != 0 else
                         PyBytes_FromStringAndSize(<const char *>a.body, a.body_len) if a.body != NULL else b"")
            if rec is None:
                deferred.append(len(out))
                rec = (pos + 4, length)
            out.append(rec)
            pos += 4 + length
        return out, pos, (st if st > 0 else 0), deferred
    finally:
        PyBuffer_Release(&view)


def scan_v3_add_requests(buf, Py_ssize_t start, Py_ssize_t max_frame, record=tuple, read_record=None):
    return _scan_v3(buf, start, max_frame, record, None, read_record)


def scan_v3_add_responses(buf, Py_ssize_t start, Py_ssize_t max_frame, dict status_map, record=tuple,
                          read_record=None):
    if status_map is None:
        raise TypeError("status_map must be a dict of v3 status -> v2 code")
    return _scan_v3(buf, start, max_frame, record, status_map, read_record)


cdef bytes _v3_request_head(uint64_t operation, uint64_t txn, uint64_t body_tag, int64_t ledger_id,
                            int64_t entry_id, Py_ssize_t rest, unsigned char **end):
    """A v3 Request frame, allocated whole and written up to its body's ledgerId and entryId
    (fields 1 and 2 of AddRequest and ReadRequest alike), `rest` bytes of the body after them
    left for the caller at *end."""
    cdef Py_ssize_t hl = 2 + 2 + 1 + _varint_size(txn)
    cdef Py_ssize_t bl = 1 + _varint_size(<uint64_t>ledger_id) + 1 + _varint_size(<uint64_t>entry_id) + rest
    cdef Py_ssize_t size = 1 + _varint_size(hl) + hl + _varint_size(body_tag) + _varint_size(bl) + bl
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 4 + size)
    cdef unsigned char *p = <unsigned char *>PyBytes_AS_STRING(out)
    _put_u32(p, <uint32_t>size)
    p = _put_v3_header(p + 4, hl, operation, txn, 0)
    p = _put_varint(p, body_tag)
    p = _put_varint(p, bl)
    p = _put_varint(p, _TAG_A_LEDGER)  # == _TAG_RD_LEDGER
    p = _put_varint(p, <uint64_t>ledger_id)
    p = _put_varint(p, _TAG_A_ENTRY)  # == _TAG_RD_ENTRY
    end[0] = _put_varint(p, <uint64_t>entry_id)
    return out


def v3_add_request_from_v2(frame, uint64_t txn_id):
    """The v3 ADD Request frame asking what the v2 ADD request `frame` (length prefix included)
    asks, with `txn_id`; None when `frame` is not a plain v2 ADD (version 1..2, ids >= 0)."""
    cdef Py_buffer view
    cdef const unsigned char *f
    cdef Py_ssize_t n, body_len
    cdef uint32_t h
    cdef int64_t ledger_id, entry_id
    cdef bint recovery, deferred_sync
    cdef bytes out
    cdef unsigned char *p
    PyObject_GetBuffer(frame, &view, PyBUF_SIMPLE)
    try:
        n = view.len
        f = <const unsigned char *>view.buf
        if n < WL_FRAME_LENGTH_BYTES + WL_ADD_REQUEST_MIN_BYTES or <Py_ssize_t>_u32(f) != n - WL_FRAME_LENGTH_BYTES:
            return None
        f += WL_FRAME_LENGTH_BYTES
        n -= WL_FRAME_LENGTH_BYTES
        h = _u32(f)
        if (h >> 24) < 1 or (h >> 24) > WL_MAX_ACCEPTED_VERSION or ((h >> 16) & 0xff) != WL_OP_ADD_ENTRY:
            return None
        ledger_id = _i64(f + WL_ADD_ENTRY_OFFSET)
        entry_id = _i64(f + WL_ADD_ENTRY_OFFSET + WL_ID_BYTES)
        if ledger_id < 0 or entry_id < 0:
            return None
        recovery = (h & 0xffff & WL_FLAG_RECOVERY_ADD) != 0
        deferred_sync = (h & 0xffff & WL_FLAG_DEFERRED_SYNC) != 0
        body_len = n - WL_ADD_ENTRY_OFFSET
        out = _v3_request_head(WL_V3_OP_ADD_ENTRY, txn_id, _TAG_ADD, ledger_id, entry_id,
                               2 + WL_MASTER_KEY_LENGTH + 1 + _varint_size(body_len) + body_len
                               + (3 if recovery else 0) + (2 if deferred_sync else 0), &p)
        p = _put_varint(p, _TAG_A_KEY)
        p = _put_varint(p, WL_MASTER_KEY_LENGTH)
        memcpy(p, f + WL_ADD_KEY_OFFSET, WL_MASTER_KEY_LENGTH)
        p += WL_MASTER_KEY_LENGTH
        p = _put_varint(p, _TAG_A_BODY)
        p = _put_varint(p, body_len)
        memcpy(p, f + WL_ADD_ENTRY_OFFSET, body_len)
        p += body_len
        if deferred_sync:  # AddRequest.writeFlags (field 5, one-byte tag and value)
            p = _put_varint(p, _TAG_A_WRITE_FLAGS)
            p = _put_varint(p, WL_V3_WRITE_FLAG_DEFERRED_SYNC)
        if recovery:
            p = _put_varint(p, _TAG_A_FLAG)
            p = _put_varint(p, WL_V3_ADD_FLAG_RECOVERY_ADD)
        return out
    finally:
        PyBuffer_Release(&view)


def v3_read_request_from_v2(frame, uint64_t txn_id):
    """The v3 READ Request frame asking what the v2 READ request `frame` (length prefix included)
    asks, with `txn_id`; None unless `frame` is a plain v2 READ (version 1..2, no flags, ids >= 0:
    a fencing read and a read of entry -1 take the protobuf library's path)."""
    cdef Py_buffer view
    cdef const unsigned char *f
    cdef uint32_t h
    cdef int64_t ledger_id, entry_id
    cdef unsigned char *p
    PyObject_GetBuffer(frame, &view, PyBUF_SIMPLE)
    try:
        f = <const unsigned char *>view.buf
        if view.len != WL_FRAME_LENGTH_BYTES + WL_READ_REQUEST_BYTES or _u32(f) != WL_READ_REQUEST_BYTES:
            return None
        f += WL_FRAME_LENGTH_BYTES
        h = _u32(f)
        if (h >> 24) < 1 or (h >> 24) > WL_MAX_ACCEPTED_VERSION or ((h >> 16) & 0xff) != WL_OP_READ_ENTRY \
                or (h & 0xffff) != 0:
            return None
        ledger_id = _i64(f + WL_PACKET_HEADER_BYTES)
        entry_id = _i64(f + WL_PACKET_HEADER_BYTES + WL_ID_BYTES)
        if ledger_id < 0 or entry_id < 0:
            return None
        return _v3_request_head(_V3_OP_READ_ENTRY, txn_id, _TAG_READ, ledger_id, entry_id, 0, &p)
    finally:
        PyBuffer_Release(&view)
