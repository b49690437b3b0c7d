# cython: language_level=3, boundscheck=False, wraparound=False
"""The client's add path, compiled: the twin of `bk/client/core_py.py`.

Same names, same behaviour, same attributes (core_py's docstring is the
contract). What compiling buys: the hot state is typed fields of extension
types instead of instance dictionaries, PendingAdd is a small struct-like
object from a free list, an ADD answer goes from the BookieClient's response
table straight into its ledger's core (an AddResponder is recognised, no bound
method or partial in between), and a send to a BookieClient is a C call.

Invariants kept from the Python version (tests run both):
- an entry is acknowledged once AQ bookies of its write set under the current
  ensemble answered EOK; completions run in entry-id order and never while an
  ensemble change is in progress (`_changing`);
- any answer other than EOK, and any error, goes to LedgerHandle._add_failure;
- a caller's callback that raises is logged and does not stop the others.
"""
cimport cython
from libc.stdint cimport int64_t

import logging

from bk.errors import IncorrectParameterError
from bk.proto.constants import OpCode
from bk.proto.messages import AddResponse

log = logging.getLogger("bk.client.ledger_handle")
req_log = logging.getLogger("bk.client.bookie_client")

EAGER_FLUSH_BYTES = 64 * 1024  # see core_py.EAGER_FLUSH_BYTES
ADD = int(OpCode.ADD_ENTRY)

cdef Py_ssize_t _EAGER = EAGER_FLUSH_BYTES
cdef object _ADD = ADD
cdef object _AddResponse = AddResponse


@cython.freelist(512)
cdef class PendingAdd:
    """One entry between add_entry and its completion (see core_py.PendingAdd)."""

    cdef public int64_t entry_id
    cdef public object frame
    cdef public object future
    cdef public object callback
    cdef public int64_t length
    cdef public object acked
    cdef public int ack_count
    cdef public bint sent

    def __init__(self, int64_t entry_id, frame, future, int64_t length, callback=None):
        self.entry_id = entry_id
        self.frame = frame
        self.future = future
        self.callback = callback
        self.length = length
        self.acked = 0
        self.ack_count = 0
        self.sent = False

    def ack(self, int index):
        bit = (<object>1) << index
        if not self.acked & bit:
            self.acked |= bit
            self.ack_count += 1
        return self.ack_count

    def unack(self, int index):
        bit = (<object>1) << index
        if self.acked & bit:
            self.acked &= ~bit
            self.ack_count -= 1

    def finished(self):
        return self.future.done() if self.future is not None else self.callback is None

    def complete(self, entry_id, err):
        future = self.future
        if future is not None:
            if not future.done():
                if err is None:
                    future.set_result(entry_id)
                else:
                    future.set_exception(err)
            return
        callback = self.callback
        self.callback = None
        if callback is not None:
            try:
                callback(entry_id, err)
            except Exception:
                log.exception("add callback of entry %d failed", entry_id)


@cython.final
cdef class AddResponder:
    """`responder(response, err)` is `core._add_response(bookie, response, err)`."""

    cdef readonly AddCore core
    cdef readonly object bookie

    def __init__(self, AddCore core, bookie):
        self.core = core
        self.bookie = bookie

    def __call__(self, response, err):
        self.core._add_response_c(self.bookie, response, err)


cdef class AddCore:
    """The add path of LedgerHandle (see core_py.AddCore)."""

    cdef public object _bk, _loop, _framer, _pending, _failed_bookies, _index, _write_sets, _write_set_indexes
    cdef public object _refuse, _fixed_lac, _frame_small, _add_header, _master_key, ledger_id
    cdef public int _E, _WQ, _AQ
    cdef public int64_t _lac, _last_add_pushed, _length_pushed, _length_confirmed
    cdef public bint _changing
    cdef public Py_ssize_t _max_payload_bytes, _frame_small_max

    def async_add_entry(self, data, callback=None):
        """Start an add without waiting (see core_py.AddCore.async_add_entry)."""
        cdef PendingAdd op
        cdef int64_t entry_id, lac, length
        cdef Py_ssize_t n
        cdef tuple pair
        if self._refuse is not None or self._bk.closed:
            self._raise_refused()
        if type(data) is not bytes:
            if not isinstance(data, (bytearray, memoryview)):
                raise IncorrectParameterError(f"entry data must be bytes-like, not {type(data).__name__}")
            data = bytes(data)
        n = len(<bytes>data)
        if n > self._max_payload_bytes:
            self._too_large(n)
        entry_id = self._last_add_pushed + 1
        self._last_add_pushed = entry_id
        self._length_pushed += n
        length = self._length_pushed
        lac = self._lac if self._fixed_lac is None else self._fixed_lac
        if self._frame_small is not None and n <= self._frame_small_max:  # AddFramer.frame's own test
            frame = self._frame_small(self._add_header, self._master_key, self.ledger_id, entry_id, lac, length,
                                      data)
        else:
            frame = self._framer.frame(entry_id, lac, length, data)
        op = PendingAdd.__new__(PendingAdd)
        op.entry_id = entry_id
        op.frame = frame
        op.length = length
        op.acked = 0
        if callback is None:
            result = self._loop.create_future()
            op.future = result
        else:
            op.callback = callback
            result = entry_id
        self._pending.append(op)
        if not self._failed_bookies:  # the common case: every bookie of the write set is up
            op.sent = True
            for pair in <tuple>self._write_sets[entry_id % self._E]:
                client = pair[0]
                if isinstance(client, RequestCore):
                    (<RequestCore>client)._send_c((_ADD, self.ledger_id, entry_id), frame, pair[1],
                                                  (<RequestCore>client).add_timeout_s)
                else:
                    client.send_add(frame, self.ledger_id, entry_id, pair[1])
        else:
            self._send(op, self._write_set_indexes[entry_id % self._E])
        return result

    def _add_response(self, bookie, response, err):
        """A bookie's answer to an ADD."""
        self._add_response_c(bookie, response, err)

    cdef _add_response_c(self, bookie, response, err):
        cdef PendingAdd op
        cdef int64_t k, entry_id
        cdef Py_ssize_t n
        cdef int i
        if err is not None:
            self._add_failure(bookie, response, err)
            return
        if type(response) is _AddResponse:
            if (<tuple>response)[0] != 0:
                self._add_failure(bookie, response, err)
                return
            entry_id = (<tuple>response)[2]
        else:
            if response.rc != 0:
                self._add_failure(bookie, response, err)
                return
            entry_id = response.entry_id
        pending = self._pending
        n = len(pending)
        if n == 0:
            return  # already completed or failed
        op = <PendingAdd>pending[0]
        k = entry_id - op.entry_id
        if k < 0 or k >= n:
            return  # already completed or failed
        if k:
            op = <PendingAdd>pending[k]
        index = (<dict>self._index).get(bookie)
        if index is None or bookie in self._failed_bookies:
            return  # an answer from a bookie that is (being) replaced
        i = index
        if (i - op.entry_id) % self._E >= self._WQ:
            return
        bit = (<object>1) << i
        if not op.acked & bit:
            op.acked |= bit
            op.ack_count += 1
        if k == 0 and op.ack_count >= self._AQ:
            self._deliver_c()

    def _deliver(self):
        """Complete the acknowledged prefix of the pending adds, in entry-id order."""
        self._deliver_c()

    cdef _deliver_c(self):
        cdef PendingAdd op
        cdef int aq = self._AQ
        if self._changing:
            return
        pending = self._pending
        popleft = pending.popleft
        while pending:
            op = <PendingAdd>pending[0]
            if op.ack_count < aq:
                break
            popleft()
            self._lac = op.entry_id
            self._length_confirmed = op.length
            op.frame = None
            callback = op.callback
            if callback is None:
                op.complete(op.entry_id, None)
                continue
            op.callback = None
            try:
                callback(op.entry_id, None)
            except Exception:  # a caller's bug must not stop the other completions
                log.exception("add callback of entry %d failed", op.entry_id)
        if not pending:
            self._wake_drain()


cdef class RequestCore:
    """The request path of BookieClient (see core_py.RequestCore)."""

    cdef public object bookie_id, _loop, _protocol, _connect_task, _sweep_handle
    cdef public dict _pending, _queued
    cdef public list _out
    cdef public Py_ssize_t _out_bytes, _pending_count
    cdef public bint _flush_scheduled, _closed
    cdef public double add_timeout_s, read_timeout_s, _shortest_timeout_s

    def send_add(self, frame, ledger_id, entry_id, callback, timeout_s=None):
        """Send a complete ADD request frame (see ledger_handle's framing)."""
        self._send_c((_ADD, ledger_id, entry_id), frame, callback,
                     self.add_timeout_s if timeout_s is None else timeout_s)

    def _send(self, tuple key, frame, callback, double timeout_s):
        self._send_c(key, frame, callback, timeout_s)

    cdef _send_c(self, tuple key, frame, callback, double timeout_s):
        if self._closed:
            self._refuse_closed(callback)
            return
        request = (callback, self._loop.time() + timeout_s)
        if self._pending.setdefault(key, request) is not request:  # rare: the same question again
            self._queue(key, request)
        self._pending_count += 1
        if timeout_s < self._shortest_timeout_s:
            self._shortest_timeout_s = timeout_s
            if self._sweep_handle is not None:
                self._sweep_handle.cancel()
                self._sweep_handle = None
        if self._sweep_handle is None:
            self._arm_sweep()
        self._out.append(frame)
        if self._protocol is not None:
            self._out_bytes += len(frame)
            if self._out_bytes >= _EAGER:
                self._flush_c()  # let the bookie start on this while we go on producing
            elif not self._flush_scheduled:
                self._flush_scheduled = True
                self._loop.call_soon(self._flush)
        elif self._connect_task is None:
            self._start_connect()

    def _flush(self):
        self._flush_c()

    cdef _flush_c(self):
        self._flush_scheduled = False
        protocol = self._protocol
        if protocol is None or not self._out:
            return
        out = self._out
        self._out = []
        self._out_bytes = 0
        protocol.transport.writelines(out)

    def _dispatch_all(self, protocol, items):
        cdef AddResponder responder
        cdef dict pending
        if protocol is not self._protocol:
            return
        pending = self._pending
        for msg in items:
            if type(msg) is _AddResponse:
                key = (_ADD, (<tuple>msg)[1], (<tuple>msg)[2])
            else:
                key = self._key_for(protocol, msg)
                if key is None:
                    continue
                if key is False:  # malformed: the connection is gone
                    return
            request = pending.pop(key, None)
            if request is None:
                req_log.debug("bookie %s: no pending request for %r (late answer?)", self.bookie_id, msg)
                continue
            if self._queued:
                self._promote(key)
            self._pending_count -= 1
            callback = (<tuple>request)[0]
            try:
                if type(callback) is AddResponder:
                    responder = <AddResponder>callback
                    responder.core._add_response_c(responder.bookie, msg, None)
                else:
                    callback(msg, None)
            except Exception:  # a caller's bug must not break the connection
                req_log.exception("request callback failed")
