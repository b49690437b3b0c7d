"""Reading entries: one entry replica by replica, a range with a window of reads in flight,
and the LAC a ledger's bookies know.

Entry read (ReadEntryOp): ask the first bookie of the entry's write set
(bookies that failed recently go last); on an error, a timeout, an explicit
negative or a bad digest ask the next one. The outcome:
- an EOK whose digest, ledger id and entry id verify -> the entry;
- otherwise, if any replica returned bytes that failed verification ->
  DigestMismatchError (a copy exists but none is valid);
- otherwise, if every replica answered ENOENTRY/ENOLEDGER -> NoSuchEntryError;
- otherwise the error of the last replica that failed for another reason
  (EIO-typed: timeout, connection loss, EIO, ...), naming every replica's answer.
A replica whose connection was dropped over a BATCH_READ (an older bookie refusing
the op, bookie_client.BatchReadDropError) is asked once more before moving on: the
drop says nothing about this entry, and each replica may be dropping a batch of its own.

Speculative reads (bk/client/speculative.py has the policy and the settings): a read
(or a batch) that has had no answer within the speculative timeout is also sent to the
next replica, while the earlier ones stay outstanding; the first valid answer wins and
every later answer is dropped. A failed answer moves on to the next replica only when
nothing else is outstanding, and the outcome above is decided only once every replica
has answered, so speculation never turns "no answer yet" into a negative. `heard` (one
set per read operation) holds the bookies that returned entries in it: a read whose
asked bookies include one of them is not speculated (that bookie is alive, only slow).
`on_error(bookie)` hears of every failed answer, late ones included: sticky reads
(ReadHandle) move to another bookie on it. Within a range read, the first speculative
look at each read is taken by one timer of the range (reads start in order and share
the first delay, so a queue ordered by due time suffices): a loop timer per read would
cost more than the rest of a fast read; a read still unanswered then, and a standalone
ReadEntryOp, arms its own timer for the later looks.

Range read (ReadRangeOp): at most `window` entry reads in flight; results are
placed by entry id, so the list comes back in order; the first failure fails
the range (reads still in flight finish and are ignored).

LAC reads are bk/client/lac_ops.py.
"""
from __future__ import annotations

import asyncio
from collections import deque
from functools import partial
from typing import Callable, NamedTuple, Sequence

from bk.errors import (
    BKError, BookieError, BookieIOError, DigestMismatchError, NoSuchEntryError, error_for_code,
)
from bk.proto import DigestManager, StatusCode

from .bookie_client import BatchReadDropError
from .speculative import SPECULATIVE_READ_COUNT, SpeculativePolicy

EOK = int(StatusCode.EOK)
EBADREQ = int(StatusCode.EBADREQ)
NEGATIVE = (int(StatusCode.ENOENTRY), int(StatusCode.ENOLEDGER))


class LedgerEntry(NamedTuple):
    entry_id: int
    data: bytes


def order_replicas(bookies: Sequence[str], pool) -> list[str]:
    """Write-set order, with bookies that failed recently moved to the end. With the client's
    reorder_read_sequence_enabled, `pool.read_order` (the placement policy's reorder_read_sequence:
    local rack, then local region, then the rest) orders the write set first."""
    read_order = getattr(pool, "read_order", None)
    if read_order is not None:
        bookies = read_order(bookies)
    healthy = [b for b in bookies if not pool.suspect(b)]
    if len(healthy) == len(bookies):
        return list(bookies)
    return healthy + [b for b in bookies if pool.suspect(b)]


class _Speculating:
    """What ReadEntryOp and BatchReadOp share: replicas asked in order, and speculative requests.

    A subclass declares the slots `replicas`, `_next` (replicas[:_next] were asked),
    `_outstanding` (requests not answered yet), `_done` (the outcome is out: later answers are
    dropped) and `_timer`, and provides `_send(bookie)`, `_policy()` and `_heard()`."""

    __slots__ = ()

    def _begin(self, watch: Callable | None) -> None:
        """Ask the first replica; with a policy, look again after its first delay (`watch`: the
        range's timer takes that look, else a timer of this op)."""
        self._send_next()
        policy = self._policy()
        if policy is not None and not self._done and self._next < len(self.replicas):
            if watch is not None:
                watch(self)
            else:
                self._arm(policy.first_s)

    def _arm(self, delay_s: float) -> None:
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._speculate, delay_s)

    def _speculate(self, delay_s: float) -> None:
        """`delay_s` after the last request: ask the next replica too, unless answered meanwhile."""
        self._timer = None
        if self._done or self._next >= len(self.replicas):
            return
        heard = self._heard()
        if heard and not heard.isdisjoint(self.replicas[:self._next]):
            return  # a bookie asked here answers this operation: slow on this read, not gone
        SPECULATIVE_READ_COUNT.inc()
        self._send_next()
        if not self._done and self._next < len(self.replicas):
            self._arm(self._policy().next_s(delay_s))

    def _send_next(self) -> None:
        bookie = self.replicas[self._next]
        self._next += 1
        self._outstanding += 1
        self._send(bookie)

    def _stop(self) -> None:
        """The outcome is out: no more speculation."""
        self._done = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class ReadEntryOp(_Speculating):
    """Reads one entry from its replicas; `callback(entry_id, LedgerEntry | None, error)` once.

    `speculative`, `heard`, `on_error`: the module docstring (all optional); `watch`: a
    ReadRangeOp's timer takes the first speculative look."""

    __slots__ = ("pool", "digest", "ledger_id", "entry_id", "replicas", "callback", "flags", "master_key",
                 "speculative", "heard", "on_error", "_next", "_outstanding", "_done", "_timer", "_retried",
                 "_answers", "_negatives", "_digest_errors", "_last_error", "lac", "length", "_watch")

    def __init__(self, pool, digest: DigestManager, entry_id: int, replicas: Sequence[str],
                 callback: Callable, *, flags: int = 0, master_key: bytes | None = None,
                 speculative: SpeculativePolicy | None = None, heard: set | None = None,
                 on_error: Callable[[str], None] | None = None, watch: Callable | None = None):
        self.pool = pool
        self.digest = digest
        self.ledger_id = digest.ledger_id
        self.entry_id = entry_id
        self.replicas = list(replicas)
        self.callback = callback
        self.flags = flags
        self.master_key = master_key
        self.speculative = speculative
        self.heard = heard
        self.on_error = on_error
        self._next = 0  # replicas[:_next] have been asked
        self._outstanding = 0  # requests sent and not answered yet
        self._done = False  # the callback has run: every later answer is dropped
        self._timer = None  # the pending speculative timer
        self._retried: set[str] | None = None  # replicas asked again after a BATCH_READ drop
        self._answers: list[str] = []
        self._negatives = 0
        self._digest_errors = 0
        self._last_error: BKError | None = None
        self.lac = -1  # piggybacked LAC and cumulative length of the entry read
        self.length = 0
        self._watch = watch

    def start(self) -> "ReadEntryOp":
        if not self.replicas:
            self._finish_failed()
        else:
            self._begin(self._watch)
        return self

    def _policy(self) -> SpeculativePolicy | None:
        return self.speculative

    def _heard(self) -> set | None:
        return self.heard

    def _send(self, bookie: str) -> None:
        try:
            client = self.pool.get(bookie)
            client.send_read(self.ledger_id, self.entry_id, partial(self._on_response, bookie), flags=self.flags,
                             master_key=self.master_key)
        except BKError as e:
            self._on_response(bookie, None, e)

    def _on_response(self, bookie: str, response, err) -> None:
        if self._done:  # an answer after the outcome (a speculative race): only a failure is news
            if self.on_error is not None and (err is not None and not isinstance(err, BatchReadDropError)
                                              or err is None and response.rc != EOK):
                self.on_error(bookie)
            return
        self._outstanding -= 1
        if err is not None:
            if isinstance(err, BatchReadDropError):
                if self._retried is None or bookie not in self._retried:
                    self._retried = (self._retried or set()) | {bookie}
                    self._outstanding += 1
                    self._send(bookie)  # the same replica once more, on a new connection
                    return
            elif self.on_error is not None:
                self.on_error(bookie)
            self._last_error = err
            self._answers.append(f"{bookie}: {err}")
        else:
            if response.rc == EOK:
                try:
                    self.lac, self.length, payload = self.digest.verify_entry(self.entry_id, response.body)
                except DigestMismatchError as e:
                    self._digest_errors += 1
                    self._answers.append(f"{bookie}: {e}")
                else:
                    self._stop()
                    if self.heard is not None:
                        self.heard.add(bookie)
                    self.callback(self.entry_id, LedgerEntry(self.entry_id, bytes(payload)), None)
                    return
            elif response.rc in NEGATIVE:
                self._negatives += 1
                self._answers.append(f"{bookie}: {StatusCode(response.rc).name}")
            else:
                err = error_for_code(response.rc, ledger_id=self.ledger_id, entry_id=self.entry_id)
                self._last_error = err
                self._answers.append(f"{bookie}: {err.name}")
            if self.on_error is not None:
                self.on_error(bookie)
        if self._outstanding:
            return  # a speculative request is still out: wait for it before asking further
        if self._next < len(self.replicas):
            self._send_next()
        else:
            self._finish_failed()

    def _finish_failed(self) -> None:
        self._stop()
        where = f"ledger {self.ledger_id} entry {self.entry_id}"
        detail = "; ".join(self._answers) or "no replicas"
        if self._digest_errors:
            err: BKError = DigestMismatchError(f"{where}: no replica has a valid copy ({detail})")
        elif self._negatives == len(self.replicas):
            err = NoSuchEntryError(f"{where}: no such entry on any replica ({detail})",
                                   ledger_id=self.ledger_id, entry_id=self.entry_id)
        else:
            last = self._last_error
            cls = type(last) if isinstance(last, BookieError) else BookieIOError
            err = cls(f"{where}: no replica could be read ({detail})", ledger_id=self.ledger_id,
                      entry_id=self.entry_id)
        self.callback(self.entry_id, None, err)


class ReadRangeOp:
    """Reads `first..last` with at most `window` entries in flight.

    Where a segment stores every entry on every bookie (E == WQ), runs of up
    to `batch_entries` entries are asked with one BATCH_READ from the first
    replica; entries the answer lacks or that fail verification, and every
    entry of a failed batch, are read one by one (replica by replica). A bookie that
    refuses BATCH_READ (it predates 4.17: bookie_client's docstring) is read entry by
    entry from then on; the batch that met the refusal is read entry by entry too.
    With speculative reads, a batch unanswered in time also goes to the next replica
    (BatchReadOp); entry reads speculate on their own (ReadEntryOp)."""

    def __init__(self, pool, digest: DigestManager, first: int, last: int,
                 replicas_for: Callable[[int], Sequence[str]], window: int, *,
                 batch_end: Callable[[int], int | None] | None = None, batch_entries: int = 0,
                 max_frame_size_bytes: int = 0, speculative: SpeculativePolicy | None = None,
                 on_error: Callable[[str], None] | None = None):
        self.pool = pool
        self.speculative = speculative
        self.on_error = on_error
        self.heard: set[str] = set()  # bookies that returned entries to this operation
        self.digest = digest
        self.first = first
        self.last = last
        self.replicas_for = replicas_for
        self.window = max(1, window)
        self.batch_end = batch_end if batch_entries > 1 else None
        self.batch_entries = batch_entries
        self.max_frame_size_bytes = max_frame_size_bytes
        self.results: list[LedgerEntry | None] = [None] * (last - first + 1)
        self._loop = asyncio.get_running_loop()
        self.future = self._loop.create_future()
        self._next = first
        self._in_flight = 0
        self._done = 0
        self._watched: deque = deque()  # (due loop time, op) awaiting their first speculative look
        self._watch_timer = None
        self._watch_fn = self._watch if speculative is not None else None

    def start(self) -> asyncio.Future:
        if self.last < self.first:
            self.future.set_result([])
        else:
            self._fill()
        return self.future

    def _fill(self) -> None:
        while self._in_flight < self.window and self._next <= self.last and not self.future.done():
            entry_id = self._next
            end = self.batch_end(entry_id) if self.batch_end is not None else None
            if end is not None:
                count = min(self.batch_entries, min(end, self.last) - entry_id + 1)
                if count > self.window - self._in_flight and self._in_flight:
                    return  # wait for room for a whole batch rather than trickle single reads
                count = min(count, self.window - self._in_flight)
                if count > 1:
                    self._next += count
                    self._in_flight += count
                    self._batch(entry_id, count)
                    continue
            self._next += 1
            self._in_flight += 1
            self._single(entry_id)

    def _single(self, entry_id: int) -> None:
        replicas = order_replicas(self.replicas_for(entry_id), self.pool)
        ReadEntryOp(self.pool, self.digest, entry_id, replicas, self._entry_done, speculative=self.speculative,
                    heard=self.heard, on_error=self.on_error, watch=self._watch_fn).start()

    def _batch(self, start: int, count: int) -> None:
        BatchReadOp(self, start, count, order_replicas(self.replicas_for(start), self.pool)).start()

    def _watch(self, op: _Speculating) -> None:
        """Take `op`'s first speculative look after the policy's first delay."""
        watched = self._watched
        while watched and watched[0][1]._done:
            watched.popleft()  # answered already (reads mostly end in order): keep no finished op alive
        due = self._loop.time() + self.speculative.first_s
        watched.append((due, op))
        if self._watch_timer is None:
            self._watch_timer = self._loop.call_at(due, self._look)

    def _look(self) -> None:
        self._watch_timer = None
        if self.future.done():
            self._watched.clear()  # the outcome is out: nobody needs the rest
            return
        watched, first_s = self._watched, self.speculative.first_s
        now = self._loop.time() + 0.001  # loop timers fire to the millisecond
        while watched and watched[0][0] <= now:
            op = watched.popleft()[1]
            if not op._done:
                op._speculate(first_s)
        if watched and self._watch_timer is None:  # (a read started meanwhile may have armed it)
            self._watch_timer = self._loop.call_at(watched[0][0], self._look)

    def _entry_done(self, entry_id: int, entry, err) -> None:
        self._in_flight -= 1
        if self.future.done():
            return
        if err is not None:
            self.future.set_exception(err)
            return
        self.results[entry_id - self.first] = entry
        self._done += 1
        if self._done == len(self.results):
            self.future.set_result(self.results)
            if self._watch_timer is not None:
                self._watch_timer.cancel()
                self._watch_timer = None
                self._watched.clear()
        else:
            self._fill()


class BatchReadOp(_Speculating):
    """One BATCH_READ of `count` entries from `start` for a ReadRangeOp.

    Asks the first replica; with speculative reads, a batch unanswered in time also goes to
    the next one (ReadEntryOp's rules: not while an asked bookie answers this operation).
    The first EOK answer wins: its entries are verified one by one, and each entry it lacks
    or that fails verification is read singly. If every batch sent fails, all `count`
    entries are read singly (replica by replica, each with its own speculation)."""

    __slots__ = ("op", "first", "count", "replicas", "_next", "_outstanding", "_done", "_timer")

    def __init__(self, op: ReadRangeOp, start: int, count: int, replicas: Sequence[str]):
        self.op = op
        self.first = start
        self.count = count
        self.replicas = replicas
        self._next = 0
        self._outstanding = 0
        self._done = False
        self._timer = None

    def start(self) -> None:
        self._begin(self.op._watch_fn)

    def _policy(self) -> SpeculativePolicy | None:
        return self.op.speculative

    def _heard(self) -> set:
        return self.op.heard

    def _send(self, bookie: str) -> None:
        op = self.op
        client = None
        try:
            client = op.pool.get(bookie)
            client.send_batch_read(op.digest.ledger_id, self.first, self.count, op.max_frame_size_bytes,
                                   partial(self._answered, bookie, client))
        except BKError as e:  # BatchReadDropError at once when the bookie is known to refuse batches
            self._answered(bookie, client, None, e)

    def _answered(self, bookie: str, client, response, err) -> None:
        refused = isinstance(err, BatchReadDropError) or err is None and response.rc == EBADREQ
        if err is None and response.rc == EBADREQ:  # a well-formed batch: the op is unknown there
            client.refuse_batch_reads("answered BATCH_READ with EBADREQ")
        failed = err is not None or response.rc != EOK
        if failed and not refused and self.op.on_error is not None:
            self.op.on_error(bookie)
        if self._done:
            return  # a speculative race's loser
        self._outstanding -= 1
        if failed and self._outstanding:
            return  # another batch is still out
        self._stop()
        op = self.op
        got = [] if failed else response.entries
        if got:
            op.heard.add(bookie)
        start, count = self.first, self.count
        verify = op.digest.verify_entry
        for i, body in enumerate(got[:count]):
            try:
                _, _, payload = verify(start + i, body)
            except DigestMismatchError:
                op._single(start + i)  # another replica may have a valid copy
            else:
                op._entry_done(start + i, LedgerEntry(start + i, bytes(payload)), None)
        for entry_id in range(start + min(len(got), count), start + count):
            op._single(entry_id)
