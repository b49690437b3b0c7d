"""Every mix of answers to ledger recovery's reads, checked against an oracle written from
REPLICATION.md's rules (not from bk.client.recovery).

For each shape (E, WQ, AQ), each assignment of an answer kind to every bookie asked (the write
set of an entry for recovery reads, the ensemble for fencing) and several arrival orders (all
of them for cohorts of up to 3), a fake pool delivers the answers one at a time and the test
checks, after EVERY answer, that recovery_read / start_fencing has decided exactly what the
oracle decided for that prefix (nothing yet, positive, absent, unknown-fail; covered with a
LAC, fence fails). Errors are checked for their machine fields.

The rules, restated (REPLICATION.md, "Fencing and ledger recovery", "Running without the
journal"):
- recovery read of entry e over its write set: a valid digest is a positive at once; explicit
  ENOENTRY/ENOLEDGER answers make it absent once they reach WQ - AQ + 1; nothing else
  (EUNKNOWNLEDGERSTATE, EIO, timeouts, bad digests) ever counts as a negative; every answer in
  and neither reached: recovery fails;
- fencing of the last segment's E bookies: EOK with a valid digest, ENOENTRY, ENOLEDGER and
  EUNKNOWNLEDGERSTATE prove the fence; done once E - AQ + 1 proved it, with the highest LAC
  among the valid EOK answers so far (EUNKNOWNLEDGERSTATE carries none); failed once more than
  AQ - 1 answers prove nothing.
"""
from __future__ import annotations

import asyncio
import itertools
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from test_client_support import run_async  # noqa: E402

from bk.client.recovery import recovery_read, start_fencing  # noqa: E402
from bk.errors import BookieConnectionError, BookieTimeoutError, LedgerRecoveryError  # noqa: E402
from bk.meta.ledger_metadata import LedgerMetadata  # noqa: E402
from bk.proto import FLAG_DO_FENCING, DigestManager, StatusCode, master_key  # noqa: E402
from bk.proto.messages import ReadResponse  # noqa: E402

OK, BAD, NOENTRY, NOLEDGER, LIMBO, EIO, TIMEOUT = "OK", "BAD", "ENOENTRY", "ENOLEDGER", "LIMBO", "EIO", "TIMEOUT"
KINDS = (OK, BAD, NOENTRY, NOLEDGER, LIMBO, EIO, TIMEOUT)
SHAPES = [(3, 3, 2), (3, 2, 2), (4, 3, 2), (5, 5, 3), (3, 3, 3), (2, 2, 1)]
LEDGER = 7
KEY = master_key(b"pw")


# ---------------------------------------------------------------- the oracle (REPLICATION.md)
def read_oracle(kinds: list[str], wq: int, aq: int):
    """The decision after the answers `kinds` (in arrival order): None while undecided."""
    explicit_negatives = 0
    for kind in kinds:
        if kind == OK:
            return "positive"
        if kind in (NOENTRY, NOLEDGER):
            explicit_negatives += 1
            if explicit_negatives >= wq - aq + 1:
                return "absent"
    return "fail" if len(kinds) == wq else None


def fence_oracle(answers: list[tuple[str, int]], e: int, aq: int):
    """`answers` = (kind, LAC carried by an EOK) in arrival order -> None | ("covered", lac) | ("fail",)."""
    proved, proved_nothing, best = 0, 0, -1
    for kind, lac in answers:
        if kind == OK:
            proved += 1
            best = max(best, lac)
        elif kind in (NOENTRY, NOLEDGER, LIMBO):
            proved += 1
        else:
            proved_nothing += 1
        if proved >= e - aq + 1:
            return ("covered", best)
        if proved_nothing > aq - 1:
            return ("fail",)
    return None


# ---------------------------------------------------------------- a fake pool
class FakeClient:
    def __init__(self, pool: "FakePool", bookie: str):
        self.pool, self.bookie = pool, bookie

    def send_read(self, ledger_id, entry_id, callback, *, flags=0, master_key=None, timeout_s=None):
        assert flags & FLAG_DO_FENCING and master_key == KEY and ledger_id == LEDGER
        assert self.bookie not in self.pool.sent, "asked the same bookie twice"
        self.pool.sent[self.bookie] = (entry_id, callback)


class FakePool:
    """Records each read's callback; a bookie in `unreachable` fails in pool.get itself."""

    def __init__(self, unreachable=()):
        self.sent: dict[str, tuple] = {}
        self.unreachable = set(unreachable)

    def get(self, bookie: str) -> FakeClient:
        if bookie in self.unreachable:
            raise BookieConnectionError(f"cannot connect to bookie {bookie}")
        return FakeClient(self, bookie)


def answer(kind: str, entry_id: int, body: bytes | None, bad_body: bytes | None):
    """(response, err) a bookie's callback gets for `kind`."""
    if kind == TIMEOUT:
        return None, BookieTimeoutError("did not answer in time")
    rc = {OK: 0, BAD: 0, NOENTRY: int(StatusCode.ENOENTRY), NOLEDGER: int(StatusCode.ENOLEDGER),
          LIMBO: int(StatusCode.EUNKNOWNLEDGERSTATE), EIO: int(StatusCode.EIO)}[kind]
    return ReadResponse(rc, LEDGER, entry_id, {OK: body, BAD: bad_body}.get(kind)), None


def corrupt(frame: bytes) -> bytes:
    return frame[:-1] + bytes([frame[-1] ^ 0xFF])


def metadata_for(e: int, wq: int, aq: int) -> LedgerMetadata:
    return LedgerMetadata.new([f"127.0.0.{i + 1}:3181" for i in range(e)], wq, aq, password=b"pw")


def orders(n: int):
    """Arrival orders (permutations of answer positions): all of them up to 3, else four."""
    if n <= 3:
        return list(itertools.permutations(range(n)))
    ident = tuple(range(n))
    return [ident, ident[::-1], ident[1:] + ident[:1], ident[2:] + ident[:2]]


def shape_id(shape) -> str:
    return "E%dWQ%dAQ%d" % shape


# ---------------------------------------------------------------- recovery reads
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@run_async
async def test_recovery_read_decides_like_the_oracle_for_every_mix_of_answers(shape):
    e, wq, aq = shape
    md = metadata_for(e, wq, aq)
    digest = DigestManager(LEDGER, "CRC32C", b"pw")
    entry_id = 11 * e - 1  # its write set wraps around the end of the ensemble when E > WQ
    ensemble = md.last_segment[1]
    write_set = [ensemble[(entry_id + i) % e] for i in range(wq)]
    body = digest.frame_entry(entry_id, entry_id - 3, 1000, b"payload")
    bad = corrupt(body)
    runs = 0
    for kinds in itertools.product(KINDS, repeat=wq):  # kinds[i] is write_set[i]'s answer
        for n_order, order in enumerate(orders(wq)):
            known_lac = entry_id if n_order == 1 else -1  # once per assignment: the entry was acknowledged
            pool = FakePool()
            fut = recovery_read(pool, digest, md, entry_id, KEY, known_lac)
            assert set(pool.sent) == set(write_set) and all(eid == entry_id for eid, _ in pool.sent.values())
            arrived = []
            for position in order:
                bookie = write_set[position]
                expected_before = read_oracle(arrived, wq, aq)
                assert fut.done() == (expected_before is not None), (kinds, order, arrived)
                pool.sent[bookie][1](*answer(kinds[position], entry_id, body, bad))
                arrived.append(kinds[position])
                expected = read_oracle(arrived, wq, aq)
                assert fut.done() == (expected is not None), (kinds, order, arrived, expected)
            expected = read_oracle(arrived, wq, aq)
            check_read_outcome(fut, expected, kinds, write_set, entry_id, known_lac, (kinds, order))
            runs += 1
    assert runs == len(KINDS) ** wq * len(orders(wq))


def check_read_outcome(fut, expected, kinds, write_set, entry_id, known_lac, where) -> None:
    if expected == "positive":
        assert fut.result() == (b"payload", 1000, entry_id - 3), where
        return
    if expected == "absent":
        assert fut.result() is None, where
        return
    err = fut.exception()
    assert isinstance(err, LedgerRecoveryError), (where, err)
    assert (err.ledger_id, err.entry_id) == (LEDGER, entry_id)
    by_bookie = dict(zip(write_set, kinds))
    assert set(err.answers) == set(write_set)
    assert set(err.unknown_bookies) == {b for b, k in by_bookie.items() if k not in (NOENTRY, NOLEDGER)}, where
    assert set(err.limbo_bookies) == {b for b, k in by_bookie.items() if k == LIMBO}, where
    message = str(err)
    for bookie in write_set:
        assert bookie in message
    assert ("EUNKNOWNLEDGERSTATE: the ledger is in limbo" in message) == (LIMBO in kinds), where
    assert "OPEN/IN_RECOVERY" in message and "never" in message or "not closed" in message
    no_usable_answer = [k for k in kinds if k in (BAD, EIO, TIMEOUT)]
    acknowledged = entry_id <= known_lac
    assert err.data_loss == (acknowledged and not no_usable_answer), where
    if acknowledged:
        assert ("POSSIBLE DATA LOSS" if no_usable_answer else "DATA LOSS of an acknowledged entry") in message
    else:
        everyone_lost_it = LIMBO in kinds and all(k in (LIMBO, NOENTRY, NOLEDGER) for k in kinds)
        assert ("it is lost on every replica (DATA LOSS, not provable" in message) == everyone_lost_it, where
        assert ("DATA LOSS" in message) == everyone_lost_it, where


@run_async
async def test_recovery_read_counts_an_unreachable_bookie_as_unknown():
    md = metadata_for(3, 3, 2)
    digest = DigestManager(LEDGER, "CRC32C", b"pw")
    b0, b1, b2 = md.last_segment[1]
    pool = FakePool(unreachable={b1})
    fut = recovery_read(pool, digest, md, 0, KEY)
    pool.sent[b0][1](*answer(LIMBO, 0, None, None))
    assert not fut.done()
    pool.sent[b2][1](*answer(NOENTRY, 0, None, None))
    err = fut.exception()
    assert isinstance(err, LedgerRecoveryError) and set(err.unknown_bookies) == {b0, b1}
    assert "cannot connect" in err.answers[b1]
    # ... and two negatives with the unreachable one decide "absent" (WQ - AQ + 1 = 2)
    pool = FakePool(unreachable={b1})
    fut = recovery_read(pool, digest, md, 0, KEY)
    pool.sent[b0][1](*answer(NOLEDGER, 0, None, None))
    pool.sent[b2][1](*answer(NOENTRY, 0, None, None))
    assert fut.result() is None


# ---------------------------------------------------------------- fencing
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@run_async
async def test_fencing_decides_like_the_oracle_for_every_mix_of_answers(shape):
    e, wq, aq = shape
    md = metadata_for(e, wq, aq)
    digest = DigestManager(LEDGER, "CRC32C", b"pw")
    ensemble = md.last_segment[1]
    # bookie i's last entry is 20 + i carrying LAC 10 + i: which answers counted shows in the LAC
    bodies = [digest.frame_entry(20 + i, 10 + i, 500, b"last") for i in range(e)]
    runs = 0
    for kinds in itertools.product(KINDS, repeat=e):
        for order in orders(e):
            pool = FakePool()
            fut = start_fencing(pool, digest, md, KEY)
            assert set(pool.sent) == set(ensemble) and all(eid == -1 for eid, _ in pool.sent.values())
            arrived = []
            for position in order:
                assert fut.done() == (fence_oracle(arrived, e, aq) is not None), (kinds, order, arrived)
                pool.sent[ensemble[position]][1](*answer(kinds[position], -1, bodies[position],
                                                         corrupt(bodies[position])))
                arrived.append((kinds[position], 10 + position))
                assert fut.done() == (fence_oracle(arrived, e, aq) is not None), (kinds, order, arrived)
            expected = fence_oracle(arrived, e, aq)
            assert expected is not None  # E answers always decide one way: E - AQ + 1 + AQ > E
            if expected[0] == "covered":
                assert fut.result() == expected[1], (kinds, order)
            else:
                err = fut.exception()
                assert isinstance(err, LedgerRecoveryError) and "cannot fence" in str(err), (kinds, order)
                decided = arrived[:[i for i in range(1, e + 1) if fence_oracle(arrived[:i], e, aq)][0]]
                assert len(err.unknown_bookies) == aq and len(err.answers) == len(decided)
                # limbo answers prove the fence: never the reason it failed
                limbo = {ensemble[p] for p, (kind, _) in zip(order, decided) if kind == LIMBO}
                assert set(err.limbo_bookies) == limbo and not limbo & set(err.unknown_bookies)
            runs += 1
    assert runs == len(KINDS) ** e * len(orders(e))


@run_async
async def test_fencing_with_every_bookie_in_limbo_is_covered_with_no_lac():
    """All bookies crashed without the journal: each proves its fence, none knows a LAC."""
    md = metadata_for(3, 3, 2)
    digest = DigestManager(LEDGER, "CRC32C", b"pw")
    pool = FakePool()
    fut = start_fencing(pool, digest, md, KEY)
    for bookie in md.last_segment[1][:2]:
        pool.sent[bookie][1](*answer(LIMBO, -1, None, None))
    assert fut.result() == -1
