"""Speculative and sticky reads against fake bookies (bk/client/speculative.py, read_ops.py,
read_handle.py): a slow replica is a FakeBookie whose answers are held (`hold`) or gated
(`gate_reads`); read timeouts are made huge so that only speculation can get past it."""
from __future__ import annotations

import asyncio
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from test_client_read import first_replica, written  # noqa: E402
from test_client_support import FakeCluster, run_async, until  # noqa: E402

from bk.client import BookKeeper  # noqa: E402
from bk.client.read_ops import ReadEntryOp  # noqa: E402
from bk.client.speculative import SPECULATIVE_READ_COUNT, SpeculativePolicy  # noqa: E402
from bk.errors import IncorrectParameterError, NoSuchEntryError  # noqa: E402
from bk.proto import StatusCode  # noqa: E402

HUGE_S = 600.0  # a read timeout no test waits for: only a speculative read gets past a slow bookie
FAST = dict(read_timeout_s=HUGE_S, speculative_read_timeout_ms=20)


def reads_of(bookie, kinds=("read", "batch")) -> list:
    return [(op, e) for op, _, e in bookie.requests if op in kinds]


def test_policy_backs_off_from_first_to_max_and_defaults_are_bookkeepers():
    p = SpeculativePolicy.build("speculative read", 100, 1000, 2.0)
    delays, d = [], p.first_s
    for _ in range(6):
        delays.append(d)
        d = p.next_s(d)
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert SpeculativePolicy.build("x", 0, 5000, 2.0) is None  # 0 turns it off
    for bad in [(-1, 10, 2.0), (10, -5, 2.0), (10, 10, 0), (10, 10, -1.5), ("10", 10, 2.0), (True, 10, 2.0)]:
        with pytest.raises(IncorrectParameterError):
            SpeculativePolicy.build("speculative read", *bad)
    bkc = BookKeeper("mem://spec-defaults/ledgers")
    assert (bkc.speculative_read_policy.first_s, bkc.speculative_read_policy.max_s) == (2.0, 2.0)
    assert bkc.speculative_read_policy.multiplier == 2.0
    lac = bkc.speculative_read_lac_policy
    assert (lac.first_s, lac.max_s, lac.multiplier) == (1.5, 5.0, 2.0)
    assert not bkc.sticky_reads_enabled
    assert BookKeeper("mem://x/ledgers", speculative_read_timeout_ms=0).speculative_read_policy is None
    custom = BookKeeper("mem://x/ledgers", speculative_read_timeout_ms=300, max_speculative_read_timeout_ms=900)
    assert (custom.speculative_read_policy.first_s, custom.speculative_read_policy.max_s) == (0.3, 0.9)
    with pytest.raises(IncorrectParameterError, match="multiplier"):
        BookKeeper("mem://x/ledgers", speculative_read_timeout_backoff_multiplier=0)


def test_the_bookies_own_client_takes_the_read_settings_from_its_configuration():
    from bk.config import load_config

    cfg = load_config(env={}, overrides=dict(speculative_read_timeout_ms=250, sticky_reads_enabled=True,
                                             first_speculative_read_lac_timeout_ms=0,
                                             explicit_lac_interval_ms=40))
    bkc = BookKeeper.for_bookie(cfg)
    assert bkc.explicit_lac_interval_ms == 40
    assert (bkc.speculative_read_policy.first_s, bkc.speculative_read_policy.max_s) == (0.25, 0.25)
    assert bkc.speculative_read_lac_policy is None and bkc.sticky_reads_enabled


@run_async
async def test_an_unanswered_read_is_also_sent_to_the_next_replica_and_the_first_answer_wins():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri, **FAST) as bkc:
        lh = await written(cluster, bkc, 12, e=3, wq=3, aq=3)
        rh = await bkc.open_ledger(lh.ledger_id, password=b"pw")
        slow, second, third = first_replica(cluster, lh, 4)
        release = slow.gate_reads(lambda req: req.entry_id == 4)
        for b in cluster.bookies:
            b.requests.clear()
        before = SPECULATIVE_READ_COUNT.value
        assert (await rh.read_entry(4)).data == b"entry-4"
        assert SPECULATIVE_READ_COUNT.value == before + 1
        assert reads_of(slow) == [("read", 4)] and reads_of(second) == [("read", 4)] and not reads_of(third)
        # The slow bookie's late answer is dropped; the connection and later reads are unharmed.
        release.set()
        await until(lambda: not slow._later, "the late answer sent")
        assert [e.data for e in await rh.read_entries(0, 11)] == [b"entry-%d" % i for i in range(12)]
        assert not bkc.pool.suspect(slow.bookie_id)  # nothing timed out: speculation did not wait for it


@run_async
async def test_without_speculation_the_read_waits_for_the_slow_bookies_timeout():
    async with FakeCluster(3) as cluster, \
            BookKeeper(cluster.metadata_uri, read_timeout_s=0.3, speculative_read_timeout_ms=0) as bkc:
        lh = await written(cluster, bkc, 8, e=3, wq=3, aq=3)
        slow, second, _ = first_replica(cluster, lh, 2)
        slow.gate_reads(lambda req: req.entry_id == 2)
        before = SPECULATIVE_READ_COUNT.value
        assert (await lh.read_entry(2)).data == b"entry-2"
        assert SPECULATIVE_READ_COUNT.value == before
        assert bkc.pool.suspect(slow.bookie_id)  # the answer came only after its read timed out


@run_async
async def test_speculation_never_turns_a_missing_answer_into_no_such_entry():
    """Two replicas say ENOENTRY while the first is slow: the outcome waits for the slow one,
    which has the entry (REPLICATION.md: never answer no-such-entry when it may be lost)."""
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri, **FAST) as bkc:
        lh = await written(cluster, bkc, 6, e=3, wq=3, aq=3)
        slow, b2, b3 = first_replica(cluster, lh, 3)
        del b2.entries[(lh.ledger_id, 3)], b3.entries[(lh.ledger_id, 3)]
        release = slow.gate_reads(lambda req: req.entry_id == 3)
        outcome = asyncio.get_running_loop().create_future()
        op = ReadEntryOp(bkc.pool, lh._digest, 3, [slow.bookie_id, b2.bookie_id, b3.bookie_id],
                         lambda eid, entry, err: outcome.set_result((entry, err)),
                         speculative=bkc.speculative_read_policy, heard=set()).start()
        await until(lambda: op._negatives == 2, "both negatives in")
        assert not outcome.done() and op._outstanding == 1
        release.set()
        entry, err = await outcome
        assert err is None and entry.data == b"entry-3"
        # With every replica answering ENOENTRY, it is NoSuchEntry, speculation or not.
        del slow.entries[(lh.ledger_id, 3)]
        with pytest.raises(NoSuchEntryError):
            await lh.read_entry(3)


@run_async
async def test_a_failed_answer_waits_for_the_speculative_request_still_out():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri, **FAST) as bkc:
        lh = await written(cluster, bkc, 6, e=3, wq=3, aq=3)
        slow, failing, third = first_replica(cluster, lh, 1)
        release = slow.gate_reads(lambda req: req.entry_id == 1)
        failing.read_hook = lambda req: int(StatusCode.EIO)
        third.read_hook = lambda req: int(StatusCode.EIO)
        outcome = asyncio.get_running_loop().create_future()
        policy = SpeculativePolicy.build("speculative read", 20, 20, 2.0)
        op = ReadEntryOp(bkc.pool, lh._digest, 1, [slow.bookie_id, failing.bookie_id, third.bookie_id],
                         lambda eid, entry, err: outcome.set_result((entry, err)), speculative=policy,
                         heard=set()).start()
        await until(lambda: op._next == 3 and op._outstanding == 1, "every replica asked, the slow one out")
        assert not outcome.done()
        release.set()
        entry, err = await outcome
        assert err is None and entry.data == b"entry-1"


@run_async
async def test_no_speculation_while_an_asked_bookie_answers_the_same_operation():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri, **FAST) as bkc:
        lh = await written(cluster, bkc, 6, e=3, wq=3, aq=3)
        slow, second, _ = first_replica(cluster, lh, 5)
        release = slow.gate_reads(lambda req: req.entry_id == 5)
        for b in cluster.bookies:
            b.requests.clear()
        outcome = asyncio.get_running_loop().create_future()
        before = SPECULATIVE_READ_COUNT.value
        op = ReadEntryOp(bkc.pool, lh._digest, 5, [slow.bookie_id, second.bookie_id],
                         lambda eid, entry, err: outcome.set_result((entry, err)),
                         speculative=bkc.speculative_read_policy, heard={slow.bookie_id}).start()
        await until(lambda: op._timer is None, "the speculative timer ran")
        assert SPECULATIVE_READ_COUNT.value == before and not reads_of(second) and not outcome.done()
        release.set()
        assert (await outcome)[0].data == b"entry-5"


@run_async
async def test_a_slow_batch_is_also_sent_to_the_next_replica():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri, batch_read_entries=10, **FAST) as bkc:
        lh = await written(cluster, bkc, 10, e=3, wq=3, aq=3)
        rh = await bkc.open_ledger(lh.ledger_id, password=b"pw")
        slow, second, third = first_replica(cluster, lh, 0)  # the batch of 0..9 asks ensemble[0] first
        slow.hold()
        for b in cluster.bookies:
            b.requests.clear()
        before = SPECULATIVE_READ_COUNT.value
        assert [e.data for e in await rh.read_entries(0, 9)] == [b"entry-%d" % i for i in range(10)]
        assert SPECULATIVE_READ_COUNT.value == before + 1
        assert reads_of(slow) == [("batch", 0)] and reads_of(second) == [("batch", 0)] and not reads_of(third)
        assert slow.release() == 1  # the late batch answer is dropped
        assert [e.data for e in await rh.read_entries(3, 7)] == [b"entry-%d" % i for i in range(3, 8)]


@pytest.mark.parametrize("batch", [0, 10])
@run_async
async def test_sticky_reads_use_one_bookie_per_handle_and_move_on_error(batch):
    async with FakeCluster(3) as cluster, \
            BookKeeper(cluster.metadata_uri, sticky_reads_enabled=True, batch_read_entries=batch) as bkc:
        lh = await written(cluster, bkc, 40, e=3, wq=3, aq=3)
        rh = await bkc.open_ledger(lh.ledger_id, password=b"pw")
        for b in cluster.bookies:
            b.requests.clear()
        for first in range(0, 40, 7):
            await rh.read_entries(first, min(first + 6, 39))
        asked = [b for b in cluster.bookies if reads_of(b)]
        assert len(asked) == 1
        sticky = asked[0]
        sticky.read_hook = lambda req: int(StatusCode.EIO)
        assert [e.data for e in await rh.read_entries(0, 39)] == [b"entry-%d" % i for i in range(40)]
        for b in cluster.bookies:
            b.requests.clear()
        for first in range(0, 40, 7):
            await rh.read_entries(first, min(first + 6, 39))
        now = [b for b in cluster.bookies if reads_of(b)]
        assert len(now) == 1 and now[0] is not sticky


@run_async
async def test_sticky_reads_need_every_bookie_to_hold_every_entry():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri, sticky_reads_enabled=True) as bkc:
        lh = await written(cluster, bkc, 30, e=3, wq=2, aq=2)
        rh = await bkc.open_ledger(lh.ledger_id, password=b"pw")
        for b in cluster.bookies:
            b.requests.clear()
        assert len(await rh.read_entries(0, 29)) == 30
        assert all(reads_of(b) for b in cluster.bookies)  # striped: write sets decide


@run_async
async def test_every_slow_read_of_a_range_is_speculated_once_and_then_again_with_backoff():
    async with FakeCluster(3) as cluster, \
            BookKeeper(cluster.metadata_uri, batch_read_entries=0, read_timeout_s=HUGE_S,
                       speculative_read_timeout_ms=20, max_speculative_read_timeout_ms=80) as bkc:
        lh = await written(cluster, bkc, 30, e=3, wq=3, aq=3)
        rh = await bkc.open_ledger(lh.ledger_id, password=b"pw")
        slow = first_replica(cluster, lh, 0)[0]  # first replica of 0, 3, 6, ..., 27
        release = slow.gate_reads(lambda req: True)
        before = SPECULATIVE_READ_COUNT.value
        assert [e.data for e in await rh.read_entries(0, 29)] == [b"entry-%d" % i for i in range(30)]
        assert SPECULATIVE_READ_COUNT.value == before + 10
        release.set()
        await until(lambda: not slow._later, "the late answers sent")
        # Both first replicas of entry 4 slow: after the first look, the op's own timer asks the third.
        a, b, c = first_replica(cluster, lh, 4)
        a.gate_reads(lambda req: req.entry_id == 4)
        b.gate_reads(lambda req: req.entry_id == 4)
        for x in cluster.bookies:
            x.requests.clear()
        before = SPECULATIVE_READ_COUNT.value
        assert (await rh.read_entry(4)).data == b"entry-4"
        assert SPECULATIVE_READ_COUNT.value == before + 2
        assert [reads_of(x) for x in (a, b, c)] == [[("read", 4)]] * 3
