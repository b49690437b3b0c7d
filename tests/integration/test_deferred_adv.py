"""Deferred sync + force() and chosen entry ids (create_ledger_adv) on real bookie processes and a real
ZooKeeper (issue 31).

The bookies checkpoint rarely (flush_interval_ms 10 min), so what a bookie holds after a SIGKILL
comes from its journal: an entry force() reported durable must be replayed from there.
"""
import asyncio
import os
import random

import pytest

from bk import eventloop
from bk.client import BookKeeper
from bk.testing.cluster import LocalCluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    c = LocalCluster(str(tmp_path_factory.mktemp("deferred")), bookies=3,
                     zk_connect=f"{zk_server}/deferred-{os.getpid()}", flush_interval_ms=600_000)
    c.start()
    yield c
    c.stop()


def payloads(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.randrange(1, 3000)) + b"#%d" % i for i in range(n)]


def test_force_makes_deferred_adds_durable_across_a_sigkill_of_every_bookie(cluster):
    data = payloads(200, 1)

    async def write() -> int:
        async with BookKeeper(cluster.metadata_uri) as bkc:  # v2 client: deferred adds go on v3 side connections
            lh = await bkc.create_ledger(3, 3, 2, password=b"pw", write_flags={"DEFERRED_SYNC"})
            assert await asyncio.gather(*(lh.add_entry(d) for d in data)) == list(range(200))
            assert (lh.last_add_confirmed, lh.last_add_acked) == (-1, 199)  # acknowledged, LAC held back
            await lh.force()
            assert lh.last_add_confirmed == 199
            for i in range(3):  # at once: nothing gets to checkpoint or shut down cleanly
                cluster.kill(i)
            return lh.ledger_id

    ledger_id = eventloop.run(write())
    for i in range(3):
        cluster.start_bookie(i)

    async def read_back() -> None:
        async with BookKeeper(cluster.metadata_uri) as bkc:
            rh = await bkc.open_ledger(ledger_id, b"pw")  # recovery: the writer never closed it
            assert rh.is_closed and rh.last_add_confirmed == 199
            got = await rh.read_entries(0, 199)
            assert [e.data for e in got] == data

    eventloop.run(read_back())


def test_create_ledger_adv_out_of_order_then_recovered_by_another_client(cluster):
    data = payloads(120, 2)
    order = list(range(120))
    random.Random(3).shuffle(order)
    chosen = 900_000_000_000 + os.getpid()

    async def write() -> None:
        async with BookKeeper(cluster.metadata_uri, protocol="v3") as bkc:
            lh = await bkc.create_ledger_adv(3, 2, 2, password=b"pw", ledger_id=chosen)
            assert lh.ledger_id == chosen
            # 0..99 in a random order; 100 is never added, so 101..119 stay above the LAC
            ids = await asyncio.gather(*(lh.add_entry(e, data[e]) for e in order if e < 100))
            assert sorted(ids) == list(range(100)) and lh.last_add_confirmed == 99
            late = [lh.add_entry(e, data[e]) for e in range(101, 120)]
            await asyncio.sleep(0.5)
            assert lh.last_add_confirmed == 99 and not any(f.done() for f in late)
            # the writer goes away without closing (its client closes: the late adds fail)
        await asyncio.gather(*late, return_exceptions=True)

    eventloop.run(write())

    async def recover() -> None:
        async with BookKeeper(cluster.metadata_uri) as bkc:
            rh = await bkc.open_ledger(chosen, b"pw")
            assert rh.is_closed and rh.last_add_confirmed == 99  # recovery stops at the gap, as the LAC did
            # as BookKeeper's recovery: the length stamped in entry 99, counted in call order (addToLength)
            calls = [e for e in order if e < 100]
            assert rh.length == sum(len(data[e]) for e in calls[:calls.index(99) + 1])
            assert [e.data for e in await rh.read_entries(0, 99)] == data[:100]

    eventloop.run(recover())


def test_bookie_process_acks_a_deferred_sync_add_before_its_journal_fsync(zk_server, tmp_path):
    """The wire facts, from a raw v3 client (tests/integration/v3_wire.py) against a real bookie whose
    journal fsync hangs (DiskFaultControl): an ADD with writeFlags DEFERRED_SYNC is answered anyway,
    FORCE_LEDGER only once the fsync went through."""
    from v3_wire import V3Client, add_body, request

    from bk.proto import DigestManager, master_key
    from bk.testing.diskfaults import DiskFaultControl

    ctl = DiskFaultControl(str(tmp_path / "faults.json"))
    c = LocalCluster(str(tmp_path / "c"), bookies=1, zk_connect=f"{zk_server}/deferred-wire-{os.getpid()}",
                     env=dict(os.environ, **ctl.env()))
    c.start()
    key, digest = master_key(b"pw"), DigestManager(7, "CRC32C", b"pw")
    try:
        async def main():
            async with V3Client(int(c.bookie_ids[0].rsplit(":", 1)[1])) as v3:
                assert (await v3.call("ADD_ENTRY", add_body(7, 0, key, digest.frame_entry(0, -1, 1, b"a")))).status == 0
                hang = ctl.hang(op="fsync", path_prefix=os.path.join(c.data_dir, "bookie-0", "journal"))
                deferred = add_body(7, 1, key, digest.frame_entry(1, 0, 2, b"b")) + [(5, 1)]  # writeFlags DEFERRED_SYNC
                assert (await v3.call("ADD_ENTRY", deferred)).status == 0  # answered with the fsync hung
                v3.send(request("FORCE_LEDGER", v3.next_txn(), [(1, 7)]))
                with pytest.raises(asyncio.TimeoutError):
                    await v3.answers(1, timeout=1.0)  # FORCE_LEDGER waits for the journal
                assert ctl.hits(hang) > 0
                ctl.heal(hang)
                (forced,) = await v3.answers(1, timeout=10)
                assert forced.status == 0

        eventloop.run(main())
    finally:
        ctl.heal()
        c.stop()
