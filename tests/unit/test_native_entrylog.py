"""The entrylog kernel: pure twin is the reference; the native build must agree."""
import random
import struct

import pytest

from bk._native import load_native, load_pure

PURE = load_pure("entrylog")
NATIVE = load_native("entrylog")
KERNELS = [pytest.param(PURE, id="pure"),
           pytest.param(NATIVE, id="native",
                        marks=pytest.mark.skipif(NATIVE is None, reason="native entrylog not built"))]


def _entry(rng, ledger_id, entry_id, payload_len):
    return struct.pack(">qq", ledger_id, entry_id) + rng.randbytes(payload_len)


@pytest.mark.parametrize("k", KERNELS)
def test_frame_layout_and_offsets(k):
    entries = [struct.pack(">qq", 7, 0) + b"abc", struct.pack(">qq", 7, 1), b"", bytearray(b"xy")]
    frame, offsets = k.frame_entries(entries, 1024)
    expect = b"".join(struct.pack(">I", len(e)) + bytes(e) for e in entries)
    assert frame == expect
    assert offsets == [1024, 1024 + 23, 1024 + 23 + 20, 1024 + 23 + 20 + 4]


@pytest.mark.parametrize("k", KERNELS)
def test_frame_accepts_buffers_and_big_base(k):
    base = (0xFFFFFFFE << 32) | 4096  # a location base, as the EntryLogger passes it
    mv = memoryview(b"0123456789abcdefXYZ")
    frame, offsets = k.frame_entries([mv, b"q" * 16], base)
    assert offsets == [base, base + 4 + 19]
    assert frame[:4] == struct.pack(">I", 19) and frame[4:23] == bytes(mv)


@pytest.mark.parametrize("k", KERNELS)
def test_frame_rejects_non_buffers(k):
    with pytest.raises(TypeError):
        k.frame_entries([b"ok", 123], 0)


@pytest.mark.parametrize("k", KERNELS)
def test_scan_round_trip(k):
    rng = random.Random(1)
    entries = [_entry(rng, rng.randrange(1 << 40), i, rng.randrange(0, 300)) for i in range(200)]
    frame, offsets = k.frame_entries(entries, 0)
    recs, stop, status = k.scan_log(frame, 0, len(frame), 1 << 20)
    assert status == 0 and stop == len(frame)
    assert [r[0] for r in recs] == offsets
    for (off, size, lid, eid), e in zip(recs, entries):
        assert size == len(e)
        assert (lid, eid) == struct.unpack(">qq", e[:16])


@pytest.mark.parametrize("k", KERNELS)
def test_scan_statuses(k):
    e = struct.pack(">qq", 1, 2) + b"payload"
    frame, _ = k.frame_entries([e, e], 0)
    n = 4 + len(e)
    assert k.scan_log(frame, 0, len(frame) - 1, 100)[1:] == (n, 1)  # body cut short
    assert k.scan_log(frame, 0, n + 3, 100)[1:] == (n, 1)  # size field cut short
    assert k.scan_log(frame, 0, len(frame), 16)[1:] == (0, 2)  # over max_entry_bytes
    assert k.scan_log(struct.pack(">I", 15) + bytes(15), 0, 19, 100)[1:] == (0, 2)  # below 16
    assert k.scan_log(bytes(64), 0, 64, 100)[1:] == (0, 2)  # zeros: size 0
    assert k.scan_log(frame, n, len(frame), 100) == ([(n, len(e), 1, 2)], len(frame), 0)
    assert k.scan_log(frame, 5, 5, 100) == ([], 5, 0)
    with pytest.raises(ValueError):
        k.scan_log(frame, 0, len(frame) + 1, 100)
    with pytest.raises(ValueError):
        k.scan_log(frame, 10, 5, 100)


@pytest.mark.parametrize("k", KERNELS)
def test_scan_negative_ids_are_signed(k):
    e = struct.pack(">qq", -1, -0x1000)
    frame, _ = k.frame_entries([e], 0)
    assert k.scan_log(frame, 0, len(frame), 100)[0] == [(0, 16, -1, -0x1000)]


@pytest.mark.skipif(NATIVE is None, reason="native entrylog not built")
def test_native_agrees_with_pure_on_random_input():
    rng = random.Random(20240601)
    for _ in range(300):
        n = rng.randrange(0, 30)
        entries = [rng.randbytes(rng.choice([0, 5, 16, 17, rng.randrange(0, 2000)])) for _ in range(n)]
        entries = [bytearray(e) if rng.random() < 0.2 else e for e in entries]
        base = rng.randrange(0, 1 << 62)
        assert NATIVE.frame_entries(entries, base) == PURE.frame_entries(entries, base)
        frame, offsets = PURE.frame_entries(entries, 0)
        buf = bytearray(frame + rng.randbytes(rng.randrange(0, 40)))
        for _ in range(rng.randrange(0, 4)):  # corrupt some bytes (sizes and ids included)
            if buf:
                buf[rng.randrange(len(buf))] = rng.randrange(256)
        # mostly start on a record boundary (a real scan), sometimes anywhere
        start = rng.choice(offsets) if offsets and rng.random() < 0.7 else rng.randrange(0, len(buf) + 1)
        end = rng.randrange(start, len(buf) + 1)
        max_entry = rng.choice([16, 100, 1000, 1 << 20])
        for b in (bytes(buf), buf, memoryview(buf)):
            assert NATIVE.scan_log(b, start, end, max_entry) == PURE.scan_log(b, start, end, max_entry)
        # fully random bytes too
        junk = rng.randbytes(rng.randrange(0, 200))
        assert NATIVE.scan_log(junk, 0, len(junk), 64) == PURE.scan_log(junk, 0, len(junk), 64)


@pytest.mark.parametrize("k", KERNELS)
def test_frame_slice_bounds_the_frame_and_takes_at_least_one(k):
    es = [struct.pack(">qq", 1, i) + bytes(i) for i in range(10)]  # records of 20 + i bytes
    frame, offsets, stop = k.frame_slice(es, 2, 500, 22 + 23 + 24)
    assert stop == 5 and (frame, offsets) == k.frame_entries(es[2:5], 500)
    assert k.frame_slice(es, 2, 0, 22 + 23 + 23)[2] == 4  # the third does not fit
    assert k.frame_slice(es, 9, 0, 1)[1:] == ([0], 10)  # too big alone: still one entry
    assert k.frame_slice(es, 10, 7, 100) == (b"", [], 10)
    assert k.frame_slice(es, 0, 0, 1 << 30)[2] == 10
    for bad in (-1, 11):
        with pytest.raises(ValueError):
            k.frame_slice(es, bad, 0, 100)
    with pytest.raises(TypeError):
        k.frame_slice([es[0], "not bytes"], 0, 0, 1000)


@pytest.mark.parametrize("k", KERNELS)
def test_record_headers_are_frame_slice_without_the_copy(k):
    es = [struct.pack(">qq", 1, i) + bytes(i * 3) for i in range(10)]
    for start, limit in ((0, 1 << 20), (2, 60), (9, 1), (10, 100), (4, 0)):
        heads, offsets, stop = k.record_headers(es, start, 777, limit)
        frame, f_offsets, f_stop = k.frame_slice(es, start, 777, limit)
        assert (offsets, stop) == (f_offsets, f_stop)
        assert len(heads) == 4 * (stop - start)
        assert b"".join(heads[4 * j:4 * j + 4] + es[start + j] for j in range(stop - start)) == frame
    for bad in (-1, 11):
        with pytest.raises(ValueError):
            k.record_headers(es, bad, 0, 100)
    with pytest.raises(TypeError):
        k.record_headers([es[0], "not bytes"], 0, 0, 1000)


@pytest.mark.parametrize("k", KERNELS)
def test_check_sizes(k):
    es = [bytes(16), bytearray(20), memoryview(bytes(30)), bytes(17)]
    assert k.check_sizes(es, 16, 30) == (83, -1)
    assert k.check_sizes(es, 16, 29) == (36, 2)
    assert k.check_sizes(es, 17, 100) == (0, 0)
    assert k.check_sizes([], 16, 30) == (0, -1)
    with pytest.raises(TypeError):
        k.check_sizes([bytes(16), 5], 16, 30)
    assert k.check_sizes([bytes(3), 5], 16, 30) == (0, 0)  # a bad size first: reported before the type


@pytest.mark.parametrize("k", KERNELS)
def test_ledger_runs(k):
    es = [struct.pack(">qq", lid, i) + bytes(i) for i, lid in enumerate([5, 5, -2, -2, -2, 5, 7])]
    sizes = [4 + len(e) for e in es]
    assert k.ledger_runs(es, 0, 7) == [(5, sizes[0] + sizes[1]), (-2, sum(sizes[2:5])), (5, sizes[5]), (7, sizes[6])]
    assert k.ledger_runs(es, 3, 4) == [(-2, sizes[3])]
    assert k.ledger_runs(es, 4, 4) == []
    assert k.ledger_runs([bytearray(es[0]), memoryview(es[1])], 0, 2) == [(5, sizes[0] + sizes[1])]
    for start, stop in ((-1, 2), (3, 2), (0, 8)):
        with pytest.raises(ValueError):
            k.ledger_runs(es, start, stop)
    with pytest.raises(ValueError):
        k.ledger_runs([es[0], b"short"], 0, 2)
    with pytest.raises(TypeError):
        k.ledger_runs([es[0], 12345678], 0, 2)


@pytest.mark.skipif(NATIVE is None, reason="native entrylog not built")
def test_native_agrees_with_pure_on_batch_helpers():
    rng = random.Random(99)
    for _ in range(300):
        n = rng.randrange(0, 40)
        entries = [struct.pack(">q", rng.choice([0, 1, -1, 1 << 40])) + rng.randbytes(rng.choice([0, 3, 8, rng.randrange(0, 300)]))
                   for _ in range(n)]
        if n and rng.random() < 0.1:
            entries[rng.randrange(n)] = b"tiny"
        entries = [bytearray(e) if rng.random() < 0.2 else e for e in entries]
        lo, hi = rng.choice([(0, 1 << 20), (16, 200), (8, 100)])
        assert NATIVE.check_sizes(entries, lo, hi) == PURE.check_sizes(entries, lo, hi)
        start = rng.randrange(0, n + 1)
        stop = rng.randrange(start, n + 1)
        outcome = []
        for kern in (PURE, NATIVE):
            try:
                outcome.append(kern.ledger_runs(entries, start, stop))
            except ValueError:
                outcome.append(ValueError)
        assert outcome[0] == outcome[1]
        base, limit = rng.randrange(1 << 40), rng.choice([1, 50, 500, 1 << 20])
        assert NATIVE.frame_slice(entries, start, base, limit) == PURE.frame_slice(entries, start, base, limit)
        assert NATIVE.record_headers(entries, start, base, limit) == PURE.record_headers(entries, start, base, limit)
