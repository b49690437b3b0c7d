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
from bk.errors import (BadRequestError, CorruptedStorageError, LedgerLimboError, NoSuchEntryError, NoSuchLedgerError,
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
            if desc.limbo:
                raise LedgerLimboError(ledger_id=ledger_id, entry_id=entry_id)
            if not limbo_before:
                raise NoSuchEntryError(ledger_id=ledger_id, entry_id=entry_id)
            # limbo was cleared during the lookup: what the repair stored is visible now

    def read_ahead_for(self, ledger_id: int, entry_id: int) -> asyncio.Future | None:
        """The future of a read-ahead in flight that will bring entry_id into the read cache, or
        None. A reader waiting on one is a scan: the read of what follows the run starts now
        (RingReads.follow, once per run). Only with the ring (read_io): the read threads' path
        reads its entry itself."""
        ring = self._ring
        run = ring.read_aheads.covering(ledger_id, entry_id) if ring is not None else None
        if run is None:
            return None
        if not run[3]:
            ring.follow(run, self.storage.read_steps(ledger_id, run[1] + 1), self.storage.read_ahead_span)
        return run[2]

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



def _release_span(span) -> None:
    """A span read for a BATCH_READ whose request was cancelled meanwhile: its buffer and fd
    reference go back (ReadThreads' discard)."""
    span.release()
