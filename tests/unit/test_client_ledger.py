"""LedgerHandle against fake bookies: quorums, ordering, framing, fencing, ensemble change, close."""
from __future__ import annotations

import asyncio
import pathlib
import random
import struct
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from test_client_support import DROP, FakeCluster, run_async, until  # noqa: E402

from bk.client import BookKeeper, EnsemblePlacementPolicy  # noqa: E402
from bk.errors import (  # noqa: E402
    IncorrectParameterError, LedgerClosedError, LedgerFencedError, NotEnoughBookiesError, UnauthorizedAccessError,
)
from bk.meta.ledger_manager import LedgerManager  # noqa: E402
from bk.meta.ledger_metadata import LedgerState  # noqa: E402
from bk.proto import DigestManager, StatusCode, master_key  # noqa: E402

_hdr = struct.Struct(">qqqq")


def where(cluster: FakeCluster, ledger_id: int) -> dict[int, set[str]]:
    """entry id -> bookie ids that store it."""
    out: dict[int, set[str]] = {}
    for b in cluster.bookies:
        for e in b.ledger_entries(ledger_id):
            out.setdefault(e, set()).add(b.bookie_id)
    return out


async def metadata(cluster: FakeCluster, ledger_id: int):
    return (await LedgerManager(cluster.store).read_ledger_metadata(ledger_id))[0]


def check_segments(md) -> None:
    """REPLICATION.md invariant 4 on the metadata."""
    firsts = [f for f, _ in md.segments]
    assert firsts == sorted(set(firsts)) and firsts[0] == 0
    for _, ensemble in md.segments:
        assert len(ensemble) == md.ensemble_size == len(set(ensemble))


@pytest.mark.parametrize("e,wq,aq", [(1, 1, 1), (3, 2, 2), (3, 3, 2), (5, 3, 2), (4, 2, 1)])
@run_async
async def test_entries_go_round_robin_to_their_write_sets(e, wq, aq):
    async with FakeCluster(5) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(e, wq, aq, password=b"pw")
        ids = await asyncio.gather(*(lh.add_entry(b"e%d" % i) for i in range(40)))
        assert ids == list(range(40)) and lh.last_add_confirmed == 39
        await lh.close()
        await until(lambda: sum(map(len, where(cluster, lh.ledger_id).values())) == 40 * wq, "all replicas")
        ensemble = lh.metadata.segments[0][1]
        for entry_id, bookies in where(cluster, lh.ledger_id).items():
            assert bookies == {ensemble[(entry_id + i) % e] for i in range(wq)}


@pytest.mark.parametrize("digest_type", ["CRC32", "CRC32C", "MAC", "DUMMY"])
@run_async
async def test_stored_entries_carry_digest_piggybacked_lac_and_cumulative_length(digest_type):
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(3, 3, 3, digest_type=digest_type, password=b"pw")
        payloads = [b"a" * 5, b"", b"bb", b"c" * 1000]
        for p in payloads:  # one at a time: each add sees the previous LAC
            await lh.add_entry(p)
        dm = DigestManager(lh.ledger_id, digest_type, b"pw")
        total = 0
        for entry_id, p in enumerate(payloads):
            total += len(p)
            for b in cluster.bookies:
                lac, length, payload = dm.verify_entry(entry_id, b.entries[(lh.ledger_id, entry_id)])
                assert (lac, length, bytes(payload)) == (entry_id - 1, total, p)
            assert b.keys[lh.ledger_id] == master_key(b"pw")
        assert lh.length == total


@run_async
async def test_create_ledger_stores_metadata_bookkeeper_style():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(3, 2, 1, digest_type="MAC", password=b"secret",
                                     custom_metadata={"app": b"x"})
        lh2 = await bkc.create_ledger(2, 2, 2)
        assert lh2.ledger_id != lh.ledger_id
        md = await metadata(cluster, lh.ledger_id)
        assert (md.ensemble_size, md.write_quorum_size, md.ack_quorum_size) == (3, 2, 1)
        assert md.state is LedgerState.OPEN and md.last_entry_id == -1 and md.length == 0
        assert md.password == b"secret" and int(md.digest_type) == 2 and md.custom == {"app": b"x"}
        assert md.ctime and md.ctoken is not None
        assert set(md.segments[0][1]) == {b.bookie_id for b in cluster.bookies}
        assert sorted(await bkc.list_ledgers()) == sorted([lh.ledger_id, lh2.ledger_id])


@run_async
async def test_create_ledger_refuses_bad_arguments_and_too_few_bookies():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        for sizes in [(2, 3, 1), (3, 2, 3), (3, 2, 0), (0, 0, 0)]:
            with pytest.raises(IncorrectParameterError):
                await bkc.create_ledger(*sizes)
        with pytest.raises(NotEnoughBookiesError, match="need 4 writable bookies, 3 available"):
            await bkc.create_ledger(4, 2, 2)
        with pytest.raises(IncorrectParameterError):
            await bkc.create_ledger(3, 2, 2, password="text")
        with pytest.raises(ValueError):
            await bkc.create_ledger(3, 2, 2, digest_type="SHA256")
        assert await bkc.list_ledgers() == []


@run_async
async def test_read_only_bookies_are_never_chosen():
    async with FakeCluster(4) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        ro = cluster.bookies[2]
        await cluster.set_readonly(ro)
        for _ in range(20):
            lh = await bkc.create_ledger(3, 2, 2)
            assert ro.bookie_id not in lh.ensemble
        with pytest.raises(NotEnoughBookiesError):
            await bkc.create_ledger(4, 2, 2)


@run_async
async def test_completions_are_delivered_in_entry_order_when_answers_come_reversed():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(3, 3, 3)
        for b in cluster.bookies:
            b.hold()
        order = []
        futures = [lh.async_add_entry(b"%d" % i) for i in range(100)]
        for f in futures:
            f.add_done_callback(lambda f: order.append(f.result()))
        await until(lambda: all(b.held == 100 for b in cluster.bookies), "adds at all bookies")
        assert lh.last_add_confirmed == -1
        for b in cluster.bookies:
            b.release(reverse=True)
        await asyncio.gather(*futures)
        assert order == list(range(100)) and lh.last_add_confirmed == 99


@run_async
async def test_ack_quorum_acknowledges_without_the_slowest_bookie_and_lac_is_a_prefix():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(3, 3, 2)
        slow = cluster.by_id(lh.ensemble[0])
        slow.hold()
        assert [await lh.add_entry(b"x") for _ in range(5)] == list(range(5))
        assert slow.held == 5
        # Entry 5 waits for two bookies; entry 6 already has its quorum: LAC stays at 4.
        fast = [cluster.by_id(b) for b in lh.ensemble[1:]]
        fast[0].hold()
        f5 = lh.async_add_entry(b"5")
        await until(lambda: fast[0].held == 1, "entry 5 held")
        fast[0].add_hook = None
        f6 = lh.async_add_entry(b"6")
        await until(lambda: fast[0].held == 2 and (lh.ledger_id, 6) in fast[1].entries, "entry 6 stored")
        await asyncio.sleep(0)
        assert not f5.done() and not f6.done() and lh.last_add_confirmed == 4
        fast[0].release()
        assert await asyncio.gather(f5, f6) == [5, 6] and lh.last_add_confirmed == 6
        slow.release()


@run_async
async def test_callback_adds_complete_in_entry_order_and_failures_reach_the_callback():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(3, 2, 2, password=b"pw")
        for b in cluster.bookies:
            b.hold()
        outcomes = []
        ids = [lh.async_add_entry(b"%d" % i, lambda eid, err: outcomes.append((eid, err))) for i in range(60)]
        assert ids == list(range(60))  # the id at once, no future
        await until(lambda: sum(b.held for b in cluster.bookies) == 120, "adds at all bookies")
        for b in cluster.bookies:
            b.release(reverse=True)
        await until(lambda: len(outcomes) == 60, "completions")
        assert outcomes == [(i, None) for i in range(60)] and lh.last_add_confirmed == 59
        # a fenced bookie: every add in flight gets its error through the callback, once
        cluster.by_id(lh.ensemble[0]).fenced.add(lh.ledger_id)
        failed = []
        for i in range(6):
            lh.async_add_entry(b"late", lambda eid, err: failed.append((eid, err)))
        await until(lambda: len(failed) == 6, "failures")
        assert [eid for eid, _ in failed] == list(range(60, 66))
        assert all(isinstance(err, LedgerFencedError) and err.outcome_unknown for _, err in failed)
        with pytest.raises(LedgerFencedError):
            lh.async_add_entry(b"after", lambda eid, err: None)


@run_async
async def test_fenced_bookie_fails_the_writer_and_in_flight_adds_have_unknown_outcome():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(3, 3, 3, password=b"pw")
        assert await lh.add_entry(b"ok") == 0
        b0 = cluster.by_id(lh.ensemble[0])
        b0.hold()
        cluster.by_id(lh.ensemble[1]).fenced.add(lh.ledger_id)  # another client recovers the ledger
        futures = [lh.async_add_entry(b"%d" % i) for i in range(1, 6)]
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert all(isinstance(r, LedgerFencedError) for r in results)
        assert all(r.outcome_unknown and "outcome is unknown" in str(r) for r in results)
        assert [r.entry_id for r in results] == [1, 2, 3, 4, 5]
        with pytest.raises(LedgerFencedError) as info:
            await lh.add_entry(b"later")
        assert info.value.outcome_unknown is False and info.value.entry_id is None
        assert lh.last_add_confirmed == 0
        b0.release()
        await lh.close()  # nobody closed it in the metadata: the writer closes at its LAC
        md = await metadata(cluster, lh.ledger_id)
        assert md.state is LedgerState.CLOSED and md.last_entry_id == 0


@run_async
async def test_wrong_master_key_at_a_bookie_is_unauthorized():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(3, 2, 2, password=b"pw")
        cluster.by_id(lh.ensemble[1]).keys[lh.ledger_id] = master_key(b"someone else")
        with pytest.raises(UnauthorizedAccessError):
            await asyncio.gather(*(lh.add_entry(b"x") for _ in range(3)))
        with pytest.raises(UnauthorizedAccessError):
            await lh.add_entry(b"y")


@pytest.mark.parametrize("failure", ["stop", "eio", "readonly", "toomany", "timeout"])
@run_async
async def test_bookie_failure_changes_the_ensemble_and_loses_nothing(failure):
    async with FakeCluster(5) as cluster, BookKeeper(cluster.metadata_uri, add_timeout_s=0.3) as bkc:
        lh = await bkc.create_ledger(3, 2, 2, password=b"pw")
        first = [await lh.add_entry(b"a%d" % i) for i in range(10)]
        victim = cluster.by_id(lh.ensemble[1])
        if failure == "stop":
            await cluster.kill(victim)
        elif failure == "timeout":
            victim.add_hook = lambda req: DROP
        else:
            rc = {"eio": StatusCode.EIO, "readonly": StatusCode.EREADONLY,
                  "toomany": StatusCode.ETOOMANYREQUESTS}[failure]
            victim.add_hook = lambda req: int(rc)
        rest = await asyncio.gather(*(lh.add_entry(b"b%d" % i) for i in range(50)))
        assert first + rest == list(range(60))
        assert victim.bookie_id not in lh.ensemble and lh.ensemble_changes >= 1
        await lh.close()
        md = await metadata(cluster, lh.ledger_id)
        check_segments(md)
        assert md.segments[1][0] == 10 and victim.bookie_id not in md.segments[1][1]
        assert md.state is LedgerState.CLOSED and md.last_entry_id == 59
        # Every entry sits on its write set of the segment that covers it.
        stored = where(cluster, lh.ledger_id)
        for entry_id in range(60):
            ensemble = md.ensemble_for(entry_id)
            ws = {ensemble[(entry_id + i) % 3] for i in range(2)}
            assert ws <= stored[entry_id]
        rh = await bkc.open_ledger(lh.ledger_id, b"pw")
        data = [e.data for e in await rh.read_entries(0, 59)]
        assert data == [b"a%d" % i for i in range(10)] + [b"b%d" % i for i in range(50)]


@run_async
async def test_no_ack_depends_on_an_ensemble_the_metadata_does_not_have():
    async with FakeCluster(4) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(3, 3, 2)
        await lh.add_entry(b"0")
        lm = bkc.ledger_manager
        gate = asyncio.Event()
        entered = asyncio.Event()
        real_update = lm.update_ledger_metadata

        async def gated_update(*args, **kwargs):
            entered.set()
            await gate.wait()
            return await real_update(*args, **kwargs)

        lm.update_ledger_metadata = gated_update
        victim = cluster.by_id(lh.ensemble[0])
        victim.add_hook = lambda req: int(StatusCode.EIO)
        others = [cluster.by_id(b) for b in lh.ensemble if b != victim.bookie_id]
        for b in others:
            b.hold()
        futures = [lh.async_add_entry(b"%d" % i) for i in range(1, 20)]
        await asyncio.wait_for(entered.wait(), 20)
        # Two healthy bookies acknowledge every entry (AQ = 2), but the ensemble change is not in the
        # metadata yet: nothing may complete.
        await until(lambda: all(b.held == 19 for b in others), "entries stored")
        for b in others:
            b.release()
        await until(lambda: all(c.pending_count == 0 for c in bkc.pool.clients().values()), "answers in")
        await asyncio.sleep(0.01)
        assert not any(f.done() for f in futures) and lh.last_add_confirmed == 0
        gate.set()
        assert await asyncio.gather(*futures) == list(range(1, 20))
        md = await metadata(cluster, lh.ledger_id)
        assert [f for f, _ in md.segments] == [0, 1]


@run_async
async def test_two_failures_replace_the_new_last_segment_at_the_same_start():
    async with FakeCluster(5) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(3, 3, 3)
        await lh.add_entry(b"0")
        for b in lh.ensemble[:2]:
            cluster.by_id(b).add_hook = lambda req: int(StatusCode.EIO)
        assert await asyncio.gather(*(lh.add_entry(b"x") for _ in range(10))) == list(range(1, 11))
        await lh.close()
        md = await metadata(cluster, lh.ledger_id)
        check_segments(md)
        assert [f for f, _ in md.segments] == [0, 1]
        assert not set(md.segments[1][1]) & set(md.segments[0][1][:2])


@run_async
async def test_not_enough_bookies_for_an_ensemble_change_fails_the_adds():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(3, 2, 2)
        await lh.add_entry(b"0")
        cluster.by_id(lh.ensemble[1]).add_hook = lambda req: int(StatusCode.EIO)
        results = await asyncio.gather(*(lh.add_entry(b"x") for _ in range(5)), return_exceptions=True)
        assert all(isinstance(r, NotEnoughBookiesError) and r.outcome_unknown for r in results)
        assert sorted(r.entry_id for r in results) == [1, 2, 3, 4, 5]
        with pytest.raises(NotEnoughBookiesError):
            await lh.add_entry(b"y")
        await lh.close()
        assert (await metadata(cluster, lh.ledger_id)).last_entry_id == 0


@run_async
async def test_ensemble_change_finding_the_ledger_in_recovery_fences_the_writer_out():
    async with FakeCluster(4) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(3, 2, 2)
        await lh.add_entry(b"0")
        await LedgerManager(cluster.store).update_ledger_metadata(lh.ledger_id, lambda md: md.with_in_recovery())
        cluster.by_id(lh.ensemble[0]).add_hook = lambda req: int(StatusCode.EIO)
        results = await asyncio.gather(*(lh.add_entry(b"x") for _ in range(3)), return_exceptions=True)
        assert all(isinstance(r, LedgerFencedError) for r in results), results
        with pytest.raises(LedgerFencedError, match="being recovered"):
            await lh.close()


@run_async
async def test_close_waits_for_adds_is_idempotent_and_refuses_later_adds():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(3, 2, 2)
        for b in cluster.bookies:
            b.hold()
        futures = [lh.async_add_entry(b"x" * 10) for _ in range(30)]
        await until(lambda: sum(b.held for b in cluster.bookies) == 60, "adds held")
        closing = asyncio.ensure_future(lh.close())
        await asyncio.sleep(0.01)
        assert not closing.done()
        with pytest.raises(LedgerClosedError):
            await lh.add_entry(b"late")
        for b in cluster.bookies:
            b.release()
        await closing
        assert await asyncio.gather(*futures) == list(range(30))
        md = await metadata(cluster, lh.ledger_id)
        assert md.state is LedgerState.CLOSED and (md.last_entry_id, md.length) == (29, 300)
        await lh.close()
        assert lh.is_closed and (await metadata(cluster, lh.ledger_id)) == md
        with pytest.raises(LedgerClosedError):
            lh.async_add_entry(b"x")


@run_async
async def test_close_of_a_ledger_closed_elsewhere_at_another_entry_is_an_error():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await bkc.create_ledger(3, 2, 2)
        await lh.add_entry(b"x")
        await LedgerManager(cluster.store).update_ledger_metadata(
            lh.ledger_id, lambda md: md.with_in_recovery().with_closed(5, 100))
        with pytest.raises(LedgerFencedError, match="closed by another client at entry 5"):
            await lh.close()
        lh2 = await bkc.create_ledger(3, 2, 2)
        await lh2.add_entry(b"x")
        await LedgerManager(cluster.store).update_ledger_metadata(
            lh2.ledger_id, lambda md: md.with_in_recovery().with_closed(0, 1))
        await lh2.close()  # recovered at exactly this writer's LAC: agreed


@run_async
async def test_bad_entries_are_refused_and_change_nothing():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri, max_frame_size_bytes=4096) as bkc:
        lh = await bkc.create_ledger(3, 2, 2)
        with pytest.raises(IncorrectParameterError, match="larger than"):
            await lh.add_entry(b"x" * 5000)
        with pytest.raises(IncorrectParameterError):
            await lh.add_entry("text")
        assert await lh.add_entry(bytearray(b"ok")) == 0
        assert await lh.add_entry(memoryview(b"ok2")) == 1
        assert lh.last_add_pushed == 1


@run_async
async def test_placement_replacement_prefers_bookies_that_did_not_fail():
    policy = EnsemblePlacementPolicy(random.Random(1))
    for _ in range(20):
        new = policy.replace_bookies(["a", "b", "c"], {"b"}, ["a", "b", "c", "d", "e"], avoid={"d"})
        assert new == ["a", "e", "c"]
    assert policy.replace_bookies(["a", "b", "c"], {"b"}, ["a", "b", "c", "d"], avoid={"d"}) == ["a", "d", "c"]
    with pytest.raises(NotEnoughBookiesError):
        policy.replace_bookies(["a", "b", "c"], {"a", "b"}, ["a", "b", "c", "d"])


@run_async
async def test_closing_the_client_fails_adds_in_flight_without_an_ensemble_change():
    async with FakeCluster(4) as cluster:
        bkc = await BookKeeper.connect(cluster.metadata_uri)
        lh = await bkc.create_ledger(3, 2, 2)
        await lh.add_entry(b"0")
        for b in cluster.bookies:
            b.add_hook = lambda req: DROP
        futures = [lh.async_add_entry(b"x") for _ in range(10)]
        await until(lambda: sum(len(b.requests) for b in cluster.bookies) >= 22, "adds sent")
        await bkc.close()
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert all(isinstance(r, LedgerClosedError) and r.outcome_unknown for r in results)
        assert lh.ensemble_changes == 0
        with pytest.raises(LedgerClosedError):
            await lh.add_entry(b"y")
