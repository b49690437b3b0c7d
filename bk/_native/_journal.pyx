# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Journal byte kernel (native): record framing and validation.

A journal record is `length u32 BE | crc32c(seed, body) u32 BE | body`: format 1
files use seed 0, format 2 files a seed made from the file id (records.py), so a
record left in a recycled file from its previous life fails its CRC. Every
function takes `seed` (default 0). Pure twin: bk/_native/journal_py.py (same
functions, same results). The record head's size and the scan statuses are the JN_
names of the generated formats.pxi (bk/formats/journal.py).

frame_records(bodies) -> bytes
    One buffer with every body framed, in order. Pointers and lengths are
    gathered with the GIL held (references pinned by a private tuple, non-bytes
    bodies pinned by their buffer export); the copy + CRC runs without the GIL
    when the group is large enough for that to pay off.
frame_headers(bodies) -> bytes
    Only the 8-byte `length | crc32c` header of every body, back to back (8 * n
    bytes): for big records the caller writes header and body as separate
    buffers (pwritev) instead of copying every body into one frame. The CRCs
    run without the GIL when the bodies are large enough.
scan_records(buf, start, end, max_record_bytes) -> (list[(body_offset, body_len)], stop, status)
    status 0: records end exactly at `end` (stop == end); 1: short/truncated
    record at `stop`; 2: length 0 or > max_record_bytes at `stop`; 3: CRC
    mismatch at `stop`.
find_valid_record(buf, start, end, max_record_bytes) -> int
    The first offset >= start where a whole valid record lies within `end`, or -1.
crc32c(data, crc=0) -> int
    google_crc32c.extend(crc, data) semantics.
"""
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_CheckExact
from cpython.tuple cimport PyTuple_GET_SIZE, PyTuple_GET_ITEM
from cpython.ref cimport PyObject
from libc.stdlib cimport malloc, free, realloc
from libc.string cimport memcpy
from libc.stdint cimport uint32_t, uint64_t

cdef extern from "crc32c.h" nogil:
    void bk_crc32c_init()
    uint32_t bk_crc32c_extend(uint32_t crc, const void *data, size_t length)
    uint32_t bk_crc32c_extend_sw(uint32_t crc, const void *data, size_t length)

bk_crc32c_init()

include "formats.pxi"

STATUS_CLEAN = JN_JOURNAL_SCAN_CLEAN
STATUS_SHORT = JN_JOURNAL_SCAN_SHORT
STATUS_BAD_LENGTH = JN_JOURNAL_SCAN_BAD_LENGTH
STATUS_BAD_CRC = JN_JOURNAL_SCAN_BAD_CRC

# Below this many payload bytes the GIL round trip costs more than it frees.
cdef Py_ssize_t _NOGIL_MIN_BYTES = 64 * 1024
cdef uint64_t _MAX_U32 = 0xFFFFFFFF


cdef inline void _put_u32(char *p, uint32_t v) noexcept nogil:
    p[0] = <char>((v >> 24) & 0xff)
    p[1] = <char>((v >> 16) & 0xff)
    p[2] = <char>((v >> 8) & 0xff)
    p[3] = <char>(v & 0xff)


cdef inline uint32_t _get_u32(const unsigned char *p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3]


cdef void _frame_into(char *out, const char **ptrs, Py_ssize_t *lens, Py_ssize_t n, uint32_t seed) noexcept nogil:
    cdef Py_ssize_t i, ln
    cdef char *p = out
    for i in range(n):
        ln = lens[i]
        _put_u32(p, <uint32_t>ln)
        _put_u32(p + 4, bk_crc32c_extend(seed, ptrs[i], <size_t>ln))
        memcpy(p + JN_JOURNAL_RECORD_HEAD_BYTES, ptrs[i], <size_t>ln)
        p += JN_JOURNAL_RECORD_HEAD_BYTES + ln


def frame_records(bodies, unsigned long long seed=0):
    """Frame every body (bytes-like) as `length | crc32c(seed, body) | body`, back to back."""
    cdef tuple items = tuple(bodies)  # pins every body for the GIL-free copy
    cdef Py_ssize_t n = PyTuple_GET_SIZE(items)
    cdef Py_ssize_t i, total = 0, ln, nviews = 0
    cdef object item
    cdef const char **ptrs = NULL
    cdef Py_ssize_t *lens = NULL
    cdef Py_buffer *views = NULL
    cdef bytes out
    cdef char *dst
    if seed > _MAX_U32:
        raise ValueError("seed must fit in 32 bits")
    if n == 0:
        return b""
    ptrs = <const char **>malloc(n * sizeof(char *))
    lens = <Py_ssize_t *>malloc(n * sizeof(Py_ssize_t))
    if ptrs == NULL or lens == NULL:
        free(ptrs)
        free(lens)
        raise MemoryError()
    try:
        for i in range(n):
            item = <object>PyTuple_GET_ITEM(items, i)
            if PyBytes_CheckExact(item):
                ptrs[i] = PyBytes_AS_STRING(item)
                ln = PyBytes_GET_SIZE(item)
            else:
                if views == NULL:
                    views = <Py_buffer *>malloc(n * sizeof(Py_buffer))
                    if views == NULL:
                        raise MemoryError()
                PyObject_GetBuffer(item, &views[nviews], PyBUF_SIMPLE)
                nviews += 1
                ptrs[i] = <const char *>views[nviews - 1].buf
                ln = views[nviews - 1].len
            if <uint64_t>ln > _MAX_U32:
                raise ValueError(f"journal record body {i} is {ln} bytes; the length field is 32 bits")
            lens[i] = ln
            total += JN_JOURNAL_RECORD_HEAD_BYTES + ln
        out = PyBytes_FromStringAndSize(NULL, total)
        dst = PyBytes_AS_STRING(out)
        if total >= _NOGIL_MIN_BYTES:
            with nogil:
                _frame_into(dst, ptrs, lens, n, <uint32_t>seed)
        else:
            _frame_into(dst, ptrs, lens, n, <uint32_t>seed)
        return out
    finally:
        for i in range(nviews):
            PyBuffer_Release(&views[i])
        free(views)
        free(ptrs)
        free(lens)


cdef void _headers_into(char *out, const char **ptrs, Py_ssize_t *lens, Py_ssize_t n, uint32_t seed) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        _put_u32(out + JN_JOURNAL_RECORD_HEAD_BYTES * i, <uint32_t>lens[i])
        _put_u32(out + JN_JOURNAL_RECORD_HEAD_BYTES * i + 4, bk_crc32c_extend(seed, ptrs[i], <size_t>lens[i]))


def frame_headers(bodies, unsigned long long seed=0):
    """The `length | crc32c(seed, body)` header of every body (bytes-like), back to back."""
    cdef tuple items = tuple(bodies)  # pins every body for the GIL-free CRCs
    cdef Py_ssize_t n = PyTuple_GET_SIZE(items)
    cdef Py_ssize_t i, total = 0, ln, nviews = 0
    cdef object item
    cdef const char **ptrs = NULL
    cdef Py_ssize_t *lens = NULL
    cdef Py_buffer *views = NULL
    cdef bytes out
    cdef char *dst
    if seed > _MAX_U32:
        raise ValueError("seed must fit in 32 bits")
    if n == 0:
        return b""
    ptrs = <const char **>malloc(n * sizeof(char *))
    lens = <Py_ssize_t *>malloc(n * sizeof(Py_ssize_t))
    if ptrs == NULL or lens == NULL:
        free(ptrs)
        free(lens)
        raise MemoryError()
    try:
        for i in range(n):
            item = <object>PyTuple_GET_ITEM(items, i)
            if PyBytes_CheckExact(item):
                ptrs[i] = PyBytes_AS_STRING(item)
                ln = PyBytes_GET_SIZE(item)
            else:
                if views == NULL:
                    views = <Py_buffer *>malloc(n * sizeof(Py_buffer))
                    if views == NULL:
                        raise MemoryError()
                PyObject_GetBuffer(item, &views[nviews], PyBUF_SIMPLE)
                nviews += 1
                ptrs[i] = <const char *>views[nviews - 1].buf
                ln = views[nviews - 1].len
            if <uint64_t>ln > _MAX_U32:
                raise ValueError(f"journal record body {i} is {ln} bytes; the length field is 32 bits")
            lens[i] = ln
            total += ln
        out = PyBytes_FromStringAndSize(NULL, JN_JOURNAL_RECORD_HEAD_BYTES * n)
        dst = PyBytes_AS_STRING(out)
        if total >= _NOGIL_MIN_BYTES:
            with nogil:
                _headers_into(dst, ptrs, lens, n, <uint32_t>seed)
        else:
            _headers_into(dst, ptrs, lens, n, <uint32_t>seed)
        return out
    finally:
        for i in range(nviews):
            PyBuffer_Release(&views[i])
        free(views)
        free(ptrs)
        free(lens)


cdef inline int _check_one(const unsigned char *b, Py_ssize_t pos, Py_ssize_t end,
                           uint64_t max_len, Py_ssize_t *body_len, uint32_t seed) noexcept nogil:
    """Status of the record at `pos` (JN_JOURNAL_SCAN_CLEAN = valid); sets body_len when the length is sane."""
    cdef uint32_t ln, crc
    if end - pos < JN_JOURNAL_RECORD_HEAD_BYTES:
        return JN_JOURNAL_SCAN_SHORT
    ln = _get_u32(b + pos)
    if ln == 0 or <uint64_t>ln > max_len:
        return JN_JOURNAL_SCAN_BAD_LENGTH
    if <uint64_t>(end - pos - JN_JOURNAL_RECORD_HEAD_BYTES) < <uint64_t>ln:
        return JN_JOURNAL_SCAN_SHORT
    crc = _get_u32(b + pos + 4)
    if bk_crc32c_extend(seed, b + pos + JN_JOURNAL_RECORD_HEAD_BYTES, ln) != crc:
        return JN_JOURNAL_SCAN_BAD_CRC
    body_len[0] = ln
    return JN_JOURNAL_SCAN_CLEAN


cdef void _check_range(Py_ssize_t size, Py_ssize_t start, Py_ssize_t end, Py_ssize_t max_record_bytes,
                       unsigned long long seed) except *:
    if seed > _MAX_U32:
        raise ValueError("seed must fit in 32 bits")
    if start < 0 or end < start or end > size:
        raise ValueError(f"bad scan range [{start}, {end}) for a buffer of {size} bytes")
    if max_record_bytes <= 0:
        raise ValueError("max_record_bytes must be positive")


def scan_records(buf, Py_ssize_t start, Py_ssize_t end, Py_ssize_t max_record_bytes,
                 unsigned long long seed=0):
    """Validate records in buf[start:end]; see the module docstring for the result."""
    cdef Py_buffer view
    cdef Py_ssize_t pos, body_len = 0, count = 0, cap = 0, k
    cdef Py_ssize_t *found = NULL
    cdef Py_ssize_t *grown
    cdef int status = 0
    cdef const unsigned char *b
    cdef uint64_t max_len = <uint64_t>max_record_bytes
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        _check_range(view.len, start, end, max_record_bytes, seed)
        b = <const unsigned char *>view.buf
        pos = start
        with nogil:
            while pos < end:
                status = _check_one(b, pos, end, max_len, &body_len, <uint32_t>seed)
                if status != JN_JOURNAL_SCAN_CLEAN:
                    break
                if count == cap:
                    cap = cap * 2 if cap else 256
                    grown = <Py_ssize_t *>realloc(found, cap * 2 * sizeof(Py_ssize_t))
                    if grown == NULL:
                        status = -1
                        break
                    found = grown
                found[2 * count] = pos + JN_JOURNAL_RECORD_HEAD_BYTES
                found[2 * count + 1] = body_len
                count += 1
                pos += JN_JOURNAL_RECORD_HEAD_BYTES + body_len
        if status == -1:
            raise MemoryError()
        records = [(found[2 * k], found[2 * k + 1]) for k in range(count)]
        return records, pos, status
    finally:
        free(found)
        PyBuffer_Release(&view)


def find_valid_record(buf, Py_ssize_t start, Py_ssize_t end, Py_ssize_t max_record_bytes,
                      unsigned long long seed=0):
    """First offset in [start, end) holding a whole valid record, or -1."""
    cdef Py_buffer view
    cdef Py_ssize_t pos, body_len = 0, hit = -1
    cdef const unsigned char *b
    cdef uint64_t max_len = <uint64_t>max_record_bytes
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        _check_range(view.len, start, end, max_record_bytes, seed)
        b = <const unsigned char *>view.buf
        with nogil:
            pos = start
            while pos + JN_JOURNAL_RECORD_HEAD_BYTES < end:
                if _check_one(b, pos, end, max_len, &body_len, <uint32_t>seed) == JN_JOURNAL_SCAN_CLEAN:
                    hit = pos
                    break
                pos += 1
        return hit
    finally:
        PyBuffer_Release(&view)


def crc32c(data, unsigned long long crc=0):
    """CRC32C of `data` continuing from `crc` (google_crc32c.extend semantics)."""
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


def crc32c_table(data, unsigned long long crc=0):
    """Same as crc32c but always the slicing-by-8 table path (tests compare both)."""
    cdef Py_buffer view
    if crc > _MAX_U32:
        raise ValueError("crc must fit in 32 bits")
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        return bk_crc32c_extend_sw(<uint32_t>crc, view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)
