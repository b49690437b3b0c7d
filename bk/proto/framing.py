"""Sans-I/O frame decoder: bytes in (as they arrive), frames or messages out.

The connection code calls `feed(data)` (or `feed_requests` / `feed_responses`)
with whatever the transport delivered; the decoder returns every frame
completed so far and keeps the partial remainder. It never touches a socket.

Invariants:
- A length prefix is judged as soon as its 4 bytes are present. Negative or
  above `max_frame_size_bytes` raises BadFrameLengthError (a ProtocolError)
  before any byte of that body is awaited or allocated; frames completed
  earlier in the same call ride along in `err.frames`. The stream cannot be
  resynchronised after that, so every later call raises too: close the
  connection.
- A partial frame is kept as a list of parts joined once, when they hold the
  whole frame (`_need`): a large chunk is a part of its own (so a 1 MiB read
  answer is copied once here, not two to three times as when every chunk was
  appended to one bytearray that was then copied to bytes); chunks under
  _SMALL_CHUNK_BYTES are appended to a bytearray part, so a peer dripping a
  frame byte by byte costs O(size) time and about `size` bytes, not an object
  per byte. A tail of at least half the chunk it came in is kept as a view of
  that chunk, not a copy.
- Every buffer a feed scans is one the decoder never writes again: a bytes
  object, or the frame buffer a BufferedProtocol read filled (`get_buffer`),
  dropped by the decoder once complete. So `feed` returns read-only
  memoryviews into it, and the message decoders give READ bodies and batch
  entries as read-only views too (no copy): they never change under the
  holder, and keep their frame alive while held. A buffer a caller passes
  in, and the decoder's own receive area, are never kept: they are copied.
- BufferedProtocol receive (`get_buffer` / `received`): while a frame of at
  least _DIRECT_FRAME_BYTES is incomplete, the transport reads the rest of it
  straight into that frame's own buffer, sized from its validated length
  prefix; the frame's bytes are copied at most once more in user space (what
  came with the previous read). Other bytes land in a reusable receive area
  and are fed as a copy, as `data_received`'s bytes would be. The frame
  buffer is allocated only once bytes of its frame arrived and its prefix
  passed the max-size check, so a peer cannot make the decoder allocate more
  than one frame of at most `max_frame_size_bytes` per connection.
- Malformed *content* of one frame is not a framing error: `feed_requests`
  puts the RequestDecodeError instance in the output list at that frame's
  position (answer it with codec.error_response_for and carry on);
  `feed_responses` does the same with ResponseDecodeError.
"""
from __future__ import annotations

from bk import _native
from bk.formats.wire import FRAME_LENGTH
from bk.proto.codec import decode_request, decode_response
from bk.proto import v3
from bk.proto.constants import DEFAULT_MAX_FRAME_SIZE_BYTES, V2_STATUS_BY_V3
from bk.proto.messages import (
    AddRequest, AddResponse, BadFrameLengthError, ReadRequest, ReadResponse, RequestDecodeError,
    ResponseDecodeError,
)

_codec = _native.load("codec")
_split_frames = _codec.split_frames
_scan_add_requests = _codec.scan_add_requests
_scan_add_responses = _codec.scan_add_responses
_codec_v3 = _native.load("codec_v3")
_scan_v3_add_requests = _codec_v3.scan_v3_add_requests
_scan_v3_add_responses = _codec_v3.scan_v3_add_responses
_i32 = FRAME_LENGTH
# A chunk under this is appended to a bytearray part of a partial frame, not kept whole
_SMALL_CHUNK_BYTES = 16 * 1024
# BufferedProtocol receive: the reusable area's size, and the least remainder of an incomplete
# frame that is read straight into the frame's own buffer
_RECEIVE_AREA_BYTES = 64 * 1024
_DIRECT_FRAME_BYTES = 32 * 1024
_V2_BY_V3 = {v3_code: int(v2) for v3_code, v2 in V2_STATUS_BY_V3.items()}
# v3 READ answers go to the kernel when it is native; the pure twin parses their varints in
# Python, 4x slower than the protobuf library's C parser (bench/test_bench_codec.py)
_V3_READ_RECORD = ReadResponse if _native.chosen().get("codec_v3") == "native" else None


class FrameDecoder:
    """Splits a byte stream into v2 frames (4-byte length + body)."""

    __slots__ = ("max_frame_size_bytes", "_pending", "_pending_bytes", "_need", "_failed", "v3_failed",
                 "_area", "_frame", "_frame_view", "_ready")

    def __init__(self, max_frame_size_bytes: int = DEFAULT_MAX_FRAME_SIZE_BYTES):
        if not isinstance(max_frame_size_bytes, int) or max_frame_size_bytes < 0:
            raise ValueError(f"max_frame_size_bytes must be an int >= 0, got {max_frame_size_bytes!r}")
        self.max_frame_size_bytes = max_frame_size_bytes
        self._pending: list = []  # the incomplete tail, if any: bytes, views of bytes, bytearrays
        self._pending_bytes = 0
        self._need = 0  # bytes _pending must hold before a scan can complete a frame
        self._failed: str | None = None
        self.v3_failed = False  # feed_v3_requests met a frame that is no v3 Request
        self._area: memoryview | None = None  # BufferedProtocol receive area, made on first use
        self._frame: bytearray | None = None  # the incomplete frame read in place (_pending_bytes filled)
        self._frame_view: memoryview | None = None
        self._ready: memoryview | None = None  # read-only: a frame `received` completed, to feed

    @property
    def buffered_bytes(self) -> int:
        """Bytes held for a frame that is not complete yet."""
        return self._pending_bytes

    # -- BufferedProtocol receive
    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the transport should put the next bytes (asyncio.BufferedProtocol.get_buffer):
        the rest of an incomplete large frame, else the receive area. After the transport
        wrote n bytes there, call `received(n)` and feed what it returns."""
        frame = self._frame
        if frame is None:
            if (self._pending_bytes >= 4 and self._need - self._pending_bytes >= _DIRECT_FRAME_BYTES
                    and self._failed is None):
                frame = self._frame = bytearray(self._need)
                view = self._frame_view = memoryview(frame)
                pos = 0
                for part in self._pending:
                    view[pos:pos + len(part)] = part  # a memcpy (bytearray slice assignment is not)
                    pos += len(part)
                self._pending = []
            else:
                if self._area is None:
                    self._area = memoryview(bytearray(_RECEIVE_AREA_BYTES))
                return self._area
        return self._frame_view[self._pending_bytes:]

    def received(self, nbytes: int):
        """The bytes the transport just wrote into `get_buffer`'s buffer, to pass to one of the
        feeds: None while a frame read in place is incomplete, then that whole frame (taken by
        the feed as is); else a view of the receive area (copied by the feed)."""
        if self._frame is None:
            return self._area[:nbytes]
        self._pending_bytes += nbytes
        if self._pending_bytes < len(self._frame):
            return None
        # Read-only once here, so every view the feeds cut of it is read-only too
        ready = self._ready = self._frame_view.toreadonly()
        self._frame = self._frame_view = None
        self._pending_bytes = 0
        return ready

    # -- plumbing shared by the feeds
    def _collect(self, data) -> bytes | memoryview | None:
        if self._failed is not None:
            raise BadFrameLengthError(f"stream already failed: {self._failed}", length=-1,
                                      max_frame_size_bytes=self.max_frame_size_bytes)
        if self._ready is not None and data is self._ready:
            self._ready = None  # a whole frame `received` completed: nothing else is pending
            return data
        if self._frame is not None:
            raise RuntimeError("a frame is being read in place (get_buffer): pass what received() returns")
        pending = self._pending
        if pending:
            if len(data) < _SMALL_CHUNK_BYTES:
                if type(pending[-1]) is bytearray:
                    pending[-1] += data
                else:
                    pending.append(bytearray(data))
            else:
                # The caller may reuse a bytearray/memoryview buffer: keep an immutable copy.
                pending.append(data if type(data) is bytes else bytes(data))
            self._pending_bytes += len(data)
            if self._pending_bytes < self._need:
                return None
            buf = b"".join(pending)
            self._pending = []
            self._pending_bytes = 0
            return buf
        # The caller may reuse a bytearray/memoryview buffer: take an immutable copy.
        return data if type(data) is bytes else bytes(data)

    def _settle(self, buf, end: int, err: int, done: list) -> list:
        if err:
            (length,) = _i32.unpack_from(buf, end)
            why = "negative" if length < 0 else f"above max_frame_size_bytes {self.max_frame_size_bytes}"
            self._failed = f"frame length {length} is {why}"
            raise BadFrameLengthError(self._failed, length=length,
                                      max_frame_size_bytes=self.max_frame_size_bytes, frames=done)
        tail = len(buf) - end
        if tail:
            # buf is immutable, so a view of it is safe; a short tail is copied instead, so an
            # idle connection does not pin a whole receive chunk for a few bytes
            self._pending = [memoryview(buf)[end:] if 2 * tail >= len(buf) else buf[end:]]
            self._pending_bytes = tail
            # A 4-byte prefix in the tail was already validated by the scan.
            self._need = 4 + _i32.unpack_from(buf, end)[0] if tail >= 4 else 4
        return done

    # -- public feeds
    def feed(self, data) -> list[memoryview]:
        """Frame bodies (without the length prefix) completed by `data`."""
        buf = self._collect(data)
        if buf is None:
            return []
        frames, end, err = _split_frames(buf, 0, self.max_frame_size_bytes)
        mv = memoryview(buf)
        return self._settle(buf, end, err, [mv[off:off + ln] for off, ln in frames])

    def feed_requests(self, data) -> list:
        """Server side: request messages (or RequestDecodeError instances) completed by `data`.

        The kernel decodes every well-formed ADD of the chunk straight into
        AddRequest records in one pass, and every plain READ into a ReadRequest
        (what decode_request gives for it); only the other frames (fencing reads,
        other ops, malformed ones) go through codec.decode_request.
        """
        buf = self._collect(data)
        if buf is None:
            return []
        items, end, err, deferred = _scan_add_requests(buf, 0, self.max_frame_size_bytes, AddRequest, ReadRequest)
        if deferred:
            mv = memoryview(buf)
            for i in deferred:
                items[i] = _slow_request(mv, items[i])
        return self._settle(buf, end, err, items)

    def feed_v3_requests(self, data) -> list:
        """Server side while the connection may speak v3: v3 requests (V3AddRequest records for
        plain ADDs, V3ReadRequest records for plain READs, decoded by the kernel; parsed `Request`s;
        the answer bytes of a malformed ADD).
        From the first frame that is no v3 Request on, frames are decoded as v2 as feed_requests
        does, and `v3_failed` is set: the caller uses feed_requests from then on."""
        buf = self._collect(data)
        if buf is None:
            return []
        items, end, err, deferred = _scan_v3_add_requests(buf, 0, self.max_frame_size_bytes, v3.V3AddRequest,
                                                         v3.V3ReadRequest)
        if deferred and _v3_slow_requests(memoryview(buf), items, deferred, end):
            self.v3_failed = True
        return self._settle(buf, end, err, items)

    def feed_v3_responses(self, data) -> list:
        """Client side on a v3 connection: the v2 answer message of each v3 Response (plain ADD
        and READ answers decoded by the kernel, the rest by bk.proto.v3), or a ResponseDecodeError
        in its place."""
        buf = self._collect(data)
        if buf is None:
            return []
        items, end, err, deferred = _scan_v3_add_responses(buf, 0, self.max_frame_size_bytes, _V2_BY_V3,
                                                          AddResponse, _V3_READ_RECORD)
        if deferred:
            mv = memoryview(buf)
            for i in deferred:
                off, ln = items[i]
                try:
                    items[i] = v3.response_to_v2(mv[off:off + ln])
                except ResponseDecodeError as e:
                    items[i] = _detached(e)
        return self._settle(buf, end, err, items)

    def feed_responses(self, data) -> list:
        """Client side: response messages (or ResponseDecodeError instances) completed by `data`."""
        buf = self._collect(data)
        if buf is None:
            return []
        items, end, err, deferred = _scan_add_responses(buf, 0, self.max_frame_size_bytes, AddResponse,
                                                       ReadResponse)
        if deferred:
            mv = memoryview(buf)
            for i in deferred:
                items[i] = _slow_response(mv, items[i])
        return self._settle(buf, end, err, items)


def _v3_slow_requests(mv: memoryview, items: list, deferred: list, end: int) -> bool:
    """Parse the kernel's deferred frames with the protobuf library, in place. At the first frame
    that is no v3 Request, that frame and every later one are decoded as v2 instead (BookKeeper's
    rule: a connection falls back to v2 for good); True when that happened."""
    key_cache = [None]
    for i in deferred:
        off, ln = items[i]
        try:
            req = v3.parse(v3.Request, mv[off:off + ln])
        except v3.V3DecodeError:
            break  # the v2 decoding is done outside the handler: its errors must not chain to this one
        items[i] = v3.request_item(req, key_cache)
    else:
        return False
    del items[i:]
    pos = off - 4
    while pos < end:
        (ln,) = _i32.unpack_from(mv, pos)
        items.append(_slow_request(mv, (pos + 4, ln)))
        pos += 4 + ln
    return True


def _slow_request(mv: memoryview, item):
    off, ln = item
    try:
        return decode_request(mv[off:off + ln])
    except RequestDecodeError as e:
        return _detached(e)


def _detached(e: Exception) -> Exception:
    """An error handed back as an item, without its traceback and chained exceptions: their
    frames reach the caller's frame, whose `items` list holds the error, a cycle only the
    cyclic GC frees, and with it the read buffers the frames' memoryviews pin. A flood of bad
    frames piled up tens of thousands of such cycles in a bookie (the live fuzzer's RSS)."""
    e.__traceback__ = e.__context__ = e.__cause__ = None
    return e


def _slow_response(mv: memoryview, item):
    off, ln = item
    try:
        return decode_response(mv[off:off + ln])
    except ResponseDecodeError as e:
        return _detached(e)
