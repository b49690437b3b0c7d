"""The Auditor's placement policy check and the ReplicationWorker's repair of ledgers that do not adhere
(bk/replication/placement.py), on mem:// metadata with fake bookies: racks from a static mapping."""
from __future__ import annotations

import asyncio
import contextlib
import time

from test_client_support import FakeCluster, run_async, until
from test_replication import payloads, raw_entries_ok, write_ledger

from bk import metrics
from bk.client import BookKeeper
from bk.client.placement import PlacementPolicyAdherence
from bk.errors import MetadataStoreError
from bk.meta.underreplication import LedgerUnderreplicationManager
from bk.replication import Auditor, ReplicationWorker
from bk.replication.admin import list_underreplicated, trigger_audit


def racks(ids):
    """Four bookies in /r1, the rest in /r2."""
    return {b: ("/r1" if i < 4 else "/r2") for i, b in enumerate(ids)}


async def marked(urm) -> dict[int, tuple]:
    return {r.ledger_id: tuple(r.missing_replicas) for r in await list_underreplicated(urm)}


async def adherence(bkc, ledger_id):
    md = await bkc.get_ledger_metadata(ledger_id)
    await bkc.placement.resolve_bookies(md.bookies())
    return [bkc.placement.is_ensemble_adhering(e, md.write_quorum_size, md.ack_quorum_size) for _, e in md.segments]


async def one_rack_ledger(bkc, ids, n=40, seed=1):
    """A closed ledger (E4 WQ2 AQ2, striped) on the four /r1 bookies: every write quorum in one rack."""
    return await write_ledger(bkc, n, 4, 2, 2, ensemble=ids[:4], seed=seed)


@contextlib.asynccontextmanager
async def racked_cluster():
    """8 fake bookies in two racks; a writer's client and a worker's client that know the racks."""
    async with FakeCluster(8) as cluster:
        ids = [b.bookie_id for b in cluster.bookies]
        layout = racks(ids)
        async with BookKeeper(cluster.metadata_uri, network_topology_mapping=layout) as bkc, \
                BookKeeper(cluster.metadata_uri, network_topology_mapping=layout) as wbk:
            yield cluster, ids, layout, bkc, wbk


@run_async
async def test_placement_check_counts_closed_ledgers_and_marks_failing_ones_only_when_repair_is_on():
    async with racked_cluster() as (cluster, ids, layout, bkc, _):
        bad, _ = await one_rack_ledger(bkc, ids)
        good, _ = await write_ledger(bkc, 10, 4, 2, 2, ensemble=[ids[0], ids[4], ids[1], ids[5]], seed=2)
        still_open, _ = await write_ledger(bkc, 5, ensemble=ids[:3], close=False, seed=3)
        assert await adherence(bkc, bad.ledger_id) == [PlacementPolicyAdherence.FAIL]
        assert await adherence(bkc, good.ledger_id) == [PlacementPolicyAdherence.MEETS_STRICT]
        urm = LedgerUnderreplicationManager(bkc.store)
        # repair off: counted, not marked
        auditor = Auditor(bkc, urm, "auditor:1", check_interval_s=0, bookie_check_interval_s=0,
                          placement_check_interval_s=3600)
        result = await auditor.check_placement()
        assert result.closed_ledgers == 2 and result.not_adhering == [bad.ledger_id]
        assert result.softly_adhering == 0 and result.marked == 0 and await marked(urm) == {}
        assert metrics.AUDITOR_NUM_LEDGERS_NOT_ADHERING_TO_PLACEMENT_POLICY.fn() == 1
        assert metrics.AUDITOR_NUM_LEDGERS_SOFTLY_ADHERING_TO_PLACEMENT_POLICY.fn() == 0
        page = metrics.exposition()[0].decode()
        assert "auditor_NUM_LEDGERS_NOT_ADHERING_TO_PLACEMENT_POLICY 1" in page
        assert "auditor_PLACEMENT_POLICY_CHECK_TIME" in page
        # repair on, periodic: the failing closed ledger is marked with no missing bookie (BookKeeper's way)
        auditor = await Auditor(bkc, urm, "auditor:1", check_interval_s=0, bookie_check_interval_s=0,
                                placement_check_interval_s=3600, repair_placement=True).start()
        await until(lambda: auditor.last_placement_check is not None, "first placement check at start")
        assert await marked(urm) == {bad.ledger_id: ()}
        await auditor.stop()


@contextlib.asynccontextmanager
async def repairing_auditor():
    """8 fake bookies in two racks, a client that knows them, and an Auditor whose placement check (with
    repair) ran its first pass at start; the next periodic one is an hour away."""
    async with racked_cluster() as (cluster, ids, layout, bkc, _):
        urm = LedgerUnderreplicationManager(bkc.store)
        auditor = await Auditor(bkc, urm, "auditor:1", check_interval_s=0, bookie_check_interval_s=0,
                                placement_check_interval_s=3600, repair_placement=True).start()
        try:
            await until(lambda: auditor.last_placement_check is not None, "first check")
            yield ids, bkc, urm, auditor
        finally:
            await auditor.stop()


@run_async
async def test_the_audit_trigger_also_runs_the_placement_check_when_it_is_on():
    async with repairing_auditor() as (ids, bkc, urm, auditor):
        bad, _ = await one_rack_ledger(bkc, ids)  # written after the check: the next one is an hour away
        assert await marked(urm) == {}
        await trigger_audit(urm)
        await until(lambda: marked(urm), "the trigger ran the placement check")
        assert await marked(urm) == {bad.ledger_id: ()}


@run_async
async def test_a_failed_triggered_placement_check_leaves_the_trigger_working():
    async with repairing_auditor() as (ids, bkc, urm, auditor):
        bad, _ = await one_rack_ledger(bkc, ids)
        audits = auditor.audits

        async def broken(bookies):
            raise MetadataStoreError("rack layout unreadable")
        bkc.placement.resolve_bookies = broken
        await trigger_audit(urm)
        await until(lambda: auditor.audits > audits and not auditor._lock.locked(), "triggered audit ran")
        assert await marked(urm) == {}
        del bkc.placement.resolve_bookies
        await trigger_audit(urm)  # the watch is still there
        await until(lambda: marked(urm), "the next trigger checked placement")
        assert await marked(urm) == {bad.ledger_id: ()}


async def start_worker(bkc, bookie_id, **options):
    urm = LedgerUnderreplicationManager(bkc.store)
    worker = ReplicationWorker(bkc, urm, bookie_id, idle_poll_s=0.05, backoff_first_s=0.05, **options)
    worker.start()
    return worker, urm


async def two_segment_ledger(bkc, first_ensemble, second_ensemble, n=60):
    """A closed ledger (E4 WQ2 AQ2) whose entries 0..n/2-1 are on `first_ensemble`, the rest on the second."""
    lh = await bkc.create_ledger(4, 2, 2, password=b"pw")
    await bkc.ledger_manager.update_ledger_metadata(
        lh.ledger_id, lambda md: md.replace(segments=((0, tuple(first_ensemble)),)))
    lh._set_ensemble(tuple(first_ensemble))
    data = payloads(n, 7)
    await asyncio.gather(*(lh.add_entry(x) for x in data[:n // 2]))
    await bkc.ledger_manager.update_ledger_metadata(
        lh.ledger_id, lambda md: md.with_ensemble_change(n // 2, tuple(second_ensemble)))
    lh._set_ensemble(tuple(second_ensemble))
    await asyncio.gather(*(lh.add_entry(x) for x in data[n // 2:]))
    await lh.close()
    return lh, data


@run_async
async def test_worker_moves_a_failing_segment_to_bookies_that_adhere_and_every_replica_holds_every_entry():
    async with racked_cluster() as (cluster, ids, layout, bkc, wbk):
        adhering = (ids[0], ids[4], ids[1], ids[5])
        lh, data = await two_segment_ledger(bkc, ids[:4], adhering)  # the first segment is all /r1
        assert await adherence(bkc, lh.ledger_id) == [PlacementPolicyAdherence.FAIL,
                                                      PlacementPolicyAdherence.MEETS_STRICT]
        urm = LedgerUnderreplicationManager(bkc.store)
        await urm.mark_ledger_underreplicated(lh.ledger_id, [])  # what the auditor's check does
        before = metrics.NUM_NOT_ADHERING_PLACEMENT_LEDGERS_REPLICATED.value
        worker, _ = await start_worker(wbk, ids[0], repair_placement=True)
        await until(lambda: worker.ledgers_replicated == 1, "repaired")
        await worker.stop()
        assert not await urm.is_ledger_underreplicated(lh.ledger_id)
        md = await bkc.get_ledger_metadata(lh.ledger_id)
        assert md.is_closed and md.last_entry_id == 59 and [f for f, _ in md.segments] == [0, 30]
        moved = md.segments[0][1]
        assert md.segments[1][1] == adhering  # only the failing segment moved
        assert len(set(moved)) == 4 and {layout[b] for b in moved} == {"/r1", "/r2"}
        assert len(set(moved) - set(ids[:4])) == 2  # the fewest positions: every other one
        assert await adherence(bkc, lh.ledger_id) == [PlacementPolicyAdherence.MEETS_STRICT] * 2
        await raw_entries_ok(bkc, lh.ledger_id, data)  # every entry on every replica the metadata names
        rh = await bkc.open_ledger(lh.ledger_id, b"pw")
        assert [bytes(e.data) for e in await rh.read_entries(0, 59)] == data
        assert metrics.NUM_NOT_ADHERING_PLACEMENT_LEDGERS_REPLICATED.value == before + 1
        assert worker.segments_replicated == 2  # one copy per changed position


@run_async
async def test_a_worker_without_repair_only_clears_the_marker_and_a_failed_copy_changes_no_metadata():
    async with racked_cluster() as (cluster, ids, layout, bkc, wbk):
        lh, data = await one_rack_ledger(bkc, ids)
        urm = LedgerUnderreplicationManager(bkc.store)
        original = (await bkc.get_ledger_metadata(lh.ledger_id)).segments
        # the /r2 bookies stay registered writable but do not answer: no copy can complete
        for bookie in cluster.bookies[4:]:
            await bookie.stop()
        await urm.mark_ledger_underreplicated(lh.ledger_id, [])
        worker, _ = await start_worker(wbk, ids[0], repair_placement=True)
        await until(lambda: worker.failures >= 1, "the copy failed")
        await worker.stop()
        assert (await bkc.get_ledger_metadata(lh.ledger_id)).segments == original
        assert await urm.is_ledger_underreplicated(lh.ledger_id)  # stays marked for a later try
        await raw_entries_ok(bkc, lh.ledger_id, data)
        # a worker with repair off has nothing to do for it: the marker goes, the ledger stays
        plain, _ = await start_worker(wbk, ids[1])
        await until(lambda: plain.ledgers_replicated == 1, "marker cleared")
        await plain.stop()
        assert (await bkc.get_ledger_metadata(lh.ledger_id)).segments == original


@run_async
async def test_a_new_auditor_resumes_the_placement_check_by_its_recorded_last_run():
    async with racked_cluster() as (cluster, ids, layout, bkc, _):
        bad, _ = await one_rack_ledger(bkc, ids)
        urm = LedgerUnderreplicationManager(bkc.store)
        options = dict(check_interval_s=0, bookie_check_interval_s=0, placement_check_interval_s=3600,
                       repair_placement=True)
        await urm.set_check_ctime("placementpolicycheck", int(time.time() * 1000))  # ran just now
        auditor = await Auditor(bkc, urm, "auditor:1", **options).start()
        await asyncio.sleep(0.3)
        assert auditor.last_placement_check is None and await marked(urm) == {}
        await auditor.stop()
        # forceauditchecks -ppc sets the record 21 days back: overdue, so the next auditor runs it at once
        await urm.set_check_ctime("placementpolicycheck", int((time.time() - 21 * 86400) * 1000))
        auditor = await Auditor(bkc, urm, "auditor:1", **options).start()
        await until(lambda: auditor.last_placement_check is not None, "overdue check run at start")
        assert await marked(urm) == {bad.ledger_id: ()}
        async def recorded():
            return await urm.get_check_ctime("placementpolicycheck") > time.time() * 1000 - 60_000
        await until(recorded, "the run recorded")
        await auditor.stop()
