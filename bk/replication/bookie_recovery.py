"""Manual bookie recovery (`bk shell recover BOOKIE_ID`): re-replicate every ledger that has
a segment on a lost bookie, without AutoRecovery (REPLICATION.md, "Manual recovery").

    async with BookKeeper(uri) as bkc:
        recovery = BookieRecovery(bkc, window_entries=100, rate_bytes_per_s=0)
        plans = await recovery.affected_ledgers("127.0.0.1:3181")          # --query / --dry-run
        summary = await recovery.recover("127.0.0.1:3181", target=None, skip_open=False,
                                         on_progress=..., on_ledger=...)

Per ledger: an open ledger whose last segment names the bookie is fenced and
closed first (opened with recovery) - or left alone with `skip_open` (an open
ledger that names the bookie only in earlier segments, which have an end, is
re-replicated without fencing: its writer is not disturbed); then each
segment naming the bookie is copied to the target (the given one, or a writable
bookie outside that segment that the client's placement policy chooses per segment, keeping
its racks with the rack-aware policy) and the metadata
CASed. A ledger fails - and is named in the summary - when a segment could not
be copied or no target fits; the others go on. A few ledgers run at once.

`delete_cookie`: once every ledger is recovered and none was skipped, the lost
bookie's cookie is deleted (so it can join again as a new, empty bookie); never
while the bookie is registered.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from bk.errors import (
    BKError, IncorrectParameterError, MetadataNotFoundError, NoSuchLedgerMetadataError, NotEnoughBookiesError,
)
from bk.meta.cookie import CookieStore
from bk.meta.ledger_metadata import LedgerMetadata

from .replicator import LedgerOutcome, LedgerReplicator, bookie_entries, segment_bounds

log = logging.getLogger(__name__)

PARALLEL_LEDGERS = 4


@dataclass
class SegmentPlan:
    first_entry_id: int
    last_entry_id: int | None  # None: the open end of the ledger (fenced and closed first)
    entries: int | None  # entries the bookie holds in it (None while open-ended)
    ensemble: tuple[str, ...]


@dataclass
class LedgerPlan:
    ledger_id: int
    state: str
    open_end: bool  # the last segment of a ledger that is not closed names the bookie
    segments: list[SegmentPlan]

    @property
    def entries(self) -> int:
        return sum(s.entries or 0 for s in self.segments)


def plan_ledger(ledger_id: int, md: LedgerMetadata, bookie_id: str) -> LedgerPlan | None:
    segments = []
    for index, (first, ensemble) in enumerate(md.segments):
        if bookie_id not in ensemble:
            continue
        _, last = segment_bounds(md, index)
        entries = None if last is None else len(bookie_entries(first, last, md.ensemble_size,
                                                               md.write_quorum_size, ensemble.index(bookie_id)))
        segments.append(SegmentPlan(first, last, entries, ensemble))
    if not segments:
        return None
    open_end = not md.is_closed and bookie_id in md.last_segment[1]
    return LedgerPlan(ledger_id, md.state.name, open_end, segments)


@dataclass
class LedgerResult:
    ledger_id: int
    status: str  # recovered | skipped-open | deleted | failed
    error: str | None = None
    outcome: LedgerOutcome | None = None

    @property
    def bytes(self) -> int:
        return self.outcome.bytes if self.outcome is not None else 0


@dataclass
class RecoveryProgress:
    ledgers_total: int
    ledgers_done: int = 0
    bytes_copied: int = 0
    entries_copied: int = 0
    started_at: float = field(default_factory=time.monotonic)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_at

    @property
    def rate_bytes_per_s(self) -> float:
        elapsed = self.elapsed_s
        return self.bytes_copied / elapsed if elapsed > 0 else 0.0


@dataclass
class RecoverySummary:
    bookie_id: str
    results: list[LedgerResult]
    progress: RecoveryProgress
    cookie_deleted: bool = False
    cookie_note: str | None = None

    def by_status(self, status: str) -> list[int]:
        return sorted(r.ledger_id for r in self.results if r.status == status)

    @property
    def failed(self) -> list[LedgerResult]:
        return sorted((r for r in self.results if r.status == "failed"), key=lambda r: r.ledger_id)

    @property
    def ok(self) -> bool:
        return not self.failed


class BookieRecovery:
    def __init__(self, bk, *, window_entries: int = 100, rate_bytes_per_s: int = 0,
                 parallel_ledgers: int = PARALLEL_LEDGERS):
        self.bk = bk
        self.replicator = LedgerReplicator(bk, window_entries=window_entries, rate_bytes_per_s=rate_bytes_per_s)
        self.parallel_ledgers = max(1, parallel_ledgers)

    async def affected_ledgers(self, bookie_id: str, ledger_id: int | None = None) -> list[LedgerPlan]:
        """Every ledger (or just `ledger_id`) with a segment on `bookie_id`, ascending."""
        lm = self.bk.ledger_manager
        if ledger_id is not None:
            await lm.read_ledger_metadata(ledger_id)  # NoSuchLedgerMetadataError for a named ledger
        plans = []
        async for lid, md, _version in lm.iter_ledger_metadata(None if ledger_id is None else [ledger_id],
                                                               concurrency=32):
            plan = plan_ledger(lid, md, bookie_id)
            if plan is not None:
                plans.append(plan)
        return plans

    async def _check_target(self, bookie_id: str, target: str | None) -> None:
        if target is None:
            return
        if target == bookie_id:
            raise IncorrectParameterError(f"the target {target} is the bookie being recovered")
        if await self.bk.registration.registration(target) != "writable":
            raise IncorrectParameterError(f"the target {target} is not a registered writable bookie")

    async def recover(self, bookie_id: str, *, ledger_id: int | None = None, target: str | None = None,
                      skip_open: bool = False, delete_cookie: bool = False,
                      plans: list[LedgerPlan] | None = None,
                      on_progress: Callable[[RecoveryProgress], None] | None = None,
                      on_ledger: Callable[[RecoveryProgress, LedgerResult], None] | None = None) -> RecoverySummary:
        await self._check_target(bookie_id, target)
        if plans is None:
            plans = await self.affected_ledgers(bookie_id, ledger_id)
        progress = RecoveryProgress(len(plans))
        writable = set(await self.bk.registration.writable_bookies())
        await self.bk.placement.on_cluster_changed(writable)

        def choose(md: LedgerMetadata, index: int, lost: str) -> str | None:
            ensemble = md.segments[index][1]
            if target is not None:
                return None if target in ensemble else target
            # The client's placement policy picks the target, as BookKeeperAdmin's replaceBookie does:
            # with the rack-aware policy the segment's write quorums keep their racks.
            try:
                new = self.bk.placement.replace_bookies(ensemble, {lost}, writable - {lost},
                                                        write_quorum_size=md.write_quorum_size,
                                                        ack_quorum_size=md.ack_quorum_size,
                                                        custom_metadata=dict(md.custom_metadata))
            except NotEnoughBookiesError:
                return None
            return new[list(ensemble).index(lost)]

        def on_bytes(nbytes: int) -> None:
            progress.bytes_copied += nbytes
            progress.entries_copied += 1
            if on_progress is not None:
                try:
                    on_progress(progress)
                except Exception:
                    log.exception("progress callback failed")

        slots = asyncio.Semaphore(self.parallel_ledgers)
        results: list[LedgerResult] = []

        async def one(plan: LedgerPlan) -> None:
            async with slots:
                result = await self._recover_ledger(plan.ledger_id, bookie_id, choose, skip_open, target, on_bytes)
            results.append(result)
            progress.ledgers_done += 1
            if on_ledger is not None:
                try:
                    on_ledger(progress, result)
                except Exception:  # a display bug must not stop the recovery
                    log.exception("progress callback failed")

        await asyncio.gather(*(one(p) for p in plans))
        summary = RecoverySummary(bookie_id, sorted(results, key=lambda r: r.ledger_id), progress)
        if delete_cookie:
            await self._delete_cookie(summary)
        return summary

    async def _recover_ledger(self, ledger_id: int, bookie_id: str, choose, skip_open: bool, target: str | None,
                              on_bytes) -> LedgerResult:
        try:
            outcome = await self.replicator.replicate_ledger(ledger_id, {bookie_id}, choose, open_grace_s=0.0,
                                                             skip_open=skip_open, on_bytes=on_bytes)
        except BKError as e:
            log.warning("ledger %d: recovery failed: %s", ledger_id, e)
            return LedgerResult(ledger_id, "failed", str(e))
        if outcome.deleted:
            return LedgerResult(ledger_id, "deleted", None, outcome)
        if outcome.skipped_open:
            return LedgerResult(ledger_id, "skipped-open", None, outcome)
        if outcome.errors:  # the shares that could be copied were; these could not
            return LedgerResult(ledger_id, "failed", "; ".join(f"segment at entry {first}: {why}"
                                                                for first, _, why in outcome.errors), outcome)
        if outcome.left:
            why = (f"target {target} is already in the segment" if target is not None
                   else "no writable bookie outside the segment")
            firsts = ", ".join(str(first) for first, _ in outcome.left)
            return LedgerResult(ledger_id, "failed", f"segment(s) at entry {firsts} still name {bookie_id}: {why}",
                                outcome)
        return LedgerResult(ledger_id, "recovered", None, outcome)

    async def _delete_cookie(self, summary: RecoverySummary) -> None:
        bookie_id = summary.bookie_id
        if not summary.ok or summary.by_status("skipped-open"):
            summary.cookie_note = "cookie kept: some ledgers still use the bookie"
            return
        if await self.bk.registration.registration(bookie_id) is not None:
            summary.cookie_note = f"cookie kept: bookie {bookie_id} is registered (running)"
            return
        try:
            await CookieStore(self.bk.store).delete(bookie_id)
        except MetadataNotFoundError:
            summary.cookie_note = f"bookie {bookie_id} had no cookie"
            return
        summary.cookie_deleted = True
        summary.cookie_note = f"cookie of {bookie_id} deleted"
