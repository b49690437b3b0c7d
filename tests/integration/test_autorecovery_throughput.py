"""Opt-in measurement (not a timing assertion): re-replication throughput with 64 KB entries.

    BK_REPLICATION_BENCH_MB=1024 python3 -m pytest -s -q tests/integration/test_autorecovery_throughput.py

Four bookie processes V, A, B, T; four ledgers E=3 WQ=3 AQ=2 on [V, A, B] hold
BK_REPLICATION_BENCH_MB MB in 64 KB entries, so V holds all of it and T is the
only bookie outside the segments: exactly one worker (T's) or one manual
`recover` run copies everything.
- autorecovery: V is killed (SIGKILL) and wiped; printed are the time from the
  death to the first marker (mostly the ZooKeeper session timeout), to full
  replication, and the worker's MB/s from the first marker to the end;
- manual: V is killed and wiped, BookieRecovery copies to T; its MB/s.
Both check that the metadata no longer names V and sample the copies on T.
"""
from __future__ import annotations

import asyncio
import os
import re
import time

import pytest

from test_autorecovery_support import index_of, log_text, make_cluster, wait_fully_replicated, wipe

from bk import eventloop
from bk.client import BookKeeper
from bk.meta.underreplication import LedgerUnderreplicationManager
from bk.replication import BookieRecovery

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not os.environ.get("BK_REPLICATION_BENCH_MB"),
                                 reason="opt-in measurement: set BK_REPLICATION_BENCH_MB")]

ENTRY_BYTES = 64 * 1024
LEDGERS = 4


async def fill(uri: str, ensemble: list[str], total_bytes: int) -> list[int]:
    payload = os.urandom(ENTRY_BYTES)
    per_ledger = total_bytes // ENTRY_BYTES // LEDGERS
    ids = []
    async with BookKeeper(uri) as bkc:
        bkc.placement.new_ensemble = lambda size, writable, exclude=(), **_: list(ensemble)
        started = time.monotonic()
        for _ in range(LEDGERS):
            lh = await bkc.create_ledger(3, 3, 2, password=b"bench")
            window = asyncio.Semaphore(64)

            async def add():
                try:
                    await lh.add_entry(payload)
                finally:
                    window.release()
            tasks = []
            for _ in range(per_ledger):
                await window.acquire()
                tasks.append(asyncio.ensure_future(add()))
            await asyncio.gather(*tasks)
            await lh.close()
            ids.append(lh.ledger_id)
        elapsed = time.monotonic() - started
        print(f"\nwrote {LEDGERS * per_ledger * ENTRY_BYTES / 1e6:.0f} MB in {elapsed:.1f} s")
    return ids


async def sample_on(uri: str, ledger_ids: list[int], bookie: str) -> None:
    async with BookKeeper(uri) as bkc:
        client = bkc.pool.get(bookie)
        for ledger_id in ledger_ids:
            md = await bkc.get_ledger_metadata(ledger_id)
            for entry_id in (0, md.last_entry_id // 2, md.last_entry_id):
                response = await client.call(client.send_read, ledger_id, entry_id)
                assert response.rc == 0 and len(response.body) > ENTRY_BYTES


@pytest.mark.parametrize("mode", ["autorecovery", "manual"])
def test_rereplication_throughput(zk_server, tmp_path, mode):
    total = int(float(os.environ["BK_REPLICATION_BENCH_MB"]) * 2**20)
    cluster = make_cluster(zk_server, tmp_path, bookies=4, autorecovery=(mode == "autorecovery"),
                           flush_interval_ms=1000, write_cache_max_size_bytes="64MiB",
                           read_cache_max_size_bytes="64MiB", rereplication_entry_batch_size=100)
    with cluster:
        victim, a, b, target = cluster.bookie_ids
        ids = eventloop.run(fill(cluster.metadata_uri, [victim, a, b], total))
        vi = index_of(cluster, victim)
        died = time.monotonic()
        cluster.kill(vi)
        wipe(cluster, vi)
        if mode == "manual":
            eventloop.run(manual(cluster.metadata_uri, victim, target))
        else:
            first_mark = eventloop.run(first_marker(cluster.metadata_uri))
            eventloop.run(wait_until_replicated(cluster.metadata_uri, ids, victim))
            done = time.monotonic()
            copied = sum(int(n) for n in re.findall(r"fully replicated \(\d+ segment\(s\), (\d+) bytes copied\)",
                                                    log_text(cluster, index_of(cluster, target))))
            assert copied >= total
            print(f"autorecovery: death -> first marker {first_mark - died:.1f} s, death -> fully replicated"
                  f" {done - died:.1f} s; the worker on {target} copied {copied / 1e6:.0f} MB in"
                  f" {done - first_mark:.1f} s = {copied / 1e6 / (done - first_mark):.1f} MB/s")
        eventloop.run(sample_on(cluster.metadata_uri, ids, target))


async def first_marker(uri: str) -> float:
    async with BookKeeper(uri) as bkc:
        urm = LedgerUnderreplicationManager(bkc.store)
        while not await urm.list_underreplicated_ledgers():
            await asyncio.sleep(0.02)
        await urm.close()
    return time.monotonic()


async def wait_until_replicated(uri: str, ids: list[int], victim: str) -> None:
    async with BookKeeper(uri) as bkc:
        await wait_fully_replicated(bkc, ids, {victim}, wait_s=1800)


async def manual(uri: str, victim: str, target: str) -> None:
    async with BookKeeper(uri) as bkc:
        started = time.monotonic()
        summary = await BookieRecovery(bkc, window_entries=100).recover(victim, target=target)
        elapsed = time.monotonic() - started
        assert summary.ok, summary.failed
        mb = summary.progress.bytes_copied / 1e6
        print(f"manual recover: {mb:.0f} MB in {elapsed:.1f} s = {mb / elapsed:.1f} MB/s")
