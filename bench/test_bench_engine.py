"""The whole storage engine (Bookie facade: write cache + journal with group
fsync + checkpoints into entry logs and the index), journal on, fsync per group,
compared in the same run with the raw disk writing the same bytes.

    pytest bench/test_bench_engine.py --benchmark-only -q

Each round adds `count` entries with up to 10,000 in flight and waits for every
acknowledgement; extra_info carries entries/s and MB/s. The raw baseline writes
the same journal-sized byte stream with os.write + os.fdatasync per group of
the same size the journal forms (512 KiB), on the same disk.
"""
import asyncio
import os
import shutil
import tempfile
import time

import pytest

from bk import eventloop
from bk.bookie import Bookie
from bk.config import load_config

KEY = bytes(20)
COUNTS = {100: 300_000, 1024: 150_000, 65536: 6_000}
IN_FLIGHT = 10_000


def bench_dir() -> str:
    base = os.environ.get("BK_BENCH_DIR") or os.path.join(os.path.dirname(__file__), "..", ".bench-tmp")
    os.makedirs(base, exist_ok=True)
    return tempfile.mkdtemp(prefix="engine-", dir=base)


def make_entry(ledger_id: int, entry_id: int, size: int, payload: bytes) -> bytes:
    return (ledger_id.to_bytes(8, "big") + entry_id.to_bytes(8, "big") + (entry_id - 1).to_bytes(8, "big", signed=True)
            + size.to_bytes(8, "big") + payload)


async def drive(bookie: Bookie, count: int, size: int, ledgers: int = 4) -> float:
    payload = os.urandom(size)
    entries = [make_entry(i % ledgers, i // ledgers, size, payload) for i in range(count)]
    done = 0
    inflight = 0
    loop = asyncio.get_running_loop()
    finished = loop.create_future()
    room = None  # a future the producer waits on when IN_FLIGHT adds are outstanding
    errors = []

    def cb(ctx, err):
        nonlocal done, inflight
        done += 1
        inflight -= 1
        if err is not None:
            errors.append(err)
        if room is not None and inflight <= IN_FLIGHT // 2 and not room.done():
            room.set_result(None)
        if done == count and not finished.done():
            finished.set_result(None)

    add = bookie.add_entry_cb
    t0 = time.perf_counter()
    for i, e in enumerate(entries):
        add(i % ledgers, i // ledgers, e, KEY, False, cb, None)
        inflight += 1
        if inflight >= IN_FLIGHT:
            room = loop.create_future()
            await room
            room = None
    await finished
    elapsed = time.perf_counter() - t0
    assert not errors, errors[:3]
    return elapsed


def run_engine(size: int, count: int, **overrides) -> float:
    d = bench_dir()
    try:
        cfg = load_config(env={}, overrides={"journal_dirs": [os.path.join(d, "j")], "ledger_dirs": [os.path.join(d, "l")],
                                             "write_cache_max_size_bytes": "256MiB", **overrides})

        async def main():
            b = Bookie(cfg)
            await b.start()
            try:
                return await drive(b, count, size)
            finally:
                await b.stop()
        return eventloop.run(main())
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run_raw(size: int, count: int, group_bytes: int = 512 * 1024) -> float:
    """The physical limit: the same record stream, written + fdatasync'd per group."""
    d = bench_dir()
    try:
        record = os.urandom(size + 32 + 8)
        per_group = max(1, group_bytes // len(record))
        group = record * per_group
        fd = os.open(os.path.join(d, "raw"), os.O_WRONLY | os.O_CREAT, 0o644)
        t0 = time.perf_counter()
        written = 0
        while written < count:
            n = min(per_group, count - written)
            os.write(fd, group if n == per_group else record * n)
            os.fdatasync(fd)
            written += n
        elapsed = time.perf_counter() - t0
        os.close(fd)
        return elapsed
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _measure(benchmark, kind, size, fn, **kwargs):
    """Run 3 rounds; report the median of the timed section (adds only, not setup)."""
    count = COUNTS[size]
    timings = []
    benchmark.pedantic(lambda: timings.append(fn(size, count, **kwargs)), rounds=3, iterations=1)
    elapsed_s = sorted(timings)[len(timings) // 2]
    benchmark.extra_info.update({
        "kind": kind, "entry_bytes": size, "entries": count,
        "entries_per_s": round(count / elapsed_s),
        "mb_per_s": round(count * size / elapsed_s / 1e6, 1),
    })
    print(f"\n{kind:22s} {size:6d} B: {count / elapsed_s:10,.0f} entries/s {count * size / elapsed_s / 1e6:8.1f} MB/s")


@pytest.mark.parametrize("size", sorted(COUNTS))
def test_engine_adds_journal_on(benchmark, size):
    _measure(benchmark, "engine-journal-on", size, run_engine)


@pytest.mark.parametrize("size", sorted(COUNTS))
def test_engine_adds_journal_off(benchmark, size):
    _measure(benchmark, "engine-journal-off", size, run_engine, journal_write_data=False)


@pytest.mark.parametrize("size", sorted(COUNTS))
def test_raw_disk_baseline(benchmark, size):
    _measure(benchmark, "raw-write-fdatasync", size, run_raw)
