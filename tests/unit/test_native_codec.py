"""The codec kernel: the pure twin is the reference; the native build must agree."""
import gc
import random
import struct
from typing import NamedTuple

import google_crc32c
import pytest

from bk._native import load_native, load_pure

PURE = load_pure("codec")
NATIVE = load_native("codec")
KERNELS = [pytest.param(PURE, id="pure"),
           pytest.param(NATIVE, id="native",
                        marks=pytest.mark.skipif(NATIVE is None, reason="native codec not built"))]
needs_native = pytest.mark.skipif(NATIVE is None, reason="native codec not built")

KEY = bytes(range(20))


class AddRecord(NamedTuple):
    flags: int
    master_key: bytes
    ledger_id: int
    entry_id: int
    body: bytes
    version: int


class AddAck(NamedTuple):
    rc: int
    ledger_id: int
    entry_id: int


class ReadAnswer(NamedTuple):
    rc: int
    ledger_id: int
    entry_id: int
    body: object


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def header(version, op, flags=0):
    return op if version == 0 else (version << 24) | (op << 16) | flags


def add_body(ledger_id, entry_id, payload=b"p", *, version=2, flags=0, key=KEY, op=1):
    entry = struct.pack(">qqqq", ledger_id, entry_id, entry_id - 1, len(payload)) + payload
    return struct.pack(">I", header(version, op, flags)) + key + entry


@pytest.mark.parametrize("k", KERNELS)
def test_split_frames_complete_and_partial(k):
    buf = frame(b"abc") + frame(b"") + frame(b"x" * 10) + b"\x00\x00\x00\x05ab"
    frames, end, err = k.split_frames(buf, 0, 100)
    assert frames == [(4, 3), (11, 0), (15, 10)]
    assert (end, err) == (25, k.ERR_OK)
    assert k.split_frames(buf, 7, 100) == ([(11, 0), (15, 10)], 25, 0)
    assert k.split_frames(b"\x00\x00", 0, 100) == ([], 0, 0)
    assert k.split_frames(b"", 0, 100) == ([], 0, 0)


@pytest.mark.parametrize("k", KERNELS)
def test_split_frames_bad_lengths_reported_before_the_body(k):
    good = frame(b"ok")
    # Only the 4 length bytes are present: the error must not wait for a body.
    assert k.split_frames(good + struct.pack(">i", -1), 0, 100) == ([(4, 2)], 6, k.ERR_NEGATIVE_LENGTH)
    assert k.split_frames(good + struct.pack(">i", 101), 0, 100) == ([(4, 2)], 6, k.ERR_FRAME_TOO_LARGE)
    assert k.split_frames(struct.pack(">i", 100) + b"x" * 100, 0, 100) == ([(4, 100)], 104, 0)
    assert k.split_frames(struct.pack(">i", -(1 << 31)), 0, 1 << 40)[2] == k.ERR_NEGATIVE_LENGTH


@pytest.mark.parametrize("k", KERNELS)
def test_split_frames_argument_checks(k):
    with pytest.raises(ValueError):
        k.split_frames(b"abc", 4, 10)
    with pytest.raises(ValueError):
        k.split_frames(b"abc", -1, 10)
    with pytest.raises(ValueError):
        k.scan_add_requests(b"abc", 0, -1)
    with pytest.raises(TypeError):
        k.split_frames("text", 0, 10)


@pytest.mark.parametrize("k", KERNELS)
def test_scan_add_requests_decodes_adds_and_defers_the_rest(k):
    a0 = add_body(7, 0, b"hello", flags=2)
    a1 = add_body(7, 1, b"")
    v0 = add_body(8, 3, version=0)
    neg = add_body(7, -1)
    read = struct.pack(">Iqq", header(2, 2), 7, 0)
    buf = bytearray(frame(a0) + frame(a1) + frame(read) + frame(v0) + frame(neg) + frame(a0[:55]))
    items, end, err, deferred = k.scan_add_requests(buf, 0, 1 << 20)
    assert (end, err, deferred) == (len(buf), 0, [2, 4, 5])
    assert all(type(it) is tuple for it in items)
    assert items[0] == (2, KEY, 7, 0, a0[24:], 2)
    assert items[1] == (0, KEY, 7, 1, a1[24:], 2)
    assert items[2] == (len(a0) + len(a1) + 12, 20)
    assert items[3] == (0, KEY, 8, 3, v0[24:], 0)
    assert len(items[4]) == 2 and len(items[5]) == 2  # negative entry id, short body
    assert items[0][1] is items[1][1]  # one key object shared within a call
    assert type(items[0][4]) is bytes


@pytest.mark.parametrize("k", KERNELS)
def test_scan_add_requests_rejects_bad_versions_and_ops(k):
    cases = [add_body(1, 1, version=3), add_body(1, 1, op=2), add_body(-4, 1),
             struct.pack(">I", 0x00000101) + add_body(1, 1)[4:]]  # v0 header 257 is no ADD
    items, _, _, deferred = k.scan_add_requests(b"".join(frame(c) for c in cases), 0, 1000)
    assert all(len(it) == 2 for it in items) and deferred == [0, 1, 2, 3]


@pytest.mark.parametrize("k", KERNELS)
def test_records_are_built_in_the_given_tuple_type(k):
    bodies = [add_body(3, i, bytes([i % 256]) * i) for i in range(300)]
    buf = b"".join(frame(b) for b in bodies) + frame(b"other")
    items, _, _, deferred = k.scan_add_requests(buf, 0, 1000, AddRecord)
    del buf
    gc.collect()  # records must be complete, tracked objects
    assert deferred == [300]
    assert all(type(it) is AddRecord for it in items[:300])
    assert [it.entry_id for it in items[:300]] == list(range(300))
    assert items[299].body == bodies[299][24:] and items[5] == AddRecord(0, KEY, 3, 5, bodies[5][24:], 2)
    acks, _, _, deferred = k.scan_add_responses(k.encode_add_responses([(0, 3, 1)] * 3), 0, 24, AddAck)
    assert acks == [AddAck(0, 3, 1)] * 3 and type(acks[0]) is AddAck and deferred == []


class WithDict(tuple):
    pass


@pytest.mark.parametrize("k", KERNELS)
@pytest.mark.parametrize("record", [list, WithDict, 5, None])
def test_record_type_must_be_a_plain_tuple_layout(k, record):
    with pytest.raises(TypeError):
        k.scan_add_requests(frame(add_body(1, 1)), 0, 1000, record)
    with pytest.raises(TypeError):
        k.scan_add_responses(b"", 0, 1000, record)


@pytest.mark.parametrize("k", KERNELS)
@pytest.mark.parametrize("version", [0, 1, 2])
def test_encode_add_responses_layout(k, version):
    rows = [(0, 1, 2), (104, (1 << 63) - 1, -(1 << 63)), (-3, 0, -1)]
    out = k.encode_add_responses(rows, version)
    h = header(version, 1)
    assert out == b"".join(struct.pack(">iIiqq", 24, h, *r) for r in rows)
    assert k.scan_add_responses(out, 0, 24) == (rows, len(out), 0, [])
    assert k.encode_add_responses([], version) == b""


@pytest.mark.parametrize("k", KERNELS)
def test_encode_add_responses_errors(k):
    with pytest.raises(ValueError):
        k.encode_add_responses([(0, 1, 2)], 3)
    with pytest.raises(OverflowError):
        k.encode_add_responses([(1 << 31, 1, 2)], 2)
    with pytest.raises(OverflowError):
        k.encode_add_responses([(0, 1 << 63, 2)], 2)
    with pytest.raises(ValueError):
        k.encode_add_responses([(0, 1)], 2)


@pytest.mark.parametrize("k", KERNELS)
def test_scan_add_responses_defers_other_frames(k):
    read_err = struct.pack(">Iiqq", header(2, 2), 2, 5, 6)
    add_long = struct.pack(">Iiqq", header(2, 1), 0, 5, 6) + b"x"
    bad_version = struct.pack(">Iiqq", header(3, 1), 0, 5, 6)
    ok = struct.pack(">Iiqq", header(0, 1), -7, 5, 6)
    buf = b"".join(frame(x) for x in (read_err, add_long, bad_version, ok))
    items, end, err, deferred = k.scan_add_responses(buf, 0, 100)
    assert items == [(4, 24), (32, 25), (61, 24), (-7, 5, 6)] and (end, err) == (len(buf), 0)
    assert deferred == [0, 1, 2]


@pytest.mark.parametrize("k", KERNELS)
def test_scan_add_responses_takes_read_answers_as_decode_response_gives_them(k):
    from bk.proto import codec
    read_ok = struct.pack(">Iiqq", header(2, 2), 0, 5, 6) + b"entry bytes"
    read_empty = struct.pack(">Iiqq", header(1, 2), 0, 5, 7)  # EOK, no body bytes: an empty entry
    read_err = struct.pack(">Iiqq", header(2, 2), -13, 5, 8)  # ENOENTRY
    read_err_tail = read_err + b"x"  # an error answer with bytes: the slow path's error
    read_v3 = struct.pack(">Iiqq", header(3, 2), 0, 5, 9) + b"y"
    read_v0 = struct.pack(">Iiqq", 2, 0, 5, 10) + b"z"  # version 0: the header int is the op
    bodies = (read_ok, read_empty, read_err, read_err_tail, read_v3, read_v0)
    buf = bytearray(b"".join(frame(x) for x in bodies))
    items, end, err, deferred = k.scan_add_responses(bytes(buf), 0, 100, AddAck, ReadAnswer)
    assert deferred == [3, 4] and (end, err) == (len(buf), 0)
    for i, body in enumerate(bodies):
        if i not in deferred:
            want = codec.decode_response(memoryview(body))
            assert type(items[i]) is ReadAnswer and tuple(items[i]) == tuple(want), i
    assert type(items[0].body) is memoryview and items[0].body == b"entry bytes"  # a view, not a copy
    assert items[1].body == b"" and items[2].body is None
    # without read_record, every READ answer is deferred, as before
    assert k.scan_add_responses(bytes(buf), 0, 100)[3] == list(range(len(bodies)))


@pytest.mark.parametrize("k", KERNELS)
def test_crc32c_entry_ids_checks_the_digest_over_header_and_payload(k):
    rng = random.Random(11)
    for n in (0, 1, 100, 70_000):  # 70,000: the payload's CRC runs without the GIL
        head = struct.pack(">qqqq", rng.getrandbits(63), rng.getrandbits(63), rng.getrandbits(63) - (1 << 62), n)
        payload = rng.randbytes(n)
        digest = struct.pack(">I", google_crc32c.extend(google_crc32c.value(head), payload))
        entry = head + digest + payload
        assert k.crc32c_entry_ids(entry) == struct.unpack(">qqqq", head)
        assert k.crc32c_entry_ids(memoryview(bytearray(entry))) == struct.unpack(">qqqq", head)
        for at in {0, 31, 32, 35, len(entry) - 1}:  # a flipped bit in the header, digest or payload
            bad = bytearray(entry)
            bad[at] ^= 0x10
            assert k.crc32c_entry_ids(bytes(bad)) is None, at
    assert k.crc32c_entry_ids(b"") is None and k.crc32c_entry_ids(bytes(35)) is None


@pytest.mark.parametrize("k", KERNELS)
def test_crc32c_matches_google(k):
    assert k.crc32c(b"123456789") == 0xE3069283
    rng = random.Random(5)
    for n in (0, 1, 7, 64, 1000, 70_000):
        data = rng.randbytes(n)
        seed = rng.getrandbits(32)
        assert k.crc32c(data) == google_crc32c.value(data)
        assert k.crc32c(memoryview(data)[1:], seed) == google_crc32c.extend(seed, data[1:])
    with pytest.raises(ValueError):
        k.crc32c(b"x", 1 << 32)


def _random_stream(rng):
    parts = []
    for _ in range(rng.randrange(1, 40)):
        kind = rng.random()
        if kind < 0.5:
            body = add_body(rng.choice([0, 1, 9, -2]), rng.choice([0, 5, -1, 1 << 40]),
                            rng.randbytes(rng.randrange(0, 200)), version=rng.choice([0, 1, 2, 2, 3]),
                            flags=rng.getrandbits(16), key=rng.choice([KEY, bytes(20), rng.randbytes(20)]),
                            op=rng.choice([1, 1, 1, 2, 7]))
            if rng.random() < 0.1:
                body = body[:rng.randrange(len(body))]
            parts.append(frame(body))
        elif kind < 0.6:
            parts.append(frame(struct.pack(">Iiqq", rng.getrandbits(32), rng.getrandbits(31),
                                           rng.getrandbits(63), rng.getrandbits(63))))
        elif kind < 0.7:  # READ answers (and ADD ones) of every version, rc and length
            parts.append(frame(struct.pack(">Iiqq", header(rng.choice([0, 1, 2, 3]), rng.choice([1, 2, 2])),
                                           rng.choice([0, 0, -13, rng.getrandbits(31)]), rng.getrandbits(63),
                                           rng.getrandbits(63)) + rng.randbytes(rng.choice([0, 0, 1, 50]))))
        elif kind < 0.9:
            parts.append(frame(rng.randbytes(rng.randrange(0, 80))))
        else:
            parts.append(rng.randbytes(rng.randrange(0, 12)))  # garbage, often a bad length
    return b"".join(parts)


@needs_native
def test_native_and_pure_agree_on_random_streams():
    rng = random.Random(20240601)
    for _ in range(400):
        buf = _random_stream(rng)
        start = rng.randrange(0, min(len(buf), 8) + 1)
        max_frame = rng.choice([0, 24, 100, 300, 1 << 20])
        for fn in ("split_frames", "scan_add_requests", "scan_add_responses"):
            assert getattr(NATIVE, fn)(buf, start, max_frame) == getattr(PURE, fn)(buf, start, max_frame), fn
        for fn, record in (("scan_add_requests", AddRecord), ("scan_add_responses", AddAck)):
            got = getattr(NATIVE, fn)(buf, start, max_frame, record)
            want = getattr(PURE, fn)(buf, start, max_frame, record)
            assert got == want and [type(x) for x in got[0]] == [type(x) for x in want[0]], fn
        got = NATIVE.scan_add_responses(buf, start, max_frame, AddAck, ReadAnswer)
        want = PURE.scan_add_responses(buf, start, max_frame, AddAck, ReadAnswer)
        assert got == want and [type(x) for x in got[0]] == [type(x) for x in want[0]]


@needs_native
def test_native_and_pure_agree_on_random_garbage():
    rng = random.Random(99)
    for _ in range(2000):
        buf = rng.randbytes(rng.randrange(0, 300))
        max_frame = rng.choice([0, 50, 1 << 31])
        for fn in ("split_frames", "scan_add_requests", "scan_add_responses"):
            assert getattr(NATIVE, fn)(buf, 0, max_frame) == getattr(PURE, fn)(buf, 0, max_frame), fn


@needs_native
def test_native_and_pure_encode_the_same():
    rng = random.Random(3)
    for _ in range(200):
        rows = [(rng.randrange(-(1 << 31), 1 << 31), rng.randrange(-(1 << 63), 1 << 63),
                 rng.randrange(-(1 << 63), 1 << 63)) for _ in range(rng.randrange(0, 50))]
        version = rng.choice([0, 1, 2])
        assert NATIVE.encode_add_responses(rows, version) == PURE.encode_add_responses(rows, version)


@pytest.mark.parametrize("k", KERNELS)
def test_frame_add_crc32c_layout(k):
    from bk.proto import DigestManager, decode_request
    payload = b"payload bytes"
    frame_bytes = k.frame_add_crc32c((2 << 24) | (1 << 16) | 4, KEY, 7, 3, 2, 99, payload)
    (length,) = struct.unpack_from(">i", frame_bytes)
    assert length == len(frame_bytes) - 4 == 4 + 20 + 32 + 4 + len(payload)
    req = decode_request(memoryview(frame_bytes)[4:])
    assert (req.flags, req.master_key, req.ledger_id, req.entry_id) == (4, KEY, 7, 3)
    # the body is exactly what the client's DigestManager frames for this entry
    assert bytes(req.body) == DigestManager(7, "CRC32C").frame_entry(3, 2, 99, payload)
    with pytest.raises(ValueError):
        k.frame_add_crc32c(0, b"short", 7, 3, 2, 99, payload)


@needs_native
def test_native_and_pure_frame_adds_the_same():
    rng = random.Random(11)
    for _ in range(300):
        args = (rng.randrange(1 << 32), rng.randbytes(20), rng.randrange(-1, 1 << 63), rng.randrange(-1, 1 << 63),
                rng.randrange(-1, 1 << 63), rng.randrange(0, 1 << 63),
                rng.randbytes(rng.choice([0, 1, 7, 100, 1024, 5000, 70000])))
        assert NATIVE.frame_add_crc32c(*args) == PURE.frame_add_crc32c(*args)
        assert NATIVE.frame_add_crc32c(*args[:-1], bytearray(args[-1])) == PURE.frame_add_crc32c(*args)


# ---------------------------------------------------------------- the bookie's ADD batch
def entry_body(ledger_id, entry_id, lac=-1, payload=b"p"):
    return struct.pack(">qqqq", ledger_id, entry_id, lac, len(payload)) + payload


@pytest.mark.parametrize("k", KERNELS)
def test_scan_add_run_segments(k):
    other = bytes(bytearray(KEY))  # equal bytes, another object: a new segment

    def add(lid, eid, key=KEY, flags=0, lac=-1, body=None):
        return AddRecord(flags, key, lid, eid, entry_body(lid, eid, lac) if body is None else body, 2)
    reqs = [add(1, 0), add(1, 1, lac=5, flags=1), add(1, 2, flags=2), add(1, 3, flags=3, lac=7),  # recovery bit
            add(1, 4, key=other), add(2, 0, lac=9), add(1, 5),                                   # key, ledger
            add(2, -1), add(2, 1, body=entry_body(2, 2)), add(2, 1, body=entry_body(3, 1)),     # bad ids
            add(2, 1, body=bytearray(entry_body(2, 1))), add(2, 1, body=b"short"), (0, KEY, 2, 1), "x",
            add(2, 1, key=bytearray(KEY)), add(1 << 63, 1, body=entry_body(0, 1)), add(2, 1, flags=1 << 64),
            add(2, 1, lac=-5), (0, KEY, 2, 2, entry_body(2, 2, 4))]                             # plain tuples too
    assert k.scan_add_run(reqs) == [
        (0, 2, 5), (2, 4, 7), (4, 5, -1), (5, 6, 9), (6, 7, -1),
        *[(i, i + 1, None) for i in range(7, 17)], (17, 19, 4)]
    assert k.scan_add_run([]) == [] and k.scan_add_run(tuple(reqs[:2])) == [(0, 2, 5)]


@needs_native
def test_native_and_pure_scan_add_runs_the_same():
    rng = random.Random(5)
    keys = [KEY, bytes(bytearray(KEY)), bytes(20)]
    for _ in range(300):
        reqs = []
        for _ in range(rng.randrange(0, 40)):
            lid, eid = rng.choice([0, 1, 2, -1, 1 << 62]), rng.choice([0, 1, 5, -2, 1 << 62])
            body = entry_body(lid if rng.random() < 0.9 else lid + 1, eid, rng.randrange(-3, 1 << 40))
            reqs.append(AddRecord(rng.choice([0, 1, 2, 3]), rng.choice(keys), lid, eid,
                                  body if rng.random() < 0.95 else body[:rng.randrange(0, 30)], 2))
        assert NATIVE.scan_add_run(reqs) == PURE.scan_add_run(reqs)


@pytest.mark.parametrize("k", KERNELS)
def test_encode_add_acks_is_encode_add_responses_of_one_rc(k):
    reqs = [AddRecord(0, KEY, 7, e, b"", 2) for e in range(5)] + [(0, KEY, 8, 1 << 62)]
    for version in (0, 1, 2):
        want = k.encode_add_responses([(-101, r[2], r[3]) for r in reqs], version)
        assert k.encode_add_acks(reqs, -101, version) == want
    assert k.encode_add_acks([], 0) == b""
    for bad_reqs, rc, version, err in (([(0, KEY, 1 << 63, 0)], 0, 2, OverflowError),
                                       (reqs, 1 << 31, 2, OverflowError), ([(0, KEY, 1)], 0, 2, IndexError),
                                       (reqs, 0, 3, ValueError), ([(0, KEY, "x", 0)], 0, 2, TypeError)):
        with pytest.raises(err):
            k.encode_add_acks(bad_reqs, rc, version)


@pytest.mark.parametrize("k", KERNELS)
def test_crc32c_three_stream_joins_at_every_boundary(k):
    # The hardware path runs three streams over blocks of 8 KiB, then 256 B, then one stream:
    # lengths around each block multiple and every start alignment must give the same CRC.
    rng = random.Random(11)
    buf = rng.randbytes(80_000)
    for n in (767, 768, 769, 1535, 1536, 3 * 8192 - 1, 3 * 8192, 3 * 8192 + 1, 3 * 8192 + 768 + 7, 65_572, 79_990):
        for off in range(8):
            seed = rng.getrandbits(32)
            view = memoryview(buf)[off:off + n]
            assert k.crc32c(view, seed) == google_crc32c.extend(seed, bytes(view)), (n, off)
