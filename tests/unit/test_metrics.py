"""bk.metrics: BookKeeper's names and shapes on the page, histogram buckets, the on/off switch."""
from prometheus_client.parser import text_string_to_metric_families

from bk import metrics


def page() -> dict:
    body, content_type = metrics.exposition()
    assert content_type.startswith("text/plain; version=0.0.4")
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def value(fam, name, **labels):
    return next(s.value for s in fam.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def test_counters_keep_bookkeepers_names_and_histograms_count_per_bucket():
    metrics.set_latency_shape("histogram")
    try:
        histogram_shape()
    finally:
        metrics.set_latency_shape("summary")


def histogram_shape():
    before = page()
    metrics.WRITE_BYTES.inc(1000)
    metrics.ADD_ENTRY_REQUEST.record_many(7, 0.3)      # 7 adds of one batch at 0.3 ms
    metrics.ADD_ENTRY_REQUEST.record_many(2, 40.0, ok=False)
    after = page()
    assert value(after["bookie_WRITE_BYTES"], "bookie_WRITE_BYTES") - \
        value(before["bookie_WRITE_BYTES"], "bookie_WRITE_BYTES") == 1000
    fam, old = after["bookkeeper_server_ADD_ENTRY_REQUEST"], before["bookkeeper_server_ADD_ENTRY_REQUEST"]
    assert fam.type == "histogram"

    def grew(name, **labels):
        return value(fam, name, **labels) - value(old, name, **labels)
    n = "bookkeeper_server_ADD_ENTRY_REQUEST"
    assert grew(n + "_count", success="true") == 7 and grew(n + "_count", success="false") == 2
    assert abs(grew(n + "_sum", success="true") - 2.1) < 1e-9
    assert grew(n + "_bucket", success="true", le="0.25") == 0
    assert grew(n + "_bucket", success="true", le="0.5") == 7
    assert grew(n + "_bucket", success="false", le="25.0") == 0
    assert grew(n + "_bucket", success="false", le="50.0") == 2
    # the alias is the same measurement
    assert value(after["bookkeeper_server_ADD_ENTRY"], n.replace("_REQUEST", "") + "_count", success="true") == \
        value(fam, n + "_count", success="true")


def test_gauges_are_read_at_scrape_time_and_a_broken_one_is_left_out():
    state = {"v": 5}
    metrics.WRITE_CACHE_SIZE.set_function(lambda: state["v"])
    metrics.READ_CACHE_SIZE.set_function(lambda: 1 / 0)
    try:
        assert value(page()["bookie_write_cache_size"], "bookie_write_cache_size") == 5
        state["v"] = 9
        fams = page()
        assert value(fams["bookie_write_cache_size"], "bookie_write_cache_size") == 9
        assert "bookie_read_cache_size" not in fams
    finally:
        metrics.WRITE_CACHE_SIZE.set_function(None)
        metrics.READ_CACHE_SIZE.set_function(None)


def test_disabled_metrics_record_nothing_and_keep_their_values():
    metrics.WRITE_BYTES.inc(3)
    kept = metrics.WRITE_BYTES.value
    count = metrics.JOURNAL_SYNC.ok.count
    metrics.set_enabled(False)
    try:
        assert not metrics.enabled()
        metrics.WRITE_BYTES.inc(100)
        metrics.JOURNAL_SYNC.record_many(1, 2.0)
        metrics.FLUSH_SIZE.record(10)
        assert metrics.WRITE_BYTES.value == kept and metrics.JOURNAL_SYNC.ok.count == count
        assert value(page()["bookie_WRITE_BYTES"], "bookie_WRITE_BYTES") == kept
    finally:
        metrics.set_enabled(True)
    metrics.WRITE_BYTES.inc(1)
    assert metrics.WRITE_BYTES.value == kept + 1


def test_the_grafana_dashboard_and_the_docs_name_only_metrics_that_exist():
    import json
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2]
    known = {m.name for m in metrics.metrics()} | set(metrics._ALIASES) | set(page())
    dash = json.loads((root / "docs/grafana/bk-bookie.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    alerts = re.findall(r"expr: (.+)", (root / "docs/OPERATIONS.md").read_text())
    used = set()
    for expr in exprs + alerts:
        used |= set(re.findall(r"\b((?:bookie|bookkeeper|auditor|replication|election)_\w+)", expr))
    unknown = {n for n in used if n not in known and re.sub(r"_(bucket|count|sum)$", "", n) not in known}
    assert used and not unknown, unknown
