# cython: language_level=3
"""An io_uring for the bookie's entry-log reads (liburing, linked statically).

Reads are queued and submitted from the event loop's thread; the kernel signals finished
ones on an eventfd the loop watches, and complete() hands each to its callback there. A
cold READ then costs no thread at all: no job hand-off, no GIL hand-off, no thread
parked in pread (docs/STORAGE.md, "READs through io_uring").

Invariants:
- A buffer lives in `_reads` from the moment its read is queued until its completion
  has been reaped: the kernel may write into it until then, whoever stopped waiting.
- At most `capacity` reads are in the kernel at once, so the completion queue (twice
  the submission queue) never overflows; more wait in `_waiting`, in order.
- Every queued read gets exactly one callback: its bytes, an errno, or ECANCELED when
  the ring closes before it was submitted.
- The fd of a queued read stays open until its callback ran (the caller's duty: the
  callback is where it may release the file).

No pure twin: where io_uring is missing (not built, an old kernel, a seccomp filter)
the bookie reads through its read threads instead (bk.bookie.read_ring.make_ring).
"""
from collections import deque

from libc.stdint cimport uint64_t
from libc.string cimport strerror
from posix.unistd cimport close as c_close, read as c_read
from cpython.bytearray cimport PyByteArray_AS_STRING


cdef extern from "<sys/eventfd.h>" nogil:
    int eventfd(unsigned int initval, int flags)
    int EFD_NONBLOCK
    int EFD_CLOEXEC

cdef extern from "<errno.h>" nogil:
    int errno
    int ECANCELED
    int EAGAIN
    int EINTR

cdef extern from "<liburing.h>" nogil:
    struct io_uring:
        pass
    struct io_uring_sqe:
        pass
    struct io_uring_cqe:
        uint64_t user_data
        int res
    int io_uring_queue_init(unsigned entries, io_uring *ring, unsigned flags)
    void io_uring_queue_exit(io_uring *ring)
    io_uring_sqe *io_uring_get_sqe(io_uring *ring)
    void io_uring_prep_read(io_uring_sqe *sqe, int fd, void *buf, unsigned nbytes, uint64_t offset)
    void io_uring_prep_nop(io_uring_sqe *sqe)
    void io_uring_sqe_set_data64(io_uring_sqe *sqe, uint64_t data)
    int io_uring_submit(io_uring *ring)
    int io_uring_peek_cqe(io_uring *ring, io_uring_cqe **cqe)
    int io_uring_wait_cqe(io_uring *ring, io_uring_cqe **cqe)
    void io_uring_cqe_seen(io_uring *ring, io_uring_cqe *cqe)
    int io_uring_register_eventfd(io_uring *ring, int fd)


cdef class Ring:
    """read(fd, nbytes, offset, done) queues a read; done(data, 0) gets a read-only view of
    what was read (shorter than nbytes at the end of the file), done(None, errno) a failure.
    submit() hands the queued reads to the kernel; complete() runs the callbacks of the
    finished ones (when fileno() is readable)."""
    cdef io_uring ring
    cdef int efd
    cdef bint opened
    cdef readonly int capacity
    cdef int prepared        # SQEs filled and not yet submitted
    cdef list _unsent        # (token, SQE address) of those, for fail_prepared
    cdef uint64_t next_token
    cdef dict _reads         # token -> (bytearray, done): in the kernel or prepared
    cdef object _waiting     # (fd, nbytes, offset, done) beyond capacity

    def __cinit__(self, unsigned entries=256):
        self.efd = -1
        cdef int rc = io_uring_queue_init(entries, &self.ring, 0)
        if rc < 0:
            raise OSError(-rc, "io_uring_queue_init: " + strerror(-rc).decode())
        self.opened = True
        self.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        if self.efd < 0:
            rc = errno
            self.close()
            raise OSError(rc, "eventfd")
        rc = io_uring_register_eventfd(&self.ring, self.efd)
        if rc < 0:
            self.close()
            raise OSError(-rc, "io_uring_register_eventfd: " + strerror(-rc).decode())
        self.capacity = entries
        self.next_token = 1
        self._reads = {}
        self._unsent = []
        self._waiting = deque()

    def fileno(self):
        return self.efd

    @property
    def in_flight(self):
        """Reads queued and not yet completed (in the kernel, prepared or waiting)."""
        return len(self._reads) + len(self._waiting)

    def read(self, int fd, Py_ssize_t nbytes, uint64_t offset, done):
        if not self.opened:
            raise RuntimeError("the read ring is closed")
        if nbytes <= 0 or nbytes > 0x7fffffff:
            raise ValueError(f"read of {nbytes} bytes")
        if len(self._reads) >= self.capacity:
            self._waiting.append((fd, nbytes, offset, done))
        else:
            self._prepare(fd, nbytes, offset, done)

    cdef _prepare(self, int fd, Py_ssize_t nbytes, uint64_t offset, done):
        cdef io_uring_sqe *sqe = io_uring_get_sqe(&self.ring)
        if sqe == NULL:  # full of prepared SQEs: hand them over first
            self.submit()
            sqe = io_uring_get_sqe(&self.ring)
            if sqe == NULL:
                raise RuntimeError("io_uring submission queue stays full")
        buf = bytearray(nbytes)
        token = self.next_token
        self.next_token += 1
        io_uring_prep_read(sqe, fd, PyByteArray_AS_STRING(buf), <unsigned>nbytes, offset)
        io_uring_sqe_set_data64(sqe, token)
        self._reads[token] = (buf, done)
        self._unsent.append((token, <size_t>sqe))
        self.prepared += 1

    def submit(self):
        """Hand the prepared reads to the kernel (one system call)."""
        cdef int rc
        while self.prepared:
            rc = io_uring_submit(&self.ring)
            if rc == -EINTR or rc == -EAGAIN:
                continue
            if rc < 0:
                raise OSError(-rc, "io_uring_submit: " + strerror(-rc).decode())
            self.prepared = self.prepared - rc if rc < self.prepared else 0
            del self._unsent[:rc]

    def fail_prepared(self, int err):
        """After submit() failed: every read not yet handed to the kernel fails with err. Their
        SQEs become no-ops (no fd, no buffer), so whatever submits them later reads nothing."""
        cdef io_uring_sqe *sqe
        for token, addr in self._unsent:  # they stay prepared: submitted later, as no-ops
            buf, done = self._reads[token]
            if done is None:
                continue
            sqe = <io_uring_sqe *><size_t>addr
            io_uring_prep_nop(sqe)
            io_uring_sqe_set_data64(sqe, token)
            self._reads[token] = (buf, None)  # its completion answers nobody
            done(None, err)

    def complete(self):
        """Run the callbacks of every finished read; queue waiting ones in their room.
        Returns how many finished."""
        cdef io_uring_cqe *cqe
        cdef uint64_t counter
        cdef int n = 0
        c_read(self.efd, &counter, 8)  # clear the eventfd (EAGAIN when nothing was posted)
        # Every posted completion is handled now, whatever a callback raises: the eventfd is
        # cleared, so one left in the queue would wait for the next read's wake-up.
        first_error = None
        while self.opened and io_uring_peek_cqe(&self.ring, &cqe) == 0:
            token, res = cqe.user_data, cqe.res
            io_uring_cqe_seen(&self.ring, cqe)
            n += 1
            try:
                self._finish(token, res)
            except BaseException as e:
                first_error = first_error or e
        while self._waiting and len(self._reads) < self.capacity:
            fd, nbytes, offset, done = self._waiting.popleft()
            self._prepare(fd, nbytes, offset, done)
        if self.prepared:
            self.submit()
        if first_error is not None:
            raise first_error
        return n

    cdef _finish(self, uint64_t token, int res):
        buf, done = self._reads.pop(token)
        if done is None:
            return
        if res < 0:
            done(None, -res)
        else:
            done(memoryview(buf)[:res].toreadonly(), 0)

    def close(self):
        """Wait for the reads in the kernel (their buffers are written until then), run every
        callback (ECANCELED for those never submitted), free the ring. Blocking, but only for
        reads already on their way."""
        cdef io_uring_cqe *cqe
        cdef int rc
        if not self.opened:
            return
        if self._reads is not None:
            self.submit()
            while self._reads:
                with nogil:
                    rc = io_uring_wait_cqe(&self.ring, &cqe)
                if rc == -EINTR:
                    continue
                if rc < 0:  # cannot happen with reads in the kernel; never spin
                    break
                token, res = cqe.user_data, cqe.res
                io_uring_cqe_seen(&self.ring, cqe)
                try:
                    self._finish(token, res)
                except Exception:
                    pass  # closing: each read is answered once; a callback's error stays its own
            while self._waiting:
                done = self._waiting.popleft()[3]
                done(None, ECANCELED)
        self.opened = False
        io_uring_queue_exit(&self.ring)
        if self.efd >= 0:
            c_close(self.efd)
            self.efd = -1

    def __dealloc__(self):
        if self.opened and not self._reads:
            io_uring_queue_exit(&self.ring)
            if self.efd >= 0:
                c_close(self.efd)
        # with reads in the kernel the ring is left to the process's end: freeing it under
        # them would let the kernel write into freed buffers
