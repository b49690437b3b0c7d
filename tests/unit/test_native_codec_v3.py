"""The v3 ADD and plain READ kernels against the protobuf library (the reference) and native against pure:
generated Requests/Responses (hypothesis), their byte mutations, and hand-made edge cases."""
import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from bk._native import load_native, load_pure
from bk.proto import AddRequest, AddResponse, FrameDecoder, ReadRequest, ReadResponse, encode_request, v3
from bk.client.wire_v3 import request_to_v3
from bk.proto.constants import V2_STATUS_BY_V3
from bk.formats.wire import FLAG_DEFERRED_SYNC, FLAG_DO_FENCING

PURE = load_pure("codec_v3")
NATIVE = load_native("codec_v3")
KERNELS = [PURE] + ([NATIVE] if NATIVE is not None else [])
KEY = bytes(range(20))
STATUS_MAP = {v3_code: int(v2) for v3_code, v2 in V2_STATUS_BY_V3.items()}
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def reference_records(buf: bytes) -> list:
    """What the protobuf library makes of each frame: a V3AddRequest, or None (slow path)."""
    out = []
    for body in FrameDecoder(1 << 24).feed(buf):
        try:
            req = v3.parse(v3.Request, body)
        except v3.V3DecodeError:
            out.append(None)
            continue
        item = v3.request_item(req, [None])
        out.append(item if isinstance(item, v3.V3AddRequest) else None)
    return out


int64 = st.integers(-(1 << 63), (1 << 63) - 1)


@st.composite
def requests(draw):
    req = v3.Request()
    h = req.header
    h.version = draw(st.sampled_from([1, 2, 3]))
    h.operation = draw(st.sampled_from([1, 2, 2, 2, 5, 7]))
    h.txnId = draw(st.integers(0, (1 << 64) - 1))
    if draw(st.booleans()):
        h.priority = draw(st.integers(0, (1 << 32) - 1))
    if draw(st.integers(0, 9)):
        a = req.addRequest
        a.ledgerId = draw(st.one_of(st.integers(0, 1 << 40), int64))
        a.entryId = draw(st.one_of(st.integers(0, 1 << 20), int64))
        a.masterKey = draw(st.one_of(st.just(KEY), st.binary(max_size=24)))
        a.body = draw(st.binary(max_size=64))
        if draw(st.booleans()):
            a.flag = 1
        if draw(st.booleans()):
            a.writeFlags = draw(st.integers(-(1 << 31), (1 << 31) - 1))
    if not draw(st.integers(0, 9)):
        req.readRequest.ledgerId, req.readRequest.entryId = 1, 2
    if not draw(st.integers(0, 19)):
        req.requestContext.add(key="k", value="v")
    return req.SerializePartialToString()


def mutate(data: bytes, edits) -> bytes:
    b = bytearray(data)
    for pos, value in edits:
        if b:
            b[pos % len(b)] = value
    return bytes(b)


@SETTINGS
@given(st.lists(requests(), min_size=1, max_size=6),
       st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=3))
def test_scan_v3_add_requests_takes_only_what_protobuf_reads_the_same(bodies, edits):
    bodies = [mutate(b, edits) if i == 0 else b for i, b in enumerate(bodies)]
    buf = b"".join(frame(b) for b in bodies)
    ref = reference_records(buf)
    results = [k.scan_v3_add_requests(buf, 0, 1 << 24, v3.V3AddRequest) for k in KERNELS]
    assert all(r == results[0] for r in results)  # native == pure
    items, end, err, deferred = results[0]
    assert end == len(buf) and err == 0
    for i, item in enumerate(items):
        if i in deferred:
            continue
        assert item == ref[i]  # taken: exactly the library's reading
    # canonical, valid ADDs are always taken (the fast path is not vacuous)
    for i, r in enumerate(ref):
        if r is None:
            continue
        msg = v3.parse(v3.Request, bodies[i])
        msg.DiscardUnknownFields()  # a field of the wrong wire type is an unknown field: the kernel defers it
        if msg.SerializeToString() == bodies[i] and {f.name for f, _ in msg.ListFields()} == {"header", "addRequest"}:
            assert i not in deferred


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, (1 << 63) - 1), st.integers(0, (1 << 63) - 1),
                          st.integers(0, (1 << 64) - 1), st.integers(0, (1 << 32) - 1)), max_size=8),
       st.sampled_from(sorted(STATUS_MAP)))
def test_v3_add_responses_are_the_librarys_bytes_and_read_back(rows, status):
    recs = [v3.V3AddRequest(0, KEY, lid, eid, b"", 3, txn, prio) for lid, eid, txn, prio in rows]
    want = []
    for r in recs:
        resp = v3.Response()
        resp.header.version, resp.header.operation, resp.header.txnId = 3, 2, r.txn_id
        if r.priority:
            resp.header.priority = r.priority
        resp.status = status
        resp.addResponse.status, resp.addResponse.ledgerId, resp.addResponse.entryId = status, r.ledger_id, r.entry_id
        want.append(v3.frame(resp))
    for k in KERNELS:
        buf = k.encode_v3_add_responses(recs, status)
        assert buf == b"".join(want)
        items, end, err, deferred = k.scan_v3_add_responses(buf, 0, 1 << 24, STATUS_MAP)
        assert not deferred and err == 0 and end == len(buf)
        assert items == [(STATUS_MAP[status], r.ledger_id, r.entry_id) for r in recs]


@SETTINGS
@given(st.binary(max_size=200), st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=4))
def test_scan_v3_add_responses_agrees_with_the_library_on_mutations(junk, edits):
    ok = PURE.encode_v3_add_responses([v3.V3AddRequest(0, KEY, 5, 6, b"", 3, 7, 0)], 0)
    bodies = [mutate(ok[4:], edits), junk]
    buf = b"".join(frame(b) for b in bodies)
    results = [k.scan_v3_add_responses(buf, 0, 1 << 24, STATUS_MAP) for k in KERNELS]
    assert all(r == results[0] for r in results)
    items, _, _, deferred = results[0]
    for i, item in enumerate(items):
        if i not in deferred:
            assert tuple(v3.response_to_v2(bodies[i])) == tuple(item)


@SETTINGS
@given(st.integers(0, (1 << 63) - 1), st.integers(0, (1 << 63) - 1), st.integers(0, (1 << 64) - 1),
       st.binary(min_size=32, max_size=80), st.sampled_from([0, 2, 4, 6, 8, 10, 14]))
def test_v2_add_frames_become_the_librarys_v3_requests(ledger_id, entry_id, txn, tail, flags):
    body = struct.pack(">qq", ledger_id, entry_id) + tail
    v2 = encode_request(AddRequest(flags, KEY, ledger_id, entry_id, body))
    req = v3.Request()
    req.header.version, req.header.operation, req.header.txnId = 3, 2, txn
    a = req.addRequest
    a.ledgerId, a.entryId, a.masterKey, a.body = ledger_id, entry_id, KEY, body
    if flags & 2:
        a.flag = 1
    if flags & FLAG_DEFERRED_SYNC:  # bk's internal v2 flag: writeFlags DEFERRED_SYNC in v3
        a.writeFlags = v3.WRITE_FLAG_DEFERRED_SYNC
    for k in KERNELS:
        assert k.v3_add_request_from_v2(v2, txn) == v3.frame(req)
    assert request_to_v3(v2, txn) == v3.frame(req)  # the slow path says the same
    back = k.scan_v3_add_requests(v3.frame(req), 0, 1 << 24, v3.V3AddRequest)[0][0]
    assert back.flags == flags & (2 | FLAG_DEFERRED_SYNC)  # and the bookie reads the flags back


@pytest.mark.parametrize("k", KERNELS)
def test_v3_request_from_v2_leaves_other_frames(k):
    add = encode_request(AddRequest(0, KEY, 1, 2, struct.pack(">qq", 1, 2) + bytes(24)))
    assert k.v3_add_request_from_v2(add, 1) is not None
    assert k.v3_add_request_from_v2(add[:-1], 1) is None  # the length prefix disagrees
    assert k.v3_add_request_from_v2(add[:4] + b"\x00\x00\x00\x01" + add[8:], 1) is None  # version 0
    assert k.v3_add_request_from_v2(b"\x00\x00\x00\x14" + struct.pack(">Iqq", (2 << 24) | (2 << 16), 1, 2), 1) is None


@pytest.mark.parametrize("k", KERNELS)
def test_duplicate_and_unknown_fields_are_deferred(k):
    good = PURE.v3_add_request_from_v2(encode_request(AddRequest(0, KEY, 1, 2, struct.pack(">qq", 1, 2) + bytes(24))), 9)
    body = good[4:]
    variants = [body + body[:body.index(b"\xaa\x06")],  # a second header: the library merges them
                body + b"\xc2\x0c\x00",  # requestContext (field 200), empty
                body + b"\x18\x01",  # an unknown top-level varint field 3
                ]
    buf = b"".join(frame(b) for b in [body] + variants)
    items, _, _, deferred = k.scan_v3_add_requests(buf, 0, 1 << 20, v3.V3AddRequest)
    assert deferred == [1, 2, 3] and items[0].txn_id == 9


def test_feed_v3_requests_falls_back_to_v2_for_good_at_the_first_non_v3_frame():
    entry = struct.pack(">qq", 1, 0) + bytes(24)
    v2_add = encode_request(AddRequest(0, KEY, 1, 0, entry))
    v3_add = PURE.v3_add_request_from_v2(v2_add, 5)
    read = v3.Request()
    read.header.version, read.header.operation, read.header.txnId = 3, 1, 6
    read.readRequest.ledgerId, read.readRequest.entryId = 1, 0
    dec = FrameDecoder()
    items = dec.feed_v3_requests(v3_add + v3.frame(read) + v2_add + v3_add)
    assert isinstance(items[0], v3.V3AddRequest) and items[0].txn_id == 5
    # a plain READ: the kernel's record (tests/unit/test_v3_read_decode.py)
    assert isinstance(items[1], v3.V3ReadRequest) and v3.read_request(items[1]).header.txnId == 6
    assert isinstance(items[2], AddRequest) and items[2].entry_id == 0
    assert items[3].code == 103  # a v3 frame after the fallback is a v2 header of version 10: EBADVERSION
    assert dec.v3_failed
    # byte by byte: the same items
    dec2 = FrameDecoder()
    got = []
    for b in v3_add + v3.frame(read):
        got += dec2.feed_v3_requests(bytes([b]))
    assert got[0] == items[0] and got[1] == items[1] and not dec2.v3_failed


# ---------------------------------------------------------------- plain READs, a client's side
@SETTINGS
@given(st.integers(0, (1 << 63) - 1), st.integers(0, (1 << 63) - 1), st.integers(0, (1 << 64) - 1))
def test_v2_read_frames_become_the_librarys_v3_requests(ledger_id, entry_id, txn):
    v2 = encode_request(ReadRequest(0, ledger_id, entry_id))
    req = v3.Request()
    req.header.version, req.header.operation, req.header.txnId = 3, v3.OperationType.READ_ENTRY, txn
    req.readRequest.ledgerId, req.readRequest.entryId = ledger_id, entry_id
    for k in KERNELS:
        assert k.v3_read_request_from_v2(v2, txn) == v3.frame(req)
        assert k.v3_add_request_from_v2(v2, txn) is None
    assert request_to_v3(v2, txn) == v3.frame(req)  # the slow path says the same


@pytest.mark.parametrize("k", KERNELS)
def test_v3_read_request_from_v2_leaves_fencing_last_entry_and_other_frames(k):
    plain = encode_request(ReadRequest(0, 1, 2))
    assert k.v3_read_request_from_v2(plain, 1) is not None
    others = [encode_request(ReadRequest(FLAG_DO_FENCING, 1, 2, KEY)),  # carries the key: the library
              encode_request(ReadRequest(0, 1, -1)),  # entry -1: the library
              plain[:-1], plain + b"\0",  # the length prefix disagrees
              plain[:4] + b"\x00\x00\x00\x02" + plain[8:],  # version 0
              plain[:4] + bytes([2, 2, 0, 4]) + plain[8:],  # an unknown flag bit
              encode_request(AddRequest(0, KEY, 1, 2, struct.pack(">qq", 1, 2) + bytes(24)))]
    for f in others:
        assert k.v3_read_request_from_v2(f, 1) is None, f


def read_response(status, ledger_id, entry_id, *, body=None, top_status=None, max_lac=None, priority=None,
                  op=v3.OperationType.READ_ENTRY):
    resp = v3.Response()
    resp.header.version, resp.header.operation, resp.header.txnId = 3, op, 9
    if priority is not None:
        resp.header.priority = priority
    resp.status = status if top_status is None else top_status
    r = resp.readResponse
    r.status, r.ledgerId, r.entryId = status, ledger_id, entry_id
    if body is not None:
        r.body = body
    if max_lac is not None:
        r.maxLAC = max_lac
    return v3.frame(resp)


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(sorted(STATUS_MAP)), int64, int64, st.none() | st.binary(max_size=300),
                          st.none() | st.sampled_from(sorted(STATUS_MAP)), st.none() | int64,
                          st.none() | st.integers(0, (1 << 32) - 1)), min_size=1, max_size=6))
def test_scan_v3_read_responses_is_what_the_library_answers(rows):
    bodies = [read_response(s, lid, eid, body=b, top_status=ts, max_lac=lac, priority=prio)[4:]
              for s, lid, eid, b, ts, lac, prio in rows]
    buf = b"".join(frame(b) for b in bodies)
    results = [k.scan_v3_add_responses(buf, 0, 1 << 24, STATUS_MAP, read_record=ReadResponse) for k in KERNELS]
    assert all(r == results[0] for r in results)
    items, end, err, deferred = results[0]
    assert end == len(buf) and err == 0
    for i, (row, body) in enumerate(zip(rows, bodies)):
        want = v3.response_to_v2(body)
        if row[5] is not None:  # maxLAC: a long poll's answer, the library's
            assert i in deferred
            continue
        assert i not in deferred and type(items[i]) is ReadResponse and items[i] == want
        assert type(want) is ReadResponse and (want.body is None) == (want.rc != 0)
    # without read_record a READ answer is the library's, as before
    assert PURE.scan_v3_add_responses(buf, 0, 1 << 24, STATUS_MAP)[3] == list(range(len(rows)))


@SETTINGS
@given(st.binary(max_size=200), st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=4))
def test_scan_v3_read_responses_agrees_with_the_library_on_mutations(junk, edits):
    ok = read_response(0, 5, 6, body=b"entry bytes")
    bodies = [mutate(ok[4:], edits), junk]
    buf = b"".join(frame(b) for b in bodies)
    results = [k.scan_v3_add_responses(buf, 0, 1 << 24, STATUS_MAP, AddResponse, ReadResponse) for k in KERNELS]
    assert all(r == results[0] for r in results)
    items, _, _, deferred = results[0]
    for i, item in enumerate(items):
        if i not in deferred:
            assert v3.response_to_v2(bodies[i]) == item


@pytest.mark.parametrize("k", KERNELS)
def test_read_answers_with_duplicates_or_a_header_of_another_operation_are_deferred(k):
    good = read_response(0, 1, 2, body=b"x")[4:]
    read_at = good.index(b"\xa2\x06")  # Response.readResponse
    variants = [good + good[read_at:],  # a second readResponse: the library merges them
                good + b"\x10\x00",  # a second Response.status
                read_response(0, 1, 2, body=b"x", op=v3.OperationType.ADD_ENTRY)[4:],  # header says ADD
                good[:read_at] + good[read_at:] + b"\x18\x01",  # an unknown top-level field 3
                ]
    buf = b"".join(frame(b) for b in [good] + variants)
    items, _, _, deferred = k.scan_v3_add_responses(buf, 0, 1 << 20, STATUS_MAP, read_record=ReadResponse)
    assert deferred == [1, 2, 3, 4] and items[0] == ReadResponse(0, 1, 2, b"x")
