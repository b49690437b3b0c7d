"""The bookie's reads (a part of Bookie: bk.bookie.bookie): entries, the LAC, long polls.

Rules kept here (REPLICATION.md): explicit negatives (ENOLEDGER/ENOENTRY) are never
answered for a ledger in limbo: there the bookie may have lost what is asked, so the answer
is EUNKNOWNLEDGERSTATE; a storage error is EIO, never "no such entry" (the reader asks
another replica).
"""
from __future__ import annotations

import asyncio
import logging

from bk import metrics
from bk.errors import (BadRequestError, BookieError, CorruptedStorageError, LedgerLimboError, NoSuchEntryError, NoSuchLedgerError,
                       StorageError)

log = logging.getLogger(__name__)


class ReadPath:
    """Bookie's reads. Uses the Bookie's storage, bookie_id, _ring and _read_threads (set by start)."""

    # ------------------------------------------------------------ LAC
    def read_lac(self, ledger_id: int) -> bytes | None:
        """The explicit LAC buffer last written, or None. In limbo the bookie may have lost a
        later one, so even a stored LAC is no answer: EUNKNOWNLEDGERSTATE."""
        desc = self._existing(ledger_id)
        if desc.limbo:
            raise LedgerLimboError(ledger_id=ledger_id)
        return desc.explicit_lac

    def last_add_confirmed(self, ledger_id: int) -> int:
        """The highest LAC piggybacked on any entry this bookie received (-1 if none)."""
        desc = self._existing(ledger_id)
        if desc.limbo:
            raise LedgerLimboError(ledger_id=ledger_id)
        return desc.lac

    def wait_for_lac_update(self, ledger_id: int, previous_lac: int, watcher):
        """BookKeeper's waitForLastAddConfirmedUpdate: `watcher(lac)` is called once, from the add
        path, when the ledger's LAC passes previous_lac (LedgerDescriptor.wait_for_lac_update).
        Returns the descriptor it waits on (cancel there), or None when the LAC already passed.
        Raises as last_add_confirmed does (ENOLEDGER; EUNKNOWNLEDGERSTATE in limbo)."""
        desc = self._existing(ledger_id)
        if desc.limbo:
            raise LedgerLimboError(ledger_id=ledger_id)
        return desc if desc.wait_for_lac_update(previous_lac, watcher) else None


    # ------------------------------------------------------------ entries
    def _existing(self, ledger_id: int):
        desc = self.storage.get_ledger(ledger_id)
        if desc is None:
            raise NoSuchLedgerError(ledger_id=ledger_id)
        return desc

    def ledger_exists(self, ledger_id: int) -> bool:
        return self.storage.get_ledger(ledger_id) is not None

    def is_fenced(self, ledger_id: int) -> bool:
        desc = self.storage.get_ledger(ledger_id)
        return desc is not None and desc.fenced

    def is_limbo(self, ledger_id: int) -> bool:
        desc = self.storage.get_ledger(ledger_id)
        return desc is not None and desc.limbo

    def last_entry_id(self, ledger_id: int) -> int | None:
        self._existing(ledger_id)
        return self.storage.last_entry_id(ledger_id)

    def read_cached(self, ledger_id: int, entry_id: int) -> bytes | None:
        """The entry if a cache holds it (no I/O), else None: the server's fast path."""
        if self.storage.get_ledger(ledger_id) is None:
            return None
        return self.storage.get_cached(ledger_id, entry_id)

    def _read_failed(self, ledger_id: int, entry_id: int, e: StorageError) -> None:
        if isinstance(e, CorruptedStorageError):
            metrics.READ_ENTRY_CORRUPTED.inc()
        else:
            metrics.STORAGE_ERRORS.inc()
        log.error("bookie %s: ledger %d entry %d cannot be read: %s", self.bookie_id, ledger_id, entry_id, e)

    async def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """The stored entry: bytes, or a read-only view of a read-ahead's buffer (never written
        again); entry_id -1 = the last entry this bookie has."""
        desc = self._existing(ledger_id)
        storage = self.storage
        if entry_id < 0:
            if entry_id != -1:
                raise BadRequestError("negative entry id on a read", ledger_id=ledger_id, entry_id=entry_id)
            if desc.limbo:  # the true last entry may be one this bookie lost
                raise LedgerLimboError(ledger_id=ledger_id)
            last = storage.last_entry_id(ledger_id)
            if last is None:
                raise NoSuchEntryError(ledger_id=ledger_id, entry_id=-1)
            entry_id = last
        while True:
            # Limbo is read before the lookup: the BP-46 repair stores its copies and then
            # clears limbo while a lookup may be running in a read thread, so a miss only
            # proves "no such entry" if limbo was already clear when the lookup began
            # (seed 10023 of the journal-off random test answered ENOENTRY without this).
            limbo_before = desc.limbo
            try:
                if self._ring is not None:  # its steps look in the caches first, here on the loop
                    ahead = self.read_ahead_for(ledger_id, entry_id)
                    if ahead is not None:  # a read-ahead in flight brings it: wait, not read it twice
                        await asyncio.wait((ahead,))
                        entry = storage.get_cached(ledger_id, entry_id)
                        if entry is not None:
                            return entry
                    entry = await self._ring.run(storage.read_steps(ledger_id, entry_id), storage.read_ahead_span)
                else:
                    entry = storage.get_cached(ledger_id, entry_id)
                    if entry is None:
                        entry = await self._read_threads.submit(storage.read_from_storage, ledger_id, entry_id)
            except StorageError as e:  # EIO, never ENOENTRY: the reader asks another replica
                self._read_failed(ledger_id, entry_id, e)
                raise
            if entry is not None:
                return entry
            _raise_missing(desc, ledger_id, entry_id, limbo_before)
            # limbo was cleared during the lookup: what the repair stored is visible now

    def read_ahead_for(self, ledger_id: int, entry_id: int) -> asyncio.Future | None:
        """The future of a read-ahead in flight that will bring entry_id into the read cache, or
        None. A reader waiting on one is a scan: the read of what follows the run starts now
        (`_follow`, once per run)."""
        run = self._read_aheads.covering(ledger_id, entry_id)
        if run is None:
            return None
        if not run[3]:
            self._follow(run, ledger_id)
        return run[2]

    def _follow(self, run: list, ledger_id: int) -> None:
        """Read what follows read-ahead `run` now, in a read thread, in the background: its
        read-ahead fills the read cache before the scan asks (noted while in flight, so a
        scan's READs wait for it rather than read their entries again). Once per run; errors
        are the readers' to see when they read those entries themselves."""
        run[3] = True
        self._read_ahead_from(ledger_id, run[1] + 1)

    def read_on(self, hits: dict) -> None:
        """READs got entries from the caches, the newest of each ledger in `hits` {ledger_id:
        entry_id}: a scan past the middle of a read-ahead's entries starts the read-ahead after
        it now (LedgerStorage.read_on_from), in a read thread, so that a reader whose READs all
        hit the read cache - no READ left waiting on a read-ahead to _follow it - does not stall
        on the disk at the end of every other read-ahead."""
        read_on_from, covering = self.storage.read_on_from, self._read_aheads.covering
        for ledger_id, entry_id in hits.items():
            nxt = read_on_from(ledger_id, entry_id)
            if nxt is not None and covering(ledger_id, nxt) is None:
                self._read_ahead_from(ledger_id, nxt)

    def _read_ahead_from(self, ledger_id: int, nxt: int) -> None:
        """Read entry nxt of the ledger in a read thread in the background when its miss would
        read ahead (ReadRuns), noted in flight so that READs of what it brings wait for it."""
        count = self.storage.read_ahead_planned(ledger_id, nxt)  # before a read thread plans it
        if count <= 1:
            return
        try:
            fut = self._read_threads.submit(self.storage.read_ahead_at, ledger_id, nxt, nxt + count - 1)
        except RuntimeError:  # stopping
            return
        fut.add_done_callback(_followed)
        self._read_aheads.note(ledger_id, nxt, nxt + count - 1, fut)

    # ------------------------------------------------------------ cold reads, in batches
    def read_entries_cb(self, keys: list, done, ctx) -> None:
        """The stored entries of `keys` [(ledger_id, entry_id >= 0)] no cache held when asked:
        every index lookup, entry-log pread and record check in one read thread, one hop
        (LedgerStorage.read_many), then `done(ctx, outcomes)` once on the loop: per key the
        entry, or the BookieError to answer (read_entry's rules: ENOLEDGER, EUNKNOWNLEDGERSTATE
        in limbo, EIO for a storage failure - never ENOENTRY where this bookie may have lost the
        entry). When the first key's miss will read ahead (ReadRuns), the batch is noted as that
        read-ahead while in flight: the READs it brings that arrive meanwhile wait for it
        (read_ahead_for) instead of reading their entries again; a batch of consecutive
        entries (a scan) then reads on after what its read-ahead brought in (`_follow`)."""
        storage = self.storage
        outcomes: list = [None] * len(keys)
        todo = []
        for i, (ledger_id, entry_id) in enumerate(keys):
            desc = storage.get_ledger(ledger_id)
            if desc is None:
                outcomes[i] = NoSuchLedgerError(ledger_id=ledger_id)
            else:
                # limbo read before the lookup starts (see read_entry)
                todo.append((i, desc, desc.limbo))
        if not todo:
            done(ctx, outcomes)
            return
        run = None
        ledger_id, first = keys[todo[0][0]]
        count = storage.read_ahead_planned(ledger_id, first)
        if count > 1:
            scan = len(todo) > 1 and keys[todo[1][0]] == (ledger_id, first + 1)
            run = (ledger_id, scan, self._read_aheads.note(ledger_id, first, first + count - 1, self._loop.create_future()))
        self._read_stored(keys, todo, outcomes, done, ctx, run)

    def _read_stored(self, keys, todo, outcomes, done, ctx, run) -> None:
        def read_done(result, error) -> None:
            retry = []
            if error is not None:  # read_many itself failed: every key of it is EIO
                result = ([error] * len(todo), [])
            out, spans = result
            for (i, desc, limbo_before), got in zip(todo, out):
                ledger_id, entry_id = keys[i]
                if isinstance(got, BaseException):
                    if not isinstance(got, StorageError):
                        log.error("unexpected error reading ledger %d entry %d: %r", ledger_id, entry_id, got)
                        got = StorageError(f"unexpected error reading: {got!r}")
                    self._read_failed(ledger_id, entry_id, got)
                    outcomes[i] = got
                elif got is not None:
                    outcomes[i] = got
                else:
                    try:
                        _raise_missing(desc, ledger_id, entry_id, limbo_before)
                        retry.append((i, desc, desc.limbo))  # limbo cleared meanwhile: look again
                    except BookieError as e:
                        outcomes[i] = e
            if run is not None:  # a scan: its READs waiting for this read-ahead look in the cache now
                ledger_id, scan, noted = run
                noted[2].set_result(None)
                span = next((span for span in spans if span[0] == ledger_id), None)
                if scan and span is not None and not noted[3]:  # read on after what it brought in
                    noted[1] = span[2]
                    self._follow(noted, ledger_id)
            if retry:
                self._read_stored(keys, retry, outcomes, done, ctx, None)
            else:
                done(ctx, outcomes)
        try:
            self._read_threads.call(self.storage.read_many, ([keys[i] for i, _, _ in todo],), read_done)
        except RuntimeError as e:  # the read threads are shut down: the bookie is stopping
            read_done(None, StorageError(f"the bookie is stopping: {e}"))

    async def read_span(self, ledger_id: int, entry_id: int, max_count: int, max_bytes: int):
        """Entries entry_id.. that only the entry logs hold, back to back in one log, as a span of
        it (LedgerStorage.read_span), or None: then read_entry reads them (caches, limbo, "no
        such entry" are its to decide)."""
        self._existing(ledger_id)
        try:
            return await self._read_threads.submit(self.storage.read_span, ledger_id, entry_id, max_count, max_bytes,
                                                   discard=_release_span)
        except StorageError as e:  # EIO, never ENOENTRY: the reader asks another replica
            self._read_failed(ledger_id, entry_id, e)
            raise



def _raise_missing(desc, ledger_id: int, entry_id: int, limbo_before: bool) -> None:
    """A lookup found no entry: in limbo that is no answer (EUNKNOWNLEDGERSTATE); out of limbo
    it is ENOENTRY only if limbo was clear when the lookup began. Returns when limbo was
    cleared during the lookup: the caller looks again (what the repair stored is visible)."""
    if desc.limbo:
        raise LedgerLimboError(ledger_id=ledger_id, entry_id=entry_id)
    if not limbo_before:
        raise NoSuchEntryError(ledger_id=ledger_id, entry_id=entry_id)


def _followed(fut: asyncio.Future) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.debug("a read-ahead after a scan's reads failed: %s", fut.exception())


def _release_span(span) -> None:
    """A span read for a BATCH_READ whose request was cancelled meanwhile: its buffer and fd
    reference go back (ReadThreads' discard)."""
    span.release()
