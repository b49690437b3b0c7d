# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Wire codec byte kernel (native): v2 framing and the ADD hot path.

A frame is `length i32 BE | body`; a v2 body starts with the header int
`(version << 24) | (op << 16) | flags` (version 0: the whole int is the op).
Pure twin: bk/_native/codec_py.py (same functions, same results).

split_frames(buf, start, max_frame) -> (list[(body_offset, body_len)], end, err)
    Every complete frame from `start` on. `end` is the offset of the first byte
    not consumed (a partial frame, or the bad length prefix when err != 0).
    err 0: fine; 1: negative length at `end`; 2: length > max_frame at `end`.
    A bad length is reported as soon as its 4 bytes are present: the body is
    never waited for nor allocated.
scan_add_requests(buf, start, max_frame, record=tuple) -> (items, end, err, deferred)
    Like split_frames, but a well-formed ADD request (version 0..2, op ADD,
    body >= 56 bytes, ledger id >= 0, entry id >= 0) comes back decoded as a
    `record` of `(flags, master_key, ledger_id, entry_id, entry_bytes, version)`;
    any other frame as a plain `(body_offset, body_len)` tuple, and `deferred`
    lists the indexes of those in `items` (the caller's slow path). Equal
    master keys in one call share one bytes object.
scan_add_responses(buf, start, max_frame, record=tuple) -> (items, end, err, deferred)
    A 24-byte ADD response (version 0..2) comes back as a `record` of
    `(rc, ledger_id, entry_id)`; any other frame as in scan_add_requests.
    `record` is `tuple` or a tuple subclass without instance fields (a
    NamedTuple): records are filled in place, as tuple.__new__(record, values)
    would build them, without a Python-level call per frame.
scan_add_run(reqs) -> list[(start, end, top_lac or None)]
    The bookie's ADD batch in one pass. `reqs`: AddRequest-shaped tuples
    `(flags, master_key, ledger_id, entry_id, body, ...)`. A request is plain
    when flags, ledger_id and entry_id are ints fitting signed 64 bits,
    master_key and body are exactly bytes, the body holds the 24-byte entry
    header, names the same ledger and entry ids, and entry_id >= 0. Consecutive
    plain requests with equal ledger ids, the SAME key object and equal
    `flags & FLAG_RECOVERY_ADD` (0x2) form one segment `(start, end, top_lac)`,
    top_lac the highest LAC (entry header bytes 16..24, i64 BE) among them; any
    other request is a segment of its own `(i, i + 1, None)`. Segments cover
    `reqs` in order.
encode_add_responses(items, version=2) -> bytes
    One buffer with a complete ADD response frame per `(rc, ledger_id, entry_id)`.
encode_add_acks(reqs, rc, version=2) -> bytes
    The same for one status `rc` and the ids at positions 2 and 3 of every
    request (AddRequest-shaped): no row tuple per answer.
crc32c(data, crc=0) -> int
    google_crc32c.extend(crc, data) semantics, on any contiguous buffer.
frame_add_crc32c(header, master_key, ledger_id, entry_id, lac, total_length, payload) -> bytes
    The client's whole ADD request frame in one allocation: `length | header |
    master_key(20) | ledger entry lac total_length (i64 BE) | crc32c | payload`,
    the CRC32C digest (u32 BE) taken over the 32-byte entry header then the
    payload, as DigestManager's CRC32C digest.
"""
cimport cython
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from cpython.tuple cimport PyTuple_SET_ITEM, PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.ref cimport PyObject
from cpython.bytes cimport PyBytes_CheckExact, PyBytes_GET_SIZE
from cpython.long cimport PyLong_Check, PyLong_AsLongLong
from cpython.ref cimport Py_INCREF
from libc.string cimport memcmp, memcpy
from libc.stdint cimport uint32_t, int32_t, uint64_t, int64_t

cdef extern from "crc32c.h" nogil:
    void bk_crc32c_init()
    uint32_t bk_crc32c_extend(uint32_t crc, const void *data, size_t length)

cdef extern from *:
    """
    /* A tuple (or field-less tuple subclass) of n slots to fill with
       PyTuple_SET_ITEM: what tuple.__new__(type, values) allocates. */
    static PyObject *bk_codec_new_record(PyObject *type, Py_ssize_t n)
    {
        if (type == (PyObject *)&PyTuple_Type)
            return PyTuple_New(n);
        return ((PyTypeObject *)type)->tp_alloc((PyTypeObject *)type, n);
    }
    """
    object bk_codec_new_record(object type, Py_ssize_t n)

bk_crc32c_init()

ERR_OK = 0
ERR_NEGATIVE_LENGTH = 1
ERR_FRAME_TOO_LARGE = 2

# Every size, offset, op code and flag below is a WL_ name of bk/proto/layout.py (generated pxi).
include "wire_layout.pxi"

cdef Py_ssize_t _NOGIL_MIN_BYTES = 64 * 1024

cdef uint64_t _MAX_U32 = 0xFFFFFFFF


cdef inline uint32_t _u32(const unsigned char *p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3]


cdef inline int64_t _i64(const unsigned char *p) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(8):
        v = (v << 8) | p[i]
    return <int64_t>v


cdef inline void _put_u32(unsigned char *p, uint32_t v) noexcept nogil:
    p[0] = (v >> 24) & 0xff
    p[1] = (v >> 16) & 0xff
    p[2] = (v >> 8) & 0xff
    p[3] = v & 0xff


cdef inline void _put_i64(unsigned char *p, int64_t s) noexcept nogil:
    cdef uint64_t v = <uint64_t>s
    cdef int i
    for i in range(7, -1, -1):
        p[i] = v & 0xff
        v >>= 8


cdef inline int _next_frame(const unsigned char *b, Py_ssize_t n, Py_ssize_t pos,
                            int64_t max_frame, Py_ssize_t *length) noexcept nogil:
    """0: a complete frame at pos (length set); -1: incomplete; 1/2: bad length."""
    cdef int32_t ln
    if n - pos < 4:
        return -1
    ln = <int32_t>_u32(b + pos)
    if ln < 0:
        return 1
    if <int64_t>ln > max_frame:
        return 2
    if n - pos - 4 < ln:
        return -1
    length[0] = ln
    return 0


cdef inline void _check_args(Py_ssize_t n, Py_ssize_t start, Py_ssize_t max_frame) except *:
    if start < 0 or start > n:
        raise ValueError(f"start {start} outside buffer of {n} bytes")
    if max_frame < 0:
        raise ValueError("max_frame must be >= 0")


cdef _check_record(object record):
    if record is tuple:
        return
    if not (isinstance(record, type) and issubclass(record, tuple)
            and record.__basicsize__ == tuple.__basicsize__ and record.__dictoffset__ == 0):
        raise TypeError(f"record must be tuple or a field-less tuple subclass, got {record!r}")


cdef inline void _put(object rec, Py_ssize_t i, object value):
    Py_INCREF(value)  # PyTuple_SET_ITEM steals a reference
    PyTuple_SET_ITEM(rec, i, value)


def split_frames(buf, Py_ssize_t start, Py_ssize_t max_frame):
    cdef Py_buffer view
    cdef const unsigned char *b
    cdef Py_ssize_t n, pos, length = 0
    cdef int st = -1
    cdef list out = []
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
            out.append((pos + 4, length))
            pos += 4 + length
        return out, pos, (st if st > 0 else 0)
    finally:
        PyBuffer_Release(&view)


def scan_add_requests(buf, Py_ssize_t start, Py_ssize_t max_frame, record=tuple):
    cdef Py_buffer view
    cdef const unsigned char *b
    cdef const unsigned char *f
    cdef Py_ssize_t n, pos, length = 0
    cdef int st = -1
    cdef uint32_t h, version, op, flags
    cdef int64_t ledger_id, entry_id
    cdef list out = []
    cdef list deferred = []
    cdef bytes key = None
    cdef object rec
    _check_record(record)
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
            f = b + pos + 4
            if length >= WL_ADD_REQUEST_MIN_BYTES:
                h = _u32(f)
                version = h >> 24  # layout.split_header
                if version == 0:
                    op, flags = h, 0
                else:
                    op, flags = (h >> 16) & 0xff, h & 0xffff
                ledger_id = _i64(f + WL_ADD_ENTRY_OFFSET)
                entry_id = _i64(f + WL_ADD_ENTRY_OFFSET + WL_ID_BYTES)
                if (version <= WL_MAX_ACCEPTED_VERSION and op == WL_OP_ADD_ENTRY
                        and ledger_id >= 0 and entry_id >= 0):
                    # Adds of one connection nearly always carry one ledger's key.
                    if key is None or memcmp(PyBytes_AS_STRING(key), f + WL_ADD_KEY_OFFSET,
                                             WL_MASTER_KEY_LENGTH) != 0:
                        key = PyBytes_FromStringAndSize(<const char *>(f + WL_ADD_KEY_OFFSET),
                                                        WL_MASTER_KEY_LENGTH)
                    rec = bk_codec_new_record(record, 6)
                    _put(rec, 0, flags)
                    _put(rec, 1, key)
                    _put(rec, 2, ledger_id)
                    _put(rec, 3, entry_id)
                    _put(rec, 4, PyBytes_FromStringAndSize(<const char *>(f + WL_ADD_ENTRY_OFFSET),
                                                           length - WL_ADD_ENTRY_OFFSET))
                    _put(rec, 5, version)
                    out.append(rec)
                    pos += 4 + length
                    continue
            deferred.append(len(out))
            out.append((pos + 4, length))
            pos += 4 + length
        return out, pos, (st if st > 0 else 0), deferred
    finally:
        PyBuffer_Release(&view)


def scan_add_responses(buf, Py_ssize_t start, Py_ssize_t max_frame, record=tuple):
    cdef Py_buffer view
    cdef const unsigned char *b
    cdef const unsigned char *f
    cdef Py_ssize_t n, pos, length = 0
    cdef int st = -1
    cdef uint32_t h, version, op
    cdef list out = []
    cdef list deferred = []
    cdef object rec
    _check_record(record)
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
            f = b + pos + 4
            if length == WL_ADD_RESPONSE_BYTES:
                h = _u32(f)
                version = h >> 24
                op = h if version == 0 else (h >> 16) & 0xff
                if version <= WL_MAX_ACCEPTED_VERSION and op == WL_OP_ADD_ENTRY:
                    rec = bk_codec_new_record(record, 3)
                    _put(rec, 0, <int32_t>_u32(f + WL_RESPONSE_RC_OFFSET))
                    _put(rec, 1, _i64(f + WL_RESPONSE_IDS_OFFSET))
                    _put(rec, 2, _i64(f + WL_RESPONSE_IDS_OFFSET + WL_ID_BYTES))
                    out.append(rec)
                    pos += 4 + length
                    continue
            deferred.append(len(out))
            out.append((pos + 4, length))
            pos += 4 + length
        return out, pos, (st if st > 0 else 0), deferred
    finally:
        PyBuffer_Release(&view)


cdef enum:
    _ENTRY_IDS_LAC = WL_ENTRY_LAC_OFFSET + WL_ID_BYTES  # the entry header's ledger id, entry id, LAC


cdef inline bint _as_i64(object o, int64_t *out) except -1:
    """An int fitting signed 64 bits into *out; False (no error left set) otherwise."""
    cdef long long v
    if not PyLong_Check(o):
        return False
    try:
        v = PyLong_AsLongLong(o)
    except OverflowError:
        return False
    out[0] = v
    return True


cdef bint _plain_add(object req, int64_t *v, PyObject **key) except -1:
    """scan_add_run's test; sets v = [flags & recovery, ledger id, lac] and *key."""
    cdef object body
    cdef const unsigned char *p
    cdef int64_t flags, entry_id
    if not isinstance(req, tuple) or PyTuple_GET_SIZE(req) < 5:
        return False
    body = <object>PyTuple_GET_ITEM(req, 4)
    if not PyBytes_CheckExact(body) or PyBytes_GET_SIZE(body) < _ENTRY_IDS_LAC:
        return False
    if not PyBytes_CheckExact(<object>PyTuple_GET_ITEM(req, 1)):
        return False
    if not (_as_i64(<object>PyTuple_GET_ITEM(req, 0), &flags) and _as_i64(<object>PyTuple_GET_ITEM(req, 2), &v[1])
            and _as_i64(<object>PyTuple_GET_ITEM(req, 3), &entry_id)):
        return False
    p = <const unsigned char *>PyBytes_AS_STRING(body)
    if entry_id < 0 or _i64(p) != v[1] or _i64(p + WL_ID_BYTES) != entry_id:
        return False
    v[0] = flags & WL_FLAG_RECOVERY_ADD
    v[2] = _i64(p + WL_ENTRY_LAC_OFFSET)
    key[0] = PyTuple_GET_ITEM(req, 1)
    return True


@cython.boundscheck(True)  # items of unknown shape: an index past the end is an IndexError
def scan_add_run(reqs):
    cdef list items = reqs if type(reqs) is list else list(reqs)
    cdef Py_ssize_t i = 0, start, n = len(items)
    cdef int64_t v[3]
    cdef int64_t recovery, ledger_id, top
    cdef PyObject *key = NULL
    cdef PyObject *seg_key
    cdef list out = []
    while i < n:
        if not _plain_add(items[i], v, &key):
            out.append((i, i + 1, None))
            i += 1
            continue
        start, recovery, ledger_id, seg_key, top = i, v[0], v[1], key, v[2]
        i += 1
        while i < n:
            if (not _plain_add(items[i], v, &key) or v[1] != ledger_id or key != seg_key
                    or v[0] != recovery):
                break
            if v[2] > top:
                top = v[2]
            i += 1
        out.append((start, i, top))
    return out


cdef inline uint32_t _header_word(uint32_t version, uint32_t op, uint32_t flags) noexcept nogil:
    """layout.pack_header for a version already checked to be 0..2."""
    return op if version == 0 else ((version << 24) | (op << 16) | flags)


cdef uint32_t _add_header(int version) except? 0:
    """The v0..v2 ADD response header word."""
    if version < 0 or version > WL_MAX_ACCEPTED_VERSION:
        raise ValueError(f"protocol version {version} is not 0..{WL_MAX_ACCEPTED_VERSION}")
    return _header_word(version, WL_OP_ADD_ENTRY, 0)


cdef inline unsigned char *_put_ack(unsigned char *p, uint32_t header, int32_t rc, int64_t ledger_id,
                                    int64_t entry_id) noexcept nogil:
    """One complete ADD response frame at p; returns the end."""
    cdef unsigned char *f = p + WL_FRAME_LENGTH_BYTES
    _put_u32(p, WL_ADD_RESPONSE_BYTES)
    _put_u32(f, header)
    _put_u32(f + WL_RESPONSE_RC_OFFSET, <uint32_t>rc)
    _put_i64(f + WL_RESPONSE_IDS_OFFSET, ledger_id)
    _put_i64(f + WL_RESPONSE_IDS_OFFSET + WL_ID_BYTES, entry_id)
    return f + WL_ADD_RESPONSE_BYTES


def encode_add_responses(items, int version=2):
    cdef list rows = list(items)
    cdef Py_ssize_t i, n = len(rows)
    cdef int32_t rc
    cdef int64_t ledger_id, entry_id
    cdef uint32_t header
    cdef bytes out
    cdef unsigned char *p
    header = _add_header(version)
    out = PyBytes_FromStringAndSize(NULL, n * (WL_FRAME_LENGTH_BYTES + WL_ADD_RESPONSE_BYTES))
    p = <unsigned char *>PyBytes_AS_STRING(out)
    for i in range(n):
        rc, ledger_id, entry_id = rows[i]
        p = _put_ack(p, header, rc, ledger_id, entry_id)
    return out


@cython.boundscheck(True)
def encode_add_acks(reqs, int32_t rc, int version=2):
    cdef list items = reqs if type(reqs) is list else list(reqs)
    cdef Py_ssize_t i, n = len(items)
    cdef int64_t ledger_id, entry_id
    cdef uint32_t header
    cdef bytes out
    cdef unsigned char *p
    cdef object req
    header = _add_header(version)
    out = PyBytes_FromStringAndSize(NULL, n * (WL_FRAME_LENGTH_BYTES + WL_ADD_RESPONSE_BYTES))
    p = <unsigned char *>PyBytes_AS_STRING(out)
    for i in range(n):
        req = items[i]
        if isinstance(req, tuple) and PyTuple_GET_SIZE(req) >= 4:
            # PyTuple_GET_ITEM: a NamedTuple's generic item lookup goes through Python
            ledger_id = <object>PyTuple_GET_ITEM(req, 2)
            entry_id = <object>PyTuple_GET_ITEM(req, 3)
        else:
            ledger_id = req[2]
            entry_id = req[3]
        p = _put_ack(p, header, rc, ledger_id, entry_id)
    return out


def crc32c(data, unsigned long long crc=0):
    cdef Py_buffer view
    cdef uint32_t out
    if crc > _MAX_U32:
        raise ValueError("crc must fit in 32 bits")
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if view.len >= _NOGIL_MIN_BYTES:
            with nogil:
                out = bk_crc32c_extend(<uint32_t>crc, view.buf, <size_t>view.len)
        else:
            out = bk_crc32c_extend(<uint32_t>crc, view.buf, <size_t>view.len)
        return out
    finally:
        PyBuffer_Release(&view)


def frame_add_crc32c(uint32_t header, bytes master_key, int64_t ledger_id, int64_t entry_id, int64_t lac,
                     int64_t total_length, payload):
    cdef Py_buffer view
    cdef bytes out
    cdef unsigned char *p
    cdef uint32_t crc
    cdef Py_ssize_t body
    cdef unsigned char *f
    cdef unsigned char *e
    if len(master_key) != WL_MASTER_KEY_LENGTH:
        raise ValueError(f"master key must be {WL_MASTER_KEY_LENGTH} bytes")
    PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
    try:
        body = WL_ADD_REQUEST_MIN_BYTES + WL_CRC32C_DIGEST_LENGTH + view.len
        if body > 0x7FFFFFFF:
            raise ValueError("frame too large")
        out = PyBytes_FromStringAndSize(NULL, WL_FRAME_LENGTH_BYTES + body)
        p = <unsigned char *>PyBytes_AS_STRING(out)
        f = p + WL_FRAME_LENGTH_BYTES  # the frame body
        e = f + WL_ADD_ENTRY_OFFSET  # the digest-framed entry
        _put_u32(p, <uint32_t>body)
        _put_u32(f, header)
        memcpy(f + WL_ADD_KEY_OFFSET, PyBytes_AS_STRING(master_key), WL_MASTER_KEY_LENGTH)
        _put_i64(e, ledger_id)
        _put_i64(e + WL_ID_BYTES, entry_id)
        _put_i64(e + 2 * WL_ID_BYTES, lac)
        _put_i64(e + 3 * WL_ID_BYTES, total_length)
        if view.len >= _NOGIL_MIN_BYTES:
            with nogil:
                crc = bk_crc32c_extend(bk_crc32c_extend(0, e, WL_ENTRY_HEADER_LENGTH), view.buf, <size_t>view.len)
                memcpy(e + WL_ENTRY_HEADER_LENGTH + WL_CRC32C_DIGEST_LENGTH, view.buf, <size_t>view.len)
        else:
            crc = bk_crc32c_extend(bk_crc32c_extend(0, e, WL_ENTRY_HEADER_LENGTH), view.buf, <size_t>view.len)
            memcpy(e + WL_ENTRY_HEADER_LENGTH + WL_CRC32C_DIGEST_LENGTH, view.buf, <size_t>view.len)
        _put_u32(e + WL_ENTRY_HEADER_LENGTH, crc)
        return out
    finally:
        PyBuffer_Release(&view)


# ---------------------------------------------------------------- v3 (protobuf) ADD kernels
# The ADD's messages of BookkeeperProtocol.proto, read and written without the protobuf library
# (field numbers: the WL_V3_* names of bk/proto/layout.py). A frame is taken only when it is
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


cdef inline int _varint_size(uint64_t v) noexcept nogil:
    cdef int n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


cdef inline unsigned char *_put_varint(unsigned char *p, uint64_t v) noexcept nogil:
    while v >= 0x80:
        p[0] = (v & 0x7f) | 0x80
        v >>= 7
        p += 1
    p[0] = v
    return p + 1


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


cdef inline unsigned char *_put_v3_header(unsigned char *p, Py_ssize_t header_len, uint64_t txn,
                                          uint64_t priority) noexcept nogil:
    """`header` (field 1) of a v3 ADD Request or Response: version 3, operation ADD, txnId, priority."""
    p = _put_varint(p, _TAG_HEADER)
    p = _put_varint(p, header_len)
    p = _put_varint(p, _TAG_H_VERSION)
    p = _put_varint(p, WL_PROTOCOL_VERSION_V3)
    p = _put_varint(p, _TAG_H_OPERATION)
    p = _put_varint(p, WL_V3_OP_ADD_ENTRY)
    p = _put_varint(p, _TAG_H_TXN)
    p = _put_varint(p, txn)
    if priority:
        p = _put_varint(p, _TAG_H_PRIORITY)
        p = _put_varint(p, priority)
    return p


cdef struct _V3Add:
    uint64_t version, operation, txn, priority, ledger, entry, flag
    const unsigned char *key
    const unsigned char *body
    Py_ssize_t key_len, body_len
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
            pass  # int32: DEFERRED_SYNC and the like; bk makes every add durable
        elif tag == _TAG_A_FLAG and _once(a, _S_FLAG):
            a.flag = v
        else:
            return False
    return ((a.seen & (_S_LEDGER | _S_ENTRY | _S_KEY | _S_BODY)) == (_S_LEDGER | _S_ENTRY | _S_KEY | _S_BODY)
            and (not a.seen & _S_FLAG or a.flag == WL_V3_ADD_FLAG_RECOVERY_ADD)
            and <int64_t>a.ledger >= 0 and <int64_t>a.entry >= 0 and a.key_len == WL_MASTER_KEY_LENGTH)


cdef bint _parse_v3_add_request(const unsigned char *f, Py_ssize_t n, _V3Add *a) noexcept nogil:
    """A plain v3 ADD Request (see above) into *a."""
    cdef Py_ssize_t pos = 0, k
    cdef uint64_t tag, ln
    a.seen = 0
    a.priority = 0
    a.flag = 0
    while pos < n:
        if not _get_pair(f, n, &pos, &tag, &ln) or (tag != _TAG_HEADER and tag != _TAG_ADD):
            return False
        if ln > <uint64_t>(n - pos):
            return False
        if tag == _TAG_HEADER:
            if not _once(a, _S_HEADER) or not _parse_header(f + pos, <Py_ssize_t>ln, a):
                return False
        elif not _once(a, _S_ADD) or not _parse_add(f + pos, <Py_ssize_t>ln, a):
            return False
        pos += <Py_ssize_t>ln
    return (a.seen & (_S_HEADER | _S_ADD)) == (_S_HEADER | _S_ADD) and a.operation == WL_V3_OP_ADD_ENTRY


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
        p = _put_v3_header(p + 4, hl, v[2], v[3])
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


cdef bint _parse_v3_add_response(const unsigned char *f, Py_ssize_t n, _V3Add *a,
                                 uint64_t *status) noexcept nogil:
    """A plain v3 ADD Response: header (op ADD), status, addResponse {status, ledgerId, entryId};
    a.flag carries the addResponse's status."""
    cdef Py_ssize_t pos = 0, k, sub_end
    cdef uint64_t tag, v
    a.seen = 0
    a.priority = 0
    while pos < n:
        if not _get_pair(f, n, &pos, &tag, &v):
            return False
        if tag == _TAG_STATUS and _once(a, _S_STATUS):
            status[0] = v
            continue
        if tag != _TAG_HEADER and tag != _TAG_ADD or v > <uint64_t>(n - pos):
            return False
        if tag == _TAG_HEADER:
            if not _once(a, _S_HEADER) or not _parse_header(f + pos, <Py_ssize_t>v, a):
                return False
            pos += <Py_ssize_t>v
            continue
        if not _once(a, _S_ADD):
            return False
        sub_end = pos + <Py_ssize_t>v
        while pos < sub_end:
            if not _get_pair(f, sub_end, &pos, &tag, &v):
                return False
            if tag == _TAG_R_STATUS and _once(a, _S_FLAG):
                a.flag = v
            elif tag == _TAG_R_LEDGER and _once(a, _S_LEDGER):
                a.ledger = v
            elif tag == _TAG_R_ENTRY and _once(a, _S_ENTRY):
                a.entry = v
            else:
                return False
    return ((a.seen & (_S_HEADER | _S_STATUS | _S_ADD | _S_FLAG | _S_LEDGER | _S_ENTRY))
            == (_S_HEADER | _S_STATUS | _S_ADD | _S_FLAG | _S_LEDGER | _S_ENTRY)
            and a.operation == WL_V3_OP_ADD_ENTRY)


cdef _scan_v3(buf, Py_ssize_t start, Py_ssize_t max_frame, record, dict status_map):
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
                if _parse_v3_add_request(b + pos + 4, length, &a):
                    if key is None or memcmp(PyBytes_AS_STRING(key), a.key, WL_MASTER_KEY_LENGTH) != 0:
                        key = PyBytes_FromStringAndSize(<const char *>a.key, WL_MASTER_KEY_LENGTH)
                    rec = bk_codec_new_record(record, 8)
                    _put(rec, 0, WL_FLAG_RECOVERY_ADD if a.seen & _S_FLAG else 0)
                    _put(rec, 1, key)
                    _put(rec, 2, <int64_t>a.ledger)
                    _put(rec, 3, <int64_t>a.entry)
                    _put(rec, 4, PyBytes_FromStringAndSize(<const char *>a.body, a.body_len))
                    _put(rec, 5, WL_PROTOCOL_VERSION_V3)
                    _put(rec, 6, a.txn)
                    _put(rec, 7, a.priority)
            elif _parse_v3_add_response(b + pos + 4, length, &a, &status):
                # the common answer, EOK (0) twice, without two dict lookups
                rc = eok if status == 0 and a.flag == 0 else (
                    status_map.get(a.flag) if status in status_map else None)
                if rc is not None:
                    rec = bk_codec_new_record(record, 3)
                    _put(rec, 0, rc)
                    _put(rec, 1, <int64_t>a.ledger)
                    _put(rec, 2, <int64_t>a.entry)
            if rec is None:
                deferred.append(len(out))
                rec = (pos + 4, length)
            out.append(rec)
            pos += 4 + length
        return out, pos, (st if st > 0 else 0), deferred
    finally:
        PyBuffer_Release(&view)


def scan_v3_add_requests(buf, Py_ssize_t start, Py_ssize_t max_frame, record=tuple):
    return _scan_v3(buf, start, max_frame, record, None)


def scan_v3_add_responses(buf, Py_ssize_t start, Py_ssize_t max_frame, dict status_map, record=tuple):
    if status_map is None:
        raise TypeError("status_map must be a dict of v3 status -> v2 code")
    return _scan_v3(buf, start, max_frame, record, status_map)


def v3_add_request_from_v2(frame, uint64_t txn_id):
    """The v3 ADD Request frame asking what the v2 ADD request `frame` (length prefix included)
    asks, with `txn_id`; None when `frame` is not a plain v2 ADD (version 1..2, ids >= 0)."""
    cdef Py_buffer view
    cdef const unsigned char *f
    cdef Py_ssize_t n, body_len, hl, al, size
    cdef uint32_t h
    cdef int64_t ledger_id, entry_id
    cdef bint recovery
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
        body_len = n - WL_ADD_ENTRY_OFFSET
        hl = 2 + 2 + 1 + _varint_size(txn_id)
        al = (1 + _varint_size(<uint64_t>ledger_id) + 1 + _varint_size(<uint64_t>entry_id)
              + 2 + WL_MASTER_KEY_LENGTH + 1 + _varint_size(body_len) + body_len + (3 if recovery else 0))
        size = 1 + _varint_size(hl) + hl + 2 + _varint_size(al) + al
        out = PyBytes_FromStringAndSize(NULL, 4 + size)
        p = <unsigned char *>PyBytes_AS_STRING(out)
        _put_u32(p, <uint32_t>size)
        p = _put_v3_header(p + 4, hl, txn_id, 0)
        p = _put_varint(p, _TAG_ADD)
        p = _put_varint(p, al)
        p = _put_varint(p, _TAG_A_LEDGER)
        p = _put_varint(p, <uint64_t>ledger_id)
        p = _put_varint(p, _TAG_A_ENTRY)
        p = _put_varint(p, <uint64_t>entry_id)
        p = _put_varint(p, _TAG_A_KEY)
        p = _put_varint(p, WL_MASTER_KEY_LENGTH)
        memcpy(p, f + WL_ADD_KEY_OFFSET, WL_MASTER_KEY_LENGTH)
        p += WL_MASTER_KEY_LENGTH
        p = _put_varint(p, _TAG_A_BODY)
        p = _put_varint(p, body_len)
        memcpy(p, f + WL_ADD_ENTRY_OFFSET, body_len)
        p += body_len
        if recovery:
            p = _put_varint(p, _TAG_A_FLAG)
            p = _put_varint(p, WL_V3_ADD_FLAG_RECOVERY_ADD)
        return out
    finally:
        PyBuffer_Release(&view)
