"""Reading a range of entries as an async iterator, with read-ahead.

    async for entry in rh.read_entries_iter(0, rh.last_add_confirmed):
        handle(entry.entry_id, entry.data)

The range is read in chunks of `chunk_entries` (each a ReadRangeOp: a window
of entry or batch reads over the replicas, exactly as `read_entries`), and
`read_ahead` chunks are in flight while the caller consumes the current one.
An entry that is already here is handed out without a future or a loop step
(the awaitable `__anext__` returns is already done); only reaching the end
of a chunk that has not arrived waits.

Bounds. `last=None` means the last entry readable when the iterator is made
(a closed ledger's lastEntryId, an open ledger's LAC as this handle knows
it). A `last` beyond that on a ledger that is still being written makes a
tailing reader: once it has read up to the LAC it asks the bookies for a newer
one (`read_last_add_confirmed`), every `poll_interval_s` until the LAC reaches
`last`. If the ledger is (or becomes) closed short of `last`, the iterator
raises IncorrectParameterError: those entries will never exist.

Errors: a failed read raises from the `async for` when it reaches the chunk
of the entry that could not be read (every entry of the chunks before was
handed out); reads still in flight are dropped.
"""
from __future__ import annotations

import asyncio
from collections import deque

from bk import _native
from bk.errors import IncorrectParameterError

Ready = _native.load("core", "bk.client").Ready

DEFAULT_READ_AHEAD_CHUNKS = 4
DEFAULT_POLL_INTERVAL_S = 0.05


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()  # a dropped chunk's error is not "never retrieved"


class EntryIterator:
    __slots__ = ("_rh", "_next_read", "_next_out", "_last", "_chunk", "_ahead", "_poll_s", "_chunks", "_buf",
                 "_pos")

    def __init__(self, rh, first: int, last: int | None, *, chunk_entries: int | None = None,
                 read_ahead: int = DEFAULT_READ_AHEAD_CHUNKS, poll_interval_s: float = DEFAULT_POLL_INTERVAL_S):
        bound = rh._last_readable()
        if last is None:
            last = bound
        if first < 0 or last < first - 1:
            raise IncorrectParameterError(f"ledger {rh.ledger_id}: bad entry range {first}..{last}")
        if rh.metadata.is_closed and last > bound:
            raise IncorrectParameterError(
                f"ledger {rh.ledger_id}: cannot read entries {first}..{last}: it is closed at entry {bound}")
        chunk = chunk_entries if chunk_entries is not None else rh._bk.read_window_entries
        if chunk < 1 or read_ahead < 1 or poll_interval_s <= 0:
            raise IncorrectParameterError("chunk_entries and read_ahead must be >= 1, poll_interval_s > 0")
        self._rh = rh
        self._next_read = first  # first entry id not yet asked for
        self._next_out = first  # first entry id not yet handed out
        self._last = last
        self._chunk = chunk
        self._ahead = read_ahead
        self._poll_s = poll_interval_s
        self._chunks: deque = deque()  # futures of lists of entries, in entry-id order
        self._buf: list | None = None
        self._pos = 0

    def __aiter__(self) -> "EntryIterator":
        return self

    def __anext__(self):
        buf = self._buf
        if buf is not None:
            entry = buf[self._pos]
            self._pos += 1
            if self._pos == len(buf):
                self._buf = None
            self._next_out += 1
            return Ready(entry)
        return self._next_chunk()

    def _fill(self) -> None:
        """Ask for chunks up to the read-ahead, within what is readable now."""
        rh = self._rh
        bound = min(self._last, rh._last_readable())
        while len(self._chunks) < self._ahead and self._next_read <= bound:
            first = self._next_read
            last = min(first + self._chunk - 1, bound)
            future = rh._range_op(first, last).start()
            future.add_done_callback(_retrieve)
            self._chunks.append(future)
            self._next_read = last + 1

    async def _next_chunk(self):
        while True:
            if self._next_out > self._last:
                self._drop()
                raise StopAsyncIteration
            self._fill()
            if self._chunks:
                future = self._chunks[0]
                try:
                    entries = await future
                except BaseException:
                    self._drop()
                    raise
                self._chunks.popleft()
                self._fill()  # the next chunk goes out before the caller consumes this one
                if len(entries) > 1:
                    self._buf, self._pos = entries, 1
                self._next_out += 1
                return entries[0]
            await self._wait_for_lac()

    async def _wait_for_lac(self) -> None:
        """Tailing: everything up to the LAC was read; wait until the LAC moves (or the ledger closes)."""
        rh = self._rh
        while True:
            lac = await rh.read_last_add_confirmed()
            if lac >= self._next_read:
                return
            if rh.metadata.is_closed:
                raise IncorrectParameterError(
                    f"ledger {rh.ledger_id} was closed at entry {lac}: entries {self._next_read}..{self._last}"
                    " will never exist")
            await asyncio.sleep(self._poll_s)

    def _drop(self) -> None:
        for future in self._chunks:
            future.cancel()
        self._chunks.clear()
        self._buf = None

    async def aclose(self) -> None:
        """Stop early: drop the reads in flight."""
        self._drop()
        self._next_out = self._last + 1
