"""Recovery with a dead bookie and no spare (issue 12), on three `bk bookie` processes and a real
ZooKeeper: E=3 WQ=3 AQ=2, the writer dies, one bookie is SIGKILLed. The ack quorum is still
reachable, so open_ledger(recovery=True) must succeed: its write-back of the unconfirmed tail
completes on the two live bookies (delayed ensemble change) instead of failing for want of a
replacement. The closed ledger holds every acknowledged entry (invariants 1-5) and its metadata
still names the dead bookie (no ensemble change was needed)."""
from __future__ import annotations

import asyncio
import uuid

import pytest

from bk import eventloop
from bk.client import BookKeeper
from bk.testing.cluster import LocalCluster
from bk.testing.history import History, assert_closed, check_ledger, entries_to_map

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PW = b"pw"


def test_recovery_with_one_of_three_bookies_dead_and_no_spare(zk_server, tmp_path):
    cluster = LocalCluster(str(tmp_path), bookies=3, zk_connect=f"{zk_server}/nospare-{uuid.uuid4().hex[:8]}",
                           flush_interval_ms=200)
    cluster.start()
    try:
        eventloop.run(scenario(cluster))
    finally:
        cluster.stop()


async def scenario(cluster: LocalCluster) -> None:
    uri = cluster.metadata_uri
    h = History()
    writer = await BookKeeper.connect(uri)
    lh = await writer.create_ledger(3, 3, 2, password=PW)
    ensemble = lh.ensemble
    sem = asyncio.Semaphore(32)

    async def one(i: int) -> None:
        async with sem:
            await h.add(lh, b"nospare-%d-" % i + bytes(i % 200))

    await asyncio.gather(*(one(i) for i in range(300)))  # pipelined: the last LAC piggybacked lags
    acked = lh.last_add_confirmed
    assert acked == 299
    await writer.close()  # the writer dies; the ledger stays OPEN

    dead = cluster.index_of(ensemble[2])
    await asyncio.to_thread(cluster.kill, dead)
    async with BookKeeper(uri, connect_timeout_s=3, add_timeout_s=3, read_timeout_s=3) as bkc:
        rh = await bkc.open_ledger(lh.ledger_id, password=PW, recovery=True)
        assert rh.is_closed and rh.last_add_confirmed >= acked
        h.recovered(lh.ledger_id, rh.last_add_confirmed, "recoverer")
        md = await bkc.get_ledger_metadata(lh.ledger_id)
    assert_closed(md, lh.ledger_id)
    assert md.segments == ((0, ensemble),)  # the dead bookie is still named: nothing replaced it

    maps = []
    for _ in range(2):  # two fresh readers: every acknowledged entry, identical bytes
        async with BookKeeper(uri, connect_timeout_s=3, read_timeout_s=3) as reader:
            handle = await reader.open_ledger(lh.ledger_id, password=PW)
            maps.append(entries_to_map(await handle.read_entries(0, handle.last_add_confirmed)))
    check_ledger(h, lh.ledger_id, md, maps, check_length=True).assert_ok()
