"""The GC analytics on a real Spark standalone cluster whose executors are elsewhere.

A master and one worker from the pip pyspark (bk.testing.spark_cluster): the worker
cannot see the bookies' directories (its own mount namespace covers them, or, where
namespaces are refused, it runs as another user and the dirs are mode 0700) and its
Python has pyspark and pyarrow but no bk: everything of bk the executors run is the
zip the job ships. Three `bk bookie` processes hold four ledgers of 1 KiB entries
(ensemble = write quorum = 3: every bookie holds every entry), two of them deleted.

- `spark-submit spark/gc_job.py --remote --out file:///...`, as docs/ANALYTICS.md says
  to run it: exact live / reclaimable bytes per bookie (each bookie reads its own
  files), the tables written by Spark's Parquet writer;
- `bk analytics gc --ledger-dirs` (dirs the driver sees and the executors do not):
  exit status 1 and an error naming the unreadable logs, the summary and the report
  say so, never a silent total of 0 (--allow-unreadable's count: test_gc_job_outputs.py;
  a third driver here would add a minute for the same summary code).
"""
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from bk import eventloop
from bk.client import BookKeeper
from bk.entrylog.usage import list_entry_logs, read_log_metadata
from bk.testing.cluster import LocalCluster

RECORD_BYTES = 4 + 32 + 4 + 1024  # size field, entry header, CRC32C digest, payload
LEDGERS = 4
ENTRIES = 150
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _required() -> bool:
    return os.environ.get("BK_REQUIRE_ZK") == "1" or bool(os.environ.get("CI"))


@pytest.fixture
def spark_cluster(tmp_path):
    from bk.testing.spark_cluster import SparkClusterError, StandaloneSpark

    data = tmp_path / "cluster"
    data.mkdir()
    cluster = StandaloneSpark(str(tmp_path / "spark"), hidden=[str(data)])
    try:
        cluster.start()
    except SparkClusterError as e:
        cluster.stop()
        if _required():
            pytest.fail(f"the Spark standalone test needs Spark, Java and worker isolation: {e}")
        pytest.skip(str(e))
    print(f"worker isolation: {cluster.isolation}")
    yield cluster
    cluster.stop()


@pytest.fixture
def bookies(zk_server, tmp_path, spark_cluster):
    c = LocalCluster(str(tmp_path / "cluster"), bookies=3, zk_connect=f"{zk_server}/sa-{uuid.uuid4().hex[:8]}",
                     entry_log_size_limit_bytes="256KiB", flush_interval_ms=100, gc_wait_time_ms=3_600_000)
    c.start()
    yield c
    c.stop()


async def write(uri) -> list[int]:
    payload = bytes(range(256)) * 4
    async with BookKeeper(uri) as bkc:
        handles = [await bkc.create_ledger(3, 3, 2, digest_type="CRC32C", password=b"pw") for _ in range(LEDGERS)]
        for _ in range(ENTRIES // 10):
            await asyncio.gather(*(lh.add_entry(payload) for lh in handles for _ in range(10)))
        for lh in handles:
            await lh.close()
        doomed = [lh.ledger_id for lh in handles[:2]]
        for lid in doomed:
            await bkc.delete_ledger(lid)
    return doomed


def _ledger_dirs(cluster) -> list[str]:
    return [os.path.join(cluster.data_dir, f"bookie-{i}", "ledgers") for i in cluster.bookies]


def _on_disk(d: str) -> int:
    return sum(read_log_metadata(p).total_bytes for _, p in list_entry_logs(d))


def _run(cmd, spark_cluster, timeout=600):
    env = spark_cluster.env()
    env["PYSPARK_PYTHON"] = spark_cluster.python  # the executors' Python, as a cluster's operator sets it
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable  # spark-submit's driver: bk's own venv
    env["PYTHONPATH"] = REPO  # the driver's own (a checkout): not the executors'
    conf = spark_cluster.driver_conf()
    if conf:  # a `bk analytics gc` driver takes spark-submit's arguments from here
        env["PYSPARK_SUBMIT_ARGS"] = " ".join(conf + ["pyspark-shell"])
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(spark_cluster.work_dir),
                         timeout=timeout)
    return res


def _said(res) -> str:
    """stdout and the stderr lines that are not Spark's INFO logging."""
    return res.stdout + "\n".join(line for line in res.stderr.splitlines() if " INFO " not in line)[-4000:]


def test_job_on_a_standalone_cluster_without_bk_on_the_executors(spark_cluster, bookies, tmp_path):
    write_started = time.monotonic()
    eventloop.run(write(bookies.metadata_uri))
    per_bookie = LEDGERS * ENTRIES * RECORD_BYTES
    dirs = _ledger_dirs(bookies)
    while any(_on_disk(d) < per_bookie for d in dirs):
        assert time.monotonic() - write_started < 60, "the bookies did not flush what they acknowledged"
        time.sleep(0.2)
    logs_on_disk = sum(len(list_entry_logs(d)) for d in dirs)
    bookie_ids = {b.bookie_id for b in bookies.bookies.values()}

    # 1. --remote through spark-submit, as docs/ANALYTICS.md says: exact figures
    out = tmp_path / "remote"
    out.mkdir()
    out.chmod(0o777)  # executors write the tables; as another user ("other-user" isolation) too
    submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    res = _run([submit, "--master", spark_cluster.master_url, "--conf", "spark.ui.enabled=false",
                *spark_cluster.driver_conf(),
                os.path.join(REPO, "spark", "gc_job.py"), "--metadata-uri", bookies.metadata_uri, "--remote",
                "--out", f"file://{out}", "--json"], spark_cluster)
    assert res.returncode == 0, _said(res) + spark_cluster.logs()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"]["spark_master"] == spark_cluster.master_url
    got = {b["bookie_id"]: b for b in summary["bookies"]}
    assert set(got) == bookie_ids
    for b in got.values():
        assert (b["total_bytes"], b["live_bytes"], b["reclaimable_bytes"]) == \
            (per_bookie, per_bookie // 2, per_bookie // 2), b
    assert summary["unreadable"]["count"] == 0 and summary["error"] is None
    assert list((out / "parquet" / "bookies").glob("run_date=*/part-*.parquet")), "Spark's writer wrote the table"

    # 2. --ledger-dirs the executors cannot see: a clear error, never a silent zero
    out = tmp_path / "dirs"
    out.mkdir()
    out.chmod(0o777)
    cmd = [sys.executable, "-m", "bk.cli.main", "--log-level", "WARNING", "analytics", "gc", "--master",
           spark_cluster.master_url, "--metadata-uri", bookies.metadata_uri, "--ledger-dirs", *dirs,
           "--out", str(out), "--json"]
    res = _run(cmd, spark_cluster)
    assert res.returncode == 1, _said(res)
    assert f"{logs_on_disk} entry log(s) could not be read" in res.stderr, _said(res)
    assert "--allow-unreadable" in res.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["unreadable"]["count"] == logs_on_disk and not summary["unreadable"]["allowed"]
    assert {r["bookie_id"] for r in summary["unreadable"]["logs"]} == bookie_ids
    assert all("FileNotFoundError" in r["error"] or "PermissionError" in r["error"]
               for r in summary["unreadable"]["logs"]), summary["unreadable"]["logs"][:3]
    assert "could not be read" in (out / "report.html").read_text()
    # --allow-unreadable (go on, count them) is the same summary code: test_gc_job_outputs.py
