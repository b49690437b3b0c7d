"""LedgerHandleAdv: a writer that chooses its entry ids (BookKeeper's createLedgerAdv).

    lh = await bkc.create_ledger_adv(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2,
                                     password=b"secret")           # ledger_id=... to choose it too
    await asyncio.gather(lh.add_entry(1, b"b"), lh.add_entry(0, b"a"))   # any order
    await lh.close()

The caller names each entry: `add_entry(entry_id, data)` (BookKeeper's addEntry(entryId, data),
WriteAdvHandle.write(entryId, data)), `async_add_entry(entry_id, data, callback=None)`. The
plain `add_entry(data)` shape of LedgerHandle does not exist here (a TypeError), nor do
`add_entries` and `writer()`, which hand out ids themselves (BookKeeper: IllegalOpException).

Order and the LAC. Adds may be called in any order and are sent at once. As in BookKeeper
(its pendingAddOps is a priority queue by id), completions come in entry-id order: entry e
completes once AQ bookies stored it AND every id below it completed, so the LAC advances over
the contiguous acknowledged prefix only. `await lh.add_entry(5, x)` alone therefore waits until
0..4 are added and acknowledged: start the adds, then await them (gather, callbacks).

Refused at the call, nothing sent (DuplicateEntryIdError, as BookKeeper's
DuplicateEntryIdException): an id already pending on this handle, or at or below its
acknowledged prefix. A negative id or bad data is IncorrectParameterError.

Length. Each entry is framed with the ledger length counted in call order (as BookKeeper's
addToLength); the length the ledger closes with is the sum of the payloads of 0..LAC, kept
here as entries complete.

Close waits for the pending adds that can complete. An add stuck behind an id that was never
added cannot: it fails with LedgerClosedError (outcome_unknown False: the ledger closes at
its LAC, below it, so it is certainly not in the ledger). Ensemble changes, deferred sync,
fencing and recovery are LedgerHandle's (the core finds an answer's add with gaps in the ids).
"""
from __future__ import annotations

import asyncio
import bisect

from bk import _native
from bk.errors import DuplicateEntryIdError, IncorrectParameterError, LedgerClosedError

from .ledger_handle import LedgerHandle, _error

PendingAdd = _native.load("core", "bk.client").PendingAdd
MAX_ENTRY_ID = 2**63 - 1
_CLOSE_POLL_S = 0.005  # close(): how often it looks whether every pending add is acknowledged


def _entry_id_of(op) -> int:
    return op.entry_id


class _Completion:
    """An add's completion: counts its payload into the handle's length, then reports through
    `then` (a PendingAdd holding the caller's future or callback). Runs right after the core set
    `length_acked`/`length_confirmed` from the add's call-order length, and puts the id-order sum
    there instead."""

    __slots__ = ("lh", "size", "then")

    def __init__(self, lh: "LedgerHandleAdv", size: int, then):
        self.lh, self.size, self.then = lh, size, then

    def __call__(self, entry_id: int, err) -> None:
        if err is None:
            lh = self.lh
            lh._acked_bytes += self.size
            core = lh._core
            core.length_acked = lh._acked_bytes
            if not core.deferred_sync:
                core.length_confirmed = lh._acked_bytes
        self.then.complete(entry_id, err)


class LedgerHandleAdv(LedgerHandle):
    """A LedgerHandle whose adds name their entry id (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in ("async_add_entry", "add_entry", "add_entries"):  # LedgerHandle binds its core's
            self.__dict__.pop(name, None)
        self._acked_bytes = self._core.length_acked

    def async_add_entry(self, entry_id: int, data, callback=None):
        """Start the add of `entry_id`: with `callback`, `callback(entry_id, err)` later (in id
        order) and the id now; without, the future of the id. Refusals raise here."""
        return self._add_at(entry_id, data, callback)

    def add_entry(self, entry_id: int, data) -> asyncio.Future:
        """`await lh.add_entry(entry_id, data)` is `entry_id` once AQ bookies stored it and every
        lower id completed. The add starts at the call; a refusal raises when awaited."""
        try:
            return self._add_at(entry_id, data, None)
        except Exception as e:
            future = self._loop.create_future()
            future.set_exception(e)
            return future

    def add_entries(self, payloads):
        raise IncorrectParameterError(f"ledger {self.ledger_id} was created with create_ledger_adv: each add names"
                                      " its entry id (add_entry(entry_id, data))")

    def writer(self, max_in_flight: int = 1000):
        raise IncorrectParameterError(f"ledger {self.ledger_id} was created with create_ledger_adv: the windowed"
                                      " writer hands out ids itself; use add_entry(entry_id, data)")

    def _add_at(self, entry_id, data, callback):
        core = self._core
        data = core.checked_payload(data)  # refused handle, payload type and size: as every add
        if isinstance(entry_id, bool) or not isinstance(entry_id, int) or not 0 <= entry_id <= MAX_ENTRY_ID:
            raise IncorrectParameterError(f"entry id must be an int in 0..{MAX_ENTRY_ID}, got {entry_id!r}")
        n = len(data)
        pending = core.pending
        i = bisect.bisect_left(pending, entry_id, key=_entry_id_of)
        if entry_id <= core.last_add_acked or (i < len(pending) and pending[i].entry_id == entry_id):
            raise DuplicateEntryIdError(
                f"ledger {self.ledger_id}: entry {entry_id} was added already on this handle (the acknowledged"
                f" prefix ends at {core.last_add_acked}; {len(pending)} adds pending): not sent")
        core.length_pushed += n
        frame = self._framer.frame(entry_id, core.lac if core.fixed_lac is None else core.fixed_lac,
                                   core.length_pushed, data)
        future = self._loop.create_future() if callback is None else None
        then = PendingAdd(entry_id, None, future, 0, callback)
        op = PendingAdd(entry_id, frame, None, core.length_pushed, _Completion(self, n, then))
        pending.insert(i, op)
        if entry_id > core.last_add_pushed:
            core.last_add_pushed = entry_id
        self._send(op, core.write_set_indexes[entry_id % core.ensemble_size])
        return entry_id if callback is not None else future

    async def _drain(self) -> None:
        """close(): wait until every pending add completed, failed, or is acknowledged but stuck behind
        an id never added; fail the stuck ones (the ledger closes below them)."""
        core = self._core
        while self._change_task is not None or any(op.ack_count < self._AQ for op in core.pending):
            await asyncio.sleep(_CLOSE_POLL_S)
        stuck = list(core.pending)
        core.pending.clear()
        for op in stuck:
            op.frame = None
            op.complete(op.entry_id, _error(
                LedgerClosedError, f"ledger {self.ledger_id} closed at entry {core.last_add_acked}: entry"
                f" {core.last_add_acked + 1} was never added, so entry {op.entry_id} (stored on its bookies) is not"
                " in the ledger", self.ledger_id, op.entry_id, False))
