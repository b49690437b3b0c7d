"""Fences, explicit LACs and BP-46 limbo (a part of Bookie: bk.bookie.bookie): the ledger
state a recovery, a writer's WRITE_LAC or the data-integrity check changes.

Rules kept here (REPLICATION.md, "Rules a bookie must keep"):
- A fence is journaled and durable before `fence_ledger` returns; a fencing of an unknown
  ledger creates it, fenced. Fence and add go through the same journal and run their
  admission on the loop thread, so an add admitted before a fence is journaled (and
  acknowledged) before the fence.
- Master keys are set once, by the first add, fence or LAC write (LedgerDescriptor.check_access).
- A ledger in limbo answers no explicit negative (bk.bookie.reads); limbo is set by phase one
  before the bookie serves and cleared only once the ledger is whole again, durably.
"""
from __future__ import annotations

import asyncio

from bk.errors import BookieReadOnlyError
from bk.index import NEEDS_INTEGRITY_CHECK
from bk.journal import EXPLICIT_LAC, FENCE, meta_body
from bk.formats.wire import IDS, LAC_HEADER_LENGTH

from .adds import _complete_future


def _learn_explicit_lac(desc, lac_buf) -> None:
    """An explicit LAC (`ledger_id(8) lac(8) digest`, key-checked: it is the writer's) raises the LAC
    the bookie knows, as a piggybacked one does: long polls and READ -1 answers' maxLAC see it."""
    if len(lac_buf) >= LAC_HEADER_LENGTH:
        ledger_id, lac = IDS.unpack_from(lac_buf)
        if ledger_id == desc.ledger_id and lac > desc.lac:  # the decoders check both ids; callers may not
            desc.lac = lac


class LimboPath:
    """Bookie's fences, LAC writes and the BP-46 integrity check's local half. Uses the
    Bookie's storage, read_only, _loop, _journal and _admitted (bk.bookie.adds)."""

    # ------------------------------------------------------------ fencing, LAC writes
    async def fence_ledger(self, ledger_id: int, master_key: bytes) -> None:
        """Fence (idempotent); returns once the fence is durable."""
        desc = self._admitted(ledger_id, master_key)
        if desc.fenced:
            if desc.fence_pending is not None:
                await asyncio.shield(desc.fence_pending)
            return
        self.storage.update_ledger(desc, fenced=True)
        fut = self._loop.create_future()
        desc.fence_pending = fut
        self._journal(ledger_id).log(meta_body(ledger_id, FENCE, b""), _complete_future, fut)
        try:
            await asyncio.shield(fut)
        finally:
            if desc.fence_pending is fut and fut.done():
                desc.fence_pending = None

    async def write_lac(self, ledger_id: int, master_key: bytes, lac_buf: bytes) -> None:
        if self.read_only:  # refused like an add (BookKeeper)
            raise BookieReadOnlyError(ledger_id=ledger_id)
        desc = self._admitted(ledger_id, master_key)
        self.storage.update_ledger(desc, explicit_lac=bytes(lac_buf))
        _learn_explicit_lac(desc, lac_buf)  # wakes the long polls waiting on it (BookKeeper's setExplicitLac)
        fut = self._loop.create_future()
        self._journal(ledger_id).log(meta_body(ledger_id, EXPLICIT_LAC, lac_buf), _complete_future, fut)
        await fut


    # ------------------------------------------------------------ BP-46 integrity check
    @property
    def needs_integrity_check(self) -> bool:
        """Set by phase one, cleared once phase two found every ledger whole (survives restarts)."""
        return self.storage.get_flag(NEEDS_INTEGRITY_CHECK)

    async def mark_for_integrity_check(self, ledgers, unfenced=()) -> int:
        """Phase one's local half (REPLICATION.md, "Running without the journal").

        `ledgers`: (ledger_id, master_key or None) of every ledger whose metadata names this
        bookie. Each is created if this bookie has no record of it (with the key the metadata
        yields, or with none: the first key a client presents is then stored), and is fenced
        and put in limbo; those in `unfenced` (open ledgers whose last ensemble left this
        bookie: their writer is alive elsewhere, bk.server.integrity) only in limbo, so they
        answer no false negative and their writer is not fenced out. Limbo without a fence
        keeps the rule that an EUNKNOWNLEDGERSTATE answer to a fencing read proves the fence:
        a fencing read fences before it reads. The needs-integrity-check flag goes first, then everything is made
        durable by one checkpoint (not one per ledger: a cluster may hold 100,000). Until that
        checkpoint returns the caller must not serve: a crash before it leaves the
        unclean-shutdown flag set, so the next boot runs phase one again."""
        await asyncio.to_thread(self.storage.set_flag_now, NEEDS_INTEGRITY_CHECK, True)
        storage = self.storage
        unfenced = set(unfenced)
        count = 0
        for ledger_id, key in ledgers:
            desc = storage.get_ledger(ledger_id) or storage.create_ledger(ledger_id)
            marks = dict(limbo=True) if ledger_id in unfenced else dict(fenced=True, limbo=True)
            if desc.master_key is None and key is not None:
                desc.check_access(key)  # its length: no key is stored yet
                marks["master_key"] = bytes(key)
            storage.update_ledger(desc, **marks)
            count += 1
        await asyncio.to_thread(storage.checkpoint)
        self.phase_one_due = False  # durable: a clean stop may clear the unclean-shutdown flag now
        return count

    async def stored_entry_ids(self, ledger_id: int) -> list[int]:
        """Every entry id of the ledger this bookie stores, ascending. Costs what is stored, never
        the span of the ids (one entry at id 2**62 is one id). The write cache is read before
        and after the index (on the loop, its owner): an entry that moves from the cache to the
        index meanwhile is seen in one of the three."""
        storage = self.storage
        ids = set(storage.cached_entry_ids(ledger_id))
        ids.update(await asyncio.to_thread(storage.index.entry_ids, ledger_id))
        ids.update(storage.cached_entry_ids(ledger_id))
        return sorted(ids)

    def missing_entries(self, ledger_id: int, entry_ids) -> list[int]:
        """Those of `entry_ids` this bookie does not store, or stored in an entry log that is
        gone (blocking: call from a thread)."""
        return self.storage.missing_entries(ledger_id, entry_ids)

    @property
    def log_check(self):
        """What the start found of the entry logs the index names (bk.bookie.log_check)."""
        return self.storage.log_check

    async def clear_limbo(self, ledger_ids) -> None:
        """Phase two found these ledgers whole: answer explicit negatives for them again.
        Durable on return. The copied entries are in the write cache (visible to reads) before
        limbo clears in memory, and the cleared state is persisted by the same checkpoint that
        writes them (or a later one), so a cleared limbo never stands in front of an entry a
        crash could still take. A read that began while in limbo looks again (read_entry)."""
        storage = self.storage
        for ledger_id in ledger_ids:
            desc = storage.get_ledger(ledger_id)
            if desc is not None and desc.limbo:
                storage.update_ledger(desc, limbo=False)
        await asyncio.to_thread(storage.checkpoint)

    async def finish_integrity_check(self) -> None:
        """Every ledger is whole: clear the bookie-wide flag (after a checkpoint)."""
        await asyncio.to_thread(self.storage.checkpoint)
        await asyncio.to_thread(self.storage.set_flag_now, NEEDS_INTEGRITY_CHECK, False)

    def limbo_ledgers(self) -> list[int]:
        storage = self.storage
        return [lid for lid in storage.ledger_ids() if (d := storage.get_ledger(lid)) is not None and d.limbo]

