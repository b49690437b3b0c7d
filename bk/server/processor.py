"""RequestProcessor: op code -> handler, between the codec and the Bookie.

ADDs take the synchronous callback path: no task or future per add. The
consecutive ADDs of one socket read go to the bookie as one run
(`add_run` -> `Bookie.add_run`, an AddRun): admitted in one accounting step,
checked per ledger once, journaled with one call, and answered by one
`_adds_done` per completion batch (all the run's accepted adds of one journal
share one). A lone ADD takes `Bookie.add_entry_cb` and `_add_done`. A plain READ
(v2 or v3) of an entry a cache holds is answered at once, a run of them in one
buffer (`read_run`, bk.server.single_reads); a plain READ no cache holds is read in a
batch by the read threads (bk.server.cold_reads); other reads and the other ops run as
tasks.

Every handler answers exactly once, with the request's ids and version, and
turns a BookieError into its wire code; anything unexpected is logged and
answered EIO (never an explicit negative).

Adds and reads are admitted against the connection's limits and the bookie-wide
ones (`limits`, one BookieLimits shared by every connection: bk.server.limits);
a refused request is answered ETOOMANYREQUESTS and changes nothing.
"""
from __future__ import annotations

import asyncio
import logging
from itertools import groupby
from operator import itemgetter
from time import monotonic

from bk import metrics

from bk.errors import BookieError, BookieIOError, TooManyRequestsError
from bk.formats.wire import FLAG_DEFERRED_SYNC
from bk.proto import (FLAG_DO_FENCING, FLAG_RECOVERY_ADD, AddRequest, AuthRequest, BatchReadRequest,
                      GetBookieInfoRequest, ReadLacRequest, ReadRequest, WriteLacRequest, encode_response,
                      encode_response_parts)
from bk.bookie import AddRun
from bk.proto import v3
from bk.proto.v3 import V3AddRequest
from bk.server import single_reads
from bk.server.cold_reads import ColdReads
from bk.server.limits import BookieLimits
from bk.server.operations import Operations, error_answer
from bk.server.v3 import V3Processor

log = logging.getLogger(__name__)

_EIO = BookieIOError.code
_BODY = itemgetter(4)  # AddRequest's (and V3AddRequest's) body field
# metrics: recorded once per completion batch of adds, once per read request
_ADD_REQUEST, _READ_REQUEST = metrics.ADD_ENTRY_REQUEST, metrics.READ_ENTRY_REQUEST
_WRITE_BYTES = metrics.WRITE_BYTES


def _done_bytes(run: tuple, reqs: list) -> int:
    """Body bytes of the completed part `reqs` of an add run `(conn, n, nbytes, start)`.

    Completions split a run into disjoint parts, so a part of the run's size is all
    of it: its byte count is known without touching the (by now cold) bodies."""
    _conn, n, nbytes, _start = run
    return nbytes if len(reqs) == n else sum(map(len, map(_BODY, reqs)))


def _deferred_flag(req) -> bool:
    return bool(req.flags & FLAG_DEFERRED_SYNC)


def _code(err: BaseException) -> int:
    if isinstance(err, BookieError):
        return err.code
    log.error("unexpected error serving a request: %r", err, exc_info=err)
    return _EIO


def _on(operation):
    """An operation (bk.server.operations) as a `handler(req, conn)` of `_spawn`."""
    def handler(req, conn):
        return operation(req)
    return handler


def _add_measured(n: int, nbytes: int, start: float, err) -> None:
    """Metrics of n completed adds of `nbytes` bytes that arrived at `start`."""
    ms = (monotonic() - start) * 1000.0
    if err is None:
        _ADD_REQUEST.record_many(n, ms)
        _WRITE_BYTES.inc(nbytes)
    else:
        _ADD_REQUEST.record_many(n, ms, False)


class RequestProcessor:
    def __init__(self, bookie, config):
        self.bookie = bookie
        self.config = config
        self._tasks: set[asyncio.Task] = set()
        self.limits = BookieLimits(config)
        self.operations = ops = Operations(bookie, config)  # one handler per operation (v2 and v3)
        self.v3 = V3Processor(self)
        self._handlers = {
            V3AddRequest: self._add,
            v3.Request: self.v3.dispatch,
            v3.V3ReadRequest: self._spawn_read,  # a plain v3 READ (bk.server.single_reads)
            AddRequest: self._add,
            ReadRequest: self._spawn_read,
            BatchReadRequest: self._spawn(self._batch_read, read=True, gated=True),
            ReadLacRequest: self._spawn(_on(ops.read_lac), read=True, gated=True),
            WriteLacRequest: self._spawn(_on(ops.write_lac)),
            GetBookieInfoRequest: self._spawn(_on(ops.bookie_info)),
            AuthRequest: self._auth,
        }
        self.cold = ColdReads(bookie, config)  # plain READs no cache holds: batches in the read threads
        self._spawn_gated_read = self._spawn(_on(ops.read), read=True, gated=True, cached=True)
        self._spawn_fencing_read = self._spawn(_on(ops.read), read=True)

    def dispatch(self, req, conn) -> None:
        self._handlers[type(req)](req, conn)

    # ------------------------------------------------------------ adds
    # The bookie takes AddRuns (bk.bookie.adds): the wire's AddRequest / V3AddRequest records
    # as they are, in arrival order, and whether they are DEFERRED_SYNC, which only v3 can
    # ask for (writeFlags): a v2 header's flags are never read for it. A lone ADD takes the
    # bookie's one-add primitive, add_entry_cb (same admission; as a run of one it cost the
    # loop 40% more CPU: the AddRun and completion wrappers, `python -m bench.lone_add`),
    # unless it is DEFERRED_SYNC.
    def _add(self, req: AddRequest, conn) -> None:
        nbytes = len(req.body)
        if not conn.begin_add(nbytes):
            conn.send_add_result(TooManyRequestsError.code, req)
            return
        if req.flags & FLAG_DEFERRED_SYNC and type(req) is V3AddRequest:  # acknowledged before the fsync
            self.bookie.add_run(AddRun([req], True), self._adds_done, (conn, 1, nbytes, monotonic()))
            return
        self.bookie.add_entry_cb(req.ledger_id, req.entry_id, req.body, req.master_key,
                                 bool(req.flags & FLAG_RECOVERY_ADD), self._add_done,
                                 (conn, req, nbytes, monotonic()))

    @staticmethod
    def _add_done(ctx, err) -> None:
        conn, req, nbytes, start = ctx
        conn.end_add(nbytes)
        conn.send_add_result(0 if err is None else _code(err), req)
        _add_measured(1, nbytes, start, err)

    def add_run(self, reqs: list, conn) -> None:
        """A run of consecutive ADDs from one socket read: admitted together, handed to
        the bookie in one call (Bookie.add_run), answered per completion batch."""
        n = len(reqs)
        if n == 1 or conn.pending + n > 2 * conn.max_pending or not conn.begin_many(
                n, nbytes := sum(map(len, map(_BODY, reqs)))):
            # Near a refusal limit (or alone) each add is admitted or refused on its own,
            # exactly as one by one: an add that fails at once frees its slot for the next.
            for req in reqs:
                self._add(req, conn)
            return
        # Below the limits every add of the run would be admitted one by one too.
        start = monotonic()
        if type(reqs[0]) is V3AddRequest and any(r.flags & FLAG_DEFERRED_SYNC for r in reqs):
            # (a run is all v2 or all v3) stretches that agree on DEFERRED_SYNC, in order
            for deferred, part in groupby(reqs, _deferred_flag):
                part = list(part)
                self.bookie.add_run(AddRun(part, deferred), self._adds_done,
                                    (conn, len(part), sum(map(len, map(_BODY, part))), start))
            return
        self.bookie.add_run(AddRun(reqs), self._adds_done, (conn, n, nbytes, start))

    @staticmethod
    def _adds_done(run, reqs: list, err) -> None:
        """Completion of adds of one run sharing an outcome; the connection encodes the
        answers in the run's protocol (a run is all v2 or all v3 requests)."""
        conn = run[0]
        nbytes = _done_bytes(run, reqs)
        conn.end_many(len(reqs), nbytes)
        conn.send_add_results(reqs, 0 if err is None else _code(err))
        _add_measured(len(reqs), nbytes, run[3], err)

    # ------------------------------------------------------------ everything else
    def _spawn(self, handler, read: bool = False, gated: bool = False, cached: bool = False):
        """`handler(req)` as a task answering on `conn`; `read`: counted as a read in progress
        (bookie-wide too); `gated`: it answers with entries, so it starts in one of the
        connection's read slots (BookieConnection.run_read); `cached`: a plain READ, answered
        without a task if a cache holds its entry when its turn comes, else read in a batch
        by the read threads (bk.server.cold_reads), no task either."""
        def start_task(req, conn) -> None:
            if cached and (single_reads.answer_cached(req, conn, self.bookie.read_cached)
                           or self.cold.start(req, conn)):
                return
            task = asyncio.ensure_future(self._run(handler, req, conn, gated, read))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        def start(req, conn) -> None:
            if not (conn.begin_read() if read else conn.begin(0)):
                conn.send(encode_response(self._overloaded(req), req.version))
            elif gated:
                conn.run_read(start_task, req)
            else:
                start_task(req, conn)
        start.task = start_task  # for a request counted already (_resume)
        return start

    def _spawn_read(self, req: ReadRequest, conn) -> None:
        # A plain read of a cached entry is answered without a task, while the client
        # reads its answers (else the read waits for room in a read slot).
        single_reads.serve_run((req,), conn, self.bookie, self._uncached, self._resume, self.cold)

    def read_run(self, reqs: list, conn) -> None:
        """The requests of one socket read, all v2 READs or all v3 requests (READs mostly: a
        client's readEntries): the plain READs of cached entries answered at once, together
        (bk.server.single_reads), every other one as dispatch would, in order."""
        single_reads.serve_run(reqs, conn, self.bookie, self._uncached, self._resume, self.cold)

    def _resume(self, req, conn) -> None:
        """A plain READ that waited for a read-ahead and still has to read (counted already):
        its read in one of the connection's read slots (bk.server.cold_reads)."""
        conn.run_read(self.cold.run, req)

    def _uncached(self, req, conn) -> None:
        if type(req) is not ReadRequest:
            self.v3.dispatch_uncached(req, conn)
        else:  # a fencing read (recovery) is not held behind a slow client's output
            (self._spawn_fencing_read if req.flags & FLAG_DO_FENCING else self._spawn_gated_read)(req, conn)

    async def _run(self, handler, req, conn, gated: bool, read: bool) -> None:
        try:
            try:
                response = await handler(req, conn)
            except Exception as err:  # every request gets an answer
                response = error_answer(req, _code(err))
            finally:
                if read:
                    conn.end_read()
                else:
                    conn.end(0)
            conn.send(encode_response_parts(response, req.version))
        finally:
            if gated:  # after the send: the next read's room check counts this answer
                conn.read_done()

    def _overloaded(self, req):
        return error_answer(req, TooManyRequestsError.code)

    def _batch_read(self, req: BatchReadRequest, conn):
        return self.operations.batch_read(req, conn.takes_spans)  # entry-log bytes unread (sendfile)

    def _auth(self, req: AuthRequest, conn) -> None:
        conn.auth_request_v2(req)

    async def drain(self) -> None:
        """Wait for every running request task and every cold READ queued."""
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self.cold.drain()
