"""The journal byte kernel: native and pure twins agree, CRCs equal google_crc32c."""
from __future__ import annotations

import random
import struct

import google_crc32c
import pytest

from bk._native import load_native, load_pure

PURE = load_pure("journal")
NATIVE = load_native("journal")
KERNELS = [pytest.param(PURE, id="pure"),
           pytest.param(NATIVE, id="native",
                        marks=pytest.mark.skipif(NATIVE is None, reason="native kernel not built"))]
need_native = pytest.mark.skipif(NATIVE is None, reason="native kernel not built")


def rand_bytes(rng: random.Random, n: int) -> bytes:
    return rng.getrandbits(8 * n).to_bytes(n, "little") if n else b""


@pytest.mark.parametrize("k", KERNELS)
def test_crc_matches_google(k):
    rng = random.Random(1)
    for n in [0, 1, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1000, 4096, 70_000]:
        data = rand_bytes(rng, n)
        assert k.crc32c(data) == google_crc32c.value(data)
        assert k.crc32c_table(data) == google_crc32c.value(data)
        cut = rng.randint(0, n)
        assert k.crc32c(data[cut:], k.crc32c(data[:cut])) == google_crc32c.value(data)
    assert k.crc32c(b"123456789") == 0xE3069283  # the standard CRC32C check value


@need_native
def test_native_crc_unaligned_views_and_buffers():
    rng = random.Random(2)
    data = rand_bytes(rng, 5000)
    for off in range(9):
        view = memoryview(data)[off:off + 4000]
        want = google_crc32c.value(bytes(view))
        assert NATIVE.crc32c(view) == want
        assert NATIVE.crc32c_table(view) == want
        assert NATIVE.crc32c(bytearray(view)) == want


@pytest.mark.parametrize("k", KERNELS)
def test_crc_rejects_out_of_range_seed(k):
    with pytest.raises((ValueError, OverflowError)):
        k.crc32c(b"x", 1 << 32)


@pytest.mark.parametrize("k", KERNELS)
def test_frame_layout(k):
    out = k.frame_records([b"hello", bytearray(b"ab"), memoryview(b"xyz")])
    want = b""
    for body in (b"hello", b"ab", b"xyz"):
        want += struct.pack(">II", len(body), google_crc32c.value(body)) + body
    assert out == want
    assert k.frame_records([]) == b""


@need_native
def test_frame_agrees_on_random_groups():
    rng = random.Random(3)
    for _ in range(40):
        bodies = [rand_bytes(rng, rng.choice([1, 16, 100, 1000, rng.randint(1, 20_000)]))
                  for _ in range(rng.randint(1, 60))]
        # mix buffer types so the native buffer-export path is exercised too
        mixed = [b if i % 3 else bytearray(b) if i % 2 else memoryview(b) for i, b in enumerate(bodies)]
        assert NATIVE.frame_records(mixed) == PURE.frame_records(bodies)


@need_native
def test_frame_large_group_nogil_path():
    rng = random.Random(4)
    bodies = [rand_bytes(rng, 64 * 1024) for _ in range(20)]
    assert NATIVE.frame_records(bodies) == PURE.frame_records(bodies)


@pytest.mark.parametrize("k", KERNELS)
def test_frame_rejects_non_buffers(k):
    with pytest.raises(TypeError):
        k.frame_records([b"ok", "not bytes"])


@pytest.mark.parametrize("k", KERNELS)
def test_frame_headers_are_the_frame_without_bodies(k):
    bodies = [b"hello", bytearray(b"ab"), memoryview(b"xyz"), bytes(70_000)]
    heads = k.frame_headers(bodies)
    assert len(heads) == 8 * len(bodies)
    assert b"".join(heads[8 * i:8 * i + 8] + bytes(b) for i, b in enumerate(bodies)) == k.frame_records(bodies)
    assert k.frame_headers([]) == b""
    with pytest.raises(TypeError):
        k.frame_headers([b"ok", "not bytes"])


@need_native
def test_frame_headers_agree_on_random_groups():
    rng = random.Random(5)
    for _ in range(40):
        bodies = [rand_bytes(rng, rng.choice([1, 16, 100, rng.randint(1, 100_000)])) for _ in range(rng.randint(0, 30))]
        mixed = [b if i % 3 else bytearray(b) if i % 2 else memoryview(b) for i, b in enumerate(bodies)]
        assert NATIVE.frame_headers(mixed) == PURE.frame_headers(bodies)


def _corrupt(rng: random.Random, buf: bytes, offsets: list[int]) -> tuple[bytes, str]:
    kind = rng.choice(["flip", "truncate", "zero_tail", "garbage_tail", "length"])
    if kind == "flip":
        i = rng.randrange(len(buf))
        return buf[:i] + bytes([buf[i] ^ (1 << rng.randrange(8))]) + buf[i + 1:], kind
    if kind == "truncate":
        return buf[:rng.randrange(len(buf))], kind
    if kind == "zero_tail":
        cut = rng.choice(offsets)
        return buf[:cut] + bytes(rng.randint(1, 300)), kind
    if kind == "garbage_tail":
        cut = rng.choice(offsets)
        return buf[:cut] + rand_bytes(rng, rng.randint(1, 300)), kind
    cut = rng.choice(offsets)  # oversized length field
    return buf[:cut] + struct.pack(">I", 0xFFFFFF00) + buf[cut + 4:], kind


def _group(rng: random.Random) -> tuple[list[bytes], bytes, list[int]]:
    bodies = [rand_bytes(rng, rng.randint(1, 3000)) for _ in range(rng.randint(1, 40))]
    buf = PURE.frame_records(bodies)
    offsets, pos = [], 0
    for b in bodies:
        offsets.append(pos)
        pos += 8 + len(b)
    return bodies, buf, offsets


@pytest.mark.parametrize("k", KERNELS)
def test_scan_clean_roundtrip(k):
    rng = random.Random(5)
    for _ in range(20):
        bodies, buf, offsets = _group(rng)
        prefix = rand_bytes(rng, rng.randint(0, 20))
        data = prefix + buf
        recs, stop, status = k.scan_records(data, len(prefix), len(data), 1 << 20)
        assert status == 0 and stop == len(data)
        assert [bytes(data[o:o + n]) for o, n in recs] == bodies
        assert [o - 8 - len(prefix) for o, _ in recs] == offsets


@pytest.mark.parametrize("k", KERNELS)
def test_scan_statuses(k):
    rec = PURE.frame_records([b"abcdef"])
    assert k.scan_records(rec, 0, len(rec), 100) == ([(8, 6)], len(rec), 0)
    assert k.scan_records(rec, 0, len(rec) - 1, 100) == ([], 0, 1)
    assert k.scan_records(rec + b"\0\0\0", 0, len(rec) + 3, 100) == ([(8, 6)], len(rec), 1)
    assert k.scan_records(rec + bytes(8), 0, len(rec) + 8, 100)[1:] == (len(rec), 2)
    assert k.scan_records(rec, 0, len(rec), 5) == ([], 0, 2)
    bad = rec[:-1] + bytes([rec[-1] ^ 1])
    assert k.scan_records(bad, 0, len(bad), 100) == ([], 0, 3)
    assert k.scan_records(rec, 3, 3, 100) == ([], 3, 0)
    with pytest.raises(ValueError):
        k.scan_records(rec, 0, len(rec) + 1, 100)
    with pytest.raises(ValueError):
        k.scan_records(rec, 5, 2, 100)


@need_native
def test_scan_agrees_on_random_corruptions():
    rng = random.Random(6)
    for _ in range(300):
        _, buf, offsets = _group(rng)
        bad, _ = _corrupt(rng, buf, offsets)
        max_len = rng.choice([1 << 20, 2000])
        start = rng.choice([0] + offsets)
        start = min(start, len(bad))
        got_n = NATIVE.scan_records(bad, start, len(bad), max_len)
        got_p = PURE.scan_records(bad, start, len(bad), max_len)
        assert got_n == got_p
        got_n = NATIVE.find_valid_record(bad, start, len(bad), max_len)
        assert got_n == PURE.find_valid_record(bad, start, len(bad), max_len)


@pytest.mark.parametrize("k", KERNELS)
def test_find_valid_record(k):
    rng = random.Random(7)
    rec = PURE.frame_records([b"0123456789abcdef-payload"])
    garbage = bytes(50) + rand_bytes(rng, 30).replace(b"\0", b"\1")
    data = garbage + rec
    assert k.find_valid_record(data, 0, len(data), 1000) == len(garbage)
    assert k.find_valid_record(data, 0, len(data) - 1, 1000) == -1
    assert k.find_valid_record(bytes(400), 0, 400, 1000) == -1
