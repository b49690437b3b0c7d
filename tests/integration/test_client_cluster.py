"""The client against real bookies: bk.testing.inprocess (real BookieServers in this process).

Checked after each scenario: every acknowledged entry reads back byte-identical,
the closed ledger ends at the writer's LAC, and the segments are valid
(REPLICATION.md invariants 1, 2 and 4).
"""
from __future__ import annotations

import asyncio
import inspect
import pathlib
import random
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "unit"))

from test_client_support import run_async, until  # noqa: E402

from bk.client import BookKeeper  # noqa: E402
from bk.client.bookie_client import BookieClient  # noqa: E402
from bk.errors import LedgerFencedError  # noqa: E402
from bk.meta.ledger_metadata import LedgerState  # noqa: E402
from bk.proto import FLAG_DO_FENCING, master_key  # noqa: E402
from bk.testing.inprocess import InProcessCluster  # noqa: E402

pytestmark = pytest.mark.integration


def payloads(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.choice((0, 1, 17, 100, 1000, 4000))) + b"#%d" % i for i in range(n)]


def check_segments(md) -> None:
    firsts = [f for f, _ in md.segments]
    assert firsts[0] == 0 and all(a < b for a, b in zip(firsts, firsts[1:]))
    for _, ensemble in md.segments:
        assert len(ensemble) == md.ensemble_size == len(set(ensemble))


async def check_ledger(bkc: BookKeeper, ledger_id: int, expected: list[bytes], password: bytes) -> None:
    rh = await bkc.open_ledger(ledger_id, password=password)
    assert rh.is_closed and rh.last_add_confirmed == len(expected) - 1
    check_segments(rh.metadata)
    assert rh.length == sum(map(len, expected))
    got = await rh.read_entries(0, len(expected) - 1)
    assert [e.entry_id for e in got] == list(range(len(expected)))
    assert [e.data for e in got] == expected


def with_cluster(bookies: int, **cluster_options):
    """Turn `async def test(cluster, **params)` into a pytest test taking `tmp_path` and the params."""
    def wrap(fn):
        params = list(inspect.signature(fn).parameters.values())[1:]

        def test(tmp_path, **kwargs):
            async def main():
                async with InProcessCluster(tmp_path, bookies=bookies, **cluster_options) as cluster:
                    await fn(cluster, **kwargs)
            run_async(main)()

        test.__name__, test.__qualname__, test.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
        test.__signature__ = inspect.Signature(
            [inspect.Parameter("tmp_path", inspect.Parameter.POSITIONAL_OR_KEYWORD)] + params)
        return test
    return wrap


@pytest.mark.parametrize("e,wq,aq", [(1, 1, 1), (3, 2, 2), (3, 3, 2), (5, 3, 2)])
@with_cluster(5)
async def test_thousands_of_entries_in_flight_read_back_identical(cluster, e, wq, aq):
    data = payloads(3000, seed=e * 100 + wq * 10 + aq)
    # 3000 adds sent at once to bookies in this process: on a loaded CI host the first ones can
    # wait past the default 10 s, and a timeout is an ensemble change this test does not expect
    async with BookKeeper(cluster.metadata_uri, add_timeout_s=60.0) as bkc:
        lh = await bkc.create_ledger(e, wq, aq, digest_type="CRC32C", password=b"secret")
        ids = await asyncio.gather(*(lh.async_add_entry(p) for p in data))
        assert ids == list(range(len(data)))
        await lh.close()
        assert lh.metadata.state is LedgerState.CLOSED and lh.metadata.last_entry_id == len(data) - 1
        assert lh.ensemble_changes == 0
    async with BookKeeper(cluster.metadata_uri) as reader:
        await check_ledger(reader, lh.ledger_id, data, b"secret")


@pytest.mark.parametrize("digest_type", ["CRC32", "MAC", "DUMMY"])
@with_cluster(3)
async def test_every_digest_type_round_trips_through_real_bookies(cluster, digest_type):
    data = payloads(200, seed=7)
    async with BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(3, 2, 2, digest_type=digest_type, password=b"pw")
        for chunk in range(0, 200, 50):
            await asyncio.gather(*(lh.add_entry(p) for p in data[chunk:chunk + 50]))
        await lh.close()
        await check_ledger(bkc, lh.ledger_id, data, b"pw")


@with_cluster(5)
async def test_bookie_stopped_mid_stream_changes_the_ensemble_and_loses_nothing(cluster):
    data = payloads(3000, seed=11)
    async with BookKeeper(cluster.metadata_uri, add_timeout_s=5.0) as bkc:
        lh = await bkc.create_ledger(3, 2, 2, password=b"pw")
        futures = [lh.async_add_entry(p) for p in data[:1500]]
        await until(lambda: lh.last_add_confirmed >= 500, "500 entries acknowledged")
        victim_id = lh.ensemble[1]
        victim = next(i for i in cluster.servers if cluster.bookie_id(i) == victim_id)
        await cluster.stop_bookie(victim)  # graceful: it answers what it has already read
        futures += [lh.async_add_entry(p) for p in data[1500:]]
        assert await asyncio.gather(*futures) == list(range(len(data)))
        await lh.close()
        assert lh.ensemble_changes >= 1 and victim_id not in lh.ensemble
        md = lh.metadata
        check_segments(md)
        assert len(md.segments) >= 2 and victim_id not in md.segments[-1][1]
        assert md.last_entry_id == len(data) - 1
    async with BookKeeper(cluster.metadata_uri) as reader:
        await check_ledger(reader, lh.ledger_id, data, b"pw")


@with_cluster(4)
async def test_read_only_bookie_is_never_chosen_and_writers_move_off_it(cluster):
    async with BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(3, 3, 2, password=b"pw")
        await asyncio.gather(*(lh.add_entry(b"before-%d" % i) for i in range(100)))
        ro_id = lh.ensemble[0]
        ro = next(s for i, s in cluster.servers.items() if cluster.bookie_id(i) == ro_id)
        await ro.set_read_only(True)
        await until(lambda: bkc.registration.readonly_bookies(), "read-only registration")
        for _ in range(10):
            assert ro_id not in (await bkc.create_ledger(3, 2, 2)).ensemble
        await asyncio.gather(*(lh.add_entry(b"after-%d" % i) for i in range(100)))
        assert ro_id not in lh.ensemble and lh.ensemble_changes == 1
        await lh.close()
        assert lh.metadata.segments[1][0] <= 100
        expected = [b"before-%d" % i for i in range(100)] + [b"after-%d" % i for i in range(100)]
        await check_ledger(bkc, lh.ledger_id, expected, b"pw")


@with_cluster(3)
async def test_fencing_by_another_client_stops_the_writer(cluster):
    async with BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(3, 2, 2, password=b"pw")
        for i in range(50):  # one at a time, so the bookies learn the LAC from the piggyback
            await lh.add_entry(b"x%d" % i)
        # What a recovering client does first: a fencing read on every bookie of the last segment.
        for bookie_id in lh.ensemble:
            fencer = BookieClient(bookie_id)
            answer = await fencer.call(fencer.send_read, lh.ledger_id, -1, flags=FLAG_DO_FENCING,
                                       master_key=master_key(b"pw"))
            assert answer.rc == 0
            fencer.close()
        with pytest.raises(LedgerFencedError):
            await lh.add_entry(b"after the fence")
        with pytest.raises(LedgerFencedError):
            await lh.add_entry(b"later")
        assert lh.last_add_confirmed == 49
        rh = await bkc.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
        assert rh.last_add_confirmed == 48
        assert [e.data for e in await rh.read_entries(0, 48)] == [b"x%d" % i for i in range(49)]


@with_cluster(3)
async def test_tailing_reader_on_real_bookies(cluster):
    async with BookKeeper(cluster.metadata_uri) as writer, BookKeeper(cluster.metadata_uri) as reader:
        lh = await writer.create_ledger(3, 2, 2, password=b"pw")
        for i in range(20):
            await lh.add_entry(b"t%d" % i)
        rh = await reader.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
        assert rh.last_add_confirmed == 18
        assert [e.data for e in await rh.read_entries(0, 18)] == [b"t%d" % i for i in range(19)]
        await lh.close()
        assert await rh.read_last_add_confirmed() == 19


def test_client_on_zookeeper_with_an_ensemble_change(tmp_path, zk_metadata_uri):
    @with_cluster(4, metadata_uri=zk_metadata_uri)
    async def scenario(cluster):
        data = payloads(600, seed=5)
        async with BookKeeper(cluster.metadata_uri) as bkc:
            lh = await bkc.create_ledger(3, 2, 2, password=b"zk")
            await asyncio.gather(*(lh.add_entry(p) for p in data[:300]))
            victim = next(i for i in cluster.servers if cluster.bookie_id(i) == lh.ensemble[0])
            await cluster.stop_bookie(victim)
            await asyncio.gather(*(lh.add_entry(p) for p in data[300:]))
            await lh.close()
            assert lh.ensemble_changes >= 1
            assert lh.ledger_id in await bkc.list_ledgers()
        async with BookKeeper(cluster.metadata_uri) as reader:
            await check_ledger(reader, lh.ledger_id, data, b"zk")
            await reader.delete_ledger(lh.ledger_id)
            assert lh.ledger_id not in await reader.list_ledgers()

    scenario(tmp_path=tmp_path)


@with_cluster(3)
async def test_writer_killed_mid_stream_then_recovered(cluster):
    """Scenario 1: no acknowledged entry lost, no truncation, readers agree."""
    data = payloads(2000, seed=3)
    writer = await BookKeeper.connect(cluster.metadata_uri)
    lh = await writer.create_ledger(3, 2, 2, password=b"pw")
    acknowledged = []
    futures = [lh.async_add_entry(p) for p in data]
    for f in futures:
        f.add_done_callback(lambda f: acknowledged.append(f.result()) if not f.exception() else None)
    await until(lambda: len(acknowledged) >= 700, "700 entries acknowledged")
    await writer.close()  # the writer dies: its connections drop with adds in flight
    await asyncio.gather(*futures, return_exceptions=True)
    top = max(acknowledged)
    assert sorted(acknowledged) == list(range(top + 1))
    async with BookKeeper(cluster.metadata_uri) as a, BookKeeper(cluster.metadata_uri) as b:
        ra = await a.open_ledger(lh.ledger_id, password=b"pw", recovery=True)
        assert ra.is_closed and ra.last_add_confirmed >= top
        check_segments(ra.metadata)
        last = ra.last_add_confirmed
        got_a = await ra.read_entries(0, last)
        rb = await b.open_ledger(lh.ledger_id, password=b"pw", recovery=True)
        assert rb.last_add_confirmed == last
        got_b = await rb.read_entries(0, last)
        assert [e.data for e in got_a] == [e.data for e in got_b] == data[:last + 1]
        assert ra.length == sum(map(len, data[:last + 1]))


@with_cluster(3)
async def test_recovery_while_the_writer_keeps_writing(cluster):
    async with BookKeeper(cluster.metadata_uri) as writer, BookKeeper(cluster.metadata_uri) as recoverer:
        lh = await writer.create_ledger(3, 3, 2, password=b"pw")
        acknowledged = []
        stop = asyncio.Event()

        async def write():
            i = 0
            while not stop.is_set():
                try:
                    acknowledged.append(await lh.add_entry(b"w%d" % i))
                except LedgerFencedError:
                    return
                i += 1

        task = asyncio.ensure_future(write())
        await until(lambda: len(acknowledged) >= 200, "200 entries acknowledged")
        rh = await recoverer.open_ledger(lh.ledger_id, password=b"pw", recovery=True)
        stop.set()
        await task
        last = rh.last_add_confirmed
        assert acknowledged == list(range(len(acknowledged))) and last >= acknowledged[-1]
        with pytest.raises(LedgerFencedError):
            await lh.add_entry(b"after recovery")
        assert [e.data for e in await rh.read_entries(0, last)] == [b"w%d" % i for i in range(last + 1)]
