"""BP-46 (journal off) on an in-process cluster: detection at boot, phase one, limbo on the wire,
phase-two self-repair. The same with real `bk bookie` processes on ZooKeeper:
tests/integration/test_journal_off.py."""
from __future__ import annotations

import asyncio

import pytest

from bk.client import BookKeeper
from bk.errors import LedgerFencedError, LedgerLimboError, NoSuchEntryError
from bk.meta.ledger_manager import LedgerManager
from bk.testing.inprocess import InProcessCluster

PW = b"pw"
OFF = dict(journal_write_data=False, flush_interval_ms=3_600_000)  # nothing checkpointed unless asked


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def write(bkc, n, e=3, wq=3, aq=2, close=False):
    lh = await bkc.create_ledger(e, wq, aq, password=PW)
    for i in range(n):
        await lh.add_entry(b"entry-%d" % i)
    if close:
        await lh.close()
    return lh


def test_one_bookie_crashes_repairs_itself(tmp_path):
    async def main():
        async with InProcessCluster(tmp_path, bookies=3, **OFF) as cluster:
            async with BookKeeper(cluster.metadata_uri) as bkc:
                closed = await write(bkc, 20, close=True)
                open_ = await write(bkc, 30)
                await cluster.crash_bookie(0)
                server = await cluster.start_bookie(0)
                bookie = server.bookie
                assert server.phase_one is not None and server.phase_one.ledgers_marked == 2
                # lost every entry (never checkpointed) and answers "unknown", never "no such entry"
                for lid in (closed.ledger_id, open_.ledger_id):
                    assert bookie.is_limbo(lid) and bookie.is_fenced(lid)
                await server.repair.wait()
                assert server.repair.status.ledgers_recovered == 1
                # recovery wrote the open ledger's last entry back to every bookie, this one included
                assert server.repair.status.entries_copied == 49
                assert not bookie.needs_integrity_check and not bookie.limbo_ledgers()
                for lid, n in ((closed.ledger_id, 20), (open_.ledger_id, 30)):
                    assert bookie.missing_entries(lid, range(n)) == []
                md, _ = await LedgerManager(bkc.store).read_ledger_metadata(open_.ledger_id)
                assert md.is_closed and md.last_entry_id == 29
                with pytest.raises(LedgerFencedError):
                    await open_.add_entry(b"late")
    run(main())


def test_clean_restart_fences_nothing(tmp_path):
    async def main():
        async with InProcessCluster(tmp_path, bookies=3, **OFF) as cluster:
            async with BookKeeper(cluster.metadata_uri) as bkc:
                lh = await write(bkc, 10)
                await cluster.stop_bookie(0)  # SIGTERM's path: final checkpoint, flag cleared
                server = await cluster.start_bookie(0)
                b = server.bookie
                assert server.phase_one is None and server.repair is None
                assert not b.needs_integrity_check and not b.is_fenced(lh.ledger_id) and not b.limbo_ledgers()
                assert b.missing_entries(lh.ledger_id, range(10)) == []
                await lh.add_entry(b"more")  # the writer carries on
    run(main())


def test_limbo_answers_and_fence_before_repair(tmp_path):
    async def main():
        async with InProcessCluster(tmp_path, bookies=3, **OFF) as cluster:
            async with BookKeeper(cluster.metadata_uri) as bkc:
                lh = await write(bkc, 10, close=True)
                await cluster.crash_bookie(0)
                # a repair that copies one byte a second: limbo stays while we look
                server = await cluster.start_bookie(0, data_integrity_repair_rate_bytes_per_s=1,
                                                 rereplication_entry_batch_size=1)
                b, lid = server.bookie, lh.ledger_id
                # The repair may already have copied an entry (its limiter lets the first copy
                # through at once; a loaded CI machine read entry 0 after it): a stored entry
                # is served, a missing one is limbo, never "no such entry".
                for e in (0, 9):
                    try:
                        assert bytes(await b.read_entry(lid, e)).endswith(b"entry-%d" % e)
                    except LedgerLimboError:
                        pass
                with pytest.raises(LedgerLimboError):  # past the last entry: nobody copies it
                    await b.read_entry(lid, 10)
                with pytest.raises(LedgerLimboError):
                    await b.read_entry(lid, -1)
                with pytest.raises(LedgerLimboError):
                    b.read_lac(lid)
                # readers get every entry from the other replicas meanwhile
                rh = await bkc.open_ledger(lid, password=PW)
                assert [x.data for x in await rh.read_entries(0, 9)] == [b"entry-%d" % i for i in range(10)]
                await asyncio.sleep(0.5)
                assert b.is_limbo(lid) and server.repair.status.state == "running"
    run(main())


def test_two_of_three_crash_closed_ledger_repaired_open_one_never_closed_short(tmp_path):
    async def main():
        async with InProcessCluster(tmp_path, bookies=3, **OFF) as cluster:
            async with BookKeeper(cluster.metadata_uri) as bkc:
                closed = await write(bkc, 20, close=True)
                open_ = await write(bkc, 30)
                await cluster.crash_bookie(0)
                await cluster.crash_bookie(1)
                s0 = await cluster.start_bookie(0, data_integrity_repair_retry_max_s=0.2)
                s1 = await cluster.start_bookie(1, data_integrity_repair_retry_max_s=0.2)
                for s in (s0, s1):
                    s.repair.retry_first_s = 0.05
                # the closed ledger is whole again on both (the third bookie held all of it)
                for _ in range(200):
                    if not any(s.bookie.is_limbo(closed.ledger_id) for s in (s0, s1)):
                        break
                    await asyncio.sleep(0.05)
                for s in (s0, s1):
                    assert not s.bookie.is_limbo(closed.ledger_id)
                    assert s.bookie.missing_entries(closed.ledger_id, range(20)) == []
                # the open one: entry 30 may have been acknowledged by the two that lost it,
                # so recovery cannot decide and the ledger stays open, in limbo, retried
                await asyncio.sleep(0.5)
                md, _ = await LedgerManager(bkc.store).read_ledger_metadata(open_.ledger_id)
                assert not md.is_closed
                for s in (s0, s1):
                    st = s.repair.status
                    assert st.state == "running" and st.errors >= 1 and st.ledgers_left == 1
                    assert s.bookie.is_limbo(open_.ledger_id) and s.bookie.needs_integrity_check
                    assert any("EUNKNOWNLEDGERSTATE" in e["error"] or "limbo" in e["error"] for e in st.last_errors)
    run(main())


def test_all_three_crash_recovery_refuses_and_nothing_is_closed_short(tmp_path):
    async def main():
        async with InProcessCluster(tmp_path, bookies=3, **OFF) as cluster:
            async with BookKeeper(cluster.metadata_uri) as bkc:
                lh = await write(bkc, 15)
                for i in range(3):
                    await cluster.crash_bookie(i)
                for i in range(3):
                    await cluster.start_bookie(i)
                async with BookKeeper(cluster.metadata_uri) as other:
                    with pytest.raises(Exception) as info:
                        await other.open_ledger(lh.ledger_id, password=PW, recovery=True)
                    assert "EUNKNOWNLEDGERSTATE" in str(info.value) or "limbo" in str(info.value)
                md, _ = await LedgerManager(bkc.store).read_ledger_metadata(lh.ledger_id)
                assert not md.is_closed
                # no bookie ever claims the acknowledged entries do not exist
                for s in cluster.servers.values():
                    with pytest.raises(LedgerLimboError):
                        await s.bookie.read_entry(lh.ledger_id, 0)
    run(main())
