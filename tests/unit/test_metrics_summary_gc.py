"""BookKeeper's Prometheus shapes (issue 30): OpStats as summaries with its quantile
labels, quantiles within 1% of a recorded value at that rank, windows that age out;
the GC metrics (GarbageCollectorStats names) fed by a real GC pass."""
import asyncio
import math

from prometheus_client.parser import text_string_to_metric_families

from bk import metrics
from bk.bookie import Bookie
from bk import eventloop
from bk.testing.engine_host import engine_config, expected_entry, ledger_key
from bk.testing.gc_host import DeletePolicy

BK_QUANTILES = ["0.5", "0.75", "0.95", "0.99", "0.999", "0.9999", "1.0"]


def page() -> dict:
    body, _ = metrics.exposition()
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def samples(fam, name, **labels):
    return {s.labels.get("quantile"): s.value for s in fam.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())}


def test_opstats_are_summaries_with_bookkeepers_quantiles_within_one_percent():
    assert metrics.latency_shape() == "summary"  # BookKeeper's shape is the default
    stat = metrics.REREPLICATE
    stat.ok, stat.failed = metrics._Sketch(), metrics._Sketch()  # a fresh window for this test
    values = [0.01 * i for i in range(1, 10_001)]  # 0.01 .. 100 ms, uniform
    for v in values[::-1]:
        stat.success(v)
    stat.record_many(5, 250.0, ok=False)
    fam = page()["replication_worker_rereplicate"]
    assert fam.type == "summary"
    got = samples(fam, "replication_worker_rereplicate", success="true")
    assert sorted(got, key=float) == BK_QUANTILES
    for q in BK_QUANTILES:
        exact = values[max(1, math.ceil(float(q) * len(values))) - 1]
        assert abs(got[q] - exact) <= 0.01 * exact, (q, got[q], exact)
    failed = samples(fam, "replication_worker_rereplicate", success="false")
    assert all(abs(v - 250.0) <= 2.5 for v in failed.values())
    count = samples(fam, "replication_worker_rereplicate_count", success="true")[None]
    total = samples(fam, "replication_worker_rereplicate_sum", success="true")[None]
    assert count == len(values) and abs(total - sum(values)) < 1e-6


def test_quantiles_cover_two_windows_then_age_out_while_count_and_sum_stay():
    s = metrics._Sketch()
    s.add(3, 10.0)
    t0 = s.started
    assert dict(s.quantiles(now=t0 + 1))["0.5"] > 0
    s.quantiles(now=t0 + metrics.ROLLOVER_S)  # the window turns: still in the previous one
    assert abs(dict(s.quantiles(now=t0 + metrics.ROLLOVER_S + 1))["0.99"] - 10.0) <= 0.1
    assert all(math.isnan(v) for _, v in s.quantiles(now=t0 + 2 * metrics.ROLLOVER_S + 1))
    assert s.count == 3 and s.total == 30.0
    s.add(1, 0.0)  # a zero is a value too
    assert dict(s.quantiles(now=t0 + 2 * metrics.ROLLOVER_S + 2))["1.0"] == 0.0


def test_histogram_shape_on_request_and_bad_shape_refused():
    metrics.set_latency_shape("histogram")
    try:
        metrics.FLUSH.success(3.0)
        fam = page()["bookie_flush"]
        assert fam.type == "histogram"
        assert any(s.name == "bookie_flush_bucket" for s in fam.samples)
    finally:
        metrics.set_latency_shape("summary")
    try:
        metrics.set_latency_shape("quantiles")
    except ValueError as e:
        assert "summary" in str(e)
    else:
        raise AssertionError("a bad shape was taken")


async def fill(b, ledgers, count):
    """Entries of 1,000 B to the ledgers in turn, a checkpoint every 10 rounds: small logs (64 KiB)."""
    for eid in range(count):
        for lid in ledgers:
            await b.add_entry(lid, eid, expected_entry(1, lid, eid, 1000), ledger_key(1, lid))
        if eid % 10 == 9:
            await b.checkpoint()
    await b.checkpoint()


def test_a_gc_pass_feeds_bookkeepers_gc_metrics(tmp_path):
    cfg = engine_config(str(tmp_path / "d"), entry_log_size_limit_bytes="64KiB", flush_interval_ms=100,
                        gc_wait_time_ms=3_600_000)
    names = ("DELETED_LEDGER_COUNT", "MAJOR_COMPACTION_COUNT", "MINOR_COMPACTION_COUNT",
             "RECLAIMED_DELETION_SPACE_BYTES", "RECLAIMED_COMPACTION_SPACE_BYTES")
    before = {n: metrics.get("bookie_gc_" + n).value for n in names}
    runs = metrics.GC_THREAD_RUNTIME.ok.count

    async def main():
        async with Bookie(cfg) as b:
            await fill(b, [5], 150)
            await fill(b, [1, 2, 3], 150)
            await fill(b, [4], 10)
            await fill(b, [6], 150)  # full logs of live entries: GC keeps and tracks them
            b.gc.policy = DeletePolicy([2, 5])
            out = await asyncio.to_thread(b.gc.trigger)
            assert out["ok"] and out["logs_deleted"] and out["logs_compacted"], out
            on_disk = sum(b.storage.entry_logger.log_file_bytes(i) for i in b.storage.entry_logger.log_ids())
            return out, b.gc.status(), on_disk

    out, status, on_disk = eventloop.run(main())
    grew = {n: metrics.get("bookie_gc_" + n).value - before[n] for n in names}
    assert grew["DELETED_LEDGER_COUNT"] == 2 and grew["MAJOR_COMPACTION_COUNT"] == 1
    assert grew["MINOR_COMPACTION_COUNT"] == 0
    assert grew["RECLAIMED_DELETION_SPACE_BYTES"] > 0 and grew["RECLAIMED_COMPACTION_SPACE_BYTES"] > 0
    assert grew["RECLAIMED_DELETION_SPACE_BYTES"] + grew["RECLAIMED_COMPACTION_SPACE_BYTES"] == out["bytes_freed"]
    assert metrics.GC_THREAD_RUNTIME.ok.count == runs + 1
    fams = page()
    assert fams["bookie_gc_ACTIVE_ENTRY_LOG_COUNT"].samples[0].value == status["entry_logs"] > 0
    assert 0 < fams["bookie_gc_ACTIVE_ENTRY_LOG_SPACE_BYTES"].samples[0].value <= on_disk
    assert "bookie_gc_THREAD_RUNTIME" in fams  # ACTIVE_LEDGER_COUNT needs a server: tests/integration


def test_the_dashboard_plots_what_its_titles_say_and_reads_both_shapes():
    import json
    import pathlib

    dash = json.loads((pathlib.Path(__file__).resolve().parents[2] / "docs/grafana/bk-bookie.json").read_text())
    for panel in dash["panels"]:
        title, exprs = panel["title"].lower(), " ".join(t["expr"] for t in panel["targets"])
        if "journal queue" in title:
            assert "JOURNAL_QUEUE_SIZE" in exprs, panel["title"]
        if "read_cache" in exprs:
            assert "read cache" in title, panel["title"]
        for t in panel["targets"]:  # a quantile reads the summary (default) or else the histogram
            if "histogram_quantile" in t["expr"]:
                assert 'quantile="' in t["expr"].split(" or ")[0], t["expr"]
    gc_exprs = " ".join(t["expr"] for p in dash["panels"] if p["title"].startswith("GC") for t in p["targets"])
    for name in ("RECLAIMED_DELETION_SPACE_BYTES", "RECLAIMED_COMPACTION_SPACE_BYTES", "ACTIVE_ENTRY_LOG_COUNT",
                 "ACTIVE_ENTRY_LOG_SPACE_BYTES", "THREAD_RUNTIME", "MAJOR_COMPACTION_COUNT", "DELETED_LEDGER_COUNT"):
        assert "bookie_gc_" + name in gc_exprs, name
