"""A live bookie's /metrics passes `promtool check metrics` (Debian's prometheus package,
installed by scripts/setup) but for the findings BookKeeper's own names cause, and carries
BookKeeper's shapes: OpStats as summaries with its quantile labels, the bookie_gc_* metrics
after a GC pass (issue 30)."""
from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bk import eventloop
from bk.client import BookKeeper
from bk.testing.cluster import LocalCluster

pytestmark = pytest.mark.integration

# findings promtool's linter reports for names BookKeeper defines (kept for its dashboards)
BOOKKEEPER_NAMES = {
    "bookie_ledgers_count": "DbLedgerStorage's gauge: promtool wants _count for summaries and histograms only",
}
GC_NAMES = ("bookie_gc_ACTIVE_ENTRY_LOG_COUNT", "bookie_gc_ACTIVE_ENTRY_LOG_SPACE_BYTES", "bookie_gc_ACTIVE_LEDGER_COUNT",
            "bookie_gc_DELETED_LEDGER_COUNT", "bookie_gc_RECLAIMED_COMPACTION_SPACE_BYTES",
            "bookie_gc_RECLAIMED_DELETION_SPACE_BYTES", "bookie_gc_MINOR_COMPACTION_COUNT",
            "bookie_gc_MAJOR_COMPACTION_COUNT", "bookie_gc_THREAD_RUNTIME")


def test_live_metrics_pass_promtool_and_have_bookkeepers_shapes(zk_server, tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:  # never a skip: CI must run this check
        pytest.fail("promtool is missing: scripts/setup installs Debian's prometheus package")
    c = LocalCluster(str(tmp_path), bookies=1, zk_connect=f"{zk_server}/prom-{uuid.uuid4().hex[:8]}",
                     http_server_mutations_enabled=True)
    c.start()
    try:
        async def write():
            async with BookKeeper(c.metadata_uri) as bkc:
                lh = await bkc.create_ledger(1, 1, 1, password=b"pw")
                for i in range(50):
                    await lh.add_entry(b"x" * 100)
                await lh.close()
        eventloop.run(write())
        base = c.bookies[0].http_url
        req = urllib.request.Request(base + "/api/v1/bookie/gc", data=b"{}", method="PUT")
        with urllib.request.urlopen(req, timeout=60) as resp:  # answers at once; the pass runs on
            assert json.loads(resp.read()).startswith("Triggered GC")
        deadline = time.monotonic() + 60
        while True:  # until the pass ends: its figures are the GC metrics checked below
            with urllib.request.urlopen(base + "/api/v1/bookie/gc", timeout=30) as resp:
                if json.loads(resp.read()) == {"is_in_force_gc": "false"}:
                    break
            assert time.monotonic() < deadline, "the triggered GC pass did not end"
            time.sleep(0.1)
        with urllib.request.urlopen(base + "/metrics", timeout=30) as resp:
            text = resp.read().decode()
    finally:
        c.stop()
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    findings = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    unexpected = [f for f in findings if f.split()[0] not in BOOKKEEPER_NAMES]
    assert not unexpected, unexpected
    assert proc.returncode in (0, 3), (proc.returncode, findings)  # 3: lint findings only, all expected

    fams = {f.name: f for f in text_string_to_metric_families(text)}
    add = fams["bookkeeper_server_ADD_ENTRY_REQUEST"]
    assert add.type == "summary"
    quantiles = {s.labels["quantile"]: s.value for s in add.samples
                 if s.name == add.name and s.labels.get("success") == "true"}
    assert sorted(quantiles, key=float) == ["0.5", "0.75", "0.95", "0.99", "0.999", "0.9999", "1.0"]
    assert 0 < quantiles["0.5"] <= quantiles["0.99"] <= quantiles["1.0"]
    for name in GC_NAMES:
        assert name in fams, name
    runtime = next(s.value for s in fams["bookie_gc_THREAD_RUNTIME"].samples
                   if s.name == "bookie_gc_THREAD_RUNTIME_count" and s.labels.get("success") == "true")
    assert runtime >= 1
