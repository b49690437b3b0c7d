"""v2 message codec: layouts, round trips, EBADREQ/EBADVERSION cases (bk.proto.codec)."""
import random
import struct

import pytest

from bk.errors import BadRequestError, BadVersionError, ProtocolError
from bk.proto import (
    FLAG_DO_FENCING, FLAG_HIGH_PRIORITY, FLAG_RECOVERY_ADD, V3_STATUS, AddRequest, AddResponse, AuthRequest,
    AuthResponse, BatchReadRequest, BatchReadResponse, DigestManager, GetBookieInfoRequest,
    GetBookieInfoResponse, MessageEncodeError, OpCode, ReadLacRequest, ReadLacResponse, ReadRequest,
    ReadResponse, RequestDecodeError, RequestVersionError, ResponseDecodeError, StatusCode, WriteLacRequest,
    WriteLacResponse, decode_request, decode_response, encode_add_responses, encode_error_response,
    encode_header, encode_request, encode_response, encode_response_parts, error_response_for, master_key, split_header,
)

KEY = master_key(b"pw")
DM = DigestManager(5, "CRC32C", b"pw")


def body_of(frame: bytes) -> bytes:
    (n,) = struct.unpack_from(">i", frame)
    assert n == len(frame) - 4
    return frame[4:]


def hdr(version, op, flags=0):
    return struct.pack(">I", op if version == 0 else (version << 24) | (op << 16) | flags)


def requests(version=2):
    flags = 0 if version == 0 else FLAG_RECOVERY_ADD | FLAG_HIGH_PRIORITY
    fence = 0 if version == 0 else FLAG_DO_FENCING
    return [
        AddRequest(flags, KEY, 5, 0, DM.frame_entry(0, -1, 3, b"abc"), version),
        AddRequest(0, KEY, 5, 1 << 40, DigestManager(5, "DUMMY").frame_entry(1 << 40, 7, 0, b""), version),
        ReadRequest(0, 5, -1, None, version),
        ReadRequest(fence, 5, 3, KEY if fence else None, version),
        BatchReadRequest(fence, 5, 0, 1 << 50, 100, 1 << 20, KEY if fence else None, version),
        BatchReadRequest(0, 5, 7, -3, 0, 0, None, version),
        AuthRequest(0, b"\x0a\x04test", version),
        AuthRequest(0, b"", version),
        ReadLacRequest(0, 5, version),
        WriteLacRequest(0, KEY, 5, 3, DM.frame_lac(3), version),
        WriteLacRequest(0, KEY, 5, -1, DM.frame_lac(-1), version),
        GetBookieInfoRequest(0, 3, version),
    ]


RESPONSES = [
    AddResponse(0, 5, 0), AddResponse(104, 5, 1 << 62), AddResponse(-1, 0, 0),
    ReadResponse(0, 5, 3, b"entry bytes"), ReadResponse(0, 5, 4, b""), ReadResponse(2, 5, -1),
    BatchReadResponse(0, 5, 0, 42, [b"a", b"", b"ccc" * 100]), BatchReadResponse(0, 5, 0, 43, []),
    BatchReadResponse(1, 5, 0, 44, []),
    AuthResponse(b"\x0a\x04test"), AuthResponse(b""),
    ReadLacResponse(0, 5, DM.frame_lac(3), DM.frame_entry(4, 3, 10, b"x")), ReadLacResponse(0, 5, None, None),
    ReadLacResponse(2, 5), ReadLacResponse(0, 5, None, b"last"),
    WriteLacResponse(0, 5), WriteLacResponse(102, 5),
    GetBookieInfoResponse(0, 1 << 40, 1 << 41), GetBookieInfoResponse(101),
]


# ---------------------------------------------------------------- constants
def test_wire_constants():
    assert [int(o) for o in OpCode] == [1, 2, 3, 4, 5, 6, 7]
    assert (StatusCode.EOK, StatusCode.ENOLEDGER, StatusCode.ENOENTRY) == (0, 1, 2)
    assert [int(s) for s in StatusCode][3:] == list(range(100, 108))
    assert V3_STATUS[StatusCode.EFENCED] == 504 and V3_STATUS[StatusCode.ENOLEDGER] == 402
    assert V3_STATUS[StatusCode.EBADREQ] == 404 and V3_STATUS[StatusCode.EUNKNOWNLEDGERSTATE] == 507
    assert (FLAG_DO_FENCING, FLAG_RECOVERY_ADD, FLAG_HIGH_PRIORITY) == (1, 2, 4)


def test_header_encoding():
    assert encode_header(2, 1, 2) == 0x02010002
    assert encode_header(1, 7, 0xFFFF) == 0x0107FFFF
    assert encode_header(0, 2) == 2
    assert split_header(0x02010002) == (2, 1, 2)
    assert split_header(2) == (0, 2, 0)
    assert split_header(0xFF000000) == (255, 0, 0)
    for bad in [(3, 1, 0), (2, 256, 0), (2, 1, 1 << 16), (0, 1, 1), (-1, 1, 0)]:
        with pytest.raises(MessageEncodeError):
            encode_header(*bad)


# ---------------------------------------------------------------- layouts
def test_add_layouts():
    entry = DM.frame_entry(9, 8, 100, b"payload")
    frame = encode_request(AddRequest(FLAG_RECOVERY_ADD, KEY, 5, 9, entry))
    assert frame == struct.pack(">iI", 4 + 20 + len(entry), 0x02010002) + KEY + entry
    assert encode_response(AddResponse(104, 5, 9)) == struct.pack(">iIiqq", 24, 0x02010000, 104, 5, 9)
    assert encode_response(AddResponse(0, 5, 9), version=0) == struct.pack(">iIiqq", 24, 1, 0, 5, 9)
    assert decode_request(body_of(frame)).last_add_confirmed == 8


def test_read_layouts():
    assert encode_request(ReadRequest(0, 5, -1)) == struct.pack(">iIqq", 20, 0x02020000, 5, -1)
    assert encode_request(ReadRequest(FLAG_DO_FENCING, 5, 2, KEY)) == \
        struct.pack(">iIqq", 40, 0x02020001, 5, 2) + KEY
    assert encode_response(ReadResponse(0, 5, 2, b"xyz")) == struct.pack(">iIiqq", 27, 0x02020000, 0, 5, 2) + b"xyz"
    assert encode_response(ReadResponse(2, 5, 2)) == struct.pack(">iIiqq", 24, 0x02020000, 2, 5, 2)


def test_batch_read_layouts():
    assert encode_request(BatchReadRequest(0, 5, 2, 77, 10, 4096)) == \
        struct.pack(">iIqqqiq", 40, 0x02070000, 5, 2, 77, 10, 4096)
    assert encode_response(BatchReadResponse(0, 5, 2, 77, [b"ab", b"c"])) == \
        struct.pack(">iIiqqq", 32 + 6 + 5, 0x02070000, 0, 5, 2, 77) + b"\0\0\0\x02ab\0\0\0\x01c"


def test_extension_layouts():
    assert encode_request(ReadLacRequest(0, 5)) == struct.pack(">iIq", 12, 0x02040000, 5)
    lac_buf = DM.frame_lac(3)
    assert encode_request(WriteLacRequest(0, KEY, 5, 3, lac_buf)) == \
        struct.pack(">iI", 4 + 20 + 16 + len(lac_buf), 0x02050000) + KEY + struct.pack(">qq", 5, 3) + lac_buf
    assert encode_request(GetBookieInfoRequest(0, 3)) == struct.pack(">iIq", 12, 0x02060000, 3)
    assert encode_response(ReadLacResponse(0, 5, b"L" * 20, b"E" * 3)) == \
        struct.pack(">iIiqi", 4 + 4 + 8 + 4 + 20 + 4 + 3, 0x02040000, 0, 5, 20) + b"L" * 20 + \
        struct.pack(">i", 3) + b"EEE"
    assert encode_response(WriteLacResponse(0, 5)) == struct.pack(">iIiq", 16, 0x02050000, 0, 5)
    assert encode_response(GetBookieInfoResponse(0, 10, 20)) == struct.pack(">iIiqq", 24, 0x02060000, 0, 10, 20)


# ---------------------------------------------------------------- round trips
@pytest.mark.parametrize("version", [0, 1, 2])
def test_every_request_round_trips(version):
    for msg in requests(version):
        frame = encode_request(msg)
        assert decode_request(body_of(frame)) == msg
        assert decode_request(memoryview(frame)[4:]) == msg


@pytest.mark.parametrize("version", [0, 1, 2])
def test_every_response_round_trips(version):
    for msg in RESPONSES:
        frame = encode_response(msg, version)
        assert split_header(struct.unpack_from(">I", frame, 4)[0])[:2] == (version, int(msg.op))
        assert decode_response(body_of(frame)) == msg
    assert decode_response(body_of(encode_response(ReadLacResponse(0, 5, b"", b"")))) == ReadLacResponse(0, 5)


@pytest.mark.parametrize("version", [0, 1, 2])
def test_response_parts_concatenate_to_the_frame_and_keep_entries_uncopied(version):
    for msg in RESPONSES:
        parts = encode_response_parts(msg, version)
        assert b"".join(parts) == encode_response(msg, version)
    entries = [bytes([i]) * 20_000 for i in range(3)]
    parts = encode_response_parts(BatchReadResponse(0, 5, 0, 1, entries), version)
    assert [p for p in parts if len(p) == 20_000] == entries and all(
        any(p is e for p in parts) for e in entries)  # the entries themselves, not copies
    body = memoryview(b"x" * 20_000)
    assert encode_response_parts(ReadResponse(0, 5, 1, body), version)[1] is body
    # small entries cost less copied than as iovecs of their own: one joined frame
    small = [bytes([i]) * 1000 for i in range(3)]
    assert encode_response_parts(BatchReadResponse(0, 5, 0, 1, small), version) == \
        [encode_response(BatchReadResponse(0, 5, 0, 1, small), version)]
    assert len(encode_response_parts(ReadResponse(0, 5, 1, b"x" * 500), version)) == 1


def test_views_in_views_out():
    # A memoryview frame decodes to views of it (what FrameDecoder relies on); bytes to bytes.
    entries = [b"a" * 50, b"b"]
    frame = memoryview(encode_response(BatchReadResponse(0, 5, 0, 1, entries)))[4:]
    got = decode_response(frame).entries
    assert all(type(e) is memoryview and e.obj is frame.obj for e in got) and got == entries
    assert all(type(e) is bytes for e in decode_response(bytes(frame)).entries)
    read = memoryview(encode_response(ReadResponse(0, 5, 1, b"body")))[4:]
    assert decode_response(read).body.obj is read.obj


def test_decoded_bodies_are_owned_bytes():
    frame = bytearray(encode_request(requests()[0]))
    msg = decode_request(memoryview(frame)[4:])
    assert type(msg.body) is bytes and type(msg.master_key) is bytes
    frame[-1] ^= 0xFF
    assert msg.body.endswith(b"abc")


def test_encode_add_responses_matches_single_encoder():
    rows = [(0, 5, i) for i in range(100)] + [(104, 6, 0), (-7, 0, 1 << 62)]
    for version in (0, 1, 2):
        assert encode_add_responses(rows, version) == \
            b"".join(encode_response(AddResponse(*r), version) for r in rows)
    assert encode_add_responses([]) == b""
    with pytest.raises(MessageEncodeError):
        encode_add_responses([(0, 1 << 63, 0)])
    with pytest.raises(MessageEncodeError):
        encode_add_responses([(0, 1, 2)], version=3)


def test_repr_never_shows_a_master_key():
    for msg in requests():
        assert KEY.hex() not in repr(msg) and repr(KEY) not in repr(msg)


# ---------------------------------------------------------------- EBADREQ / EBADVERSION
def add_body(ledger_id, entry_id, *, version=2, flags=0, entry_len=40):
    entry = struct.pack(">qqqq", ledger_id, entry_id, -1, 0) + b"x" * (entry_len - 32)
    return hdr(version, 1, flags) + KEY + entry[:entry_len]


def bad(frame_body, **expected):
    with pytest.raises(RequestDecodeError) as info:
        decode_request(frame_body)
    err = info.value
    assert isinstance(err, BadRequestError)
    for k, v in expected.items():
        assert getattr(err, k) == v, (k, getattr(err, k), v)
    return err


def test_add_bad_requests():
    bad(add_body(5, -1), op=1, ledger_id=5, entry_id=-1, code=100)
    bad(add_body(-5, 1), op=1, ledger_id=-5, entry_id=1)
    bad(add_body(5, 1, entry_len=31), op=1, ledger_id=5, entry_id=1)  # no room for the entry header
    bad(add_body(5, 1)[:30], op=1, ledger_id=None, entry_id=None)
    bad(hdr(2, 1) + KEY[:10], op=1)


def test_read_bad_requests():
    bad(hdr(2, 2) + struct.pack(">qq", 5, -2), op=2, ledger_id=5, entry_id=-2)
    bad(hdr(2, 2) + struct.pack(">qq", -1, 0), op=2, ledger_id=-1)
    bad(hdr(2, 2, FLAG_DO_FENCING) + struct.pack(">qq", 5, 3), op=2, ledger_id=5, entry_id=3)  # key missing
    bad(hdr(2, 2) + struct.pack(">qq", 5, 3) + KEY, op=2, entry_id=3)  # key without fencing
    bad(hdr(2, 2) + struct.pack(">q", 5), op=2, ledger_id=None)


def test_batch_read_bad_requests():
    good = struct.pack(">qqqiq", 5, 0, 9, 10, 100)
    decode_request(hdr(2, 7) + good)
    bad(hdr(2, 7) + struct.pack(">qqqiq", 5, -1, 9, 10, 100), op=7, entry_id=-1, request_id=9)
    bad(hdr(2, 7) + struct.pack(">qqqiq", 5, 0, 9, -1, 100), op=7, request_id=9)
    bad(hdr(2, 7) + struct.pack(">qqqiq", 5, 0, 9, 1, -100), op=7)
    bad(hdr(2, 7, FLAG_DO_FENCING) + good, op=7, ledger_id=5, request_id=9)
    bad(hdr(2, 7) + good[:30], op=7, ledger_id=None)


def test_extension_bad_requests():
    bad(hdr(2, 4) + struct.pack(">q", 5) + b"x", op=4, ledger_id=5)
    bad(hdr(2, 4) + struct.pack(">q", -5), op=4, ledger_id=-5)
    bad(hdr(2, 4), op=4)
    lac_buf = DM.frame_lac(3)
    # the LAC buffer names another lac / ledger than the request: EBADREQ, nothing stored
    bad(hdr(2, 5) + KEY + struct.pack(">qq", 5, 4) + lac_buf, op=5, ledger_id=5)
    bad(hdr(2, 5) + KEY + struct.pack(">qq", 6, 3) + lac_buf, op=5, ledger_id=6)
    bad(hdr(2, 5) + KEY + struct.pack(">qq", 5, 3) + lac_buf[:15], op=5, ledger_id=5)
    bad(hdr(2, 5) + KEY + struct.pack(">qq", 5, -2) + struct.pack(">qq", 5, -2), op=5)
    bad(hdr(2, 6) + struct.pack(">q", 1) + b"\0", op=6)


def test_unknown_ops_and_short_frames():
    bad(hdr(2, 8) + b"\0" * 20, op=8, ledger_id=None)
    bad(hdr(2, 0), op=0)
    bad(hdr(1, 200, 5), op=200, flags=5, version=1)
    bad(struct.pack(">I", 0x123), op=None, version=0)  # v0 header 291: no such op, no byte to name it
    bad(b"\x02\x01\x00", op=None)
    bad(b"", op=None)


def test_version_0_header_is_the_op_code():
    body = add_body(5, 1)
    msg = decode_request(struct.pack(">I", 1) + body[4:])
    assert msg.version == 0 and msg.flags == 0 and (msg.ledger_id, msg.entry_id) == (5, 1)
    assert decode_request(struct.pack(">Iqq", 2, 5, -1)) == ReadRequest(0, 5, -1, None, 0)


@pytest.mark.parametrize("version", [3, 4, 0x7F, 0x80, 0xFF])
def test_bad_versions_are_ebadversion(version):
    err = bad(hdr(version, 1) + add_body(5, 9)[4:], op=1, ledger_id=5, entry_id=9, version=version)
    assert isinstance(err, RequestVersionError) and isinstance(err, BadVersionError)
    assert err.code == StatusCode.EBADVERSION
    err = bad(hdr(version, 7) + struct.pack(">qqqiq", 5, 2, 99, 1, 1), op=7, request_id=99, entry_id=2)
    assert decode_response(error_response_for(err)[4:]) == BatchReadResponse(103, 5, 2, 99, [])


def test_error_answers_use_the_ops_layout():
    cases = [
        (add_body(5, -1), AddResponse(100, 5, -1)),
        (hdr(2, 2) + struct.pack(">qq", 5, -2), ReadResponse(100, 5, -2)),
        (hdr(2, 7) + struct.pack(">qqqiq", 5, -1, 9, 10, 100), BatchReadResponse(100, 5, -1, 9, [])),
        (hdr(2, 4) + b"\0", ReadLacResponse(100, -1)),
        (hdr(2, 5) + KEY + struct.pack(">qq", 5, 4) + DM.frame_lac(3), WriteLacResponse(100, 5)),
        (hdr(2, 6), GetBookieInfoResponse(100, 0, 0)),
        (hdr(0, 1) + KEY + struct.pack(">qqqq", 5, -3, 0, 0), AddResponse(100, 5, -3)),
    ]
    for frame_body, answer in cases:
        with pytest.raises(RequestDecodeError) as info:
            decode_request(frame_body)
        out = error_response_for(info.value)
        assert decode_response(body_of(out)) == answer
    # unknown op: BookKeeper's generic error layout header|rc|ledger|entry
    with pytest.raises(RequestDecodeError) as info:
        decode_request(hdr(2, 9) + b"zz")
    assert error_response_for(info.value) == struct.pack(">iIiqq", 24, 0x02090000, 100, -1, -1)


def test_error_response_refusals():
    with pytest.raises(MessageEncodeError):
        encode_error_response(3, 100)  # AUTH has no error layout
    with pytest.raises(MessageEncodeError):
        encode_error_response(1, 0, 5, 1)  # rc EOK is no error
    assert decode_response(encode_error_response(2, 101, 5, 7)[4:]) == ReadResponse(101, 5, 7)


# ---------------------------------------------------------------- encoder refusals
@pytest.mark.parametrize("msg", [
    AddRequest(0, KEY[:19], 5, 0, DM.frame_entry(0, -1, 0, b"")),            # short key
    AddRequest(0, KEY, 5, 1, DM.frame_entry(0, -1, 0, b"")),                 # header vs entry: entry id
    AddRequest(0, KEY, 6, 0, DM.frame_entry(0, -1, 0, b"")),                 # header vs entry: ledger id
    AddRequest(0, KEY, 5, 0, b"x" * 31),                                     # no entry header
    AddRequest(0, KEY, 5, -1, DM.frame_entry(-1, -1, 0, b"")),               # negative entry id
    AddRequest(1, KEY, 5, 0, DM.frame_entry(0, -1, 0, b""), 0),              # flags on version 0
    AddRequest(0, KEY, 5, 0, DM.frame_entry(0, -1, 0, b""), 3),              # version 3
    ReadRequest(FLAG_DO_FENCING, 5, 0),                                      # fencing without key
    ReadRequest(0, 5, 0, KEY),                                               # key without fencing
    ReadRequest(0, 5, -2),
    ReadRequest(0, 5, 1 << 63),                                              # out of range
    BatchReadRequest(0, 5, 0, 1, -1, 10),
    WriteLacRequest(0, KEY, 5, 4, DM.frame_lac(3)),                          # lac vs lac_buf
    WriteLacRequest(0, KEY, 5, 3, b"short"),
    ReadLacRequest(0, -1),
    GetBookieInfoRequest(0, "3"),
])
def test_encoder_refuses_bad_requests(msg):
    with pytest.raises(MessageEncodeError):
        encode_request(msg)


def test_encoder_refuses_bad_responses_and_types():
    for msg in [ReadResponse(0, 5, 1, None), ReadResponse(2, 5, 1, b"x"), BatchReadResponse(2, 5, 0, 1, [b"x"]),
                AddResponse(1 << 31, 5, 0)]:
        with pytest.raises(MessageEncodeError):
            encode_response(msg)
    with pytest.raises(MessageEncodeError):
        encode_request(AddResponse(0, 1, 2))
    with pytest.raises(MessageEncodeError):
        encode_response(ReadRequest(0, 1, 2))


# ---------------------------------------------------------------- client-side decode errors
@pytest.mark.parametrize("frame_body", [
    b"", b"\x02\x01\x00",
    struct.pack(">Iiqq", 0x02010000, 0, 5, 1) + b"x",                 # ADD response too long
    struct.pack(">Iiq", 0x02010000, 0, 5),                             # ADD response too short
    struct.pack(">Iiqq", 0x02020000, 2, 5, 1) + b"x",                 # READ error with a body
    struct.pack(">Iiqqq", 0x02070000, 0, 5, 1, 1) + b"\0\0\0\x05ab",  # batch entry overruns
    struct.pack(">Iiqqq", 0x02070000, 0, 5, 1, 1) + b"\0\0",          # stray bytes
    struct.pack(">Iiqqq", 0x02070000, 0, 5, 1, 1) + b"\xff\xff\xff\xff",
    struct.pack(">Iiqqq", 0x02070000, 1, 5, 1, 1) + b"\0\0\0\x01a",   # error with entries
    struct.pack(">Iiqii", 0x02040000, 0, 5, 0, 0) + b"x",             # READ_LAC trailing
    struct.pack(">Iiqi", 0x02040000, 0, 5, 3) + b"abc",               # READ_LAC without last_entry length
    struct.pack(">Iiqii", 0x02040000, 0, 5, -1, 0),
    struct.pack(">Iiqq", 0x02050000, 0, 5, 0),                         # WRITE_LAC too long
    struct.pack(">Iiq", 0x02060000, 0, 5),                             # GET_BOOKIE_INFO too short
    struct.pack(">Iiqq", 0x03010000, 0, 5, 1),                         # version 3
    struct.pack(">Iiqq", 0x02080000, 0, 5, 1),                         # unknown op
])
def test_malformed_responses(frame_body):
    with pytest.raises(ResponseDecodeError) as info:
        decode_response(frame_body)
    assert isinstance(info.value, ProtocolError)


# ---------------------------------------------------------------- fuzz
def test_random_request_bytes_only_raise_decode_errors():
    rng = random.Random(7)
    seeds = [body_of(encode_request(m)) for m in requests()]
    for _ in range(5000):
        if rng.random() < 0.5:
            body = bytearray(rng.choice(seeds))
            for _ in range(rng.randrange(1, 4)):
                if body:
                    body[rng.randrange(len(body))] = rng.getrandbits(8)
            body = bytes(body[:rng.randrange(len(body) + 1)]) if rng.random() < 0.3 else bytes(body)
        else:
            body = hdr(rng.choice([0, 1, 2, 2, 3]), rng.randrange(0, 9), rng.getrandbits(16)) + \
                rng.randbytes(rng.randrange(0, 80))
        try:
            msg = decode_request(body)
        except RequestDecodeError as err:
            if err.op is not None and err.op != 3:
                error_response_for(err)  # every decode error can be answered
            continue
        assert encode_request(msg)[4:] == body  # whatever decodes, re-encodes to the same bytes


def test_random_response_bytes_only_raise_decode_errors():
    rng = random.Random(8)
    seeds = [body_of(encode_response(m)) for m in RESPONSES]
    for _ in range(5000):
        body = bytearray(rng.choice(seeds))
        for _ in range(rng.randrange(1, 4)):
            body[rng.randrange(len(body))] = rng.getrandbits(8)
        body = bytes(body[:rng.randrange(len(body) + 1)]) if rng.random() < 0.3 else bytes(body)
        try:
            decode_response(body)
        except ResponseDecodeError:
            pass
