"""Regressions found by the chaos runner (bk.testing.chaos), each named after its seed.
Replay the original: the command in the test's docstring."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from bk.client import BookKeeper
from bk.testing.inprocess import InProcessCluster


@pytest.mark.timeout(60)
def test_seed25_crash_during_a_checkpoint_does_not_deadlock(tmp_path):
    """python -m bk.testing.chaos --seed 25 --mode inprocess --break forget-fence hung for good:
    InProcessCluster.crash_bookie joined the storage thread on the event loop's thread while
    that thread's checkpoint waited for the loop (LedgerStorage._on_owner). Here the
    checkpoint is made to reach the loop only once the crash is under way."""
    async def main():
        async with InProcessCluster(tmp_path, bookies=1, flush_interval_ms=3_600_000) as cluster:
            storage = cluster.servers[0].bookie.storage
            entered = threading.Event()
            real = storage._on_owner

            def late_on_owner(fn):
                entered.set()
                time.sleep(0.3)  # the crash reaches its join meanwhile
                return real(fn)
            storage._on_owner = late_on_owner
            async with BookKeeper(cluster.metadata_uri) as bkc:
                lh = await bkc.create_ledger(1, 1, 1, password=b"pw")
                await lh.add_entry(b"in the write cache")
            storage.request_checkpoint()
            assert await asyncio.to_thread(entered.wait, 10)
            await asyncio.wait_for(cluster.crash_bookie(0), 20)
            server = await cluster.start_bookie(0)
            assert server.bookie.missing_entries(lh.ledger_id, range(1)) == []  # journal replay
    asyncio.run(main())
