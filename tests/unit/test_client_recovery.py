"""Ledger recovery (open_ledger(recovery=True)) against fake bookies: REPLICATION.md steps 1-5
and invariants 1-4 after each scenario."""
from __future__ import annotations

import asyncio
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from test_client_support import DROP, FakeCluster, run_async, until  # noqa: E402

from bk.client import BookKeeper  # noqa: E402
from bk.errors import LedgerFencedError, LedgerRecoveryError, UnauthorizedAccessError  # noqa: E402
from bk.meta.ledger_manager import LedgerManager  # noqa: E402
from bk.meta.ledger_metadata import LedgerState  # noqa: E402
from bk.proto import FLAG_RECOVERY_ADD, DigestManager, StatusCode, master_key  # noqa: E402

ENOENTRY = int(StatusCode.ENOENTRY)


def plant(bookie, ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes,
          password: bytes = b"pw") -> None:
    """Store an entry on one fake bookie as if a writer had sent it there only."""
    bookie.keys.setdefault(ledger_id, master_key(password))
    bookie.entries[(ledger_id, entry_id)] = DigestManager(ledger_id, "CRC32C", password).frame_entry(
        entry_id, lac, length, payload)


async def dead_writer(cluster, bkc, n: int, e=3, wq=3, aq=2):
    """A ledger whose writer wrote entries 0..n-1 one at a time (LAC piggybacked) and then died."""
    lh = await bkc.create_ledger(e, wq, aq, password=b"pw")
    for i in range(n):
        await lh.add_entry(b"entry-%d" % i)
    return lh


async def check_closed(bkc, ledger_id: int, expected: list[bytes]):
    md = (await LedgerManager(bkc.store).read_ledger_metadata(ledger_id))[0]
    assert md.state is LedgerState.CLOSED and md.last_entry_id == len(expected) - 1
    assert md.length == sum(map(len, expected))
    firsts = [f for f, _ in md.segments]
    assert firsts[0] == 0 and all(a < b for a, b in zip(firsts, firsts[1:]))
    assert all(len(set(ens)) == md.ensemble_size == len(ens) for _, ens in md.segments)
    if expected:
        rh = await bkc.open_ledger(ledger_id, password=b"pw")
        assert [x.data for x in await rh.read_entries(0, len(expected) - 1)] == expected
    return md


@run_async
async def test_recovery_closes_at_the_writers_lac_and_fences_the_writer():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as writer, \
            BookKeeper(cluster.metadata_uri) as recoverer:
        lh = await dead_writer(cluster, writer, 12)
        rh = await recoverer.open_ledger(lh.ledger_id, password=b"pw", recovery=True)
        assert rh.is_closed and rh.last_add_confirmed == 11
        expected = [b"entry-%d" % i for i in range(12)]
        await check_closed(recoverer, lh.ledger_id, expected)
        assert all(lh.ledger_id in b.fenced for b in cluster.bookies)
        with pytest.raises(LedgerFencedError):
            await lh.add_entry(b"too late")
        await lh.close()  # recovery closed it exactly at this writer's LAC: they agree
        # Opening again with recovery is a plain open of a closed ledger.
        assert (await recoverer.open_ledger(lh.ledger_id, password=b"pw", recovery=True)).last_add_confirmed == 11


@run_async
async def test_unacknowledged_entries_on_some_bookies_are_recovered_and_written_back():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await dead_writer(cluster, bkc, 10)
        x, y, z = (cluster.by_id(b) for b in lh.ensemble)
        length = lh.length
        extra = []
        for i in range(10, 15):  # the writer sent these to two bookies and died before any ack
            payload = b"entry-%d" % i
            length += len(payload)
            extra.append(payload)
            for b in (x, y):
                plant(b, lh.ledger_id, i, 9, length, payload)
        await bkc.open_ledger(lh.ledger_id, password=b"pw", recovery=True)
        expected = [b"entry-%d" % i for i in range(10)] + extra
        await check_closed(bkc, lh.ledger_id, expected)
        # Written back to the third replica, stamped with the LAC recovery started from.
        dm = DigestManager(lh.ledger_id, "CRC32C", b"pw")
        for i in range(10, 15):
            lac, _, payload = dm.verify_entry(i, z.entries[(lh.ledger_id, i)])
            assert bytes(payload) == b"entry-%d" % i and lac == 9
        assert ("fence", lh.ledger_id, 15) in z.requests or ("fence", lh.ledger_id, 15) in x.requests


@run_async
async def test_fencing_needs_coverage_and_a_failed_recovery_leaves_the_ledger_in_recovery():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await dead_writer(cluster, bkc, 5)
        broken = [cluster.by_id(b) for b in lh.ensemble[:2]]
        for b in broken:
            b.read_hook = lambda req: int(StatusCode.EIO)
        with pytest.raises(LedgerRecoveryError, match="cannot fence"):
            await bkc.open_ledger(lh.ledger_id, password=b"pw", recovery=True)
        md = (await LedgerManager(cluster.store).read_ledger_metadata(lh.ledger_id))[0]
        assert md.state is LedgerState.IN_RECOVERY
        with pytest.raises(LedgerFencedError):  # the writer cannot close an IN_RECOVERY ledger
            await lh.close()
        for b in broken:
            b.read_hook = None
        await bkc.open_ledger(lh.ledger_id, password=b"pw", recovery=True)
        await check_closed(bkc, lh.ledger_id, [b"entry-%d" % i for i in range(5)])


@run_async
async def test_an_entry_with_neither_a_valid_copy_nor_enough_negatives_fails_recovery():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await dead_writer(cluster, bkc, 5)
        x, y, z = (cluster.by_id(b) for b in lh.ensemble)
        plant(x, lh.ledger_id, 5, 4, lh.length + 7, b"entry-5")
        x.corrupt(lh.ledger_id, 5)
        y.read_hook = lambda req: int(StatusCode.EIO) if req.entry_id == 5 else None
        with pytest.raises(LedgerRecoveryError, match="entry 5: recovery cannot tell whether the entry exists"):
            await bkc.open_ledger(lh.ledger_id, password=b"pw", recovery=True)
        md = (await LedgerManager(cluster.store).read_ledger_metadata(lh.ledger_id))[0]
        assert md.state is LedgerState.IN_RECOVERY


@run_async
async def test_empty_last_segment_closes_before_it_with_the_right_length():
    async with FakeCluster(4) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await dead_writer(cluster, bkc, 6)
        spare = next(b.bookie_id for b in cluster.bookies if b.bookie_id not in lh.ensemble)
        await LedgerManager(cluster.store).update_ledger_metadata(
            lh.ledger_id, lambda md: md.with_ensemble_change(6, [spare] + list(lh.ensemble[1:])))
        # The new segment's bookies answer the fence with entry 5 (LAC 4): recovery starts at 6
        # (the segment's start), finds nothing and closes at 5 with entry 5's length.
        rh = await bkc.open_ledger(lh.ledger_id, password=b"pw", recovery=True)
        assert rh.last_add_confirmed == 5
        md = await check_closed(bkc, lh.ledger_id, [b"entry-%d" % i for i in range(6)])
        assert [f for f, _ in md.segments] == [0, 6]


@run_async
async def test_write_back_to_a_dead_bookie_changes_the_ensemble_only_in_the_final_cas():
    """AQ = WQ: without the dead bookie no entry reaches its ack quorum, so the write-back must
    replace it - and that change is written only with the final CAS."""
    async with FakeCluster(4) as cluster, BookKeeper(cluster.metadata_uri, connect_timeout_s=2) as bkc:
        lh = await dead_writer(cluster, bkc, 10, aq=3)
        x, y, z = (cluster.by_id(b) for b in lh.ensemble)
        length = lh.length
        for i in range(10, 13):
            length += len(b"entry-%d" % i)
            for b in (x, y):
                plant(b, lh.ledger_id, i, 9, length, b"entry-%d" % i)
        await cluster.kill(z)
        lm = LedgerManager(cluster.store)
        seen = []
        real = lm.write_ledger_metadata

        async def spy(ledger_id, metadata, version):
            seen.append(metadata.state)
            return await real(ledger_id, metadata, version)

        bkc.ledger_manager.write_ledger_metadata = spy
        await bkc.open_ledger(lh.ledger_id, password=b"pw", recovery=True)
        assert seen == [LedgerState.IN_RECOVERY, LedgerState.CLOSED]  # no CAS for the ensemble change
        md = await check_closed(bkc, lh.ledger_id, [b"entry-%d" % i for i in range(13)])
        assert len(md.segments) == 2 and z.bookie_id not in md.segments[1][1]
        assert md.segments[1][0] <= 10


@run_async
async def test_write_back_with_a_dead_bookie_and_no_spare_keeps_it_in_the_ensemble():
    """E=3 WQ=3 AQ=2 on three bookies, one dead: every write set still has AQ bookies up, so the
    write-back completes on the other two (delayed ensemble change) and the closed ledger names
    the dead bookie (no replacement exists; re-replication fixes the copies later)."""
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri, connect_timeout_s=2) as bkc:
        lh = await dead_writer(cluster, bkc, 10)
        x, y, z = (cluster.by_id(b) for b in lh.ensemble)
        length = lh.length
        for i in range(10, 13):  # sent to x and y only, never acknowledged
            length += len(b"entry-%d" % i)
            for b in (x, y):
                plant(b, lh.ledger_id, i, 9, length, b"entry-%d" % i)
        await cluster.kill(z)
        rh = await bkc.open_ledger(lh.ledger_id, password=b"pw", recovery=True)
        assert rh.last_add_confirmed == 12
        md = await check_closed(bkc, lh.ledger_id, [b"entry-%d" % i for i in range(13)])
        assert md.segments == ((0, lh.ensemble),)
        assert ("add", lh.ledger_id, 12) in x.requests and ("add", lh.ledger_id, 12) in y.requests


@run_async
async def test_concurrent_recoverers_agree():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as writer:
        lh = await dead_writer(cluster, writer, 8)
        x, y, _ = (cluster.by_id(b) for b in lh.ensemble)
        plant(x, lh.ledger_id, 8, 7, lh.length + 7, b"entry-8")
        plant(y, lh.ledger_id, 8, 7, lh.length + 7, b"entry-8")
        clients = [await BookKeeper.connect(cluster.metadata_uri) for _ in range(3)]
        try:
            handles = await asyncio.gather(*(c.open_ledger(lh.ledger_id, password=b"pw", recovery=True)
                                             for c in clients), return_exceptions=True)
            assert not [h for h in handles if isinstance(h, BaseException)], handles
            assert {h.last_add_confirmed for h in handles} == {8}
            await check_closed(writer, lh.ledger_id, [b"entry-%d" % i for i in range(9)])
        finally:
            for c in clients:
                await c.close()


@run_async
async def test_recovery_with_a_wrong_password_touches_nothing():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await dead_writer(cluster, bkc, 3)
        with pytest.raises(UnauthorizedAccessError):
            await bkc.open_ledger(lh.ledger_id, password=b"nope", recovery=True)
        assert not any(b.fenced for b in cluster.bookies)
        assert (await LedgerManager(cluster.store).read_ledger_metadata(lh.ledger_id))[0].state is LedgerState.OPEN


@run_async
async def test_recovery_adds_carry_the_recovery_flag():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await dead_writer(cluster, bkc, 4)
        x, y, z = (cluster.by_id(b) for b in lh.ensemble)
        plant(x, lh.ledger_id, 4, 3, lh.length + 7, b"entry-4")
        plant(y, lh.ledger_id, 4, 3, lh.length + 7, b"entry-4")
        flags = []
        z.add_hook = lambda req: flags.append(req.flags)
        await bkc.open_ledger(lh.ledger_id, password=b"pw", recovery=True)
        assert flags and all(f & FLAG_RECOVERY_ADD for f in flags)
        assert (lh.ledger_id, 4) in z.entries  # accepted although z is fenced


@run_async
async def test_lost_fence_the_writers_late_add_is_never_acknowledged():
    """TESTING.md scenario 2: one bookie never gets the fence; the writer's next add reaches it."""
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as writer, \
            BookKeeper(cluster.metadata_uri) as recoverer:
        lh = await dead_writer(cluster, writer, 5)  # E=3 WQ=3 AQ=2: fencing needs 2 of 3
        z = cluster.by_id(lh.ensemble[2])
        z.read_hook = lambda req: DROP  # the fence (and every recovery read) never reaches z
        rh = await recoverer.open_ledger(lh.ledger_id, password=b"pw", recovery=True)
        assert rh.last_add_confirmed == 4 and lh.ledger_id not in z.fenced
        with pytest.raises(LedgerFencedError):
            await lh.add_entry(b"late")
        assert (lh.ledger_id, 5) in z.entries  # z stored it, but one copy is no ack quorum
        assert lh.last_add_confirmed == 4
        await check_closed(recoverer, lh.ledger_id, [b"entry-%d" % i for i in range(5)])


# ---------------------------------------------------------------- BP-46: unknown answers (limbo, timeouts)
def forget(bookie, ledger_id: int, first: int) -> None:
    """The bookie lost entries `first..` (a crash without the journal)."""
    for key in [k for k in bookie.entries if k[0] == ledger_id and k[1] >= first]:
        del bookie.entries[key]


async def assert_not_closed(cluster, ledger_id: int) -> None:
    md = (await LedgerManager(cluster.store).read_ledger_metadata(ledger_id))[0]
    assert md.state is LedgerState.IN_RECOVERY and md.last_entry_id == -1


@run_async
async def test_limbo_and_a_silent_bookie_fail_recovery_plainly_and_a_retry_after_repair_succeeds():
    """x lost its tail and is in limbo, z never answers (its read times out), y has no entry 10:
    entry 10 can be decided neither way. The error names each bookie's answer and says what limbo
    means; the ledger is not closed; once x is repaired (it has entry 10 back) recovery succeeds."""
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri, read_timeout_s=0.5) as bkc:
        lh = await dead_writer(cluster, bkc, 10)
        x, y, z = (cluster.by_id(b) for b in lh.ensemble)
        plant(x, lh.ledger_id, 10, 9, lh.length + 8, b"entry-10")
        saved = x.entries[(lh.ledger_id, 10)]
        forget(x, lh.ledger_id, 10)
        x.limbo(lh.ledger_id)
        z.read_hook = lambda req: DROP if req.entry_id == 10 else None
        with pytest.raises(LedgerRecoveryError) as caught:
            await bkc.open_ledger(lh.ledger_id, password=b"pw", recovery=True)
        err = caught.value
        assert err.entry_id == 10 and not err.data_loss
        assert set(err.unknown_bookies) == {x.bookie_id, z.bookie_id} and err.limbo_bookies == (x.bookie_id,)
        assert err.answers[y.bookie_id] == "ENOENTRY" and "did not answer" in err.answers[z.bookie_id]
        message = str(err)
        assert "in limbo there, they may have lost data in a crash while running without the journal" in message
        assert "not closed" in message and x.bookie_id in message and z.bookie_id in message
        await assert_not_closed(cluster, lh.ledger_id)
        x.entries[(lh.ledger_id, 10)] = saved  # repaired from a peer
        z.read_hook = None
        await bkc.open_ledger(lh.ledger_id, password=b"pw", recovery=True)
        await check_closed(bkc, lh.ledger_id, [b"entry-%d" % i for i in range(10)] + [b"entry-10"])


@run_async
async def test_every_replica_lost_the_tail_recovery_refuses_and_says_so():
    """All three bookies crashed without the journal and lost entries 6..: fencing is covered by
    limbo answers (no LAC), 0..5 are recovered, entry 6 has no copy and nobody can deny it."""
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await dead_writer(cluster, bkc, 10)
        for b in cluster.bookies:
            forget(b, lh.ledger_id, 6)
            b.limbo(lh.ledger_id)
        with pytest.raises(LedgerRecoveryError) as caught:
            await bkc.open_ledger(lh.ledger_id, password=b"pw", recovery=True)
        err = caught.value
        assert err.entry_id == 6 and len(err.limbo_bookies) == 3
        assert "it is lost on every replica" in str(err) and "never closed short" in str(err)
        await assert_not_closed(cluster, lh.ledger_id)


@run_async
async def test_an_entry_lost_everywhere_below_a_lac_read_ahead_is_reported_as_data_loss():
    """Entry 5 is gone from all three limbo bookies but 6..9 are not, and entry 6 carries LAC 5:
    entry 5 was acknowledged. (Entry 5's answers wait until 6..9 have been answered.)"""
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await dead_writer(cluster, bkc, 10)
        gates = []
        for b in cluster.bookies:
            del b.entries[(lh.ledger_id, 5)]
            b.limbo(lh.ledger_id)
            gates.append(b.gate_reads(lambda req: req.entry_id == 5))
        opening = asyncio.ensure_future(bkc.open_ledger(lh.ledger_id, password=b"pw", recovery=True))
        await until(lambda: all(("fence", lh.ledger_id, 9) in b.requests for b in cluster.bookies), "reads ahead")
        for gate in gates:
            gate.set()
        with pytest.raises(LedgerRecoveryError) as caught:
            await opening
        err = caught.value
        assert err.entry_id == 5 and err.data_loss
        assert "DATA LOSS of an acknowledged entry (LAC 8 was seen)" in str(err)
        await assert_not_closed(cluster, lh.ledger_id)


@run_async
async def test_negatives_below_a_lac_read_ahead_never_close_the_ledger_short():
    """Bookies that do not know they lost data deny entry 5 (and give no LAC when fenced), but entry 6
    carries LAC 5:
    closing at 4 would truncate an acknowledged entry, so recovery refuses."""
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        lh = await dead_writer(cluster, bkc, 10)
        gates = []
        for b in cluster.bookies:
            del b.entries[(lh.ledger_id, 5)]
            b.read_hook = lambda req: ENOENTRY if req.entry_id == -1 else None  # no LAC from the fence
            gates.append(b.gate_reads(lambda req: req.entry_id == 5))
        opening = asyncio.ensure_future(bkc.open_ledger(lh.ledger_id, password=b"pw", recovery=True))
        await until(lambda: all(("fence", lh.ledger_id, 9) in b.requests for b in cluster.bookies), "reads ahead")
        for gate in gates:
            gate.set()
        with pytest.raises(LedgerRecoveryError, match="never closed short") as caught:
            await opening
        assert caught.value.entry_id == 5 and caught.value.data_loss
        await assert_not_closed(cluster, lh.ledger_id)
