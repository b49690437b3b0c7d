# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Wire codec byte kernel (native): v2 framing and the ADD hot path.

A frame is `length i32 BE | body`; a v2 body starts with the header int
`(version << 24) | (op << 16) | flags` (version 0: the whole int is the op).
Pure twin: bk/_native/codec_py.py (same functions, same results). The v3 (protobuf) ADD
kernels are _codec_v3.pyx; both include codec_base.pxi (shared helpers) and the generated
formats.pxi (every size, offset, op code and flag, from bk/formats/wire.py).

split_frames(buf, start, max_frame) -> (list[(body_offset, body_len)], end, err)
    Every complete frame from `start` on. `end` is the offset of the first byte
    not consumed (a partial frame, or the bad length prefix when err != 0).
    err 0: fine; 1: negative length at `end`; 2: length > max_frame at `end`.
    A bad length is reported as soon as its 4 bytes are present: the body is
    never waited for nor allocated.
scan_add_requests(buf, start, max_frame, record=tuple, read_record=None) -> (items, end, err, deferred)
    Like split_frames, but a well-formed ADD request (version 0..2, op ADD,
    body >= 56 bytes, ledger id >= 0, entry id >= 0) comes back decoded as a
    `record` of `(flags, master_key, ledger_id, entry_id, entry_bytes, version)`;
    any other frame as a plain `(body_offset, body_len)` tuple, and `deferred`
    lists the indexes of those in `items` (the caller's slow path). Equal
    master keys in one call share one bytes object. With `read_record` (a
    ReadRequest-shaped NamedTuple) a plain READ (version 0..2, 20 bytes, no
    fencing flag, ledger id >= 0, entry id >= -1) comes back as
    `(flags, ledger_id, entry_id, None, version)`: what codec.decode_request
    gives for it (the single READs of a client's readEntries, bk.server.single_reads).
scan_add_responses(buf, start, max_frame, record=tuple, read_record=None) -> (items, end, err, deferred)
    A 24-byte ADD response (version 0..2) comes back as a `record` of
    `(rc, ledger_id, entry_id)`; any other frame as in scan_add_requests. With
    `read_record` (a ReadResponse-shaped NamedTuple) a READ response (version 0..2)
    comes back as `(rc, ledger_id, entry_id, body)`: rc EOK with the entry as a
    memoryview of `buf` (as codec.decode_response gives it for a view: not copied),
    another rc with no body bytes and body None; a READ error answer with trailing
    bytes is deferred (the slow path's error).
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
crc32c_entry_ids(data) -> (ledger_id, entry_id, lac, length) | None
    The entry header's four ids of a CRC32C-digested entry (`header(32) | crc32c u32 BE |
    payload`) whose digest matches, else None (shorter than 36 bytes, or another digest): a
    reader's check of one entry in one call (DigestManager.unpack_entry keeps the errors).
frame_add_crc32c(header, master_key, ledger_id, entry_id, lac, total_length, payload) -> bytes
    The client's whole ADD request frame in one allocation: `length | header |
    master_key(20) | ledger entry lac total_length (i64 BE) | crc32c | payload`,
    the CRC32C digest (u32 BE) taken over the 32-byte entry header then the
    payload, as DigestManager's CRC32C digest.
"""
include "codec_base.pxi"

cdef extern from "crc32c.h" nogil:
    void bk_crc32c_init()
    uint32_t bk_crc32c_extend(uint32_t crc, const void *data, size_t length)

bk_crc32c_init()

ERR_OK = 0
ERR_NEGATIVE_LENGTH = 1
ERR_FRAME_TOO_LARGE = 2

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


def scan_add_requests(buf, Py_ssize_t start, Py_ssize_t max_frame, record=tuple, read_record=None):
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
            if length >= WL_ADD_REQUEST_MIN_BYTES or (length == WL_READ_REQUEST_BYTES and read_record is not None):
                h = _u32(f)
                version = h >> 24  # layout.split_header
                if version == 0:
                    op, flags = h, 0
                else:
                    op, flags = (h >> 16) & 0xff, h & 0xffff
                if length >= WL_ADD_REQUEST_MIN_BYTES:
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
                else:  # a READ's 20 bytes: header, ledger id, entry id
                    ledger_id = _i64(f + WL_PACKET_HEADER_BYTES)
                    entry_id = _i64(f + WL_PACKET_HEADER_BYTES + WL_ID_BYTES)
                    if (version <= WL_MAX_ACCEPTED_VERSION and op == WL_OP_READ_ENTRY
                            and not flags & WL_FLAG_DO_FENCING and ledger_id >= 0 and entry_id >= -1):
                        rec = bk_codec_new_record(read_record, 5)
                        _put(rec, 0, flags)
                        _put(rec, 1, ledger_id)
                        _put(rec, 2, entry_id)
                        _put(rec, 3, None)
                        _put(rec, 4, version)
                        out.append(rec)
                        pos += 4 + length
                        continue
            deferred.append(len(out))
            out.append((pos + 4, length))
            pos += 4 + length
        return out, pos, (st if st > 0 else 0), deferred
    finally:
        PyBuffer_Release(&view)


def scan_add_responses(buf, Py_ssize_t start, Py_ssize_t max_frame, record=tuple, read_record=None):
    cdef Py_buffer view
    cdef const unsigned char *b
    cdef const unsigned char *f
    cdef Py_ssize_t n, pos, length = 0
    cdef int st = -1
    cdef uint32_t h, version, op
    cdef int32_t rc
    cdef list out = []
    cdef list deferred = []
    cdef object rec
    cdef object mv = None
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
            f = b + pos + 4
            if length >= WL_ADD_RESPONSE_BYTES:  # == WL_READ_RESPONSE_HEADER_BYTES: header rc ids
                h = _u32(f)
                version = h >> 24
                op = h if version == 0 else (h >> 16) & 0xff
                rc = <int32_t>_u32(f + WL_RESPONSE_RC_OFFSET)
                if version > WL_MAX_ACCEPTED_VERSION:
                    pass
                elif op == WL_OP_ADD_ENTRY and length == WL_ADD_RESPONSE_BYTES:
                    rec = bk_codec_new_record(record, 3)
                    _put(rec, 0, rc)
                    _put(rec, 1, _i64(f + WL_RESPONSE_IDS_OFFSET))
                    _put(rec, 2, _i64(f + WL_RESPONSE_IDS_OFFSET + WL_ID_BYTES))
                    out.append(rec)
                    pos += 4 + length
                    continue
                elif op == WL_OP_READ_ENTRY and read_record is not None and (
                        rc == 0 or length == WL_READ_RESPONSE_HEADER_BYTES):
                    rec = bk_codec_new_record(read_record, 4)
                    _put(rec, 0, rc)
                    _put(rec, 1, _i64(f + WL_RESPONSE_IDS_OFFSET))
                    _put(rec, 2, _i64(f + WL_RESPONSE_IDS_OFFSET + WL_ID_BYTES))
                    if rc != 0:
                        _put(rec, 3, None)
                    else:
                        if mv is None:
                            mv = memoryview(buf).cast("B")
                        _put(rec, 3, mv[pos + 4 + WL_READ_RESPONSE_HEADER_BYTES:pos + 4 + length])
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


def crc32c_entry_ids(data):
    cdef Py_buffer view
    cdef const unsigned char *p
    cdef uint32_t crc
    cdef Py_ssize_t body_len
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if view.len < WL_ENTRY_HEADER_LENGTH + WL_CRC32C_DIGEST_LENGTH:
            return None
        p = <const unsigned char *>view.buf
        body_len = view.len - WL_ENTRY_HEADER_LENGTH - WL_CRC32C_DIGEST_LENGTH
        crc = bk_crc32c_extend(0, p, WL_ENTRY_HEADER_LENGTH)
        if body_len >= _NOGIL_MIN_BYTES:
            with nogil:
                crc = bk_crc32c_extend(crc, p + WL_ENTRY_HEADER_LENGTH + WL_CRC32C_DIGEST_LENGTH, <size_t>body_len)
        else:
            crc = bk_crc32c_extend(crc, p + WL_ENTRY_HEADER_LENGTH + WL_CRC32C_DIGEST_LENGTH, <size_t>body_len)
        if crc != _u32(p + WL_ENTRY_HEADER_LENGTH):
            return None
        return (_i64(p), _i64(p + WL_ID_BYTES), _i64(p + 2 * WL_ID_BYTES), _i64(p + 3 * WL_ID_BYTES))
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
