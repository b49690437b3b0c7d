"""bench.compare against Apache BookKeeper's own bookie (bench/java_bookie.py, bench/compare_reads.py).

A tiny run of `python -m bench.compare --systems java-bookie` as a user runs it: it must start the Java
bookie beside a bk bookie, measure adds on both, make every read row on both, run the Java client's
driver against both, and leave no process and no directory behind. Like every interop test, a missing
Java part FAILS (the bench records why; this test fails on it), never skips. Speed is not asserted.
"""
from __future__ import annotations

import os
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from interop_support import require_java_bk  # noqa: E402

from bench import compare, compare_reads, java_bookie  # noqa: E402


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_compare_java_bookie_tiny_run(tmp_path, monkeypatch):
    require_java_bk()  # a missing folder, script, jar or JRE fails here with the reason
    bench_dir = tmp_path / "bench"
    monkeypatch.setenv("BK_BENCH_DIR", str(bench_dir))
    args = compare.parse_args(["--systems", "java-bookie", "--sizes", "1024", "--runs", "1", "--duration-s", "0.5",
                               "--in-flight", "100", "--warm-up-s", "0.5", "--read-entries", "300",
                               "--java-client-entries", "500", "--no-chart", "--out-dir", str(tmp_path / "out")])
    assert args.systems == ["bk-1", "java-bookie"]  # the bk system it is compared with comes along
    pids = []
    real_start = java_bookie.Fleet.start

    def start(self, log):
        fleet = real_start(self, log)
        pids.extend(fleet.pids("java-bookie").values())
        return fleet
    monkeypatch.setattr(java_bookie.Fleet, "start", start)

    result = compare.run_compare(args, lambda msg: None)

    assert result["failures"] == [] and not result["notes"], (result["failures"], result["notes"])
    rows = {r["system"]: r for r in result["summary"]}
    assert set(rows) == {"bk-1", "java-bookie"}
    assert all(r["entries_per_s"] and r["errors"] == 0 for r in rows.values())
    assert rows["bk-1"]["x_java"] == pytest.approx(rows["bk-1"]["entries_per_s"] / rows["java-bookie"]["entries_per_s"])
    assert "bk÷Java" in compare.render_summary(result["summary"])

    # every read row on both sides: single READs (v2, v3; 8 and 100 in flight) and BATCH_READ (4.17), 3 tiers
    reads = {(r["form"], r["protocol"], r["depth"], r["tier"]): r for r in result["reads_summary"]}
    want = {("single", p, d, t) for p in compare_reads.PROTOCOLS for d in compare_reads.DEPTHS
            for t in compare_reads.TIERS}
    want |= {("batch", "v2", compare_reads.BATCH_RANGES_IN_FLIGHT, t) for t in compare_reads.TIERS}
    assert set(reads) == want
    for key, r in reads.items():
        assert r["bk_reads_per_s"] and r["java_reads_per_s"] and r["bk_over_java"], key
        assert r["bk_errors"] == 0 and r["java_errors"] == 0, key
    assert all(m["entries"] == 300 for m in result["reads"])

    # the Java client's driver against both kinds
    (jc,) = result["java_client_summary"]
    assert jc["bk"]["adds_per_s"] and jc["java"]["adds_per_s"] and jc["bk"]["reads_per_s"] and jc["java"]["reads_per_s"]

    # nothing left behind: the Java bookie stopped, every cluster directory removed
    assert pids and not any(_alive(p) for p in pids)
    assert list(bench_dir.iterdir()) == []


def test_a_missing_java_build_is_said_plainly(tmp_path, monkeypatch):
    """Without ../shared/java-bookkeeper the Java systems fail with the reason (bench.compare records it
    as a failure and exits 1), never run as if nothing were missing."""
    monkeypatch.setattr(java_bookie, "JAVA_BK", tmp_path / "no-such-folder")
    with pytest.raises(java_bookie.JavaMissing, match="no-such-folder.*is missing"):
        java_bookie.require_java()
    with pytest.raises(java_bookie.JavaMissing):
        java_bookie.Fleet("127.0.0.1:1", ["java-bookie"], java_bookie.DEFAULT_RELEASE, {}).start(lambda m: None)
