"""The whole storage engine (Bookie facade: write cache + journal with group
fsync + checkpoints into entry logs and the index), journal on, fsync per group,
compared in the same run with the raw disk writing the same bytes.

    pytest bench/test_bench_engine.py --benchmark-only -q

Each round adds `count` entries with up to 10,000 in flight and waits for every
acknowledgement; extra_info carries entries/s, MB/s and the process CPU time
per entry (all threads). The raw baseline writes the same journal-sized byte
stream with os.write + os.fdatasync per group of the same size the journal
forms (512 KiB), on the same disk. The raw double-write baseline is the
physical expectation for the engine's design: that journal stream and, at the
same time, the same payload again as entry-log writes (8 MiB writes, fsync per
128 MiB write-cache half); it is done when both streams are.
"""
import asyncio
import os
import shutil
import tempfile
import threading
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


async def drive(bookie: Bookie, count: int, size: int, ledgers: int = 4) -> tuple[float, float]:
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
    cpu0 = _cpu_s()
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
    cpu_s = _cpu_s() - cpu0
    assert not errors, errors[:3]
    return elapsed, cpu_s


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def run_engine(size: int, count: int, **overrides) -> tuple[float, float]:
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


def _journal_stream(path: str, size: int, count: int, group_bytes: int) -> None:
    """`count` records of `size` + 40 bytes (entry header + journal framing), written
    and fdatasync'd per group of group_bytes, as the journal does."""
    record = os.urandom(size + 32 + 8)
    per_group = max(1, group_bytes // len(record))
    group = record * per_group
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        written = 0
        while written < count:
            n = min(per_group, count - written)
            os.write(fd, group if n == per_group else record * n)
            os.fdatasync(fd)
            written += n
    finally:
        os.close(fd)


def _entry_log_stream(path: str, total_bytes: int, write_bytes: int = 8 << 20, sync_bytes: int = 128 << 20) -> None:
    """total_bytes in write_bytes writes, fsync'd every sync_bytes and at the end, as
    checkpoints of a 256 MiB write cache (two 128 MiB halves) write the entry log."""
    buf = os.urandom(write_bytes)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        written = since_sync = 0
        while written < total_bytes:
            n = os.write(fd, buf[:min(write_bytes, total_bytes - written)])
            written += n
            since_sync += n
            if since_sync >= sync_bytes:
                os.fsync(fd)
                since_sync = 0
        os.fsync(fd)
    finally:
        os.close(fd)


def run_raw(size: int, count: int, group_bytes: int = 512 * 1024) -> tuple[float, float]:
    """The physical limit of the journal alone: the same record stream, written +
    fdatasync'd per group."""
    d = bench_dir()
    try:
        cpu0 = _cpu_s()
        t0 = time.perf_counter()
        _journal_stream(os.path.join(d, "raw"), size, count, group_bytes)
        return time.perf_counter() - t0, _cpu_s() - cpu0
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run_raw_double(size: int, count: int, group_bytes: int = 512 * 1024) -> tuple[float, float]:
    """The physical limit of the engine's design: the journal stream and, beside it,
    the same payload written once more as the entry log is (each entry is written
    twice on this one disk). Done when both streams are."""
    d = bench_dir()
    try:
        threads = [threading.Thread(target=_journal_stream, args=(os.path.join(d, "journal"), size, count, group_bytes)),
                   threading.Thread(target=_entry_log_stream, args=(os.path.join(d, "entrylog"), count * (size + 36)))]
        cpu0 = _cpu_s()
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - t0, _cpu_s() - cpu0
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _measure(benchmark, kind, size, fn, **kwargs):
    """Run 3 rounds; report the median of the timed section (adds only, not setup)."""
    count = COUNTS[size]
    timings = []
    benchmark.pedantic(lambda: timings.append(fn(size, count, **kwargs)), rounds=3, iterations=1)
    elapsed_s, cpu_s = sorted(timings)[len(timings) // 2]
    benchmark.extra_info.update({
        "kind": kind, "entry_bytes": size, "entries": count,
        "entries_per_s": round(count / elapsed_s),
        "mb_per_s": round(count * size / elapsed_s / 1e6, 1),
        "cpu_us_per_entry": round(cpu_s / count * 1e6, 2),
    })
    print(f"\n{kind:22s} {size:6d} B: {count / elapsed_s:10,.0f} entries/s {count * size / elapsed_s / 1e6:8.1f} MB/s"
          f" {cpu_s / count * 1e6:8.2f} us CPU/entry")


@pytest.mark.parametrize("size", sorted(COUNTS))
def test_engine_adds_journal_on(benchmark, size):
    _measure(benchmark, "engine-journal-on", size, run_engine)


@pytest.mark.parametrize("size", sorted(COUNTS))
def test_engine_adds_journal_off(benchmark, size):
    _measure(benchmark, "engine-journal-off", size, run_engine, journal_write_data=False)


@pytest.mark.parametrize("size", sorted(COUNTS))
def test_raw_disk_baseline(benchmark, size):
    _measure(benchmark, "raw-write-fdatasync", size, run_raw)


@pytest.mark.parametrize("size", sorted(COUNTS))
def test_raw_disk_double_write_baseline(benchmark, size):
    _measure(benchmark, "raw-double-write", size, run_raw_double)
