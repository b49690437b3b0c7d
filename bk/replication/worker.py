"""ReplicationWorker: one per bookie; copies under-replicated ledgers' segments to its own bookie.

Loop:
1. Wait while replication is disabled (`underreplication/disable` exists) and
   while its own bookie is not registered writable (a read-only or absent
   bookie cannot take copies).
2. Take a marked ledger whose ephemeral lock it can create (a lock held by
   another worker means someone is on it; a worker that dies releases its
   locks with its session). Ledgers that recently failed here are skipped for
   a back-off that doubles with each failure, and so are ledgers it cannot
   help with (its bookie is in every segment naming a marked bookie): holding
   their lock would only keep out the worker that can.
3. Decide which shares (a bookie's part of one segment) are lost: every share
   of a bookie of the ledger that is not registered, and of a marked bookie that
   is registered, only the shares a probe (LedgerChecker) finds lacking or
   cannot ask about. A whole marked bookie is not lost: with AQ < WQ every
   bookie of a ledger may lack a few entries (the writer died before its second
   copy), and replacing each one everywhere made workers swap bookies back and
   forth for ever (chaos seed 89).
4. LedgerReplicator with its own bookie as target: segments that already
   contain its bookie are left for other workers; an open ledger whose last
   segment names a lost bookie gets `open_ledger_rereplication_grace_period_ms`
   for its writer to move on, then is fenced and closed.
5. With `repaired_placement_policy_not_adhering_bookie_enable` (BookKeeper's
   repairedPlacementPolicyNotAdheringBookieEnable), a closed ledger's segments
   that FAIL the placement policy are moved to the bookies `replace_to_adhere`
   names (any writable bookies, not only this worker's): copied first, the
   metadata changed after (bk.replication.placement). The Auditor's placement
   check marks such ledgers with no missing bookie.
6. Fully replicated: delete the marker at the version read in step 2 (a marker
   the auditor extended meanwhile stays) and release the lock. Otherwise, or on
   an error, release the lock and back off from that ledger.
"""
from __future__ import annotations

import asyncio
import logging
import time

from bk import metrics
from bk.eventloop import cancel_and_wait
from bk.errors import BKError, NoSuchLedgerMetadataError
from bk.meta.underreplication import LedgerUnderreplicationManager, UnderreplicatedLedger

from .checker import LedgerChecker
from .placement import PlacementRepair
from .replicator import LedgerOutcome, LedgerReplicator

log = logging.getLogger(__name__)

IDLE_POLL_S = 1.0
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
ERROR_PAUSE_S = 1.0


class ReplicationWorker:
    def __init__(self, bk, urm: LedgerUnderreplicationManager, bookie_id: str, *, open_grace_s: float = 30.0,
                 window_entries: int = 100, rate_bytes_per_s: int = 0, idle_poll_s: float = IDLE_POLL_S,
                 backoff_first_s: float = BACKOFF_FIRST_S, backoff_max_s: float = BACKOFF_MAX_S,
                 repair_placement: bool = False):
        self.bk = bk
        self.urm = urm
        self.bookie_id = bookie_id
        self.open_grace_s = open_grace_s
        self.idle_poll_s = idle_poll_s
        self.backoff_first_s = backoff_first_s
        self.backoff_max_s = backoff_max_s
        self.replicator = LedgerReplicator(bk, window_entries=window_entries, rate_bytes_per_s=rate_bytes_per_s)
        self.checker = LedgerChecker(bk.pool)
        self.placement_repair = PlacementRepair(bk, self.replicator) if repair_placement else None
        self.current: int | None = None  # the ledger being worked on
        self._deferred: dict[int, tuple[float, float]] = {}  # ledger -> (retry at, last back-off)
        self._task: asyncio.Task | None = None
        # counters, for tests and status
        self.ledgers_replicated = 0
        self.segments_replicated = 0
        self.bytes_replicated = 0
        self.failures = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(),
                                                                name=f"replication-worker-{self.bookie_id}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    # ------------------------------------------------------------ loop
    async def _run(self) -> None:
        me = asyncio.current_task()
        while True:
            # A cancellation swallowed on the way (Python 3.11's wait_for returns the inner result
            # when the outer task is cancelled just as it finishes) would let the worker sleep on
            # and stop() wait for ever (chaos seed 107897): a task asked to stop never starts
            # another round.
            if me is not None and me.cancelling():
                raise asyncio.CancelledError()
            try:
                await self.urm.wait_until_replication_enabled()
                if await self.bk.registration.registration(self.bookie_id) != "writable":
                    await asyncio.sleep(self.idle_poll_s)
                    continue
                info = await self._take()
                if info is None:
                    await asyncio.sleep(self.idle_poll_s)
                    continue
                await self._work(info)
            except asyncio.CancelledError:
                raise
            except BKError as e:
                log.warning("replication worker %s: %s", self.bookie_id, e)
                await asyncio.sleep(ERROR_PAUSE_S)
            except Exception:
                log.exception("replication worker %s failed", self.bookie_id)
                await asyncio.sleep(ERROR_PAUSE_S)

    async def _take(self) -> UnderreplicatedLedger | None:
        now = asyncio.get_running_loop().time()
        for ledger_id in [i for i, (at, _) in self._deferred.items() if at <= now - self.backoff_max_s]:
            del self._deferred[ledger_id]  # long past its back-off: forget its failures
        async for ledger_id in self.urm.iter_underreplicated_ledgers(shuffle=True):
            deferred = self._deferred.get(ledger_id)
            if deferred is not None and deferred[0] > now:
                continue
            if not await self._worth_taking(ledger_id):
                self._defer(ledger_id)
                continue
            if not await self.urm.acquire_ledger_lock(ledger_id, self.bookie_id):
                continue
            info = await self.urm.get_ledger_unreplication_info(ledger_id)
            if info is not None:
                return info
            await self.urm.release_ledger_lock(ledger_id)  # replicated meanwhile
        return None

    async def _worth_taking(self, ledger_id: int) -> bool:
        """Without the lock: could this worker do anything for the ledger? A worker whose bookie is
        in every segment that names a marked bookie would only hold the lock that another worker
        needs. Taken by anyone: stale markers (no marked bookie in the ledger, ledger deleted), an
        open end naming a marked bookie (it needs fencing, not a target), and a marked bookie that is
        registered again (if it still has its data the marker goes, whoever checks)."""
        info = await self.urm.get_ledger_unreplication_info(ledger_id)
        if info is None:
            return False
        try:
            md, _ = await self.bk.ledger_manager.read_ledger_metadata(ledger_id)
        except NoSuchLedgerMetadataError:
            return True
        marked = set(info.replicas) & md.bookies()
        if not marked or (not md.is_closed and marked & set(md.last_segment[1])):
            return True
        if any(self.bookie_id not in ensemble for _, ensemble in md.segments if marked & set(ensemble)):
            return True
        # Only if a marked bookie is registered again: anyone may check it still has its data and unmark.
        reg = self.bk.registration
        for bookie in marked:
            if await reg.registration(bookie) is not None:
                return True
        return False

    def _defer(self, ledger_id: int) -> None:
        _, last = self._deferred.get(ledger_id, (0.0, 0.0))
        backoff = min(self.backoff_max_s, last * 2) if last else self.backoff_first_s
        self._deferred[ledger_id] = (asyncio.get_running_loop().time() + backoff, backoff)

    async def _work(self, info: UnderreplicatedLedger) -> None:
        ledger_id = info.ledger_id
        self.current = ledger_id
        try:
            started = time.monotonic()
            try:
                outcome = await self.rereplicate(info)
            except BKError as e:
                self.failures += 1
                metrics.REPLICATION_EXCEPTIONS.inc()
                metrics.REREPLICATE.failure((time.monotonic() - started) * 1000.0)
                self._defer(ledger_id)
                log.warning("replication worker %s: ledger %d: %s; will retry", self.bookie_id, ledger_id, e)
                return
            if outcome.errors:  # shares that could not be copied now (the others were): a failure too
                self.failures += 1
                metrics.REPLICATION_EXCEPTIONS.inc()
                metrics.REREPLICATE.failure((time.monotonic() - started) * 1000.0)
                log.warning("replication worker %s: ledger %d: %s; will retry", self.bookie_id, ledger_id,
                            "; ".join(f"segment at {first}, {bookie}: {why}" for first, bookie, why in outcome.errors))
            else:
                metrics.REREPLICATE.success((time.monotonic() - started) * 1000.0)
            self.segments_replicated += len(outcome.segments)
            self.bytes_replicated += outcome.bytes
            metrics.REPLICATION_NUM_BYTES_WRITTEN.inc(outcome.bytes)
            if outcome.segments:
                metrics.NUM_FULL_OR_PARTIAL_LEDGERS_REPLICATED.inc()
            if outcome.fully_replicated:
                if await self.urm.mark_ledger_replicated(ledger_id, info.version):
                    self.ledgers_replicated += 1
                    self._deferred.pop(ledger_id, None)
                    log.info("replication worker %s: ledger %d fully replicated (%d segment(s), %d bytes copied)",
                             self.bookie_id, ledger_id, len(outcome.segments), outcome.bytes)
                else:
                    log.info("replication worker %s: ledger %d: its marker changed meanwhile; it stays marked",
                             self.bookie_id, ledger_id)
            else:
                self._defer(ledger_id)
                log.info("replication worker %s: ledger %d: left %s for other workers", self.bookie_id, ledger_id,
                         outcome.left)
        finally:
            self.current = None
            try:
                await self.urm.release_ledger_lock(ledger_id)
            except BKError as e:  # the session may be gone; the lock is ephemeral
                log.warning("replication worker %s: releasing the lock of ledger %d: %s", self.bookie_id,
                            ledger_id, e)

    async def lost_shares(self, ledger_id: int, md, marked) -> set[tuple[int, str]]:
        """Step 3: the (segment first entry, bookie) shares of the ledger to replace."""
        reg = self.bk.registration
        available = set(await reg.writable_bookies()) | set(await reg.readonly_bookies())
        bookies = md.bookies()
        gone = bookies - available
        alive_marked = set(marked) & bookies & available
        lacking: set[tuple[int, str]] = set()
        if alive_marked:
            result = await self.checker.check(ledger_id, md, alive_marked)
            lacking = result.missing_shares | result.unknown_shares
        return {(first, b) for first, ensemble in md.segments for b in ensemble if b in gone or (first, b) in lacking}

    async def rereplicate(self, info: UnderreplicatedLedger) -> LedgerOutcome:
        ledger_id = info.ledger_id
        try:
            md, _ = await self.bk.ledger_manager.read_ledger_metadata(ledger_id)
        except NoSuchLedgerMetadataError:
            return LedgerOutcome(ledger_id, deleted=True)
        shares = await self.lost_shares(ledger_id, md, info.replicas)
        outcome = LedgerOutcome(ledger_id)
        if shares:
            me = self.bookie_id

            def choose(metadata, index: int, bookie: str) -> str | None:
                return None if me in metadata.segments[index][1] else me

            outcome = await self.replicator.replicate_ledger(ledger_id, {b for _, b in shares}, choose,
                                                             open_grace_s=self.open_grace_s, shares=shares)
        if self.placement_repair is not None and not outcome.left and not outcome.deleted:
            # lost copies first (above); a ledger still missing some is not moved for placement yet
            try:
                moved, left = await self.placement_repair.repair_ledger(ledger_id)
            except NoSuchLedgerMetadataError:
                return LedgerOutcome(ledger_id, segments=outcome.segments, deleted=True)
            outcome.segments += moved
            outcome.left += left
            if moved:
                metrics.NUM_NOT_ADHERING_PLACEMENT_LEDGERS_REPLICATED.inc()
        return outcome
