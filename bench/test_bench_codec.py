"""Wire codec micro benchmarks: the bookie's ADD hot path and entry digests.

    pytest bench/test_bench_codec.py --benchmark-only -q

Native and pure kernels run side by side in one run (the `kernel` parameter
swaps the codec kernel the proto modules use). extra_info carries frames/s
(decode, encode) or MB/s (digests), computed from the median round.
- decode: one chunk of 1,000 ADD request frames (100 B and 1 KB payloads) through
  FrameDecoder.feed_requests (split + decode into AddRequest messages), and
  through FrameDecoder.feed (split only);
- encode: 1,000 ADD responses into one buffer (encode_add_responses);
- read answers (a client's side of single READs): one chunk of 1,000 READ answers of 1 KiB
  entries, v2 through FrameDecoder.feed_responses and v3 through feed_v3_responses, taken by
  the native or pure kernel, or by the slow path every READ answer took before (`library`:
  codec.decode_response for v2, the protobuf library for v3);
- digests: DigestManager.frame_entry (payload given as bytes) and verify_entry
  (payload is a view into the entry) on 1 KB and 64 KB payloads. CRC32C uses
  google_crc32c for bytes and the kernel's crc32c for views below 8 KiB; CRC32 is
  zlib and MAC is hmac/OpenSSL whatever the kernel, so only CRC32C runs twice.
"""
import os

import pytest

import bk.proto.codec as codec_mod
import bk.proto.digest as digest_mod
import bk.proto.framing as framing_mod
from bk._native import load_native, load_pure
from bk.proto import AddRequest, DigestManager, FrameDecoder, encode_add_responses, encode_request, master_key

KERNELS = {"native": load_native("codec"), "pure": load_pure("codec")}
FRAMES = 1000


@pytest.fixture(params=["native", "pure"])
def kernel(request, monkeypatch):
    k = KERNELS[request.param]
    if k is None:
        pytest.skip("native codec not built")
    monkeypatch.setattr(framing_mod, "_split_frames", k.split_frames)
    monkeypatch.setattr(framing_mod, "_scan_add_requests", k.scan_add_requests)
    monkeypatch.setattr(framing_mod, "_scan_add_responses", k.scan_add_responses)
    monkeypatch.setattr(codec_mod, "_codec", k)
    monkeypatch.setattr(digest_mod, "_crc32c", k.crc32c)
    monkeypatch.setattr(digest_mod, "_codec", k)  # DigestManager's whole-entry check
    return request.param


def add_chunk(payload_bytes: int) -> bytes:
    key = master_key(b"bench")
    dm = DigestManager(7, "CRC32C", b"bench")
    payload = os.urandom(payload_bytes)
    return b"".join(encode_request(AddRequest(0, key, 7, i, dm.frame_entry(i, i - 1, (i + 1) * payload_bytes,
                                                                             payload)))
                    for i in range(FRAMES))


def per_second(benchmark, count: int) -> int:
    return round(count / benchmark.stats.stats.median)


@pytest.mark.parametrize("payload_bytes", [100, 1024])
def test_decode_add_chunk(benchmark, kernel, payload_bytes):
    chunk = add_chunk(payload_bytes)
    msgs = benchmark(lambda: FrameDecoder().feed_requests(chunk))
    assert len(msgs) == FRAMES and type(msgs[-1]) is AddRequest
    benchmark.extra_info.update(kernel=kernel, frames_per_chunk=FRAMES, chunk_bytes=len(chunk),
                                frames_per_s=per_second(benchmark, FRAMES))


@pytest.mark.parametrize("payload_bytes", [100, 1024])
def test_split_add_chunk(benchmark, kernel, payload_bytes):
    chunk = add_chunk(payload_bytes)
    frames = benchmark(lambda: FrameDecoder().feed(chunk))
    assert len(frames) == FRAMES
    benchmark.extra_info.update(kernel=kernel, frames_per_chunk=FRAMES,
                                frames_per_s=per_second(benchmark, FRAMES))


def read_answers_chunk(protocol: str) -> bytes:
    from bk.proto import ReadResponse, encode_response, v3
    dm = DigestManager(7, "CRC32C", b"bench")
    payload = os.urandom(1024)
    answers = [ReadResponse(0, 7, i, dm.frame_entry(i, i - 1, (i + 1) * 1024, payload)) for i in range(FRAMES)]
    if protocol == "v2":
        return b"".join(encode_response(a) for a in answers)
    header = v3.Request().header
    header.version, header.operation = v3.PROTOCOL_VERSION_V3, v3.OperationType.READ_ENTRY
    out = []
    for i, a in enumerate(answers):
        header.txnId = i + 1
        out.append(v3.frame(v3.response_to_v3(header, a)))
    return b"".join(out)


@pytest.mark.parametrize("protocol", ["v2", "v3"])
@pytest.mark.parametrize("path", ["native", "pure", "library"])
def test_decode_read_answers_chunk(benchmark, monkeypatch, path, protocol):
    from bk.proto import ReadResponse
    name, scan_name = ("codec", "scan_add_responses") if protocol == "v2" else ("codec_v3", "scan_v3_add_responses")
    k = load_pure(name) if path == "pure" else load_native(name)
    if k is None:
        pytest.skip("native codec not built")
    scan = getattr(k, scan_name)
    # library: the kernel takes the ADD answers only and defers every READ answer to the slow path
    monkeypatch.setattr(framing_mod, "_" + scan_name, (lambda *a: scan(*a[:-1])) if path == "library" else
                        (lambda *a: scan(*a[:-1], ReadResponse)))
    chunk = read_answers_chunk(protocol)
    msgs = benchmark(lambda: getattr(FrameDecoder(), "feed_responses" if protocol == "v2" else "feed_v3_responses")(chunk))
    assert len(msgs) == FRAMES and type(msgs[-1]) is ReadResponse and msgs[-1].entry_id == FRAMES - 1
    benchmark.extra_info.update(path=path, protocol=protocol, frames_per_chunk=FRAMES,
                                frames_per_s=per_second(benchmark, FRAMES))


def test_encode_add_responses(benchmark, kernel):
    rows = [(0, 7, i) for i in range(FRAMES)]
    out = benchmark(encode_add_responses, rows)
    assert len(out) == 28 * FRAMES
    benchmark.extra_info.update(kernel=kernel, frames_per_s=per_second(benchmark, FRAMES))


@pytest.mark.parametrize("payload_bytes", [1024, 65536])
@pytest.mark.parametrize("digest", ["CRC32C", "CRC32", "MAC"])
def test_digest_frame_entry(benchmark, kernel, digest, payload_bytes):
    if kernel == "pure" and digest != "CRC32C":
        pytest.skip("only CRC32C goes through the codec kernel")
    dm = DigestManager(7, digest, b"bench")
    payload = os.urandom(payload_bytes)
    entry = benchmark(dm.frame_entry, 1, 0, payload_bytes, payload)
    assert bytes(dm.verify_entry(1, entry)[2]) == payload
    benchmark.extra_info.update(kernel=kernel, digest=digest, payload_bytes=payload_bytes,
                                mb_per_s=round(payload_bytes / benchmark.stats.stats.median / 1e6, 1))


@pytest.mark.parametrize("payload_bytes", [1024, 65536])
@pytest.mark.parametrize("digest", ["CRC32C", "CRC32", "MAC"])
def test_digest_verify_entry(benchmark, kernel, digest, payload_bytes):
    if kernel == "pure" and digest != "CRC32C":
        pytest.skip("only CRC32C goes through the codec kernel")
    dm = DigestManager(7, digest, b"bench")
    entry = dm.frame_entry(1, 0, payload_bytes, os.urandom(payload_bytes))
    lac, length, payload = benchmark(dm.verify_entry, 1, entry)
    assert len(payload) == payload_bytes
    benchmark.extra_info.update(kernel=kernel, digest=digest, payload_bytes=payload_bytes,
                                mb_per_s=round(payload_bytes / benchmark.stats.stats.median / 1e6, 1))
