"""Index (LMDB) micro benchmarks: put_locations batches and lookups.

    pytest bench/test_bench_index.py --benchmark-only -q

put: one write() (= one LMDB txn, fsynced at commit with index_sync = true) of
10,000 locations per round: sorted beyond the last key (the flush thread's case,
MDB_APPEND) or shuffled. get: 20,000 random get_location calls on a 1M-entry
index, and last_entry_id. extra_info has locations/s or lookups/s.
Set BK_BENCH_DIR to put the files on a particular disk.
"""
import os
import random
import shutil
import tempfile

import pytest

from bk.config import load_config
from bk.index import Index

BATCH = 10_000


def bench_dir(prefix: str) -> str:
    base = os.environ.get("BK_BENCH_DIR") or None
    if base:
        os.makedirs(base, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix, dir=base)


@pytest.fixture
def index_dir():
    d = bench_dir("bench-index-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "nosync"])
@pytest.mark.parametrize("order", ["sorted", "shuffled"])
def test_put_locations(benchmark, index_dir, order, sync):
    idx = Index(index_dir, load_config(env={}, overrides={"index_map_size_bytes": "1GiB", "index_sync": sync}))
    state = {"ledger": 0}
    rng = random.Random(5)

    def setup():
        state["ledger"] += 1
        lid = state["ledger"]
        triples = [(lid, e, (lid << 32) | (1024 + 100 * e)) for e in range(BATCH)]
        if order == "shuffled":
            rng.shuffle(triples)
        return (triples,), {}

    def round_(triples):
        with idx.write() as w:
            w.put_locations(triples)

    benchmark.pedantic(round_, setup=setup, rounds=20, iterations=1, warmup_rounds=1)
    assert idx.last_entry_id(state["ledger"]) == BATCH - 1
    idx.close()
    benchmark.extra_info.update(batch=BATCH, index_sync=sync,
                                locations_per_s=round(BATCH / benchmark.stats.stats.min))


@pytest.fixture(scope="module")
def big_index():
    d = bench_dir("bench-index-get-")
    idx = Index(d, load_config(env={}, overrides={"index_map_size_bytes": "1GiB", "index_sync": False}))
    for lid in range(100):
        with idx.write() as w:
            w.put_locations([(lid, e, (lid << 32) | e) for e in range(BATCH)])
    yield idx
    idx.close()
    shutil.rmtree(d, ignore_errors=True)


def test_get_location_random(benchmark, big_index):
    rng = random.Random(9)
    keys = [(rng.randrange(100), rng.randrange(BATCH)) for _ in range(20_000)]
    get = big_index.get_location

    def round_():
        for lid, eid in keys:
            get(lid, eid)

    benchmark.pedantic(round_, rounds=5, iterations=1, warmup_rounds=1)
    benchmark.extra_info.update(index_entries=100 * BATCH, lookups_per_s=round(len(keys) / benchmark.stats.stats.min))


def test_last_entry_id(benchmark, big_index):
    lids = list(range(100)) * 100

    def round_():
        for lid in lids:
            big_index.last_entry_id(lid)

    benchmark.pedantic(round_, rounds=5, iterations=1, warmup_rounds=1)
    benchmark.extra_info.update(lookups_per_s=round(len(lids) / benchmark.stats.stats.min))
