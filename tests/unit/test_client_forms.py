"""The idiomatic add and read forms against fake bookies: add_entry as a future, add_entries,
lh.writer(), read_entries_iter - ordering, errors part way, cancellation, the window, tailing."""
from __future__ import annotations

import asyncio
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from test_client_support import FakeCluster, run_async, until  # noqa: E402

from bk.client import BookKeeper  # noqa: E402
from bk.errors import (  # noqa: E402
    AddBatchError, DigestMismatchError, IncorrectParameterError, LedgerClosedError, LedgerFencedError,
)
from bk.proto import StatusCode  # noqa: E402

EFENCED = int(StatusCode.EFENCED)


def fence_from(bookie, ledger_id: int, entry_id: int) -> None:
    """The bookie answers EFENCED to every add of `ledger_id` from `entry_id` on."""
    bookie.add_hook = lambda req: EFENCED if req.ledger_id == ledger_id and req.entry_id >= entry_id else None


# ---------------------------------------------------------------- add_entry
@run_async
async def test_add_entry_is_a_future_started_at_the_call_and_errors_raise_at_the_await():
    async with FakeCluster(1) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(1, 1, 1)
        f = lh.add_entry(b"a")
        assert asyncio.isfuture(f) and lh.last_add_pushed == 0  # started, no coroutine to schedule
        assert await asyncio.gather(f, *(lh.add_entry(b"%d" % i) for i in range(20))) == list(range(21))
        bad = lh.add_entry("not bytes")  # does not raise here ...
        with pytest.raises(IncorrectParameterError):
            await bad  # ... but where a coroutine's error would
        await lh.close()
        refused = lh.add_entry(b"late")
        with pytest.raises(LedgerClosedError) as info:
            await refused
        assert info.value.outcome_unknown is False


# ---------------------------------------------------------------- add_entries
@run_async
async def test_add_entries_returns_ids_in_order_for_any_iterable_between_other_adds():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(3, 2, 2)
        for b in cluster.bookies:
            b.hold()
        first = lh.add_entry(b"single")
        batch = lh.add_entries(b"e%d" % i for i in range(50))  # a generator
        after = lh.add_entries([bytearray(b"x"), memoryview(b"y")])
        empty = lh.add_entries([])
        assert await empty == []
        await until(lambda: sum(b.held for b in cluster.bookies) == 2 * 53, "adds at the bookies")
        for b in cluster.bookies:
            b.release(reverse=True)  # answers out of order: completions still in order
        assert await first == 0
        assert await batch == list(range(1, 51))
        assert await after == [51, 52]
        entries = await lh.read_entries(0, 52)
        assert [e.data for e in entries[1:51]] == [b"e%d" % i for i in range(50)]


@run_async
async def test_add_entries_with_bad_input_adds_nothing():
    async with FakeCluster(1) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(1, 1, 1)
        with pytest.raises(IncorrectParameterError):
            await lh.add_entries([b"ok", b"ok", 17, b"ok"])
        with pytest.raises(IncorrectParameterError):
            await lh.add_entries([b"ok", bytes(bkc.max_frame_size_bytes + 1)])
        assert lh.last_add_pushed == -1 and lh.pending_adds == 0
        assert await lh.add_entries([b"now"]) == [0]


@run_async
async def test_a_batch_failing_part_way_reports_each_add_once():
    async with FakeCluster(1) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(1, 1, 1)
        await lh.add_entries([b"before"] * 3)  # 0..2
        fence_from(cluster.bookies[0], lh.ledger_id, 10)  # another client fenced the ledger at entry 10
        with pytest.raises(AddBatchError) as info:
            await lh.add_entries(b"b%d" % i for i in range(20))  # 3..22
        err = info.value
        assert err.acknowledged == list(range(3, 10))
        assert err.failed == list(range(10, 23))
        assert err.not_added == 0 and err.outcome_unknown is True
        assert isinstance(err.__cause__, LedgerFencedError)
        assert not set(err.acknowledged) & set(err.failed)
        assert lh.last_add_confirmed == 9  # what was reported acknowledged is acknowledged
        assert [e.data for e in await lh.read_entries(3, 9)] == [b"b%d" % i for i in range(7)]
        with pytest.raises(LedgerFencedError):  # the writer is fenced out: nothing more is added
            await lh.add_entries([b"after"])


@run_async
async def test_cancelling_a_batch_does_not_take_its_adds_back():
    async with FakeCluster(1) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(1, 1, 1)
        cluster.bookies[0].hold()
        batch = lh.add_entries([b"c"] * 5)
        task = asyncio.ensure_future(asyncio.wait_for(batch, 10))
        await until(lambda: cluster.bookies[0].held == 5, "adds at the bookie")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert batch.cancelled()
        cluster.bookies[0].release()
        assert await lh.add_entry(b"next") == 5
        assert lh.last_add_confirmed == 5  # the cancelled batch's adds were made


# ---------------------------------------------------------------- writer
@run_async
async def test_writer_waits_only_when_its_window_is_full():
    async with FakeCluster(1) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(1, 1, 1)
        bookie = cluster.bookies[0]
        bookie.hold()
        async with lh.writer(max_in_flight=4) as w:
            ids = [await w.add(b"%d" % i) for i in range(4)]  # room: done at once, no loop step
            assert ids == [0, 1, 2, 3] and w.in_flight == 4
            fifth = w.add(b"4")
            sixth = w.add(b"5")
            assert not fifth.done() and w.waiting == 2 and lh.last_add_pushed == 3  # not sent yet
            await until(lambda: bookie.held == 4, "the window at the bookie")
            bookie.release()
            assert await fifth == 4 and await sixth == 5
            bookie.add_hook = None
        assert lh.last_add_confirmed == 5 and w.acknowledged == 6 and w.in_flight == 0
        with pytest.raises(LedgerClosedError):
            w.add(b"after close")
        with pytest.raises(IncorrectParameterError):
            lh.writer(max_in_flight=0)


@run_async
async def test_writer_error_surfaces_on_the_next_add_once_and_exit_does_not_repeat_it():
    async with FakeCluster(1) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(1, 1, 1)
        fence_from(cluster.bookies[0], lh.ledger_id, 5)
        raised = []
        async with lh.writer(max_in_flight=2) as w:
            for i in range(20):
                try:
                    await w.add(b"%d" % i)
                except LedgerFencedError as e:
                    raised.append((i, e))
                    break
        assert len(raised) == 1 and w.acknowledged == 5 and w.last_acknowledged_entry_id == 4
        assert raised[0][1].outcome_unknown is True


@run_async
async def test_writer_error_not_yet_seen_raises_on_exit():
    async with FakeCluster(1) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(1, 1, 1)
        fence_from(cluster.bookies[0], lh.ledger_id, 2)
        with pytest.raises(LedgerFencedError):
            async with lh.writer(max_in_flight=100) as w:
                for i in range(4):
                    await w.add(b"%d" % i)  # the window never fills: no add sees the failure
        assert w.acknowledged == 2


@run_async
async def test_writer_cancelled_while_waiting_does_not_send_and_exit_waits_for_what_was_sent():
    async with FakeCluster(1) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(1, 1, 1)
        bookie = cluster.bookies[0]
        bookie.hold()
        w = lh.writer(max_in_flight=2)

        async def producer():
            async with w:
                for i in range(10):
                    await w.add(b"%d" % i)

        task = asyncio.ensure_future(producer())
        await until(lambda: w.waiting == 1 and bookie.held == 2, "a full window")
        task.cancel()
        await asyncio.sleep(0.05)
        assert not task.done()  # leaving the block waits for the two adds sent
        bookie.release()
        bookie.add_hook = None
        with pytest.raises(asyncio.CancelledError):
            await task
        assert lh.last_add_pushed == 1 and lh.last_add_confirmed == 1  # the third add was never sent
        assert await lh.add_entry(b"next") == 2


# ---------------------------------------------------------------- read_entries_iter
@run_async
async def test_read_iterator_reads_across_segments_in_order():
    async with FakeCluster(4) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(3, 2, 2)
        await lh.add_entries(b"a%d" % i for i in range(25))
        await cluster.kill(cluster.by_id(lh.ensemble[1]))
        await lh.add_entries(b"b%d" % i for i in range(25))
        await lh.close()
        assert len(lh.metadata.segments) == 2
        rh = await bkc.open_ledger(lh.ledger_id, recovery=False)
        got = [e async for e in rh.read_entries_iter(0, None, chunk_entries=7, read_ahead=2)]
        assert [e.entry_id for e in got] == list(range(50))
        assert [e.data for e in got] == [b"a%d" % i for i in range(25)] + [b"b%d" % i for i in range(25)]
        middle = [e.entry_id async for e in rh.read_entries_iter(20, 30, chunk_entries=4)]
        assert middle == list(range(20, 31))
        assert [e async for e in rh.read_entries_iter(5, 4)] == []
        with pytest.raises(IncorrectParameterError):
            rh.read_entries_iter(0, 50)  # closed at 49: entry 50 will never exist


@run_async
async def test_read_iterator_tails_a_ledger_still_being_written():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc, \
            BookKeeper(cluster.metadata_uri) as reader_client:
        lh = await bkc.create_ledger(3, 3, 2)
        await lh.add_entries([b"0", b"1"])
        rh = await reader_client.open_ledger(lh.ledger_id, recovery=False)
        got = []

        async def tail():
            async for entry in rh.read_entries_iter(0, 29, chunk_entries=4, poll_interval_s=0.01):
                got.append(entry)

        task = asyncio.ensure_future(tail())
        for i in range(2, 31):  # entry 30 carries the LAC 29: then entry 29 is readable
            await lh.add_entry(b"%d" % i)
            await asyncio.sleep(0.002)
        await asyncio.wait_for(task, 20)
        assert [e.entry_id for e in got] == list(range(30))
        assert [e.data for e in got] == [b"%d" % i for i in range(30)]
        # the writer closes short of what a reader waits for: the reader is told, not left waiting
        waiting = rh.read_entries_iter(31, 40, poll_interval_s=0.01)
        await lh.close()
        with pytest.raises(IncorrectParameterError):
            async for _ in waiting:
                pass


@run_async
async def test_read_iterator_raises_at_the_chunk_it_cannot_read():
    async with FakeCluster(1) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(1, 1, 1)
        await lh.add_entries([b"%d" % i for i in range(20)])
        await lh.close()
        cluster.bookies[0].corrupt(lh.ledger_id, 12)
        got = []
        with pytest.raises(DigestMismatchError):
            async for entry in lh.read_entries_iter(0, 19, chunk_entries=5):
                got.append(entry.entry_id)
        assert got == list(range(10))  # the chunks before the one holding entry 12
