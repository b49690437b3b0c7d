"""bk/client/lac_ops.py against scripted bookies: when each LAC read ends, and what it believes.

A bookie that never answers (paused) must not hold up a quorum LAC read once the others cover
the ensemble (BookKeeper's ReadLastConfirmedOp); a try-read ends at the first LAC above the known
one; READ_LAC takes the higher of the explicit and piggybacked LACs, digest-checked; a long poll
ends at a verified piggybacked entry, at a LAC past previousLAC, or after E - AQ + 1 empty answers,
and never believes an entry whose digest or id is wrong.
"""
import asyncio

import pytest

from bk.client.lac_ops import LongPollOp, read_lac_quorum, try_read_lac
from bk.errors import BKError, BookieConnectionError, UnauthorizedAccessError
from bk.proto import DigestManager, ReadLacResponse, ReadResponse
from bk.proto.v3 import LongPollReadResponse

D = DigestManager(7, "CRC32C", b"pw")
HANG = object()  # this bookie never answers


def entry(entry_id: int, lac: int) -> bytes:
    return D.frame_entry(entry_id, lac, 10 * (entry_id + 1), b"x" * 10)


class Client:
    def __init__(self, script):
        self.script = script  # answer or exception, or HANG; a list: one per request
        self.sent = []

    def _answer(self, callback):
        script = self.script.pop(0) if isinstance(self.script, list) else self.script
        if script is HANG:
            return
        loop = asyncio.get_running_loop()
        if isinstance(script, BaseException):
            loop.call_soon(callback, None, script)
        else:
            loop.call_soon(callback, script, None)

    def call(self, send, *args):
        fut = asyncio.get_running_loop().create_future()
        send(*args, lambda r, e: fut.done() or (fut.set_exception(e) if e else fut.set_result(r)))
        return fut

    def send_read(self, ledger_id, entry_id, callback):
        self.sent.append(("read", entry_id))
        self._answer(callback)

    def send_read_lac(self, ledger_id, callback):
        self.sent.append(("read_lac",))
        self._answer(callback)

    def send_long_poll(self, ledger_id, previous_lac, timeout_ms, callback):
        self.sent.append(("long_poll", previous_lac, timeout_ms))
        self._answer(callback)


class Pool:
    def __init__(self, scripts):
        self.clients = {b: Client(s) for b, s in scripts.items()}

    def get(self, bookie):
        return self.clients[bookie]


def run(coro, timeout_s=10):
    async def main():
        return await asyncio.wait_for(coro, timeout_s)  # a hang detector, not a speed check
    return asyncio.run(main())


def test_quorum_read_does_not_wait_for_a_paused_bookie():
    pool = Pool({"a": ReadResponse(0, 7, 4, entry(4, 3)), "b": ReadResponse(0, 7, 5, entry(5, 4)), "c": HANG})
    answers = run(read_lac_quorum(pool, D, ["a", "b", "c"], 2))  # E - AQ + 1 = 2 answers cover
    assert (answers.lac, answers.valid, answers.negative) == (4, 2, 0)


def test_quorum_read_counts_negatives_and_reports_errors_when_uncovered():
    pool = Pool({"a": ReadResponse(1, 7, -1), "b": BookieConnectionError("down"), "c": ReadResponse(0, 7, 2, entry(2, 1))})
    answers = run(read_lac_quorum(pool, D, ["a", "b", "c"], 2))
    assert (answers.lac, answers.valid, answers.negative, len(answers.errors)) == (1, 1, 1, 1)
    pool = Pool({"a": BookieConnectionError("down"), "b": BookieConnectionError("down"),
                 "c": ReadResponse(0, 7, 2, entry(2, 1))})
    answers = run(read_lac_quorum(pool, D, ["a", "b", "c"], 2))  # every answer in, not covered
    assert answers.lac == 1 and len(answers.errors) == 2


def test_quorum_read_refuses_bad_digests():
    bad = bytearray(entry(9, 8))
    bad[-1] ^= 1
    pool = Pool({"a": ReadResponse(0, 7, 9, bytes(bad)), "b": ReadResponse(0, 7, 3, entry(3, 2)),
                 "c": ReadResponse(1, 7, -1)})
    answers = run(read_lac_quorum(pool, D, ["a", "b", "c"], 2))
    assert answers.lac == 2 and len(answers.errors) == 1


def test_try_read_ends_at_the_first_higher_lac():
    pool = Pool({"a": HANG, "b": ReadResponse(0, 7, 6, entry(6, 5)), "c": HANG})
    answers = run(try_read_lac(pool, D, ["a", "b", "c"], 3))
    assert answers.lac == 5
    pool = Pool({"a": ReadResponse(0, 7, 3, entry(3, 2)), "b": ReadResponse(1, 7, -1), "c": ReadResponse(0, 7, 4, entry(4, 3))})
    answers = run(try_read_lac(pool, D, ["a", "b", "c"], 3))  # nothing above 3: all answers
    assert answers.lac == 3 and answers.valid == 2 and answers.negative == 1


def test_read_lac_takes_explicit_and_piggybacked_and_eua_ends_it():
    pool = Pool({"a": ReadLacResponse(0, 7, D.frame_lac(9), entry(9, 8)), "b": ReadLacResponse(0, 7, None, entry(8, 7)),
                 "c": HANG})
    assert run(read_lac_quorum(pool, D, ["a", "b", "c"], 2, explicit=True)).lac == 9
    forged = bytearray(D.frame_lac(50))
    forged[-1] ^= 1
    pool = Pool({"a": ReadLacResponse(0, 7, bytes(forged), None), "b": ReadLacResponse(0, 7, None, entry(8, 7)),
                 "c": ReadLacResponse(1, 7)})
    answers = run(read_lac_quorum(pool, D, ["a", "b", "c"], 2, explicit=True))
    assert answers.lac == 7 and len(answers.errors) == 1  # a forged explicit LAC is not believed
    pool = Pool({"a": ReadResponse(102, 7, -1), "b": HANG, "c": HANG})
    with pytest.raises(UnauthorizedAccessError):
        run(read_lac_quorum(pool, D, ["a", "b", "c"], 2))


def long_poll(pool, parallel, entry_id=5, known=4, e=3, aq=2):
    async def go():
        return await LongPollOp(pool, D, ["a", "b", "c"][:e], aq, entry_id, known, 1000, parallel).run()
    return go()


def test_long_poll_returns_the_piggybacked_entry():
    pool = Pool({"a": HANG, "b": HANG, "c": LongPollReadResponse(0, 7, 5, entry(5, 4), 6)})
    lac, got = run(long_poll(pool, parallel=True))
    assert lac == 6 and got.entry_id == 5 and got.data == b"x" * 10
    assert pool.clients["c"].sent == [("long_poll", 4, 1000)]


def test_long_poll_sequential_moves_on_after_empty_answers_and_ends_after_e_minus_aq_plus_1():
    empty = LongPollReadResponse(0, 7, -1, b"", 4)
    pool = Pool({"a": empty, "b": HANG, "c": empty})
    lac, got = run(long_poll(pool, parallel=False))  # order starts at 5 % 3: c, a, b
    assert (lac, got) == (4, None)
    assert pool.clients["b"].sent == []  # two empty answers (E - AQ + 1) end it: b is never asked
    pool = Pool({"a": empty, "b": empty, "c": BookieConnectionError("down")})
    lac, got = run(long_poll(pool, parallel=False))
    assert (lac, got) == (4, None) and [len(c.sent) for c in pool.clients.values()] == [1, 1, 1]


def test_long_poll_lac_without_entry_and_bad_entries_are_not_believed():
    bad = bytearray(entry(5, 4))
    bad[-1] ^= 1
    pool = Pool({"a": LongPollReadResponse(0, 7, 5, bytes(bad), 5), "b": HANG, "c": HANG})
    lac, got = run(long_poll(pool, parallel=True))
    assert got is None and lac == 5  # the LAC moved; the entry must be read from a good replica
    pool = Pool({"a": LongPollReadResponse(0, 7, 6, entry(6, 5), 6), "b": HANG, "c": HANG})
    lac, got = run(long_poll(pool, parallel=True))
    assert got is None and lac == 6  # an answer for another entry (a stale long poll's) is no entry 5
    pool = Pool({"a": BookieConnectionError("down"), "b": BookieConnectionError("down"),
                 "c": BookieConnectionError("down")})
    with pytest.raises(BKError):
        run(long_poll(pool, parallel=True))


def test_long_poll_on_bookies_without_the_ledger_yet_is_empty_not_an_error():
    pool = Pool({"a": ReadResponse(1, 7, -1), "b": ReadResponse(1, 7, -1), "c": ReadResponse(1, 7, -1)})
    async def go():
        op = LongPollOp(pool, D, ["a", "b", "c"], 2, 0, -1, 1000, True)
        return op, await op.run()
    op, (lac, got) = run(go())
    assert (lac, got) == (-1, None) and op.negatives >= 2 and op.errors == []


def test_sequential_long_poll_speculates_past_a_paused_bookie():
    from bk.client.speculative import SpeculativePolicy

    pool = Pool({"a": LongPollReadResponse(0, 7, 5, entry(5, 4), 5), "b": HANG, "c": HANG})

    async def go(policy):
        op = LongPollOp(pool, D, ["a", "b", "c"], 2, 5, 4, 1000, False, policy)
        return op, await op.run()
    op, (lac, got) = run(go(SpeculativePolicy(20, 40, 2.0)))  # order c, a, b: c is paused
    assert got.entry_id == 5 and op.speculative_sends == 1 and pool.clients["b"].sent == []
    with pytest.raises(asyncio.TimeoutError):  # without the policy it waits for c (its request timeout)
        asyncio.run(asyncio.wait_for(go(None), 0.5))
