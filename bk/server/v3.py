"""V3Processor: the bookie's v3 (protobuf) operations other than ADD (bk/proto/v3.py).

v3 ADDs take the v2 add path (RequestProcessor.add_run, the bookie's batch
path) as V3AddRequest records; BookieConnection answers them in v3. Everything
else comes here as a parsed `Request`: ADD with a bad body, READ (fencing,
long poll, entry piggyback), WRITE_LAC, READ_LAC, GET_BOOKIE_INFO,
FORCE_LEDGER, GET_LIST_OF_ENTRIES_OF_LEDGER, AUTH and START_TLS.

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

from bk.errors import (BadRequestError, BookieError, LedgerLimboError, NoSuchEntryError, NoSuchLedgerError,
                       TooManyRequestsError)
from bk.proto import GetBookieInfoRequest
from bk.proto import v3
from bk.proto.layout import LAC_HEADER_LENGTH, MASTER_KEY_LENGTH
from bk.proto.v3 import OperationType as Op
from bk.server import single_reads

log = logging.getLogger(__name__)

LONG_POLL_MAX_S = 60.0
AUTH_DISABLED_PLUGIN_NAME = "AuthDisabledPlugin"  # BookKeeper's AuthProviderFactoryFactory name
_EBADREQ = BadRequestError.code


class _Refuse(Exception):
    """A handler's answer is this v2 status (with the body's ids)."""

    def __init__(self, code: int):
        self.code = code


def _check(ok: bool) -> None:
    if not ok:
        raise _Refuse(_EBADREQ)


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
        self._woken_polls: list = []  # long polls whose LAC moved, answered at the next loop iteration
        self._handlers = {
            Op.ADD_ENTRY: None,  # only malformed ADDs get here (add_record answered them already)
            Op.READ_ENTRY: self._read, Op.WRITE_LAC: self._write_lac, Op.READ_LAC: self._read_lac,
            Op.GET_BOOKIE_INFO: self._bookie_info, Op.FORCE_LEDGER: self._force_ledger,
            Op.GET_LIST_OF_ENTRIES_OF_LEDGER: self._list_entries,
        }

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
        handler = self._handlers.get(op)
        body = v3.REQUEST_BODY.get(op)
        if handler is None or not req.HasField(body):
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
        # A plain read answers with an entry: it starts in one of the connection's read
        # slots (BookieConnection.run_read); a fencing read is not held there.
        if op == Op.READ_ENTRY and not _fencing(req.readRequest):
            conn.run_read(self._start_gated, req)
        else:
            self._start(req, conn, handler, False, _READ if read else _OTHER)

    def _start_gated(self, req, conn) -> None:
        if not single_reads.answer_cached(req, conn, self.bookie.read_cached):  # cached by now: no task
            self._start(req, conn, self._read, True, _READ)

    def _start(self, req, conn, handler, gated: bool, kind: int) -> None:
        task = asyncio.ensure_future(self._run(handler, req, conn, gated, kind))
        tasks = self.processor._tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _run(self, handler, req, conn, gated: bool, kind: int) -> None:
        try:
            try:
                resp = await handler(req)
            except _Refuse as r:
                resp = v3.error_response(req, r.code)
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
        self._start(req, conn, self._read, False, _LONG_POLL)

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
        self._start(poll.req, poll.conn, self._read, False, _LONG_POLL)

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
    async def _read(self, req):
        r = req.readRequest
        flag = r.flag if r.HasField("flag") else 0  # an unset proto2 enum reads as its first value
        fencing = flag == v3.READ_FLAG_FENCE_LEDGER
        piggyback = flag == v3.READ_FLAG_ENTRY_PIGGYBACK
        _check(r.ledgerId >= 0 and r.entryId >= -1)
        _check(not fencing or len(r.masterKey) == MASTER_KEY_LENGTH)
        _check(not piggyback or (r.HasField("previousLAC") and r.entryId == -1))
        bookie = self.bookie
        resp = v3.response_for(req.header)
        out = resp.readResponse
        out.status, out.ledgerId, out.entryId = 0, r.ledgerId, r.entryId
        if fencing:
            await bookie.fence_ledger(r.ledgerId, r.masterKey)
        if r.HasField("previousLAC") and not fencing:  # a long poll, parked before if it had to wait
            known = bookie.last_add_confirmed(r.ledgerId)
            out.maxLAC = known
            if piggyback:
                if known > r.previousLAC:  # best effort: the next entry, if this bookie has it
                    try:
                        out.body = bytes(await bookie.read_entry(r.ledgerId, r.previousLAC + 1))
                        out.entryId = r.previousLAC + 1
                    except NoSuchEntryError:
                        pass
                return resp
        entry = await bookie.read_entry(r.ledgerId, r.entryId)
        if not r.HasField("previousLAC"):  # the answer is status, ids and body only: the reads kernel
            return single_reads.v3_answer(req, r.ledgerId, r.entryId, entry)
        # protobuf takes bytes only; a read-ahead entry is a view (bytes() of bytes is no copy)
        out.body = bytes(entry)
        return resp

    async def _write_lac(self, req):
        w = req.writeLacRequest
        _check(w.ledgerId >= 0 and w.lac >= -1 and len(w.masterKey) == MASTER_KEY_LENGTH)
        _check(len(w.body) >= LAC_HEADER_LENGTH and v3.LAC_IDS.unpack_from(w.body) == (w.ledgerId, w.lac))
        await self.bookie.write_lac(w.ledgerId, w.masterKey, w.body)
        resp = v3.response_for(req.header)
        resp.writeLacResponse.status, resp.writeLacResponse.ledgerId = 0, w.ledgerId
        return resp

    async def _read_lac(self, req):
        ledger_id = req.readLacRequest.ledgerId
        _check(ledger_id >= 0)
        bookie = self.bookie
        lac_buf = bookie.read_lac(ledger_id)  # ENOLEDGER, EUNKNOWNLEDGERSTATE in limbo
        try:
            last_entry = await bookie.read_entry(ledger_id, -1)
        except NoSuchEntryError:
            last_entry = None
        if lac_buf is None and last_entry is None:
            raise _Refuse(NoSuchEntryError.code)
        resp = v3.response_for(req.header)
        out = resp.readLacResponse
        out.status, out.ledgerId = 0, ledger_id
        if lac_buf is not None:
            out.lacBody = lac_buf
        if last_entry is not None:
            out.lastEntryBody = bytes(last_entry)
        return resp

    async def _bookie_info(self, req):
        requested = req.getBookieInfoRequest.requested
        info = await self.processor._bookie_info(GetBookieInfoRequest(0, requested))
        resp = v3.response_for(req.header)
        out = resp.getBookieInfoResponse
        out.status, out.totalDiskCapacity, out.freeDiskSpace = 0, info.total_disk_bytes, info.free_disk_bytes
        return resp

    async def _force_ledger(self, req):
        ledger_id = req.forceLedgerRequest.ledgerId
        _check(ledger_id >= 0)
        await self.bookie.force_ledger(ledger_id)  # its deferred-sync adds are durable from here
        resp = v3.response_for(req.header)
        resp.forceLedgerResponse.status, resp.forceLedgerResponse.ledgerId = 0, ledger_id
        return resp

    async def _list_entries(self, req):
        ledger_id = req.getListOfEntriesOfLedgerRequest.ledgerId
        _check(ledger_id >= 0)
        bookie = self.bookie
        if not bookie.ledger_exists(ledger_id):
            raise NoSuchLedgerError(ledger_id=ledger_id)
        if bookie.is_limbo(ledger_id):  # it may have lost entries: no list is the truth
            raise LedgerLimboError(ledger_id=ledger_id)
        # what is stored, not range(0, last + 1): one add at entry 2**62 must not cost 2**62
        ids = await bookie.stored_entry_ids(ledger_id)
        resp = v3.response_for(req.header)
        out = resp.getListOfEntriesOfLedgerResponse
        out.status, out.ledgerId = 0, ledger_id
        out.availabilityOfEntriesOfLedger = v3.encode_entries_availability(ids)
        return resp
