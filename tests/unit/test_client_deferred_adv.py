"""Deferred sync + force, and chosen entry ids (create_ledger_adv), against in-process bookies (issue 31).

The in-process bookies are the real server and storage engine in this process; the crash-safety
half (a SIGKILLed bookie after force) is tests/integration/test_deferred_adv.py."""
from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import random

import pytest

from bk.client import BookKeeper
from bk.errors import (
    BookieIOError, DuplicateEntryIdError, IncorrectParameterError, LedgerClosedError, LedgerExistsError, LedgerFencedError,
)
from bk.testing.diskfaults import DiskFaults
from bk.testing.inprocess import InProcessCluster

pytestmark = pytest.mark.timeout(120)


def run(coro_fn):
    @functools.wraps(coro_fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(coro_fn(*args, **kwargs))
    return wrapper


async def until(cond, what: str, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("protocol", ["v2", "v3"])
@run
async def test_deferred_sync_acks_hold_the_lac_until_force(tmp_path, protocol):
    async with InProcessCluster(tmp_path, bookies=3) as cluster, \
            BookKeeper(cluster.metadata_uri, protocol=protocol) as bkc:
        lh = await bkc.create_ledger(3, 2, 2, password=b"pw", write_flags={"DEFERRED_SYNC"})
        ids = await asyncio.gather(*(lh.add_entry(b"d%d" % i) for i in range(20)))
        assert ids == list(range(20))
        assert (lh.last_add_confirmed, lh.last_add_acked) == (-1, 19)  # acknowledged, not yet durable
        await lh.force()
        assert lh.last_add_confirmed == 19 and lh.length == sum(len(b"d%d" % i) for i in range(20))
        more = await asyncio.gather(*(lh.add_entry(b"m%d" % i) for i in range(5)))
        assert more == list(range(20, 25)) and lh.last_add_confirmed == 19
        await lh.close()  # forces first: the ledger ends at the last acknowledged add
        md = await bkc.get_ledger_metadata(lh.ledger_id)
        assert md.is_closed and md.last_entry_id == 24
        rh = await bkc.open_ledger(lh.ledger_id, b"pw")
        got = [e.data for e in await rh.read_entries(0, 24)]
        assert got == [b"d%d" % i for i in range(20)] + [b"m%d" % i for i in range(5)]


@run
async def test_force_and_write_flags_refuse_bad_use(tmp_path):
    async with InProcessCluster(tmp_path, bookies=3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        with pytest.raises(IncorrectParameterError, match="unknown write flag"):
            await bkc.create_ledger(3, 2, 2, write_flags={"NO_SUCH_FLAG"})
        lh = await bkc.create_ledger(3, 2, 2, write_flags={"DEFERRED_SYNC"})
        await lh.add_entry(b"x")
        await lh.close()
        with pytest.raises(LedgerClosedError):
            await lh.force()
        plain = await bkc.create_ledger(3, 2, 2)  # force() on a normal ledger: its LAC is already durable
        await plain.add_entry(b"y")
        await plain.force()
        assert plain.last_add_confirmed == 0


@run
async def test_deferred_sync_writer_stops_on_a_bookie_failure_no_ensemble_change(tmp_path):
    async with InProcessCluster(tmp_path, bookies=4) as cluster, \
            BookKeeper(cluster.metadata_uri, add_timeout_s=2.0) as bkc:
        lh = await bkc.create_ledger(3, 3, 2, write_flags={"DEFERRED_SYNC"})
        await lh.add_entry(b"a")
        victim = [i for i in cluster.servers if cluster.bookie_id(i) == lh.ensemble[0]][0]
        await cluster.stop_bookie(victim)
        with pytest.raises(Exception) as failure:
            for i in range(50):
                await lh.add_entry(b"b%d" % i)
        assert "DEFERRED_SYNC" in str(failure.value)
        assert lh.ensemble_changes == 0 and lh.metadata.segments == (await bkc.get_ledger_metadata(
            lh.ledger_id)).segments


@run
async def test_adv_out_of_order_adds_complete_in_id_order_and_lac_is_the_contiguous_prefix(tmp_path):
    async with InProcessCluster(tmp_path, bookies=3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger_adv(3, 2, 2, password=b"pw")
        order = list(range(30))
        random.Random(7).shuffle(order)
        done = []
        futures = {e: lh.async_add_entry(e, b"v" * (e + 1), lambda e, err: done.append((e, err))) for e in order[:-1]}
        assert set(futures) == set(order[:-1])
        missing = order[-1]
        await asyncio.sleep(0.3)  # every add but `missing` is acknowledged by now; ids above it wait
        assert lh.last_add_confirmed == missing - 1 and [e for e, _ in done] == list(range(missing))
        assert await lh.add_entry(missing, b"v" * (missing + 1)) == missing
        await until(lambda: len(done) == 29, "every completion")
        assert [e for e, err in done] == [e for e in range(30) if e != missing] and all(err is None for _, err in done)
        assert lh.last_add_confirmed == 29
        for bad in (5, 29):  # at or below the LAC
            with pytest.raises(DuplicateEntryIdError):
                await lh.add_entry(bad, b"again")
        with pytest.raises(IncorrectParameterError):
            await lh.add_entry(-1, b"negative")
        with pytest.raises(IncorrectParameterError):
            lh.add_entries([b"a", b"b"])
        await lh.close()
        md = await bkc.get_ledger_metadata(lh.ledger_id)
        assert (md.last_entry_id, md.length) == (29, sum(range(1, 31)))
        rh = await bkc.open_ledger(lh.ledger_id, b"pw")
        assert [e.data for e in await rh.read_entries(0, 29)] == [b"v" * (e + 1) for e in range(30)]


@run
async def test_adv_duplicate_pending_id_and_close_with_a_gap(tmp_path):
    async with InProcessCluster(tmp_path, bookies=3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger_adv(3, 3, 2)
        first = [lh.add_entry(e, b"e%d" % e) for e in (0, 1, 3)]
        with pytest.raises(DuplicateEntryIdError):
            await lh.add_entry(3, b"dup")  # pending, not yet completed (2 is missing)
        await asyncio.gather(*first[:2])
        assert lh.last_add_confirmed == 1
        await lh.close()  # 3 is stored but stuck behind 2, never added: not in the ledger
        with pytest.raises(LedgerClosedError, match="never added") as stuck:
            await first[2]
        assert stuck.value.outcome_unknown is False
        md = await bkc.get_ledger_metadata(lh.ledger_id)
        assert (md.last_entry_id, md.length) == (1, 4)


@run
async def test_adv_chosen_ledger_id_and_recovery_by_another_client(tmp_path):
    async with InProcessCluster(tmp_path, bookies=3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger_adv(3, 2, 2, password=b"pw", ledger_id=123456789012)
        assert lh.ledger_id == 123456789012
        with pytest.raises(LedgerExistsError):
            await bkc.create_ledger_adv(3, 2, 2, ledger_id=123456789012)
        with pytest.raises(IncorrectParameterError):
            await bkc.create_ledger_adv(3, 2, 2, ledger_id=-3)
        await asyncio.gather(*(lh.add_entry(e, b"r%d" % e) for e in (4, 2, 0, 3, 1)))
        async with BookKeeper(cluster.metadata_uri) as other:  # the writer is left open: recovery closes it
            rh = await other.open_ledger(lh.ledger_id, b"pw")
            assert rh.last_add_confirmed == 4
            assert [e.data for e in await rh.read_entries(0, 4)] == [b"r%d" % e for e in range(5)]
        with pytest.raises(LedgerFencedError):
            await lh.add_entry(5, b"after recovery")


@contextlib.contextmanager
def disk_faults():
    """This process's disk-fault injector (bk.testing.diskfaults), healed and removed afterwards."""
    faults = DiskFaults.install()
    try:
        yield faults
    finally:
        faults.heal()
        DiskFaults.uninstall()


@run
async def test_bookie_acknowledges_deferred_adds_before_the_journal_fsync_and_force_waits_for_it(tmp_path):
    with disk_faults() as faults:
        async with InProcessCluster(tmp_path, bookies=3) as cluster, \
                BookKeeper(cluster.metadata_uri, protocol="v3") as bkc:
            deferred = await bkc.create_ledger(3, 3, 2, write_flags={"DEFERRED_SYNC"})
            plain = await bkc.create_ledger(3, 3, 2)
            await deferred.add_entry(b"before")
            await plain.add_entry(b"before")
            hang = faults.hang(op="fsync", path_prefix=str(tmp_path))  # every bookie's journal fsync blocks
            ids = await asyncio.wait_for(asyncio.gather(*(deferred.add_entry(b"x%d" % i) for i in range(10))), 10)
            assert ids == list(range(1, 11)) and deferred.last_add_confirmed == -1  # acked with no fsync done
            blocked = plain.add_entry(b"needs the fsync")
            force = asyncio.ensure_future(deferred.force())
            await asyncio.sleep(0.3)
            assert faults.hits(hang) > 0
            assert not force.done() and not blocked.done()  # both wait for the hung fsync, as they must
            faults.heal(hang)
            await asyncio.wait_for(force, 10)
            assert deferred.last_add_confirmed == 10 and await asyncio.wait_for(blocked, 10) == 1


@run
async def test_force_fails_when_the_journal_lost_deferred_adds(tmp_path):
    with disk_faults() as faults:
        async with InProcessCluster(tmp_path, bookies=3) as cluster, \
                BookKeeper(cluster.metadata_uri, protocol="v3") as bkc:
            lh = await bkc.create_ledger(3, 3, 3, write_flags={"DEFERRED_SYNC"})
            await lh.add_entry(b"durable")
            await lh.force()
            journal = cluster.config(0).journal_dirs[0]
            faults.fail(op="fsync", errno=errno.EIO, path_prefix=journal)  # bookie 0's journal dies
            await lh.add_entry(b"acked, then lost by bookie 0's journal")
            with pytest.raises(BookieIOError, match=r"force\(\) failed.*EIO"):
                await lh.force()
            assert lh.last_add_confirmed == 0  # the LAC stays at what is durable


@run
async def test_adv_closing_the_client_fails_adds_stuck_behind_a_missing_id(tmp_path):
    async with InProcessCluster(tmp_path, bookies=3) as cluster:
        bkc = await BookKeeper(cluster.metadata_uri).start()
        lh = await bkc.create_ledger_adv(3, 2, 2)
        await lh.add_entry(0, b"zero")
        stuck = lh.add_entry(2, b"two")  # acknowledged by its bookies, but 1 is never added
        await asyncio.sleep(0.2)
        assert not stuck.done()
        await bkc.close()
        with pytest.raises(LedgerClosedError, match="client was closed"):
            await asyncio.wait_for(stuck, 5)
