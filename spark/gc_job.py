"""The GC analytics job: `bk analytics gc`, or the same through spark-submit:

    spark-submit --master spark://host:7077 spark/gc_job.py --metadata-uri zk://zk:2181/ledgers \\
        --remote --out /reports/gc
    bk analytics gc --metadata-uri zk://127.0.0.1:2181/ledgers --ledger-dirs '/data/*/ledgers' --out /tmp/gc

Reads the bookies' entry logs (ledgers maps, or a full scan with --scan) and every
ledger's metadata, and writes to --out: summary.json, report.html, three PNG charts,
and Parquet tables appended under OUT/parquet/<table>/run_date=YYYY-MM-DD/. The
definitions are in spark/analysis.py; docs/ANALYTICS.md explains them for operators.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
import uuid

if __package__ in (None, ""):  # run as a file by spark-submit: make `spark` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from spark import report as R  # noqa: E402

PARQUET_TABLES = ("bookies", "entry_logs", "plan", "what_if", "top_ledgers", "top_owners", "under_replicated")
MAX_LISTED_UNDER_REPLICATED = 1000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metadata-uri", required=True, help="the cluster's metadata service, zk://host:port/ledgers")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--ledger-dirs", nargs="+", metavar="DIR",
                     help="bookies' ledger dirs this Spark can read (paths or globs: '/data/*/ledgers')")
    src.add_argument("--remote", action="store_true",
                     help="ask every registered bookie over its HTTP admin server instead")
    src.add_argument("--urls", nargs="+", metavar="URL", help="these bookies' HTTP admin servers (http://b1:8180)")
    p.add_argument("--out", required=True, metavar="DIR", help="where summary.json, report.html, charts, parquet/ go")
    p.add_argument("--master", help="Spark master URL (default local[*]; under spark-submit, its --master)")
    p.add_argument("--threshold", type=float, default=None,
                   help="compaction plan threshold 0..1 (default: the recommended one, see docs/ANALYTICS.md)")
    p.add_argument("--scan", action="store_true", help="also scan every entry and check its digest (reads all bytes)")
    p.add_argument("--token", default="", help="the bookies' http_server_token (--remote, --urls)")
    p.add_argument("--driver-memory", default="1g", help="local mode driver memory (default 1g)")
    p.add_argument("--logs-per-partition", type=int, default=0,
                   help="entry logs per Spark task (default 0: about 4 tasks per core; 1 = one task per log)")
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
    with open(os.path.join(args.out, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    _write_parquet(spark, summary, os.path.join(args.out, "parquet"))
    R.charts(summary, args.out)
    R.write_html(summary, args.out)
    return summary


def _log_reader(spark, args):
    """bk_entry_logs over --ledger-dirs, grouped so a Python task's own cost does not dominate."""
    reader = spark.read.format("bk_entry_logs").option("ledger_dirs", json.dumps(args.ledger_dirs))
    per = getattr(args, "logs_per_partition", 0) or 0
    if per > 0:
        return reader.option("logs_per_partition", str(per))
    return reader.option("max_partitions", str(4 * spark.sparkContext.defaultParallelism))


def _usage_df(spark, args):
    if args.ledger_dirs:
        return _log_reader(spark, args).load()
    reader = spark.read.format("bk_remote_entry_logs").option("token", args.token)
    if args.urls:
        return reader.option("urls", json.dumps(args.urls)).load()
    return reader.option("metadata_uri", args.metadata_uri).load()


def _rows(df) -> list[dict]:
    return [r.asDict() for r in df.collect()]


def _analyse(spark, args, progress) -> dict:
    from spark import analysis as A

    progress.set_step("reading ledger metadata")
    ledgers = spark.read.format("bk_ledgers").option("metadata_uri", args.metadata_uri).load().cache()
    ledger_count = ledgers.count()
    progress.set_step(f"reading entry logs ({ledger_count} ledgers in the metadata)")
    rows = A.classify(_usage_df(spark, args), ledgers).cache()
    logs = A.per_log(rows).cache()
    entry_logs = _rows(logs.orderBy("bookie_id", "log_id"))
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
        entries = _log_reader(spark, args).option("mode", "scan").option("digest_types", json.dumps(digests)) \
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
    }


def _write_parquet(spark, summary: dict, root: str) -> None:
    """Each table appended under root/<table>/run_date=<date>/ with run_id on every row."""
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
    import pyarrow.parquet as pq

    for name in PARQUET_TABLES:
        rows = [{**r, "run_id": run["run_id"], "run_date": run["run_date"]} for r in tables[name]]
        if not rows:
            continue
        table = pa.Table.from_pylist(rows)
        pq.write_to_dataset(table, os.path.join(root, name), partition_cols=["run_date"],
                            basename_template=f"{run['run_id']}-{{i}}.parquet")


def main(argv=None, bar=None) -> int:
    p = argparse.ArgumentParser(prog="gc_job.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    args = p.parse_args(argv)
    return execute(args, bar)


def execute(args, bar=None) -> int:
    try:
        summary = run(args, bar)
    except (ValueError, RuntimeError, OSError) as e:
        print(f"bk analytics gc: error: {e}", file=sys.stderr)
        return 1
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        print(json.dumps({"summary": os.path.join(args.out, "summary.json"), "totals": summary["totals"],
                          "plan": {k: v for k, v in summary["plan"].items() if k != "logs"}}))
    else:
        print(R.text_summary(summary, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
