"""A chaos run's bookie processes watch their own stores and checkpoints (excuse.watch_from_env),
so a journal-off crash of a process excuses only what no checkpoint of it had made durable, as
for in-process bookies (issue 28: "a journal-off loss is excused only for entries that were not
yet made durable by a checkpoint on the bookies that lost them"). Before, no process was watched
and every such crash excused every entry sent before it (journal-off-crash-unwatched).

One real `bk bookie` process on the session's ZooKeeper, journal off, checkpoints every 50 ms;
about 10 s.
"""
from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from bk.client import BookKeeper
from bk.testing.chaos.clusters import ProcessChaosCluster
from bk.testing.chaos.run import Chaos
from bk.testing.chaos.scenario import generate

pytestmark = pytest.mark.integration
PW = b"watch"


def _journal_off_process_scenario():
    for seed in range(1, 5000):
        s = generate(seed, mode="process")
        if not s.journal:
            return s
    raise AssertionError("no seed draws the journal off")


@pytest.mark.timeout(120)
def test_a_killed_bookie_process_excuses_only_what_its_checkpoints_had_not_covered(zk_server, tmp_path):
    async def main():
        cluster = ProcessChaosCluster(str(tmp_path), 1, f"{zk_server}/watch-{uuid.uuid4().hex[:8]}",
                                      journal_write_data=False, flush_interval_ms=50, http_server_enabled=False)
        await cluster.start()
        chaos = Chaos(_journal_off_process_scenario(), cluster, [])
        try:
            async with BookKeeper(cluster.metadata_uri, add_timeout_s=5.0) as bkc:
                lh = await bkc.create_ledger(1, 1, 1, password=PW)
                for e in range(5):
                    chaos.sent_at[(lh.ledger_id, e)] = time.monotonic()
                    await lh.add_entry(b"before %d" % e)
                await asyncio.sleep(1.0)  # twenty flush intervals: a checkpoint covered them
                cluster.inner.bookies[0].signal(__import__("signal").SIGSTOP)  # nothing checkpoints now
                for e in range(5, 8):
                    chaos.sent_at[(lh.ledger_id, e)] = time.monotonic()
                    lh.async_add_entry(b"after %d" % e, lambda *a: None)  # stored? never checkpointed
                await asyncio.sleep(0.2)
                asked = time.monotonic()
                stopped_at = await cluster.crash(0)  # the instant its SIGKILL went (seed 190140)
                assert asked <= stopped_at <= time.monotonic() and not cluster.alive(0)
                assert await cluster.crash(0) is None  # down already: no second crash to date
                chaos.mark_crashed(0, stopped_at)
                await cluster.restart(0)
                lid = lh.ledger_id
        finally:
            await cluster.stop()
        [first, second] = cluster.watch_files(0)  # one per storage instance, oldest first
        chaos.read_process_watches()
        assert chaos.watches[0][0].checkpoints >= 1 and (lid, 0) in chaos.watches[0][0].stored_at
        for e in range(5):
            assert chaos.durable_on(0, lid, e)
            assert chaos.excuses(lid, e) == {}  # before: {0: "journal-off-crash-unwatched"}
        for e in range(5, 8):
            assert chaos.excuses(lid, e) == {0: "journal-off-crash"}

    asyncio.run(main())
