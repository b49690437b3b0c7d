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

Where bk differs from BookKeeper (docs/PROTOCOL-EXTENSIONS.md, "v3"):
- long-poll reads wait for the ledger's LAC by polling it every
  LONG_POLL_INTERVAL_S (BookKeeper registers a watcher), at most
  LONG_POLL_MAX_S;
- FORCE_LEDGER answers EOK at once: bk acknowledges an add only once it is
  durable (DEFERRED_SYNC adds are made durable like any other), so every
  acknowledged entry already is.
"""
from __future__ import annotations

import asyncio
import logging
import time

from bk.errors import (BadRequestError, BookieError, LedgerLimboError, NoSuchEntryError, NoSuchLedgerError,
                       TooManyRequestsError)
from bk.proto import GetBookieInfoRequest
from bk.proto import v3
from bk.proto.layout import LAC_HEADER_LENGTH, MASTER_KEY_LENGTH
from bk.proto.v3 import OperationType as Op

log = logging.getLogger(__name__)

LONG_POLL_INTERVAL_S = 0.005
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


def _plain_read(r) -> bool:
    """A v3 ReadRequest that is neither a long poll nor a fencing read."""
    return not r.HasField("previousLAC") and not (r.HasField("flag") and r.flag == v3.READ_FLAG_FENCE_LEDGER)


class V3Processor:
    def __init__(self, processor):
        self.processor = processor  # the RequestProcessor: bookie, config, task set
        self.bookie = processor.bookie
        self._handlers = {
            Op.ADD_ENTRY: None,  # only malformed ADDs get here (add_record answered them already)
            Op.READ_ENTRY: self._read, Op.WRITE_LAC: self._write_lac, Op.READ_LAC: self._read_lac,
            Op.GET_BOOKIE_INFO: self._bookie_info, Op.FORCE_LEDGER: self._force_ledger,
            Op.GET_LIST_OF_ENTRIES_OF_LEDGER: self._list_entries,
        }

    def dispatch(self, req, conn) -> None:
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
        if not conn.begin(0):
            conn.send(v3.frame(v3.error_response(req, TooManyRequestsError.code)))
            return
        # A plain read answers with an entry: it starts in one of the connection's read
        # slots (BookieConnection.run_read); a long poll or a fencing read is not held there.
        if op == Op.READ_ENTRY and _plain_read(req.readRequest):
            conn.run_read(self._start_gated, req)
        else:
            self._start(req, conn, handler, False)

    def _start_gated(self, req, conn) -> None:
        self._start(req, conn, self._read, True)

    def _start(self, req, conn, handler, gated: bool) -> None:
        task = asyncio.ensure_future(self._run(handler, req, conn, gated))
        tasks = self.processor._tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _run(self, handler, req, conn, gated: bool) -> None:
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
                conn.end(0)
            conn.send(v3.frame(resp))
        finally:
            if gated:  # after the send: the next read's room check counts this answer
                conn.read_done()

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
        if r.HasField("previousLAC"):
            known = await self._wait_for_lac(r.ledgerId, r.previousLAC, r.timeOut if r.HasField("timeOut") else 0)
            out.maxLAC = known
            if piggyback:
                if known > r.previousLAC:  # best effort: the next entry, if this bookie has it
                    try:
                        out.body = bytes(await bookie.read_entry(r.ledgerId, r.previousLAC + 1))
                        out.entryId = r.previousLAC + 1
                    except NoSuchEntryError:
                        pass
                return resp
        # protobuf takes bytes only; a read-ahead entry is a view (bytes() of bytes is no copy)
        out.body = bytes(await bookie.read_entry(r.ledgerId, r.entryId))
        return resp

    async def _wait_for_lac(self, ledger_id: int, previous_lac: int, timeout_ms: int) -> int:
        """The ledger's LAC once above previous_lac, or when timeout_ms passed."""
        bookie = self.bookie
        deadline = time.monotonic() + min(max(timeout_ms, 0) / 1000.0, LONG_POLL_MAX_S)
        while True:
            known = bookie.last_add_confirmed(ledger_id)
            if known > previous_lac or time.monotonic() >= deadline:
                return known
            await asyncio.sleep(LONG_POLL_INTERVAL_S)

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
