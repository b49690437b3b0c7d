"""An in-process crash (InProcessCluster.crash_bookie) is abrupt, as kill -9 is: from the
crash instant nothing more of the bookie reaches its disk. A checkpoint in progress does not
finish (its index commit never happens) and a journal write in flight is never made, even
when the disk they wait for answers right after the crash. About 3 s."""
from __future__ import annotations

import asyncio

import pytest

from bk.client import BookKeeper
from bk.index.index import Index
from bk.testing.diskfaults import DiskFaults
from bk.testing.inprocess import InProcessCluster


async def _wait_hit(faults, rule):
    for _ in range(200):
        if faults.hits(rule):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the hung operation was never reached")


async def _crash_while_the_disk_answers_late(cluster, faults, rule):
    """Crash bookie 0 while an operation hangs on `rule`; the disk answers 0.3 s later (a
    cooperative stop would then go on and finish what it was doing)."""
    crash = asyncio.create_task(cluster.crash_bookie(0))
    await asyncio.sleep(0.3)
    faults.heal(rule)
    await asyncio.wait_for(crash, 20)


@pytest.mark.timeout(60)
def test_a_checkpoint_in_progress_at_the_crash_never_commits(tmp_path):
    async def main():
        async with InProcessCluster(tmp_path, bookies=1, flush_interval_ms=3_600_000) as cluster:
            server = cluster.servers[0]
            config = server.bookie.config
            async with BookKeeper(cluster.metadata_uri) as bkc:
                lh = await bkc.create_ledger(1, 1, 1, password=b"pw")
                for i in range(3):
                    await lh.add_entry(b"in the write cache %d" % i)
            faults = DiskFaults.install()
            try:
                rule = faults.hang(op="write", path_prefix=config.ledger_dirs[0])
                server.bookie.storage.request_checkpoint()
                await _wait_hit(faults, rule)  # the checkpoint is writing the entry log
                await _crash_while_the_disk_answers_late(cluster, faults, rule)
            finally:
                DiskFaults.uninstall()
            index = Index(config.resolved_index_dir, config, readonly=True)
            try:
                assert index.get_location(lh.ledger_id, 0) is None  # its commit never happened
            finally:
                index.close()
            server = await cluster.start_bookie(0)
            assert server.bookie.missing_entries(lh.ledger_id, range(3)) == []  # the journal has them
    asyncio.run(main())


@pytest.mark.timeout(60)
def test_a_journal_write_in_flight_at_the_crash_never_reaches_the_disk(tmp_path):
    async def main():
        async with InProcessCluster(tmp_path, bookies=1, flush_interval_ms=3_600_000) as cluster:
            config = cluster.servers[0].bookie.config
            async with BookKeeper(cluster.metadata_uri) as bkc:
                lh = await bkc.create_ledger(1, 1, 1, password=b"pw")
                await lh.add_entry(b"acknowledged")
                faults = DiskFaults.install()
                try:
                    rule = faults.hang(op="write", path_prefix=config.journal_dirs[0])
                    add = asyncio.ensure_future(lh.add_entry(b"in flight at the crash"))
                    await _wait_hit(faults, rule)
                    await _crash_while_the_disk_answers_late(cluster, faults, rule)
                finally:
                    DiskFaults.uninstall()
                await asyncio.sleep(0.2)
                assert not (add.done() and not add.cancelled() and add.exception() is None), \
                    "an add in flight at the crash was acknowledged"
                add.cancel()
                add.add_done_callback(lambda f: f.cancelled() or f.exception())
            server = await cluster.start_bookie(0)
            assert server.bookie.missing_entries(lh.ledger_id, range(2)) == [1]  # kill -9: never written
    asyncio.run(main())
