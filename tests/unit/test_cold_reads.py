"""Plain single READs that no cache holds, read in batches by the read threads with one callback
each, no task per READ (bk.server.cold_reads, Bookie.read_entries_cb): every READ answered once
with the code it had as a task (the entry, ENOENTRY, ENOLEDGER, EUNKNOWNLEDGERSTATE in limbo,
EIO for a storage failure), its count and read slot given back exactly once, also when its
connection closes mid-run or the read threads are gone. In process: a real Bookie restarted
over its entry logs (so the entries are cold), a connection on a stand-in transport; run with
BK_NO_NATIVE=1 too (pure kernels, reads through the read threads)."""
import asyncio
from types import SimpleNamespace

import pytest

from bk.errors import StorageError
from bk.proto import FrameDecoder, ReadRequest, StatusCode, encode_request, master_key
from bk.proto import v3
from bk.testing.transport import FakeTransport, answers_written, stored_then_stopped

KEY = master_key(b"pw")
LEDGER, OTHER = 5, 6
N = 60


def _entry(ledger_id: int, e: int) -> bytes:
    from bk.proto.digest import DigestManager
    payload = b"cold-%04d" % e
    return bytes(DigestManager(ledger_id, "CRC32C", b"pw").frame_entry(e, e - 1, len(payload), payload))


def _v3_read(txn, entry_id, ledger_id=LEDGER):
    req = v3.Request()
    req.header.version, req.header.operation, req.header.txnId = 3, v3.OperationType.READ_ENTRY, txn
    req.readRequest.ledgerId, req.readRequest.entryId = ledger_id, entry_id
    return v3.frame(req)


def _v2(frame):
    from bk.proto import decode_response
    r = decode_response(frame)
    return r.ledger_id, r.entry_id, r.rc, None if r.body is None else bytes(r.body)


def _v3(frame):
    r = v3.parse(v3.Response, frame)
    rr = r.readResponse
    return rr.ledgerId, rr.entryId, v3.v2_status(r.status), bytes(rr.body) if rr.body else None


def _frames(proto, keys):
    if proto == "v2":
        return [encode_request(ReadRequest(0, lid, eid)) for lid, eid in keys]
    return [_v3_read(i + 1, eid, lid) for i, (lid, eid) in enumerate(keys)]


def _cold(tmp_path, body, read_io="threads", stored=lambda e: True, **settings):
    """`body(bookie, proc, conn, transport, answers)` against a bookie whose ledgers LEDGER and
    OTHER (entries 0..N-1, those `stored(e)` says) are only in its entry logs (written, the bookie
    stopped and started)."""
    from bk.bookie import Bookie
    from bk.config import load_config
    from bk.server.connection import BookieConnection
    from bk.server.processor import RequestProcessor

    cfg = load_config(env={}, overrides=dict(journal_dirs=[str(tmp_path / "j")], ledger_dirs=[str(tmp_path / "l")],
                                             read_io=read_io, **settings))

    async def write():
        await stored_then_stopped(Bookie(cfg), [(lid, e, _entry(lid, e), KEY) for lid in (LEDGER, OTHER)
                                                for e in range(N) if stored(e)])

    async def read():
        b = Bookie(cfg)
        await b.start()
        try:
            assert b.storage.get_cached(LEDGER, 0) is None
            proc = RequestProcessor(b, cfg)
            conn = BookieConnection(SimpleNamespace(config=cfg, processor=proc, connections=set()))
            conn.connection_made(transport := FakeTransport())
            decoder = FrameDecoder()

            def answers(n, parse, tries=400):
                return answers_written(transport, decoder, n, parse, tries)

            await body(b, proc, conn, transport, answers)
            await proc.drain()
            assert (conn.pending, conn._reads_running, len(conn._reads_waiting), proc.limits.reads) == (0, 0, 0, 0)
        finally:
            await b.stop()
    asyncio.run(write())
    asyncio.run(read())


def _count_calls(bookie):
    calls = []
    call = bookie._read_threads.call
    bookie._read_threads.call = lambda fn, args, done: calls.append(args[0]) or call(fn, args, done)
    return calls


@pytest.mark.parametrize("read_io", ["threads", "auto"])
@pytest.mark.parametrize("proto", ["v2", "v3"])
def test_a_cold_run_is_read_in_one_batch_without_a_task_and_each_read_answered_once(tmp_path, proto, read_io):
    """40 READs of one socket read, more than the connection's 32 read slots: a scan of LEDGER
    (its first miss reads ahead for the rest), a missing entry, an unknown ledger and a few of
    OTHER. On ddbad0d each missing READ was a task (its lookup on the loop)."""
    async def body(bookie, proc, conn, transport, answers):
        calls = _count_calls(bookie)
        keys = [(LEDGER, e) for e in range(30)] + [(LEDGER, N + 5), (99, 0)] + [(OTHER, e) for e in (7, 3, 8, 9)] \
            + [(LEDGER, e) for e in range(30, 34)]
        conn.data_received(b"".join(_frames(proto, keys)))
        assert not proc._tasks  # no task for a cold plain READ
        got = await answers(len(keys), _v2 if proto == "v2" else _v3)
        want = [(lid, eid, StatusCode.ENOLEDGER if lid == 99 else StatusCode.ENOENTRY if eid >= N else 0,
                 None if lid == 99 or eid >= N else _entry(lid, eid)) for lid, eid in keys]
        if proto == "v3":  # v3 errors carry no body
            want = [w if w[2] == 0 else w[:3] + (None,) for w in want]
        assert sorted(got) == sorted(want)
        # the 32 READs in slots went to the read threads in one flush: the scan whole in one
        # batch, the missing entry beside it, the unknown ledger answered without a thread
        assert calls[:2] == [keys[:30], [(LEDGER, N + 5)]]
        assert all((99, 0) not in c for c in calls)
        assert not proc._tasks
    _cold(tmp_path, body, read_io=read_io)


@pytest.mark.parametrize("proto", ["v2", "v3"])
def test_a_cold_miss_in_limbo_is_never_no_such_entry_and_a_storage_error_is_eio(tmp_path, proto):
    async def body(bookie, proc, conn, transport, answers):
        storage = bookie.storage
        storage.update_ledger(storage.get_ledger(OTHER), limbo=True)
        read_many = storage.read_many

        def failing(keys):  # entry 3 of LEDGER cannot be read (an I/O error in the thread)
            out, spans = read_many(keys)
            return [StorageError("injected read error") if k == (LEDGER, 3) else o for k, o in zip(keys, out)], spans
        storage.read_many = failing
        keys = [(OTHER, 1), (OTHER, N + 1), (LEDGER, 3), (LEDGER, N + 2), (LEDGER, 4)]
        conn.data_received(b"".join(_frames(proto, keys)))
        got = await answers(len(keys), _v2 if proto == "v2" else _v3)
        assert sorted((lid, eid, rc) for lid, eid, rc, _ in got) == sorted([
            (OTHER, 1, 0), (OTHER, N + 1, StatusCode.EUNKNOWNLEDGERSTATE), (LEDGER, 3, StatusCode.EIO),
            (LEDGER, N + 2, StatusCode.ENOENTRY), (LEDGER, 4, 0)])
    _cold(tmp_path, body)


def test_limbo_cleared_during_the_lookup_looks_again_rather_than_answer_no_such_entry(tmp_path):
    """The BP-46 repair stores its copy and clears limbo while a lookup runs: that lookup's miss
    proves nothing, so the READ is looked up again and answered with the entry."""
    async def body(bookie, proc, conn, transport, answers):
        storage = bookie.storage
        desc = storage.get_ledger(LEDGER)
        storage.update_ledger(desc, limbo=True)
        read_many, seen = storage.read_many, []

        def repaired_meanwhile(keys):
            seen.append(list(keys))
            if len(seen) == 1:  # the miss of a lookup that began in limbo; the repair ends now
                desc.limbo = False
                return [None] * len(keys), []
            return read_many(keys)
        storage.read_many = repaired_meanwhile
        conn.data_received(encode_request(ReadRequest(0, LEDGER, 2)))
        assert await answers(1, _v2) == [(LEDGER, 2, 0, _entry(LEDGER, 2))]
        assert seen == [[(LEDGER, 2)], [(LEDGER, 2)]]
    _cold(tmp_path, body)


@pytest.mark.parametrize("proto", ["v2", "v3"])
def test_a_connection_closed_mid_run_answers_nothing_and_gives_every_slot_back(tmp_path, proto):
    """Two connections' READs in one flush (interleaved in the batches); one closes before the
    read threads answer: it gets nothing, the other everything, both give every slot back."""
    from bk.server.connection import BookieConnection

    async def body(bookie, proc, conn, transport, answers):
        other = BookieConnection(conn.server)
        other.connection_made(other_transport := FakeTransport())
        conn.data_received(b"".join(_frames(proto, [(LEDGER, e) for e in range(40)])))
        other.data_received(b"".join(_frames(proto, [(LEDGER, e) for e in range(40, 50)] + [(OTHER, 1), (LEDGER, N)])))
        assert conn._reads_running == 32 and len(conn._reads_waiting) == 8
        conn.connection_lost(None)  # before the batches come back from the read threads
        await proc.drain()
        assert transport.out == [] and not proc._tasks
        parse = _v2 if proto == "v2" else _v3
        got = sorted(parse(f) for f in FrameDecoder().feed(b"".join(other_transport.out)))
        assert [(lid, eid, rc) for lid, eid, rc, _ in got] == \
            [(LEDGER, e, 0) for e in range(40, 50)] + [(LEDGER, N, StatusCode.ENOENTRY), (OTHER, 1, 0)]
        assert (other.pending, other._reads_running, len(other._reads_waiting)) == (0, 0, 0)
    _cold(tmp_path, body)


def test_reads_queued_as_the_read_threads_stop_are_answered_eio(tmp_path):
    async def body(bookie, proc, conn, transport, answers):
        bookie._read_threads.shutdown()
        conn.data_received(b"".join(_frames("v2", [(LEDGER, e) for e in range(3)])))
        got = await answers(3, _v2)
        assert sorted(got) == [(LEDGER, e, StatusCode.EIO, None) for e in range(3)]
    _cold(tmp_path, body)


def test_batches_keep_a_ledgers_consecutive_entries_together_in_at_most_jobs_batches():
    from bk.server.cold_reads import batches

    def items(keys):
        return [(None, None, lid, eid, 0.0) for lid, eid in keys]

    def ids(out):
        return [[(i[2], i[3]) for i in b] for b in out]
    scan = [(1, e) for e in range(10)]
    assert ids(batches(items(scan), 8)) == [scan]
    mixed = [(1, 0), (1, 1), (2, 5), (1, 2), (1, 9), (3, 0), (3, 1)]
    assert ids(batches(items(mixed), 8)) == [[(1, 0), (1, 1)], [(2, 5)], [(1, 2)], [(1, 9)], [(3, 0), (3, 1)]]
    assert ids(batches(items(mixed), 2)) == [[(1, 0), (1, 1), (2, 5), (1, 2)], [(1, 9), (3, 0), (3, 1)]]
    rand = [(1, e) for e in (50, 3, 77, 12, 9, 40, 2, 66, 31)]
    out = batches(items(rand), 4)
    assert len(out) <= 4 and [k for b in ids(out) for k in b] == rand
    assert batches([], 8) == []


@pytest.mark.parametrize("kernel", ["pure", "native"])
def test_preads_reads_each_span_or_gives_its_errno_as_os_pread(tmp_path, kernel):
    """The entrylog kernel's batch pread (read_many's first preads, the GIL released once):
    what os.pread gives per (fd, n, offset) - short at the end of the file, empty past it -
    and a failed read's errno instead of raising (the others of the batch are still read)."""
    import errno
    import os
    from bk import _native
    mod = _native.load_pure("entrylog") if kernel == "pure" else _native.load_native("entrylog")
    if mod is None:
        pytest.fail("bk._native._entrylog is not built (scripts/setup builds it)")
    data = bytes(range(256)) * 40
    path = tmp_path / "log"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        bad = os.open(tmp_path, os.O_RDONLY)  # a directory: EISDIR
        os.close(bad)  # and closed: EBADF
        reads = [(fd, 10, 0), (fd, 100, len(data) - 40), (fd, 5, len(data) + 7), (bad, 4, 0), (fd, 0, 3),
                 (fd, 4096, 1000)]
        got = mod.preads(reads)
        assert got[3] == errno.EBADF
        assert [g for i, g in enumerate(got) if i != 3] == [os.pread(f, n, o) for i, (f, n, o) in enumerate(reads) if i != 3]
        assert mod.preads([]) == []
        with pytest.raises(ValueError):
            mod.preads([(fd, -1, 0)])
    finally:
        os.close(fd)


@pytest.mark.parametrize("kernel", ["pure", "native"])
def test_close_preads_of_a_batch_are_one_read_with_the_same_bytes_each(tmp_path, kernel):
    """A batch's first preads that overlap or lie close in one file are read as one (a ledger's
    consecutive records: one disk trip, not one each with no kernel readahead) and cut back:
    every read gets exactly what it gets read alone (os.pread's bytes: short at the end, empty
    past it; its errno on a bad descriptor), for seeded random batches over two files."""
    import errno
    import os
    import random
    from bk import _native
    from bk.entrylog.reads import COALESCE_GAP_BYTES, coalesced_preads
    mod = _native.load_pure("entrylog") if kernel == "pure" else _native.load_native("entrylog")
    if mod is None:
        pytest.fail("bk._native._entrylog is not built (scripts/setup builds it)")
    calls = []

    def counted(reads):
        calls.append(len(reads))
        return mod.preads(reads)
    rng = random.Random(34)
    (tmp_path / "a").write_bytes(rng.randbytes(300_000))
    (tmp_path / "b").write_bytes(rng.randbytes(50_000))
    fa, fb = os.open(tmp_path / "a", os.O_RDONLY), os.open(tmp_path / "b", os.O_RDONLY)
    bad = os.open(tmp_path / "b", os.O_RDONLY)
    os.close(bad)
    try:
        run = [(fa, 1100, 1024 + 1100 * k) for k in range(50)]  # consecutive records
        calls.clear()
        assert coalesced_preads(counted, run) == [os.pread(*r) for r in run]
        assert calls == [1]  # one read for the run
        for _ in range(200):
            reads = []
            for _ in range(rng.randint(0, 30)):
                fd = rng.choice([fa, fa, fa, fb, bad])
                offset = rng.choice([rng.randint(0, 310_000), rng.randint(0, 3) * COALESCE_GAP_BYTES])
                reads.append((fd, rng.choice([0, 1, 512, 4096, rng.randint(1, 20_000)]), offset))
            want = [b"" if not n else errno.EBADF if fd == bad else os.pread(fd, n, off) for fd, n, off in reads]
            assert mod.preads(reads) == want  # each read alone: os.pread's bytes, or its errno
            assert coalesced_preads(counted, reads) == want
    finally:
        os.close(fa)
        os.close(fb)


def test_a_merged_read_that_fails_is_retried_as_its_separate_reads(tmp_path):
    """EIO on a merged read (a bad sector under one record) must not fail the records beside it:
    the group is read again span by span, and only the span that fails gets the errno."""
    import errno
    import os
    from bk.entrylog.reads import coalesced_preads
    (tmp_path / "a").write_bytes(bytes(range(256)) * 64)
    fd = os.open(tmp_path / "a", os.O_RDONLY)

    def sick(reads):  # the bytes 5000-5009 cannot be read
        return [errno.EIO if off < 5010 and off + n > 5000 else os.pread(f, n, off) for f, n, off in reads]
    try:
        reads = [(fd, 1000, 3000), (fd, 1000, 4000), (fd, 1000, 5000), (fd, 1000, 6000)]
        assert coalesced_preads(sick, reads) == [os.pread(fd, 1000, 3000), os.pread(fd, 1000, 4000), errno.EIO,
                                                 os.pread(fd, 1000, 6000)]
    finally:
        os.close(fd)


@pytest.mark.parametrize("proto", ["v2", "v3"])
def test_cold_reads_beyond_the_bookie_wide_limit_are_refused_once_each(tmp_path, proto):
    """max_reads_in_progress_limit 2: the bookie refuses reads beyond twice that; the cold READs
    it admits are answered, the others get ETOOMANYREQUESTS, each refusal counted once."""
    async def body(bookie, proc, conn, transport, answers):
        keys = [(LEDGER, e) for e in range(10)]
        conn.data_received(b"".join(_frames(proto, keys)))
        got = await answers(len(keys), _v2 if proto == "v2" else _v3)
        codes = sorted(rc for _, _, rc, _ in got)
        assert len(got) == 10 and codes == [0] * 4 + [StatusCode.ETOOMANYREQUESTS] * 6
        assert all(body == _entry(lid, eid) for lid, eid, rc, body in got if rc == 0)
        assert proc.limits.refused == 6
    _cold(tmp_path, body, max_reads_in_progress_limit=2)


def test_reads_refused_while_a_read_ahead_they_wait_for_is_in_flight_are_refused_once_each(tmp_path):
    import threading

    async def body(bookie, proc, conn, transport, answers):
        gate, read_ahead = threading.Event(), bookie.storage._read_ahead

        def held(*args):  # the read-ahead of entry 0's batch, in flight until the READs came
            gate.wait(10)
            return read_ahead(*args)
        bookie.storage._read_ahead = held
        conn.data_received(b"".join(_frames("v2", [(LEDGER, 0)])))
        for _ in range(200):
            if bookie.read_ahead_for(LEDGER, 5) is not None:
                break
            await asyncio.sleep(0.005)
        conn.data_received(b"".join(_frames("v2", [(LEDGER, e) for e in range(1, 10)])))
        gate.set()
        got = await answers(10, _v2)
        assert sorted(rc for _, _, rc, _ in got) == [0] * 4 + [StatusCode.ETOOMANYREQUESTS] * 6
        assert proc.limits.refused == 6
    _cold(tmp_path, body, max_reads_in_progress_limit=2)


@pytest.mark.parametrize("read_io", ["threads", "auto"])
@pytest.mark.parametrize("proto", ["v2", "v3"])
def test_a_scan_of_a_bookie_holding_some_entries_reads_on_from_the_next_one_it_holds(tmp_path, proto, read_io):
    """With E > WQ a bookie holds WQ of every E entries (here E3/WQ2: all but e % 3 == 1) and a
    reader asks it for one in E (e % 3 == 0). The entry after a read-ahead is often one this
    bookie does not hold: the read-ahead from it found nothing, and the scan's next READs waited
    for it and missed. It reads on from the next entry the bookie holds."""
    async def body(bookie, proc, conn, transport, answers):
        parse = _v2 if proto == "v2" else _v3
        cached = bookie.storage.get_cached
        conn.data_received(b"".join(_frames(proto, [(LEDGER, 0)])))  # the ledger's first miss: 9 records
        assert [g[:3] for g in await answers(1, parse)] == [(LEDGER, 0, 0)]
        assert cached(LEDGER, 12) is not None and cached(LEDGER, 14) is None  # 0 2 3 5 6 8 9 11 12
        conn.data_received(b"".join(_frames(proto, [(LEDGER, 6)])))  # past the middle: read on after 12
        assert await answers(1, parse) == [(LEDGER, 6, 0, _entry(LEDGER, 6))]
        # 13 is not held here: 26 records (twice the first run) from 14, the next one held: 14..51
        assert await _eventually(lambda: cached(LEDGER, 51) is not None)
        assert cached(LEDGER, 53) is None
        conn.data_received(b"".join(_frames(proto, [(LEDGER, e) for e in range(15, 52, 3)])))
        got = await answers(13, parse)
        assert sorted(got) == [(LEDGER, e, 0, _entry(LEDGER, e)) for e in range(15, 52, 3)]
    _cold(tmp_path, body, read_io=read_io, stored=lambda e: e % 3 != 1, read_ahead_batch_size=9)


async def _eventually(cond, tries: int = 400) -> bool:
    for _ in range(tries):
        if cond():
            return True
        await asyncio.sleep(0.005)
    return cond()


@pytest.mark.parametrize("read_io", ["threads", "auto"])
@pytest.mark.parametrize("proto", ["v2", "v3"])
def test_a_scan_served_from_the_read_cache_reads_ahead_once_past_the_middle(tmp_path, proto, read_io):
    """A scan whose READs all hit the read cache left nobody waiting on a read-ahead to start the
    next one (Bookie._follow), so it stalled on the disk after every other read-ahead. Now a hit
    past the middle of the read-ahead that brought the entry starts the one after it
    (Bookie.read_on); a hit before the middle, or on a random read's one entry, does not."""
    async def body(bookie, proc, conn, transport, answers):
        parse = _v2 if proto == "v2" else _v3
        cached = bookie.storage.get_cached
        conn.data_received(b"".join(_frames(proto, [(LEDGER, 0)])))  # the ledger's first miss: 0..9 read ahead
        assert [g[:3] for g in await answers(1, parse)] == [(LEDGER, 0, 0)]
        assert cached(LEDGER, 9) is not None and cached(LEDGER, 10) is None
        conn.data_received(b"".join(_frames(proto, [(LEDGER, e) for e in range(1, 5)])))  # hits before the middle
        got = await answers(4, parse)
        assert sorted(g[:3] for g in got) == [(LEDGER, e, 0) for e in range(1, 5)]
        await asyncio.sleep(0.05)
        assert cached(LEDGER, 10) is None  # nothing read on yet
        conn.data_received(b"".join(_frames(proto, [(LEDGER, 5)])))  # past the middle
        assert await answers(1, parse) == [(LEDGER, 5, 0, _entry(LEDGER, 5))]
        # 10..29 (a scan's second run is twice its first), read before anyone asked
        assert await _eventually(lambda: cached(LEDGER, 29) is not None)
        assert cached(LEDGER, 30) is None
        # entries of what it read ahead are the stored ones, answered from the read cache
        conn.data_received(b"".join(_frames(proto, [(LEDGER, e) for e in range(10, 30)])))
        got = await answers(20, parse)
        assert sorted(got) == [(LEDGER, e, 0, _entry(LEDGER, e)) for e in range(10, 30)]
        # a random read (OTHER's 40, after its first miss read 0..9 ahead) reads its one entry,
        # and hitting that entry again reads nothing on
        for e in (0, 40, 40):  # one at a time: 40 first would be the ledger's first miss
            conn.data_received(b"".join(_frames(proto, [(OTHER, e)])))
            assert [g[:3] for g in await answers(1, parse)] == [(OTHER, e, 0)]
        await asyncio.sleep(0.05)
        assert cached(OTHER, 41) is None and cached(OTHER, 10) is None
    _cold(tmp_path, body, read_io=read_io, read_ahead_batch_size=10)
