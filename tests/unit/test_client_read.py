"""Reads against fake bookies: replicas, digests, bounds, the LAC, open_ledger, delete/list."""
from __future__ import annotations

import asyncio
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from test_client_support import DROP, FakeCluster, run_async, until  # noqa: E402

from bk.client import BookKeeper, LedgerEntry  # noqa: E402
from bk.errors import (  # noqa: E402
    BookieIOError, BookieTimeoutError, DigestMismatchError, IncorrectParameterError, NoSuchEntryError,
    NoSuchLedgerMetadataError, UnauthorizedAccessError,
)
from bk.meta.ledger_manager import LedgerManager  # noqa: E402
from bk.proto import StatusCode  # noqa: E402


async def written(cluster, bkc, n=20, e=3, wq=3, aq=2, close=True, digest_type="CRC32C", password=b"pw"):
    lh = await bkc.create_ledger(e, wq, aq, digest_type=digest_type, password=password)
    await asyncio.gather(*(lh.add_entry(b"entry-%d" % i) for i in range(n)))
    if close:
        await lh.close()
        # AQ < WQ: the last replica may still be on its way.
        await until(lambda: sum(len(b.ledger_entries(lh.ledger_id)) for b in cluster.bookies) == n * wq,
                    "every replica stored")
    return lh


def first_replica(cluster, lh, entry_id):
    md = lh.metadata
    ensemble = md.ensemble_for(entry_id)
    return [cluster.by_id(ensemble[(entry_id + i) % md.ensemble_size]) for i in range(md.write_quorum_size)]


@pytest.mark.parametrize("digest_type", ["CRC32", "CRC32C", "MAC", "DUMMY"])
@run_async
async def test_read_back_a_closed_ledger_with_every_digest_type(digest_type):
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await written(cluster, bkc, 50, digest_type=digest_type)
        rh = await bkc.open_ledger(lh.ledger_id, password=b"pw")
        assert rh.is_closed and rh.last_add_confirmed == 49 and rh.length == lh.length
        assert rh.digest_type.name == ("MAC" if digest_type == "MAC" else digest_type)
        entries = await rh.read_entries(0, 49)
        assert entries == [LedgerEntry(i, b"entry-%d" % i) for i in range(50)]
        assert await rh.read_entry(7) == LedgerEntry(7, b"entry-7")
        assert [e.data for e in await lh.read_entries(10, 12)] == [b"entry-10", b"entry-11", b"entry-12"]


@run_async
async def test_reading_past_the_last_entry_or_a_bad_range_is_a_clear_error():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await written(cluster, bkc, 5, close=False)
        with pytest.raises(IncorrectParameterError, match="last add confirmed is 4"):
            await lh.read_entries(0, 5)
        await lh.close()
        rh = await bkc.open_ledger(lh.ledger_id, password=b"pw")
        with pytest.raises(IncorrectParameterError, match="lastEntryId is 4"):
            await rh.read_entries(3, 5)
        for first, last in [(-1, 2), (3, 2), (0.0, 1)]:
            with pytest.raises(IncorrectParameterError):
                await rh.read_entries(first, last)
        empty = await bkc.create_ledger(3, 2, 2)
        await empty.close()
        rh = await bkc.open_ledger(empty.ledger_id)
        assert rh.last_add_confirmed == -1
        with pytest.raises(IncorrectParameterError):
            await rh.read_entries(0, 0)


@pytest.mark.parametrize("trouble", ["eio", "noentry", "corrupt", "timeout", "down"])
@run_async
async def test_read_falls_back_to_the_next_replica(trouble):
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri, read_timeout_s=0.2) as bkc:
        lh = await written(cluster, bkc, 12)
        first = first_replica(cluster, lh, 4)[0]
        if trouble == "eio":
            first.read_hook = lambda req: int(StatusCode.EIO)
        elif trouble == "noentry":
            del first.entries[(lh.ledger_id, 4)]
        elif trouble == "corrupt":
            first.corrupt(lh.ledger_id, 4)
        elif trouble == "timeout":
            first.read_hook = lambda req: DROP
        else:
            await first.stop()
        rh = await bkc.open_ledger(lh.ledger_id, password=b"pw")
        assert (await rh.read_entry(4)).data == b"entry-4"
        assert [e.data for e in await rh.read_entries(0, 11)] == [b"entry-%d" % i for i in range(12)]


@run_async
async def test_digest_mismatch_only_when_no_replica_has_a_valid_copy():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await written(cluster, bkc, 6)
        replicas = first_replica(cluster, lh, 2)
        for b in replicas[:-1]:
            b.corrupt(lh.ledger_id, 2)
        assert (await lh.read_entry(2)).data == b"entry-2"
        replicas[-1].corrupt(lh.ledger_id, 2)
        with pytest.raises(DigestMismatchError, match="no replica has a valid copy"):
            await lh.read_entry(2)
        # One corrupt copy and explicit negatives elsewhere: still a digest problem, not "no entry".
        for b in replicas[1:]:
            del b.entries[(lh.ledger_id, 2)]
        with pytest.raises(DigestMismatchError):
            await lh.read_entry(2)


@run_async
async def test_no_such_entry_only_when_every_replica_says_so():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri, read_timeout_s=0.2) as bkc:
        lh = await written(cluster, bkc, 6)
        replicas = first_replica(cluster, lh, 3)
        for b in replicas[:-1]:
            del b.entries[(lh.ledger_id, 3)]
        replicas[-1].read_hook = lambda req: int(StatusCode.EIO)
        with pytest.raises(BookieIOError) as info:
            await lh.read_entry(3)
        assert not isinstance(info.value, NoSuchEntryError) and "ENOENTRY" in str(info.value)
        replicas[-1].read_hook = lambda req: DROP
        with pytest.raises(BookieTimeoutError):
            await lh.read_entry(3)
        replicas[-1].read_hook = None
        del replicas[-1].entries[(lh.ledger_id, 3)]
        with pytest.raises(NoSuchEntryError):
            await lh.read_entry(3)
        assert (await lh.read_entry(4)).data == b"entry-4"


@run_async
async def test_range_reads_keep_a_bounded_window_in_flight():
    async with FakeCluster(3) as cluster, \
            BookKeeper(cluster.metadata_uri, read_window_entries=16, batch_read_entries=0) as bkc:
        lh = await written(cluster, bkc, 100)
        for b in cluster.bookies:
            b.requests.clear()
            b.hold()
        reading = asyncio.ensure_future(lh.read_entries(0, 99))
        await until(lambda: sum(b.held for b in cluster.bookies) == 16, "a full window")
        await asyncio.sleep(0.01)
        assert sum(b.held for b in cluster.bookies) == 16
        for b in cluster.bookies:
            b.release()
        for b in cluster.bookies:
            b._held = None
        entries = await reading
        assert [e.entry_id for e in entries] == list(range(100))
        assert sum(len(b.requests) for b in cluster.bookies) == 100


@run_async
async def test_a_failing_read_in_a_range_fails_the_range():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await written(cluster, bkc, 30)
        for b in first_replica(cluster, lh, 17):
            b.corrupt(lh.ledger_id, 17)
        with pytest.raises(DigestMismatchError, match="entry 17"):
            await lh.read_entries(0, 29)


@run_async
async def test_open_with_a_wrong_password_contacts_no_bookie():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await written(cluster, bkc, 3, close=False)
        for b in cluster.bookies:
            b.requests.clear()
        with pytest.raises(UnauthorizedAccessError):
            await bkc.open_ledger(lh.ledger_id, password=b"wrong")
        with pytest.raises(UnauthorizedAccessError):
            await bkc.open_ledger(lh.ledger_id)
        assert all(b.requests == [] for b in cluster.bookies)
        with pytest.raises(NoSuchLedgerMetadataError):
            await bkc.open_ledger(12345, password=b"pw")


@run_async
async def test_tailing_reader_follows_the_lac_without_fencing_or_changing_metadata():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as writer, \
            BookKeeper(cluster.metadata_uri) as reader:
        lh = await writer.create_ledger(3, 3, 2, password=b"pw")
        for i in range(10):
            await lh.add_entry(b"entry-%d" % i)
        lm = LedgerManager(cluster.store)
        before = await lm.read_ledger_metadata(lh.ledger_id)
        rh = await reader.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
        # Entry 9 carries LAC 8: the reader learns 8 (entry 9 is not known to be confirmed yet).
        assert rh.last_add_confirmed == 8
        assert [e.data for e in await rh.read_entries(0, 8)] == [b"entry-%d" % i for i in range(9)]
        for i in range(10, 20):
            await lh.add_entry(b"entry-%d" % i)
        assert await rh.read_last_add_confirmed() == 18  # entry 19 carries LAC 18
        assert (await rh.read_entry(18)).data == b"entry-18"
        with pytest.raises(IncorrectParameterError):
            await rh.read_entry(19)
        assert not any(b.fenced for b in cluster.bookies)
        assert not any(op == "fence" for b in cluster.bookies for op, _, _ in b.requests)
        after = await lm.read_ledger_metadata(lh.ledger_id)
        assert after == before
        await lh.close()
        assert await rh.read_last_add_confirmed() == 19 and rh.is_closed
        assert (await rh.read_entry(19)).data == b"entry-19"


@run_async
async def test_tailing_reader_finds_entries_of_a_new_segment():
    async with FakeCluster(4) as cluster, BookKeeper(cluster.metadata_uri) as writer, \
            BookKeeper(cluster.metadata_uri) as reader:
        lh = await written(cluster, writer, 5, e=3, wq=3, aq=3, close=False)
        rh = await reader.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
        victim = cluster.by_id(lh.ensemble[2])
        victim.add_hook = lambda req: int(StatusCode.EIO)
        for i in range(5, 15):
            await lh.add_entry(b"entry-%d" % i)
        assert len(lh.metadata.segments) == 2
        assert await rh.read_last_add_confirmed() == 13
        assert len(rh.metadata.segments) == 2
        assert [e.data for e in await rh.read_entries(0, 13)] == [b"entry-%d" % i for i in range(14)]


@run_async
async def test_lac_of_an_open_ledger_with_a_new_empty_segment_is_at_least_its_start_minus_one():
    async with FakeCluster(4) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await written(cluster, bkc, 4, close=False)
        spare = next(b.bookie_id for b in cluster.bookies if b.bookie_id not in lh.ensemble)
        await LedgerManager(cluster.store).update_ledger_metadata(
            lh.ledger_id, lambda md: md.with_ensemble_change(4, [spare] + list(lh.ensemble[1:])))
        rh = await bkc.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
        assert rh.last_add_confirmed == 3


@run_async
async def test_open_ledger_of_an_empty_open_ledger_and_unreachable_bookies():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri, connect_timeout_s=1) as bkc:
        lh = await bkc.create_ledger(3, 2, 2, password=b"pw")
        rh = await bkc.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
        assert rh.last_add_confirmed == -1
        for b in cluster.bookies:
            await b.stop()
        with pytest.raises(BookieIOError, match="no bookie of the last segment answered"):
            await bkc.open_ledger(lh.ledger_id, password=b"pw", recovery=False)


@run_async
async def test_delete_and_list_ledgers():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        ids = [(await bkc.create_ledger(3, 2, 2)).ledger_id for _ in range(4)]
        assert await bkc.list_ledgers() == sorted(ids)
        await bkc.delete_ledger(ids[1])
        assert await bkc.list_ledgers() == sorted(ids[:1] + ids[2:])
        with pytest.raises(NoSuchLedgerMetadataError):
            await bkc.delete_ledger(ids[1])
        with pytest.raises(NoSuchLedgerMetadataError):
            await bkc.open_ledger(ids[1])


@run_async
async def test_connect_classmethod_and_closed_client():
    async with FakeCluster(3) as cluster:
        bkc = await BookKeeper.connect(cluster.metadata_uri, add_timeout_s=1.0)
        lh = await bkc.create_ledger(3, 2, 2)
        await lh.add_entry(b"x")
        await bkc.close()
        await bkc.close()
        with pytest.raises(IncorrectParameterError, match="closed"):
            await bkc.create_ledger(3, 2, 2)
        with pytest.raises(IncorrectParameterError, match="add_timeout_s"):
            BookKeeper(cluster.metadata_uri, add_timeout_s=0)


@run_async
async def test_batch_reads_when_every_bookie_holds_every_entry():
    async with FakeCluster(4) as cluster, BookKeeper(cluster.metadata_uri, batch_read_entries=10) as bkc:
        lh = await written(cluster, bkc, 95, e=3, wq=3, aq=3)
        for b in cluster.bookies:
            b.requests.clear()
        entries = await lh.read_entries(0, 94)
        assert [e.data for e in entries] == [b"entry-%d" % i for i in range(95)]
        ops = [op for b in cluster.bookies for op, _, _ in b.requests]
        assert set(ops) == {"batch"} and len(ops) == 10
        # A corrupt entry inside a batch and a bookie that fails batches: single reads fill in.
        ens = first_replica(cluster, lh, 0)  # batches from entry s go to ens[s % 3] first
        ens[1].corrupt(lh.ledger_id, 13)  # inside the batch of 10..19
        ens[0].read_hook = lambda req: int(StatusCode.EIO)  # fails the batches of 0.., 30.., 60.., 90..
        for b in cluster.bookies:
            b.requests.clear()
        entries = await lh.read_entries(0, 94)
        assert [e.data for e in entries] == [b"entry-%d" % i for i in range(95)]
        singles = {e for b in cluster.bookies for op, _, e in b.requests if op == "read"}
        assert singles == {13} | set(range(0, 10)) | set(range(30, 40)) | set(range(60, 70)) | set(range(90, 95))
        ens[0].read_hook = None
        # A batch that stops early (the bookie lacks entries) is completed entry by entry.
        for e in range(45, 50):
            del ens[1].entries[(lh.ledger_id, e)]
        for b in cluster.bookies:
            b.requests.clear()
        assert [e.data for e in await lh.read_entries(40, 70)] == [b"entry-%d" % i for i in range(40, 71)]
        singles = {e for b in cluster.bookies for op, _, e in b.requests if op == "read"}
        assert singles == set(range(45, 50)) | {70}  # a run of one entry is a plain read


@run_async
async def test_striped_segments_never_use_batch_reads():
    async with FakeCluster(4) as cluster, BookKeeper(cluster.metadata_uri, batch_read_entries=10) as bkc:
        lh = await written(cluster, bkc, 30, e=3, wq=2, aq=2)
        for b in cluster.bookies:
            b.requests.clear()
        assert len(await lh.read_entries(0, 29)) == 30
        assert {op for b in cluster.bookies for op, _, _ in b.requests} == {"read"}
