"""Journal append throughput (group fsync) against the raw disk, same bytes, same groups.

    python3 -m pytest bench/test_bench_journal.py --benchmark-only -q

test_journal_append[size]: each round, a producer on a uvloop loop calls
Journal.log() for `count` entries (at most IN_FLIGHT unacknowledged, like many
clients) and waits for every completion; journal on, fdatasync per group,
default grouping settings. extra_info: entries/s, MB/s (payload), groups and
the average group size.

test_raw_baseline[size]: the same byte volume (payload + 8 bytes of framing per
entry) written with os.write + os.fdatasync in groups of the size the journal
formed in its run (the threshold if the journal test did not run), to a file
on the same disk. extra_info adds journal_vs_raw = journal entries/s / raw entries/s.
"""
from __future__ import annotations

import asyncio
import os
import struct

import pytest
import uvloop

from bk._native import chosen
from bk.config import load_config
from bk.journal import Journal

COUNTS = {100: 200_000, 1024: 100_000, 65536: 3_000}
IN_FLIGHT = 10_000
ROUNDS = 3
FRAMING_BYTES = 8

# size -> measured journal figures, for the raw baseline's group size and ratio
_journal_runs: dict[int, dict] = {}


async def _produce(journal: Journal, body: bytes, count: int) -> None:
    """Log `count` records, never more than IN_FLIGHT unacknowledged; wait for all."""
    loop = asyncio.get_running_loop()
    state = {"done": 0, "waiter": None, "wake_at": 0}
    finished = loop.create_future()

    def on_durable(ctx, exc):
        if exc is not None:
            raise exc
        state["done"] = done = state["done"] + 1
        waiter = state["waiter"]
        if waiter is not None and done >= state["wake_at"]:
            state["waiter"] = None
            waiter.set_result(None)
        if done == count:
            finished.set_result(None)

    log = journal.log
    for i in range(count):
        log(body, on_durable, i)
        if i + 1 - state["done"] >= IN_FLIGHT:
            state["wake_at"] = i + 1 - IN_FLIGHT // 2
            state["waiter"] = loop.create_future()
            await state["waiter"]
    await finished


def _body(size: int) -> bytes:
    return struct.pack(">qq", 1, 0) + b"e" * max(0, size - 16)


@pytest.mark.benchmark(group="journal-append")
def test_journal_append(benchmark, bench_tmp_dir, entry_size):
    count = COUNTS[entry_size]
    cfg = load_config(env={})
    loop = uvloop.new_event_loop()
    journal = Journal(bench_tmp_dir, cfg, loop=loop)
    journal.start()
    body = _body(entry_size)
    try:
        benchmark.pedantic(lambda: loop.run_until_complete(_produce(journal, body, count)),
                           rounds=ROUNDS, iterations=1)
    finally:
        journal.stop()
        loop.close()
    mean_s = benchmark.stats.stats.mean
    run = {
        "entries_per_s": round(count / mean_s),
        "mb_per_s": round(count * entry_size / mean_s / 1e6, 1),
        "groups": journal.groups_written,
        "avg_group_bytes": journal.bytes_written // max(1, journal.groups_written),
        "avg_group_entries": round(journal.records_written / max(1, journal.groups_written), 1),
        "kernel": chosen().get("journal", "?"),
    }
    _journal_runs[entry_size] = run
    benchmark.extra_info.update(run)
    assert journal.records_written == count * ROUNDS


@pytest.mark.benchmark(group="journal-append")
def test_raw_baseline(benchmark, bench_tmp_dir, entry_size):
    count = COUNTS[entry_size]
    total_bytes = count * (entry_size + FRAMING_BYTES)
    journal_run = _journal_runs.get(entry_size)
    group_bytes = journal_run["avg_group_bytes"] if journal_run else \
        load_config(env={}).journal_buffered_writes_threshold_bytes
    group_bytes = max(1, min(group_bytes, total_bytes))
    chunk = b"r" * group_bytes
    path = os.path.join(bench_tmp_dir, "raw.dat")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)

    def setup():
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)

    def write_all():
        left = total_bytes
        while left > 0:
            n = group_bytes if left >= group_bytes else left
            view = memoryview(chunk)[:n]
            while view:
                view = view[os.write(fd, view):]
            os.fdatasync(fd)
            left -= n

    try:
        benchmark.pedantic(write_all, setup=setup, rounds=ROUNDS, iterations=1)
    finally:
        os.close(fd)
    mean_s = benchmark.stats.stats.mean
    raw_rate = count / mean_s
    info = {
        "entries_per_s": round(raw_rate),
        "mb_per_s": round(count * entry_size / mean_s / 1e6, 1),
        "group_bytes": group_bytes,
        "groups": -(-total_bytes // group_bytes),
    }
    if journal_run:
        info["journal_vs_raw"] = round(journal_run["entries_per_s"] / raw_rate, 3)
    benchmark.extra_info.update(info)
