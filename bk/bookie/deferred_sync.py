"""DeferredSyncTracker: what FORCE_LEDGER waits for on a bookie (BookKeeper's WriteFlag.DEFERRED_SYNC).

A v3 ADD with writeFlags DEFERRED_SYNC is acknowledged as soon as its entry is in the write
cache and its journal record is queued - before the journal's fsync (BookKeeper's Journal acks
such an entry once it is in the journal's buffer: ackBeforeSync). FORCE_LEDGER for a ledger then
answers once every deferred-sync record of that ledger queued before it is durable.

Invariant this relies on: a journal completes its records in queue order (groups are written
and fsynced in order, one completion call per group, in order; a failed journal fails every
queued record). So per journal a run of deferred-sync records gets the next sequence number
when it is queued (`logged`), and once the run with number s completed without error every
run of that journal up to s is durable (`synced[journal] >= s`).

A run that completes with an error marks its ledgers failed for good: their acknowledged
entries may be gone from the journal, so no later FORCE_LEDGER of them may say otherwise (it
raises that error: EIO on the wire). Ledgers whose last run is durable are forgotten, so the
tables hold only ledgers with journal writes in flight (and the failed ones).
"""
from __future__ import annotations

import asyncio

from bk.errors import BookieIOError


def _lost(ledger_id: int, err: BaseException) -> BookieIOError:
    return BookieIOError(f"ledger {ledger_id}: a journal write of its deferred-sync adds failed ({err}); entries"
                         " it acknowledged may be lost", ledger_id=ledger_id)


class DeferredSyncTracker:
    def __init__(self):
        self._issued: dict[int, int] = {}  # journal index -> sequence of its last deferred run queued
        self._synced: dict[int, int] = {}  # journal index -> highest sequence completed without error
        self._last: dict[int, tuple[int, int]] = {}  # ledger -> (journal index, its last run's sequence)
        self._failed: dict[int, BaseException] = {}  # ledger -> the journal error that hit a run of it
        self._waiters: list = []  # [journal index, sequence, ledger, future] of FORCE_LEDGERs waiting

    def logged(self, index: int, ledger_ids) -> tuple:
        """A run of deferred-sync records of `ledger_ids` was queued on journal `index`: the context
        for its completion (`done`)."""
        seq = self._issued[index] = self._issued.get(index, 0) + 1
        for ledger_id in ledger_ids:
            self._last[ledger_id] = (index, seq)
        return index, seq, tuple(ledger_ids)

    def done(self, ctx: tuple, exc: BaseException | None) -> None:
        """The journal's completion of a run (on the event loop)."""
        index, seq, ledger_ids = ctx
        if exc is not None:
            for ledger_id in ledger_ids:
                self._failed[ledger_id] = exc
        else:
            if seq > self._synced.get(index, 0):
                self._synced[index] = seq
            for ledger_id in ledger_ids:
                if self._last.get(ledger_id) == (index, seq):
                    del self._last[ledger_id]  # nothing of it waits for this journal any more
        if self._waiters:
            self._wake()

    def _wake(self) -> None:
        keep = []
        for waiter in self._waiters:
            index, seq, ledger_id, future = waiter
            if future.done():
                continue
            err = self._failed.get(ledger_id)
            if err is not None:
                future.set_exception(_lost(ledger_id, err))
            elif self._synced.get(index, 0) >= seq:
                future.set_result(None)
            else:
                keep.append(waiter)
        self._waiters = keep

    async def wait(self, ledger_id: int) -> None:
        """Return once every deferred-sync add of `ledger_id` acknowledged so far is durable in the
        journal; raise the journal's error if one of them may be lost."""
        err = self._failed.get(ledger_id)
        if err is not None:
            raise _lost(ledger_id, err)
        last = self._last.get(ledger_id)
        if last is None or self._synced.get(last[0], 0) >= last[1]:
            return
        future = asyncio.get_running_loop().create_future()
        self._waiters.append([last[0], last[1], ledger_id, future])
        await future
