# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Index byte kernel (native). Same API and results as index_py.py, which
documents the contract; the pure twin is the reference.

location_items(ledger_ids, entry_ids, locations) -> (items, ascending)
"""
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from cpython.list cimport PyList_GET_SIZE, PyList_GET_ITEM, PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_Check, PyLong_AsUnsignedLongLong
from cpython.number cimport PyNumber_Index
from cpython.ref cimport Py_INCREF, PyObject

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(object op)
    void PyObject_GC_Track(object op)
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport malloc, free

MAX_ID = (1 << 63) - 1
MAX_LOCATION = (1 << 64) - 1

cdef uint64_t _MAX_ID = 0x7FFFFFFFFFFFFFFFULL


cdef inline void _put_u64(uint8_t* p, uint64_t v) noexcept nogil:
    cdef int i
    for i in range(7, -1, -1):
        p[i] = <uint8_t>(v & 0xFF)
        v >>= 8


cdef uint64_t _as_u64(object x, str name, uint64_t top) except? 0xFFFFFFFFFFFFFFFF:
    """x as an unsigned 64-bit value in 0..top; TypeError / ValueError like the twin."""
    cdef uint64_t v
    if not PyLong_Check(x):
        try:
            x = PyNumber_Index(x)
        except TypeError:
            raise TypeError(f"{name} must be an int, not {type(x).__name__}") from None
    try:
        v = PyLong_AsUnsignedLongLong(x)
    except OverflowError:  # negative, or 2**64 and up
        raise ValueError(f"{name} {x} is outside 0..{MAX_ID if top == _MAX_ID else MAX_LOCATION}") from None
    if v > top:
        raise ValueError(f"{name} {x} is outside 0..{MAX_ID}")
    return v


def location_items(list ledger_ids, list entry_ids, list locations):
    cdef Py_ssize_t n = PyList_GET_SIZE(ledger_ids)
    cdef Py_ssize_t i
    cdef uint64_t lid, eid
    cdef bint ascending = True
    cdef uint64_t *cols = NULL
    cdef bytes key, value
    cdef tuple item
    cdef list items
    if PyList_GET_SIZE(entry_ids) != n or PyList_GET_SIZE(locations) != n:
        raise ValueError(f"location columns differ in length: {n}, {len(entry_ids)}, {len(locations)}")
    if n == 0:
        return [], True
    cols = <uint64_t*>malloc(3 * n * sizeof(uint64_t))
    if cols == NULL:
        raise MemoryError()
    try:
        # Validate every element before building anything: an error leaves no partial result.
        for i in range(n):
            lid = _as_u64(<object>PyList_GET_ITEM(ledger_ids, i), "ledger id", _MAX_ID)
            eid = _as_u64(<object>PyList_GET_ITEM(entry_ids, i), "entry id", _MAX_ID)
            cols[3 * i + 2] = _as_u64(<object>PyList_GET_ITEM(locations, i), "location", 0xFFFFFFFFFFFFFFFFULL)
            if i and ascending and not (lid > cols[3 * i - 3] or (lid == cols[3 * i - 3] and eid > cols[3 * i - 2])):
                ascending = False
            cols[3 * i] = lid
            cols[3 * i + 1] = eid
        # A (bytes, bytes) tuple can never be part of a cycle: leave it untracked by
        # the cyclic GC (CPython would untrack it at its first collection anyway), and
        # keep the list untracked while it fills, so the collections that these
        # allocations trigger do not walk a large half-built list again and again.
        items = PyList_New(n)
        PyObject_GC_UnTrack(items)
        for i in range(n):
            key = PyBytes_FromStringAndSize(NULL, 16)
            _put_u64(<uint8_t*>PyBytes_AS_STRING(key), cols[3 * i])
            _put_u64(<uint8_t*>PyBytes_AS_STRING(key) + 8, cols[3 * i + 1])
            value = PyBytes_FromStringAndSize(NULL, 8)
            _put_u64(<uint8_t*>PyBytes_AS_STRING(value), cols[3 * i + 2])
            item = PyTuple_New(2)
            Py_INCREF(key)
            PyTuple_SET_ITEM(item, 0, key)
            Py_INCREF(value)
            PyTuple_SET_ITEM(item, 1, value)
            PyObject_GC_UnTrack(item)
            Py_INCREF(item)
            PyList_SET_ITEM(items, i, item)
        PyObject_GC_Track(items)
        return items, ascending
    finally:
        free(cols)
