"""`bk analytics`: storage analytics on Spark (the `spark/` package; docs/ANALYTICS.md).

    bk analytics gc --metadata-uri URI (--ledger-dirs DIR... | --remote | --urls URL...) --out DIR
                    [--master URL] [--threshold T] [--scan] [--allow-unreadable]

`gc` is spark/gc_job.py (also runnable with spark-submit): where every byte on every
bookie goes, what GC and compaction would free, and a compaction plan that
`bk shell compact --plan OUT/summary.json` hands to the bookies. Progress (Spark
stages done / total) is shown on the terminal while Spark works. An entry log that
cannot be read fails the run (exit 1; the summary and report list it) unless
--allow-unreadable. --out may be a Hadoop URI (hdfs://, s3a://, file:///).
"""
from __future__ import annotations

import sys


def add_parser(sub) -> None:
    p = sub.add_parser("analytics", help="storage analytics on Spark (GC, compaction plans)", description=__doc__)
    cmds = p.add_subparsers(dest="analytics_command", metavar="COMMAND")
    cmds.required = True
    c = cmds.add_parser("gc", help="where the bytes go, what GC/compaction would free, a compaction plan")
    from spark.gc_job import add_arguments  # argparse only: pyspark is imported when the job runs

    add_arguments(c)
    c.set_defaults(func=run_gc)


def run_gc(args) -> int:
    import importlib.util

    missing = [m for m in ("pyspark", "pyarrow", "matplotlib") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"bk analytics: needs {', '.join(missing)}; run ./scripts/setup or pip install -e '.[spark]'",
              file=sys.stderr)
        return 1
    from spark.gc_job import execute

    from .progress import progress_bar

    bar = progress_bar(total=None, desc="spark stages", unit="stage", quiet=args.json)
    return execute(args, bar)
