"""Learning a ledger's LAC from its bookies, the ways BookKeeper's client does (REPLICATION.md).

Every op asks the bookies of the ledger's last segment (the current ensemble) and
digest-checks what they return; a LAC taken from an answer is a fact the writer
stamped (piggybacked on an entry, or an explicit LAC it sent), so it is a valid
lower bound of the ledger's LAC whatever the other bookies say.

- `read_lac_quorum` (BookKeeper's ReadLastConfirmedOp; `explicit=True`:
  PendingReadLacOp): READ of entry -1 (or READ_LAC, whose answer holds the
  explicit LAC and the last entry) to every bookie; done as soon as the answers
  that know something (a valid entry or buffer, or an explicit ENOENTRY /
  ENOLEDGER) cover the ensemble, `E - AQ + 1` of them, with the highest LAC among
  them; a bookie that is down or SIGSTOPped then costs nothing. When every answer
  is in without coverage the answers are returned as they are (the caller decides:
  ReadHandle keeps what it knows unless no bookie answered at all). EUA ends it
  at once.
- `try_read_lac` (TryReadLastConfirmedOp): the same READs, but the first valid
  answer above the LAC the caller knows ends it; otherwise it ends when every
  bookie answered.
- `LongPollOp` (ReadLastConfirmedAndEntryOp): v3 READ of entry -1 with
  previousLAC = entry_id - 1, timeOut and ENTRY_PIGGYBACK. A bookie answers once
  its LAC passes previousLAC (with that LAC and, when it has it, entry
  previousLAC + 1) or when the time is up (its LAC, no entry). Parallel: asked of
  every bookie of the ensemble at once. Sequential: one bookie after another
  (starting at the entry's write set), the next one asked when the last one
  answered empty or failed. Done at the first verified entry, at the first answer
  whose LAC passed previousLAC, after `E - AQ + 1` empty answers (the LAC did not
  move on enough bookies that an ack quorum could have formed without them), or
  when every bookie answered. ENOLEDGER / ENOENTRY (a bookie that has no entry of
  the ledger yet: it does not park the poll) count as empty answers, answered at
  once: `negatives` tells the caller to pause before asking again. Sequential long
  polls are speculative with the client's `first_speculative_read_lac_timeout_ms`
  family: a bookie that has not answered within it (it may be paused) gets the next
  bookie asked beside it.
"""
from __future__ import annotations

import asyncio
from typing import NamedTuple, Sequence

from bk.errors import (BKError, BookieIOError, DigestMismatchError, UnauthorizedAccessError, error_for_code)
from bk.proto import DigestManager, StatusCode
from bk.proto.v3 import LongPollReadResponse

from .quorum import coverage
from .read_ops import EOK, NEGATIVE, LedgerEntry

EUA = int(StatusCode.EUA)


class LacAnswers(NamedTuple):
    lac: int | None  # the highest valid LAC seen, None if no bookie returned a valid entry or buffer
    valid: int  # EOK answers that verified
    negative: int  # explicit ENOENTRY / ENOLEDGER
    errors: list  # (bookie, error) for everything else


def _retrieve(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()  # an answer nobody waits for any more is not "never retrieved"


def _ask(pool, bookies: Sequence[str], send: str, *args) -> list[asyncio.Future]:
    """One request per bookie (`client.<send>(*args, callback)`), as futures of the answers."""
    futures = []
    for bookie in bookies:
        try:
            client = pool.get(bookie)
            fut = client.call(getattr(client, send), *args)
        except BKError as e:
            fut = asyncio.get_running_loop().create_future()
            fut.set_exception(e)
        fut.add_done_callback(_retrieve)
        futures.append(fut)
    return futures


def _lac_of(digest: DigestManager, answer, explicit: bool) -> int:
    """The highest LAC a valid EOK answer holds (DigestMismatchError when none of it verifies)."""
    if not explicit:
        return digest.unpack_entry(answer.body)[1]
    lac = -1
    if answer.lac_buf:
        lac = digest.verify_lac(answer.lac_buf)
    if answer.last_entry:
        lac = max(lac, digest.unpack_entry(answer.last_entry)[1])
    return lac


async def _collect(pool, digest: DigestManager, bookies: Sequence[str], *, explicit: bool, need: int | None,
                   above: int | None) -> LacAnswers:
    """Ask every bookie; stop once `need` knowing answers are in (quorum), or at the first valid LAC
    greater than `above` (try), or when all answered."""
    ledger_id = digest.ledger_id
    futures = (_ask(pool, bookies, "send_read_lac", ledger_id) if explicit
               else _ask(pool, bookies, "send_read", ledger_id, -1))
    by_future = dict(zip(futures, bookies))
    best, valid, negative, errors = None, 0, 0, []
    pending = set(futures)
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for fut in done:
            bookie = by_future[fut]
            err = fut.exception()
            if err is not None:
                errors.append((bookie, err))
                continue
            answer = fut.result()
            if answer.rc == EOK:
                try:
                    lac = _lac_of(digest, answer, explicit)
                except DigestMismatchError as e:
                    errors.append((bookie, e))
                    continue
                valid += 1
                best = lac if best is None else max(best, lac)
            elif answer.rc in NEGATIVE:
                negative += 1
            elif answer.rc == EUA:
                raise UnauthorizedAccessError(f"bookie {bookie} refused to read ledger {ledger_id}'s LAC",
                                              ledger_id=ledger_id)
            else:
                errors.append((bookie, error_for_code(answer.rc, ledger_id=ledger_id, entry_id=-1)))
        if need is not None and valid + negative >= need:
            break
        if above is not None and best is not None and best > above:
            break
    for fut in pending:
        fut.cancel()  # the answers still due are dropped as they come
    return LacAnswers(best, valid, negative, errors)


async def read_lac_quorum(pool, digest: DigestManager, bookies: Sequence[str], ack_quorum_size: int, *,
                          explicit: bool = False) -> LacAnswers:
    """READ -1 (explicit: READ_LAC) until the knowing answers cover the ensemble."""
    return await _collect(pool, digest, bookies, explicit=explicit,
                          need=coverage(len(bookies), ack_quorum_size), above=None)


async def try_read_lac(pool, digest: DigestManager, bookies: Sequence[str], known_lac: int) -> LacAnswers:
    """READ -1 to every bookie; the first valid LAC above `known_lac` ends it."""
    return await _collect(pool, digest, bookies, explicit=False, need=None, above=known_lac)


_NOTHING = LongPollReadResponse(int(StatusCode.EOK), -1, -1, b"", -1)  # an explicit negative, as an answer


class LastConfirmedAndEntry(NamedTuple):
    """BookKeeper's LastConfirmedAndEntry: the LAC learnt, and the entry asked for if it came."""
    last_add_confirmed: int
    entry: LedgerEntry | None


class LongPollOp:
    """One readLastConfirmedAndEntry long poll over an ensemble (the module docstring)."""

    def __init__(self, pool, digest: DigestManager, ensemble: Sequence[str], ack_quorum_size: int,
                 entry_id: int, known_lac: int, timeout_ms: int, parallel: bool, speculative=None):
        size = len(ensemble)
        start = entry_id % size
        self.order = [ensemble[(start + i) % size] for i in range(size)]  # BookKeeper's getWriteSetForLongPoll
        self.pool = pool
        self.digest = digest
        self.entry_id = entry_id
        self.previous_lac = entry_id - 1
        self.lac = known_lac
        self.timeout_ms = int(timeout_ms)
        self.parallel = parallel
        self.empty_enough = coverage(size, ack_quorum_size)  # E - AQ + 1 empty answers: the LAC did not move
        self.errors: list = []  # (bookie, error) of failed answers: the caller may re-read the metadata
        self.negatives = 0  # ENOLEDGER / ENOENTRY answers (answered at once: the caller should pause)
        self._empty = 0
        self._valid = False
        self._next = 0
        self._outstanding = 0
        self.speculative = None if parallel else speculative  # a SpeculativePolicy (bk/client/speculative.py)
        self.speculative_sends = 0
        self._timer = None
        self.future = asyncio.get_running_loop().create_future()

    async def run(self) -> LastConfirmedAndEntry:
        if self.parallel:
            while self._next < len(self.order):
                self._send_next()
        else:
            self._send_next()
            if self.speculative is not None:
                self._arm(self.speculative.first_s)
        try:
            return await self.future
        finally:
            if self._timer is not None:
                self._timer.cancel()

    def _arm(self, delay_s: float) -> None:
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._speculate, delay_s)

    def _speculate(self, delay_s: float) -> None:
        """BookKeeper's readLACSpeculativeRequestPolicy: no answer yet from the bookies asked, so
        ask the next one too (the earlier ones stay asked)."""
        self._timer = None
        if self.future.done() or self._next >= len(self.order):
            return
        self.speculative_sends += 1
        self._send_next()
        self._arm(self.speculative.next_s(delay_s))

    def _send_next(self) -> None:
        bookie = self.order[self._next]
        self._next += 1
        self._outstanding += 1
        try:
            self.pool.get(bookie).send_long_poll(self.digest.ledger_id, self.previous_lac, self.timeout_ms,
                                                 lambda response, err: self._answered(bookie, response, err))
        except BKError as e:
            self._answered(bookie, None, e)

    def _answered(self, bookie: str, response, err) -> None:
        self._outstanding -= 1
        if self.future.done():
            return
        if err is None and response.rc == EUA:
            self.future.set_exception(UnauthorizedAccessError(
                f"bookie {bookie} refused to read ledger {self.digest.ledger_id}", ledger_id=self.digest.ledger_id))
            return
        if err is None and response.rc in NEGATIVE:  # a bookie with no entry of it yet: its LAC did not move
            self.negatives += 1
            response = _NOTHING
        elif err is None and response.rc != EOK:
            err = error_for_code(response.rc, ledger_id=self.digest.ledger_id, entry_id=-1)
        if err is not None:
            self.errors.append((bookie, err))
        else:
            self._valid = True
            self.lac = max(self.lac, getattr(response, "max_lac", -1))
            if response.body and response.entry_id == self.entry_id:
                try:
                    lac, _, payload = self.digest.verify_entry(self.entry_id, response.body)
                except DigestMismatchError as e:
                    self.errors.append((bookie, e))
                else:
                    # The bookie sends entry previousLAC + 1 only once its LAC passed previousLAC.
                    self.lac = max(self.lac, lac, self.entry_id)
                    self._finish(LedgerEntry(self.entry_id, bytes(payload)))
                    return
            elif response.body:  # an entry -1 read answered by a bookie that ignores previousLAC
                try:
                    self.lac = max(self.lac, self.digest.unpack_entry(response.body)[1])
                except DigestMismatchError as e:
                    self.errors.append((bookie, e))
            if self.lac > self.previous_lac:
                self._finish(None)
                return
            self._empty += 1
            if self._empty >= self.empty_enough:
                self._finish(None)
                return
        if self._next < len(self.order) and not self.parallel and self._outstanding == 0:
            self._send_next()
        elif self._outstanding == 0:
            if self._valid:
                self._finish(None)
            else:
                detail = "; ".join(f"{b}: {e}" for b, e in self.errors)
                self.future.set_exception(BookieIOError(
                    f"ledger {self.digest.ledger_id}: no bookie answered the long poll ({detail})",
                    ledger_id=self.digest.ledger_id))

    def _finish(self, entry: LedgerEntry | None) -> None:
        self.future.set_result(LastConfirmedAndEntry(self.lac, entry))
