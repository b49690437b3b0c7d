"""LedgerWriter: adds through a bounded window, the asyncio way.

    async with lh.writer(max_in_flight=1000) as w:
        for record in records:
            await w.add(record)          # waits only while 1000 adds are unacknowledged
    # here every add is acknowledged, or the block raised the first failure

`w.add(data)` returns an awaitable of the entry id the add got (not of its
acknowledgement). While fewer than `max_in_flight` adds are unacknowledged the
add is sent at once and the awaitable is already done (awaiting it takes no
loop step and makes no future); otherwise the add waits its turn, in call
order, and is sent when an earlier one completes.

Errors. Adds complete through the ledger's callback path; the first failure is
kept and raised by the next `add()` (and by every later one: after a failure the
ledger takes no more adds) and by `flush()`/leaving the block if no `add()`
raised it yet. `acknowledged` counts the adds that succeeded and
`last_acknowledged_entry_id` names the last (completions come in entry-id
order, so every id up to it that this writer added was acknowledged).

Cancellation. An `add()` cancelled while it waits for room was not sent (its
payload is not in the ledger). An add that was sent cannot be taken back:
leaving the block (also by an exception or a cancellation in the body) waits
for every sent add to complete; adds still waiting for room are dropped.
The writer never closes the ledger.
"""
from __future__ import annotations

from bk import _native
from bk.errors import IncorrectParameterError

AddWindow = _native.load("core", "bk.client").AddWindow


class LedgerWriter:
    """`add` is the window's own method (bk/client/_core.pyx AddWindow, twin core_py.py): a call
    goes straight into the compiled core; this class adds the waiting and the context manager."""

    __slots__ = ("_lh", "_window", "add")

    def __init__(self, lh, max_in_flight: int = 1000):
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise IncorrectParameterError(f"max_in_flight must be a positive int, got {max_in_flight!r}")
        self._lh = lh
        self._window = AddWindow(lh._core, max_in_flight)
        self.add = self._window.add  # add(data): see the module docstring

    @property
    def in_flight(self) -> int:
        """Adds sent and not yet completed."""
        return self._window.in_flight

    @property
    def waiting(self) -> int:
        """Adds waiting for room in the window (not sent)."""
        return len(self._window.waiters)

    @property
    def acknowledged(self) -> int:
        """Adds of this writer that succeeded."""
        return self._window.acknowledged

    @property
    def last_acknowledged_entry_id(self) -> int | None:
        return self._window.last_acknowledged_entry_id

    async def flush(self) -> None:
        """Wait until every add sent so far completed (adds waiting for room are sent meanwhile);
        raise the first failure if no add() raised it yet."""
        w = self._window
        while w.in_flight or w.waiters:
            if not w.in_flight:  # waiters with nothing in flight: only after a failure
                w.admit()
                continue
            w.drained = w.loop.create_future()
            try:
                await w.drained
            finally:
                w.drained = None
        if w.error is not None and not w.reported:
            w.reported = True
            raise w.error

    async def close(self) -> None:
        """No more adds; wait for the ones sent (see flush)."""
        self._window.closed = True
        await self.flush()

    async def __aenter__(self) -> "LedgerWriter":
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        w = self._window
        w.closed = True
        if exc_type is not None:  # the body failed: what waits for room is not sent; what was sent completes
            for future, _ in w.waiters:
                future.cancel()
            w.waiters.clear()
            w.reported = True  # the body's own exception is the one that propagates
        await self.flush()
