"""python -m bk.testing.chaos: run seeds, replay one, shrink failures (see bk/testing/chaos/__init__.py).
With --mode gc: the GC chaos mode (one storage engine, bk/testing/chaos/gc_chaos.py)."""
from __future__ import annotations

import argparse
import json
import sys

from .gc_breaks import GC_BREAKS
from .gc_runner import print_run
from .nemesis import KINDS
from .runner import investigate, matching_seeds, run_many, run_one

BREAKS = ("ack-before-fsync", "forget-fence")


def parse_faults(text: str | None):
    if text is None:
        return None
    if text in ("", "none"):
        return frozenset()
    try:
        return frozenset(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--faults takes comma-separated fault indices or 'none', got {text!r}")


WHERE_FIELDS = {"journal": bool, "autorecovery": bool, "tls": bool, "mode": str, "bookies": int}


def parse_where(text: str) -> tuple[str, object]:
    field, _, value = text.partition("=")
    kind = WHERE_FIELDS.get(field)
    if kind is None or not value:
        raise argparse.ArgumentTypeError(f"--where takes FIELD=VALUE with FIELD one of {', '.join(WHERE_FIELDS)},"
                                         f" got {text!r}")
    if kind is bool:
        if value not in ("on", "off"):
            raise argparse.ArgumentTypeError(f"--where {field}= takes on or off, got {value!r}")
        return field, value == "on"
    try:
        return field, kind(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--where {field}= takes {kind.__name__}, got {value!r}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bk.testing.chaos", description=(
        "Seeded chaos runs against bk clusters: each seed draws a cluster, a workload and a fault schedule "
        f"({', '.join(KINDS)}), heals, recovers and checks the history. Exit status 1 if a run failed."))
    which = p.add_mutually_exclusive_group()
    which.add_argument("--seed", type=int, help="run (replay) this one seed, printing its trace")
    which.add_argument("--seeds", type=int, default=20, help="how many seeds to run (default 20)")
    p.add_argument("--start", type=int, default=1, help="the first seed of --seeds (default 1)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--mode", choices=("inprocess", "process", "gc"),
                   help="force every run's cluster mode; gc: the GC chaos mode (one engine, GC's destructive paths)")
    p.add_argument("--process-share", type=float, default=0.02,
                   help="share of seeds run with real `bk bookie` processes (default 0.02, 1 in 50)")
    p.add_argument("--faults", type=parse_faults, help="keep only these fault indices (a shrunk replay), or 'none'")
    p.add_argument("--break", dest="test_break", choices=BREAKS + GC_BREAKS, default="",
                   help="run a deliberately broken bookie (the runner's self-test; gc-*: with --mode gc)")
    p.add_argument("--draw-for", dest="draw_for", choices=BREAKS + ("none",),
                   help="draw the scenarios for this break (default: --break's); without --break a correct bookie"
                        " runs them (a self-test's clean half)")
    p.add_argument("--json", dest="json_path", help="write the summary and every run's result to this file")
    p.add_argument("--shrink-limit", type=int, default=3, help="failures to replay and shrink (default 3, 0 = none)")
    p.add_argument("--shrink", action="store_true", help="with --seed: replay and shrink it if it fails")
    p.add_argument("--zk", dest="zk_connect", help="ZooKeeper connect string for process runs (default: start one)")
    p.add_argument("--time-limit", dest="time_limit_s", type=float, help="per-run time limit in seconds")
    p.add_argument("--keep-dir", action="store_true", help="keep each run's data directory")
    p.add_argument("--where", action="append", type=parse_where, default=[], metavar="FIELD=VALUE",
                   help="run only the seeds of the range whose drawn scenario has FIELD=VALUE (journal, autorecovery,"
                        " tls: on/off; mode; bookies), to hunt a failure seen in one kind of cluster; repeatable")
    p.add_argument("--report", metavar="JSON", help="print markdown tables of a run's --json file (done or running)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--verbose", action="store_true", help="let bk's logging through")
    a = p.parse_args(argv)
    if a.mode == "gc":
        from .gc_runner import main as gc_main
        return gc_main(a)
    if a.test_break in GC_BREAKS:
        p.error(f"--break {a.test_break} needs --mode gc")
    draw_for = None if a.draw_for is None else "" if a.draw_for == "none" else a.draw_for
    options = {k: v for k, v in dict(mode=a.mode, process_share=a.process_share, keep=a.faults,
                                     test_break=a.test_break, zk_connect=a.zk_connect, time_limit_s=a.time_limit_s,
                                     keep_dir=a.keep_dir, verbose=a.verbose).items() if v not in (None, "", False)}
    if draw_for is not None:
        options["draw_for"] = draw_for
    if a.report:
        from .runner import report_file
        print(report_file(a.report))
        return 0
    if a.seed is not None:
        import logging
        if not a.verbose:
            logging.disable(logging.CRITICAL)
        r = run_one(a.seed, options)
        print_run(r, f"seed {a.seed}", r.failures, r.replay, a.json_path)
        if not r.ok and a.shrink:
            investigate(r.to_json(), options)
        return 0 if r.ok else 1
    seeds = range(a.start, a.start + a.seeds)
    if a.where:
        seeds = matching_seeds(seeds, options, dict(a.where))
        print(f"{len(seeds)} of the {a.seeds} seeds from {a.start} draw {' '.join(f'{k}={v}' for k, v in a.where)}",
              flush=True)
        options["where"] = {k: v for k, v in a.where}
    summary = run_many(seeds, options, jobs=a.jobs, json_path=a.json_path,
                       progress=not a.quiet, shrink_limit=a.shrink_limit)
    brief = {k: v for k, v in summary.items() if k not in ("failures", "options")}
    brief["failed_seeds"] = [r["seed"] for r in summary["failures"]]
    print(json.dumps(brief, indent=1))
    return 0 if not summary["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
