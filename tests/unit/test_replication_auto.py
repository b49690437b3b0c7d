"""AutoRecovery logic on mem:// metadata: the auditor election, the Auditor's rules (delay,
cancellation, second loss, trigger, bookie and ledger checks) and the ReplicationWorker
(locks, disabled replication, segments it cannot take, open ledgers, grace period),
with fake bookies; then AutoRecovery inside real in-process BookieServers.
"""
from __future__ import annotations

import asyncio
import os
import shutil
from types import SimpleNamespace

import pytest

from test_client_support import FakeCluster, run_async, until
from test_replication import check_recovered, payloads, raw_entries_ok, write_ledger

from bk.client import BookKeeper
from bk.errors import LedgerClosedError, LedgerFencedError
from bk.meta import open_store
from bk.meta.cluster import init_new_cluster
from bk.meta.underreplication import LedgerUnderreplicationManager
from bk.proto import StatusCode
from bk.replication import Auditor, AuditorElector, ReplicationWorker, current_auditor
from bk.replication.admin import list_underreplicated, trigger_audit
from bk.testing.inprocess import InProcessCluster


class FakeAuditor:
    def __init__(self, name, log):
        self.name, self.log = name, log
        log.append(("start", name))

    async def stop(self):
        self.log.append(("stop", self.name))


# ---------------------------------------------------------------------- election
@run_async
async def test_one_auditor_at_a_time_and_a_new_one_when_it_dies():
    uri = "mem://election-test/ledgers"
    root = await open_store(uri)
    await init_new_cluster(root)
    log, stores, electors = [], [], []
    for i in range(3):
        store = await open_store(uri)
        stores.append(store)

        async def starter(name=f"b{i}:1"):
            return FakeAuditor(name, log)
        electors.append(AuditorElector(store, f"b{i}:1", starter, retry_s=0.05))
    for e in electors:
        e.start()
        await until(lambda e=e: e.vote is not None, "vote cast")
    await until(lambda: sum(e.is_auditor for e in electors) == 1, "one auditor")
    assert electors[0].is_auditor and await current_auditor(root) == "b0:1"
    data, _ = await root.get("/ledgers/underreplication/auditorelection")
    assert b'bookieId: "b0:1"' in data
    # the auditor's session dies: the next voter takes over, the old one steps down and votes again
    await stores[0].expire_session()
    await until(lambda: electors[1].is_auditor, "b1 elected")
    await until(lambda: electors[0].vote is not None and not electors[0].is_auditor, "b0 votes again")
    assert ("stop", "b0:1") in log and await current_auditor(root) == "b1:1"
    assert sum(e.is_auditor for e in electors) == 1
    # a clean stop withdraws the vote
    await electors[1].stop()
    await until(lambda: electors[2].is_auditor, "b2 elected")
    assert await current_auditor(root) == "b2:1"
    for e in electors:
        await e.stop()
    assert await current_auditor(root) is None
    for s in stores + [root]:
        await s.close()


# ---------------------------------------------------------------------- auditor
async def start_auditor(bkc, delay_s=0, **options):
    urm = LedgerUnderreplicationManager(bkc.store)
    auditor = await Auditor(bkc, urm, "auditor:1", lost_bookie_recovery_delay_s=delay_s, **options).start()
    return auditor, urm


async def marked(urm) -> dict[int, tuple]:
    return {r.ledger_id: tuple(sorted(r.missing_replicas)) for r in await list_underreplicated(urm)}


@run_async
async def test_auditor_marks_every_ledger_of_a_lost_bookie_at_once_with_no_delay():
    async with FakeCluster(5) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        ids = [b.bookie_id for b in cluster.bookies]
        on_victim = [(await write_ledger(bkc, 5, ensemble=ids[:3], seed=i))[0].ledger_id for i in range(3)]
        open_lh, _ = await write_ledger(bkc, 5, close=False, ensemble=[ids[2], ids[0], ids[4]])
        elsewhere, _ = await write_ledger(bkc, 5, ensemble=ids[1:4])
        auditor, urm = await start_auditor(bkc)
        assert await urm.get_lost_bookie_recovery_delay(99) == 0  # published at start
        await cluster.kill(cluster.bookies[0])
        expected = {lid: (ids[0],) for lid in on_victim + [open_lh.ledger_id]}
        await until(lambda: marked(urm), "ledgers marked")
        await until(lambda: auditor.audits >= 1 and not auditor._lock.locked(), "audit done")
        assert await marked(urm) == expected and elsewhere.ledger_id not in expected
        # read-only counts as available: no audit when a bookie turns read-only
        await cluster.set_readonly(cluster.bookies[1])
        await asyncio.sleep(0.2)
        assert await marked(urm) == expected
        await auditor.stop()


@run_async
async def test_delay_postpones_the_audit_and_a_returning_bookie_cancels_it():
    async with FakeCluster(4) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        ids = [b.bookie_id for b in cluster.bookies]
        lh, _ = await write_ledger(bkc, 5, ensemble=ids[:3])
        auditor, urm = await start_auditor(bkc, delay_s=3600)
        await cluster.kill(cluster.bookies[0])
        await until(lambda: auditor.pending == {ids[0]}, "audit pending")
        assert await marked(urm) == {}
        await cluster.registrations[ids[0]].register(ids[0])  # back in time
        await until(lambda: auditor.delayed_audits_cancelled == 1, "delayed audit cancelled")
        assert not auditor.pending and auditor._delayed is None and await marked(urm) == {}
        # lost again; now the delay is shortened live: the audit is rescheduled with the new value
        await cluster.kill(cluster.bookies[0])
        await until(lambda: auditor.pending == {ids[0]}, "audit pending again")
        await urm.set_lost_bookie_recovery_delay(1)
        await until(lambda: marked(urm), "marked after the new delay")
        assert await marked(urm) == {lh.ledger_id: (ids[0],)}
        await auditor.stop()


@run_async
async def test_a_second_loss_audits_at_once_and_a_trigger_audits_now():
    async with FakeCluster(5) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        ids = [b.bookie_id for b in cluster.bookies]
        a, _ = await write_ledger(bkc, 5, ensemble=ids[:3])
        b, _ = await write_ledger(bkc, 5, ensemble=ids[1:4], seed=2)
        c, _ = await write_ledger(bkc, 5, ensemble=[ids[4], ids[2], ids[3]], seed=3)
        auditor, urm = await start_auditor(bkc, delay_s=3600)
        await cluster.kill(cluster.bookies[0])
        await until(lambda: auditor.pending == {ids[0]}, "first loss pending")
        await cluster.kill(cluster.bookies[1])
        await until(lambda: marked(urm), "second loss audits at once")
        await until(lambda: not auditor.pending and not auditor._lock.locked(), "audit done")
        assert await marked(urm) == {a.ledger_id: tuple(sorted(ids[:2])), b.ledger_id: (ids[1],)}
        # a bookie lost with nothing pending waits again; the trigger (same value) audits now
        await cluster.kill(cluster.bookies[4])
        await until(lambda: auditor.pending == {ids[4]}, "pending")
        assert await trigger_audit(urm) == 3600
        await until(lambda: marked_has(urm, c.ledger_id), "triggered audit marked the third ledger")
        assert not auditor.pending
        await auditor.stop()


async def marked_has(urm, ledger_id) -> bool:
    return ledger_id in await marked(urm)


@run_async
async def test_startup_bookie_check_and_periodic_ledger_check():
    async with FakeCluster(4) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        ids = [b.bookie_id for b in cluster.bookies]
        a, _ = await write_ledger(bkc, 9, ensemble=ids[:3])
        b, _ = await write_ledger(bkc, 9, ensemble=ids[1:4], seed=2)
        await cluster.kill(cluster.bookies[0])  # lost before any auditor ran
        # bookie 3 silently loses an entry of ledger b (its last one in its share)
        del cluster.bookies[3].entries[(b.ledger_id, 8)]
        auditor, urm = await start_auditor(bkc, check_interval_s=0.3)
        await until(lambda: marked_has(urm, a.ledger_id), "startup bookie check marked ledger a")
        await until(lambda: marked_has(urm, b.ledger_id), "ledger check marked ledger b")
        assert await marked(urm) == {a.ledger_id: (ids[0],), b.ledger_id: (ids[3],)}
        await auditor.stop()


@run_async
async def test_ledger_check_marks_a_registered_bookie_that_cannot_answer_and_leaves_a_lost_one_to_the_bookie_check():
    """A registered bookie that answers a probe with an error (EIO: it may have lost the
    share) is marked by the ledger check, as BookKeeper's checker counts any failed read as
    a bad fragment; the worker's own check then decides what to copy. A bookie that is not
    registered is the bookie check's, with its delay: the ledger check leaves it alone."""
    async with FakeCluster(4) as cluster, BookKeeper(cluster.metadata_uri, read_timeout_s=2) as bkc:
        ids = [b.bookie_id for b in cluster.bookies]
        a, _ = await write_ledger(bkc, 9, ensemble=ids[:3])
        b, _ = await write_ledger(bkc, 9, ensemble=ids[1:4], seed=2)
        cluster.bookies[0].read_hook = lambda req: int(StatusCode.EIO)
        await cluster.kill(cluster.bookies[3])
        auditor, urm = await start_auditor(bkc, delay_s=3600, check_interval_s=0, bookie_check_interval_s=0)
        await until(lambda: ids[3] not in auditor.available, "bookie 3 seen gone")
        assert await auditor.check_all_ledgers() == 1
        assert await marked(urm) == {a.ledger_id: (ids[0],)}
        await auditor.stop()


# ---------------------------------------------------------------------- worker
async def start_worker(bkc, bookie_id, **options):
    urm = LedgerUnderreplicationManager(bkc.store)
    options.setdefault("idle_poll_s", 0.05)
    options.setdefault("backoff_first_s", 0.05)
    worker = ReplicationWorker(bkc, urm, bookie_id, **options)
    worker.start()
    return worker, urm


@pytest.mark.timeout(30)
@run_async
async def test_a_worker_whose_cancellation_is_swallowed_once_still_stops():
    """Chaos seed 107897 hung: a power cut's crash waited for ReplicationWorker.stop(), and the
    worker's task, asked to cancel, slept on at the idle poll: the CancelledError had been
    swallowed below _take() (3.11's wait_for can, when the inner call finishes as the outer task
    is cancelled). Here _take swallows it on purpose; the worker must stop all the same."""
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        worker, _ = await start_worker(bkc, cluster.bookies[0].bookie_id)
        inside = asyncio.Event()

        async def take_swallowing_a_cancel():
            inside.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass  # swallowed: the task stays "cancelling" and its coroutine goes on
            return None
        worker._take = take_swallowing_a_cancel
        await asyncio.wait_for(inside.wait(), 10)
        await asyncio.wait_for(worker.stop(), 10)
        assert not worker.running


@run_async
async def test_worker_replicates_a_marked_ledger_to_its_own_bookie_and_unmarks_it():
    async with FakeCluster(4) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        ids = [b.bookie_id for b in cluster.bookies]
        lh, data = await write_ledger(bkc, 50, ensemble=ids[:3])
        urm = LedgerUnderreplicationManager(bkc.store)
        await urm.disable_ledger_replication()
        await cluster.kill(cluster.bookies[0])
        await urm.mark_ledger_underreplicated(lh.ledger_id, [ids[0]])
        async with BookKeeper(cluster.metadata_uri) as wbk:
            worker, _ = await start_worker(wbk, ids[3])
            await asyncio.sleep(0.3)
            assert worker.segments_replicated == 0 and await urm.is_ledger_underreplicated(lh.ledger_id)
            await urm.enable_ledger_replication()
            await until(lambda: worker.ledgers_replicated == 1, "replicated")
            assert not await urm.is_ledger_underreplicated(lh.ledger_id)
            assert await urm.lock_holder(lh.ledger_id) is None
            md = await bkc.get_ledger_metadata(lh.ledger_id)
            assert md.segments[0][1][0] == ids[3]
            await check_recovered(bkc, lh.ledger_id, data, ids[0], last_entry_id=49)
            await worker.stop()


@run_async
async def test_locked_ledgers_and_segments_with_the_workers_own_bookie_are_left_to_others():
    async with FakeCluster(5) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        ids = [b.bookie_id for b in cluster.bookies]
        # two segments: the first has ids[3], so worker ids[3] can only do the second one
        lh = await bkc.create_ledger(3, 2, 2, password=b"pw")
        await bkc.ledger_manager.update_ledger_metadata(
            lh.ledger_id, lambda md: md.replace(segments=((0, (ids[0], ids[1], ids[3])),)))
        lh._set_ensemble((ids[0], ids[1], ids[3]))
        data = payloads(20, 1)
        await asyncio.gather(*(lh.add_entry(x) for x in data[:10]))
        await bkc.ledger_manager.update_ledger_metadata(
            lh.ledger_id, lambda md: md.with_ensemble_change(10, (ids[0], ids[1], ids[2])))
        lh._set_ensemble((ids[0], ids[1], ids[2]))
        await asyncio.gather(*(lh.add_entry(x) for x in data[10:]))
        await lh.close()
        await cluster.kill(cluster.bookies[0])
        urm = LedgerUnderreplicationManager(bkc.store)
        await urm.mark_ledger_underreplicated(lh.ledger_id, [ids[0]])
        other = LedgerUnderreplicationManager(await open_store(cluster.metadata_uri))
        assert await other.acquire_ledger_lock(lh.ledger_id, "someone-else:1")
        async with BookKeeper(cluster.metadata_uri) as w3, BookKeeper(cluster.metadata_uri) as w4:
            worker3, _ = await start_worker(w3, ids[3])
            await asyncio.sleep(0.3)
            assert worker3.segments_replicated == 0  # locked by someone else
            await other.release_ledger_lock(lh.ledger_id)
            await until(lambda: worker3.segments_replicated == 1, "worker 3 did the segment it can")
            await until(lambda: worker3.current is None, "worker 3 let go")
            assert await urm.is_ledger_underreplicated(lh.ledger_id)
            worker4, _ = await start_worker(w4, ids[4])
            await until(lambda: worker4.ledgers_replicated == 1, "worker 4 finished the ledger")
            assert not await urm.is_ledger_underreplicated(lh.ledger_id)
            md = await bkc.get_ledger_metadata(lh.ledger_id)
            assert md.segments == ((0, (ids[4], ids[1], ids[3])), (10, (ids[3], ids[1], ids[2])))
            await check_recovered(bkc, lh.ledger_id, data, ids[0], last_entry_id=19)
            await worker3.stop()
            await worker4.stop()
        await other.store.close()


@run_async
async def test_open_ledger_gets_a_grace_period_then_is_fenced_and_closed():
    async with FakeCluster(4) as cluster, BookKeeper(cluster.metadata_uri, add_timeout_s=2) as bkc:
        ids = [b.bookie_id for b in cluster.bookies]
        writer, data = await write_ledger(bkc, 25, close=False, ensemble=ids[:3])
        await cluster.kill(cluster.bookies[0])
        urm = LedgerUnderreplicationManager(bkc.store)
        await urm.mark_ledger_underreplicated(writer.ledger_id, [ids[0]])
        async with BookKeeper(cluster.metadata_uri) as wbk:
            worker, _ = await start_worker(wbk, ids[3], open_grace_s=0.5)
            await until(lambda: worker.ledgers_replicated == 1, "replicated")
            await check_recovered(bkc, writer.ledger_id, data, ids[0], last_entry_id=24)
            await worker.stop()
        with pytest.raises((LedgerFencedError, LedgerClosedError)):
            await writer.add_entry(b"after the fence")


@run_async
async def test_a_writer_that_moves_on_within_the_grace_period_is_not_fenced():
    async with FakeCluster(5) as cluster, BookKeeper(cluster.metadata_uri, add_timeout_s=2) as bkc:
        ids = [b.bookie_id for b in cluster.bookies]
        writer, data = await write_ledger(bkc, 10, close=False, ensemble=ids[:3])
        await cluster.kill(cluster.bookies[0])
        urm = LedgerUnderreplicationManager(bkc.store)
        await urm.mark_ledger_underreplicated(writer.ledger_id, [ids[0]])
        async with BookKeeper(cluster.metadata_uri) as wbk:
            worker, _ = await start_worker(wbk, ids[3], open_grace_s=30)
            await until(lambda: worker.current == writer.ledger_id, "worker waits in the grace period")
            more = payloads(10, 7)
            await asyncio.gather(*(writer.add_entry(x) for x in more))  # ensemble change away from ids[0]
            await until(lambda: worker.ledgers_replicated == 1, "replicated without fencing")
            md = await bkc.get_ledger_metadata(writer.ledger_id)
            assert not md.is_closed and ids[0] not in md.bookies()
            await writer.add_entry(b"still writing")
            await worker.stop()


@run_async
async def test_a_marked_bookie_that_is_back_with_its_data_is_not_copied():
    async with FakeCluster(4) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        ids = [b.bookie_id for b in cluster.bookies]
        lh, _ = await write_ledger(bkc, 10, ensemble=ids[:3])
        urm = LedgerUnderreplicationManager(bkc.store)
        await urm.mark_ledger_underreplicated(lh.ledger_id, [ids[0]])  # e.g. it was down for a while
        async with BookKeeper(cluster.metadata_uri) as wbk:
            worker, _ = await start_worker(wbk, ids[3])
            await until(lambda: worker.ledgers_replicated == 1, "unmarked")
            assert worker.segments_replicated == 0
            assert (await bkc.get_ledger_metadata(lh.ledger_id)).segments[0][1] == tuple(ids[:3])
            await worker.stop()


@run_async
async def test_seed_89_only_the_lacking_shares_move_when_every_bookie_is_marked():
    # Chaos seed 89: a 2/2/1 ledger over three bookies whose writer died; each bookie lacks an
    # entry of one segment and the auditor marks all three. Workers used to treat every marked
    # bookie as lost in every segment and swapped bookies back and forth for ever; each must
    # replace only the share its probe finds lacking, and the marker must go.
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        ids = [b.bookie_id for b in cluster.bookies]
        plan = [(0, (ids[0], ids[1])), (10, (ids[1], ids[2])), (20, (ids[2], ids[0]))]
        lh = await bkc.create_ledger(2, 2, 1, password=b"pw")
        await bkc.ledger_manager.update_ledger_metadata(lh.ledger_id, lambda md: md.replace(segments=(plan[0],)))
        data = payloads(30, 3)
        for first, ensemble in plan:
            if first:
                await bkc.ledger_manager.update_ledger_metadata(
                    lh.ledger_id, lambda md, f=first, e=ensemble: md.with_ensemble_change(f, e))
            lh._set_ensemble(ensemble)
            await asyncio.gather(*(lh.add_entry(x) for x in data[first:first + 10]))
        await lh.close()
        for bookie, entry_id in ((0, 9), (1, 10), (2, 29)):  # the last or first entry of a share
            del cluster.bookies[bookie].entries[(lh.ledger_id, entry_id)]
        urm = LedgerUnderreplicationManager(bkc.store)
        await urm.mark_ledger_underreplicated(lh.ledger_id, ids)
        clients = [BookKeeper(cluster.metadata_uri) for _ in ids]
        workers = []
        try:
            for c, bookie_id in zip(clients, ids):
                await c.start()
                workers.append((await start_worker(c, bookie_id))[0])
            await until(lambda: sum(w.ledgers_replicated for w in workers) == 1, "the marker went")
            assert not await urm.is_ledger_underreplicated(lh.ledger_id)
            assert sum(w.segments_replicated for w in workers) == 3  # one share per segment, no swapping back
            md = await bkc.get_ledger_metadata(lh.ledger_id)
            assert md.segments == ((0, (ids[2], ids[1])), (10, (ids[0], ids[2])), (20, (ids[1], ids[0])))
            await raw_entries_ok(bkc, lh.ledger_id, data)
        finally:
            for w in workers:
                await w.stop()
            for c in clients:
                await c.close()


# ---------------------------------------------------------------------- inside real bookies
@run_async
async def test_autorecovery_inside_in_process_bookies_brings_a_wiped_bookie_back_to_full_replication(tmp_path):
    options = dict(autorecovery_enabled=True, open_ledger_rereplication_grace_period_ms=300,
                   rereplication_entry_batch_size=16)
    async with InProcessCluster(tmp_path, bookies=4, **options) as cluster:
        await until(lambda: sum(s.autorecovery.is_auditor for s in cluster.servers.values()) == 1, "auditor")
        async with BookKeeper(cluster.metadata_uri, add_timeout_s=3) as bkc:
            ids = cluster.bookie_ids
            victim_index = 3
            victim = ids[victim_index]
            ledgers = {}
            for i, shape in enumerate(((3, 2, 2), (3, 3, 2), (2, 2, 2))):
                lh, data = await write_ledger(bkc, 40, *shape, seed=i, ensemble=[victim] + ids[:shape[0] - 1])
                ledgers[lh.ledger_id] = data
            writer, open_data = await write_ledger(bkc, 15, close=False, ensemble=[victim] + ids[:2], seed=9)
            await cluster.stop_bookie(victim_index)
            shutil.rmtree(os.path.join(str(tmp_path), f"bookie-{victim_index}"))
            urm = LedgerUnderreplicationManager(bkc.store)

            async def fully_replicated():
                using = [lid for lid in [*ledgers, writer.ledger_id]
                         if victim in (await bkc.get_ledger_metadata(lid)).bookies()]
                return not using and not await urm.list_underreplicated_ledgers()
            await until(fully_replicated, "every ledger fully replicated", wait_s=60)
            for lid, data in ledgers.items():
                await check_recovered(bkc, lid, data, victim, last_entry_id=len(data) - 1)
            await check_recovered(bkc, writer.ledger_id, open_data, victim, last_entry_id=14)
            with pytest.raises((LedgerFencedError, LedgerClosedError)):
                await writer.add_entry(b"fenced out")
            workers = [s.autorecovery.worker for s in cluster.servers.values()]
            assert sum(w.ledgers_replicated for w in workers) >= 1
            await urm.close()


@run_async
async def test_a_stale_marker_is_cleared_even_when_every_worker_is_in_the_segment():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        ids = [b.bookie_id for b in cluster.bookies]
        lh, _ = await write_ledger(bkc, 10, ensemble=ids)
        urm = LedgerUnderreplicationManager(bkc.store)
        await urm.mark_ledger_underreplicated(lh.ledger_id, [ids[0]])  # e.g. marked while it restarted
        async with BookKeeper(cluster.metadata_uri) as wbk:
            worker, _ = await start_worker(wbk, ids[1])
            await until(lambda: worker.ledgers_replicated == 1, "unmarked")
            assert not await urm.is_ledger_underreplicated(lh.ledger_id)
            await worker.stop()
        # a marked bookie that is really gone, with every live bookie in the segment: nobody can help,
        # and nobody holds the lock for nothing
        await cluster.kill(cluster.bookies[0])
        await urm.mark_ledger_underreplicated(lh.ledger_id, [ids[0]])
        async with BookKeeper(cluster.metadata_uri) as wbk:
            worker, _ = await start_worker(wbk, ids[1])
            await until(lambda: lh.ledger_id in worker._deferred, "looked at and deferred")
            assert await urm.lock_holder(lh.ledger_id) is None and worker.failures == 0
            assert await urm.is_ledger_underreplicated(lh.ledger_id)
            await worker.stop()


class _WatchedLedgers:
    """A ledger manager whose one ledger stays open with a lost bookie; `change()` fires its watch."""

    def __init__(self, md):
        self.md, self.watchers = md, []

    async def read_ledger_metadata(self, ledger_id):
        return self.md, 1

    async def watch_ledger_metadata(self, ledger_id, cb):
        self.watchers.append(cb)
        return SimpleNamespace(cancel=lambda: None)

    def change(self):
        for cb in self.watchers:
            cb(self.md, 1)


@pytest.mark.parametrize("iterations", [0, 1, 2])
def test_a_worker_cancelled_as_the_ledgers_metadata_changes_is_cancelled(iterations):
    """Chaos seed 107897's lost cancellation, scripted: the worker waits out an open ledger's grace
    period on a metadata watch; the watch fires and the worker's task is cancelled in the same
    loop iteration (or one or two later). With asyncio.wait_for (Python 3.11) the cancellation
    was swallowed and the task went on; the grace wait must end in CancelledError."""
    from bk.meta.ledger_metadata import LedgerMetadata
    from bk.replication.replicator import LedgerReplicator

    async def main():
        md = LedgerMetadata.new(["a:1", "b:1", "c:1"], 2, 2, password=b"pw")
        lm = _WatchedLedgers(md)
        replicator = LedgerReplicator(SimpleNamespace(ledger_manager=lm))
        task = asyncio.ensure_future(replicator.close_open_ledger(1, ["a:1"], grace_s=30))
        for _ in range(3):
            await asyncio.sleep(0)
        assert lm.watchers and not task.done()  # waiting out the grace period
        lm.change()
        for _ in range(iterations):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)
    asyncio.run(main())
