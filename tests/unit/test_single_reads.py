"""Single READs answered from the caches without a task (bk.server.single_reads), and the kernels
that encode their answers (bk/_native/_reads.pyx and its twin): the bytes equal the protobuf
library's and the v2 codec's, every request of a run is answered once with the code it had one
by one (a miss: ENOENTRY, or EUNKNOWNLEDGERSTATE in limbo), the room limit holds, a closed
connection answers nothing. In process: a real Bookie, a connection on a stand-in transport."""
import asyncio
import random
import threading

import pytest

from bk import _native, eventloop
from bk.proto import (FLAG_DO_FENCING, FrameDecoder, ReadRequest, ReadResponse, StatusCode, encode_request,
                      encode_response, master_key)
from bk.proto import v3
from bk.testing.transport import FakeTransport, answers_written

KERNELS = [pytest.param("pure", id="pure"), pytest.param("native", id="native")]


@pytest.fixture
def k(request):
    if request.param == "pure":
        return _native.load_pure("reads")
    mod = _native.load_native("reads")
    if mod is None:
        pytest.skip("bk._native._reads is not built")
    return mod

KEY = master_key(b"pw")
LEDGER = 5


def _entry(e: int) -> bytes:
    from bk.proto.digest import DigestManager
    payload = b"entry-%04d" % e  # one size: a read-ahead of n records reads n (record_bytes)
    return bytes(DigestManager(LEDGER, "CRC32C", b"pw").frame_entry(e, e - 1, len(payload), payload))


E = [_entry(e) for e in range(10)]


def _v3_expected(header, ledger_id, entry_id, body) -> bytes:
    resp = v3.response_for(header)
    out = resp.readResponse
    out.status, out.ledgerId, out.entryId = 0, ledger_id, entry_id
    out.body = bytes(body)
    return v3.frame(resp)


@pytest.mark.parametrize("k", KERNELS, indirect=True)
def test_v3_answers_are_the_protobuf_librarys_bytes(k):
    rng = random.Random(7)
    rows, want = [], []
    for ledger_id, entry_id, size, priority in [(0, 0, 0, None), (1, 2, 1000, None), (2**63 - 1, 2**40, 300, 5),
                                                (-1, -5, 20000, 0), (127, 128, 1, 2**31)]:
        req = v3.Request()
        req.header.version, req.header.operation = 3, v3.OperationType.READ_ENTRY
        req.header.txnId = rng.getrandbits(64)
        if priority is not None:
            req.header.priority = priority
        body = rng.randbytes(size)
        header = req.header.SerializeToString()
        expected = _v3_expected(req.header, ledger_id, entry_id, body)
        assert k.v3_read_head(header, ledger_id, entry_id, size) + body == expected
        rows.append((header, ledger_id, entry_id, memoryview(body) if size % 2 else body))
        want.append(expected)
    assert k.v3_read_answers(rows) == b"".join(want)
    assert k.v3_read_answers([]) == b""


@pytest.mark.parametrize("k", KERNELS, indirect=True)
@pytest.mark.parametrize("version", [0, 1, 2])
def test_v2_answers_are_the_codecs_bytes(k, version):
    from bk.proto.codec import encode_header
    rows = [(7, 0, b""), (2**63 - 1, 3, b"x" * 100), (0, 2**62, memoryview(b"y" * 70000))]
    want = b"".join(encode_response(ReadResponse(0, lid, eid, bytes(body)), version) for lid, eid, body in rows)
    assert k.read_answers(rows, encode_header(version, 2)) == want


@pytest.mark.parametrize("k", KERNELS, indirect=True)
def test_ids_beyond_64_bits_are_refused(k):
    with pytest.raises(OverflowError):
        k.read_answers([(2**63, 0, b"")], 2 << 24 | 2 << 16)
    with pytest.raises(OverflowError):
        k.v3_read_head(b"", 0, 2**64, 0)


# ---------------------------------------------------------------- the server, in process
def _v3_read(txn, entry_id, ledger_id=LEDGER, **fields):
    req = v3.Request()
    req.header.version, req.header.operation, req.header.txnId = 3, v3.OperationType.READ_ENTRY, txn
    r = req.readRequest
    r.ledgerId, r.entryId = ledger_id, entry_id
    for name, value in fields.items():
        setattr(r, name, value)
    return v3.frame(req)


def _run(tmp_path, body, **settings):
    """`body(bookie, processor, conn, transport, answers)` against a started Bookie holding
    entries 0..9 of LEDGER in its write cache."""
    from types import SimpleNamespace
    from bk.bookie import Bookie
    from bk.config import load_config
    from bk.server.connection import BookieConnection
    from bk.server.processor import RequestProcessor

    async def main():
        cfg = load_config(env={}, overrides=dict(journal_dirs=[str(tmp_path / "j")],
                                                 ledger_dirs=[str(tmp_path / "l")], **settings))
        bookie = Bookie(cfg)
        await bookie.start()
        try:
            for e in range(10):
                await bookie.add_entry(LEDGER, e, E[e], KEY)
            proc = RequestProcessor(bookie, cfg)
            server = SimpleNamespace(config=cfg, processor=proc, connections=set())
            conn = BookieConnection(server)
            conn.connection_made(transport := FakeTransport())

            def answers(n, parse, tries=400):
                return answers_written(transport, FrameDecoder(), n, parse, tries)

            await body(bookie, proc, conn, transport, answers)
            await proc.drain()
        finally:
            await bookie.stop()
    asyncio.run(main())


def _v2(frame):
    from bk.proto import decode_response
    r = decode_response(frame)
    return r.entry_id, r.rc, None if r.body is None else bytes(r.body)


def _v3(frame):
    r = v3.parse(v3.Response, frame)
    rr = r.readResponse
    return r.header.txnId, v3.v2_status(r.status), rr.entryId, rr.body


def test_a_v2_run_answers_cached_entries_at_once_and_misses_as_before(tmp_path):
    async def body(bookie, proc, conn, transport, answers):
        reads = [ReadRequest(0, LEDGER, e) for e in (0, 1, 50, 2, 3)] + [ReadRequest(0, 99, 0)] \
            + [ReadRequest(FLAG_DO_FENCING, LEDGER, 4, KEY), ReadRequest(0, LEDGER, 5)]
        conn.data_received(b"".join(map(encode_request, reads)))
        # only the fencing read is a task: the cached ones are answered at once, the missing entry
        # and the unknown ledger are read in one batch by the read threads (bk.server.cold_reads)
        assert len(proc._tasks) == 1
        got = await answers(len(reads), _v2)
        assert sorted(got) == sorted([(0, 0, E[0]), (1, 0, E[1]), (50, StatusCode.ENOENTRY, None),
                                      (2, 0, E[2]), (3, 0, E[3]), (0, StatusCode.ENOLEDGER, None),
                                      (4, 0, E[4]), (5, 0, E[5])])
        assert bookie.is_fenced(LEDGER)
        assert (conn.pending, conn._reads_running) == (0, 0)
    _run(tmp_path, body)


def test_a_v3_run_answers_cached_entries_without_tasks_and_the_rest_in_order(tmp_path):
    async def body(bookie, proc, conn, transport, answers):
        frames = [_v3_read(1, 0), _v3_read(2, 1), _v3_read(3, 77), _v3_read(4, 2),
                  _v3_read(5, -1, flag=v3.READ_FLAG_ENTRY_PIGGYBACK),  # EBADREQ: piggyback needs previousLAC
                  _v3_read(6, 3)]
        conn.data_received(b"".join(frames))
        assert len(proc._tasks) == 1  # the bad request: no task for a cached entry, nor for the miss
        got = await answers(len(frames), _v3)
        assert sorted(got) == [(1, 0, 0, E[0]), (2, 0, 1, E[1]), (3, StatusCode.ENOENTRY, 77, b""),
                               (4, 0, 2, E[2]), (5, StatusCode.EBADREQ, -1, b""), (6, 0, 3, E[3])]
        # one read alone (a client with one READ in flight) takes the same path
        conn.data_received(_v3_read(7, 9))
        assert len(proc._tasks) == 0 and await answers(1, _v3) == [(7, 0, 9, E[9])]
    _run(tmp_path, body)


@pytest.mark.parametrize("proto", ["v2", "v3"])
def test_a_miss_in_limbo_is_never_no_such_entry(tmp_path, proto):
    async def body(bookie, proc, conn, transport, answers):
        storage = bookie.storage
        storage.update_ledger(storage.get_ledger(LEDGER), limbo=True)
        if proto == "v2":
            conn.data_received(b"".join(map(encode_request, [ReadRequest(0, LEDGER, 1), ReadRequest(0, LEDGER, 40)])))
            assert sorted(await answers(2, _v2)) == [(1, 0, E[1]), (40, StatusCode.EUNKNOWNLEDGERSTATE, None)]
        else:
            conn.data_received(b"".join([_v3_read(1, 2), _v3_read(2, 41)]))
            assert sorted(await answers(2, _v3)) == [(1, 0, 2, E[2]), (2, StatusCode.EUNKNOWNLEDGERSTATE, 41, b"")]
    _run(tmp_path, body)


@pytest.mark.parametrize("proto", ["v2", "v3"])
def test_a_client_not_reading_gets_no_answer_beyond_the_room(tmp_path, proto):
    async def body(bookie, proc, conn, transport, answers):
        transport.buffered = 70_000  # over max_response_bytes_per_connection: the client is not reading
        frames = [encode_request(ReadRequest(0, LEDGER, e)) if proto == "v2" else _v3_read(e + 1, e)
                  for e in range(10)]
        conn.data_received(b"".join(frames))
        parse = _v2 if proto == "v2" else _v3
        assert await answers(1, parse, tries=4) == []  # every read waits for room, its request alone
        assert len(conn._reads_waiting) == 10
        transport.buffered = 0
        conn.resume_writing()
        got = await answers(10, parse)
        assert sorted(g[-1] for g in got) == E
    _run(tmp_path, body, max_response_bytes_per_connection=65536)


def test_a_run_is_answered_within_the_room_and_the_rest_waits_its_turn(tmp_path):
    async def body(bookie, proc, conn, transport, answers):
        transport.buffered = 65536 - 200  # room for about two answers of 50 bytes, as one by one
        conn.data_received(b"".join(encode_request(ReadRequest(0, LEDGER, e)) for e in range(10)))
        assert 0 < len(conn._reads_waiting) < 10
        transport.buffered = 0
        conn.resume_writing()
        got = await answers(10, _v2)
        assert sorted(got) == [(e, 0, E[e]) for e in range(10)]
    _run(tmp_path, body, max_response_bytes_per_connection=65536)


def test_a_closed_connection_answers_nothing_more(tmp_path):
    async def body(bookie, proc, conn, transport, answers):
        transport.close()  # closed earlier in this read (a bad frame length in a previous slice)
        conn.data_received(b"".join(encode_request(ReadRequest(0, LEDGER, e)) for e in range(5)))
        conn.data_received(b"".join(_v3_read(e + 1, e) for e in range(5)))
        assert await answers(1, _v2, tries=4) == [] and not proc._tasks
    _run(tmp_path, body)


@pytest.mark.usefixtures("io_uring_reads")
@pytest.mark.parametrize("proto", ["v2", "v3"])
def test_a_cold_scan_of_single_reads_is_served_by_its_read_ahead(tmp_path, proto):
    """40 pipelined READs of entries only the entry logs hold (a client's readEntries): the
    first miss reads ahead, the others wait for it and are answered from the read cache; on
    2f38923 each of the 31 in the other read slots pread its own entry as well. The first
    to wait starts the next read-ahead (entries 100..299: a scan's second run is twice its
    first) before the client asks for them."""
    from types import SimpleNamespace
    from bk.bookie import Bookie
    from bk.config import load_config
    from bk.server.connection import BookieConnection
    from bk.server.processor import RequestProcessor

    cfg = load_config(env={}, overrides=dict(journal_dirs=[str(tmp_path / "j")], ledger_dirs=[str(tmp_path / "l")],
                                             read_io="ring"))
    entries = [_entry(e) for e in range(450)]

    async def write():
        b = Bookie(cfg)
        await b.start()
        try:
            for e, entry in enumerate(entries):
                await b.add_entry(LEDGER, e, entry, KEY)
        finally:
            await b.stop()

    async def read():
        b = Bookie(cfg)
        await b.start()
        try:
            preads = []
            pread = b._ring._pread
            b._ring._pread = lambda op, steps: preads.append(op) or pread(op, steps)
            proc = RequestProcessor(b, cfg)
            conn = BookieConnection(SimpleNamespace(config=cfg, processor=proc, connections=set()))
            conn.connection_made(transport := FakeTransport())
            frames = [encode_request(ReadRequest(0, LEDGER, e)) if proto == "v2" else _v3_read(e + 1, e)
                      for e in range(40)]
            assert b.storage.get_cached(LEDGER, 150) is None
            conn.data_received(b"".join(frames))
            decoder, got = FrameDecoder(), []
            for _ in range(400):
                await asyncio.sleep(0.005)
                got += [(_v2 if proto == "v2" else _v3)(f) for f in decoder.feed(b"".join(transport.out))]
                transport.out.clear()
                if len(got) == 40:
                    break
            assert sorted(g[-1] for g in got) == sorted(entries[:40])
            assert preads == []  # every entry came from the one read-ahead
            for _ in range(200):  # the read-ahead after the first runs in the background
                if b.storage.get_cached(LEDGER, 250) is not None:
                    break
                await asyncio.sleep(0.005)
            assert bytes(b.storage.get_cached(LEDGER, 250)) == entries[250]  # read ahead of the reader
            assert b.storage.get_cached(LEDGER, 300) is None
            # the client reads on (140..339): its hits past the middle of 100..299 start the next
            # read-ahead (300..) while it still reads from the cache; those of its READs that the
            # read-ahead in flight brings wait for it as callbacks, no task each
            more = [encode_request(ReadRequest(0, LEDGER, e)) if proto == "v2" else _v3_read(e + 1, e)
                    for e in range(140, 340)]
            gate, read_ahead = threading.Event(), b.storage._read_ahead

            def held_read_ahead(ledger_id, entry_id, *rest):  # in flight until the client asked
                if entry_id >= 300:
                    gate.wait(10)
                return read_ahead(ledger_id, entry_id, *rest)
            b.storage._read_ahead = held_read_ahead
            conn.data_received(b"".join(more[:160]))  # 140..299 from the cache, read on from 300
            for _ in range(400):
                if b._ring.read_aheads.covering(LEDGER, 310) is not None:
                    break
                await asyncio.sleep(0.001)
            assert b._ring.read_aheads.covering(LEDGER, 310) is not None
            before = set(proc._tasks)
            conn.data_received(b"".join(more[160:]))  # 300..339: being read ahead right now
            assert not set(proc._tasks) - before
            gate.set()
            got = []
            for _ in range(400):
                await asyncio.sleep(0.005)
                got += [(_v2 if proto == "v2" else _v3)(f) for f in decoder.feed(b"".join(transport.out))]
                transport.out.clear()
                if len(got) == 200:
                    break
            assert sorted(g[-1] for g in got) == sorted(entries[140:340])
            assert preads == []
            assert (conn.pending, conn._reads_running, len(conn._reads_waiting)) == (0, 0, 0)
            await proc.drain()
        finally:
            await b.stop()
    eventloop.run(write())
    eventloop.run(read())


def test_a_read_waiting_for_a_read_ahead_on_a_lost_connection_is_only_uncounted(tmp_path):
    from bk.server import single_reads

    async def body(bookie, proc, conn, transport, answers):
        assert conn.begin_read()  # as serve_run counts a READ that waits for a read-ahead
        conn.connection_lost(None)
        single_reads._ahead_done(ReadRequest(0, LEDGER, 1), LEDGER, 1, conn, bookie, proc._resume, 0.0, None)
        assert (conn.pending, proc.limits.reads, transport.out, proc._tasks) == (0, 0, [], set())
    _run(tmp_path, body)


def test_a_read_the_read_ahead_did_not_bring_frees_its_read_slot(tmp_path):
    """A READ that waited for a read-ahead whose entry is not in the read cache afterwards
    (evicted, the read-ahead failed, or no room) reads in a read slot and gives the slot back
    once answered. On 4f9edef it took two slots and gave one back: under load (the read cache
    churning) every such read leaked a slot until all 32 were gone and the connection's reads
    waited forever (tests/integration/test_client_cluster.py's stopped-bookie test hung in CI)."""
    from bk.server import single_reads

    async def body(bookie, proc, conn, transport, answers):
        for entry_id in (50, 51, 3):  # not in any cache (no such entry), twice; then one that is
            assert conn.begin_read()  # as serve_run counts a READ that waits for a read-ahead
            single_reads._ahead_done(ReadRequest(0, LEDGER, entry_id), LEDGER, entry_id, conn, bookie,
                                     proc._resume, 0.0, None)
        got = await answers(3, _v2)
        assert sorted(got) == [(3, 0, E[3]), (50, StatusCode.ENOENTRY, None), (51, StatusCode.ENOENTRY, None)]
        await proc.drain()
        assert (conn.pending, conn._reads_running, len(conn._reads_waiting), proc.limits.reads) == (0, 0, 0, 0)
    _run(tmp_path, body)


@pytest.mark.parametrize("k", ["pure", "native"])
def test_plain_reads_decode_in_the_kernel_exactly_as_decode_request(k):
    """The request kernel decodes plain READs (v0..2, no fence) into ReadRequests equal to
    codec.decode_request's; every other READ frame is deferred to it (fencing, bad ids, a bad
    length, version 3+), so what the server sees is unchanged."""
    import struct
    from bk.proto import AddRequest, RequestDecodeError
    from bk.proto.codec import decode_request

    mod = _native.load_pure("codec") if k == "pure" else _native.load_native("codec")
    if mod is None:
        pytest.skip("bk._native._codec is not built")
    frames = []
    for h in (2, 1 << 24 | 2 << 16, 2 << 24 | 2 << 16, 2 << 24 | 2 << 16 | 0x4, 2 << 24 | 2 << 16 | 1,
              3 << 24 | 2 << 16, 2 << 24 | 1 << 16):
        for lid, eid in ((0, 0), (7, -1), (7, -2), (-1, 3), (2**63 - 1, 2**63 - 1)):
            frames.append(struct.pack(">Iqq", h, lid, eid))
    frames.append(struct.pack(">Iqq", 2 << 24 | 2 << 16 | 1, 7, 3) + KEY)  # a fencing read with its key
    frames.append(struct.pack(">Iqqi", 2 << 24 | 2 << 16, 7, 3, 0))  # one int too many
    buf = b"".join(struct.pack(">i", len(f)) + f for f in frames)
    items, end, err, deferred = mod.scan_add_requests(buf, 0, 1 << 20, AddRequest, ReadRequest)
    assert (end, err) == (len(buf), 0) and len(items) == len(frames)
    decoded = 0
    for i, (item, frame) in enumerate(zip(items, frames)):
        try:
            want = decode_request(frame)
        except RequestDecodeError:
            want = None
        if i in deferred:
            assert item[1] == len(frame)  # (offset, length): decode_request's to decide
            continue
        assert type(item) is ReadRequest and item == want and want.master_key is None
        decoded += 1
    assert decoded == 12  # ids (0, 0), (7, -1) and the largest, under the 4 plain headers (v0, v1, v2, v2 high priority)
    assert len(items) - len(deferred) == decoded
