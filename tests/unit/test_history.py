"""bk.testing.history: recording adds and checking REPLICATION.md's invariants 1-5."""
import asyncio
import random
import threading
from types import SimpleNamespace
from typing import NamedTuple

import pytest

from bk.errors import (
    BookieIOError, LedgerClosedError, LedgerFencedError, UnauthorizedAccessError,
)
from bk.meta.ledger_metadata import LedgerMetadata, LedgerState
from bk.testing.history import (
    History, Outcome, assert_closed, check_ledger, entries_to_map,
)

L = 7
BOOKIES = ("b1:3181", "b2:3181", "b3:3181")


def meta(last=-1, state=LedgerState.CLOSED, segments=((0, BOOKIES),), length=0):
    return LedgerMetadata(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2, segments=segments,
                          state=state, last_entry_id=last, length=length)


def raw_meta(**fields):
    """Metadata that LedgerMetadata itself would refuse to build (for invariant 4)."""
    base = dict(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2, segments=((0, BOOKIES),),
                state=LedgerState.CLOSED, last_entry_id=-1, length=0)
    base.update(fields)
    return SimpleNamespace(**base)


def p(i) -> bytes:
    return b"payload-%d" % i


def acked_history(n, ledger_id=L) -> History:
    h = History()
    for i in range(n):
        h.ok(h.invoke(ledger_id, p(i)), i)
    return h


def reads(ids, payload=p):
    return {e: payload(e) for e in ids}


def kinds(result):
    return sorted({v.invariant for v in result.violations})


# ------------------------------------------------------------------ clean runs
def test_clean_history_passes_with_several_readers():
    h = acked_history(10)
    h.writer_closed(L, 9)
    h.recovered(L, 9, client="c2")
    r = check_ledger(h, L, meta(9), [reads(range(10)), reads(range(10))])
    assert r.ok and r.violations == []
    r.assert_ok()


def test_single_mapping_and_ledger_entry_values_are_accepted():
    class Entry(NamedTuple):
        entry_id: int
        data: bytes

    h = acked_history(3)
    entries = [Entry(e, p(e)) for e in range(3)]
    assert entries_to_map(entries) == reads(range(3))
    assert check_ledger(h, L, meta(2), {e.entry_id: e for e in entries}).ok


def test_other_ledgers_do_not_interfere():
    h = acked_history(3)
    h.ok(h.invoke(99, b"other"), 0)
    assert check_ledger(h, L, meta(2), reads(range(3))).ok
    r = check_ledger(h, 99, meta(0), {0: b"other"})
    assert r.ok


# ------------------------------------------------------------------ invariant 1
def test_lost_acknowledged_entry():
    h = acked_history(10)
    r = check_ledger(h, L, meta(9), [reads(range(10)), reads(set(range(10)) - {5})])
    assert 1 in kinds(r)
    lost = r.of(1)
    assert len(lost) == 1 and lost[0].entry_id == 5 and "reader 1" in lost[0].message
    with pytest.raises(AssertionError, match=r"invariant 1 .*ledger 7, entry 5"):
        r.assert_ok()


def test_acknowledged_entry_with_other_bytes():
    h = acked_history(4)
    got = reads(range(4))
    got[2] = b"corrupt"
    r = check_ledger(h, L, meta(3), got)
    assert [(v.invariant, v.entry_id) for v in r.violations] == [(1, 2)]


def test_two_adds_acknowledged_as_the_same_id():
    h = acked_history(3)
    h.ok(h.invoke(L, b"again"), 2)
    r = check_ledger(h, L, meta(2), reads(range(3)), check_order=False)
    assert any(v.invariant == 1 and "both acknowledged" in v.message for v in r.violations)


# ------------------------------------------------------------------ invariant 2
def test_truncated_close_is_caught():
    h = acked_history(10)
    r = check_ledger(h, L, meta(7), reads(range(8)))
    (trunc,) = r.of(2)
    assert trunc.entry_id == 9 and "[8, 9]" in trunc.message
    assert {v.entry_id for v in r.of(1)} == {8, 9}


def test_writer_close_must_equal_its_lac():
    h = acked_history(5)
    h.writer_closed(L, 4)
    assert check_ledger(h, L, meta(4), reads(range(5))).ok
    h2 = acked_history(5)
    u = h2.invoke(L, p(5))
    h2.unknown(u, "EFENCED")
    h2.writer_closed(L, 4)
    r = check_ledger(h2, L, meta(5), reads(range(6)))
    assert kinds(r) == [2] and "LAC 4" in r.violations[0].message


def test_writer_close_on_a_ledger_that_is_not_closed():
    h = acked_history(2)
    h.writer_closed(L, 1)
    r = check_ledger(h, L, meta(state=LedgerState.OPEN), reads(range(2)))
    assert kinds(r) == [2] and "OPEN" in r.violations[0].message


def test_recoverers_must_agree_and_not_truncate():
    h = acked_history(5)
    h.recovered(L, 4, "c1")
    h.recovered(L, 3, "c2")
    r = check_ledger(h, L, meta(4), reads(range(5)))
    assert kinds(r) == [2, 3]
    assert all("c2" in v.message for v in r.violations)


def test_closed_length_is_checked_on_request():
    h = acked_history(3)
    size = sum(len(p(i)) for i in range(3))
    assert check_ledger(h, L, meta(2, length=size), reads(range(3)), check_length=True).ok
    assert check_ledger(h, L, meta(2, length=1), reads(range(3))).ok  # off by default
    r = check_ledger(h, L, meta(2, length=1), reads(range(3)), check_length=True)
    assert kinds(r) == [2]


# ------------------------------------------------------------------ invariant 3
def test_invented_entry():
    h = acked_history(3)
    got = reads(range(3))
    got[3] = b"never sent"
    r = check_ledger(h, L, meta(3), got)
    (v,) = r.violations
    assert (v.invariant, v.entry_id) == (3, 3) and "invented" in v.message


def test_disagreeing_readers():
    h = History()
    for i in range(3):
        h.unknown(h.invoke(L, p(i)), "timeout")
    a, b = reads(range(3)), reads(range(3))
    b[1] = p(2)
    r = check_ledger(h, L, meta(2), [a, b])
    assert any(v.invariant == 3 and v.entry_id == 1 and "disagree" in v.message for v in r.violations)


def test_reader_missing_an_entry_others_read():
    h = History()
    for i in range(3):
        h.unknown(h.invoke(L, p(i)), "timeout")
    r = check_ledger(h, L, meta(2), [reads(range(3)), reads([0, 2])])
    assert [(v.invariant, v.entry_id) for v in r.violations] == [(3, 1)]


def test_hole_below_last_entry_id():
    h = acked_history(2)
    h.unknown(h.invoke(L, p(2)), "EFENCED")
    r = check_ledger(h, L, meta(2), reads(range(2)))
    assert [(v.invariant, v.entry_id) for v in r.violations] == [(3, 2)]
    assert check_ledger(h, L, meta(2), reads(range(2)), require_complete=False).ok


def test_unknown_outcomes_may_or_may_not_survive():
    h = acked_history(5)
    for i in (5, 6):
        h.unknown(h.invoke(L, p(i)), LedgerFencedError(ledger_id=L, entry_id=i))
    pending = h.invoke(L, p(7))  # never resolved: counts as unknown
    assert h.ops(L)[pending].outcome is Outcome.PENDING
    for last in (4, 5, 6, 7):
        assert check_ledger(h, L, meta(last), reads(range(last + 1))).ok, last
    # an unknown add that never got an id lets the next one take its id
    assert check_ledger(h, L, meta(5), {**reads(range(5)), 5: p(6)}).ok


def test_unknown_payload_must_respect_invocation_order():
    h = History()
    h.ok(h.invoke(L, p(0)), 0)
    u = h.invoke(L, b"unknown")
    h.ok(h.invoke(L, p(2)), 2)
    h.unknown(u, "timeout")
    assert check_ledger(h, L, meta(2), {0: p(0), 1: b"unknown", 2: p(2)}).ok
    got = {0: p(0), 2: p(2), 3: b"unknown"}
    r = check_ledger(h, L, meta(3), got, require_complete=False)
    (v,) = r.violations
    assert v.entry_id == 3 and "between entries 0 and 2" in v.message
    assert check_ledger(h, L, meta(3), got, require_complete=False, check_order=False).ok


def test_unknown_with_a_recorded_id_sits_only_there():
    h = acked_history(5)
    h.unknown(h.invoke(L, p(5)), "EFENCED", entry_id=5)
    h.unknown(h.invoke(L, p(6)), "EFENCED")
    assert check_ledger(h, L, meta(5), reads(range(6))).ok
    r = check_ledger(h, L, meta(6), {**reads(range(5)), 5: p(6), 6: p(5)})
    assert [v.entry_id for v in r.violations] == [6] and "recorded at entry 5" in r.violations[0].message


def test_unknown_payload_explains_one_entry_only():
    h = acked_history(2)
    h.unknown(h.invoke(L, b"dup"), "timeout")
    r = check_ledger(h, L, meta(3), {**reads(range(2)), 2: b"dup", 3: b"dup"})
    (v,) = r.violations
    assert v.entry_id == 3 and "already explains entry 2" in v.message


def test_equal_payloads_of_several_unknown_adds_are_interchangeable():
    h = acked_history(1)
    for _ in range(3):
        h.unknown(h.invoke(L, b"same"), "timeout")
    assert check_ledger(h, L, meta(3), {0: p(0), 1: b"same", 2: b"same", 3: b"same"}).ok


def test_failed_add_payload_must_never_appear():
    h = acked_history(2)
    h.fail(h.invoke(L, b"refused"), LedgerClosedError("closed"))
    r = check_ledger(h, L, meta(2), {**reads(range(2)), 2: b"refused"})
    (v,) = r.violations
    assert v.invariant == 3 and "failed before reaching a bookie" in v.message


def test_acknowledged_payload_duplicated_at_another_id():
    h = acked_history(2)
    r = check_ledger(h, L, meta(2), {**reads(range(2)), 2: p(0)})
    (v,) = r.violations
    assert v.entry_id == 2 and "duplicate of" in v.message


def test_acknowledged_ids_follow_invocation_order():
    h = History()
    a, b = h.invoke(L, p(0)), h.invoke(L, p(1))
    h.ok(b, 0)
    h.ok(a, 1)
    got = {0: p(1), 1: p(0)}
    r = check_ledger(h, L, meta(1), got)
    assert kinds(r) == [3] and "invocation order" in r.violations[0].message
    assert check_ledger(h, L, meta(1), got, check_order=False).ok


# ------------------------------------------------------------------ invariant 4
@pytest.mark.parametrize("segments, why", [
    (((0, BOOKIES), (5, BOOKIES), (5, BOOKIES)), "strictly increase"),
    (((0, BOOKIES), (6, BOOKIES), (4, BOOKIES)), "strictly increase"),
    (((0, ("b1", "b2", "b1")),), "distinct"),
    (((0, ("b1", "b2")),), "distinct"),
    (((1, BOOKIES),), "not 0"),
    ((), "no segments"),
])
def test_bad_segments(segments, why):
    h = acked_history(1)
    r = check_ledger(h, L, raw_meta(segments=segments, last_entry_id=0), reads([0]))
    assert kinds(r) == [4] and any(why in v.message for v in r.violations)


def test_good_multi_segment_metadata():
    segs = ((0, BOOKIES), (3, ("b4:1", "b2:3181", "b3:3181")), (6, ("b4:1", "b5:1", "b3:3181")))
    assert check_ledger(acked_history(6), L, meta(5, segments=segs), reads(range(6))).ok


def test_bad_quorum_sizes():
    r = check_ledger(acked_history(1), L, raw_meta(write_quorum_size=4, last_entry_id=0), reads([0]))
    assert kinds(r) == [4]


def test_reads_above_last_entry_id_or_negative():
    h = acked_history(3)
    r = check_ledger(h, L, meta(1), reads(range(3)))
    assert (4, 2) in [(v.invariant, v.entry_id) for v in r.violations]
    r = check_ledger(acked_history(2), L, meta(1), {**reads(range(2)), -1: b"x"})
    assert any(v.invariant == 4 and v.entry_id == -1 for v in r.violations)


def test_open_ledger_is_checked_up_to_the_given_lac():
    h = acked_history(6)
    opened = meta(state=LedgerState.OPEN)
    assert check_ledger(h, L, opened, reads(range(4)), lac=3).ok  # acked 4, 5 lie beyond the LAC read
    r = check_ledger(h, L, opened, reads(range(5)), lac=3)
    assert [(v.invariant, v.entry_id) for v in r.violations] == [(4, 4)] and "LAC 3" in r.violations[0].message
    r = check_ledger(h, L, opened, reads(range(4)))  # no LAC given: every acked entry must be readable
    assert {v.entry_id for v in r.of(1)} == {4, 5}


# ------------------------------------------------------------------ invariant 5
def test_assert_closed():
    assert_closed(meta(3))
    assert_closed(raw_meta(state="CLOSED"))
    for state in (LedgerState.OPEN, LedgerState.IN_RECOVERY):
        with pytest.raises(AssertionError, match=f"invariant 5 .*ledger 7 is {state.name}"):
            assert_closed(meta(state=state), L)


def test_assert_ok_lists_every_violation():
    h = acked_history(4)
    got = reads([0, 1, 3, 9])
    r = check_ledger(h, L, meta(3), got)
    with pytest.raises(AssertionError) as err:
        r.assert_ok()
    text = str(err.value)
    for v in r.violations:
        assert str(v) in text
    assert "4 ok" in text and len(r.violations) >= 3


# ------------------------------------------------------------------ recording rules
def test_recording_errors():
    h = History()
    op = h.invoke(L, b"a")
    with pytest.raises(ValueError):
        h.ok(op, None)
    with pytest.raises(ValueError):
        h.ok(op, -1)
    with pytest.raises(ValueError):
        h.ok(op, True)
    h.ok(op, 0)
    with pytest.raises(ValueError, match="already has an outcome"):
        h.unknown(op, "late")
    with pytest.raises(KeyError):
        h.fail(12345, "no such op")
    with pytest.raises(TypeError):
        h.invoke(L, "text is not bytes")
    with pytest.raises(ValueError):
        check_ledger(h, L, meta(0), [])
    assert h.acknowledged(L) == {0: b"a"} and h.summary(L) == "0 pending, 1 ok, 0 failed, 0 unknown"


def test_concurrent_recording_from_threads():
    h = History()

    def writer(t):
        for i in range(200):
            h.ok(h.invoke(t, b"%d" % i), i)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({op.op_id for op in h.ops()}) == 800
    for t in range(4):
        assert check_ledger(h, t, meta(199), {i: b"%d" % i for i in range(200)}).ok


# ------------------------------------------------------------------ the async wrapper
class ScriptedHandle:
    """add_entry returns or raises the next scripted item."""

    ledger_id = L

    def __init__(self, script):
        self.script = list(script)

    async def add_entry(self, payload):
        await asyncio.sleep(0)
        item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item


def test_add_wrapper_classifies_outcomes():
    class Result(NamedTuple):
        entry_id: int

    async def main():
        h = History()
        lh = ScriptedHandle([0, Result(1), LedgerClosedError("closed"), ValueError("bad"),
                             LedgerFencedError(ledger_id=L, entry_id=2), UnauthorizedAccessError(),
                             BookieIOError("timeout"), None])
        assert await h.add(lh, b"a") == 0
        assert await h.add(lh, b"b") == 1
        for exc in (LedgerClosedError, ValueError, LedgerFencedError, UnauthorizedAccessError, BookieIOError):
            with pytest.raises(exc):
                await h.add(lh, b"x")
        with pytest.raises(TypeError, match="entry id"):
            await h.add(lh, b"y")
        return h

    h = asyncio.run(main())
    outcomes = [op.outcome for op in h.ops(L)]
    assert outcomes == [Outcome.OK, Outcome.OK, Outcome.FAILED, Outcome.FAILED, Outcome.UNKNOWN,
                        Outcome.UNKNOWN, Outcome.UNKNOWN, Outcome.UNKNOWN]
    assert [op.entry_id for op in h.ops(L)] == [0, 1] + [None] * 6
    assert "LedgerFencedError" in h.ops(L)[4].error


def flagged(exc, outcome_unknown, entry_id=None):
    exc.outcome_unknown = outcome_unknown
    if entry_id is not None:
        exc.entry_id = entry_id
    return exc


def test_add_wrapper_trusts_the_clients_outcome_unknown_flag():
    async def main():
        h = History()
        lh = ScriptedHandle([flagged(LedgerClosedError("fenced out mid-flight"), True, 4),
                             flagged(LedgerFencedError(ledger_id=L, entry_id=None), False),
                             flagged(BookieIOError("in flight", ledger_id=L, entry_id=6), True),
                             flagged(ValueError("odd"), True)])
        for exc in (LedgerClosedError, LedgerFencedError, BookieIOError, ValueError):
            with pytest.raises(exc):
                await h.add(lh, b"x")
        return h

    ops = asyncio.run(main()).ops(L)
    assert [(op.outcome, op.entry_id) for op in ops] == [
        (Outcome.UNKNOWN, 4), (Outcome.FAILED, None), (Outcome.UNKNOWN, 6), (Outcome.UNKNOWN, None)]


def test_close_wrapper_records_the_writers_close():
    class Closable:
        ledger_id = L
        last_add_confirmed = 3

        def __init__(self, error=None):
            self.error = error

        async def close(self):
            if self.error:
                raise self.error

    async def main():
        h = History()
        await h.close(Closable())
        with pytest.raises(LedgerFencedError):
            await h.close(Closable(LedgerFencedError("closed by another client")))
        return h

    (ev,) = asyncio.run(main()).events(L)
    assert (ev.kind, ev.last_entry_id) == ("writer_closed", 3)


def test_add_wrapper_records_cancellation_as_unknown():
    class Hanging:
        ledger_id = 3

        async def add_entry(self, payload):
            await asyncio.Event().wait()

    async def main():
        h = History()
        task = asyncio.ensure_future(h.add(Hanging(), b"z"))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return h

    (op,) = asyncio.run(main()).ops(3)
    assert op.outcome is Outcome.UNKNOWN and op.error == "CancelledError"


class FencibleHandle:
    """A toy writer: ids assigned in call order; acks complete out of order; a fence
    at `fence_at` fails every add in flight or later with EFENCED. `stored` is what
    the 'bookies' hold: acked entries plus a random subset of fenced in-flight ones."""

    def __init__(self, rng, fence_at, flag_errors=False):
        self.ledger_id = L
        self.flag_errors = flag_errors
        self.rng = rng
        self.next_id = 0
        self.fence_at = fence_at
        self.fenced = asyncio.Event()
        self.stored = {}

    async def add_entry(self, payload):
        e = self.next_id
        self.next_id += 1
        if self.fenced.is_set():
            raise self._error(e, sent=False)
        if e >= self.fence_at:
            if self.rng.random() < 0.5:  # reached some bookies before the fence
                self.stored[e] = payload
            await self.fenced.wait()
            raise self._error(e, sent=True)
        await asyncio.sleep(self.rng.random() / 1000)
        self.stored[e] = payload
        return e

    def _error(self, e, sent):
        err = LedgerFencedError(ledger_id=L, entry_id=e)
        return flagged(err, sent) if self.flag_errors else err


@pytest.mark.parametrize("seed", range(6))
def test_wrapper_and_checker_on_a_fenced_toy_writer(seed):
    async def main():
        rng = random.Random(seed)
        h = History()
        lh = FencibleHandle(rng, fence_at=20, flag_errors=seed % 2 == 1)
        tasks = [asyncio.ensure_future(h.add(lh, b"%d-%d" % (seed, i))) for i in range(30)]
        await asyncio.sleep(0.05)
        lh.fenced.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        return h, lh

    h, lh = asyncio.run(main())
    assert sorted(h.acknowledged(L)) == list(range(20))
    if lh.flag_errors:  # the client said which in-flight add had which id
        assert all(op.entry_id is not None for op in h.ops(L) if op.outcome is Outcome.UNKNOWN)
    # "recovery": the closed ledger ends at the last entry of the contiguous stored prefix
    last = 19
    while last + 1 in lh.stored:
        last += 1
    check_ledger(h, L, meta(last), {e: lh.stored[e] for e in range(last + 1)}).assert_ok()
    # a recovery that stops early truncates acknowledged entries
    assert 2 in kinds(check_ledger(h, L, meta(15), {e: lh.stored[e] for e in range(16)}))
