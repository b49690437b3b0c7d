"""The client's add path in pure Python: the twin of `bk/client/_core.pyx`.

Both modules define the same names with the same behaviour and the same
fields (`bk/client/_core.pxd` declares them; here they are `__slots__`);
`bk.client` takes the compiled one unless `BK_NO_NATIVE=1`
(bk._native.load):

- `PendingAdd`: one entry between `async_add_entry` and its completion.
- `AddCore`: the per-add part of a ledger's writer, held by its LedgerHandle
  (`lh._core`): `async_add_entry`, `add_response` (a bookie's answer: the ack),
  `deliver` (in-order completion). Everything rarer - refusals, a bookie's
  failure, ensemble change, close - is LedgerHandle's Python, which the core
  reaches through the hooks it was given: `raise_refused()`,
  `raise_too_large(n)`, `send_again(op, indexes)`,
  `add_failure(bookie, response, err)`, `wake_drain()`.
- `RequestCore`: the per-request part of a BookieClient, held by it
  (`client._core`): `send_add`, `send`, `flush`, `dispatch_all`. Its hooks:
  `refuse_closed(callback)`, `queue(key, request)`, `arm_sweep()`,
  `start_connect()`, `key_for(protocol, msg)`, `promote(key)`.
- `AddResponder(core, bookie)`: the callback a RequestCore gets for an ADD of
  `core`'s ledger sent to `bookie`; `responder(response, err)` is
  `core.add_response(bookie, response, err)`. The compiled RequestCore
  recognises it and calls the core directly.

The ledger's hot state lives in the core's fields (`pending`, `lac`,
`last_add_pushed`, `length_pushed`, `length_confirmed`, `ensemble_size`,
`write_quorum_size`, `ack_quorum_size`, `write_sets`, `failed_bookies`,
`changing`, ...): LedgerHandle's Python reads and writes the same fields, so
both halves see one state.
"""
from __future__ import annotations

import logging
from functools import partial

from collections import deque

from bk.errors import AddBatchError, IncorrectParameterError, LedgerClosedError
from bk.proto.constants import OpCode
from bk.proto.messages import AddResponse

log = logging.getLogger("bk.client.ledger_handle")
req_log = logging.getLogger("bk.client.bookie_client")

# Frames queued in one loop iteration leave together at its end, but once this
# many bytes are queued they leave at once: a writer that pipelines thousands of
# adds in one go would otherwise keep the bookie idle until it yields, and the
# two processes would take turns instead of working at the same time.
EAGER_FLUSH_BYTES = 64 * 1024
ADD = int(OpCode.ADD_ENTRY)


class PendingAdd:
    """One entry between add_entry and its completion.

    `acked` is a bit mask over ensemble indexes of the bookies that answered
    EOK under the current ensemble; `ack_count` its population. An ensemble
    change clears the bits of the indexes whose bookie changed. The outcome goes
    to `future` or, for callback adds, to `callback(entry_id, error)`: exactly once.
    """

    __slots__ = ("entry_id", "frame", "future", "callback", "length", "acked", "ack_count", "sent")

    def __init__(self, entry_id: int, frame: bytes, future, length: int, callback=None):
        self.entry_id = entry_id
        self.frame = frame
        self.future = future
        self.callback = callback
        self.length = length  # cumulative ledger length including this entry
        self.acked = 0
        self.ack_count = 0
        self.sent = False  # sent to at least one bookie: its outcome is unknown if it fails

    def ack(self, index: int) -> int:
        bit = 1 << index
        if not self.acked & bit:
            self.acked |= bit
            self.ack_count += 1
        return self.ack_count

    def unack(self, index: int) -> None:
        bit = 1 << index
        if self.acked & bit:
            self.acked &= ~bit
            self.ack_count -= 1

    def finished(self) -> bool:
        return self.future.done() if self.future is not None else self.callback is None

    def complete(self, entry_id: int, err: BaseException | None) -> None:
        future = self.future
        if future is not None:
            if not future.done():
                if err is None:
                    future.set_result(entry_id)
                else:
                    future.set_exception(err)
            return
        callback, self.callback = self.callback, None
        if callback is not None:
            try:
                callback(entry_id, err)
            except Exception:  # a caller's bug must not stop the other completions
                log.exception("add callback of entry %d failed", entry_id)


def AddResponder(core, bookie: str):  # noqa: N802 - the compiled twin is a class
    return partial(core.add_response, bookie)


class AddBatch:
    """The adds of one add_entries call: its future, completed once every add did.

    `count` adds got ids from `first_entry_id` on (of `total` payloads; fewer
    if the handle refused part way); `done` of them completed, `acked` of them
    successfully (a prefix: completions come in entry-id order)."""

    __slots__ = ("future", "error", "first_entry_id", "total", "count", "done", "acked", "added", "unknown")

    def __init__(self):
        self.future = self.error = None
        self.first_entry_id = self.total = self.count = self.done = self.acked = 0
        self.added = self.unknown = False

    def __call__(self, entry_id: int, err) -> None:
        self._completed(entry_id, err)

    def _completed(self, entry_id: int, err) -> None:
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

    def _finish(self) -> None:
        future = self.future
        if future.done():  # cancelled by its awaiter: the adds went on regardless
            return
        if self.error is None:
            future.set_result(list(range(self.first_entry_id, self.first_entry_id + self.count)))
        else:
            future.set_exception(AddBatchError.of_batch(self.first_entry_id, self.acked, self.count, self.total,
                                                        self.error, self.unknown))


class AddWindow:
    """The hot half of a LedgerWriter (bk/client/writer.py): adds through a window of
    `max_in_flight`, completed through this object as their callback. `waiters` are
    (future, data) of adds waiting for room, in call order; `error` the first failure
    (`reported` once raised to the caller); `drained` a future set when nothing is in flight."""

    __slots__ = ("core", "loop", "error", "waiters", "drained", "last_acknowledged_entry_id", "max_in_flight",
                 "in_flight", "acknowledged", "reported", "closed")

    def __init__(self, core, max_in_flight: int):
        self.core, self.loop = core, core.loop
        self.error = self.drained = self.last_acknowledged_entry_id = None
        self.waiters = deque()
        self.max_in_flight = max_in_flight
        self.in_flight = self.acknowledged = 0
        self.reported = self.closed = False

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

    def __call__(self, entry_id: int, err) -> None:
        self._completed(entry_id, err)

    def _completed(self, entry_id: int, err) -> None:
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

    def admit(self) -> None:
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


class Ready:
    """An awaitable that is already done: `await Ready(v)` is v, with no future and no loop step."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __await__(self):
        return self.value
        yield  # noqa: unreachable - makes __await__ a generator that stops at once


class AddCore:
    """The add path of one ledger, held by its LedgerHandle (see the module docstring)."""

    __slots__ = ("ledger_id", "bk", "loop", "framer", "frame_small", "add_header", "master_key",
                 "max_payload_bytes", "frame_small_max",
                 "ensemble_size", "write_quorum_size", "ack_quorum_size", "index", "write_sets", "write_set_indexes",
                 "pending", "failed_bookies", "refuse", "fixed_lac",
                 "lac", "last_add_pushed", "length_pushed", "length_confirmed", "changing",
                 "last_add_acked", "length_acked", "deferred_sync",
                 "raise_refused", "raise_too_large", "send_again", "add_failure", "wake_drain")

    def __init__(self, ledger_id, bk, loop, *, raise_refused, raise_too_large, send_again, add_failure,
                 wake_drain):
        for name in self.__slots__:  # the compiled twin's defaults: None for objects, 0 for numbers
            setattr(self, name, None)
        self.max_payload_bytes = self.frame_small_max = 0
        self.ensemble_size = self.write_quorum_size = self.ack_quorum_size = 0
        self.length_pushed = self.length_confirmed = self.length_acked = 0
        self.changing = self.deferred_sync = False
        self.ledger_id, self.bk, self.loop = ledger_id, bk, loop
        self.raise_refused, self.raise_too_large, self.send_again = raise_refused, raise_too_large, send_again
        self.add_failure, self.wake_drain = add_failure, wake_drain
        # the acknowledged prefix (BookKeeper's pendingAddsSequenceHead) and its length: the LAC
        # follows it except on a deferred-sync ledger, where only LedgerHandle.force() moves the LAC
        self.lac = self.last_add_pushed = self.last_add_acked = -1

    def async_add_entry(self, data, callback=None):
        """Start an add without waiting (pipelining).

        Without `callback`: returns the future of the entry id. With `callback`
        (no future is made: the cheapest way to keep thousands of adds in
        flight): returns the entry id at once and later calls, on the event loop
        and in entry-id order, `callback(entry_id, None)` once AQ bookies stored
        it or `callback(entry_id, error)` if it failed. Either way an add that
        cannot start (closed handle, fenced writer, bad data) raises here.
        """
        return self._add(data, callback)

    def add_entry(self, data):
        """The add starts now; returns the future of its entry id.

        A plain future, not a coroutine: `await lh.add_entry(data)` reads as
        before, and `asyncio.gather` over many of them wraps none in a task. An
        add that cannot start puts its error in the future (raised by the
        await, as a coroutine would)."""
        try:
            return self._add(data, None)
        except Exception as e:  # what awaiting a coroutine would raise, raised by the await
            future = self.loop.create_future()
            future.set_exception(e)
            return future

    def add_entries(self, payloads):
        """Add every payload of `payloads` (any iterable of bytes-like) now; one future for all.

        The future's result is the list of entry ids, in the payloads' order
        (consecutive ids). Bad input (a payload that is not bytes-like or too
        large) fails the future before anything is added. If some adds fail
        the future raises AddBatchError: the acknowledged ids, the failed ids
        and how many payloads were never added; each add is reported once.
        Cancelling the future does not take back adds already made."""
        batch = AddBatch()
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

    def _check(self, data) -> None:
        """Raise what _add would for `data` as a payload, without adding it."""
        if type(data) is bytes:
            n = len(data)
        elif isinstance(data, (bytearray, memoryview)):
            n = memoryview(data).nbytes
        else:
            raise IncorrectParameterError(f"entry data must be bytes-like, not {type(data).__name__}")
        if n > self.max_payload_bytes:
            self.raise_too_large(n)

    def checked_payload(self, data):
        """`data` as bytes once the checks of an add passed: the handle takes adds (else
        raise_refused raises), the payload is bytes-like and not too large. For adds framed
        outside the core (LedgerHandleAdv)."""
        if self.refuse is not None or self.bk.closed:
            self.raise_refused()
        if type(data) is not bytes:
            if not isinstance(data, (bytearray, memoryview)):
                raise IncorrectParameterError(f"entry data must be bytes-like, not {type(data).__name__}")
            data = bytes(data)
        if len(data) > self.max_payload_bytes:
            self.raise_too_large(len(data))
        return data

    def _add(self, data, callback):
        data = self.checked_payload(data)
        n = len(data)
        entry_id = self.last_add_pushed + 1
        self.last_add_pushed = entry_id
        length = self.length_pushed = self.length_pushed + n
        lac = self.lac if self.fixed_lac is None else self.fixed_lac
        if self.frame_small is not None and n <= self.frame_small_max:  # AddFramer.frame's own test
            frame = self.frame_small(self.add_header, self.master_key, self.ledger_id, entry_id, lac, length, data)
        else:
            frame = self.framer.frame(entry_id, lac, length, data)
        if callback is None:
            result = self.loop.create_future()
            op = PendingAdd(entry_id, frame, result, length)
        else:
            result = entry_id
            op = PendingAdd(entry_id, frame, None, length, callback)
        self.pending.append(op)
        if not self.failed_bookies:  # the common case: every bookie of the write set is up
            op.sent = True
            for client, respond in self.write_sets[entry_id % self.ensemble_size]:
                client.send_add(frame, self.ledger_id, entry_id, respond)
        else:
            self.send_again(op, self.write_set_indexes[entry_id % self.ensemble_size])
        return result

    def add_response(self, bookie: str, response, err) -> None:
        """A bookie's answer to an ADD (an AddResponder per bookie calls it)."""
        if err is not None or response.rc != 0:
            self.add_failure(bookie, response, err)
            return
        pending = self.pending
        if not pending:
            return  # already completed or failed
        head = pending[0]
        k = response.entry_id - head.entry_id
        if k < 0:
            return  # already completed or failed
        op = pending[k] if k < len(pending) else None
        if op is None or op.entry_id != response.entry_id:  # ids with gaps: create_ledger_adv's
            op = self._find(response.entry_id, min(k, len(pending) - 1))
            if op is None:
                return  # already failed, or never added
        i = self.index.get(bookie)
        if i is None or bookie in self.failed_bookies or (i - op.entry_id) % self.ensemble_size >= self.write_quorum_size:
            return  # an answer from a bookie that is (being) replaced
        bit = 1 << i  # op.ack(i), inlined
        if not op.acked & bit:
            op.acked |= bit
            op.ack_count += 1
        if op is head and op.ack_count >= self.ack_quorum_size:
            self.deliver()

    def _find(self, entry_id: int, start: int):
        """The pending add of `entry_id` when ids have gaps (chosen ids): pending is sorted by id with
        no duplicates, so its index is at most `start` = entry_id - head id."""
        pending = self.pending
        for i in range(start, -1, -1):
            op = pending[i]
            if op.entry_id <= entry_id:
                return op if op.entry_id == entry_id else None
        return None

    def deliver(self) -> None:
        """Complete the acknowledged prefix of the pending adds, in entry-id order."""
        if self.changing:
            return
        pending, aq = self.pending, self.ack_quorum_size
        # the head completes once acknowledged and (chosen ids) every id before it was added
        while pending and pending[0].ack_count >= aq and pending[0].entry_id == self.last_add_acked + 1:
            op = pending.popleft()
            entry_id = op.entry_id
            self.last_add_acked = entry_id
            self.length_acked = op.length
            if not self.deferred_sync:  # deferred sync: only LedgerHandle.force() moves the LAC
                self.lac = entry_id
                self.length_confirmed = op.length
            op.frame = None
            callback = op.callback
            if callback is None:
                op.complete(entry_id, None)
                continue
            op.callback = None  # the callback form, inlined (the hot one)
            try:
                callback(entry_id, None)
            except Exception:  # a caller's bug must not stop the other completions
                log.exception("add callback of entry %d failed", entry_id)
        if not pending:
            self.wake_drain()


class RequestCore:
    """The request path of one BookieClient, held by it (see the module docstring)."""

    __slots__ = ("bookie_id", "loop", "protocol", "connect_task", "sweep_handle", "pending", "queued", "out",
                 "out_bytes", "pending_count", "flush_scheduled", "closed", "add_timeout_s", "read_timeout_s",
                 "shortest_timeout_s", "refuse_closed", "queue", "arm_sweep", "start_connect", "key_for", "promote")

    def __init__(self, bookie_id, loop, add_timeout_s: float, read_timeout_s: float, *, refuse_closed, queue,
                 arm_sweep, start_connect, key_for, promote):
        self.bookie_id, self.loop = bookie_id, loop
        self.protocol = self.connect_task = self.sweep_handle = None
        self.add_timeout_s, self.read_timeout_s = float(add_timeout_s), float(read_timeout_s)
        self.shortest_timeout_s = min(self.add_timeout_s, self.read_timeout_s)
        self.pending: dict = {}
        self.queued: dict = {}
        self.out: list = []
        self.out_bytes = self.pending_count = 0
        self.flush_scheduled = self.closed = False
        self.refuse_closed, self.queue, self.arm_sweep = refuse_closed, queue, arm_sweep
        self.start_connect, self.key_for, self.promote = start_connect, key_for, promote

    def send_add(self, frame: bytes, ledger_id: int, entry_id: int, callback, timeout_s: float | None = None) -> None:
        """Send a complete ADD request frame (see ledger_handle's framing)."""
        self.send((ADD, ledger_id, entry_id), frame, callback,
                  self.add_timeout_s if timeout_s is None else timeout_s)

    def send(self, key: tuple, frame: bytes, callback, timeout_s: float) -> None:
        """Queue `frame`, answered under `key` by `callback(response, err)` within `timeout_s`."""
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
            if self.out_bytes >= EAGER_FLUSH_BYTES:
                self.flush()  # let the bookie start on this while we go on producing
            elif not self.flush_scheduled:
                self.flush_scheduled = True
                self.loop.call_soon(self.flush)
        elif self.connect_task is None:
            self.start_connect()

    def flush(self) -> None:
        """Write every queued frame now (one writelines)."""
        self.flush_scheduled = False
        protocol = self.protocol
        if protocol is None or not self.out:
            return
        out, self.out = self.out, []
        self.out_bytes = 0
        transport = protocol.transport
        # Closed, its connection_lost not delivered yet (a loop step later): that fails every
        # pending request, these included; writing would raise (uvloop) or vanish (asyncio).
        if not transport.is_closing():
            transport.writelines(out)

    def dispatch_all(self, protocol, items) -> None:
        """Answer the pending requests that the decoded messages `items` (from `protocol`) match."""
        if protocol is not self.protocol:
            return
        pending = self.pending
        for msg in items:
            if type(msg) is AddResponse:
                key = (ADD, msg.ledger_id, msg.entry_id)
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
            try:
                request[0](msg, None)
            except Exception:  # a caller's bug must not break the connection
                req_log.exception("request callback failed")
