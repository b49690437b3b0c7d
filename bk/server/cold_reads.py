"""Plain single READs that no cache holds (cold), read in batches by the read threads, no task each.

A cold READ used to run as an asyncio task: its index lookup on the loop (an LMDB page fault
when the index is cold too), its pread through the ring or a read thread, its record check
back on the loop: two or three hops and a task per READ. Here a plain READ (v2 or v3: no
fencing, no long poll, an entry id >= 0) that got its read slot (BookieConnection.run_read)
and still missed the caches (single_reads.answer_cached) is queued; once per loop iteration
the queue goes to the read threads (Bookie.read_entries_cb): lookup + pread + check of each
READ in one thread, one hop, answered by one callback per batch. The READs of one socket read
that missed arrive together, so a client's pipelined scan is one batch: its first miss reads
ahead and the rest are found in the read cache in the same thread.

Batches: consecutive entries of one ledger stay in one job (a scan read twice in two threads
would read its entries one by one: ReadRuns gives a miss inside a span in flight its one
entry); separate runs (other ledgers, random reads) are spread over at most
num_read_worker_threads jobs, so random cold READs still reach the disk in parallel.

What a client sees is unchanged (read_entry's answers: the entry, ENOLEDGER, ENOENTRY only
where limbo was clear before the lookup, EUNKNOWNLEDGERSTATE in limbo, EIO for a storage
failure). Every queued READ is answered exactly once and gives back what it holds exactly
once: its count (end_read), then its read slot after the answer is queued (read_done: the
next read's room check counts it), also when its connection closed meanwhile (the answer
is then dropped by send).
"""
from __future__ import annotations

import asyncio
import logging
from time import monotonic

from bk import metrics
from bk.errors import BookieError, TooManyRequestsError
from bk.proto import ReadRequest, ReadResponse, encode_response
from bk.proto import v3
from bk.server import single_reads

log = logging.getLogger(__name__)
_READ_REQUEST, _READ_BYTES = metrics.READ_ENTRY_REQUEST, metrics.READ_BYTES


def batches(items: list, jobs: int) -> list[list]:
    """`items` [(req, conn, ledger_id, entry_id, start)] as at most `jobs` batches: each run of
    consecutive entries of one ledger whole in one batch, the runs in arrival order."""
    runs: list[list] = []
    prev = None
    for item in items:
        key = (item[2], item[3])
        if prev is not None and key == (prev[0], prev[1] + 1):
            runs[-1].append(item)
        else:
            runs.append([item])
        prev = key
    if len(runs) <= jobs:
        return runs
    per = -(-len(runs) // jobs)  # ceil: at most `jobs` batches
    return [[item for run in runs[i:i + per] for item in run] for i in range(0, len(runs), per)]


class ColdReads:
    """The processor's queue of cold plain READs (both protocols), flushed once per loop iteration."""

    def __init__(self, bookie, config):
        self.bookie = bookie
        self._jobs = max(1, config.num_read_worker_threads)
        self._queued: list = []
        self._flush_due = False
        self._in_flight = 0  # batches handed to the bookie and not answered yet
        self._idle: asyncio.Future | None = None

    def run(self, req, conn) -> None:
        """`start` of a plain READ in its read slot (BookieConnection.run_read; serve_run's
        misses, and reads the read-ahead they waited for did not bring): answered at once if a
        cache holds its entry by now, else queued."""
        if not single_reads.answer_cached(req, conn, self.bookie.read_cached):
            self.start(req, conn)

    @staticmethod
    def refuse(req, conn) -> None:
        """The ETOOMANYREQUESTS answer to a plain READ the limits refused (begin_read False), as
        the ordinary path answers it."""
        if type(req) is ReadRequest:
            conn.send(_error(req, req.ledger_id, req.entry_id, TooManyRequestsError.code))
        else:
            if type(req) is v3.V3ReadRequest:
                req = v3.read_request(req)
            conn.send(v3.frame(v3.error_response(req, TooManyRequestsError.code)))

    def start(self, req, conn) -> bool:
        """A READ holding a read slot and its count, whose entry no cache held: queued and True if
        it is plain, else False (the caller reads it the ordinary way)."""
        ids = single_reads.plain_ids(req)
        if ids is None:
            return False
        self._queued.append((req, conn, ids[0], ids[1], monotonic()))
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)
        return True

    def _flush(self) -> None:
        self._flush_due = False
        items, self._queued = self._queued, []
        read = self.bookie.read_entries_cb
        for batch in batches(items, self._jobs):
            self._in_flight += 1
            read([(item[2], item[3]) for item in batch], self._answer, batch)

    def _answer(self, batch: list, outcomes: list) -> None:
        """One batch read (Bookie.read_entries_cb): each READ answered, the EOK answers of one
        connection's consecutive READs encoded by one kernel call into one part (as serve_run
        does); each connection's READs give back their counts and slots once their answers
        are queued (the next read's room check counts them)."""
        self._in_flight -= 1
        now = monotonic()
        conn = None
        rows: list = []
        kind = n = 0  # the rows' kind (single_reads: v2 header version, or v3); READs of conn
        try:
            for (req, c, ledger_id, entry_id, start), out in zip(batch, outcomes):
                if c is not conn:
                    if conn is not None:
                        _give_back(conn, kind, rows, n)
                    conn, rows, n = c, [], 0
                n += 1
                if c.closed:
                    continue  # nobody to answer; its count and slot still go back
                try:
                    if isinstance(out, BookieError):
                        _READ_REQUEST.failure((now - start) * 1000.0)
                        answer = _error(req, ledger_id, entry_id, out.code)
                    else:
                        size = len(out)
                        _READ_REQUEST.success((now - start) * 1000.0)
                        _READ_BYTES.inc(size)
                        if size < single_reads.PART_MIN_ENTRY_BYTES:
                            k, row = _row(req, ledger_id, entry_id, out)
                            if rows and k != kind:
                                single_reads.queue_rows(c, kind, rows)
                                rows = []
                            kind = k
                            rows.append(row)
                            continue
                        answer = single_reads._answer(req, ledger_id, entry_id, out)
                    if rows:
                        single_reads.queue_rows(c, kind, rows)
                        rows = []
                except Exception as err:  # every READ gets an answer, never an explicit negative
                    log.error("unexpected error answering a READ: %r", err, exc_info=err)
                    rows, answer = [], _error(req, ledger_id, entry_id, BookieError.code)
                c.send(answer)
        finally:
            if conn is not None:
                _give_back(conn, kind, rows, n)
        if self._in_flight == 0 and self._idle is not None:
            if not self._idle.done():
                self._idle.set_result(None)
            self._idle = None

    async def drain(self) -> None:
        """Wait until every queued READ is answered."""
        while self._in_flight or self._queued:
            if self._idle is None:
                self._idle = asyncio.get_running_loop().create_future()
            await asyncio.wait((self._idle,), timeout=0.05)


def _row(req, ledger_id: int, entry_id: int, entry) -> tuple[int, tuple]:
    """(kind, row) of an EOK answer for single_reads.queue_rows."""
    if type(req) is ReadRequest:
        return req.version, (ledger_id, entry_id, entry)
    header = req.header if type(req) is v3.V3ReadRequest else req.header.SerializeToString()
    return single_reads.V3_KIND, (header, ledger_id, entry_id, entry)


def _give_back(conn, kind: int, rows: list, n: int) -> None:
    """The gathered answers of conn's `n` READs queued, then their counts and read slots back
    (exactly once, whatever the send does)."""
    try:
        if rows:
            single_reads.queue_rows(conn, kind, rows)
    finally:
        conn.end_reads(n)
        conn.read_done(n)


def _error(req, ledger_id: int, entry_id: int, code: int):
    """The answer to READ `req` carrying error `code` (as Operations.read answers it)."""
    answer = ReadResponse(code, ledger_id, entry_id)
    if type(req) is ReadRequest:
        return encode_response(answer, req.version)
    if type(req) is v3.V3ReadRequest:
        req = v3.read_request(req)
    return v3.frame(v3.response_to_v3(req.header, answer))
