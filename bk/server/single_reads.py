"""Single READs answered from the caches on the loop: no task, no future, one write per run.

The Java client's `readEntries` (Pulsar's consumers, managed ledgers) sends one READ per entry,
and bk's client does too when E != WQ, so the bookie sees runs of READs, often dozens in one
socket read. A plain READ (no fencing, no long poll, an entry id >= 0; v2 or v3) whose entry a
cache holds (Bookie.read_cached: write cache, read cache, what a read-ahead brought in) is
answered here at once: the answers of a run are encoded by one kernel call into one buffer
(bk/_native/_reads.pyx: v2 frames, or v3 Responses byte for byte as the protobuf library
writes them) and queued as one part of the connection's next write. Everything else - a miss,
a fencing read, a long poll, a v3 request of another operation, a read while the connection's
unwritten answers exceed max_response_bytes_per_connection - goes to the processor's ordinary
path (a task in one of the connection's read slots), in order: the answers gathered so far are
queued first, so the answers queued at once keep the requests' order.

A read that waited (for a read slot, or for the read-ahead that brings its entry) looks in the
caches again when its turn comes (`answer_cached`): a cold scan's READs behind the one that
started a read-ahead are then answered from it, without a task each.

What a client sees is unchanged: the same bytes, the same errors (a miss is answered by
Bookie.read_entry, which decides between "no such entry", limbo and EIO), the same room check
per read as one by one (each answer gathered counts against the room before the next).
"""
from __future__ import annotations

from functools import partial
from time import monotonic

from bk import _native, metrics
from bk.proto import ReadRequest, encode_header
from bk.proto.constants import OpCode
from bk.formats.wire import FLAG_DO_FENCING
from bk.proto.v3 import OperationType, V3ReadRequest, read_request

_reads = _native.load("reads")
read_answers, v3_read_answers, v3_read_head = _reads.read_answers, _reads.v3_read_answers, _reads.v3_read_head

_READ_OP = int(OpCode.READ_ENTRY)
_V3_READ = int(OperationType.READ_ENTRY)
_V3 = V3_KIND = -1  # a run's kind for v3 answers (v2 runs are keyed by their header version)
# Entries at least this large go out as parts of their own, uncopied (codec._PART_MIN_ENTRY_BYTES)
PART_MIN_ENTRY_BYTES = 16 * 1024
_READ_REQUEST, _READ_BYTES = metrics.READ_ENTRY_REQUEST, metrics.READ_BYTES
_v2_headers: dict[int, int] = {}
_ANSWER_HEAD_MAX = 64  # bytes of an answer before its entry, at most (v3: besides the echoed header)


def v2_header(version: int) -> int:
    h = _v2_headers.get(version)
    if h is None:
        h = _v2_headers[version] = encode_header(version, _READ_OP)
    return h


def v3_plain_read(req):
    """(ledgerId, entryId) of a v3 READ that only asks for an entry (no flag, no previousLAC, ids
    >= 0), else None."""
    if req.header.operation != _V3_READ or not req.HasField("readRequest"):
        return None
    r = req.readRequest
    if r.HasField("flag") or r.HasField("previousLAC") or r.ledgerId < 0 or r.entryId < 0:
        return None
    return r.ledgerId, r.entryId


def plain_ids(req) -> tuple[int, int] | None:
    """(ledger_id, entry_id) of a plain READ (a v2 ReadRequest, the kernel's V3ReadRequest or a
    v3 Request), else None."""
    t = type(req)
    if t is ReadRequest:
        if req.flags & FLAG_DO_FENCING or req.entry_id < 0:
            return None
        return req.ledger_id, req.entry_id
    if t is V3ReadRequest:
        return req.ledger_id, req.entry_id
    return v3_plain_read(req)


def queue_rows(conn, kind: int, rows: list) -> None:
    """EOK answers, rows of one kind (a v2 header version: (ledger_id, entry_id, entry); V3_KIND:
    (header bytes, ledger_id, entry_id, entry)), encoded by one kernel call as one part."""
    conn.send(v3_read_answers(rows) if kind == _V3 else read_answers(rows, v2_header(kind)))


def serve_run(reqs, conn, bookie, slow, resume, cold) -> None:
    """Answer the plain READs of `reqs` (v2 ReadRequests, v3 Requests, the kernel's
    V3ReadRequests: those go to `slow` as the Requests they stand for) that a cache holds; a
    plain READ whose entry a read-ahead in flight brings waits for it as a callback (counted
    as a read in progress; then answered from the read cache, or `resume(req, conn)`: its
    read in a read slot); another plain READ that misses is counted and read in a read slot
    by `cold.run(req, conn)` (bk.server.cold_reads.ColdReads: no task, no protobuf Request) or
    refused (`cold.refuse`); hand every other request to `slow(req, conn)` in its turn."""
    start = monotonic()
    read_cached = bookie.read_cached
    room = conn.room()
    rows: list = []
    kind = 0
    served = nbytes = 0
    hits: dict = {}  # the newest entry served per ledger: a scan's read-ahead goes on from there
    for req in reqs:
        if conn.transport.is_closing():  # closed earlier in this read (a bad frame): drop the rest
            break
        entry = None
        t = type(req)
        if t is V3ReadRequest:  # plain by construction (the codec kernel's)
            k = _V3
            ids = (req.ledger_id, req.entry_id) if room >= 0 else None
            if ids is not None:
                entry = read_cached(*ids)
        elif t is ReadRequest:
            k = req.version
            if not req.flags & FLAG_DO_FENCING and req.entry_id >= 0 and room >= 0:
                entry = read_cached(req.ledger_id, req.entry_id)
        else:
            k = _V3
            ids = v3_plain_read(req) if room >= 0 else None
            if ids is not None:
                entry = read_cached(*ids)
        if entry is None:
            if rows:
                queue_rows(conn, kind, rows)
                rows = []
            if room >= 0 and (k == _V3 and ids is not None or k != _V3 and not req.flags & FLAG_DO_FENCING
                              and req.entry_id >= 0):
                lid, eid = ids if k == _V3 else (req.ledger_id, req.entry_id)
                ahead = bookie.read_ahead_for(lid, eid)
                # the limits are asked once: refused here, not again by slow()
                if not conn.begin_read():
                    cold.refuse(req, conn)
                elif ahead is not None:
                    ahead.add_done_callback(partial(_ahead_done, req, lid, eid, conn, bookie, resume, monotonic()))
                else:
                    conn.run_read(cold.run, req)
                room = conn.room()
                continue
            slow(read_request(req) if t is V3ReadRequest else req, conn)
            room = conn.room()
            continue
        if rows and k != kind:
            queue_rows(conn, kind, rows)
            rows = []
        kind = k
        n = len(entry)
        served += 1
        nbytes += n
        if k == _V3:
            # echoed as it came (CopyFrom's bytes; the kernel's record holds exactly those)
            header = req.header if t is V3ReadRequest else req.header.SerializeToString()
            room -= n + len(header) + _ANSWER_HEAD_MAX  # never more room than one by one
            row = (header, ids[0], ids[1], entry)
            hits[ids[0]] = ids[1]
        else:
            room -= n + _ANSWER_HEAD_MAX
            row = (req.ledger_id, req.entry_id, entry)
            hits[req.ledger_id] = req.entry_id
        if n < PART_MIN_ENTRY_BYTES:
            rows.append(row)
            continue
        # a large entry: its own parts, the head and then the entry as it is (no copy)
        if rows:
            queue_rows(conn, kind, rows)
            rows = []
        conn.send([v3_read_head(header, ids[0], ids[1], n) if k == _V3 else _v2_head(req, n), entry])
    if rows:
        queue_rows(conn, kind, rows)
    if served:
        bookie.read_on(hits)
        _READ_REQUEST.record_many(served, (monotonic() - start) * 1000.0)
        _READ_BYTES.inc(nbytes)


def _ahead_done(req, ledger_id: int, entry_id: int, conn, bookie, resume, start: float, _fut) -> None:
    """The read-ahead a plain READ waited for is done (or failed): the entry from the read cache
    while the output has room, else the READ's ordinary read in a read slot (already counted)."""
    if conn.closed:
        conn.end_read()
        return
    entry = bookie.read_cached(ledger_id, entry_id) if conn.has_room() else None
    if entry is None:  # resume takes the read slot (run_read): taking one here as well leaked it
        resume(req, conn)
        return
    conn.end_read()
    conn.send(_answer(req, ledger_id, entry_id, entry))
    _READ_REQUEST.success((monotonic() - start) * 1000.0)
    _READ_BYTES.inc(len(entry))


def _answer(req, ledger_id: int, entry_id: int, entry):
    """The EOK answer to one plain READ (v2 or v3): bytes, or [head, entry] for a large entry."""
    if type(req) is not ReadRequest:
        return v3_answer(req, ledger_id, entry_id, entry)
    n = len(entry)
    if n >= PART_MIN_ENTRY_BYTES:
        return [_v2_head(req, n), entry]
    return read_answers(((ledger_id, entry_id, entry),), v2_header(req.version))


def answer_cached(req, conn, read_cached) -> bool:
    """A READ that went the ordinary way (it missed the caches, or waited for room) gets its turn
    in a read slot: if it is plain and a cache holds its entry by now (brought in by a read-ahead
    of the reads before it), it is answered here without its task, True. Its accounting ends
    and its slot is freed without starting the next read (the caller is the loop that does)."""
    ids = plain_ids(req)
    if ids is None:
        return False
    start = monotonic()
    entry = read_cached(*ids)
    if entry is None:
        return False
    conn.end_read()
    conn.send(_answer(req, ids[0], ids[1], entry))
    conn.read_answered()
    _READ_REQUEST.success((monotonic() - start) * 1000.0)
    _READ_BYTES.inc(len(entry))
    return True


def v3_answer(req, ledger_id: int, entry_id: int, entry):
    """The EOK answer to v3 READ `req` carrying `entry`: bytes, or [head, entry] for a large one
    (what the protobuf library writes for Response{header, status, readResponse{status, ids, body}})."""
    header = req.header if type(req) is V3ReadRequest else req.header.SerializeToString()
    n = len(entry)
    if n >= PART_MIN_ENTRY_BYTES:
        return [v3_read_head(header, ledger_id, entry_id, n), entry]
    return v3_read_answers(((header, ledger_id, entry_id, entry),))


def _v2_head(req, n: int) -> bytes:
    """A v2 READ answer's frame up to its entry (of n bytes)."""
    frame = read_answers(((req.ledger_id, req.entry_id, b""),), v2_header(req.version))
    return (n + len(frame) - 4).to_bytes(4, "big") + frame[4:]
