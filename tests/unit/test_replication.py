"""bk.replication: segment arithmetic, the fragment replicator, the ledger checker and manual
bookie recovery (BookieRecovery), against fake bookies on a mem:// store (test_client_support).

After each recovery the checks are the ones REPLICATION.md asks for: no segment
names the lost bookie, every entry is on every bookie of its write set (a raw
READ of each entry from each bookie, digest-verified, original payload), closed
ledgers keep their lastEntryId and length.
"""
from __future__ import annotations

import asyncio
import random

import pytest

from test_client_support import EOK, FakeCluster, run_async

from bk.client import BookKeeper
from bk.errors import LedgerFencedError, LedgerClosedError, ReplicationError
from bk.meta.ledger_metadata import LedgerState
from bk.proto import DigestManager, DigestType, StatusCode
from bk.replication import BookieRecovery, LedgerChecker, LedgerReplicator, RateLimiter
from bk.replication.replicator import bookie_entries, segment_bounds, share_ends


# ---------------------------------------------------------------------- arithmetic
@pytest.mark.parametrize("seed", range(20))
def test_bookie_entries_and_share_ends_match_the_write_sets(seed):
    rng = random.Random(seed)
    E = rng.randint(1, 6)
    WQ = rng.randint(1, E)
    first = rng.randint(0, 50)
    last = first + rng.randint(-1, 40)
    for index in range(E):
        expected = [e for e in range(first, last + 1) if index in [(e + i) % E for i in range(WQ)]]
        assert list(bookie_entries(first, last, E, WQ, index)) == expected
        ends = (expected[0], expected[-1]) if len(expected) > 1 else tuple(expected)
        assert share_ends(first, last, E, WQ, index) == ends


def test_segment_bounds_of_open_closed_and_empty_segments():
    from bk.meta.ledger_metadata import LedgerMetadata
    md = LedgerMetadata.new(["a:1", "b:1", "c:1"], 2, 2).with_ensemble_change(10, ["a:1", "b:1", "d:1"])
    assert segment_bounds(md, 0) == (0, 9)
    assert segment_bounds(md, 1) == (10, None)  # open end
    closed = md.with_closed(9, 100)  # the last segment never got an entry
    assert segment_bounds(closed, 1) == (10, 9)
    assert list(bookie_entries(10, 9, 3, 2, 0)) == []


def test_rate_limiter_asks_to_wait_once_the_budget_is_spent():
    limiter = RateLimiter(1000)
    assert limiter.delay_s() == 0
    limiter.spend(10_000)
    assert limiter.delay_s() > 5
    with pytest.raises(ValueError):
        RateLimiter(0)


# ---------------------------------------------------------------------- helpers
def payloads(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.randrange(1, 300)) + b"#%d" % i for i in range(n)]


async def write_ledger(bkc, n, e=3, wq=2, aq=2, close=True, seed=1, password=b"pw", ensemble=None):
    data = payloads(n, seed)
    if ensemble is not None:
        bkc.placement.new_ensemble = lambda size, writable, exclude=(), **_: list(ensemble)
    try:
        lh = await bkc.create_ledger(e, wq, aq, password=password)
    finally:
        if ensemble is not None:
            del bkc.placement.new_ensemble
    await asyncio.gather(*(lh.add_entry(d) for d in data))
    if close:
        await lh.close()
    return lh, data


async def raw_entries_ok(bkc, ledger_id: int, expected: list[bytes]) -> None:
    """Every entry on every bookie of its write set, digest-valid and with its original payload."""
    md = await bkc.get_ledger_metadata(ledger_id)
    digest = DigestManager(ledger_id, DigestType(int(md.digest_type)), md.password)
    for entry_id, payload in enumerate(expected):
        ensemble = md.ensemble_for(entry_id)
        for i in range(md.write_quorum_size):
            bookie = ensemble[(entry_id + i) % md.ensemble_size]
            client = bkc.pool.get(bookie)
            response = await client.call(client.send_read, ledger_id, entry_id)
            assert response.rc == EOK, f"ledger {ledger_id} entry {entry_id} missing on {bookie}"
            _, _, got = digest.verify_entry(entry_id, response.body)
            assert bytes(got) == payload


async def two_segment_ledger(cluster, bkc, n: int, seed: int):
    """A closed E3/WQ2/AQ2 ledger of n entries whose first bookie failed adds halfway, so it has two
    segments; the second bookie of the first ensemble (returned as `victim`) is in both."""
    lh = await bkc.create_ledger(3, 2, 2, password=b"pw")
    bkc.placement.rng = random.Random(0)
    data = payloads(n, seed)
    await asyncio.gather(*(lh.add_entry(x) for x in data[:n // 2]))
    failing, victim = lh.ensemble[0], lh.ensemble[1]
    cluster.by_id(failing).add_hook = lambda req: int(StatusCode.EIO)
    await asyncio.gather(*(lh.add_entry(x) for x in data[n // 2:]))
    await lh.close()
    cluster.by_id(failing).add_hook = None
    assert len(lh.metadata.segments) == 2 and all(victim in ens for _, ens in lh.metadata.segments)
    return lh, data, victim


async def check_recovered(bkc, ledger_id, expected, lost, *, last_entry_id=None):
    md = await bkc.get_ledger_metadata(ledger_id)
    assert lost not in md.bookies()
    for _, ensemble in md.segments:
        assert len(set(ensemble)) == md.ensemble_size
    if last_entry_id is not None:
        assert md.state is LedgerState.CLOSED and md.last_entry_id == last_entry_id
        assert md.length == sum(map(len, expected[:last_entry_id + 1]))
    await raw_entries_ok(bkc, ledger_id, expected[:md.last_entry_id + 1] if md.is_closed else expected)


# ---------------------------------------------------------------------- manual recovery
@run_async
async def test_recover_every_closed_ledger_of_a_lost_bookie_to_random_targets():
    async with FakeCluster(6) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        ids = [b.bookie_id for b in cluster.bookies]
        victim = ids[0]
        written = {}
        for shape, seed in (((3, 2, 2), 1), ((3, 3, 2), 2), ((2, 2, 1), 3), ((5, 3, 2), 4)):
            lh, data = await write_ledger(bkc, 60, *shape, seed=seed, ensemble=[victim] + ids[1:shape[0]])
            written[lh.ledger_id] = data
        empty, _ = await write_ledger(bkc, 0, ensemble=[victim, ids[1], ids[2]])
        written[empty.ledger_id] = []
        other, other_data = await write_ledger(bkc, 20, ensemble=ids[1:4], seed=9)
        await cluster.kill(cluster.by_id(victim))
        recovery = BookieRecovery(bkc, window_entries=7)
        plans = await recovery.affected_ledgers(victim)
        assert sorted(p.ledger_id for p in plans) == sorted(written)
        seen = []
        summary = await recovery.recover(victim, on_ledger=lambda p, r: seen.append((p.ledgers_done, r.ledger_id)))
        assert summary.ok and summary.by_status("recovered") == sorted(written)
        assert [n for n, _ in seen] == list(range(1, len(written) + 1))
        assert summary.progress.bytes_copied > 0
        for ledger_id, data in written.items():
            await check_recovered(bkc, ledger_id, data, victim, last_entry_id=len(data) - 1)
        md = await bkc.get_ledger_metadata(other.ledger_id)
        assert md.segments == ((0, tuple(ids[1:4])),)  # untouched


@run_async
async def test_recover_with_a_target_only_one_ledger_and_a_multi_segment_ledger():
    async with FakeCluster(5) as cluster, BookKeeper(cluster.metadata_uri, add_timeout_s=2) as bkc:
        a, b, c, d, t = [x.bookie_id for x in cluster.bookies]
        # a ledger with two segments, both with b: a fails mid-stream and is replaced by d
        lh, data, victim = await two_segment_ledger(cluster, bkc, 80, 5)
        md = lh.metadata
        other, _ = await write_ledger(bkc, 10, ensemble=[victim] + [x for x in (a, c, d) if x != victim][:2], seed=3)
        target = next(x for x in (a, b, c, d, t) if x not in md.bookies())
        await cluster.kill(cluster.by_id(victim))
        recovery = BookieRecovery(bkc)
        summary = await recovery.recover(victim, ledger_id=lh.ledger_id, target=target)
        assert summary.ok and summary.by_status("recovered") == [lh.ledger_id]
        new = await bkc.get_ledger_metadata(lh.ledger_id)
        assert all(target in ens for _, ens in new.segments)
        await check_recovered(bkc, lh.ledger_id, data, victim, last_entry_id=79)
        assert victim in (await bkc.get_ledger_metadata(other.ledger_id)).bookies()  # not asked for


@run_async
async def test_open_ledger_is_fenced_and_closed_then_recovered_and_the_writer_is_out():
    async with FakeCluster(4) as cluster, BookKeeper(cluster.metadata_uri, add_timeout_s=2) as bkc:
        ids = [x.bookie_id for x in cluster.bookies]
        writer, data = await write_ledger(bkc, 30, close=False, ensemble=ids[:3])
        victim = ids[0]
        await cluster.kill(cluster.by_id(victim))
        async with BookKeeper(cluster.metadata_uri) as admin:
            summary = await BookieRecovery(admin).recover(victim)
            assert summary.ok
            (result,) = summary.results
            assert result.outcome.fenced
            await check_recovered(admin, writer.ledger_id, data, victim, last_entry_id=29)
        with pytest.raises((LedgerFencedError, LedgerClosedError)):
            await writer.add_entry(b"too late")


@run_async
async def test_skip_open_ledgers_leaves_them_untouched():
    async with FakeCluster(4) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        ids = [x.bookie_id for x in cluster.bookies]
        open_lh, _ = await write_ledger(bkc, 10, close=False, ensemble=ids[:3])
        closed, data = await write_ledger(bkc, 10, ensemble=ids[:3], seed=2)
        before = await bkc.ledger_manager.read_ledger_metadata(open_lh.ledger_id)
        await cluster.kill(cluster.bookies[0])
        summary = await BookieRecovery(bkc).recover(ids[0], skip_open=True)
        assert summary.ok
        assert summary.by_status("skipped-open") == [open_lh.ledger_id]
        assert summary.by_status("recovered") == [closed.ledger_id]
        assert await bkc.ledger_manager.read_ledger_metadata(open_lh.ledger_id) == before
        await check_recovered(bkc, closed.ledger_id, data, ids[0], last_entry_id=9)
        await open_lh.add_entry(b"the writer goes on")


@run_async
async def test_an_unreadable_entry_fails_that_ledger_only_and_changes_nothing():
    async with FakeCluster(5) as cluster, BookKeeper(cluster.metadata_uri, read_timeout_s=2) as bkc:
        ids = [x.bookie_id for x in cluster.bookies]
        doomed, _ = await write_ledger(bkc, 10, ensemble=ids[:3])  # entry 0 lives on ids[0] and ids[1] only
        fine, data = await write_ledger(bkc, 10, e=3, wq=3, aq=2, ensemble=[ids[0], ids[2], ids[3]], seed=2)
        before = await bkc.ledger_manager.read_ledger_metadata(doomed.ledger_id)
        await cluster.kill(cluster.bookies[0])
        await cluster.kill(cluster.bookies[1])
        summary = await BookieRecovery(bkc).recover(ids[0])
        assert not summary.ok
        (failed,) = summary.failed
        assert failed.ledger_id == doomed.ledger_id and "no replica could be read" in failed.error
        assert await bkc.ledger_manager.read_ledger_metadata(doomed.ledger_id) == before
        assert summary.by_status("recovered") == [fine.ledger_id]
        await check_recovered(bkc, fine.ledger_id, data, ids[0], last_entry_id=9)


@run_async
async def test_a_share_that_cannot_be_copied_does_not_keep_the_ledgers_other_shares_from_being_copied():
    """The lost bookie is in both segments of a ledger; one entry of its share in the first has no
    readable copy left. Before, that copy's failure ended the whole ledger's repair, so the second
    segment kept naming the lost bookie (a worker retried the same first share forever); as
    BookKeeper's ReplicationWorker goes on to the next fragment, the second share is now copied and
    only the first is left, with its error."""
    async with FakeCluster(5) as cluster, BookKeeper(cluster.metadata_uri, add_timeout_s=2, read_timeout_s=2) as bkc:
        lh, data, victim = await two_segment_ledger(cluster, bkc, 60, 7)
        md = lh.metadata
        # one entry of the victim's share in segment 0: its other copy corrupt, so nothing can give it
        def write_set(e):
            ensemble = md.ensemble_for(e)
            return [ensemble[(e + i) % md.ensemble_size] for i in range(md.write_quorum_size)]
        second = md.segments[1][0]
        entry = next(e for e in range(second) if victim in write_set(e))
        (other,) = [b for b in write_set(entry) if b != victim]
        cluster.by_id(other).corrupt(lh.ledger_id, entry)
        await cluster.kill(cluster.by_id(victim))
        summary = await BookieRecovery(bkc).recover(victim, ledger_id=lh.ledger_id)
        new = await bkc.get_ledger_metadata(lh.ledger_id)
        assert victim in new.segments[0][1] and victim not in new.segments[1][1]  # before: in both
        (failed,) = summary.failed
        assert "segment at entry 0" in failed.error and "no replica could be read" in failed.error
        assert failed.outcome.left == [(0, victim)] and len(failed.outcome.segments) == 1


@run_async
async def test_corrupt_replica_is_skipped_and_a_refusing_target_fails_the_segment():
    async with FakeCluster(5) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        ids = [x.bookie_id for x in cluster.bookies]
        lh, data = await write_ledger(bkc, 12, e=3, wq=3, aq=2, ensemble=ids[:3])
        for entry_id in range(12):
            cluster.bookies[1].corrupt(lh.ledger_id, entry_id)  # only ids[2] has good copies
        await cluster.kill(cluster.bookies[0])
        replicator = LedgerReplicator(bkc, window_entries=4)
        md, _ = await bkc.ledger_manager.read_ledger_metadata(lh.ledger_id)
        cluster.bookies[3].add_hook = lambda req: int(StatusCode.EUA)
        with pytest.raises(ReplicationError, match="did not store it"):
            await replicator.replicate_segment(lh.ledger_id, md, 0, ids[0], ids[3], {ids[0]})
        assert ids[0] in (await bkc.get_ledger_metadata(lh.ledger_id)).bookies()
        result = await replicator.replicate_segment(lh.ledger_id, md, 0, ids[0], ids[4], {ids[0]})
        assert result.replaced and result.entries == 12
        stored = cluster.bookies[4].ledger_entries(lh.ledger_id)
        digest = DigestManager(lh.ledger_id, DigestType.CRC32C, b"pw")
        assert [bytes(digest.verify_entry(e, stored[e])[2]) for e in range(12)] == data


@run_async
async def test_seed_89_every_replica_with_holes_is_still_a_source():
    # Chaos seed 89: with AQ < WQ every bookie of a segment may lack some entries while each
    # entry has a copy somewhere. The auditor marks all of them; the worker passed them all as
    # `lost`, the replicator read only from replicas outside `lost`, found none, and the marker
    # stayed. Each hole must be filled from whichever bookie has the entry, the lost one included.
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        ids = [x.bookie_id for x in cluster.bookies]
        lh, data = await write_ledger(bkc, 10, e=2, wq=2, aq=1, ensemble=ids[:2])
        for entry_id in range(10):  # ids[0] lacks the even entries, ids[1] the odd ones
            del cluster.bookies[entry_id % 2].entries[(lh.ledger_id, entry_id)]
        md, _ = await bkc.ledger_manager.read_ledger_metadata(lh.ledger_id)
        replicator = LedgerReplicator(bkc, window_entries=3)
        result = await replicator.replicate_segment(lh.ledger_id, md, 0, ids[0], ids[2], {ids[0], ids[1]})
        assert result.replaced and result.entries == 10
        stored = cluster.bookies[2].ledger_entries(lh.ledger_id)
        digest = DigestManager(lh.ledger_id, DigestType.CRC32C, b"pw")
        assert [bytes(digest.verify_entry(e, stored[e])[2]) for e in range(10)] == data


@run_async
async def test_a_segment_replaced_meanwhile_is_not_replaced_twice():
    async with FakeCluster(5) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        ids = [x.bookie_id for x in cluster.bookies]
        lh, _ = await write_ledger(bkc, 6, ensemble=ids[:3])
        md, _ = await bkc.ledger_manager.read_ledger_metadata(lh.ledger_id)
        replicator = LedgerReplicator(bkc)
        first = await replicator.replicate_segment(lh.ledger_id, md, 0, ids[0], ids[3])
        second = await replicator.replicate_segment(lh.ledger_id, md, 0, ids[0], ids[4])  # stale metadata
        assert first.replaced and not second.replaced
        assert (await bkc.get_ledger_metadata(lh.ledger_id)).segments[0][1] == (ids[3], ids[1], ids[2])


@run_async
async def test_target_checks_and_cookie_deletion():
    async with FakeCluster(4) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        ids = [x.bookie_id for x in cluster.bookies]
        await write_ledger(bkc, 5, ensemble=ids[:3])
        from bk.meta.cookie import Cookie, CookieStore
        await CookieStore(bkc.store).write(ids[0], Cookie(ids[0], ("/j",), ("/l",)))
        recovery = BookieRecovery(bkc)
        with pytest.raises(Exception, match="is the bookie being recovered"):
            await recovery.recover(ids[0], target=ids[0])
        with pytest.raises(Exception, match="not a registered writable bookie"):
            await recovery.recover(ids[0], target="127.0.0.1:1")
        summary = await recovery.recover(ids[0], delete_cookie=True)
        assert "registered" in summary.cookie_note and not summary.cookie_deleted  # still running
        await cluster.kill(cluster.bookies[0])
        summary = await recovery.recover(ids[0], delete_cookie=True)
        assert summary.ok and summary.cookie_deleted
        assert await bkc.registration.known_bookies() == []


@run_async
async def test_rate_limited_copy_still_copies_everything():
    async with FakeCluster(4) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        ids = [x.bookie_id for x in cluster.bookies]
        lh, data = await write_ledger(bkc, 40, ensemble=ids[:3])
        await cluster.kill(cluster.bookies[0])
        summary = await BookieRecovery(bkc, rate_bytes_per_s=50_000, window_entries=3).recover(ids[0])
        assert summary.ok
        await check_recovered(bkc, lh.ledger_id, data, ids[0], last_entry_id=39)


# ---------------------------------------------------------------------- checker
@run_async
async def test_checker_names_bookies_that_lost_entries_and_ignores_unreachable_ones():
    async with FakeCluster(4) as cluster, BookKeeper(cluster.metadata_uri, read_timeout_s=2) as bkc:
        ids = [x.bookie_id for x in cluster.bookies]
        lh, _ = await write_ledger(bkc, 20, ensemble=ids[:3])
        md = await bkc.get_ledger_metadata(lh.ledger_id)
        checker = LedgerChecker(bkc.pool)
        result = await checker.check(lh.ledger_id, md)
        assert not result.missing and not result.unknown and result.reads == 6
        # bookie 1 loses its last entry, bookie 2 gets a corrupt first one, bookie 0 is down
        last_on_1 = max(e for e in range(20) if 1 in ((e % 3), (e + 1) % 3))
        del cluster.bookies[1].entries[(lh.ledger_id, last_on_1)]
        first_on_2 = min(e for e in range(20) if 2 in ((e % 3), (e + 1) % 3))
        cluster.bookies[2].corrupt(lh.ledger_id, first_on_2)
        await cluster.bookies[0].stop()
        result = await checker.check(lh.ledger_id, md)
        assert result.missing == {ids[1], ids[2]} and result.unknown == {ids[0]}
        assert (await checker.check(lh.ledger_id, md, bookies=[ids[1]])).missing == {ids[1]}
        # the open end of an open ledger is never probed
        open_lh, _ = await write_ledger(bkc, 5, close=False, ensemble=ids[1:4])
        open_md = await bkc.get_ledger_metadata(open_lh.ledger_id)
        assert (await checker.check(open_lh.ledger_id, open_md)).reads == 0
