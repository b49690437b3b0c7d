"""EntryLogger micro benchmarks: append + flush (fdatasync) and reads by location.

    pytest bench/test_bench_entrylog.py --benchmark-only -q
    BK_NO_NATIVE=1 pytest bench/test_bench_entrylog.py --benchmark-only -q   # pure kernel

Append: each round appends ~64 MiB of entries in batches of ~1 MiB (as a write-cache
flush would, sorted by ledger), then one flush(); extra_info has MB/s and entries/s
of the best round. Reads: entries written beforehand (page cache warm), read one
by one by location, in order or shuffled; extra_info has entries/s.
Set BK_BENCH_DIR to put the files on a particular disk.
"""
import os
import random
import shutil
import tempfile
import time

import pytest

from bk._native import chosen
from bk.config import load_config
from bk.entrylog import EntryLogger

MiB = 1024 * 1024
ROUND_BYTES = 64 * MiB
BATCH_BYTES = 1 * MiB


def bench_dir(prefix: str) -> str:
    base = os.environ.get("BK_BENCH_DIR") or None
    if base:
        os.makedirs(base, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix, dir=base)


def make_entries(count: int, size: int, ledgers: int = 4) -> list[bytes]:
    payload = os.urandom(max(size - 16, 0))
    per = count // ledgers + 1
    return [lid.to_bytes(8, "big") + eid.to_bytes(8, "big") + payload
            for lid in range(ledgers) for eid in range(per)][:count]


@pytest.fixture
def workdir():
    d = bench_dir("bench-entrylog-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("size", [100, 1024, 65536])
def test_append_and_flush(benchmark, workdir, size):
    cfg = load_config(env={}, overrides={"entry_log_size_limit_bytes": "1GiB"})
    count = ROUND_BYTES // size
    entries = make_entries(count, size)
    per_batch = max(1, BATCH_BYTES // size)
    batches = [entries[i:i + per_batch] for i in range(0, count, per_batch)]
    el = EntryLogger([workdir], cfg)
    seconds = []

    def round_():
        t0 = time.perf_counter()
        for b in batches:
            el.add_entries(b)
        el.flush()
        seconds.append(time.perf_counter() - t0)

    benchmark.pedantic(round_, rounds=5, iterations=1, warmup_rounds=1)
    el.close()
    best = min(seconds)
    benchmark.extra_info.update(
        kernel=chosen().get("entrylog"), entry_bytes=size, entries_per_round=count,
        mb_per_s=round(count * size / best / 1e6, 1), entries_per_s=round(count / best))


@pytest.fixture(scope="module")
def filled():
    d = bench_dir("bench-entrylog-read-")
    cfg = load_config(env={}, overrides={"entry_log_size_limit_bytes": "64MiB"})
    el = EntryLogger([d], cfg)
    entries = make_entries(100_000, 1024, ledgers=10)
    locs = []
    for i in range(0, len(entries), 1000):
        locs += el.add_entries(entries[i:i + 1000])
    el.flush()
    ids = [(int.from_bytes(e[:8], "big"), int.from_bytes(e[8:16], "big")) for e in entries]
    yield el, [(lid, eid, loc) for (lid, eid), loc in zip(ids, locs)]
    el.close()
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("order", ["sequential", "random"])
def test_read_entry(benchmark, filled, order):
    el, triples = filled
    sample = triples[:20_000] if order == "sequential" else random.Random(1).sample(triples, 20_000)
    read = el.read_entry

    def round_():
        for lid, eid, loc in sample:
            read(lid, eid, loc)

    benchmark.pedantic(round_, rounds=5, iterations=1, warmup_rounds=1)
    benchmark.extra_info.update(entry_bytes=1024, entries_per_s=round(len(sample) / benchmark.stats.stats.min))


def test_read_run(benchmark, filled):
    el, triples = filled
    starts = [loc for _, _, loc in triples[:20_000:100]]  # 200 runs of up to 100 entries

    def round_():
        n = 0
        for loc in starts:
            n += len(el.read_run(loc, 100, 1 * MiB))
        return n

    n = benchmark.pedantic(round_, rounds=5, iterations=1, warmup_rounds=1)
    benchmark.extra_info.update(entry_bytes=1024, entries_per_s=round(n / benchmark.stats.stats.min))


def test_scan_log(benchmark, filled):
    el, triples = filled
    log_id = el.log_ids()[0]

    def round_():
        return sum(1 for _ in el.scan(log_id))

    n = benchmark.pedantic(round_, rounds=5, iterations=1, warmup_rounds=1)
    benchmark.extra_info.update(kernel=chosen().get("entrylog"), records=n,
                                records_per_s=round(n / benchmark.stats.stats.min))
