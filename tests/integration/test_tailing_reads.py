"""Tailing readers, read_unconfirmed and explicit LAC against real bookie processes and ZooKeeper.

- a tailing reader (`async for entry in rh.tail(0)`, opened without recovery) while the writer
  adds, loses a bookie (SIGKILL: ensemble change) and closes: every entry exactly once, in
  order, byte-identical, and the loop ends; on v3 it waited with long polls only, on v2 by
  polling only;
- readLastAddConfirmedAndEntry waits for an entry that is added later (v3 long poll, v2 polling);
- explicit LAC: with `explicit_lac_interval_ms` an idle writer's last entry becomes visible to
  read_explicit_lac and to a long-polling tail; without it, it does not;
- read_unconfirmed reads the entries past the LAC that read_entries refuses.
"""
import asyncio
import os
import random

import pytest

from bk import eventloop
from bk.client import BookKeeper
from bk.errors import IncorrectParameterError, NoSuchEntryError
from bk.testing.cluster import LocalCluster

pytestmark = pytest.mark.integration

PW = b"tail"


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    c = LocalCluster(str(tmp_path_factory.mktemp("tail")), bookies=4, zk_connect=f"{zk_server}/tail-{os.getpid()}",
                     flush_interval_ms=500)
    c.start()
    yield c
    c.stop()


def payload(i: int) -> bytes:
    return random.Random(i).randbytes(random.Random(-i).randrange(1, 500)) + b"#%d" % i


async def until(check, what: str, timeout_s: float = 15.0):
    """Poll `check()` (async) until it is truthy; fail naming `what` after timeout_s (no timing asserted)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.02)


async def equals(coro, value) -> bool:
    return (await coro) == value


@pytest.mark.parametrize("protocol", ["v3", "v2"])
def test_tailing_reader_across_an_ensemble_change_and_the_close(cluster, protocol):
    n, kill_at = 240, 120

    async def main():
        async with BookKeeper(cluster.metadata_uri, protocol=protocol) as wbk, \
                BookKeeper(cluster.metadata_uri, protocol=protocol) as rbk:
            lh = await wbk.create_ledger(3, 3, 2, password=PW)
            rh = await rbk.open_ledger(lh.ledger_id, password=PW, recovery=False)
            got = []

            async def tail():
                async with rh.tail(0, long_poll_timeout_ms=2000) as entries:
                    async for entry in entries:
                        got.append(entry)
                return entries
            reader = asyncio.ensure_future(tail())
            victim = None
            for i in range(n):
                await lh.add_entry(payload(i))
                if i == kill_at:
                    await until(lambda: asyncio.sleep(0, len(got) > kill_at - 5), "the tail kept up")
                    victim = cluster.index_of(lh.ensemble[0])
                    await asyncio.to_thread(cluster.kill, victim)
                if i % 10 == 0:
                    await asyncio.sleep(0.005)  # a writer with pauses: the tail waits for new entries
            assert lh.ensemble_changes >= 1
            await lh.close()
            stats = await asyncio.wait_for(reader, 30)
            assert [e.entry_id for e in got] == list(range(n))  # each once, in order, and the loop ended
            assert [e.data for e in got] == [payload(i) for i in range(n)]
            md = await rbk.get_ledger_metadata(lh.ledger_id)
            assert len(md.segments) >= 2 and md.last_entry_id == n - 1
            assert stats.metadata_changes >= 2  # the ensemble change and the close
            if protocol == "v3":
                assert stats.long_polls > 0 and stats.polls == 0
            else:
                assert stats.polls > 0 and stats.long_polls == 0
            return victim
    victim = eventloop.run(main())
    cluster.start_bookie(victim)


@pytest.mark.parametrize("protocol", ["v3", "v2"])
def test_read_last_add_confirmed_and_entry_waits_for_the_entry(cluster, protocol):
    async def main():
        async with BookKeeper(cluster.metadata_uri, protocol=protocol) as wbk, \
                BookKeeper(cluster.metadata_uri, protocol=protocol) as rbk:
            lh = await wbk.create_ledger(3, 2, 2, password=PW)
            for i in range(3):
                await lh.add_entry(payload(i))
            rh = await rbk.open_ledger(lh.ledger_id, password=PW, recovery=False)
            assert rh.last_add_confirmed == 1  # entry 2 is not known confirmed: nothing piggybacked it
            assert await rh.try_read_last_add_confirmed() == 1
            waiting = asyncio.ensure_future(rh.read_last_add_confirmed_and_entry(3, 20_000))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            for i in range(3, 6):
                await lh.add_entry(payload(i))
            lac, entry = await asyncio.wait_for(waiting, 20)
            assert lac >= 3 and entry is not None and (entry.entry_id, entry.data) == (3, payload(3))
            # an entry known confirmed is read at once; past a closed ledger's end there is nothing
            lac, entry = await rh.read_last_add_confirmed_and_entry(1, 20_000)
            assert entry.data == payload(1)
            await lh.close()
            assert await rh.read_last_add_confirmed() == 5  # the handle learns the close here (or tailing)
            lac, entry = await rh.read_last_add_confirmed_and_entry(6, 20_000)
            assert (lac, entry) == (5, None)
            # a fresh ledger: its bookies hold nothing yet (ENOLEDGER at once), still it waits
            lh = await wbk.create_ledger(3, 2, 2, password=PW)
            rh = await rbk.open_ledger(lh.ledger_id, password=PW, recovery=False)
            waiting = asyncio.ensure_future(rh.read_last_add_confirmed_and_entry(0, 20_000))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            await lh.add_entry(payload(0))
            await lh.add_entry(payload(1))
            lac, entry = await asyncio.wait_for(waiting, 20)
            assert entry is not None and (entry.entry_id, entry.data) == (0, payload(0))
    eventloop.run(main())


@pytest.mark.parametrize("interval_ms", [50, 0])
def test_explicit_lac_shows_an_idle_writers_last_entry(cluster, interval_ms):
    async def main():
        async with BookKeeper(cluster.metadata_uri, explicit_lac_interval_ms=interval_ms) as wbk, \
                BookKeeper(cluster.metadata_uri, protocol="v3") as rbk:
            lh = await wbk.create_ledger(3, 2, 2, password=PW)
            for i in range(10):
                await lh.add_entry(payload(i))
            rh = await rbk.open_ledger(lh.ledger_id, password=PW, recovery=False)
            got = []

            async def tail():
                async with rh.tail(0) as entries:
                    async for entry in entries:
                        got.append(entry.entry_id)
            reader = asyncio.ensure_future(tail())
            if interval_ms:
                # the writer is idle: its WRITE_LACs tell the bookies that entry 9 is confirmed
                await until(lambda: equals(rh.read_explicit_lac(), 9), "read_explicit_lac() == 9")
                await until(lambda: asyncio.sleep(0, got == list(range(10))), "the tail got entry 9")
                assert lh.explicit_lac.sends >= 1
                assert rh.last_add_confirmed == 9
            else:
                await until(lambda: asyncio.sleep(0, len(got) == 9), "the tail got entries 0..8")
                await asyncio.sleep(0.5)  # ten intervals of the other case
                assert await rh.read_explicit_lac() == 8  # only what entry 9 piggybacked
                assert got == list(range(9)) and lh.explicit_lac is None
            await lh.close()  # the close tells the tail the end, with or without explicit LAC
            await asyncio.wait_for(reader, 20)
            assert got == list(range(10))
    eventloop.run(main())


def test_read_unconfirmed_reads_past_the_lac(cluster):
    async def main():
        async with BookKeeper(cluster.metadata_uri) as wbk, BookKeeper(cluster.metadata_uri) as rbk:
            lh = await wbk.create_ledger(3, 2, 2, password=PW)
            for i in range(5):
                await lh.add_entry(payload(i))
            rh = await rbk.open_ledger(lh.ledger_id, password=PW, recovery=False)
            assert rh.last_add_confirmed == 3
            with pytest.raises(IncorrectParameterError):
                await rh.read_entries(0, 4)
            got = await rh.read_unconfirmed(2, 4)
            assert [(e.entry_id, e.data) for e in got] == [(i, payload(i)) for i in (2, 3, 4)]
            assert rh.last_add_confirmed == 3  # reading past the LAC does not move it
            with pytest.raises(NoSuchEntryError):
                await rh.read_unconfirmed(5, 5)
            with pytest.raises(IncorrectParameterError):
                await rh.read_unconfirmed(3, 2)
            await lh.close()
            await rh.read_last_add_confirmed()  # learns the close
            with pytest.raises(IncorrectParameterError):  # a closed ledger ends at its last entry
                await rh.read_unconfirmed(0, 5)
    eventloop.run(main())
