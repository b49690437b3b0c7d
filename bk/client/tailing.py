"""Reading a ledger while it is written: BookKeeper's readUnconfirmed, tryReadLastAddConfirmed,
readExplicitLastConfirmed, readLastAddConfirmedAndEntry, and a tailing reader.

    rh = await bkc.open_ledger(ledger_id, password=pw, recovery=False)   # no fencing
    async with rh.tail(0) as entries:
        async for entry in entries:      # every entry once, in order, as it is confirmed
            handle(entry.entry_id, entry.data)
    # the loop ends after the writer closed the ledger and its last entry was handed out

The functions here are ReadHandle's methods of the same names (read_handle.py
forwards to them); the bookie-level ops are bk/client/lac_ops.py.

What a reader may read. Entries up to the LAC are acknowledged; the LAC a
reader learns from any bookie is a lower bound of the writer's (it was stamped
by the writer), so every LAC here only grows. Entries past it
(`read_unconfirmed`) may never be acknowledged, and a ledger closed by
recovery may end before them. The segments that hold entries up to a learnt
LAC are in the metadata store (a writer stores a segment before any entry of it
is acknowledged), so after learning a LAC the handle's metadata is re-read
before entries up to it are read; the tailing reader keeps it current with a
watch instead and re-reads it when a read fails, so a read never trusts a
stale ensemble (digests make a wrong bookie's answer fail, never wrong).

Waiting. On the v3 protocol the tailing reader waits with long polls (the
bookie answers when its LAC passes the one asked about, usually with the next
entry in the answer); on v2, which has no long poll, it polls: READ_LAC every
`poll_interval_s`, which also returns the explicit LAC (an idle writer with
`explicit_lac_interval_ms` set makes its last entry visible that way). A metadata
change (an ensemble change, the writer's close) interrupts the wait: the next
wait asks the new ensemble, and once the ledger is closed the reader reads up to
its last entry and ends.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque

from bk.errors import BKError, BookieIOError, IncorrectParameterError, NoSuchLedgerMetadataError

from .lac_ops import LastConfirmedAndEntry, LongPollOp, read_lac_quorum, try_read_lac

log = logging.getLogger(__name__)

DEFAULT_LONG_POLL_TIMEOUT_MS = 5000
DEFAULT_TAIL_POLL_INTERVAL_S = 0.05
DEFAULT_TAIL_BATCH_ENTRIES = 256
READ_RETRIES = 3  # reads of a tailing reader retried after re-reading the metadata
WAIT_FAILURES = 8  # waits in a row that no bookie answered before the tailing reader gives up


def _entry_id(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise IncorrectParameterError(f"{name} must be an int >= 0, got {value!r}")
    return value


async def refresh_metadata(rh) -> None:
    metadata, version = await rh._bk.ledger_manager.read_ledger_metadata(rh.ledger_id)
    rh._update_metadata(metadata, version)


async def _learn(rh, lac: int | None) -> int:
    """Take a LAC learnt from the bookies; the metadata is re-read first when it moved (docstring)."""
    if lac is not None and lac > rh._last_readable() and not rh.metadata.is_closed:
        await refresh_metadata(rh)
        rh._learn_lac(lac)
    return rh._last_readable()


def _raise_if_nobody(rh, answers) -> None:
    if answers.lac is None and not answers.negative and answers.errors:
        detail = "; ".join(f"{b}: {e}" for b, e in answers.errors)
        raise BookieIOError(f"ledger {rh.ledger_id}: no bookie of the last segment answered ({detail})",
                            ledger_id=rh.ledger_id)


# ---------------------------------------------------------------- ReadHandle's methods
async def read_unconfirmed(rh, first_entry_id: int, last_entry_id: int) -> list:
    """Entries first..last read without checking the LAC: the entries past it may never be
    acknowledged (BookKeeper's readUnconfirmed). A closed ledger is still read only up to its last
    entry. An entry no replica has raises NoSuchEntryError, after the metadata was re-read in case
    the writer moved to a new ensemble."""
    first = _entry_id("first_entry_id", first_entry_id)
    last = _entry_id("last_entry_id", last_entry_id)
    if last < first:
        raise IncorrectParameterError(f"ledger {rh.ledger_id}: bad entry range {first}..{last}")
    for attempt in (0, 1):
        md = rh.metadata
        if md.is_closed and last > md.last_entry_id:
            raise IncorrectParameterError(f"ledger {rh.ledger_id}: cannot read entries {first}..{last}: it is"
                                          f" closed at entry {md.last_entry_id}")
        try:
            return await rh._read_range(first, last)
        except BKError:
            if attempt or md.is_closed:
                raise
            version = rh._version
            await refresh_metadata(rh)
            if rh._version == version:
                raise


async def try_read_last_add_confirmed(rh) -> int:
    """The LAC from the first bookie that knows one above the handle's (BookKeeper's
    tryReadLastAddConfirmed: no quorum); the handle's LAC when none does."""
    if rh.metadata.is_closed:
        return rh.metadata.last_entry_id
    answers = await try_read_lac(rh._bk.pool, rh._digest, rh.metadata.last_segment[1], rh._last_readable())
    _raise_if_nobody(rh, answers)
    return await _learn(rh, answers.lac)


async def read_explicit_lac(rh) -> int:
    """READ_LAC to the last segment's bookies until they cover the ensemble: the highest of the
    explicit LACs (a writer's WRITE_LAC) and the LACs piggybacked on their last entries
    (BookKeeper's readExplicitLastConfirmed). A closed ledger's last entry id."""
    if rh.metadata.is_closed:
        return rh.metadata.last_entry_id
    md = rh.metadata
    answers = await read_lac_quorum(rh._bk.pool, rh._digest, md.last_segment[1], md.ack_quorum_size,
                                    explicit=True)
    _raise_if_nobody(rh, answers)
    return await _learn(rh, answers.lac)


def _long_poll(rh, entry_id: int, timeout_ms: int, parallel: bool) -> LongPollOp:
    md = rh.metadata
    return LongPollOp(rh._bk.pool, rh._digest, md.last_segment[1], md.ack_quorum_size, entry_id,
                      rh._last_readable(), timeout_ms, parallel, rh._bk.speculative_read_lac_policy)


def _long_polls(rh) -> bool:
    """Long polls are v3 only (BookKeeper's v2 protocol has none)."""
    return rh._bk.wire.protocol == "v3"


async def read_last_add_confirmed_and_entry(rh, entry_id: int, timeout_ms: int,
                                            parallel: bool = False) -> LastConfirmedAndEntry:
    """BookKeeper's readLastAddConfirmedAndEntry: the LAC and entry `entry_id` once it is confirmed,
    waiting up to `timeout_ms` for it (v3: one long poll; v2: polling READ_LAC); after the wait the
    entry is None if it is not confirmed yet. `parallel` asks every bookie at once."""
    entry_id = _entry_id("entry_id", entry_id)
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 0:
        raise IncorrectParameterError(f"timeout_ms must be an int >= 0, got {timeout_ms!r}")
    md = rh.metadata
    if md.is_closed and entry_id > md.last_entry_id:
        return LastConfirmedAndEntry(md.last_entry_id, None)
    entry = None
    if entry_id > rh._last_readable():
        if _long_polls(rh):
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_ms / 1000.0
            while True:
                op = _long_poll(rh, entry_id, timeout_ms, parallel)
                result = await op.run()
                entry, lac = result.entry, result.last_add_confirmed
                left_ms = int((deadline - loop.time()) * 1000)
                if entry is not None or lac >= entry_id or not op.negatives or left_ms <= 0:
                    break
                # the bookies hold nothing of the ledger yet, so they did not wait: wait here
                await asyncio.sleep(min(DEFAULT_TAIL_POLL_INTERVAL_S, left_ms / 1000.0))
                timeout_ms = max(0, int((deadline - loop.time()) * 1000))
        else:
            lac = await _poll_until(rh, entry_id, timeout_ms)
        await _learn(rh, lac)
    if entry is None and entry_id <= rh._last_readable():
        entry = await rh.read_entry(entry_id)
    return LastConfirmedAndEntry(rh._last_readable(), entry)


async def _poll_until(rh, entry_id: int, timeout_ms: int) -> int:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_ms / 1000.0
    while True:
        lac = await read_explicit_lac(rh)
        if lac >= entry_id or rh.metadata.is_closed or loop.time() >= deadline:
            return lac
        await asyncio.sleep(min(DEFAULT_TAIL_POLL_INTERVAL_S, max(0.0, deadline - loop.time())))


# ---------------------------------------------------------------- the tailing reader
class TailingReader:
    """`async for entry in rh.tail(from_entry)`: the module docstring. `long_polls` and `polls`
    count the waits of each kind, `metadata_changes` the watch's notifications. It holds a watch on
    the ledger's metadata until the loop ends: a caller that leaves the loop early uses
    `async with rh.tail(...)` or calls `aclose()` (else the watch lives until the client closes)."""

    def __init__(self, rh, from_entry: int, *, long_poll_timeout_ms: int = DEFAULT_LONG_POLL_TIMEOUT_MS,
                 poll_interval_s: float = DEFAULT_TAIL_POLL_INTERVAL_S, parallel: bool = False,
                 batch_entries: int = DEFAULT_TAIL_BATCH_ENTRIES):
        from_entry = _entry_id("from_entry", from_entry)
        if long_poll_timeout_ms <= 0 or poll_interval_s <= 0 or batch_entries < 1:
            raise IncorrectParameterError("long_poll_timeout_ms, poll_interval_s and batch_entries must be > 0")
        self._rh = rh
        self._next = from_entry  # the next entry id to hand out; nothing below it is handed out again
        self._timeout_ms = int(long_poll_timeout_ms)
        self._poll_s = float(poll_interval_s)
        self._parallel = parallel
        self._batch = batch_entries
        self._buf: deque = deque()
        self._watch = None
        self._changed = asyncio.Event()
        self._deleted = False
        self._closed = False
        self.long_polls = 0
        self.polls = 0
        self.metadata_changes = 0

    @property
    def next_entry_id(self) -> int:
        return self._next - len(self._buf)

    def __aiter__(self) -> "TailingReader":
        return self

    async def __aenter__(self) -> "TailingReader":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop: the metadata watch ends; waits in flight are dropped."""
        self._closed = True
        self._buf.clear()
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    async def __anext__(self):
        if self._buf:
            return self._buf.popleft()
        if self._closed:
            raise StopAsyncIteration
        rh = self._rh
        if self._watch is None and not rh.metadata.is_closed:
            self._watch = await rh._bk.ledger_manager.watch_ledger_metadata(rh.ledger_id, self._on_metadata)
        failures = 0
        while True:
            if self._deleted:
                await self.aclose()
                raise NoSuchLedgerMetadataError(f"ledger {rh.ledger_id} was deleted while it was tailed")
            bound = rh._last_readable()
            if self._next <= bound:
                last = min(bound, self._next + self._batch - 1)
                entries = await self._read(self._next, last)
                self._next = last + 1
                self._buf.extend(entries[1:])
                return entries[0]
            if rh.metadata.is_closed:  # read up to its last entry: the end
                await self.aclose()
                raise StopAsyncIteration
            try:
                entry = await self._wait()
            except BKError as e:
                failures += 1
                if failures >= WAIT_FAILURES or rh._bk.closed:
                    raise
                log.info("ledger %d: tailing reader: %s; re-reading the metadata", rh.ledger_id, e)
                await asyncio.sleep(min(0.05 * 2 ** failures, 1.0))
                await refresh_metadata(rh)
                continue
            failures = 0
            if entry is not None:
                self._next += 1
                return entry

    def _on_metadata(self, metadata, version) -> None:
        self.metadata_changes += 1
        if metadata is None:
            self._deleted = True
        else:
            self._rh._update_metadata(metadata, version)
        self._changed.set()

    async def _read(self, first: int, last: int) -> list:
        for attempt in range(READ_RETRIES):
            try:
                return await self._rh.read_entries(first, last)
            except BKError as e:
                if attempt == READ_RETRIES - 1:
                    raise
                log.info("ledger %d: tailing reader: reading %d..%d: %s; re-reading the metadata",
                         self._rh.ledger_id, first, last, e)
                await refresh_metadata(self._rh)

    async def _wait(self):
        """Wait for the LAC to pass the next entry, a metadata change, or the wait's end; returns
        the next entry when the bookie's answer carried it."""
        self._changed.clear()
        if _long_polls(self._rh):
            self.long_polls += 1
            op = _long_poll(self._rh, self._next, self._timeout_ms, self._parallel)
            waiting = asyncio.ensure_future(op.run())
        else:
            self.polls += 1
            op = None
            waiting = asyncio.ensure_future(self._poll())
        changed = asyncio.ensure_future(self._changed.wait())
        try:
            await asyncio.wait((waiting, changed), return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
            if not waiting.done():
                waiting.cancel()  # a long poll's late answer is dropped
        if not waiting.done() or waiting.cancelled():
            return None  # the metadata changed: look again
        rh = self._rh
        result = waiting.result()  # raises BKError when no bookie answered
        if op is None:
            rh._learn_lac(result)
            return None
        rh._learn_lac(result.last_add_confirmed)
        if op.negatives and result.entry is None and result.last_add_confirmed < self._next:
            await asyncio.sleep(self._poll_s)  # no entry on the bookies yet: they answer without waiting
        if op.errors or result.last_add_confirmed < self._next:
            # a bookie failed (the writer may have replaced it) or the wait timed out (it may
            # have closed the ledger): the watch says so too, this covers a notification lost
            await refresh_metadata(rh)
        entry = result.entry
        return entry if entry is not None and entry.entry_id == self._next else None

    async def _poll(self) -> int:
        rh = self._rh
        md = rh.metadata
        answers = await read_lac_quorum(rh._bk.pool, rh._digest, md.last_segment[1], md.ack_quorum_size,
                                        explicit=True)
        _raise_if_nobody(rh, answers)
        if answers.lac is None or answers.lac < self._next:
            await asyncio.sleep(self._poll_s)
        return -1 if answers.lac is None else answers.lac
