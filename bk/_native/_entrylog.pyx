# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Entry-log byte kernel (native). Same API and results as entrylog_py.py,
which documents the contract; the pure twin is the reference.

frame_entries(entries, base_offset) -> (frame, offsets)
scan_log(buf, start, end, max_entry_bytes) -> (records, stop_offset, status)
"""
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE, PyBUF_C_CONTIGUOUS
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_CheckExact
from cpython.list cimport PyList_GET_SIZE, PyList_GET_ITEM
from libc.stdint cimport uint8_t, uint32_t, int64_t, uint64_t
from libc.string cimport memcpy

SCAN_CLEAN = 0
SCAN_TRUNCATED = 1
SCAN_BAD_SIZE = 2
MIN_ENTRY_BYTES = 16

cdef enum:
    _MIN_ENTRY = 16


cdef inline uint32_t _get_u32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3]


cdef inline int64_t _get_i64(const uint8_t* p) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(8):
        v = (v << 8) | p[i]
    return <int64_t>v


cdef inline void _put_u32(uint8_t* p, uint32_t v) noexcept nogil:
    p[0] = <uint8_t>(v >> 24)
    p[1] = <uint8_t>(v >> 16)
    p[2] = <uint8_t>(v >> 8)
    p[3] = <uint8_t>v


def frame_entries(list entries, base_offset):
    cdef Py_ssize_t n = PyList_GET_SIZE(entries)
    cdef Py_ssize_t i
    cdef Py_ssize_t total = 0
    cdef Py_ssize_t size
    cdef object e
    cdef Py_buffer pybuf
    # First pass: sizes (and the same errors as the twin, before any output).
    for i in range(n):
        e = <object>PyList_GET_ITEM(entries, i)
        if PyBytes_CheckExact(e):
            size = PyBytes_GET_SIZE(e)
        else:
            PyObject_GetBuffer(e, &pybuf, PyBUF_SIMPLE)
            size = pybuf.len
            PyBuffer_Release(&pybuf)
        if <uint64_t>size > 0xFFFFFFFFULL:
            raise ValueError(f"entry of {size} bytes does not fit a u32 size field")
        total += 4 + size
    cdef bytes frame = PyBytes_FromStringAndSize(NULL, total)
    cdef uint8_t* out = <uint8_t*>PyBytes_AS_STRING(frame)
    cdef Py_ssize_t pos = 0
    offsets = [None] * n
    for i in range(n):
        e = <object>PyList_GET_ITEM(entries, i)
        offsets[i] = base_offset + pos
        if PyBytes_CheckExact(e):
            size = PyBytes_GET_SIZE(e)
            _put_u32(out + pos, <uint32_t>size)
            memcpy(out + pos + 4, PyBytes_AS_STRING(e), size)
        else:
            PyObject_GetBuffer(e, &pybuf, PyBUF_C_CONTIGUOUS)
            size = pybuf.len
            if pos + 4 + size > total:  # the buffer grew between the passes
                PyBuffer_Release(&pybuf)
                raise ValueError("an entry changed size while being framed")
            _put_u32(out + pos, <uint32_t>size)
            memcpy(out + pos + 4, pybuf.buf, size)
            PyBuffer_Release(&pybuf)
        pos += 4 + size
    if pos != total:
        raise ValueError("an entry changed size while being framed")
    return frame, offsets


def scan_log(buf, Py_ssize_t start, Py_ssize_t end, long long max_entry_bytes):
    cdef Py_buffer pybuf
    PyObject_GetBuffer(buf, &pybuf, PyBUF_SIMPLE)
    cdef const uint8_t* p = <const uint8_t*>pybuf.buf
    cdef Py_ssize_t length = pybuf.len
    cdef Py_ssize_t pos = start
    cdef uint32_t size
    cdef int status = SCAN_CLEAN
    records = []
    try:
        if not (0 <= start <= end <= length):
            raise ValueError(f"bad scan range [{start}, {end}) for a buffer of {length} bytes")
        while pos < end:
            if end - pos < 4:
                status = SCAN_TRUNCATED
                break
            size = _get_u32(p + pos)
            if size < _MIN_ENTRY or <long long>size > max_entry_bytes:
                status = SCAN_BAD_SIZE
                break
            if <Py_ssize_t>size > end - pos - 4:
                status = SCAN_TRUNCATED
                break
            records.append((pos, size, _get_i64(p + pos + 4), _get_i64(p + pos + 12)))
            pos += 4 + <Py_ssize_t>size
    finally:
        PyBuffer_Release(&pybuf)
    return records, pos, status
