"""bk.testing.chaos.diagnose: what a failing run's trace says about a late event loop and
about each in-process bookie's read path (seed 101207's liveness failure left no such
evidence)."""
from __future__ import annotations

import asyncio
import time

import pytest

from bk.client import BookKeeper
from bk.testing.chaos.clusters import InProcessChaosCluster
from bk.testing.chaos.diagnose import STALL_S, LoopLag, describe_bookies


def test_a_callback_holding_the_loop_is_noted_with_how_late_the_loop_was():
    notes: list[str] = []

    async def main():
        lag = LoopLag(notes.append).start()
        await asyncio.sleep(0.05)
        time.sleep(STALL_S + 0.15)  # holds the loop, as a slow callback would
        await asyncio.sleep(0.05)
        await lag.stop()
        return lag
    lag = asyncio.run(main())
    assert lag.stalls == 1 and lag.max_s > STALL_S
    assert len(notes) == 1 and "ms late" in notes[0]
    assert "1 time(s) over" in lag.summary()


def test_a_quiet_loop_notes_nothing():
    notes: list[str] = []

    async def main():
        lag = LoopLag(notes.append).start()
        await asyncio.sleep(0.2)
        await lag.stop()
        return lag
    lag = asyncio.run(main())
    assert notes == [] and lag.stalls == 0


@pytest.mark.timeout(60)
def test_each_bookie_and_proxy_of_an_in_process_cluster_is_described(tmp_path):
    async def main():
        cluster = await InProcessChaosCluster(str(tmp_path), 2).start()
        try:
            async with BookKeeper(cluster.metadata_uri) as bkc:
                lh = await bkc.create_ledger(2, 2, 2, password=b"pw")
                await lh.add_entry(b"x")
                return describe_bookies(cluster)
        finally:
            await cluster.stop()
    lines = asyncio.run(main())
    assert [line.split(":")[0] for line in lines] == ["bookie 0", "bookie 1", "proxy 0", "proxy 1"]
    assert not any("cannot describe" in line for line in lines), lines
    assert "reads running 0, waiting 0" in lines[0] and "limbo []" in lines[0]
    assert describe_bookies(object()) == []  # a process cluster: nothing in this process
