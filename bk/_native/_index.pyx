# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Index byte kernel (native). Same API and results as index_py.py, which
documents the contract; the pure twin is the reference.

pack_locations(ledger_ids, entry_ids, locations) -> (packed, ascending)
location_items(packed, start, stop) -> iterator of (key, value)
"""
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_SIZE, PyList_GET_ITEM
from cpython.long cimport PyLong_Check, PyLong_AsUnsignedLongLong
from cpython.number cimport PyNumber_Index
from cpython.exc cimport PyErr_Clear
from libc.stdint cimport uint8_t, uint64_t

include "formats.pxi"

# A packed location record is key (ledger_id u64 | entry_id u64) then value (location u64):
# the IX_ names of the generated formats.pxi (bk/formats/index.py).
MAX_ID = (1 << 63) - 1
MAX_LOCATION = (1 << 64) - 1
RECORD_BYTES = IX_LOCATION_RECORD_BYTES
KEY_BYTES = IX_LOCATION_KEY_BYTES

cdef uint64_t _MAX_ID = 0x7FFFFFFFFFFFFFFFULL
cdef uint64_t _MAX_U64 = 0xFFFFFFFFFFFFFFFFULL


cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    static inline void bk_put_u64_be(unsigned char *p, uint64_t v) {
    #if defined(__GNUC__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        v = __builtin_bswap64(v);
        memcpy(p, &v, 8);
    #else
        int i;
        for (i = 7; i >= 0; i--) { p[i] = (unsigned char)(v & 0xFF); v >>= 8; }
    #endif
    }
    """
    void _put_u64 "bk_put_u64_be"(uint8_t* p, uint64_t v) nogil


cdef extern from "Python.h":
    # Declared without an exception clause: the caller checks PyErr_Occurred
    # itself, so the hot path has no try/except state to save.
    unsigned long long _ull_of_long "PyLong_AsUnsignedLongLong"(object pylong)
    bint _exact_long "PyLong_CheckExact"(object o)


cdef inline uint64_t _as_u64(object x, str name, uint64_t top) except? 0xFFFFFFFFFFFFFFFF:
    """x as an unsigned 64-bit value in 0..top; TypeError / ValueError like the twin."""
    cdef uint64_t v
    if _exact_long(x):
        v = _ull_of_long(x)
        if v <= top and v != 0xFFFFFFFFFFFFFFFFULL:  # all ones may be the error value: slow path decides
            return v
    return _as_u64_slow(x, name, top)


cdef uint64_t _as_u64_slow(object x, str name, uint64_t top) except? 0xFFFFFFFFFFFFFFFF:
    cdef uint64_t v
    PyErr_Clear()  # the fast path may have left an OverflowError
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


def pack_locations(list ledger_ids, list entry_ids, list locations):
    cdef Py_ssize_t n = PyList_GET_SIZE(ledger_ids)
    cdef Py_ssize_t i
    cdef uint64_t lid, eid, prev_lid = 0, prev_eid = 0
    cdef bint ascending = True
    cdef bytes packed
    cdef uint8_t* p
    if PyList_GET_SIZE(entry_ids) != n or PyList_GET_SIZE(locations) != n:
        raise ValueError(f"location columns differ in length: {n}, {len(entry_ids)}, {len(locations)}")
    packed = PyBytes_FromStringAndSize(NULL, n * IX_LOCATION_RECORD_BYTES)
    p = <uint8_t*>PyBytes_AS_STRING(packed)
    for i in range(n):
        lid = _as_u64(<object>PyList_GET_ITEM(ledger_ids, i), "ledger id", _MAX_ID)
        eid = _as_u64(<object>PyList_GET_ITEM(entry_ids, i), "entry id", _MAX_ID)
        _put_u64(p + IX_LOCATION_RECORD_BYTES * i + IX_LOCATION_KEY_BYTES,
                 _as_u64(<object>PyList_GET_ITEM(locations, i), "location", _MAX_U64))
        _put_u64(p + IX_LOCATION_RECORD_BYTES * i, lid)
        _put_u64(p + IX_LOCATION_RECORD_BYTES * i + 8, eid)
        if i and ascending and not (lid > prev_lid or (lid == prev_lid and eid > prev_eid)):
            ascending = False
        prev_lid = lid
        prev_eid = eid
    return packed, ascending


cdef class _LocationItems:
    """Iterator over packed records as (key, value) 2-tuples, one at a time.

    putmulti drops each item before asking for the next, so the tuple and both
    bytes objects go straight back to CPython's free lists and are reused: a
    batch costs a few objects, not three per location, and no GC accounting.
    """
    cdef bytes _packed
    cdef Py_ssize_t _pos, _stop

    def __iter__(self):
        return self

    def __next__(self):
        cdef const char* p
        if self._pos >= self._stop:
            raise StopIteration
        p = PyBytes_AS_STRING(self._packed) + IX_LOCATION_RECORD_BYTES * self._pos
        self._pos += 1
        return (PyBytes_FromStringAndSize(p, IX_LOCATION_KEY_BYTES),
                PyBytes_FromStringAndSize(p + IX_LOCATION_KEY_BYTES, IX_LOCATION_VALUE_BYTES))

    def __length_hint__(self):
        return self._stop - self._pos


def location_items(packed, Py_ssize_t start, Py_ssize_t stop):
    cdef bytes data = packed if type(packed) is bytes else bytes(packed)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(data)
    cdef Py_ssize_t n = size // IX_LOCATION_RECORD_BYTES
    cdef _LocationItems it
    if size % IX_LOCATION_RECORD_BYTES:
        raise ValueError(f"packed locations of {size} bytes are not whole {RECORD_BYTES}-byte records")
    if not (0 <= start <= stop <= n):
        raise ValueError(f"bad record range [{start}, {stop}) of {n} records")
    it = _LocationItems.__new__(_LocationItems)
    it._packed = data
    it._pos = start
    it._stop = stop
    return it
