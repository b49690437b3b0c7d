"""Placement adherence for AutoRecovery: the Auditor's check and the ReplicationWorker's repair.

The check (BookKeeper's Auditor.placementPolicyCheck): every *closed* ledger's
every segment is asked of the placement policy (`is_ensemble_adhering`); a
ledger with a FAIL segment does not adhere, one with only MEETS_SOFT ones
(besides strict ones) adheres softly. Open ledgers are skipped: their last
segment belongs to the writer, which may still change it.

The repair (BookKeeper's DATA_NOT_ADHERING_PLACEMENT fragments): for each FAIL
segment of a closed ledger, `replace_to_adhere` names an ensemble with as few
positions as possible given to other writable bookies. For every changed
position the bookie's share of the segment is copied to its new bookie
(replicator.EntryCopy: each entry read from a replica of its write set, digest
verified, the stored bytes written with a recovery add). Only when every new
bookie holds its whole share is the metadata changed, in one compare-and-set
that replaces the segment's ensemble - and only if the segment still has the
ensemble the plan was made for. So a replica is never dropped before its
replacement holds every entry; the old bookies keep their (now unreferenced)
copies until their garbage collector drops them.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable

from bk.client.placement import PlacementPolicyAdherence
from bk.errors import ReplicationError
from bk.meta.ledger_metadata import LedgerMetadata

from .replicator import EntryCopy, SegmentResult, bookie_entries, ledger_digest, segment_bounds, write_set

log = logging.getLogger(__name__)

FAIL = PlacementPolicyAdherence.FAIL
MEETS_SOFT = PlacementPolicyAdherence.MEETS_SOFT


async def segment_adherence(policy, md: LedgerMetadata) -> list[PlacementPolicyAdherence]:
    """The policy's verdict on each segment of `md` (racks of its bookies resolved first)."""
    await policy.resolve_bookies(md.bookies())
    return [PlacementPolicyAdherence(policy.is_ensemble_adhering(ensemble, md.write_quorum_size,
                                                                 md.ack_quorum_size))
            for _, ensemble in md.segments]


def ledger_adherence(verdicts: Iterable[PlacementPolicyAdherence]) -> PlacementPolicyAdherence:
    """A ledger is as good as its worst segment."""
    verdicts = set(verdicts)
    if FAIL in verdicts:
        return FAIL
    return MEETS_SOFT if MEETS_SOFT in verdicts else PlacementPolicyAdherence.MEETS_STRICT


@dataclass
class PlacementCheckResult:
    closed_ledgers: int = 0
    not_adhering: list[int] | None = None  # ledger ids with a FAIL segment
    softly_adhering: int = 0
    marked: int = 0

    def __post_init__(self) -> None:
        if self.not_adhering is None:
            self.not_adhering = []


class PlacementRepair:
    """Moves the FAIL segments of a closed ledger onto bookies the policy accepts (see the module doc)."""

    def __init__(self, bk, replicator):
        self.bk = bk
        self.replicator = replicator  # its window and rate limit apply to these copies too

    async def repair_ledger(self, ledger_id: int) -> tuple[list[SegmentResult], list[tuple[int, str]]]:
        """(segments moved, (segment first entry, bookie) positions still not adhering). A ledger that is
        not closed is left alone (nothing to report: the auditor only marks closed ones)."""
        policy = self.bk.placement
        md, _ = await self.bk.ledger_manager.read_ledger_metadata(ledger_id)
        if not md.is_closed:
            return [], []
        writable = set(await self.bk.registration.writable_bookies())
        await policy.on_cluster_changed(writable)
        verdicts = await segment_adherence(policy, md)
        moved: list[SegmentResult] = []
        left: list[tuple[int, str]] = []
        for index, verdict in enumerate(verdicts):
            if verdict != FAIL:
                continue
            first, ensemble = md.segments[index]
            new = policy.replace_to_adhere(list(ensemble), writable, md.write_quorum_size, md.ack_quorum_size,
                                           custom_metadata=dict(md.custom_metadata))
            if new is None or list(new) == list(ensemble):
                log.warning("ledger %d: segment at %d %s does not adhere to the placement policy and no writable"
                            " bookies can make it adhere; it stays as it is", ledger_id, first, list(ensemble))
                left += [(first, b) for b in ensemble]
                continue
            moved += await self.move_segment(ledger_id, md, index, list(new))
            md, _ = await self.bk.ledger_manager.read_ledger_metadata(ledger_id)
        return moved, left

    async def move_segment(self, ledger_id: int, md: LedgerMetadata, index: int,
                           new: list[str]) -> list[SegmentResult]:
        """Copy each changed position's share of segment `index` to its new bookie, then swap the ensemble."""
        first, last = segment_bounds(md, index)
        ensemble = list(md.segments[index][1])
        if last is None:
            raise ReplicationError(f"ledger {ledger_id}: segment at {first} has no end; only closed ledgers move")
        changed = [i for i, (old, b) in enumerate(zip(ensemble, new)) if old != b]
        if len(new) != len(ensemble) or any(new[i] in ensemble for i in changed) or len(set(new)) != len(new):
            raise ReplicationError(f"ledger {ledger_id}: placement gave {new} for segment {ensemble}: not a"
                                   " replacement by new, distinct bookies")
        digest, key = ledger_digest(ledger_id, md)
        results = []
        for i in changed:
            old, target = ensemble[i], new[i]
            entries = bookie_entries(first, last, md.ensemble_size, md.write_quorum_size, i)

            def replicas_for(entry_id: int, old=old) -> list[str]:
                # the bookie being moved away holds exactly this share: ask it first, then the others
                ws = write_set(md, ensemble, entry_id)
                return sorted(ws, key=lambda b: 0 if b == old else 1)

            op = EntryCopy(self.bk.pool, digest, key, entries, replicas_for, target,
                           self.replicator.window_entries, self.replicator.limiter, None)
            try:
                stats = await op.start()
            finally:
                op.cancel()
            results.append(SegmentResult(first, old, target, stats.entries, stats.bytes, True))
        # every new bookie holds its whole share: now, and only now, the metadata may name it instead
        planned = tuple(ensemble)

        def update(current: LedgerMetadata):
            segments = dict(current.segments)
            if not current.is_closed:
                raise ReplicationError(f"ledger {ledger_id}: no longer closed")
            if tuple(segments.get(first, ())) != planned:
                raise ReplicationError(f"ledger {ledger_id}: segment at {first} changed meanwhile"
                                       f" ({segments.get(first)}, was {list(planned)}); deciding again later")
            return current.with_segment_replaced(first, tuple(new))

        await self.bk.ledger_manager.update_ledger_metadata(ledger_id, update)
        log.info("ledger %d: segment at %d moved from %s to %s to adhere to the placement policy (%d entries,"
                 " %d bytes copied)", ledger_id, first, ensemble, new, sum(r.entries for r in results),
                 sum(r.bytes for r in results))
        return results
