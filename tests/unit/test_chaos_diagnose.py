"""bk.testing.chaos.diagnose: what a failing run's trace says about a late event loop and
about each in-process bookie's read path (seed 101207's liveness failure left no such
evidence)."""
from __future__ import annotations

import asyncio
import time

import pytest

from bk.client import BookKeeper
from bk.testing.chaos.clusters import InProcessChaosCluster
from bk.testing.chaos.diagnose import STALL_S, STARVED_CAP, Budget, LoopLag, describe_bookies


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


def test_a_budget_gives_back_the_time_the_loop_was_late():
    # Seeds 110091 and 110098 failed liveness on a loaded machine: their 4 s recovery window
    # was spent with the loop up to 1.8 s late. The window now counts the time the loop had.
    async def main():
        lag = LoopLag().start()
        await asyncio.sleep(0.05)
        budget = lag.budget(0.3)
        time.sleep(0.5)  # the process gets no CPU (or a callback holds the loop) for 0.5 s
        stretched = (budget.expired(), budget.starved_s(), budget.describe())
        await asyncio.sleep(0.4)  # a loop on time again: the 0.3 s plus 0.5 s given back run out
        spent = budget.expired()
        await lag.stop()
        return stretched, spent
    (expired, starved, described), spent = asyncio.run(main())
    assert not expired and starved >= 0.45 and "the loop was late" in described
    assert spent


def test_a_budget_stretches_at_most_starved_cap_times_and_is_wall_time_without_a_lag():
    async def main():
        lag = LoopLag().start()
        await asyncio.sleep(0.05)
        budget = lag.budget(0.1)
        time.sleep(0.1 * STARVED_CAP + 0.2)
        await asyncio.sleep(0.03)
        capped = (budget.expired(), budget.starved_s())
        await lag.stop()
        plain = Budget(None, 0.1)
        await asyncio.sleep(0.15)
        return capped, plain.expired(), plain.describe()
    (expired, starved), plain_expired, plain_described = asyncio.run(main())
    assert expired and starved == pytest.approx(0.1 * (STARVED_CAP - 1))
    assert plain_expired and plain_described == "0.1s"


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


@pytest.mark.timeout(120)
def test_a_run_past_its_time_limit_is_a_timeout_with_every_tasks_stack(tmp_path):
    from bk.testing.chaos.runner import run_one
    r = run_one(3, {"mode": "inprocess", "time_limit_s": 0.3})
    assert not r.ok and r.failures[0].startswith("timeout: the run did not finish within 0.3s"), r.failures
    assert any(line.startswith("still running at the time limit") for line in r.trace)
