# cython: language_level=3, boundscheck=False, wraparound=False
"""The client's add path, compiled: the twin of `bk/client/core_py.py`.

Same names, same behaviour, same fields (declared in `_core.pxd`; core_py's
docstring is the contract). What compiling buys: the hot state is typed
fields of extension types instead of instance dictionaries, PendingAdd is a small struct-like
object from a free list, an ADD answer goes from the BookieClient's response
table straight into its ledger's core (an AddResponder is recognised, no bound
method or partial in between), and a send to a BookieClient is a C call.

Invariants kept from the Python version (tests run both):
- an entry is acknowledged once AQ bookies of its write set under the current
  ensemble answered EOK; completions run in entry-id order and never while an
  ensemble change is in progress (`_changing`);
- any answer other than EOK, and any error, goes to the `add_failure` hook;
- a caller's callback that raises is logged and does not stop the others.
"""
cimport cython
from libc.stdint cimport int64_t

import logging

from collections import deque

from bk.errors import AddBatchError, IncorrectParameterError, LedgerClosedError
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
    """`responder(response, err)` is `core.add_response(bookie, response, err)`."""

    def __init__(self, AddCore core, bookie):
        self.core = core
        self.bookie = bookie

    def __call__(self, response, err):
        self.core._add_response_c(self.bookie, response, err)


@cython.final
cdef class AddBatch:
    """The adds of one add_entries call: its future, completed once every add did (core_py.AddBatch)."""

    def __call__(self, entry_id, err):
        self._completed(entry_id, err)

    cdef _completed(self, int64_t entry_id, err):
        self.done += 1
        if err is None:
            self.acked += 1
        else:
            if self.error is None:
                self.error = err
            if getattr(err, "outcome_unknown", True):
                self.unknown = True
        if self.added and self.done == self.count:
            self._finish()

    cdef _finish(self):
        future = self.future
        if future.done():  # cancelled by its awaiter: the adds went on regardless
            return
        if self.error is None:
            future.set_result(list(range(self.first_entry_id, self.first_entry_id + self.count)))
        else:
            future.set_exception(AddBatchError.of_batch(self.first_entry_id, self.acked, self.count, self.total,
                                                        self.error, self.unknown))


@cython.final
cdef class AddWindow:
    """The hot half of a LedgerWriter: adds through a window of `max_in_flight` (see core_py.AddWindow)."""

    def __init__(self, AddCore core, Py_ssize_t max_in_flight):
        self.core = core
        self.loop = core.loop
        self.max_in_flight = max_in_flight
        self.waiters = deque()

    def add(self, data):
        """Send `data` now if the window has room (an awaitable already done: the entry id), else
        queue it (a future of the entry id, set when it is sent)."""
        if self.error is not None:
            self.reported = True
            raise self.error
        if self.closed:
            raise LedgerClosedError(f"ledger {self.core.ledger_id}: this writer is closed")
        if self.in_flight < self.max_in_flight and not self.waiters:
            entry_id = self.core._add(data, self)
            self.in_flight += 1
            return Ready(entry_id)
        future = self.loop.create_future()
        self.waiters.append((future, data))
        return future

    def __call__(self, entry_id, err):
        self._completed(entry_id, err)

    cdef _completed(self, int64_t entry_id, err):
        self.in_flight -= 1
        if err is None:
            self.acknowledged += 1
            self.last_acknowledged_entry_id = entry_id
        elif self.error is None:
            self.error = err
        if self.waiters:
            self.admit()
        if self.in_flight == 0:
            drained = self.drained
            if drained is not None and not drained.done():
                drained.set_result(None)

    def admit(self):
        """Send waiting adds while there is room; after a failure fail them all (they were not sent)."""
        waiters = self.waiters
        while waiters and (self.in_flight < self.max_in_flight or self.error is not None):
            future, data = waiters.popleft()
            if future.done():  # cancelled while waiting: not sent
                continue
            if self.error is not None:
                self.reported = True
                future.set_exception(self.error)
                continue
            try:
                entry_id = self.core._add(data, self)
            except Exception as e:  # refused (e.g. the ledger was closed): this add was not written
                future.set_exception(e)
                continue
            self.in_flight += 1
            future.set_result(entry_id)


@cython.freelist(256)
@cython.final
cdef class Ready:
    """An awaitable that is already done: `await Ready(v)` is v, with no future and no loop step."""

    cdef object value

    def __init__(self, value):
        self.value = value

    def __await__(self):
        return self

    def __next__(self):
        raise StopIteration(self.value)


cdef class AddCore:
    """The add path of one ledger, held by its LedgerHandle (see core_py.AddCore)."""

    def __init__(self, ledger_id, bk, loop, *, raise_refused, raise_too_large, send_again, add_failure,
                 wake_drain):
        self.ledger_id = ledger_id
        self.bk = bk
        self.loop = loop
        self.raise_refused = raise_refused
        self.raise_too_large = raise_too_large
        self.send_again = send_again
        self.add_failure = add_failure
        self.wake_drain = wake_drain
        self.lac = self.last_add_pushed = self.last_add_acked = -1

    def async_add_entry(self, data, callback=None):
        """Start an add without waiting (see core_py.AddCore.async_add_entry)."""
        return self._add(data, callback)

    def add_entry(self, data):
        """The future of the entry id (see core_py.AddCore.add_entry)."""
        try:
            return self._add(data, None)
        except Exception as e:  # what awaiting a coroutine would raise, raised by the await
            future = self.loop.create_future()
            future.set_exception(e)
            return future

    def add_entries(self, payloads):
        """One future for a batch of adds (see core_py.AddCore.add_entries)."""
        cdef AddBatch batch = AddBatch.__new__(AddBatch)
        cdef list items
        future = batch.future = self.loop.create_future()
        try:
            items = payloads if type(payloads) is list else list(payloads)
            for data in items:
                self._check(data)
        except Exception as e:  # bad input: nothing was added
            future.set_exception(e)
            return future
        batch.first_entry_id = self.last_add_pushed + 1
        batch.total = len(items)
        try:
            for data in items:
                self._add(data, batch)
                batch.count += 1
        except Exception as e:  # refused: at once (as add_entry would be), or part way
            if batch.count == 0:
                future.set_exception(e)
                return future
            if batch.error is None:
                batch.error = e
        batch.added = True
        if batch.done == batch.count:
            batch._finish()
        return future

    cdef _check(self, data):
        """Raise what _add would for `data` as a payload, without adding it."""
        cdef Py_ssize_t n
        if type(data) is bytes:
            n = len(<bytes>data)
        elif isinstance(data, (bytearray, memoryview)):
            n = memoryview(data).nbytes
        else:
            raise IncorrectParameterError(f"entry data must be bytes-like, not {type(data).__name__}")
        if n > self.max_payload_bytes:
            self.raise_too_large(n)

    def checked_payload(self, data):
        """`data` as bytes once the checks of an add passed (see core_py.AddCore.checked_payload)."""
        return self._payload(data)

    cdef _payload(self, data):
        if self.refuse is not None or self.bk.closed:
            self.raise_refused()
        if type(data) is not bytes:
            if not isinstance(data, (bytearray, memoryview)):
                raise IncorrectParameterError(f"entry data must be bytes-like, not {type(data).__name__}")
            data = bytes(data)
        if len(<bytes>data) > self.max_payload_bytes:
            self.raise_too_large(len(<bytes>data))
        return data

    cdef _add(self, data, callback):
        cdef PendingAdd op
        cdef int64_t entry_id, lac, length
        cdef Py_ssize_t n
        cdef tuple pair
        data = self._payload(data)
        n = len(<bytes>data)
        entry_id = self.last_add_pushed + 1
        self.last_add_pushed = entry_id
        self.length_pushed += n
        length = self.length_pushed
        lac = self.lac if self.fixed_lac is None else self.fixed_lac
        if self.frame_small is not None and n <= self.frame_small_max:  # AddFramer.frame's own test
            frame = self.frame_small(self.add_header, self.master_key, self.ledger_id, entry_id, lac, length, data)
        else:
            frame = self.framer.frame(entry_id, lac, length, data)
        op = PendingAdd.__new__(PendingAdd)
        op.entry_id = entry_id
        op.frame = frame
        op.length = length
        op.acked = 0
        if callback is None:
            result = self.loop.create_future()
            op.future = result
        else:
            op.callback = callback
            result = entry_id
        self.pending.append(op)
        if not self.failed_bookies:  # the common case: every bookie of the write set is up
            op.sent = True
            for pair in <tuple>self.write_sets[entry_id % self.ensemble_size]:
                client = pair[0]
                if type(client) is RequestCore:
                    (<RequestCore>client).send_c((_ADD, self.ledger_id, entry_id), frame, pair[1],
                                                 (<RequestCore>client).add_timeout_s)
                else:
                    client.send_add(frame, self.ledger_id, entry_id, pair[1])
        else:
            self.send_again(op, self.write_set_indexes[entry_id % self.ensemble_size])
        return result

    def add_response(self, bookie, response, err):
        """A bookie's answer to an ADD."""
        self._add_response_c(bookie, response, err)

    cdef _add_response_c(self, bookie, response, err):
        cdef PendingAdd op, head
        cdef int64_t k, entry_id
        cdef Py_ssize_t n
        cdef int i
        if err is not None:
            self.add_failure(bookie, response, err)
            return
        if type(response) is _AddResponse:
            if (<tuple>response)[0] != 0:
                self.add_failure(bookie, response, err)
                return
            entry_id = (<tuple>response)[2]
        else:
            if response.rc != 0:
                self.add_failure(bookie, response, err)
                return
            entry_id = response.entry_id
        pending = self.pending
        n = len(pending)
        if n == 0:
            return  # already completed or failed
        head = <PendingAdd>pending[0]
        k = entry_id - head.entry_id
        if k < 0:
            return  # already completed or failed
        op = head
        if k:
            if k < n:
                op = <PendingAdd>pending[k]  # dense ids (every ledger but create_ledger_adv's): the entry
            if k >= n or op.entry_id != entry_id:
                op = self._find(entry_id, k if k < n else n - 1)
                if op is None:
                    return  # already failed, or never added
        index = (<dict>self.index).get(bookie)
        if index is None or bookie in self.failed_bookies:
            return  # an answer from a bookie that is (being) replaced
        i = index
        if (i - op.entry_id) % self.ensemble_size >= self.write_quorum_size:
            return
        bit = (<object>1) << i
        if not op.acked & bit:
            op.acked |= bit
            op.ack_count += 1
        if op is head and op.ack_count >= self.ack_quorum_size:
            self._deliver_c()

    cdef _find(self, int64_t entry_id, Py_ssize_t start):
        """The pending add of `entry_id` when ids have gaps (chosen ids): pending is sorted by id with
        no duplicates, so its index is at most `start` = entry_id - head id."""
        cdef PendingAdd op
        cdef Py_ssize_t i = start
        pending = self.pending
        while i >= 0:
            op = <PendingAdd>pending[i]
            if op.entry_id <= entry_id:
                return op if op.entry_id == entry_id else None
            i -= 1
        return None

    def deliver(self):
        """Complete the acknowledged prefix of the pending adds, in entry-id order."""
        self._deliver_c()

    cdef _deliver_c(self):
        cdef PendingAdd op
        cdef int aq = self.ack_quorum_size
        if self.changing:
            return
        pending = self.pending
        popleft = pending.popleft
        while pending:
            op = <PendingAdd>pending[0]
            if op.ack_count < aq or op.entry_id != self.last_add_acked + 1:
                break  # not acknowledged, or (chosen ids) an id before it was not added yet
            popleft()
            self.last_add_acked = op.entry_id
            self.length_acked = op.length
            if not self.deferred_sync:  # deferred sync: only LedgerHandle.force() moves the LAC
                self.lac = op.entry_id
                self.length_confirmed = op.length
            op.frame = None
            callback = op.callback
            if callback is None:
                op.complete(op.entry_id, None)
                continue
            op.callback = None
            try:
                if type(callback) is AddWindow:
                    (<AddWindow>callback)._completed(op.entry_id, None)
                elif type(callback) is AddBatch:
                    (<AddBatch>callback)._completed(op.entry_id, None)
                else:
                    callback(op.entry_id, None)
            except Exception:  # a caller's bug must not stop the other completions
                log.exception("add callback of entry %d failed", op.entry_id)
        if not pending:
            self.wake_drain()


cdef class RequestCore:
    """The request path of one BookieClient, held by it (see core_py.RequestCore)."""

    def __init__(self, bookie_id, loop, double add_timeout_s, double read_timeout_s, *, refuse_closed, queue,
                 arm_sweep, start_connect, key_for, promote):
        self.bookie_id = bookie_id
        self.loop = loop
        self.add_timeout_s = add_timeout_s
        self.read_timeout_s = read_timeout_s
        self.shortest_timeout_s = min(add_timeout_s, read_timeout_s)
        self.pending = {}
        self.queued = {}
        self.out = []
        self.refuse_closed = refuse_closed
        self.queue = queue
        self.arm_sweep = arm_sweep
        self.start_connect = start_connect
        self.key_for = key_for
        self.promote = promote

    def send_add(self, frame, ledger_id, entry_id, callback, timeout_s=None):
        """Send a complete ADD request frame (see ledger_handle's framing)."""
        self.send_c((_ADD, ledger_id, entry_id), frame, callback,
                    self.add_timeout_s if timeout_s is None else timeout_s)

    def send(self, tuple key, frame, callback, double timeout_s):
        """Queue `frame`, answered under `key` by `callback(response, err)` within `timeout_s`."""
        self.send_c(key, frame, callback, timeout_s)

    cdef send_c(self, tuple key, frame, callback, double timeout_s):
        if self.closed:
            self.refuse_closed(callback)
            return
        request = (callback, self.loop.time() + timeout_s)
        if self.pending.setdefault(key, request) is not request:  # rare: the same question again
            self.queue(key, request)
        self.pending_count += 1
        if timeout_s < self.shortest_timeout_s:
            self.shortest_timeout_s = timeout_s
            if self.sweep_handle is not None:
                self.sweep_handle.cancel()
                self.sweep_handle = None
        if self.sweep_handle is None:
            self.arm_sweep()
        self.out.append(frame)
        if self.protocol is not None:
            self.out_bytes += len(frame)
            if self.out_bytes >= _EAGER:
                self.flush_c()  # let the bookie start on this while we go on producing
            elif not self.flush_scheduled:
                self.flush_scheduled = True
                self.loop.call_soon(self.flush)
        elif self.connect_task is None:
            self.start_connect()

    def flush(self):
        """Write every queued frame now (one writelines)."""
        self.flush_c()

    cdef flush_c(self):
        self.flush_scheduled = False
        protocol = self.protocol
        if protocol is None or not self.out:
            return
        out = self.out
        self.out = []
        self.out_bytes = 0
        transport = protocol.transport
        # Closed, its connection_lost not delivered yet (a loop step later): that fails every
        # pending request, these included; writing would raise (uvloop) or vanish (asyncio).
        if not transport.is_closing():
            transport.writelines(out)

    def dispatch_all(self, protocol, items):
        """Answer the pending requests that the decoded messages `items` (from `protocol`) match."""
        cdef AddResponder responder
        cdef dict pending
        if protocol is not self.protocol:
            return
        pending = self.pending
        for msg in items:
            if type(msg) is _AddResponse:
                key = (_ADD, (<tuple>msg)[1], (<tuple>msg)[2])
            else:
                key = self.key_for(protocol, msg)
                if key is None:
                    continue
                if key is False:  # malformed: the connection is gone
                    return
            request = pending.pop(key, None)
            if request is None:
                req_log.debug("bookie %s: no pending request for %r (late answer?)", self.bookie_id, msg)
                continue
            if self.queued:
                self.promote(key)
            self.pending_count -= 1
            callback = (<tuple>request)[0]
            try:
                if type(callback) is AddResponder:
                    responder = <AddResponder>callback
                    responder.core._add_response_c(responder.bookie, msg, None)
                else:
                    callback(msg, None)
            except Exception:  # a caller's bug must not break the connection
                req_log.exception("request callback failed")
