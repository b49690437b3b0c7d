"""Spark analytics benchmarks (docs/BENCHMARKS.md, "Spark storage analytics").

    python -m bench.spark_gc metadata [--bookies 30 --logs 10000 --log-bytes 1GiB]
    python -m bench.spark_gc scan [--bookies 4 --logs 12 --log-bytes 256MiB --entry-bytes 4KiB --runs 3]

metadata: a synthetic cluster (spark.synth, sparse logs: header + ledgers map) with
its ledgers in a fresh local ZooKeeper, then `bk analytics gc` in local mode; prints
the job's seconds (Spark start included) and checks every bookie's figures against
the generator's manifest.

scan: real logs (every record written), then per run, cold caches both (sync +
POSIX_FADV_DONTNEED on every file): `cat` of all the files to /dev/null (the disk's
read rate), and a full scan on Spark (every entry's size, ids, CRC32C) in local mode;
MB/s of log bytes, and per core (Spark's cores; cat is one process). Medians over runs.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from bench import scratch_dir


def _drop_cache(paths) -> None:
    os.sync()
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _zookeeper(base: str):
    from bk.testing.cluster import run_shell
    from bk.testing.zookeeper import LocalZooKeeper

    zk = LocalZooKeeper(os.path.join(base, "zookeeper"))
    zk.start()
    uri = f"zk://{zk.connect_string}/ledgers"
    out = run_shell(uri, "initnewcluster")
    if out.returncode != 0:
        zk.stop()
        raise RuntimeError(out.stderr)
    return zk, uri


def metadata(a) -> dict:
    from spark.synth import generate

    base = scratch_dir("spark-meta-")
    zk, uri = _zookeeper(base)
    try:
        t0 = time.monotonic()
        manifest = generate(os.path.join(base, "synth"), a.bookies, a.logs, a.log_bytes, 0.3, uri)
        gen_s = time.monotonic() - t0
        out = os.path.join(base, "out")
        cmd = [sys.executable, "-m", "bk.cli.main", "--log-level", "WARNING", "analytics", "gc", "--json",
               "--metadata-uri", uri, "--ledger-dirs", os.path.join(base, "synth", "*", "ledgers"), "--out", out]
        if a.logs_per_partition:
            cmd += ["--logs-per-partition", str(a.logs_per_partition)]
        t0 = time.monotonic()
        res = subprocess.run(cmd, capture_output=True, text=True)
        wall_s = time.monotonic() - t0
        if res.returncode != 0:
            raise RuntimeError(res.stderr[-3000:])
        with open(os.path.join(out, "summary.json")) as fh:
            summary = json.load(fh)
        mismatched = [b["bookie_id"] for b in summary["bookies"]
                      if (b["total_bytes"], b["live_bytes"], b["deleted_bytes"], b["over_replicated_bytes"]) !=
                      tuple(manifest["bookies"][b["bookie_id"]][k] for k in
                            ("total_bytes", "live_bytes", "deleted_bytes", "over_replicated_bytes"))]
        return {"bench": "spark-metadata", "bookies": a.bookies, "entry_logs": len(summary["entry_logs"]),
                "represented_tb": round(summary["totals"]["total_bytes"] / 1e12, 2), "ledgers": manifest["ledgers"],
                "generate_s": round(gen_s, 1), "job_s": summary["run"]["duration_s"], "wall_s": round(wall_s, 1),
                "bookies_matching_manifest": len(summary["bookies"]) - len(mismatched),
                "logs_per_partition": a.logs_per_partition or "auto"}
    finally:
        zk.stop()
        shutil.rmtree(base, ignore_errors=True)


def scan(a) -> dict:
    from spark.synth import generate
    from spark.session import get_session

    base = scratch_dir("spark-scan-")
    try:
        generate(os.path.join(base, "synth"), a.bookies, a.logs, a.log_bytes, 0.3, None, mode="real",
                 entry_bytes=a.entry_bytes)
        files = sorted(glob.glob(os.path.join(base, "synth", "*", "ledgers", "current", "*.log")))
        total = sum(os.path.getsize(f) for f in files)
        spark = get_session(a.master)
        cores = spark.sparkContext.defaultParallelism
        dirs = json.dumps(sorted(glob.glob(os.path.join(base, "synth", "*", "ledgers"))))
        cat_s, scan_s, entries = [], [], 0
        for _ in range(a.runs):
            _drop_cache(files)
            t0 = time.monotonic()
            subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)
            cat_s.append(time.monotonic() - t0)
            _drop_cache(files)
            t0 = time.monotonic()
            row = spark.read.format("bk_entry_logs").option("ledger_dirs", dirs).option("mode", "scan") \
                .option("max_partitions", str(4 * cores)).load() \
                .selectExpr("count(*) AS n", "sum(size) AS bytes",
                            "sum(CASE WHEN checksum_valid THEN 0 ELSE 1 END) AS unchecked").collect()[0]
            scan_s.append(time.monotonic() - t0)
            entries = row["n"]
            if row["unchecked"]:
                raise RuntimeError(f"{row['unchecked']} entries failed or skipped their CRC32C")
        cat_mb_s = total / 1e6 / statistics.median(cat_s)
        scan_mb_s = total / 1e6 / statistics.median(scan_s)
        return {"bench": "spark-scan", "log_bytes_total_mb": round(total / 1e6), "files": len(files),
                "entries": entries, "entry_payload_bytes": a.entry_bytes, "runs": a.runs, "spark_cores": cores,
                "cat_mb_s": round(cat_mb_s), "scan_mb_s": round(scan_mb_s),
                "scan_mb_s_per_core": round(scan_mb_s / cores), "scan_vs_cat": round(scan_mb_s / cat_mb_s, 2),
                "cat_s": [round(x, 2) for x in cat_s], "scan_s": [round(x, 2) for x in scan_s]}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main(argv=None) -> int:
    from spark.synth import parse_bytes

    p = argparse.ArgumentParser(prog="python -m bench.spark_gc", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    m = sub.add_parser("metadata")
    m.add_argument("--bookies", type=int, default=30)
    m.add_argument("--logs", type=int, default=10000)
    m.add_argument("--log-bytes", type=parse_bytes, default=1 << 30)
    m.add_argument("--logs-per-partition", type=int, default=0)
    s = sub.add_parser("scan")
    s.add_argument("--bookies", type=int, default=4)
    s.add_argument("--logs", type=int, default=12)
    s.add_argument("--log-bytes", type=parse_bytes, default=256 << 20)
    s.add_argument("--entry-bytes", type=parse_bytes, default=4096)
    s.add_argument("--runs", type=int, default=3)
    s.add_argument("--master", default="local[2]")
    a = p.parse_args(argv)
    print(json.dumps(metadata(a) if a.what == "metadata" else scan(a)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
