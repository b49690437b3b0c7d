"""The GC analytics job: `bk analytics gc`, or the same through spark-submit:

    spark-submit --master spark://host:7077 spark/gc_job.py --metadata-uri zk://zk:2181/ledgers \\
        --remote --out /reports/gc
    bk analytics gc --metadata-uri zk://127.0.0.1:2181/ledgers --ledger-dirs '/data/*/ledgers' --out /tmp/gc

Reads the bookies' entry logs (ledgers maps, or a full scan with --scan) and every
ledger's metadata, and writes to --out: summary.json, report.html, three PNG charts,
and Parquet tables appended under OUT/parquet/<table>/run_date=YYYY-MM-DD/. --out is a
local directory or any Hadoop file-system URI (file:///, hdfs://, s3a://): the tables go
through Spark's Parquet writer, the other files through Hadoop's FileSystem. The
definitions are in spark/analysis.py; docs/ANALYTICS.md explains them for operators.

An entry log the executors cannot read (the ledger dirs are not mounted where they run,
permissions, I/O errors) is an error: its bytes would be missing from every figure. The
job still writes summary.json and the report, both saying which logs, and exits 1;
--allow-unreadable accepts the gap (exit 0, the count and the logs in the summary).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from urllib.parse import urlparse

if __package__ in (None, ""):  # run as a file by spark-submit: make `spark` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from spark import report as R  # noqa: E402

PARQUET_TABLES = ("bookies", "entry_logs", "plan", "what_if", "top_ledgers", "top_owners", "under_replicated")
MAX_LISTED_UNDER_REPLICATED = 1000
MAX_LISTED_UNREADABLE = 1000


class UnreadableLogs(RuntimeError):
    """Entry logs the job could not read (raised after the summary and report are written;
    .summary is that summary, its "unreadable" lists them)."""

    def __init__(self, message: str, summary: dict):
        super().__init__(message)
        self.summary = summary


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metadata-uri", required=True, help="the cluster's metadata service, zk://host:port/ledgers")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--ledger-dirs", nargs="+", metavar="DIR",
                     help="bookies' ledger dirs this Spark can read (paths or globs: '/data/*/ledgers')")
    src.add_argument("--remote", action="store_true",
                     help="ask every registered bookie over its HTTP admin server instead")
    src.add_argument("--urls", nargs="+", metavar="URL", help="these bookies' HTTP admin servers (http://b1:8180)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="where summary.json, report.html, charts, parquet/ go: a local dir or a Hadoop URI"
                        " (file:///..., hdfs://..., s3a://...)")
    p.add_argument("--master", help="Spark master URL (default local[*]; under spark-submit, its --master)")
    p.add_argument("--threshold", type=float, default=None,
                   help="compaction plan threshold 0..1 (default: the recommended one, see docs/ANALYTICS.md)")
    p.add_argument("--scan", action="store_true", help="also scan every entry and check its digest (reads all bytes)")
    p.add_argument("--token", default="", help="the bookies' http_server_token (--remote, --urls)")
    p.add_argument("--driver-memory", default="1g", help="local mode driver memory (default 1g)")
    p.add_argument("--logs-per-partition", type=int, default=0,
                   help="entry logs per Spark task (default 0: as many tasks as the cluster's default"
                        " parallelism; 1 = one task per log)")
    p.add_argument("--allow-unreadable", action="store_true",
                   help="go on when some entry logs cannot be read (counted and listed in the summary);"
                        " without it they are an error (exit 1)")
    p.add_argument("--json", action="store_true", help="print summary.json's path and totals as JSON, no progress")


class _Quiet:
    def update_to(self, *a, **k) -> None:
        pass

    def note(self, line: str) -> None:
        pass

    def close(self) -> None:
        pass


def run(args, bar=None) -> dict:
    """The whole job; returns the summary dict (also written to OUT/summary.json)."""
    from spark.session import StageProgress, get_session

    if args.threshold is not None and not 0 < args.threshold <= 1:
        raise ValueError(f"--threshold must be in (0, 1], got {args.threshold}")
    if args.scan and not args.ledger_dirs:
        raise ValueError("--scan reads every byte: it needs --ledger-dirs (the bookies' HTTP endpoint serves usage only)")
    bar = bar or _Quiet()
    out_uri = out_is_uri(args.out)
    if not out_uri:
        os.makedirs(args.out, exist_ok=True)
    t0 = time.monotonic()
    started = dt.datetime.now(dt.timezone.utc)
    run_id = started.strftime("%Y%m%dT%H%M%SZ-") + uuid.uuid4().hex[:6]
    spark = get_session(args.master, driver_memory=args.driver_memory)
    with StageProgress(spark, bar) as progress:
        summary = _analyse(spark, args, progress)
    summary["run"] = {"run_id": run_id, "run_date": started.date().isoformat(), "started_at": started.isoformat(),
                      "duration_s": round(time.monotonic() - t0, 3), "mode": "scan" if args.scan else "ledgers_map",
                      "metadata_uri": args.metadata_uri, "spark_master": spark.sparkContext.master,
                      "source": ("remote" if args.remote or args.urls else "ledger_dirs"),
                      "ledger_dirs": list(args.ledger_dirs or ()), "urls": list(args.urls or ())}
    summary["error"] = unreadable_error(summary)
    # files are made here, then copied to a URI --out by Hadoop's FileSystem
    local = tempfile.mkdtemp(prefix="bk-analytics-out-") if out_uri else args.out
    try:
        with open(os.path.join(local, "summary.json"), "w") as fh:
            json.dump(summary, fh, indent=1)
        R.charts(summary, local)
        R.write_html(summary, local)
        if out_uri:
            _copy_out(spark, local, args.out)
    finally:
        if out_uri:
            shutil.rmtree(local, ignore_errors=True)
    if summary["error"]:  # figures with a gap stay out of the trend tables
        raise UnreadableLogs(summary["error"], summary)
    _write_parquet(spark, summary, _join(args.out if out_uri else "file://" + os.path.abspath(args.out), "parquet"))
    return summary


def out_is_uri(out: str) -> bool:
    """A Hadoop URI (scheme://...) rather than a local path."""
    return len(urlparse(out).scheme) > 1  # a one-letter "scheme" is a Windows drive


def _join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *parts])


def _copy_out(spark, local_dir: str, out: str) -> None:
    """Copy every file of local_dir to the URI `out` through Hadoop's FileSystem (any scheme
    the cluster's Hadoop configuration knows: file, hdfs, s3a, abfs, gs ...)."""
    jvm = spark.sparkContext._jvm
    Path = jvm.org.apache.hadoop.fs.Path
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    fs = Path(out).getFileSystem(conf)
    fs.mkdirs(Path(out))
    for name in sorted(os.listdir(local_dir)):
        fs.copyFromLocalFile(False, True, Path("file://" + os.path.join(local_dir, name)), Path(_join(out, name)))


def _log_reader(spark, args, listed: list | None = None):
    """bk_entry_logs over --ledger-dirs, listed here in the driver (the executors' Python may
    lack bk.meta, which reads the dirs' cookies), grouped so a Python task's own cost does
    not dominate."""
    from spark import logs as L

    listed = listed if listed is not None else L.list_logs(L.expand_dirs(args.ledger_dirs))
    reader = spark.read.format("bk_entry_logs").option("logs", json.dumps(listed))
    per = getattr(args, "logs_per_partition", 0) or 0
    if per > 0:
        return reader.option("logs_per_partition", str(per))
    return reader.option("max_partitions", str(spark.sparkContext.defaultParallelism))


def _usage_df(spark, args, listed):
    if args.ledger_dirs:
        return _log_reader(spark, args, listed).load()
    reader = spark.read.format("bk_remote_entry_logs").option("token", args.token)
    if args.urls:
        return reader.option("urls", json.dumps(args.urls)).load()
    from spark.sources import registered_urls

    return reader.option("bookies", json.dumps(registered_urls(args.metadata_uri))).load()


def _ledgers_df(spark, uri: str):
    """Every ledger's metadata, read here in the driver (bk.meta), spread over the cluster."""
    import pyarrow as pa

    from spark import metadata as M

    table = pa.Table.from_batches([M.rows_to_batch(M.read_ledgers(uri))], schema=M.LEDGERS_META_SCHEMA)
    return spark.createDataFrame(table, M.LEDGERS_META_DDL).repartition(spark.sparkContext.defaultParallelism)


def _rows(df) -> list[dict]:
    return [r.asDict() for r in df.collect()]


def _analyse(spark, args, progress) -> dict:
    from spark import analysis as A

    progress.set_step("reading ledger metadata")
    ledgers = _ledgers_df(spark, args.metadata_uri).cache()
    ledger_count = ledgers.count()
    progress.set_step(f"reading entry logs ({ledger_count} ledgers in the metadata)")
    from spark import logs as L

    listed = L.list_logs(L.expand_dirs(args.ledger_dirs)) if args.ledger_dirs else None
    rows = A.classify(_usage_df(spark, args, listed), ledgers).cache()
    logs = A.per_log(rows).cache()
    entry_logs = _rows(logs.orderBy("bookie_id", "log_id"))
    unreadable = [{"bookie_id": r["bookie_id"], "log_id": r["log_id"], "error": r["scan_status"]}
                  for r in entry_logs if r["source"] == "error"]
    progress.set_step(f"{len(entry_logs)} entry logs read; per bookie, what-if, plan")
    bookies = _rows(A.per_bookie(logs))
    per_bookie_curves, total_rows = A.what_if(entry_logs)
    recommended = A.recommend(total_rows)
    threshold = args.threshold if args.threshold is not None else recommended
    plan_rows = A.plan(entry_logs, threshold)
    hist = A.usage_histogram(entry_logs)
    entries = None
    scan = None
    if args.scan:
        progress.set_step("full scan: every entry and its digest")
        # every known ledger's digest, so each live entry is checked (deleted ones are guessed)
        digests = {r["ledger_id"]: r["digest_type"] for r in _rows(ledgers.select("ledger_id", "digest_type"))
                   if r["digest_type"] is not None}
        entries = _log_reader(spark, args, listed).option("mode", "scan").option("digest_types", json.dumps(digests)) \
            .load().cache()
        scan = _rows(A.scan_stats(entries))
    progress.set_step("where the space goes")
    under = A.under_replicated(rows, ledgers, entries)
    under_count = under.count()
    space = {"top_ledgers": _rows(A.top_ledgers(rows)), "top_owners": _rows(A.top_owners(rows)),
             "deleted_unreclaimed_bytes": sum(b["deleted_bytes"] for b in bookies),
             "over_replicated_bytes": sum(b["over_replicated_bytes"] for b in bookies),
             "under_replicated_count": under_count,
             "under_replicated_judged_by": "segment entries (full scan)" if entries is not None else "ledger bytes",
             "under_replicated_segments": _rows(under.limit(MAX_LISTED_UNDER_REPLICATED))}
    if entries is not None:
        entries.unpersist()
    totals = {k: sum(b[k] for b in bookies) for k in ("total_bytes", "live_bytes", "reclaimable_bytes",
                                                      "deleted_bytes", "over_replicated_bytes", "file_bytes")}
    totals["ledgers_in_metadata"] = ledger_count
    totals["unreadable_logs"] = len(unreadable)
    return {
        "bookies": bookies,
        "entry_logs": [{"bookie_id": r["bookie_id"], "log_id": r["log_id"], "total_bytes": r["total_bytes"],
                        "live_bytes": r["live_bytes"], "usage": round(r["usage"], 6), "closed": r["closed"],
                        "source": r["source"], "file_bytes": r["file_bytes"], "deleted_bytes": r["deleted_bytes"],
                        "over_replicated_bytes": r["over_replicated_bytes"], "ledgers": r["ledgers"],
                        "scan_status": r["scan_status"], "invalid_bytes": r["invalid_bytes"]} for r in entry_logs],
        "plan": {"threshold": threshold,
                 "logs": [{"bookie_id": r["bookie_id"], "log_id": r["log_id"], "usage": round(r["usage"], 6),
                           "total_bytes": r["total_bytes"], "live_bytes": r["live_bytes"]} for r in plan_rows],
                 "bytes_reclaimed": sum(r["total_bytes"] - r["live_bytes"] for r in plan_rows),
                 "bytes_rewritten": sum(r["live_bytes"] for r in plan_rows)},
        "what_if": {"thresholds": list(A.THRESHOLDS), "recommended_threshold": recommended,
                    "total": total_rows, "per_bookie": per_bookie_curves},
        "usage_histogram": {"bins": 20, "per_bookie": hist},
        "space": space,
        "scan": scan,
        "totals": totals,
        # logs whose bytes no figure above includes; allowed: the run went on by --allow-unreadable
        "unreadable": {"count": len(unreadable), "allowed": bool(getattr(args, "allow_unreadable", False)),
                       "logs": unreadable[:MAX_LISTED_UNREADABLE]},
    }


def _write_parquet(spark, summary: dict, root: str) -> None:
    """Each table appended under root/<table>/run_date=<date>/ with run_id on every row, by
    Spark's Parquet writer (root: any Hadoop URI)."""
    run = summary["run"]
    tables = {
        "bookies": summary["bookies"],
        "entry_logs": summary["entry_logs"],
        "plan": [{**r, "threshold": summary["plan"]["threshold"]} for r in summary["plan"]["logs"]],
        "what_if": [{**r, "bookie_id": b} for b, rs in summary["what_if"]["per_bookie"].items() for r in rs]
        + [{**r, "bookie_id": None} for r in summary["what_if"]["total"]],
        "top_ledgers": summary["space"]["top_ledgers"],
        "top_owners": summary["space"]["top_owners"],
        "under_replicated": summary["space"]["under_replicated_segments"],
    }
    import pyarrow as pa

    for name in PARQUET_TABLES:
        rows = [{**r, "run_id": run["run_id"], "run_date": run["run_date"]} for r in tables[name]]
        if not rows:
            continue
        table = pa.Table.from_pylist(rows)
        # a column that is null in every row has no type Parquet can store: a string column of nulls
        table = table.cast(pa.schema([pa.field(f.name, pa.string()) if pa.types.is_null(f.type) else f
                                      for f in table.schema]))
        spark.createDataFrame(table).coalesce(1).write.mode("append").partitionBy("run_date") \
            .parquet(_join(root, name))


def main(argv=None, bar=None) -> int:
    p = argparse.ArgumentParser(prog="gc_job.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    args = p.parse_args(argv)
    return execute(args, bar)


def unreadable_error(summary: dict) -> str | None:
    """The error a run with unreadable logs ends with, None when there are none or they were allowed."""
    u = summary.get("unreadable") or {}
    if not u.get("count") or u.get("allowed"):
        return None
    first = u["logs"][0]
    return (f"{u['count']} entry log(s) could not be read, so no figure includes their bytes (first: bookie "
            f"{first['bookie_id']} log {first['log_id']}: {first['error']}). Run where the executors can read the "
            "ledger dirs, use --remote (each bookie reads its own), or --allow-unreadable to accept the gap; "
            "summary.json lists them")


def execute(args, bar=None) -> int:
    try:
        summary = run(args, bar)
    except UnreadableLogs as e:  # the summary and report are written and say so
        summary = e.summary
    except (ValueError, RuntimeError, OSError) as e:
        print(f"bk analytics gc: error: {e}", file=sys.stderr)
        return 1
    finally:
        if bar is not None:
            bar.close()
    error = summary["error"]
    if args.json:
        print(json.dumps({"summary": _join(args.out, "summary.json"), "totals": summary["totals"],
                          "unreadable": summary["unreadable"], "error": error,
                          "plan": {k: v for k, v in summary["plan"].items() if k != "logs"}}))
    else:
        print(R.text_summary(summary, args.out))
    if error is not None:
        print(f"bk analytics gc: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
