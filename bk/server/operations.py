"""Operations: one handler per wire operation, shared by the v2 and v3 protocols.

Each handler takes a version-neutral request (bk.proto.messages: the v2 message shapes, plus
the v3-only LongPollReadRequest, ForceLedgerRequest and GetListOfEntriesRequest) and returns
the neutral answer, as BookKeeper's `proto/*Processor` classes each serve one operation. The
protocols only translate at the edge: bk.server.processor (v2) takes the requests the v2 codec
decoded and encodes the answers with it; bk.server.v3 converts a protobuf Request with
bk.proto.v3.request_from_v3 and the answer with response_to_v3. How a request is admitted
(a read slot, a parked long poll, ETOOMANYREQUESTS) stays with the protocol's processor.

A handler either returns an answer (an error a read reports for its entry is an answer with
that code) or raises a BookieError, which the caller answers with `error_answer` (v2) or
v3.error_response (v3): the request's ids with the error's code. ADD is not here: adds take
the run path (RequestProcessor.add_run -> Bookie.add_entries_cb), which answers without a task.

The fast paths do not come here: a plain READ a cache holds is answered by the reads kernel
(bk.server.single_reads), and a v3 READ's EOK answer is encoded by it too (v3.py).

To add a wire operation: its neutral request and answer (messages.py), its v2 layout
(layout.py, codec.py) and/or its v3 conversion (the `_OPERATIONS` table of bk/proto/v3.py), its
handler and a row in `Operations.handlers` and `ERROR_ANSWERS` here.
"""
from __future__ import annotations

import logging
from time import monotonic

from bk import metrics
from bk.fileio import on_space_thread, total_space
from bk.errors import BookieError, LedgerLimboError, NoSuchEntryError, NoSuchLedgerError, StorageError
from bk.proto import (FLAG_DO_FENCING, BatchReadRequest, BatchReadResponse, GetBookieInfoRequest,
                      GetBookieInfoResponse, ReadLacRequest, ReadLacResponse, ReadRequest, ReadResponse,
                      WriteLacRequest, WriteLacResponse)
from bk.formats.wire import (BATCH_READ_ENTRY_LENGTH_BYTES, BATCH_READ_RESPONSE_HEADER_BYTES,
                             BOOKIE_INFO_FREE_DISK_SPACE, BOOKIE_INFO_TOTAL_DISK_CAPACITY)
from bk.proto.messages import (ForceLedgerRequest, ForceLedgerResponse, GetListOfEntriesRequest,
                               GetListOfEntriesResponse, LongPollReadRequest, LongPollReadResponse)

log = logging.getLogger(__name__)

_READ_REQUEST, _READ_BYTES = metrics.READ_ENTRY_REQUEST, metrics.READ_BYTES

# The error answer to each request: its ids with the code (a BookieError a handler raised,
# ETOOMANYREQUESTS at admission).
ERROR_ANSWERS = {
    ReadRequest: lambda req, rc: ReadResponse(rc, req.ledger_id, req.entry_id),
    BatchReadRequest: lambda req, rc: BatchReadResponse(rc, req.ledger_id, req.start_entry_id, req.request_id, []),
    ReadLacRequest: lambda req, rc: ReadLacResponse(rc, req.ledger_id),
    WriteLacRequest: lambda req, rc: WriteLacResponse(rc, req.ledger_id),
    GetBookieInfoRequest: lambda req, rc: GetBookieInfoResponse(rc),
    LongPollReadRequest: lambda req, rc: LongPollReadResponse(rc, req.ledger_id, req.entry_id, None, None),
    ForceLedgerRequest: lambda req, rc: ForceLedgerResponse(rc, req.ledger_id),
    GetListOfEntriesRequest: lambda req, rc: GetListOfEntriesResponse(rc, req.ledger_id),
}


def error_answer(req, rc: int):
    """The neutral answer to `req` carrying error code `rc` (v2 codes, as every layer speaks)."""
    return ERROR_ANSWERS[type(req)](req, rc)


class Operations:
    """The bookie's operations other than ADD, each `async handler(request) -> answer`."""

    def __init__(self, bookie, config):
        self.bookie = bookie
        self.config = config
        # request type -> handler: the one table both protocols dispatch through
        self.handlers = {
            ReadRequest: self.read,
            BatchReadRequest: self.batch_read,
            ReadLacRequest: self.read_lac,
            WriteLacRequest: self.write_lac,
            GetBookieInfoRequest: self.bookie_info,
            LongPollReadRequest: self.long_poll_read,
            ForceLedgerRequest: self.force_ledger,
            GetListOfEntriesRequest: self.list_entries,
        }

    async def read(self, req: ReadRequest) -> ReadResponse:
        """READ (v2 and v3): a fencing read fences durably before it answers, with the entry."""
        bookie = self.bookie
        start = monotonic()
        try:
            if req.flags & FLAG_DO_FENCING:
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

    async def long_poll_read(self, req: LongPollReadRequest) -> LongPollReadResponse:
        """A long poll's answer once it was parked until the LAC passed previous_lac (or its time
        was up; bk.server.v3): the known LAC, and with `piggyback` the entry previous_lac + 1 if
        this bookie has it (best effort), else the entry asked for."""
        bookie = self.bookie
        known = bookie.last_add_confirmed(req.ledger_id)
        if req.piggyback:
            if known > req.previous_lac:
                try:
                    body = await bookie.read_entry(req.ledger_id, req.previous_lac + 1)
                    return LongPollReadResponse(0, req.ledger_id, req.previous_lac + 1, body, known)
                except NoSuchEntryError:
                    pass
            return LongPollReadResponse(0, req.ledger_id, req.entry_id, None, known)
        body = await bookie.read_entry(req.ledger_id, req.entry_id)
        return LongPollReadResponse(0, req.ledger_id, req.entry_id, body, known)

    async def batch_read(self, req: BatchReadRequest, spans: bool = False) -> BatchReadResponse:
        """BATCH_READ (v2 only); `spans`: the connection can send entry-log bytes unread."""
        start = monotonic()
        try:
            response = await self._batch_read_entries(req, spans)
        except BaseException:
            metrics.BATCH_READ_ENTRY_REQUEST.failure((monotonic() - start) * 1000.0)
            raise
        metrics.BATCH_READ_ENTRY_REQUEST.success((monotonic() - start) * 1000.0)
        return response

    async def _batch_read_entries(self, req: BatchReadRequest, spans: bool = False) -> BatchReadResponse:
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

    async def read_lac(self, req: ReadLacRequest) -> ReadLacResponse:
        """READ_LAC: the explicit LAC buffer and the last entry, either None when the bookie has
        none (v3 answers ENOENTRY when it has neither, as BookKeeper's ReadLacProcessorV3)."""
        bookie = self.bookie
        lac_buf = bookie.read_lac(req.ledger_id)  # ENOLEDGER, EUNKNOWNLEDGERSTATE in limbo
        try:
            last_entry = await bookie.read_entry(req.ledger_id, -1)
        except NoSuchEntryError:
            last_entry = None
        return ReadLacResponse(0, req.ledger_id, lac_buf, last_entry)

    async def write_lac(self, req: WriteLacRequest) -> WriteLacResponse:
        await self.bookie.write_lac(req.ledger_id, req.master_key, req.lac_buf)
        return WriteLacResponse(0, req.ledger_id)

    async def bookie_info(self, req: GetBookieInfoRequest) -> GetBookieInfoResponse:
        """GET_BOOKIE_INFO: free and total bytes of the ledger dirs, each only if asked for."""
        total, free, *_ = await on_space_thread(total_space, self.config.ledger_dirs)  # as HTTP's, off the loop
        return GetBookieInfoResponse(0, free if req.requested_info & BOOKIE_INFO_FREE_DISK_SPACE else 0,
                                     total if req.requested_info & BOOKIE_INFO_TOTAL_DISK_CAPACITY else 0)

    async def force_ledger(self, req: ForceLedgerRequest) -> ForceLedgerResponse:
        """FORCE_LEDGER (v3): answered once every deferred-sync add of the ledger acknowledged
        before it is durable (Bookie.force_ledger)."""
        await self.bookie.force_ledger(req.ledger_id)
        return ForceLedgerResponse(0, req.ledger_id)

    async def list_entries(self, req: GetListOfEntriesRequest) -> GetListOfEntriesResponse:
        """GET_LIST_OF_ENTRIES_OF_LEDGER (v3): the ids of the entries stored here."""
        bookie = self.bookie
        if not bookie.ledger_exists(req.ledger_id):
            raise NoSuchLedgerError(ledger_id=req.ledger_id)
        if bookie.is_limbo(req.ledger_id):  # it may have lost entries: no list is the truth
            raise LedgerLimboError(ledger_id=req.ledger_id)
        # what is stored, not range(0, last + 1): one add at entry 2**62 must not cost 2**62
        return GetListOfEntriesResponse(0, req.ledger_id, await bookie.stored_entry_ids(req.ledger_id))
