"""Speculative and sticky reads on real ZooKeeper and three real `bk bookie` processes
(bk/client/speculative.py, read_ops.py, read_handle.py; issue 31).

A SIGSTOPped bookie is the slow replica: it accepts connections and requests but answers
nothing. The client's read timeout is huge (HUGE_S), so a read that waited for the paused
bookie would not end before the test's own bound; what is asserted is where the answers
came from (each bookie's own /metrics: its READ_ENTRY and BATCH_READ_ENTRY request counts),
that a speculative request was counted (SPECULATIVE_READ_COUNT) and that no request to
the paused bookie had timed out when the read completed - never how fast anything was.
Every paused bookie gets SIGCONT in a finally.
"""
from __future__ import annotations

import asyncio
import signal
import urllib.request
import uuid

import pytest

from bk import eventloop
from bk.client import BookKeeper
from bk.client.speculative import SPECULATIVE_READ_COUNT
from bk.testing.cluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PW = b"spec"
N = 60
HUGE_S = 120.0
REQUESTS = ("bookkeeper_server_READ_ENTRY_REQUEST_count{", "bookkeeper_server_BATCH_READ_ENTRY_REQUEST_count{")


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    c = LocalCluster(str(tmp_path_factory.mktemp("spec")), bookies=3,
                     zk_connect=f"{zk_server}/spec-{uuid.uuid4().hex[:8]}", flush_interval_ms=500)
    c.start()
    try:
        yield c
    finally:
        c.stop()  # SIGCONTs a paused bookie first


def read_requests(c: LocalCluster, bookie_id: str) -> int:
    """READ_ENTRY + BATCH_READ_ENTRY requests the bookie has served (its own /metrics)."""
    b = c.bookies[c.index_of(bookie_id)]
    with urllib.request.urlopen(b.http_url + "/metrics", timeout=10) as r:
        lines = r.read().decode().splitlines()
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(REQUESTS)))


def payload(i: int) -> bytes:
    return b"spec-%d-" % i + bytes([i % 251]) * (100 + i % 97)


def run(coro):
    return eventloop.run(asyncio.wait_for(coro, 180))


async def write_ledger(uri: str) -> tuple[int, list[str]]:
    async with BookKeeper(uri) as bkc:
        lh = await bkc.create_ledger(3, 3, 3, password=PW)
        await asyncio.gather(*(lh.add_entry(payload(i)) for i in range(N)))
        await lh.close()
        return lh.ledger_id, list(lh.metadata.segments[0][1])


@pytest.mark.parametrize("batch", [0, 64], ids=["single-reads", "batch-reads"])
def test_reads_complete_from_the_other_replicas_while_a_bookie_is_paused(cluster, batch):
    ledger_id, ensemble = run(write_ledger(cluster.metadata_uri))
    paused = ensemble[0]  # the first replica of entries 0, 3, 6, ... and of a batch from entry 0
    others = ensemble[1:]

    async def read(**options):
        async with BookKeeper(cluster.metadata_uri, read_timeout_s=HUGE_S, batch_read_entries=batch,
                              **options) as bkc:
            rh = await bkc.open_ledger(ledger_id, PW)  # closed: no LAC read
            entries = await rh.read_entries(0, N - 1)
            return [e.data for e in entries], bkc.pool.suspect(paused)

    before = {b: read_requests(cluster, b) for b in others}
    speculated = SPECULATIVE_READ_COUNT.value
    cluster.bookies[cluster.index_of(paused)].signal(signal.SIGSTOP)
    try:
        data, paused_failed = run(read(speculative_read_timeout_ms=50))
    finally:
        cluster.bookies[cluster.index_of(paused)].signal(signal.SIGCONT)
    assert data == [payload(i) for i in range(N)]
    assert SPECULATIVE_READ_COUNT.value > speculated  # the paused bookie's reads went elsewhere
    assert not paused_failed  # ... before any request to it timed out
    served = {b: read_requests(cluster, b) - before[b] for b in others}
    assert sum(served.values()) > 0, served


def test_without_speculation_a_read_led_by_a_paused_bookie_waits_for_its_timeout(cluster):
    ledger_id, ensemble = run(write_ledger(cluster.metadata_uri))
    paused = ensemble[0]

    async def read():
        async with BookKeeper(cluster.metadata_uri, read_timeout_s=1.0, speculative_read_timeout_ms=0) as bkc:
            rh = await bkc.open_ledger(ledger_id, PW)
            entry = await rh.read_entry(0)  # entry 0 asks ensemble[0] first
            return entry.data, bkc.pool.suspect(paused)

    speculated = SPECULATIVE_READ_COUNT.value
    cluster.bookies[cluster.index_of(paused)].signal(signal.SIGSTOP)
    try:
        data, paused_failed = run(read())
    finally:
        cluster.bookies[cluster.index_of(paused)].signal(signal.SIGCONT)
    assert data == payload(0)
    assert SPECULATIVE_READ_COUNT.value == speculated
    assert paused_failed  # the answer came from the next replica only after the paused one timed out


def test_sticky_reads_hit_one_bookie_and_move_when_it_fails(cluster):
    ledger_id, ensemble = run(write_ledger(cluster.metadata_uri))

    async def read_all(rh) -> None:
        for first in range(0, N, 10):  # several read operations of one handle
            got = await rh.read_entries(first, first + 9)
            assert [e.data for e in got] == [payload(i) for i in range(first, first + 10)]

    async def scenario():
        async with BookKeeper(cluster.metadata_uri, sticky_reads_enabled=True, read_timeout_s=1.0,
                              speculative_read_timeout_ms=50) as bkc:
            rh = await bkc.open_ledger(ledger_id, PW)
            before = {b: read_requests(cluster, b) for b in ensemble}
            await read_all(rh)
            served = {b: read_requests(cluster, b) - before[b] for b in ensemble}
            hit = [b for b, n in served.items() if n]
            assert len(hit) == 1, served
            sticky = hit[0]
            # The sticky bookie stops answering: reads go on (speculatively), its requests time
            # out, and the handle moves to another bookie, which then serves every read alone.
            proc = cluster.bookies[cluster.index_of(sticky)]
            proc.signal(signal.SIGSTOP)
            try:
                await read_all(rh)
                for _ in range(300):  # its requests time out after read_timeout_s (bounded wait)
                    if bkc.pool.suspect(sticky):
                        break
                    await asyncio.sleep(0.05)
                assert bkc.pool.suspect(sticky)
                rest = [b for b in ensemble if b != sticky]
                before = {b: read_requests(cluster, b) for b in rest}
                await read_all(rh)
                served = {b: read_requests(cluster, b) - before[b] for b in rest}
            finally:
                proc.signal(signal.SIGCONT)
            assert len([b for b, n in served.items() if n]) == 1, served

    run(scenario())
