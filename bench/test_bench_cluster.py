"""Throughput of a real bookie process, end to end: client -> TCP -> bookie -> journal fsync.

    python -m pytest bench/test_bench_cluster.py --benchmark-only -q

A LocalCluster (real ZooKeeper, one `bk bookie` process, journal on, bench
cache sizes) serves every round; each round creates a ledger with E=WQ=AQ=1
and adds COUNT entries of 1 KiB with IN_FLIGHT outstanding (bench.load). The
benchmark's time per round is COUNT acknowledged adds plus the client's set-up
(metadata session, ledger create and close: ~0.1-0.3 s); extra_info carries
the last round's entries/s, MB/s and add latency p50/p99 (ms), which count only
the add window, and the bookie's peak RSS. Skipped without Java or ZooKeeper.
"""
from __future__ import annotations

import pytest

from bench.load import LoadSpec, bookie_pids, local_cluster, run_load
from bench.procmem import RssSampler

COUNT = 30_000  # ~1-3 s per round at the rates this machine shows
ENTRY_SIZE = 1024
IN_FLIGHT = 1000


@pytest.fixture(scope="module")
def one_bookie():
    from bk.testing.zookeeper import ZooKeeperLaunchError, default_classpath, find_java
    try:
        find_java()
        default_classpath()
    except ZooKeeperLaunchError as e:
        pytest.skip(f"no local ZooKeeper: {e}")
    with local_cluster(1, prefix="bench-cluster") as cluster:
        yield cluster


def test_add_throughput_one_bookie(benchmark, one_bookie):
    spec = LoadSpec(duration_s=None, count=COUNT, entry_size=ENTRY_SIZE, in_flight=IN_FLIGHT)
    summaries = []

    def one_round():
        summaries.append(run_load(one_bookie.metadata_uri, spec))

    with RssSampler(bookie_pids(one_bookie)) as rss:
        benchmark.pedantic(one_round, rounds=3, iterations=1, warmup_rounds=0)
    adds = summaries[-1]["adds"]
    assert all(s["adds"]["errors"] == 0 and s["adds"]["entries"] == COUNT for s in summaries), \
        [s["adds"]["error"] for s in summaries]
    benchmark.extra_info.update({
        "entries_per_s": round(adds["entries_per_s"]), "mb_per_s": round(adds["mb_per_s"], 2),
        "p50_ms": round(adds["latency_ms"]["p50"], 2), "p99_ms": round(adds["latency_ms"]["p99"], 2),
        "entry_size": ENTRY_SIZE, "in_flight": IN_FLIGHT, "bookie_peak_rss_mib": round(rss.peak_mib()["bookie-0"] or 0),
    })
