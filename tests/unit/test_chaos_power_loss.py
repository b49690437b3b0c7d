"""The chaos power cut (clusters.py): the bookie is stopped behind its crash gate, then every
file goes back to what was durable, entry logs included: here a checkpoint's entry log was
written but its fsync never returned. A cut of several bookies (a rack, the whole cluster) is
one instant, in-process and with processes. About 5 s."""
from __future__ import annotations

import asyncio
import glob
import os
import random
import signal
import subprocess
import sys
import types

import pytest

from bk import fileio
from bk.client import BookKeeper
from bk.errors import StorageError
from bk.testing.chaos import clusters
from bk.testing.chaos.clusters import InProcessChaosCluster, ProcessChaosCluster
from bk.testing.chaos.nemesis import KINDS
from bk.testing.cluster import BookieProcess
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


def _fault(**params):
    return types.SimpleNamespace(bookie=0, index=0, param=lambda k, d=None: {"tear": False, **params}.get(k, d))


def _probe_writable(cluster, i: int) -> bool:
    """Could a write still land in bookie i's ledger directory (through bk.fileio, as the bookie writes)?"""
    try:
        fileio.atomic_write(os.path.join(cluster.data_dir_of(i), "ledgers", "probe-after-the-instant"), b"x")
        return True
    except (OSError, StorageError):
        return False


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind, params, victims", [("power-loss-all", {}, [0, 1, 2]),
                                                   ("power-loss", {"bookies": 2}, [0, 1])])
def test_a_power_cut_of_several_bookies_is_one_instant(tmp_path, monkeypatch, kind, params, victims):
    """A power cut of the whole cluster (or of a rack) stops every one of its bookies before any
    file is cut, and cuts them all at once. Before, it cut bookie 0's files while bookies 1 and 2
    still ran (a write or an fsync could still land on them), then bookie 1's, and so on. Each
    cut records which bookies still ran and which could still be written: the single cut must
    find none of the victims running and none writable; acknowledged entries survive it."""
    cuts = []
    real = clusters.simulate_power_loss

    def recording(track_file, roots, **kw):
        cuts.append((sorted(cluster.servers), [i for i in range(3) if _probe_writable(cluster, i)],
                     sorted(roots)))
        return real(track_file, roots, **kw)

    monkeypatch.setattr(clusters, "simulate_power_loss", recording)
    cluster = None

    async def main():
        nonlocal cluster
        cluster = await InProcessChaosCluster(str(tmp_path), 3).start()
        try:
            async with BookKeeper(cluster.metadata_uri) as bkc:
                lh = await bkc.create_ledger(3, 3, 3, password=b"pw")
                for i in range(10):
                    await lh.add_entry(b"acknowledged %d" % i)
            crashed: list[int] = []
            ctx = types.SimpleNamespace(cluster=cluster, mark_crashed=crashed.append, restart=cluster.restart,
                                        fault_rng=lambda f: random.Random(1))
            await KINDS[kind].apply(ctx, _fault(**params))
            assert crashed == victims
            await KINDS[kind].heal(ctx, _fault(**params))
            assert all(cluster.alive(i) for i in range(3))
            async with BookKeeper(cluster.metadata_uri) as bkc:
                rh = await bkc.open_ledger(lh.ledger_id, password=b"pw", recovery=True)
                got = [bytes(e.data) for e in await rh.read_entries(0, rh.last_add_confirmed)]
            assert got == [b"acknowledged %d" % i for i in range(10)]
        finally:
            await cluster.stop()
            DiskFaults.uninstall()

    asyncio.run(main())
    survivors = [i for i in range(3) if i not in victims]
    assert len(cuts) == 1, cuts
    assert cuts[0] == (survivors, survivors, sorted(cluster.data_dir_of(i) for i in victims)), cuts


@pytest.mark.timeout(60)
def test_a_whole_cluster_power_cut_of_processes_kills_every_one_before_any_file_is_cut(tmp_path, monkeypatch):
    """Process clusters: every bookie process gets its SIGKILL before any file is cut (before,
    bookie 0's files were cut while bookies 1 and 2 still ran). Real processes (sleepers in
    the bookies' places, a real SIGKILL each); each cut records which were still alive."""
    cluster = ProcessChaosCluster(str(tmp_path), 3, zk_connect="127.0.0.1:1")
    for i in range(3):
        d = cluster.data_dir_of(i)
        os.makedirs(d)
        with open(os.path.join(d, "never-synced"), "wb") as fh:
            fh.write(b"lost at the cut")
        b = BookieProcess(i, os.path.join(d, "conf"), os.path.join(d, "log"), f"127.0.0.1:{4100 + i}")
        b.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        cluster.inner.bookies[i] = b
    cuts = []
    real = clusters.simulate_power_loss

    def recording(track_file, roots, **kw):
        cuts.append(([i for i in range(3) if cluster.alive(i)], sorted(roots)))
        return real(track_file, roots, **kw)

    monkeypatch.setattr(clusters, "simulate_power_loss", recording)
    crashed: list[int] = []
    ctx = types.SimpleNamespace(cluster=cluster, mark_crashed=crashed.append, fault_rng=lambda f: random.Random(1))
    try:
        asyncio.run(KINDS["power-loss-all"].apply(ctx, _fault()))
    finally:
        for b in cluster.inner.bookies.values():
            b.kill()
    assert cuts == [([], sorted(cluster.data_dir_of(i) for i in range(3)))], cuts
    assert crashed == [0, 1, 2]
    assert all(b.proc.returncode == -signal.SIGKILL for b in cluster.inner.bookies.values())
    assert not any(os.path.exists(os.path.join(cluster.data_dir_of(i), "never-synced")) for i in range(3))
