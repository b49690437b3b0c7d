"""`bk autorecovery` exports /metrics and logs as `bk bookie` does (issue 30; docs/OPERATIONS.md):
a real process next to a bookie without its own AutoRecovery."""
from __future__ import annotations

import json
import signal
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from test_autorecovery_support import autorecovery_process, make_cluster


def test_autorecovery_process_serves_metrics_and_logs_to_its_own_file(zk_server, tmp_path):
    cluster = make_cluster(zk_server, tmp_path / "c", bookies=1, autorecovery=False)
    log_file = tmp_path / "logs" / "bookie.log"
    log_file.parent.mkdir()
    with cluster:
        bookie = cluster.bookies[0]
        settings = ("autorecovery_metrics_port=0", f"log_file={log_file}", "log_format=json",
                    "log_level=WARNING,bk.autorecovery=INFO")
        with autorecovery_process(bookie, *(a for kv in settings for a in ("--set", kv))) as (proc, line):
            url = line.rsplit(" metrics ", 1)[1].strip()
            assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics"), line
            deadline = time.monotonic() + 30
            while True:  # this process is elected auditor (nobody else votes): its counter moves
                with urllib.request.urlopen(url, timeout=10) as resp:
                    assert resp.status == 200
                    text = resp.read().decode()
                fams = {f.name: f for f in text_string_to_metric_families(text)}
                won = sum(s.value for s in fams["election_attempts"].samples)
                if won >= 1:
                    break
                assert time.monotonic() < deadline, text
                time.sleep(0.2)
            for name in ("auditor_NUM_UNDER_REPLICATED_LEDGERS", "auditor_NUM_LEDGERS_MARKED",
                         "replication_worker_rereplicate", "replication_worker_NUM_BYTES_WRITTEN"):
                assert name in fams, (name, sorted(fams))
            assert fams["replication_worker_rereplicate"].type == "summary"  # prometheus_latency_shape
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
    # the log settings: its own file beside the bookie's (two processes never rotate one file),
    # in log_format json, at log_level (the election's INFO line is below it, autorecovery's is not)
    own = log_file.parent / "bookie-autorecovery.log"
    assert own.exists() and not log_file.exists(), list(log_file.parent.iterdir())
    records = [json.loads(line) for line in own.read_text().splitlines() if line.strip()]
    assert records and all(r["logger"] == "bk.autorecovery" or r["level"] in ("WARNING", "ERROR", "CRITICAL")
                           for r in records), records
    assert any(r["message"].startswith("stopping autorecovery") for r in records), records
    assert all(r["bookie_id"] == bookie.bookie_id for r in records), records
