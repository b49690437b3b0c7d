"""FrameDecoder: sans-I/O splitting of a byte stream into frames and messages."""
import random
import struct
import weakref

import pytest

from bk.errors import ProtocolError
from bk.proto import (
    AddRequest, AddResponse, BadFrameLengthError, BatchReadResponse, DigestManager, FrameDecoder, ReadRequest,
    ReadResponse, RequestDecodeError, ResponseDecodeError, decode_request, decode_response, encode_add_responses,
    encode_request, encode_response, master_key,
)

KEY = master_key(b"pw")
DM = DigestManager(5, "CRC32C", b"pw")


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def add_frame(entry_id, payload_len=100, ledger_id=5):
    dm = DM if ledger_id == 5 else DigestManager(ledger_id, "CRC32C", b"pw")
    return encode_request(AddRequest(0, KEY, ledger_id, entry_id,
                                     dm.frame_entry(entry_id, entry_id - 1, 0, b"p" * payload_len)))


def mixed_stream(rng, count=60):
    """Valid requests of every kind plus malformed-but-framed ones."""
    parts = []
    for i in range(count):
        r = rng.random()
        if r < 0.5:
            parts.append(add_frame(i, rng.randrange(0, 300)))
        elif r < 0.65:
            parts.append(encode_request(ReadRequest(0, 5, rng.randrange(-1, 50))))
        elif r < 0.75:  # ADD with a negative entry id: framed fine, content EBADREQ
            parts.append(frame(struct.pack(">I", 0x02010000) + KEY + struct.pack(">qqqq", 5, -4, 0, 0)))
        elif r < 0.85:  # unknown op / bad version / short body
            parts.append(frame(struct.pack(">I", rng.choice([0x02090000, 0x03010000, 0x02020000])) +
                               rng.randbytes(rng.randrange(0, 30))))
        else:  # version 0 ADD
            parts.append(frame(struct.pack(">I", 1) + add_frame(i)[8:]))
    return b"".join(parts)


def same(a, b):
    """Messages compare by value; decode errors by type, code and carried ids."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, Exception):
            assert type(x) is type(y) and str(x) == str(y)
            assert (x.code, x.op, x.ledger_id, x.entry_id) == (y.code, y.op, y.ledger_id, y.entry_id)
        else:
            assert x == y


def slow_requests(stream: bytes):
    out = []
    for body in FrameDecoder().feed(stream):
        try:
            out.append(decode_request(body))
        except RequestDecodeError as e:
            out.append(e)
    return out


def test_feed_returns_frame_bodies():
    d = FrameDecoder()
    frames = d.feed(frame(b"abc") + frame(b"") + frame(b"xyz" * 100))
    assert [bytes(f) for f in frames] == [b"abc", b"", b"xyz" * 100]
    assert all(isinstance(f, memoryview) and f.readonly for f in frames)
    assert d.buffered_bytes == 0


def test_byte_by_byte_feeding_equals_one_chunk():
    rng = random.Random(1)
    stream = mixed_stream(rng)
    whole = FrameDecoder().feed_requests(stream)
    d = FrameDecoder()
    one_by_one = []
    for i in range(len(stream)):
        one_by_one += d.feed_requests(stream[i:i + 1])
    same(one_by_one, whole)
    assert d.buffered_bytes == 0
    d = FrameDecoder()
    assert [bytes(f) for i in range(len(stream)) for f in d.feed(stream[i:i + 1])] == \
        [bytes(f) for f in FrameDecoder().feed(stream)]


@pytest.mark.parametrize("seed", range(5))
def test_random_chunking_equals_one_chunk(seed):
    rng = random.Random(seed)
    stream = mixed_stream(rng, 200)
    d = FrameDecoder()
    got, pos = [], 0
    while pos < len(stream):
        n = rng.choice([1, 2, 3, 4, 5, 17, 100, 1000, 5000])
        chunk = stream[pos:pos + n]
        got += d.feed_requests(rng.choice([bytes, bytearray, memoryview])(chunk))
        pos += n
    same(got, FrameDecoder().feed_requests(stream))


@pytest.mark.parametrize("seed", range(3))
def test_fast_path_equals_slow_path(seed):
    stream = mixed_stream(random.Random(100 + seed), 300)
    fast = FrameDecoder().feed_requests(stream)
    same(fast, slow_requests(stream))
    assert any(isinstance(x, RequestDecodeError) for x in fast)
    assert any(isinstance(x, AddRequest) and x.version == 0 for x in fast)


def test_many_small_adds_in_one_chunk():
    stream = b"".join(add_frame(i, 100) for i in range(3000))
    msgs = FrameDecoder().feed_requests(stream)
    assert len(msgs) == 3000
    assert [m.entry_id for m in msgs] == list(range(3000))
    assert all(type(m) is AddRequest and m.master_key == KEY and m.ledger_id == 5 for m in msgs)
    lac, length, payload = DM.verify_entry(2999, msgs[-1].body)
    assert (lac, bytes(payload)) == (2998, b"p" * 100)
    assert msgs[7].last_add_confirmed == 6


def test_chunk_split_inside_the_length_prefix_and_header():
    f = add_frame(1)
    for cut in range(1, len(f)):
        d = FrameDecoder()
        assert d.feed_requests(f[:cut]) == []
        assert d.buffered_bytes == cut
        assert d.feed_requests(f[cut:] + f) == [decode_request(f[4:])] * 2


def test_truncated_frame_stays_buffered():
    d = FrameDecoder()
    f = add_frame(3, 1000)
    assert d.feed(f[:-1]) == []
    assert d.buffered_bytes == len(f) - 1
    assert [bytes(x) for x in d.feed(f[-1:])] == [f[4:]]


def test_oversized_length_fails_without_waiting_for_the_body():
    d = FrameDecoder(max_frame_size_bytes=1024)
    good = add_frame(1)
    with pytest.raises(BadFrameLengthError) as info:
        d.feed_requests(good + struct.pack(">i", 1025))  # only the prefix: no body was sent
    err = info.value
    assert isinstance(err, ProtocolError)
    assert err.length == 1025 and err.max_frame_size_bytes == 1024
    assert err.frames == [decode_request(good[4:])]  # what came before is not lost
    with pytest.raises(BadFrameLengthError):  # the stream cannot be resynchronised
        d.feed_requests(good)


def test_oversized_prefix_split_across_feeds():
    d = FrameDecoder(max_frame_size_bytes=100)
    assert d.feed(b"\x7f\xff") == []
    with pytest.raises(BadFrameLengthError) as info:
        d.feed(b"\xff\xff")
    assert info.value.length == 0x7FFFFFFF and info.value.frames == []


def test_exactly_max_frame_size_is_accepted():
    d = FrameDecoder(max_frame_size_bytes=64)
    assert [bytes(f) for f in d.feed(frame(b"x" * 64))] == [b"x" * 64]
    with pytest.raises(BadFrameLengthError):
        FrameDecoder(max_frame_size_bytes=64).feed(frame(b"x" * 65))


@pytest.mark.parametrize("length", [-1, -24, -(1 << 31)])
def test_negative_length(length):
    for feed in ("feed", "feed_requests", "feed_responses"):
        with pytest.raises(BadFrameLengthError, match="negative") as info:
            getattr(FrameDecoder(), feed)(struct.pack(">i", length) + b"\0" * 30)
        assert info.value.length == length


def test_default_max_and_big_frame_in_chunks():
    d = FrameDecoder()
    assert d.max_frame_size_bytes == 5 * 1024 * 1024
    big = add_frame(0, 5 * 1024 * 1024 - 100)
    got = []
    for pos in range(0, len(big), 65536):
        got += d.feed_requests(big[pos:pos + 65536])
    assert len(got) == 1 and len(got[0].body) == 5 * 1024 * 1024 - 100 + 32 + 4
    with pytest.raises(BadFrameLengthError):
        FrameDecoder().feed(struct.pack(">i", 5 * 1024 * 1024 + 1))


def test_feed_copies_mutable_input():
    buf = bytearray(frame(b"hello"))
    frames = FrameDecoder().feed(buf)
    buf[4:9] = b"XXXXX"
    assert bytes(frames[0]) == b"hello"


def test_a_partial_frame_survives_the_caller_reusing_its_buffers():
    # A frame split over a mutable chunk and a memoryview; both buffers are scribbled over
    # after each feed, as a receive loop reusing one buffer does.
    first, second = frame(b"a" * 300), frame(b"b" * 5000)
    stream = first + second
    d = FrameDecoder()
    got = []
    for piece in (stream[:200], stream[200:1000], stream[1000:]):
        buf = bytearray(piece)
        got += d.feed(memoryview(buf) if len(got) % 2 else buf)
        buf[:] = b"X" * len(buf)
    assert [bytes(f) for f in got] == [b"a" * 300, b"b" * 5000]
    assert d.buffered_bytes == 0


def test_a_frame_dripped_byte_by_byte_is_held_in_few_parts():
    # One Python object per byte would hold ~34x the frame's size for a slow peer.
    d = FrameDecoder()
    f = add_frame(0, 100_000)
    for i in range(len(f) - 1):
        assert d.feed_requests(f[i:i + 1]) == []
    assert d.buffered_bytes == len(f) - 1 and len(d._pending) <= 2
    [req] = d.feed_requests(f[-1:])
    assert d.buffered_bytes == 0 and len(req.body) == 100_000 + 32 + 4


def test_a_long_tail_is_a_view_and_a_short_one_a_copy():
    # The tail left by a scan: a view of the chunk when it is most of it (no copy of a big
    # partial frame), a copy when short (an idle connection does not pin the chunk).
    d = FrameDecoder()
    small, big = frame(b"s" * 10), frame(b"B" * 100_000)
    assert [bytes(f) for f in d.feed(small + big[:90_000])] == [b"s" * 10]
    assert isinstance(d._pending[0], memoryview) and d.buffered_bytes == 90_000
    assert [bytes(f) for f in d.feed(big[90_000:] + small[:3])] == [b"B" * 100_000]
    assert type(d._pending[0]) is bytes and d.buffered_bytes == 3
    assert [bytes(f) for f in d.feed(small[3:])] == [b"s" * 10]


def test_bad_max_frame_size():
    with pytest.raises(ValueError):
        FrameDecoder(-1)
    with pytest.raises(ValueError):
        FrameDecoder(1.5)


def test_random_garbage_never_escapes_the_error_types():
    rng = random.Random(42)
    for _ in range(500):
        data = rng.randbytes(rng.randrange(0, 400))
        for feed in ("feed", "feed_requests", "feed_responses"):
            d = FrameDecoder(max_frame_size_bytes=rng.choice([16, 200, 1 << 20]))
            try:
                for pos in range(0, len(data), 37):
                    for item in getattr(d, feed)(data[pos:pos + 37]):
                        assert not isinstance(item, Exception) or isinstance(
                            item, (RequestDecodeError, ResponseDecodeError))
            except BadFrameLengthError:
                pass


# ---------------------------------------------------------------- responses (client side)
def test_feed_responses_fast_and_slow_paths():
    rows = [(0, 5, i) for i in range(500)]
    stream = encode_add_responses(rows[:250]) + encode_response(ReadResponse(0, 5, 1, b"body")) + \
        frame(b"\x02\x08\0\0" + b"\0" * 20) + encode_response(BatchReadResponse(0, 5, 1, 9, [b"a"])) + \
        encode_add_responses(rows[250:], version=0)
    got = FrameDecoder().feed_responses(stream)
    assert got[:250] == [AddResponse(*r) for r in rows[:250]]
    assert got[250] == ReadResponse(0, 5, 1, b"body")
    assert isinstance(got[251], ResponseDecodeError)
    assert got[252] == BatchReadResponse(0, 5, 1, 9, [b"a"])
    assert got[253:] == [AddResponse(*r) for r in rows[250:]]
    for fast, body in zip(got, FrameDecoder().feed(stream)):
        if not isinstance(fast, Exception):
            assert fast == decode_response(body)


def test_feed_responses_byte_by_byte():
    stream = encode_add_responses([(104, 5, i) for i in range(20)])
    d = FrameDecoder()
    got = [m for i in range(len(stream)) for m in d.feed_responses(stream[i:i + 1])]
    assert got == [AddResponse(104, 5, i) for i in range(20)]


def test_decode_errors_handed_back_leave_no_reference_cycle():
    # An error returned as an item kept its traceback, whose frames reached the decoder's
    # `items` list holding the error: a cycle per bad frame, freed only by the cyclic GC and
    # pinning the read buffer meanwhile (the live fuzzer's bookie RSS). Refcounting alone must
    # free everything a bad frame produced.
    import gc

    def frame(header: int) -> bytes:
        body = struct.pack(">I", header) + bytes(40)
        return struct.pack(">i", len(body)) + body

    bad_version = frame((9 << 24) | (1 << 16))  # version 9, ADD
    unknown_op = frame((2 << 24) | (0x77 << 16))  # version 2, op 0x77
    # Weak references to what the test itself made, not gc.collect()'s process-wide count: other
    # threads of a test worker (left by earlier tests) may make cyclic garbage meanwhile.
    gc.disable()
    try:
        decoder = FrameDecoder()
        requests = decoder.feed_requests((bad_version + unknown_op) * 3)
        assert [type(r).__name__ for r in requests] == ["RequestVersionError", "RequestDecodeError"] * 3
        responses = decoder.feed_responses(unknown_op * 2)
        assert all(isinstance(r, Exception) for r in responses) and len(responses) == 2
        # a connection's first frames that are no v3 Request fall back to v2, inside what was
        # the protobuf error's handler: the v2 errors chained to it
        fallback_decoder = FrameDecoder()
        fallback = fallback_decoder.feed_v3_requests((bad_version + unknown_op) * 3)
        assert [type(r).__name__ for r in fallback] == ["RequestVersionError", "RequestDecodeError"] * 3
        made = [*requests, *responses, *fallback]
        made += [e.__context__ for e in fallback if e.__context__ is not None]
        refs = [weakref.ref(obj) for obj in made]
        del requests, responses, fallback, decoder, fallback_decoder, made
        alive = [type(r()).__name__ for r in refs if r() is not None]
        assert alive == []
    finally:
        gc.enable()


# ---------------------------------------------------------------- BufferedProtocol receive
def receive(d: FrameDecoder, stream: bytes, feed: str = "feed_responses", most: int = 1 << 30) -> tuple[list, list]:
    """Play a transport: write at most `most` bytes per read into get_buffer's buffer. Returns the
    items and the sizes of the buffers the decoder offered."""
    items, offered = [], []
    src = memoryview(stream)
    pos = 0
    while pos < len(stream):
        buf = d.get_buffer(-1)
        offered.append(len(buf))
        n = min(len(buf), most, len(stream) - pos)
        buf[:n] = src[pos:pos + n]
        pos += n
        data = d.received(n)
        if data is not None:
            items += getattr(d, feed)(data)
    return items, offered


def test_buffered_receive_decodes_what_feed_decodes():
    rng = random.Random(7)
    entries = [DM.frame_entry(i, i - 1, 0, rng.randbytes(rng.choice([10, 70_000, 300_000]))) for i in range(12)]
    stream = b"".join([encode_add_responses([(0, 5, i) for i in range(100)]),
                       encode_response(BatchReadResponse(0, 5, 0, 1, entries[:6])),
                       encode_response(ReadResponse(0, 5, 6, entries[6])),
                       encode_response(BatchReadResponse(0, 5, 7, 2, entries[7:])),
                       frame(b"\x02\x08\0\0" + b"\0" * 20),  # a bad response: an error item
                       encode_add_responses([(0, 5, 100)])])
    want = FrameDecoder().feed_responses(stream)
    assert isinstance(want[-2], ResponseDecodeError)
    for most in (1, 1000, 70_001, 1 << 30):
        d = FrameDecoder()
        got, offered = receive(d, stream, most=most)
        assert [(type(x), str(x)) if isinstance(x, Exception) else x for x in got] == \
            [(type(x), str(x)) if isinstance(x, Exception) else x for x in want]
        assert d.buffered_bytes == 0
        if most > 1000:  # the large frames' rest was offered as a buffer of its own
            assert any(n > 64 * 1024 for n in offered)


def test_entries_read_in_place_are_read_only_views_that_never_change():
    entries = [DM.frame_entry(i, i - 1, 0, bytes([i]) * 100_000) for i in range(4)]
    stream = encode_response(BatchReadResponse(0, 5, 0, 1, entries)) * 3
    d = FrameDecoder()
    got, _ = receive(d, stream, most=50_000)
    assert len(got) == 3
    first = got[0].entries
    assert all(type(e) is memoryview and e.readonly for e in first)
    # later frames were read after the first was handed out: none overwrote it
    assert [bytes(e) for e in first] == entries
    assert all(m.entries == entries for m in got)
    with pytest.raises(TypeError):
        first[0][0] = 0


def test_receive_area_bytes_are_copied():
    # Small frames land in the decoder's reusable area: what comes out must not alias it.
    stream = encode_response(ReadResponse(0, 5, 1, b"x" * 100)) + encode_response(ReadResponse(0, 5, 2, b"y" * 100))
    d = FrameDecoder()
    got, offered = receive(d, stream)
    assert offered == [64 * 1024]
    d.get_buffer(-1)[:len(stream)] = b"Z" * len(stream)  # the next read scribbles on the area
    assert [bytes(m.body) for m in got] == [b"x" * 100, b"y" * 100]


def test_a_frame_buffer_is_allocated_only_after_its_prefix_passed_the_size_check():
    d = FrameDecoder(max_frame_size_bytes=1 << 20)
    buf = d.get_buffer(-1)
    head = struct.pack(">i", (1 << 20) + 1)
    buf[:4] = head
    with pytest.raises(BadFrameLengthError):
        d.feed_responses(d.received(4))
    assert d._frame is None and len(d.get_buffer(-1)) == 64 * 1024  # no frame-sized buffer was made
    # a frame at the limit is read in place
    d = FrameDecoder(max_frame_size_bytes=1 << 20)
    body = struct.pack(">I", 0x02080000) + bytes((1 << 20) - 4)
    d.get_buffer(-1)[:100] = struct.pack(">i", len(body)) + body[:96]
    assert d.feed(d.received(100)) == []
    assert len(d.get_buffer(-1)) == 4 + len(body) - 100


def test_feeding_other_bytes_while_a_frame_is_read_in_place_is_refused():
    d = FrameDecoder()
    f = encode_response(ReadResponse(0, 5, 1, b"x" * 200_000))
    d.get_buffer(-1)[:1000] = f[:1000]
    assert d.feed_responses(d.received(1000)) == []
    d.get_buffer(-1)  # the frame's own buffer now
    with pytest.raises(RuntimeError):
        d.feed_responses(f[1000:])
