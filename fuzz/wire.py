"""Fuzz targets of the wire codecs: v2 and v3, requests (server side) and responses (client side).

Contracts checked on every input (the codec docstrings in bk/proto):
- the kernels' native and pure twins agree (split_frames, scan_add_*, scan_v3_add_*,
  v3_add_request_from_v2, v3_read_request_from_v2);
- FrameDecoder feeds return messages or error *items*, and raise only BadFrameLengthError;
  feeding the same bytes in pieces gives the same items as feeding them at once;
- a decoded v2 request or response encodes back to the very frame it came from;
- the answer to a request that failed to decode is a well-formed frame carrying its status;
- an ADD the v3 kernel decoded is the ADD the protobuf library parses from the same bytes, and
  an ADD or READ answer the v3 kernel decoded is the library's.
"""
from __future__ import annotations

from bk.errors import BadRequestError
from bk.formats import wire as layout
from bk.proto import codec, v3
from bk.proto.constants import V2_STATUS_BY_V3
from bk.proto.framing import FrameDecoder
from bk.proto.messages import (AddRequest, AddResponse, BadFrameLengthError, MessageEncodeError, ReadResponse,
                               RequestDecodeError, ResponseDecodeError)

from .contract import Twins, allowed, check, item_value, params, plain

_codec = Twins("codec")
_codec_v3 = Twins("codec_v3")
_V2_BY_V3 = {v3_code: int(v2) for v3_code, v2 in V2_STATUS_BY_V3.items()}
# max_frame_size_bytes choices: tiny limits reach the bad-length paths, the default the rest
_MAX_FRAMES = (0, 8, 24, 64, 1024, layout.DEFAULT_MAX_FRAME_SIZE_BYTES, 0x7FFFFFFF, 56)


def _feed(feed_name: str, max_frame: int, chunks) -> tuple:
    """(items as values, error or None, v3_failed) of feeding `chunks` to one decoder."""
    dec = FrameDecoder(max_frame)
    out = []
    for chunk in chunks:
        if dec.v3_failed:  # the connection is v2 for good: its caller switches feeds (framing.py)
            feed_name = "feed_requests"
        try:
            out += [item_value(i) for i in getattr(dec, feed_name)(chunk)]
        except BadFrameLengthError as e:
            out += [item_value(i) for i in e.frames]
            return out, "bad length", dec.v3_failed
    return out, None, dec.v3_failed


def _chunked(feed_name: str, max_frame: int, buf: bytes, cut: int):
    whole = _feed(feed_name, max_frame, [buf])
    a = cut % (len(buf) + 1)
    b = a + (cut * 7919) % (len(buf) - a + 1)
    pieces = _feed(feed_name, max_frame, [buf[:a], bytearray(buf[a:b]), memoryview(buf[b:])])
    check(whole == pieces, f"{feed_name}: whole {whole!r:.300} != pieces at {a},{b} {pieces!r:.300}")


def _frames(buf: bytes, max_frame: int):
    """Bodies of the complete frames at the start of buf (split_frames' walk)."""
    found, _, _ = _codec.same("split_frames", buf, 0, max_frame)
    return [buf[off:off + ln] for off, ln in found]


def _check_answer(frame: bytes, rc: int) -> None:
    """An error answer: one whole frame whose body decodes (when its op is known) with status rc."""
    check(len(frame) >= 4 and int.from_bytes(frame[:4], "big", signed=True) == len(frame) - 4,
          f"error answer {frame!r:.100} is not one frame")
    with allowed(ResponseDecodeError):  # the generic layout of an unknown op has no decoder
        check(codec.decode_response(frame[4:]).rc == rc, "error answer carries another status")


# ---------------------------------------------------------------- v2
def v2_request(data: bytes) -> None:
    p, buf = params(data, 2)
    max_frame = _MAX_FRAMES[p[0] & 7]
    _codec.same("split_frames", buf, 0, max_frame, normalize=plain)
    _codec.same("scan_add_requests", buf, 0, max_frame, AddRequest, normalize=plain)
    _chunked("feed_requests", max_frame, buf, p[1])
    for body in _frames(buf, max_frame):
        try:
            msg = codec.decode_request(body)
        except RequestDecodeError as e:
            try:
                answer = codec.error_response_for(e)
            except MessageEncodeError:
                check(e.op == codec.AUTH, f"only AUTH has no error answer, not op {e.op}")
                continue
            _check_answer(answer, e.code)
            continue
        frame = len(body).to_bytes(4, "big") + body
        check(codec.encode_request(msg) == frame, f"{msg!r} does not encode back to its frame")
        if type(msg) is AddRequest:  # the batch path's segmenting kernel on what the decoder gives
            _codec.same("scan_add_run", [msg, msg], normalize=plain)


def v2_response(data: bytes) -> None:
    p, buf = params(data, 2)
    max_frame = _MAX_FRAMES[p[0] & 7]
    _codec.same("scan_add_responses", buf, 0, max_frame, AddResponse, ReadResponse, normalize=plain)
    _chunked("feed_responses", max_frame, buf, p[1])
    for body in _frames(buf, max_frame):
        try:
            msg = codec.decode_response(body)
        except ResponseDecodeError:
            continue
        version, op, _ = codec.split_header(int.from_bytes(body[:4], "big"))
        with allowed(MessageEncodeError):  # the header's flags are not part of a response message
            if codec.encode_header(version, op) == int.from_bytes(body[:4], "big"):
                frame = len(body).to_bytes(4, "big") + body
                check(codec.encode_response(msg, version) == frame, f"{msg!r} does not encode back")


# ---------------------------------------------------------------- v3
def v3_request(data: bytes) -> None:
    p, buf = params(data, 3)
    max_frame = _MAX_FRAMES[p[0] & 7]
    scanned = _codec_v3.same("scan_v3_add_requests", buf, 0, max_frame, v3.V3AddRequest, v3.V3ReadRequest,
                             normalize=plain)
    _codec_v3.same("v3_add_request_from_v2", buf, p[2] * 0x0101010101, normalize=plain)
    _codec_v3.same("v3_read_request_from_v2", buf, p[2] * 0x0101010101, normalize=plain)
    _chunked("feed_v3_requests", max_frame, buf, p[1])
    items = scanned[0]
    for i, body in enumerate(_frames(buf, max_frame)):
        try:
            req = v3.parse(v3.Request, body)
        except v3.V3DecodeError:
            check(i in scanned[3], "the v3 kernel took a frame the protobuf library refuses")
            continue
        item = v3.request_item(req, [None])
        if i not in scanned[3] and len(items[i]) == len(v3.V3ReadRequest._fields):  # a plain READ (plain tuple)
            rec = v3.V3ReadRequest(*items[i])  # exactly the library's Request, its header's bytes echoed
            check(v3.read_request(rec).SerializeToString() == req.SerializeToString()
                  and rec.header == req.header.SerializeToString(), f"v3 kernel READ {rec!r} != library")
        elif i not in scanned[3]:
            check(item == items[i], f"v3 kernel ADD {items[i]!r} != library {item!r}")
        if isinstance(item, bytes):
            check(v3.parse(v3.Response, item[4:]).status != 0, "an EBADREQ answer with status EOK")
        with allowed(v3.V3DecodeError):  # a header that cannot be echoed (encode refused)
            answer = v3.frame(v3.error_response(req, BadRequestError.code))
            check(v3.parse(v3.Response, answer[4:]).header.txnId == req.header.txnId, "answer lost txnId")


def v3_response(data: bytes) -> None:
    p, buf = params(data, 2)
    max_frame = _MAX_FRAMES[p[0] & 7]
    scanned = _codec_v3.same("scan_v3_add_responses", buf, 0, max_frame, _V2_BY_V3, AddResponse, ReadResponse,
                             normalize=plain)
    _chunked("feed_v3_responses", max_frame, buf, p[1])
    items = scanned[0]
    for i, body in enumerate(_frames(buf, max_frame)):
        try:
            msg = v3.response_to_v2(body)
        except ResponseDecodeError:
            check(i in scanned[3], "the v3 kernel took an answer the protobuf library refuses")
            continue
        if i not in scanned[3]:
            check(tuple(msg) == tuple(items[i]), f"v3 kernel answer {items[i]!r} != library {msg!r}")
    with allowed(v3.V3DecodeError):
        ids = v3.decode_entries_availability(buf)
        check(v3.decode_entries_availability(v3.encode_entries_availability(sorted(set(ids)))) == sorted(set(ids)),
              "availability does not round-trip")


TARGETS = {"v2_request": v2_request, "v2_response": v2_response, "v3_request": v3_request,
           "v3_response": v3_response}
