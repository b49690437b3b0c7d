"""V3Processor: the bookie's v3 (protobuf) edge for the operations other than ADD.

v3 ADDs take the v2 add path (RequestProcessor.add_run, the bookie's batch
path) as V3AddRequest records; BookieConnection answers them in v3. Everything
else comes here as a parsed `Request`: ADD with a bad body, READ (fencing,
long poll, entry piggyback), WRITE_LAC, READ_LAC, GET_BOOKIE_INFO,
FORCE_LEDGER, GET_LIST_OF_ENTRIES_OF_LEDGER, AUTH and START_TLS. This module
admits them (read slots, parked long polls, ETOOMANYREQUESTS); the operations
themselves are the ones v2 uses (bk.server.operations), reached through the
conversion of bk.proto.v3 (request_from_v3, response_to_v3).

Each answer echoes the request's header (so the client matches it by txnId),
carries BookKeeper's v3 status in Response.status and in the body's status,
and is accounted in the connection's backpressure like a v2 request
(refused with ETOOMANYREQUESTS above the limit). bk's layers raise v2 codes;
they become v3 codes here, through the one status table.

Long polls (a READ with previousLAC and no FENCE_LEDGER flag: BookKeeper's
isLongPollReadRequest) park as a `_LongPoll`: a watcher on the ledger's descriptor
(Bookie.wait_for_lac_update, woken by the add that moves the LAC) and one loop timer for
the request's timeOut (at most LONG_POLL_MAX_S). No task exists and nothing wakes while it
waits; when the LAC moves or the timer fires it is answered by the ordinary read (the known
LAC, the piggybacked entry) in a task. At most `max_long_polls` are parked bookie-wide
(BookieLimits); more are answered ETOOMANYREQUESTS. A lost connection cancels its own.

Where bk differs from BookKeeper (docs/PROTOCOL-EXTENSIONS.md, "v3"):
- long polls are counted against `max_long_polls`, not against the reads in progress
  (BookKeeper counts them as reads while they wait);
- none for FORCE_LEDGER: as BookKeeper, an ADD with writeFlags DEFERRED_SYNC is acknowledged
  before the journal's fsync and FORCE_LEDGER answers once every such add of the ledger
  acknowledged before it is durable (Bookie.force_ledger, bk/bookie/deferred_sync.py).
"""
from __future__ import annotations

import asyncio
import logging

from bk.errors import BadRequestError, BookieError, TooManyRequestsError
from bk.proto import ReadResponse
from bk.proto import v3
from bk.proto.v3 import OperationType as Op
from bk.server import single_reads

log = logging.getLogger(__name__)

LONG_POLL_MAX_S = 60.0
AUTH_DISABLED_PLUGIN_NAME = "AuthDisabledPlugin"  # BookKeeper's AuthProviderFactoryFactory name
_EBADREQ = BadRequestError.code


def _fencing(r) -> bool:
    return r.HasField("flag") and r.flag == v3.READ_FLAG_FENCE_LEDGER


def _long_poll(r) -> bool:
    """BookKeeper's RequestUtils.isLongPollReadRequest: previousLAC set, not a fencing read."""
    return r.HasField("previousLAC") and not _fencing(r)


# How a request is accounted (what _run ends)
_OTHER, _READ, _LONG_POLL = 0, 1, 2
_PARKED, _WOKEN, _CANCELLED = 0, 1, 2


class _LongPoll:
    """A parked long poll: the LAC watcher (called as `poll(lac)`) and the timeout timer."""

    __slots__ = ("owner", "req", "conn", "desc", "timer", "state")

    def __init__(self, owner, req, conn):
        self.owner = owner
        self.req = req
        self.conn = conn
        self.desc = None  # the LedgerDescriptor it is registered on
        self.timer = None
        self.state = _PARKED

    def __call__(self, lac: int) -> None:
        """The LAC passed previousLAC (called inside the add path: only queue the answer)."""
        if self.state == _PARKED:
            self.state = _WOKEN
            self.timer.cancel()
            self.owner._woken(self)

    def expire(self) -> None:
        """The timeOut passed: answer with what the bookie knows."""
        if self.state == _PARKED:
            self.state = _WOKEN
            self.desc.cancel_wait_for_lac_update(self)
            self.owner._answer_long_poll(self)

    def cancel(self) -> None:
        """The connection is gone: no answer; the watcher and the timer go, the count drops."""
        if self.state != _CANCELLED:
            was_parked = self.state == _PARKED
            self.state = _CANCELLED
            self.timer.cancel()
            self.desc.cancel_wait_for_lac_update(self)
            if was_parked:  # a woken one is ended by _answer_long_poll when its turn comes
                self.owner._end_long_poll(self.conn)


class V3Processor:
    def __init__(self, processor):
        self.processor = processor  # the RequestProcessor: bookie, config, task set
        self.bookie = processor.bookie
        self.limits = processor.limits
        self.operations = processor.operations  # the handlers v2 shares (bk.server.operations)
        self._woken_polls: list = []  # long polls whose LAC moved, answered at the next loop iteration

    def dispatch(self, req, conn) -> None:
        if req.header.operation == Op.READ_ENTRY:  # a cached entry is answered at once (no task)
            self.processor.read_run((req,), conn)
        else:
            self.dispatch_uncached(req, conn)

    def dispatch_uncached(self, req, conn) -> None:
        """Every request but the plain READs bk.server.single_reads answered from a cache."""
        op = req.header.operation
        if op == Op.AUTH:
            conn.auth_request_v3(req)
            return
        if op == Op.START_TLS:
            conn.start_tls_v3(req)
            return
        # only malformed ADDs get here among ADDs (add_record answered them already)
        if op not in v3.SERVED or not req.HasField(v3.REQUEST_BODY[op]):
            log.info("answering EBADREQ to a v3 %s request without its body from %s", Op(op).name
                     if op in Op._value2member_map_ else op, conn.peer)
            conn.send(v3.frame(v3.error_response(req, _EBADREQ)))
            return
        if op == Op.READ_ENTRY and _long_poll(req.readRequest):
            self._park(req, conn)
            return
        read = op == Op.READ_ENTRY or op == Op.READ_LAC
        if not (conn.begin_read() if read else conn.begin(0)):
            conn.send(v3.frame(v3.error_response(req, TooManyRequestsError.code)))
            return
        # A plain read and a READ_LAC answer with an entry: they start in one of the
        # connection's read slots (BookieConnection.run_read), as on v2; a fencing read
        # is not held there.
        if op == Op.READ_ENTRY and not _fencing(req.readRequest):
            conn.run_read(self._start_gated, req)
        elif op == Op.READ_LAC:
            conn.run_read(self._start_lac_gated, req)
        else:
            self._start(req, conn, False, _READ if read else _OTHER)

    def _start_gated(self, req, conn) -> None:
        # cached by now, or cold and plain (a batch in the read threads): no task
        if not (single_reads.answer_cached(req, conn, self.bookie.read_cached)
                or self.processor.cold.start(req, conn)):
            self._start(req, conn, True, _READ)

    def _start_lac_gated(self, req, conn) -> None:
        self._start(req, conn, True, _READ)

    def _start(self, req, conn, gated: bool, kind: int) -> None:
        task = asyncio.ensure_future(self._run(req, conn, gated, kind))
        tasks = self.processor._tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _run(self, req, conn, gated: bool, kind: int) -> None:
        try:
            try:
                resp = await self._serve(req)
            except BookieError as err:
                resp = v3.error_response(req, err.code)
            except Exception as err:  # every request gets an answer, never an explicit negative
                log.error("unexpected error serving a v3 request: %r", err, exc_info=err)
                resp = v3.error_response(req, BookieError.code)
            finally:
                if kind == _READ:
                    conn.end_read()
                elif kind == _LONG_POLL:
                    self._end_long_poll(conn)
                else:
                    conn.end(0)
            conn.send(v3.frame(resp) if type(resp) is v3.Response else resp)  # else encoded (single_reads)
        finally:
            if gated:  # after the send: the next read's room check counts this answer
                conn.read_done()

    # ------------------------------------------------------------ long polls
    def _park(self, req, conn) -> None:
        """Admit a long poll and park it on the ledger's LAC, or answer it now (the LAC already
        passed previousLAC, no timeOut, or an error the read reports)."""
        if not conn.begin(0):
            conn.send(v3.frame(v3.error_response(req, TooManyRequestsError.code)))
            return
        if not self.limits.admit_long_poll():
            conn.end(0)
            conn.send(v3.frame(v3.error_response(req, TooManyRequestsError.code)))
            return
        r = req.readRequest
        timeout_ms = r.timeOut if r.HasField("timeOut") else 0
        poll = _LongPoll(self, req, conn)
        if timeout_ms > 0 and r.ledgerId >= 0:
            try:
                poll.desc = self.bookie.wait_for_lac_update(r.ledgerId, r.previousLAC, poll)
            except BookieError:
                pass  # ENOLEDGER, limbo: the read answers it
            if poll.desc is not None:
                poll.timer = asyncio.get_running_loop().call_later(min(timeout_ms / 1000.0, LONG_POLL_MAX_S),
                                                                   poll.expire)
                conn.long_polls.add(poll)
                return
        self._start(req, conn, False, _LONG_POLL)

    def _woken(self, poll) -> None:
        """From the add path (LedgerDescriptor): answer at the next loop iteration, all at once."""
        if not self._woken_polls:
            asyncio.get_running_loop().call_soon(self._answer_woken)
        self._woken_polls.append(poll)

    def _answer_woken(self) -> None:
        polls, self._woken_polls = self._woken_polls, []
        for poll in polls:
            self._answer_long_poll(poll)

    def _answer_long_poll(self, poll) -> None:
        """A parked long poll's LAC moved or its time is up: the read answers it (known LAC,
        the entry previousLAC + 1 with ENTRY_PIGGYBACK, the entry asked for without)."""
        if poll.state == _CANCELLED:  # its connection went while it was queued
            self._end_long_poll(poll.conn)
            return
        poll.conn.long_polls.discard(poll)
        self._start(poll.req, poll.conn, False, _LONG_POLL)

    def _end_long_poll(self, conn) -> None:
        self.limits.long_polls -= 1
        conn.end(0)

    @staticmethod
    def wake_long_polls(connections) -> int:
        """Answer every long poll parked for `connections` now with what the bookie knows (a
        stopping bookie need not wait out their timeOut); returns how many."""
        polls = [p for conn in list(connections) for p in conn.long_polls]
        for poll in polls:
            poll.expire()
        return len(polls)

    # ------------------------------------------------------------ operations
    async def _serve(self, req):
        """A v3 request through the one operations table (bk.server.operations): converted to
        its neutral request and back at this edge (bk.proto.v3). An EOK READ answer is encoded
        by the reads kernel (bk.server.single_reads), as a cached one is."""
        msg = v3.request_from_v3(req)  # V3RequestError (EBADREQ) when it cannot be served as asked
        answer = await self.operations.handlers[type(msg)](msg)
        if type(answer) is ReadResponse and answer.rc == 0:
            return single_reads.v3_answer(req, answer.ledger_id, answer.entry_id, answer.body)
        return v3.response_to_v3(req.header, answer)
