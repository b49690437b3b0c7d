"""The v3 request kernel's plain READs (scan_v3_add_requests' read_record) against the protobuf
library, native and pure: generated READ Requests with every field of ReadRequest, fields in any
order, unknown fields, padded varints and byte mutations. A frame the kernel takes must be one
the library parses to a plain READ (ledgerId and entryId alone, both >= 0) with the same ids and
a header whose re-serialized bytes are the record's; anything else must be deferred. A plain
READ as a client writes it (the library's own bytes) must be taken."""
import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from bk._native import load_native, load_pure
from bk.proto import FrameDecoder, v3

PURE = load_pure("codec_v3")
NATIVE = load_native("codec_v3")
KERNELS = [PURE] + ([NATIVE] if NATIVE is not None else [])
SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
int64 = st.integers(-(1 << 63), (1 << 63) - 1)


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def varint(v: int, pad: int = 0) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while v >= 0x80 or pad > 0:
        if v < 0x80:
            pad -= 1
        out.append((v & 0x7F) | 0x80)
        v >>= 7
        if v == 0 and pad <= 0:
            break
    out.append(v)
    return bytes(out)


def field(num: int, value, pad: int = 0) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return varint((num << 3) | 2) + varint(len(value)) + bytes(value)
    return varint(num << 3) + varint(value, pad)


@st.composite
def read_frames(draw):
    """(frame body, plain): a READ Request written field by field; `plain` when it is what a
    client writes for a plain READ (the library's order and varints, ids >= 0, nothing else)."""
    plain = True
    hfields = [(1, draw(st.sampled_from([1, 2, 3, 3, 3]))), (2, draw(st.sampled_from([1, 1, 1, 2, 5]))),
               (3, draw(st.integers(0, (1 << 64) - 1)))]
    plain &= hfields[1][1] == 1
    if draw(st.booleans()):
        hfields.append((4, draw(st.sampled_from([0, 1, 7, (1 << 32) - 1, 1 << 32]))))
        plain &= hfields[-1][1] < 1 << 32
    rfields = [(1, draw(st.one_of(st.integers(0, 1 << 40), int64))),
               (2, draw(st.one_of(st.integers(-1, 1 << 20), int64)))]
    plain &= rfields[0][1] >= 0 and rfields[1][1] >= 0
    for num, strat in ((100, st.sampled_from([0, 1, 2, 3])), (3, st.binary(max_size=24)),
                       (4, int64), (5, st.integers(0, 1 << 20)), (7, st.integers(0, 9))):
        if not draw(st.integers(0, 5)):  # flag, masterKey, previousLAC, timeOut, an unknown field
            rfields.append((num, draw(strat)))
            plain = False
    if draw(st.integers(0, 3)) == 0:
        hfields = draw(st.permutations(hfields))
        plain &= [n for n, _ in hfields] == sorted(n for n, _ in hfields)
    if draw(st.integers(0, 3)) == 0:
        rfields = draw(st.permutations(rfields))  # ids in any order: still plain (not echoed)
    pads = draw(st.integers(0, 9))
    header = b""
    for i, (n, v) in enumerate(hfields):
        pad = 1 if pads == 0 and i == len(hfields) - 1 else 0
        plain &= not pad
        header += field(n, v, pad)
    body = b"".join(field(n, v) for n, v in rfields)
    parts = [field(1, header), field(100, body)]
    extra = draw(st.integers(0, 9))
    if extra == 0:
        parts.append(field(101, b""))  # an addRequest too
        plain = False
    elif extra == 1:
        parts.append(field(9, 5))  # an unknown top-level field
        plain = False
    elif extra == 2:
        parts.reverse()  # readRequest before header: the same message
    return b"".join(parts), plain


def check(kernel, bodies: list) -> list:
    """Scan `bodies` as one buffer; each taken READ checked against the library; the taken flags."""
    buf = b"".join(frame(b) for b in bodies)
    items, end, err, deferred = kernel.scan_v3_add_requests(buf, 0, 1 << 24, v3.V3AddRequest, v3.V3ReadRequest)
    assert (end, err, len(items)) == (len(buf), 0, len(bodies))
    taken = []
    for i, (item, body) in enumerate(zip(items, bodies)):
        if i in deferred:
            taken.append(False)
            continue
        if type(item) is v3.V3AddRequest:
            taken.append(None)
            continue
        assert type(item) is v3.V3ReadRequest
        ref = v3.parse(v3.Request, body)  # taken => the library parses it...
        r = ref.readRequest
        assert ref.header.operation == v3.OperationType.READ_ENTRY and ref.HasField("readRequest")
        assert [f.name for f, _ in r.ListFields()] == ["ledgerId", "entryId"]  # ...to a plain READ
        assert (item.ledger_id, item.entry_id) == (r.ledgerId, r.entryId) and r.ledgerId >= 0 <= r.entryId
        assert item.header == ref.header.SerializeToString()
        # the Request it stands for is the library's, unknown fields included (they serialize)
        assert v3.read_request(item).SerializeToString() == ref.SerializeToString()
        taken.append(True)
    return taken


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__.rsplit(".", 1)[-1])
@given(st.lists(read_frames(), min_size=1, max_size=6))
@SETTINGS
def test_kernel_takes_plain_v3_reads_exactly_as_protobuf_parses_them(kernel, frames):
    bodies = [b for b, _ in frames]
    taken = check(kernel, bodies)
    for (body, plain), took in zip(frames, taken):
        if plain:
            assert took, body
        else:
            ref = None
            try:
                ref = v3.parse(v3.Request, body)
            except v3.V3DecodeError:
                pass
            # deferred, or (ids in another order) a plain READ the library reads the same way
            assert not took or ref is not None


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__.rsplit(".", 1)[-1])
@given(read_frames(), st.integers(0, 200), st.integers(0, 255))
@SETTINGS
def test_a_mutated_read_frame_is_never_misread(kernel, fr, at, byte):
    body = bytearray(fr[0])
    body[at % len(body)] = byte
    check(kernel, [bytes(body), bytes(body[: at % len(body)])])


def test_native_and_pure_agree_on_each_frame():
    if NATIVE is None:
        pytest.skip("no native kernel built")
    r = v3.Request()
    r.header.version, r.header.operation, r.header.txnId = 3, 1, 77
    r.readRequest.ledgerId, r.readRequest.entryId = 5, 9
    plain = r.SerializeToString()
    r.readRequest.previousLAC, r.readRequest.timeOut = 8, 1000  # a long poll
    poll = r.SerializeToString()
    buf = frame(plain) + frame(poll) + frame(plain)
    a = PURE.scan_v3_add_requests(buf, 0, 1 << 20, v3.V3AddRequest, v3.V3ReadRequest)
    b = NATIVE.scan_v3_add_requests(buf, 0, 1 << 20, v3.V3AddRequest, v3.V3ReadRequest)
    assert a == b
    assert a[0][0] == v3.V3ReadRequest(5, 9, r.header.SerializeToString()) and a[3] == [1]


def test_feed_v3_requests_gives_plain_reads_as_records_and_the_rest_parsed():
    r = v3.Request()
    r.header.version, r.header.operation, r.header.txnId = 3, 1, 1
    r.readRequest.ledgerId, r.readRequest.entryId = 3, 4
    plain = v3.frame(r)
    r.readRequest.flag = v3.READ_FLAG_ENTRY_PIGGYBACK
    r.readRequest.previousLAC = 3
    poll = v3.frame(r)
    items = FrameDecoder(1 << 20).feed_v3_requests(plain + poll + plain)
    assert [type(i) for i in items] == [v3.V3ReadRequest, v3.Request, v3.V3ReadRequest]
    assert items[1].readRequest.previousLAC == 3
