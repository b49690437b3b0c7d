"""Auditor: finds the ledgers that lost replicas and marks them under-replicated.

One per cluster (AuditorElector). It keeps the set of available bookies -
writable and read-only both count, a read-only bookie still serves its data -
from watches on `available/` and `available/readonly/`.

Lost bookies. When bookies disappear, the audit waits `lostBookieRecoveryDelay`
seconds (the live value of the znode, else the configured default):
- a bookie that comes back meanwhile is struck off; when none is left the
  delayed audit is cancelled;
- a second loss while an audit is delayed audits every pending bookie at once
  (the cluster is losing bookies: waiting risks data);
- a delay of 0 audits at once.
The audit walks every ledger and marks each ledger with a segment on a lost
bookie, naming the lost bookies that ledger uses (marks merge).

The delay znode doubles as a trigger (BookKeeper's protocol, used by
`bk shell triggeraudit` / `lostbookierecoverydelay --set`): a write of the value
it already had, or of 0, runs a full bookie audit now; another value
reschedules a delayed audit with the new delay.

Periodic work: the bookie check (every `auditor_periodic_bookie_check_interval_s`,
first at start, through the delay rules above) marks the ledgers of every bookie
named in some ledger's metadata but not registered; the ledger check (every
`auditor_periodic_check_interval_s`) probes every bookie's share of every
segment (LedgerChecker) and marks ledgers whose bookies lost entries, or could
not be asked about them though registered (as BookKeeper's checker, which counts
any failed read as a bad fragment: the worker's own check then decides what to
copy; an unregistered bookie is the bookie check's, with its delay). Its last
run is kept in `underreplication/checkallledgersctime` (BookKeeper's znode): an
auditor that starts waits only what is left of the interval since then, and runs
the check at once when it is overdue (`bk shell forceauditchecks -calc` sets it 21
days back); with no run recorded it waits a whole interval.

The placement check (every `auditor_periodic_placement_policy_check_interval_s`;
off by default as in BookKeeper; also after each trigger when it is on) asks the
placement policy about every segment of every closed ledger
(bk.replication.placement). Each periodic run is recorded in
`placementpolicycheckctime`: a starting auditor runs it at once when none is
recorded or it is overdue (`forceauditchecks -ppc`), else when the interval since
the recorded run ends, as BookKeeper's does. It exports how many ledgers FAIL or only MEETS_SOFT,
and with `repaired_placement_policy_not_adhering_bookie_enable` marks the
failing ones under-replicated with no missing bookie, as BookKeeper does: the
replication workers then move those segments (ReplicationWorker).

All audits run one at a time (a lock), like BookKeeper's single audit thread.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator

from bk import metrics
from bk.errors import BKError, MetadataExistsError, NoSuchLedgerMetadataError
from bk.meta import EventType
from bk.meta.ledger_metadata import LedgerMetadata
from bk.meta.underreplication import LedgerUnderreplicationManager

from .checker import LedgerChecker
from .placement import FAIL, MEETS_SOFT, PlacementCheckResult, ledger_adherence, segment_adherence

log = logging.getLogger(__name__)

METADATA_READ_CONCURRENCY = 32


class Auditor:
    def __init__(self, bk, urm: LedgerUnderreplicationManager, bookie_id: str, *,
                 lost_bookie_recovery_delay_s: int = 0, check_interval_s: float = 604_800,
                 bookie_check_interval_s: float = 86_400, placement_check_interval_s: float = 0,
                 repair_placement: bool = False):
        self.bk = bk
        self.urm = urm
        self.bookie_id = bookie_id
        self.default_delay_s = int(lost_bookie_recovery_delay_s)
        self.check_interval_s = check_interval_s
        self.bookie_check_interval_s = bookie_check_interval_s
        self.placement_check_interval_s = placement_check_interval_s
        self.repair_placement = repair_placement
        self.last_placement_check: PlacementCheckResult | None = None
        self.checker = LedgerChecker(bk.pool)
        self.available: frozenset = frozenset()
        self.pending: set[str] = set()  # lost bookies waiting for the delay
        self._writable: frozenset = frozenset()
        self._readonly: frozenset = frozenset()
        self._watches = []
        self._tasks: set[asyncio.Task] = set()
        self._delayed: asyncio.Task | None = None
        self._delay_s = self.default_delay_s  # the value before the latest change (the trigger rule)
        self._lock = asyncio.Lock()
        self._running = False
        # counters, for tests and status
        self.audits = 0
        self.delayed_audits_cancelled = 0
        self.ledgers_marked = 0

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> "Auditor":
        self._running = True
        await self._init_delay()
        reg = self.bk.registration
        self._watches.append(await reg.watch_writable_bookies(lambda s: self._bookies_changed(writable=s)))
        self._watches.append(await reg.watch_readonly_bookies(lambda s: self._bookies_changed(readonly=s)))
        self._writable, self._readonly = self._watches[0].bookies, self._watches[1].bookies
        self.available = self._writable | self._readonly
        self._spawn(self._watch_delay(), "auditor-delay-watch")
        if self.bookie_check_interval_s > 0:
            self._spawn(self._periodic(self.bookie_check_interval_s, self._startup_bookie_check,
                                       self.check_all_bookies, first_now=True), "auditor-bookie-check")
        if self.check_interval_s > 0:
            self._spawn(self._periodic(self.check_interval_s, None, self.check_all_ledgers, first_now=False,
                                       check="checkallledgers", resume=True), "auditor-ledger-check")
        if self.placement_check_interval_s > 0:
            # as BookKeeper's: at once when no run is recorded (first_now), else when the recorded run is due
            self._spawn(self._periodic(self.placement_check_interval_s, None, self.check_placement, first_now=True,
                                       check="placementpolicycheck", resume=True), "auditor-placement-check")
        log.info("auditor %s started; available bookies: %s", self.bookie_id, sorted(self.available))
        return self

    async def stop(self) -> None:
        self._running = False
        for watch in self._watches:
            watch.cancel()
        self._watches.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        log.info("auditor %s stopped", self.bookie_id)

    def _spawn(self, coro, name: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(self._guard(coro, name), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @staticmethod
    async def _guard(coro, name: str) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("auditor task %s failed", name)

    async def _init_delay(self) -> None:
        """Publish the configured delay if the cluster has none yet (BookKeeper does the same)."""
        if await self.urm.store.exists(self.urm.paths.lost_bookie_recovery_delay) is None:
            try:
                await self.urm.store.create(self.urm.paths.lost_bookie_recovery_delay,
                                            str(self.default_delay_s).encode("ascii"), make_parents=True)
            except MetadataExistsError:
                pass
        self._delay_s = await self.urm.get_lost_bookie_recovery_delay(self.default_delay_s)

    # ------------------------------------------------------------ lost bookies
    def _bookies_changed(self, writable=None, readonly=None) -> None:
        if writable is not None:
            self._writable = writable
        if readonly is not None:
            self._readonly = readonly
        now = self._writable | self._readonly
        lost, back = self.available - now, now - self.available
        self.available = now
        if back & self.pending:
            self.pending -= back
            log.info("auditor: bookie(s) %s are back", sorted(back))
            if not self.pending and self._delayed is not None:
                self._delayed.cancel()
                self._delayed = None
                self.delayed_audits_cancelled += 1
                metrics.AUDITOR_NUM_DELAYED_BOOKIE_AUDITS_CANCELLED.inc()
                log.info("auditor: every lost bookie came back within the delay: audit cancelled")
        if lost and self._running:
            log.info("auditor: bookie(s) %s lost", sorted(lost))
            self._spawn(self._bookies_lost(lost), "auditor-bookies-lost")

    async def _bookies_lost(self, lost: set) -> None:
        delay_s = await self.urm.get_lost_bookie_recovery_delay(self.default_delay_s)
        lost = set(lost) - self.available - self.pending  # pending ones are already waiting
        if not lost:
            return
        if delay_s == 0 or self._delayed is not None:
            self._cancel_delayed()
            bookies = self.pending | lost
            self.pending.clear()
            await self.audit_bookies(bookies)
            return
        self.pending |= lost
        log.info("auditor: auditing %s in %d s unless they come back", sorted(self.pending), delay_s)
        self._schedule_delayed(delay_s)

    def _cancel_delayed(self) -> None:
        if self._delayed is not None:
            self._delayed.cancel()
            self._delayed = None

    def _schedule_delayed(self, delay_s: float) -> None:
        self._cancel_delayed()

        async def later() -> None:
            await asyncio.sleep(delay_s)
            self._delayed = None
            bookies = set(self.pending)
            self.pending.clear()
            await self.audit_bookies(bookies)

        self._delayed = self._spawn(later(), "auditor-delayed-audit")

    async def _watch_delay(self) -> None:
        while True:
            try:
                _, changed = await self.urm.lost_bookie_recovery_delay_watched(self.default_delay_s)
                event = await changed
            except BKError as e:
                log.warning("auditor: watching lostBookieRecoveryDelay: %s; retrying", e)
                await asyncio.sleep(1.0)
                continue
            if event.type in (EventType.CHANGED, EventType.CREATED):
                await self._delay_changed()

    async def _delay_changed(self) -> None:
        delay_s = await self.urm.get_lost_bookie_recovery_delay(self.default_delay_s)
        before, self._delay_s = self._delay_s, delay_s
        if delay_s == 0 or delay_s == before:
            log.info("auditor: lostBookieRecoveryDelay set to %d (was %d): auditing now", delay_s, before)
            self._cancel_delayed()
            self.pending.clear()
            await self.check_all_bookies()
            if self.placement_check_interval_s > 0:
                try:
                    await self.check_placement()
                except BKError as e:  # the trigger watch must go on
                    log.warning("auditor: triggered placement check failed: %s", e)
        elif self._delayed is not None:
            log.info("auditor: lostBookieRecoveryDelay now %d s: audit of %s rescheduled", delay_s,
                     sorted(self.pending))
            self._schedule_delayed(delay_s)

    # ------------------------------------------------------------ audits
    async def _ledgers(self) -> AsyncIterator[tuple[int, LedgerMetadata]]:
        """Every ledger with its metadata, reading a bounded number of znodes at once."""
        lm = self.bk.ledger_manager
        ids = await lm.list_ledger_ids()
        for start in range(0, len(ids), METADATA_READ_CONCURRENCY):
            batch = ids[start:start + METADATA_READ_CONCURRENCY]
            answers = await asyncio.gather(*(lm.read_ledger_metadata(i) for i in batch), return_exceptions=True)
            for ledger_id, answer in zip(batch, answers):
                if isinstance(answer, NoSuchLedgerMetadataError):
                    continue  # deleted meanwhile
                if isinstance(answer, BaseException):
                    raise answer
                yield ledger_id, answer[0]

    async def _mark(self, ledger_id: int, missing) -> None:
        await self.urm.mark_ledger_underreplicated(ledger_id, sorted(missing))
        self.ledgers_marked += 1
        metrics.AUDITOR_NUM_LEDGERS_MARKED.inc()
        log.info("auditor: ledger %d under-replicated (missing %s)", ledger_id, sorted(missing))

    async def audit_bookies(self, bookies) -> int:
        """Mark every ledger with a segment on one of `bookies` (those still unavailable)."""
        async with self._lock:
            bookies = set(bookies) - self.available
            if not bookies:
                return 0
            self.audits += 1
            log.info("auditor: auditing lost bookie(s) %s", sorted(bookies))
            marked = 0
            started = time.monotonic()
            async for ledger_id, md in self._ledgers():
                missing = bookies & md.bookies()
                if missing:
                    await self._mark(ledger_id, missing)
                    marked += 1
            metrics.AUDITOR_AUDIT_BOOKIES_TIME.success((time.monotonic() - started) * 1000.0)
            metrics.AUDITOR_NUM_UNDER_REPLICATED_LEDGERS.record(marked)
            log.info("auditor: audit of %s done: %d ledger(s) marked", sorted(bookies), marked)
            return marked

    async def _unregistered_bookies(self) -> tuple[set, list]:
        available = set(await self.bk.registration.writable_bookies()) | set(
            await self.bk.registration.readonly_bookies())
        ledgers = [(i, md) async for i, md in self._ledgers()]
        named = set().union(*(md.bookies() for _, md in ledgers)) if ledgers else set()
        return named - available, ledgers

    async def _startup_bookie_check(self) -> None:
        """At start, bookies named in metadata but not registered are treated as just lost."""
        async with self._lock:
            lost, _ = await self._unregistered_bookies()
        lost -= self.available
        if lost:
            log.info("auditor: bookie(s) %s are named in ledger metadata but not registered", sorted(lost))
            await self._bookies_lost(lost)

    async def check_all_bookies(self) -> int:
        """The periodic bookie check (and the trigger): mark the ledgers of every unregistered bookie now."""
        async with self._lock:
            self.audits += 1
            lost, ledgers = await self._unregistered_bookies()
            marked = 0
            for ledger_id, md in ledgers:
                missing = lost & md.bookies()
                if missing:
                    await self._mark(ledger_id, missing)
                    marked += 1
            log.info("auditor: bookie check: %s not registered, %d ledger(s) marked", sorted(lost) or "none",
                     marked)
            return marked

    async def check_all_ledgers(self) -> int:
        """The periodic ledger check: probe every bookie's share of every segment with an end."""
        async with self._lock:
            marked = unanswered = 0
            async for ledger_id, md in self._ledgers():
                result = await self.checker.check(ledger_id, md)
                unknown = result.unknown & self.available
                if unknown:
                    unanswered += 1
                    log.warning("auditor: ledger %d: %s did not answer for their share(s) %s: marked", ledger_id,
                                sorted(unknown), sorted(s for s in result.unknown_shares if s[1] in unknown))
                if result.missing or unknown:
                    await self._mark(ledger_id, result.missing | unknown)
                    marked += 1
            log.info("auditor: ledger check done: %d ledger(s) marked (%d on shares that could not be read)",
                     marked, unanswered)
            return marked

    async def check_placement(self) -> PlacementCheckResult:
        """The placement policy check of every closed ledger (module doc); marks the failing ones when
        repair is on. The gauges keep the counts of the last check."""
        async with self._lock:
            started = time.monotonic()
            result = PlacementCheckResult()
            policy = self.bk.placement
            async for ledger_id, md in self._ledgers():
                if not md.is_closed:
                    continue  # the writer's; BookKeeper checks closed ledgers only
                result.closed_ledgers += 1
                verdicts = await segment_adherence(policy, md)
                verdict = ledger_adherence(verdicts)
                if verdict == FAIL:
                    result.not_adhering.append(ledger_id)
                    bad = [(first, list(e)) for (first, e), v in zip(md.segments, verdicts) if v == FAIL]
                    log.warning("auditor: ledger %d does not adhere to the placement policy (segments %s, WQ %d,"
                                " AQ %d)", ledger_id, bad, md.write_quorum_size, md.ack_quorum_size)
                    if self.repair_placement:
                        await self._mark(ledger_id, ())
                        result.marked += 1
                elif verdict == MEETS_SOFT:
                    result.softly_adhering += 1
            not_adhering, soft = len(result.not_adhering), result.softly_adhering
            metrics.AUDITOR_NUM_LEDGERS_NOT_ADHERING_TO_PLACEMENT_POLICY.set_function(lambda: not_adhering)
            metrics.AUDITOR_NUM_LEDGERS_SOFTLY_ADHERING_TO_PLACEMENT_POLICY.set_function(lambda: soft)
            metrics.AUDITOR_PLACEMENT_POLICY_CHECK_TIME.success((time.monotonic() - started) * 1000.0)
            self.last_placement_check = result
            log.info("auditor: placement check done: %d closed ledger(s), %d not adhering, %d softly adhering,"
                     " %d marked", result.closed_ledgers, not_adhering, soft, result.marked)
            return result

    async def _periodic(self, interval_s: float, first, every, *, first_now: bool, check: str | None = None,
                        resume: bool = False) -> None:
        """Run `every` each interval (`first` first when first_now). `check` names the znode
        that records each run; with `resume` a recorded run sets the first wait to what is
        left of the interval since it (0 when overdue), as BookKeeper's auditor does."""
        step = (first or every) if first_now else None
        if resume:
            due = await self._due_in(check, interval_s)
            if due is not None:
                log.info("auditor: next %s in %.0f s (by its recorded last run)", check, due)
                await asyncio.sleep(due)
                step = every
        while True:
            if step is not None:
                try:
                    await step()
                    if check is not None:
                        await self.urm.set_check_ctime(check, int(time.time() * 1000))
                except BKError as e:
                    log.warning("auditor: periodic check failed: %s", e)
            step = every
            await asyncio.sleep(interval_s)

    async def _due_in(self, check: str, interval_s: float) -> float | None:
        """Seconds until `check` is due by its recorded last run, None if none is recorded."""
        try:
            ctime_ms = await self.urm.get_check_ctime(check)
        except BKError as e:
            log.warning("auditor: cannot read %s's last run (%s): waiting a whole interval", check, e)
            return None
        if ctime_ms is None:
            return None
        return max(0.0, interval_s - max(0.0, time.time() - ctime_ms / 1000))
