"""Delayed ensemble change (BookKeeper's delayEnsembleChange) for writers, against fake bookies:
off by default (a failure changes the ensemble at once, as before); on, a failed bookie stays in
the ensemble while every write set still has AQ bookies up, and the ensemble changes - replacing
every failed bookie - only once some write set falls below AQ."""
from __future__ import annotations

import asyncio
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from test_client_support import DROP, FakeCluster, run_async  # noqa: E402

from bk.client import BookKeeper  # noqa: E402
from bk.errors import NotEnoughBookiesError  # noqa: E402
from bk.meta.ledger_manager import LedgerManager  # noqa: E402
from bk.meta.ledger_metadata import LedgerState  # noqa: E402
from bk.proto import StatusCode  # noqa: E402


async def metadata(cluster, ledger_id: int):
    return (await LedgerManager(cluster.store).read_ledger_metadata(ledger_id))[0]


def fail(cluster, victim, how: str):
    if how == "timeout":
        victim.add_hook = lambda req: DROP
        return asyncio.sleep(0)
    if how == "eio":
        victim.add_hook = lambda req: int(StatusCode.EIO)
        return asyncio.sleep(0)
    return cluster.kill(victim)


async def read_all(bkc, ledger_id: int, last: int) -> list[bytes]:
    rh = await bkc.open_ledger(ledger_id, b"pw")
    return [e.data for e in await rh.read_entries(0, last)]


@run_async
async def test_default_writer_changes_the_ensemble_and_fails_without_a_spare():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri, connect_timeout_s=1) as bkc:
        assert bkc.delay_ensemble_change is False
        lh = await bkc.create_ledger(3, 3, 2, password=b"pw")
        await lh.add_entry(b"0")
        await cluster.kill(cluster.by_id(lh.ensemble[2]))
        results = await asyncio.gather(*(lh.add_entry(b"x") for _ in range(5)), return_exceptions=True)
        assert all(isinstance(r, NotEnoughBookiesError) for r in results)


@pytest.mark.parametrize("how", ["stop", "eio", "timeout"])
@run_async
async def test_delayed_writer_keeps_a_failed_bookie_while_the_ack_quorum_is_reachable(how):
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri, delay_ensemble_change=True,
                                                     add_timeout_s=0.3, connect_timeout_s=1) as bkc:
        lh = await bkc.create_ledger(3, 3, 2, password=b"pw")
        first = [await lh.add_entry(b"a%d" % i) for i in range(5)]
        x, y, victim = (cluster.by_id(b) for b in lh.ensemble)
        await fail(cluster, victim, how)
        rest = await asyncio.gather(*(lh.add_entry(b"b%d" % i) for i in range(40)))
        assert first + rest == list(range(45))
        if how == "timeout":  # the failure is known only once the victim's adds time out
            while not lh.delayed_failures:
                await asyncio.sleep(0.05)
        more = [await lh.add_entry(b"c%d" % i) for i in range(5)]
        assert more == list(range(45, 50))
        assert lh.ensemble_changes == 0 and lh.delayed_failures == 1 and victim.bookie_id in lh.ensemble
        await lh.close()
        md = await metadata(cluster, lh.ledger_id)
        assert md.state is LedgerState.CLOSED and md.last_entry_id == 49
        assert md.segments == ((0, lh.ensemble),)
        for entry_id in range(50):  # AQ copies of every entry on the bookies that stayed up
            assert (lh.ledger_id, entry_id) in x.entries and (lh.ledger_id, entry_id) in y.entries
        assert await read_all(bkc, lh.ledger_id, 49) == (
            [b"a%d" % i for i in range(5)] + [b"b%d" % i for i in range(40)] + [b"c%d" % i for i in range(5)])


@run_async
async def test_delayed_writer_changes_the_ensemble_once_a_write_set_falls_below_the_ack_quorum():
    async with FakeCluster(5) as cluster, BookKeeper(cluster.metadata_uri, delay_ensemble_change=True,
                                                     connect_timeout_s=1) as bkc:
        lh = await bkc.create_ledger(3, 3, 2, password=b"pw")
        await asyncio.gather(*(lh.add_entry(b"a%d" % i) for i in range(10)))
        first_ensemble = lh.ensemble
        one, two = (cluster.by_id(b) for b in first_ensemble[:2])
        one.add_hook = lambda req: int(StatusCode.EIO)
        await asyncio.gather(*(lh.add_entry(b"b%d" % i) for i in range(10)))
        assert lh.ensemble_changes == 0 and lh.delayed_failures == 1
        await cluster.kill(two)  # now every write set has one bookie up: AQ 2 is out of reach
        await asyncio.gather(*(lh.add_entry(b"c%d" % i) for i in range(10)))
        assert lh.ensemble_changes == 1
        assert not {one.bookie_id, two.bookie_id} & set(lh.ensemble)  # the delayed one is replaced too
        await lh.close()
        md = await metadata(cluster, lh.ledger_id)
        assert [f for f, _ in md.segments] == [0, 20] and md.segments[0][1] == first_ensemble
        survivor = cluster.by_id(first_ensemble[2])
        for entry_id in range(20, 30):
            on = {b.bookie_id for b in cluster.bookies if (lh.ledger_id, entry_id) in b.entries}
            assert set(md.segments[1][1]) <= on
        assert survivor.bookie_id in md.segments[1][1]
        assert await read_all(bkc, lh.ledger_id, 29) == (
            [b"a%d" % i for i in range(10)] + [b"b%d" % i for i in range(10)] + [b"c%d" % i for i in range(10)])


@run_async
async def test_delayed_writer_changes_at_once_when_the_failed_bookies_write_sets_lose_the_ack_quorum():
    """E=3 WQ=2 AQ=2: a write set with a failed bookie has one bookie up, so there is nothing to delay."""
    async with FakeCluster(4) as cluster, BookKeeper(cluster.metadata_uri, delay_ensemble_change=True) as bkc:
        lh = await bkc.create_ledger(3, 2, 2, password=b"pw")
        await lh.add_entry(b"0")
        victim = cluster.by_id(lh.ensemble[1])
        victim.add_hook = lambda req: int(StatusCode.EIO)
        assert await asyncio.gather(*(lh.add_entry(b"x") for _ in range(6))) == list(range(1, 7))
        assert lh.ensemble_changes == 1 and lh.delayed_failures == 0 and victim.bookie_id not in lh.ensemble
        await lh.close()
        assert (await metadata(cluster, lh.ledger_id)).segments[1][0] == 1


@run_async
async def test_an_unexpected_error_in_the_ensemble_change_fails_the_adds_not_hangs_them():
    """A bug in a placement policy (any exception out of replace_bookies) must fail the writer's
    adds with a BKError; it killed the ensemble change task and the adds waited for ever."""
    from bk.errors import BKError

    async with FakeCluster(4) as cluster, BookKeeper(cluster.metadata_uri, connect_timeout_s=1) as bkc:
        lh = await bkc.create_ledger(3, 3, 2, password=b"pw")
        await lh.add_entry(b"0")

        def broken(*args, **kwargs):
            raise RuntimeError("a bug in a placement policy")
        bkc.placement.replace_bookies = broken
        await cluster.kill(cluster.by_id(lh.ensemble[2]))
        adds = asyncio.gather(*(lh.add_entry(b"x") for _ in range(3)), return_exceptions=True)
        results = await asyncio.wait_for(adds, 30)  # a hang guard only
        assert all(isinstance(r, BKError) for r in results), results
