"""The client's add path in pure Python: the twin of `bk/client/_core.pyx`.

Both modules define the same four names with the same behaviour; `bk.client`
takes the compiled one unless `BK_NO_NATIVE=1` (bk._native.load_core):

- `PendingAdd`: one entry between `async_add_entry` and its completion.
- `AddCore`: the per-add part of LedgerHandle (it is LedgerHandle's first
  base class): `async_add_entry`, `_add_response` (an EOK answer: the ack),
  `_deliver` (in-order completion). Everything rarer - refusals, a bookie's
  failure, ensemble change, close - is LedgerHandle's Python, which the core
  calls by name: `_raise_refused`, `_too_large`, `_send`, `_add_failure`,
  `_wake_drain`.
- `RequestCore`: the per-request part of BookieClient (its first base class):
  `send_add`, `_send`, `_flush`, `_dispatch_all`. It calls BookieClient's
  `_refuse_closed`, `_queue`, `_arm_sweep`, `_start_connect`, `_key_for`,
  `_promote`.
- `AddResponder(core, bookie)`: the callback a BookieClient gets for an ADD of
  `core`'s ledger sent to `bookie`; `responder(response, err)` is
  `core._add_response(bookie, response, err)`. The compiled RequestCore
  recognises it and calls the core directly.

The ledger's hot state lives in the core's attributes (`_pending`, `_lac`,
`_last_add_pushed`, `_length_pushed`, `_length_confirmed`, `_E/_WQ/_AQ`,
`_write_sets`, `_failed_bookies`, `_changing`, ...): LedgerHandle's Python
reads and writes the same attributes, so both halves see one state.
"""
from __future__ import annotations

import logging
from functools import partial

from bk.errors import IncorrectParameterError
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
    return partial(core._add_response, bookie)


class AddCore:
    """The add path of LedgerHandle (see the module docstring)."""

    def async_add_entry(self, data, callback=None):
        """Start an add without waiting (pipelining).

        Without `callback`: returns the future of the entry id. With `callback`
        (no future is made: the cheapest way to keep thousands of adds in
        flight): returns the entry id at once and later calls, on the event loop
        and in entry-id order, `callback(entry_id, None)` once AQ bookies stored
        it or `callback(entry_id, error)` if it failed. Either way an add that
        cannot start (closed handle, fenced writer, bad data) raises here.
        """
        if self._refuse is not None or self._bk.closed:
            self._raise_refused()
        if type(data) is not bytes:
            if not isinstance(data, (bytearray, memoryview)):
                raise IncorrectParameterError(f"entry data must be bytes-like, not {type(data).__name__}")
            data = bytes(data)
        n = len(data)
        if n > self._max_payload_bytes:
            self._too_large(n)
        entry_id = self._last_add_pushed + 1
        self._last_add_pushed = entry_id
        length = self._length_pushed = self._length_pushed + n
        lac = self._lac if self._fixed_lac is None else self._fixed_lac
        if self._frame_small is not None and n <= self._frame_small_max:  # AddFramer.frame's own test
            frame = self._frame_small(self._add_header, self._master_key, self.ledger_id, entry_id, lac, length, data)
        else:
            frame = self._framer.frame(entry_id, lac, length, data)
        if callback is None:
            result = self._loop.create_future()
            op = PendingAdd(entry_id, frame, result, length)
        else:
            result = entry_id
            op = PendingAdd(entry_id, frame, None, length, callback)
        self._pending.append(op)
        if not self._failed_bookies:  # the common case: every bookie of the write set is up
            op.sent = True
            for client, respond in self._write_sets[entry_id % self._E]:
                client.send_add(frame, self.ledger_id, entry_id, respond)
        else:
            self._send(op, self._write_set_indexes[entry_id % self._E])
        return result

    def _add_response(self, bookie: str, response, err) -> None:
        """A bookie's answer to an ADD (an AddResponder per bookie calls it)."""
        if err is not None or response.rc != 0:
            self._add_failure(bookie, response, err)
            return
        pending = self._pending
        if not pending:
            return  # already completed or failed
        k = response.entry_id - pending[0].entry_id
        if k < 0 or k >= len(pending):
            return  # already completed or failed
        op = pending[k]
        i = self._index.get(bookie)
        if i is None or bookie in self._failed_bookies or (i - op.entry_id) % self._E >= self._WQ:
            return  # an answer from a bookie that is (being) replaced
        bit = 1 << i  # op.ack(i), inlined
        if not op.acked & bit:
            op.acked |= bit
            op.ack_count += 1
        if k == 0 and op.ack_count >= self._AQ:
            self._deliver()

    def _deliver(self) -> None:
        """Complete the acknowledged prefix of the pending adds, in entry-id order."""
        if self._changing:
            return
        pending, aq = self._pending, self._AQ
        while pending and pending[0].ack_count >= aq:
            op = pending.popleft()
            entry_id = op.entry_id
            self._lac = entry_id
            self._length_confirmed = op.length
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
            self._wake_drain()


class RequestCore:
    """The request path of BookieClient (see the module docstring)."""

    def send_add(self, frame: bytes, ledger_id: int, entry_id: int, callback, timeout_s: float | None = None) -> None:
        """Send a complete ADD request frame (see ledger_handle's framing)."""
        self._send((ADD, ledger_id, entry_id), frame, callback,
                   self.add_timeout_s if timeout_s is None else timeout_s)

    def _send(self, key: tuple, frame: bytes, callback, timeout_s: float) -> None:
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
            if self._out_bytes >= EAGER_FLUSH_BYTES:
                self._flush()  # let the bookie start on this while we go on producing
            elif not self._flush_scheduled:
                self._flush_scheduled = True
                self._loop.call_soon(self._flush)
        elif self._connect_task is None:
            self._start_connect()

    def _flush(self) -> None:
        self._flush_scheduled = False
        protocol = self._protocol
        if protocol is None or not self._out:
            return
        out, self._out = self._out, []
        self._out_bytes = 0
        protocol.transport.writelines(out)

    def _dispatch_all(self, protocol, items) -> None:
        if protocol is not self._protocol:
            return
        pending = self._pending
        for msg in items:
            if type(msg) is AddResponse:
                key = (ADD, msg.ledger_id, msg.entry_id)
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
            try:
                request[0](msg, None)
            except Exception:  # a caller's bug must not break the connection
                req_log.exception("request callback failed")
