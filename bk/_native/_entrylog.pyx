# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Entry-log byte kernel (native). Same API and results as entrylog_py.py,
which documents the contract; the pure twin is the reference.

frame_entries(entries, base_offset) -> (frame, offsets)
frame_slice(entries, start, base_offset, max_frame_bytes) -> (frame, offsets, stop)
record_headers(entries, start, base_offset, max_frame_bytes) -> (headers, offsets, stop)
check_sizes(entries, min_bytes, max_bytes) -> (total_bytes, first_bad)
ledger_runs(entries, start, stop) -> list[(ledger_id, framed_bytes)]
scan_log(buf, start, end, max_entry_bytes) -> (records, stop_offset, status)
preads(reads) -> list[bytes | int]
"""
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE, PyBUF_C_CONTIGUOUS
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_CheckExact
from cpython.list cimport PyList_GET_SIZE, PyList_GET_ITEM
from cpython.tuple cimport PyTuple_GET_SIZE, PyTuple_GET_ITEM
from cpython.long cimport PyLong_FromUnsignedLongLong
from libc.stdint cimport uint8_t, uint32_t, int64_t, uint64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy, memcmp
from libc.errno cimport errno, EINTR
from posix.unistd cimport pread

include "formats.pxi"

# The record layout and scan statuses are the EL_ names of the generated formats.pxi
# (bk/formats/entrylog.py): a record is `size u32 | entry`, the entry at least its two ids.
SCAN_CLEAN = EL_LOG_SCAN_CLEAN
SCAN_TRUNCATED = EL_LOG_SCAN_TRUNCATED
SCAN_BAD_SIZE = EL_LOG_SCAN_BAD_SIZE
MIN_ENTRY_BYTES = EL_LOG_MIN_ENTRY_BYTES

# Below this many bytes the GIL round trip costs more than the copy it frees.
cdef Py_ssize_t _NOGIL_MIN_BYTES = 64 * 1024


cdef inline Py_ssize_t _size_of(object e) except -1:
    """Byte length of a bytes-like entry (TypeError for anything else)."""
    cdef Py_buffer pybuf
    cdef Py_ssize_t size
    if PyBytes_CheckExact(e):
        return PyBytes_GET_SIZE(e)
    PyObject_GetBuffer(e, &pybuf, PyBUF_SIMPLE)
    size = pybuf.len
    PyBuffer_Release(&pybuf)
    return size


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
        total += EL_LOG_SIZE_FIELD_BYTES + size
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
            memcpy(out + pos + EL_LOG_SIZE_FIELD_BYTES, PyBytes_AS_STRING(e), size)
        else:
            PyObject_GetBuffer(e, &pybuf, PyBUF_C_CONTIGUOUS)
            size = pybuf.len
            if pos + EL_LOG_SIZE_FIELD_BYTES + size > total:  # the buffer grew between the passes
                PyBuffer_Release(&pybuf)
                raise ValueError("an entry changed size while being framed")
            _put_u32(out + pos, <uint32_t>size)
            memcpy(out + pos + EL_LOG_SIZE_FIELD_BYTES, pybuf.buf, size)
            PyBuffer_Release(&pybuf)
        pos += EL_LOG_SIZE_FIELD_BYTES + size
    if pos != total:
        raise ValueError("an entry changed size while being framed")
    return frame, offsets


def check_sizes(list entries, Py_ssize_t min_bytes, Py_ssize_t max_bytes):
    cdef Py_ssize_t i, size, total = 0
    for i in range(PyList_GET_SIZE(entries)):
        size = _size_of(<object>PyList_GET_ITEM(entries, i))
        if size < min_bytes or size > max_bytes:
            return total, i
        total += size
    return total, -1


def frame_slice(list entries, Py_ssize_t start, base_offset, Py_ssize_t max_frame_bytes):
    cdef Py_ssize_t n = PyList_GET_SIZE(entries)
    cdef Py_ssize_t i, k, stop, size, total = 0, pos = 0, nviews = 0
    cdef tuple pinned
    cdef object e
    cdef const char **ptrs = NULL
    cdef Py_ssize_t *lens = NULL
    cdef Py_buffer *views = NULL
    cdef bytes frame
    cdef uint8_t* out
    if start < 0 or start > n:
        raise ValueError(f"start {start} is outside 0..{n}")
    # How many entries fit (at least one): sizes only, before any output.
    stop = start
    while stop < n:
        size = _size_of(<object>PyList_GET_ITEM(entries, stop))
        if <uint64_t>size > 0xFFFFFFFFULL:
            raise ValueError(f"entry of {size} bytes does not fit a u32 size field")
        if stop > start and total + EL_LOG_SIZE_FIELD_BYTES + size > max_frame_bytes:
            break
        total += EL_LOG_SIZE_FIELD_BYTES + size
        stop += 1
    k = stop - start
    # Offsets in C when the base is a plain non-negative int (always, for locations).
    cdef bint cfast = type(base_offset) is int and 0 <= base_offset < (1 << 62)
    cdef uint64_t cbase = base_offset if cfast else 0
    # Pin the entries (the caller's list may change while the copy runs without the GIL).
    pinned = tuple(entries[start:stop])
    ptrs = <const char **>malloc((k + 1) * sizeof(char *))
    lens = <Py_ssize_t *>malloc((k + 1) * sizeof(Py_ssize_t))
    views = <Py_buffer *>malloc((k + 1) * sizeof(Py_buffer))
    if ptrs == NULL or lens == NULL or views == NULL:
        free(ptrs)
        free(lens)
        free(views)
        raise MemoryError()
    try:
        pos = 0
        offsets = [None] * k
        for i in range(k):
            e = <object>PyTuple_GET_ITEM(pinned, i)
            if PyBytes_CheckExact(e):
                ptrs[i] = PyBytes_AS_STRING(e)
                lens[i] = PyBytes_GET_SIZE(e)
            else:
                PyObject_GetBuffer(e, &views[nviews], PyBUF_C_CONTIGUOUS)
                nviews += 1
                ptrs[i] = <const char *>views[nviews - 1].buf
                lens[i] = views[nviews - 1].len
            offsets[i] = PyLong_FromUnsignedLongLong(cbase + <uint64_t>pos) if cfast else base_offset + pos
            pos += EL_LOG_SIZE_FIELD_BYTES + lens[i]
        if pos != total:
            raise ValueError("an entry changed size while being framed")
        frame = PyBytes_FromStringAndSize(NULL, total)
        out = <uint8_t*>PyBytes_AS_STRING(frame)
        if total >= _NOGIL_MIN_BYTES:
            with nogil:
                _frame_into(out, ptrs, lens, k)
        else:
            _frame_into(out, ptrs, lens, k)
        return frame, offsets, stop
    finally:
        for i in range(nviews):
            PyBuffer_Release(&views[i])
        free(views)
        free(ptrs)
        free(lens)


def record_headers(list entries, Py_ssize_t start, base_offset, Py_ssize_t max_frame_bytes):
    cdef Py_ssize_t n = PyList_GET_SIZE(entries)
    cdef Py_ssize_t i, stop, size, total = 0, pos = 0
    cdef bytes headers
    cdef uint8_t* out
    if start < 0 or start > n:
        raise ValueError(f"start {start} is outside 0..{n}")
    cdef bint cfast = type(base_offset) is int and 0 <= base_offset < (1 << 62)
    cdef uint64_t cbase = base_offset if cfast else 0
    stop = start
    while stop < n:  # the same run frame_slice would take
        size = _size_of(<object>PyList_GET_ITEM(entries, stop))
        if <uint64_t>size > 0xFFFFFFFFULL:
            raise ValueError(f"entry of {size} bytes does not fit a u32 size field")
        if stop > start and total + EL_LOG_SIZE_FIELD_BYTES + size > max_frame_bytes:
            break
        total += EL_LOG_SIZE_FIELD_BYTES + size
        stop += 1
    headers = PyBytes_FromStringAndSize(NULL, EL_LOG_SIZE_FIELD_BYTES * (stop - start))
    out = <uint8_t*>PyBytes_AS_STRING(headers)
    offsets = [None] * (stop - start)
    for i in range(stop - start):
        size = _size_of(<object>PyList_GET_ITEM(entries, start + i))
        _put_u32(out + EL_LOG_SIZE_FIELD_BYTES * i, <uint32_t>size)
        offsets[i] = PyLong_FromUnsignedLongLong(cbase + <uint64_t>pos) if cfast else base_offset + pos
        pos += EL_LOG_SIZE_FIELD_BYTES + size
    if pos != total:
        raise ValueError("an entry changed size while its header was built")
    return headers, offsets, stop


cdef void _frame_into(uint8_t* out, const char **ptrs, Py_ssize_t *lens, Py_ssize_t k) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(k):
        _put_u32(out, <uint32_t>lens[i])
        memcpy(out + EL_LOG_SIZE_FIELD_BYTES, ptrs[i], lens[i])
        out += EL_LOG_SIZE_FIELD_BYTES + lens[i]


def ledger_runs(list entries, Py_ssize_t start, Py_ssize_t stop):
    cdef Py_ssize_t i, size
    cdef Py_buffer pybuf
    cdef const uint8_t* head
    cdef uint8_t prev[8]
    cdef uint8_t cur[8]
    cdef Py_ssize_t run_bytes = 0
    cdef bint have = False
    cdef object e
    runs = []
    if not (0 <= start <= stop <= PyList_GET_SIZE(entries)):
        raise ValueError(f"bad range [{start}, {stop}) of {PyList_GET_SIZE(entries)} entries")
    for i in range(start, stop):
        e = <object>PyList_GET_ITEM(entries, i)
        if PyBytes_CheckExact(e):
            size = PyBytes_GET_SIZE(e)
            if size < 8:
                raise ValueError(f"entry {i} is {size} bytes, shorter than its ledger id")
            memcpy(cur, PyBytes_AS_STRING(e), 8)
        else:
            PyObject_GetBuffer(e, &pybuf, PyBUF_SIMPLE)
            size = pybuf.len
            if size >= 8:
                memcpy(cur, pybuf.buf, 8)
            PyBuffer_Release(&pybuf)
            if size < 8:
                raise ValueError(f"entry {i} is {size} bytes, shorter than its ledger id")
        if have and memcmp(cur, prev, 8) == 0:
            run_bytes += EL_LOG_SIZE_FIELD_BYTES + size
            continue
        if have:
            runs.append((_get_i64(prev), run_bytes))
        memcpy(prev, cur, 8)
        run_bytes = EL_LOG_SIZE_FIELD_BYTES + size
        have = True
    if have:
        runs.append((_get_i64(prev), run_bytes))
    return runs


def scan_log(buf, Py_ssize_t start, Py_ssize_t end, long long max_entry_bytes):
    cdef Py_buffer pybuf
    PyObject_GetBuffer(buf, &pybuf, PyBUF_SIMPLE)
    cdef const uint8_t* p = <const uint8_t*>pybuf.buf
    cdef Py_ssize_t length = pybuf.len
    cdef Py_ssize_t pos = start
    cdef uint32_t size
    cdef int status = EL_LOG_SCAN_CLEAN
    records = []
    try:
        if not (0 <= start <= end <= length):
            raise ValueError(f"bad scan range [{start}, {end}) for a buffer of {length} bytes")
        while pos < end:
            if end - pos < EL_LOG_SIZE_FIELD_BYTES:
                status = EL_LOG_SCAN_TRUNCATED
                break
            size = _get_u32(p + pos)
            if size < EL_LOG_MIN_ENTRY_BYTES or <long long>size > max_entry_bytes:
                status = EL_LOG_SCAN_BAD_SIZE
                break
            if <Py_ssize_t>size > end - pos - EL_LOG_SIZE_FIELD_BYTES:
                status = EL_LOG_SCAN_TRUNCATED
                break
            records.append((pos, size, _get_i64(p + pos + EL_LOG_SIZE_FIELD_BYTES),
                            _get_i64(p + pos + EL_LOG_SIZE_FIELD_BYTES + 8)))
            pos += EL_LOG_SIZE_FIELD_BYTES + <Py_ssize_t>size
    finally:
        PyBuffer_Release(&pybuf)
    return records, pos, status


def preads(list reads):
    """[(fd, n, offset)] -> per read the bytes read (shorter at a file's end) or the errno of its
    failure (an int), every pread done with the GIL released once for all (a batch of cold READs
    pays one GIL round trip, not one per entry)."""
    cdef Py_ssize_t k = PyList_GET_SIZE(reads), i
    if k == 0:
        return []
    cdef int* fds = <int*>malloc(k * sizeof(int))
    cdef Py_ssize_t* ns = <Py_ssize_t*>malloc(k * sizeof(Py_ssize_t))
    cdef long long* offs = <long long*>malloc(k * sizeof(long long))
    cdef Py_ssize_t* got = <Py_ssize_t*>malloc(k * sizeof(Py_ssize_t))
    cdef char** bufs = <char**>malloc(k * sizeof(char*))
    cdef Py_ssize_t r, done
    out = []
    try:
        if fds == NULL or ns == NULL or offs == NULL or got == NULL or bufs == NULL:
            raise MemoryError()
        for i in range(k):
            fd, n, off = reads[i]
            if n < 0 or off < 0:
                raise ValueError(f"bad read ({fd}, {n}, {off})")
            b = PyBytes_FromStringAndSize(NULL, n)
            out.append(b)
            fds[i], ns[i], offs[i], bufs[i] = fd, n, off, PyBytes_AS_STRING(b)
        with nogil:
            for i in range(k):
                done = 0
                while done < ns[i]:  # to the end of the file, as os.pread returns what is there
                    r = pread(fds[i], bufs[i] + done, ns[i] - done, offs[i] + done)
                    if r < 0:
                        if errno == EINTR:
                            continue
                        done = -errno
                        break
                    if r == 0:
                        break
                    done += r
                got[i] = done
        for i in range(k):
            if got[i] < 0:
                out[i] = <int>-got[i]
            elif got[i] < ns[i]:
                out[i] = out[i][:got[i]]
        return out
    finally:
        free(fds)
        free(ns)
        free(offs)
        free(got)
        free(bufs)
