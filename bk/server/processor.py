"""RequestProcessor: op code -> handler, between the codec and the Bookie.

ADDs take the synchronous callback path: no task or future per add. The
consecutive ADDs of one socket read go to the bookie as one run
(`add_run` -> `Bookie.add_entries_cb`): admitted in one accounting step,
checked per ledger once, journaled with one call, and answered by one
`_adds_done` per completion batch (all the run's accepted adds of one journal
share one). A lone ADD takes `Bookie.add_entry_cb` and `_add_done`. A plain READ
(v2 or v3) of an entry a cache holds is answered at once, a run of them in one
buffer (`read_run`, bk.server.single_reads); other reads and the other ops run as
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
import os
from operator import itemgetter
from time import monotonic

from bk import metrics

from bk.errors import (BookieError, BookieIOError, LedgerLimboError, NoSuchEntryError, StorageError,
                       TooManyRequestsError)
from bk.proto.layout import FLAG_DEFERRED_SYNC
from bk.proto import (FLAG_DO_FENCING, FLAG_RECOVERY_ADD, AddRequest, AuthRequest,
                      BatchReadRequest, BatchReadResponse, GetBookieInfoRequest, GetBookieInfoResponse,
                      ReadLacRequest, ReadLacResponse, ReadRequest, ReadResponse, WriteLacRequest,
                      WriteLacResponse, encode_response, encode_response_parts)
from bk.proto import v3
from bk.proto.v3 import V3AddRequest
from bk.server import single_reads
from bk.server.limits import BookieLimits
from bk.server.v3 import V3Processor
from bk.proto.layout import (BATCH_READ_ENTRY_LENGTH_BYTES, BATCH_READ_RESPONSE_HEADER_BYTES,
                             BOOKIE_INFO_FREE_DISK_SPACE, BOOKIE_INFO_TOTAL_DISK_CAPACITY)

log = logging.getLogger(__name__)

_EIO = BookieIOError.code
_BODY = itemgetter(4)  # AddRequest's (and V3AddRequest's) body field
# metrics: recorded once per completion batch of adds, once per read request
_ADD_REQUEST, _READ_REQUEST = metrics.ADD_ENTRY_REQUEST, metrics.READ_ENTRY_REQUEST
_WRITE_BYTES, _READ_BYTES = metrics.WRITE_BYTES, metrics.READ_BYTES


def _done_bytes(run: tuple, reqs: list) -> int:
    """Body bytes of the completed part `reqs` of an add run `(conn, n, nbytes, start)`.

    Completions split a run into disjoint parts, so a part of the run's size is all
    of it: its byte count is known without touching the (by now cold) bodies."""
    _conn, n, nbytes, _start = run
    return nbytes if len(reqs) == n else sum(map(len, map(_BODY, reqs)))


def _code(err: BaseException) -> int:
    if isinstance(err, BookieError):
        return err.code
    log.error("unexpected error serving a request: %r", err, exc_info=err)
    return _EIO


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
        self.v3 = V3Processor(self)
        self._handlers = {
            V3AddRequest: self._add,
            v3.Request: self.v3.dispatch,
            v3.V3ReadRequest: self._spawn_read,  # a plain v3 READ (bk.server.single_reads)
            AddRequest: self._add,
            ReadRequest: self._spawn_read,
            BatchReadRequest: self._spawn(self._batch_read, read=True, gated=True),
            ReadLacRequest: self._spawn(self._read_lac, read=True, gated=True),
            WriteLacRequest: self._spawn(self._write_lac),
            GetBookieInfoRequest: self._spawn(self._bookie_info),
            AuthRequest: self._auth,
        }
        self._spawn_gated_read = self._spawn(self._read, read=True, gated=True, cached=True)
        self._spawn_fencing_read = self._spawn(self._read, read=True)

    def dispatch(self, req, conn) -> None:
        self._handlers[type(req)](req, conn)

    # ------------------------------------------------------------ adds
    def _add(self, req: AddRequest, conn) -> None:
        nbytes = len(req.body)
        if not conn.begin_add(nbytes):
            conn.send_add_result(TooManyRequestsError.code, req)
            return
        if req.flags & FLAG_DEFERRED_SYNC:  # (v3) the batch path acknowledges it before the fsync
            self.bookie.add_entries_cb([req], self._adds_done, (conn, 1, nbytes, monotonic()))
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
        the bookie in one call (Bookie.add_entries_cb), answered per completion batch."""
        n = len(reqs)
        if n == 1 or conn.pending + n > 2 * conn.max_pending or not conn.begin_many(
                n, nbytes := sum(map(len, map(_BODY, reqs)))):
            # Near a refusal limit (or alone) each add is admitted or refused on its own,
            # exactly as one by one: an add that fails at once frees its slot for the next.
            for req in reqs:
                self._add(req, conn)
            return
        # Below the limits every add of the run would be admitted one by one too.
        self.bookie.add_entries_cb(reqs, self._adds_done, (conn, n, nbytes, monotonic()))

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
        without a task if a cache holds its entry when its turn comes."""
        def start_task(req, conn) -> None:
            if cached and single_reads.answer_cached(req, conn, self.bookie.read_cached):
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
        single_reads.serve_run((req,), conn, self.bookie, self._uncached, self._resume)

    def read_run(self, reqs: list, conn) -> None:
        """The requests of one socket read, all v2 READs or all v3 requests (READs mostly: a
        client's readEntries): the plain READs of cached entries answered at once, together
        (bk.server.single_reads), every other one as dispatch would, in order."""
        single_reads.serve_run(reqs, conn, self.bookie, self._uncached, self._resume)

    def _resume(self, req, conn) -> None:
        """A plain READ that waited for a read-ahead and still has to read (counted already):
        its read in one of the connection's read slots."""
        conn.run_read(self._spawn_gated_read.task if type(req) is ReadRequest else self.v3._start_gated, req)

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
                response = self._error(req, _code(err))
            finally:
                if read:
                    conn.end_read()
                else:
                    conn.end(0)
            conn.send(encode_response_parts(response, req.version))
        finally:
            if gated:  # after the send: the next read's room check counts this answer
                conn.read_done()

    @staticmethod
    def _error(req, rc: int):
        if isinstance(req, ReadRequest):
            return ReadResponse(rc, req.ledger_id, req.entry_id)
        if isinstance(req, BatchReadRequest):
            return BatchReadResponse(rc, req.ledger_id, req.start_entry_id, req.request_id, [])
        if isinstance(req, ReadLacRequest):
            return ReadLacResponse(rc, req.ledger_id)
        if isinstance(req, WriteLacRequest):
            return WriteLacResponse(rc, req.ledger_id)
        return GetBookieInfoResponse(rc)

    def _overloaded(self, req):
        return self._error(req, TooManyRequestsError.code)

    async def _read(self, req: ReadRequest, conn=None):
        bookie = self.bookie
        start = monotonic()
        try:
            if req.flags & FLAG_DO_FENCING:
                # Durable before the answer; the answer still carries the entry.
                await bookie.fence_ledger(req.ledger_id, req.master_key)
            try:
                body = await bookie.read_entry(req.ledger_id, req.entry_id)
            except BookieError as err:
                _READ_REQUEST.failure((monotonic() - start) * 1000.0)
                return ReadResponse(err.code, req.ledger_id, req.entry_id)
        except BaseException:
            _READ_REQUEST.failure((monotonic() - start) * 1000.0)
            raise
        _READ_REQUEST.success((monotonic() - start) * 1000.0)
        _READ_BYTES.inc(len(body))
        return ReadResponse(0, req.ledger_id, req.entry_id, body)

    async def _batch_read(self, req: BatchReadRequest, conn=None):
        start = monotonic()
        try:
            response = await self._batch_read_entries(req, conn is not None and conn.takes_spans)
        except BaseException:
            metrics.BATCH_READ_ENTRY_REQUEST.failure((monotonic() - start) * 1000.0)
            raise
        metrics.BATCH_READ_ENTRY_REQUEST.success((monotonic() - start) * 1000.0)
        return response

    async def _batch_read_entries(self, req: BatchReadRequest, spans: bool = False):
        bookie = self.bookie
        if req.flags & FLAG_DO_FENCING:
            await bookie.fence_ledger(req.ledger_id, req.master_key)
        entries: list[bytes] = []
        size = BATCH_READ_RESPONSE_HEADER_BYTES  # the response frame body's fixed part
        max_size = req.max_size or self.config.max_frame_size_bytes
        max_size = min(max_size, self.config.max_frame_size_bytes)
        eid = req.start_entry_id
        max_count = max(1, req.max_count)
        if spans and eid >= 0:
            # Entries only in the entry logs go out as the log's bytes (os.sendfile), unread.
            span = await bookie.read_span(req.ledger_id, eid, max_count, max_size - size)
            if span is not None:
                if await self._span_is_whole(req, span, size, max_size):
                    _READ_BYTES.inc(len(span) - BATCH_READ_ENTRY_LENGTH_BYTES * span.count)
                    return BatchReadResponse(0, req.ledger_id, eid, req.request_id, span)
                span.release()  # short: the entry-by-entry loop below answers all of them
        while len(entries) < max_count:
            try:
                entry = await bookie.read_entry(req.ledger_id, eid)
            except (NoSuchEntryError, LedgerLimboError, StorageError):
                if not entries:  # the first entry's own answer (EUNKNOWNLEDGERSTATE in limbo, EIO)
                    raise
                # serve what this bookie has; the reader asks again from there (and gets the
                # error of a damaged entry then, and reads it from another replica)
                break
            if entries and size + BATCH_READ_ENTRY_LENGTH_BYTES + len(entry) > max_size:
                break
            entries.append(entry)
            size += BATCH_READ_ENTRY_LENGTH_BYTES + len(entry)
            eid += 1
        _READ_BYTES.inc(size - BATCH_READ_RESPONSE_HEADER_BYTES - BATCH_READ_ENTRY_LENGTH_BYTES * len(entries))
        return BatchReadResponse(0, req.ledger_id, req.start_entry_id, req.request_id, entries)

    async def _span_is_whole(self, req: BatchReadRequest, span, size: int, max_size: int) -> bool:
        """Whether `span` is the whole answer a Java bookie gives: max_count entries, or the
        next entry is missing, unreadable (a later error ends a batch) or would not fit
        max_size. A span covers one stretch of one entry log, so a batch running into the
        next log or the write cache has more to answer (a 4.17 Java client hands a short
        answer to its caller as it is). Releases the span before raising (a cancelled await)."""
        if span.count >= max(1, req.max_count):
            return True
        try:
            nxt = await self.bookie.read_entry(req.ledger_id, req.start_entry_id + span.count)
        except (NoSuchEntryError, LedgerLimboError, StorageError):
            return True
        except BaseException:
            span.release()
            raise
        return size + len(span) + BATCH_READ_ENTRY_LENGTH_BYTES + len(nxt) > max_size

    async def _read_lac(self, req: ReadLacRequest, conn=None):
        bookie = self.bookie
        lac_buf = bookie.read_lac(req.ledger_id)
        try:
            last_entry = await bookie.read_entry(req.ledger_id, -1)
        except NoSuchEntryError:
            last_entry = None
        return ReadLacResponse(0, req.ledger_id, lac_buf, last_entry)

    async def _write_lac(self, req: WriteLacRequest, conn=None):
        await self.bookie.write_lac(req.ledger_id, req.master_key, req.lac_buf)
        return WriteLacResponse(0, req.ledger_id)

    async def _bookie_info(self, req: GetBookieInfoRequest, conn=None):
        free = total = 0
        for d in self.config.ledger_dirs:
            st = os.statvfs(d)
            free += st.f_bavail * st.f_frsize
            total += st.f_blocks * st.f_frsize
        return GetBookieInfoResponse(0, free if req.requested_info & BOOKIE_INFO_FREE_DISK_SPACE else 0,
                                     total if req.requested_info & BOOKIE_INFO_TOTAL_DISK_CAPACITY else 0)

    def _auth(self, req: AuthRequest, conn) -> None:
        conn.auth_request_v2(req)

    async def drain(self) -> None:
        """Wait for every running request task."""
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
