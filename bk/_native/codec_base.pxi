# Shared by the codec kernels (_codec.pyx, _codec_v3.pyx): included, not imported, so the
# helpers inline into each module. The wire numbers come from the generated formats.pxi.
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

# Every size, offset, op code and flag below is a WL_ name of bk/formats/wire.py (generated formats.pxi).
include "formats.pxi"

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


cdef inline int _varint_size(uint64_t v) noexcept nogil:
    """Bytes of v as a protobuf varint."""
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


