"""The in-process chaos power cut (InProcessChaosCluster.power_loss): the bookie is stopped
behind its crash gate, then every file goes back to what was durable, entry logs included:
here a checkpoint's entry log was written but its fsync never returned. About 2 s."""
from __future__ import annotations

import asyncio
import glob
import os
import random

import pytest

from bk.client import BookKeeper
from bk.testing.chaos.clusters import InProcessChaosCluster
from bk.testing.diskfaults import DiskFaults
from bk.testing.powerloss import read_fsync_log


@pytest.mark.timeout(60)
def test_a_power_cut_drops_an_entry_log_written_but_not_synced(tmp_path):
    async def main():
        cluster = await InProcessChaosCluster(str(tmp_path), 1, flush_interval_ms=3_600_000).start()
        try:
            async with BookKeeper(cluster.metadata_uri) as bkc:
                lh = await bkc.create_ledger(1, 1, 1, password=b"pw")
                for i in range(20):
                    await lh.add_entry(b"entry %d " % i * 50)
            ledgers = os.path.join(cluster.data_dir_of(0), "ledgers")
            faults = cluster.disk_faults
            rule = faults.hang(op="fsync", path_prefix=ledgers)
            cluster.servers[0].bookie.storage.request_checkpoint()
            for _ in range(200):  # the checkpoint wrote the entry log and waits for its fsync
                if faults.hits(rule):
                    break
                await asyncio.sleep(0.05)
            assert faults.hits(rule)
            logs = glob.glob(os.path.join(ledgers, "current", "*.log"))
            written = {p: os.path.getsize(p) for p in logs}
            report = await asyncio.wait_for(cluster.power_loss(0, False, random.Random(1)), 20)
            faults.heal(rule)
            synced = read_fsync_log(cluster.track_file)
            for path, size in written.items():
                durable = synced.get(os.path.abspath(path), 0)
                assert durable < size, report  # the entries' bytes were never fsynced
                assert not os.path.exists(path) or os.path.getsize(path) == durable, report
            await cluster.restart(0)
            assert cluster.servers[0].bookie.missing_entries(lh.ledger_id, range(20)) == []  # the journal
        finally:
            await cluster.stop()
            DiskFaults.uninstall()
    asyncio.run(main())
