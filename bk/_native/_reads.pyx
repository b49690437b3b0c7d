# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The answers to a run of single READs (native). Pure twin: bk/_native/reads_py.py (the API
and the layouts are described there). The codec kernels' helpers (varints, big-endian ints,
buffers) come from codec_base.pxi.

read_answers(rows, header) -> bytes                    v2 READ answers, rc EOK, one buffer
v3_read_answers(rows) -> bytes                         v3 READ Responses, EOK, one buffer
v3_read_head(header, ledger_id, entry_id, entry_len)   a v3 READ Response up to its body
"""
include "codec_base.pxi"

cdef enum:
    _RESPONSE_FIXED = 4 + 4 + 16  # header rc ledger_id entry_id (READ_RESPONSE_HEADER_BYTES)
    _TAG_HEADER = (WL_V3_FIELD_HEADER << 3) | WL_V3_WIRE_LEN  # Response.header
    _TAG_STATUS = (WL_V3_FIELD_STATUS << 3) | WL_V3_WIRE_VARINT  # Response.status
    _TAG_READ = (100 << 3) | WL_V3_WIRE_LEN  # Response.readResponse
    _TAG_R_STATUS = (1 << 3) | WL_V3_WIRE_VARINT  # ReadResponse.status, .ledgerId, .entryId, .body
    _TAG_R_LEDGER = (2 << 3) | WL_V3_WIRE_VARINT
    _TAG_R_ENTRY = (3 << 3) | WL_V3_WIRE_VARINT
    _TAG_R_BODY = (4 << 3) | WL_V3_WIRE_LEN


cdef inline unsigned char *_put_be32(unsigned char *p, uint32_t v) noexcept nogil:
    _put_u32(p, v)
    return p + 4


cdef Py_ssize_t _v3_sizes(Py_ssize_t header_len, uint64_t ledger, uint64_t entry, Py_ssize_t entry_len,
                          Py_ssize_t *read_len) noexcept:
    """The Response's size (without the frame's length) and its readResponse's in *read_len."""
    cdef Py_ssize_t r = 2 + 1 + _varint_size(ledger) + 1 + _varint_size(entry) + 1 + _varint_size(entry_len) \
        + entry_len
    read_len[0] = r
    return 1 + _varint_size(header_len) + header_len + 2 + 2 + _varint_size(r) + r


cdef unsigned char *_put_v3_head(unsigned char *p, const unsigned char *header, Py_ssize_t header_len,
                                 uint64_t ledger, uint64_t entry, Py_ssize_t entry_len) noexcept:
    cdef Py_ssize_t read_len
    cdef Py_ssize_t size = _v3_sizes(header_len, ledger, entry, entry_len, &read_len)
    p = _put_be32(p, <uint32_t>size)
    p[0] = _TAG_HEADER
    p = _put_varint(p + 1, header_len)
    memcpy(p, header, header_len)
    p += header_len
    p[0] = _TAG_STATUS
    p[1] = 0
    p = _put_varint(p + 2, _TAG_READ)
    p = _put_varint(p, read_len)
    p[0] = _TAG_R_STATUS
    p[1] = 0
    p[2] = _TAG_R_LEDGER
    p = _put_varint(p + 3, ledger)
    p[0] = _TAG_R_ENTRY
    p = _put_varint(p + 1, entry)
    p[0] = _TAG_R_BODY
    return _put_varint(p + 1, entry_len)


def v3_read_head(bytes header, int64_t ledger_id, int64_t entry_id, Py_ssize_t entry_len):
    cdef Py_ssize_t read_len, hl = PyBytes_GET_SIZE(header)
    cdef Py_ssize_t size = _v3_sizes(hl, <uint64_t>ledger_id, <uint64_t>entry_id, entry_len, &read_len)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 4 + size - entry_len)
    _put_v3_head(<unsigned char *>PyBytes_AS_STRING(out), <const unsigned char *>PyBytes_AS_STRING(header), hl,
                 <uint64_t>ledger_id, <uint64_t>entry_id, entry_len)
    return out


def v3_read_answers(rows):
    cdef list items = rows if type(rows) is list else list(rows)
    cdef Py_ssize_t i, n = len(items), total = 0, read_len
    cdef int64_t ledger, entry
    cdef bytes header, out
    cdef unsigned char *p
    cdef Py_buffer view
    for i in range(n):  # sizes first: one allocation for the run
        header, ledger, entry = items[i][0], items[i][1], items[i][2]
        total += 4 + _v3_sizes(PyBytes_GET_SIZE(header), <uint64_t>ledger, <uint64_t>entry, len(items[i][3]),
                               &read_len)
    out = PyBytes_FromStringAndSize(NULL, total)
    p = <unsigned char *>PyBytes_AS_STRING(out)
    for i in range(n):
        header, ledger, entry = items[i][0], items[i][1], items[i][2]
        PyObject_GetBuffer(items[i][3], &view, PyBUF_SIMPLE)
        try:
            p = _put_v3_head(p, <const unsigned char *>PyBytes_AS_STRING(header), PyBytes_GET_SIZE(header),
                             <uint64_t>ledger, <uint64_t>entry, view.len)
            memcpy(p, view.buf, view.len)
            p += view.len
        finally:
            PyBuffer_Release(&view)
    return out


def read_answers(rows, uint32_t header):
    cdef list items = rows if type(rows) is list else list(rows)
    cdef Py_ssize_t i, n = len(items), total = 0
    cdef int64_t ledger, entry
    cdef bytes out
    cdef unsigned char *p
    cdef Py_buffer view
    for i in range(n):
        ledger, entry = items[i][0], items[i][1]  # OverflowError before anything is written
        total += 4 + _RESPONSE_FIXED + len(items[i][2])
    out = PyBytes_FromStringAndSize(NULL, total)
    p = <unsigned char *>PyBytes_AS_STRING(out)
    for i in range(n):
        ledger, entry = items[i][0], items[i][1]
        PyObject_GetBuffer(items[i][2], &view, PyBUF_SIMPLE)
        try:
            p = _put_be32(p, <uint32_t>(_RESPONSE_FIXED + view.len))
            p = _put_be32(p, header)
            p = _put_be32(p, 0)
            _put_i64(p, ledger)
            _put_i64(p + 8, entry)
            p += 16
            memcpy(p, view.buf, view.len)
            p += view.len
        finally:
            PyBuffer_Release(&view)
    return out
