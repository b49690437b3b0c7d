"""The job's outputs on a local session (no bookie, no ZooKeeper): an entry log that cannot
be read is an error the summary, the report and the exit status show (or, with
--allow-unreadable, a counted gap); --out takes a Hadoop URI (file:///...) and the
Parquet tables go through Spark's writer; partitions follow the default parallelism.

The bookie dir is written byte by byte by tests/spark/test_sources.py's helpers: one
closed log of ledger 10 and one "log" the executors cannot read (a directory named
like a log: open() fails with IsADirectoryError, as any unreadable file would).
The metadata store is an empty in-memory tree, so every byte reads as deleted.
"""
import argparse
import json
import os

import pytest

from bk.meta.cookie import Cookie, write_directory_cookie

from test_sources import OVERHEAD, entry, write_log

BOOKIE = "127.0.0.7:3181"
LOG1_BYTES = 5 * (OVERHEAD + 100)


@pytest.fixture
def bookie_dir(tmp_path):
    d = str(tmp_path / "bookie" / "ledgers")
    write_directory_cookie(d, Cookie(BOOKIE, ("/j",), (d,)))
    cur = os.path.join(d, "current")
    write_log(os.path.join(cur, "1.log"), 1, [entry(10, e, b"a" * 100) for e in range(5)], {10: LOG1_BYTES})
    os.makedirs(os.path.join(cur, "2.log"))
    return d


def job_args(out, dirs, **kw):
    base = dict(metadata_uri="mem://outputs-test/ledgers", ledger_dirs=dirs, remote=False, urls=None, out=out,
                master=None, threshold=None, scan=False, token="", driver_memory="512m", json=False,
                logs_per_partition=0, allow_unreadable=False)
    base.update(kw)
    return argparse.Namespace(**base)


def test_unreadable_log_fails_the_run_and_says_so(spark, bookie_dir, tmp_path, capsys):
    from spark.gc_job import UnreadableLogs, execute, run

    out = str(tmp_path / "out")
    with pytest.raises(UnreadableLogs, match=r"1 entry log\(s\) could not be read") as err:
        run(job_args(out, [bookie_dir]))
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary == err.value.summary or summary["unreadable"] == err.value.summary["unreadable"]
    u = summary["unreadable"]
    assert u["count"] == 1 and not u["allowed"] and summary["totals"]["unreadable_logs"] == 1
    assert [(r["bookie_id"], r["log_id"]) for r in u["logs"]] == [(BOOKIE, 2)]
    assert "IsADirectoryError" in u["logs"][0]["error"] and summary["error"]
    assert summary["totals"]["total_bytes"] == LOG1_BYTES, "the readable log still counts"
    page = open(os.path.join(out, "report.html")).read()
    assert "1 entry log(s) could not be read" in page and "FAILED" in page
    assert not os.path.exists(os.path.join(out, "parquet")), "a run with a gap appends no trend rows"

    capsys.readouterr()
    assert execute(job_args(out, [bookie_dir])) == 1
    printed = capsys.readouterr()
    assert "UNREADABLE: 1 entry log(s)" in printed.out and "ERROR" in printed.out
    assert "could not be read" in printed.err and "--allow-unreadable" in printed.err


def test_allow_unreadable_counts_them_and_uri_out(spark, bookie_dir, tmp_path, capsys):
    from spark.gc_job import execute, run

    out_dir = tmp_path / "uri-out"
    out = "file://" + str(out_dir)
    summary = run(job_args(out, [bookie_dir], allow_unreadable=True))
    assert summary["unreadable"]["count"] == 1 and summary["unreadable"]["allowed"] and summary["error"] is None
    assert summary["totals"]["total_bytes"] == LOG1_BYTES == summary["totals"]["reclaimable_bytes"]
    written = json.load(open(out_dir / "summary.json"))
    assert written["unreadable"]["logs"][0]["log_id"] == 2
    for name in ("report.html", "usage_histogram.png", "what_if.png", "reclaimable_per_bookie.png"):
        assert (out_dir / name).stat().st_size > 0, name
    assert "accepted by --allow-unreadable" in (out_dir / "report.html").read_text()
    # Spark's writer: part files under run_date=, one row per log
    logs = spark.read.parquet(out + "/parquet/entry_logs")
    assert sorted((r["log_id"], r["source"]) for r in logs.collect()) == [(1, "map"), (2, "error")]
    parts = list((out_dir / "parquet" / "entry_logs").glob("run_date=*/part-*.parquet"))
    assert parts, "written by Spark's Parquet writer"

    capsys.readouterr()
    assert execute(job_args(out, [bookie_dir], allow_unreadable=True, json=True)) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["unreadable"]["count"] == 1 and printed["error"] is None
    assert printed["summary"] == out + "/summary.json"
    assert spark.read.parquet(out + "/parquet/bookies").select("run_id").distinct().count() == 2


def test_partitions_follow_default_parallelism(spark, tmp_path):
    """Ten logs on local[2]: two tasks (the default parallelism), not four per core."""
    from spark.gc_job import _log_reader

    d = str(tmp_path / "many" / "ledgers")
    write_directory_cookie(d, Cookie(BOOKIE, ("/j",), (d,)))
    for i in range(1, 11):
        write_log(os.path.join(d, "current", f"{i:x}.log"), i, [entry(i, 0, b"x")], {i: OVERHEAD + 1})
    df = _log_reader(spark, job_args(str(tmp_path / "o"), [d])).load()
    assert spark.sparkContext.defaultParallelism == 2
    assert df.rdd.getNumPartitions() == 2
    assert df.count() == 10
