"""GC chaos over many seeds: the summary, the JSON file, `python -m bk.testing.chaos --mode gc`.

    summary = run_many(range(1, 201), test_break="gc-dead-from-memory", json_path="gc.json")

Each seed runs in a fresh event loop with a fresh engine under its own directory
(run_seed; the schedule and the checker are bk.testing.chaos.gc_chaos), with jobs > 1
on forked worker processes. The summary counts the failed seeds ("caught" with a break), the step whose check failed
first, the journal split and what the schedules did; the JSON file adds every run.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections import Counter

from bk import eventloop
from bk.testing.diskfaults import DiskFaults

from .gc_breaks import GC_BREAKS
from .gc_chaos import Failed, GcChaos, GcRunResult, replay_command


def run_seed(seed: int, test_break: str = "", keep_dir: bool = False, verbose: bool = False) -> GcRunResult:
    """One seed's run in a fresh event loop, under its own directory (removed after)."""
    from .runner import work_root
    os.makedirs(work_root(), exist_ok=True)
    work_dir = tempfile.mkdtemp(prefix=f"gc-seed{seed}-", dir=work_root())
    if not verbose:
        logging.disable(logging.CRITICAL)
    chaos = GcChaos(seed, work_dir, test_break)
    t0 = time.monotonic()
    try:
        eventloop.run(chaos.run())
    except Failed as e:
        chaos.result.ok, chaos.result.failed_step, chaos.result.finding = False, chaos.step, True
        chaos.result.failures.append(str(e))
    except Exception as e:  # an error the engine raised where the schedule expected none
        chaos.result.ok, chaos.result.failed_step = False, chaos.step
        chaos.result.failures.append(f"{type(e).__name__}: {e}")
    finally:
        DiskFaults.uninstall()
        if not verbose:
            logging.disable(logging.NOTSET)
        if not keep_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    chaos.result.duration_s = round(time.monotonic() - t0, 3)
    return chaos.result


def git_revision() -> str:
    """The commit the runs ran on ("+dirty" with uncommitted changes), for the evidence."""
    import subprocess
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (rev + ("+dirty" if dirty else "")) if rev else "unknown"


def summarize(results: list[dict], test_break: str, wall_s: float) -> dict:
    failed = [r for r in results if not r["ok"]]
    return {"mode": "gc", "break": test_break, "git_revision": git_revision(),
            "runs": len(results), "ok": len(results) - len(failed),
            "failed": len(failed), "failed_seeds": [r["seed"] for r in failed],
            "seeds": f"{results[0]['seed']}-{results[-1]['seed']}" if results else "",
            "caught_at_step": dict(Counter(r["failed_step"].split(":")[-1] for r in failed)),
            "journal": dict(Counter("on" if r["journal"] else "off" for r in results)),
            "failed_by_journal": dict(Counter("on" if r["journal"] else "off" for r in failed)),
            "steps": dict(sum((Counter(r["steps"]) for r in results), Counter())),
            "entries_checked": sum(r["entries"] for r in results),
            "garbled_live_entries": sum(r["garbled_live"] for r in results),
            "ledgers_deleted": sum(r["ledgers_deleted"] for r in results),
            "gc_passes_by_metadata_fault": dict(sum((Counter(r.get("metadata_faults", {})) for r in results),
                                                    Counter())),
            "wall_s": round(wall_s, 1),
            "mean_run_s": round(sum(r["duration_s"] for r in results) / max(1, len(results)), 3)}


def _one(args) -> dict:
    seed, test_break = args
    return run_seed(seed, test_break).to_json()


def run_many(seeds, test_break: str = "", jobs: int = 1, json_path: str | None = None, progress=None) -> dict:
    """Every seed; the summary, written with every run's result to `json_path` when given.
    `progress(result, done, total)` is called after each run."""
    seeds, t0 = list(seeds), time.monotonic()
    work = [(s, test_break) for s in seeds]
    results: list[dict] = []
    if jobs > 1:
        import multiprocessing
        with multiprocessing.get_context("fork").Pool(jobs, maxtasksperchild=20) as pool:
            for r in pool.imap_unordered(_one, work):
                results.append(r)
                if progress:
                    progress(r, len(results), len(seeds))
    else:
        for w in work:
            results.append(_one(w))
            if progress:
                progress(results[-1], len(results), len(seeds))
    results.sort(key=lambda r: r["seed"])
    summary = summarize(results, test_break, time.monotonic() - t0)
    if json_path:
        with open(json_path, "w") as fh:
            json.dump({**summary, "results": results}, fh, indent=None)
            fh.write("\n")
    return summary


def print_run(r, title: str, failures: list, replay: str, json_path: str | None) -> None:
    """One replayed seed (a cluster run or a GC one): its trace, verdict, replay command."""
    print("\n".join(r.trace))
    print(f"{title}: {'ok' if r.ok else 'FAILED'} in {r.duration_s:.2f}s")
    for f in failures:
        print(f"  {f}")
    print(f"replay: {replay}")
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(r.to_json(), fh, indent=1)


def main(a) -> int:
    """The `--mode gc` branch of python -m bk.testing.chaos (its parsed arguments `a`).
    Exit status 1 if a run failed (with a break: if a seed caught it)."""
    test_break = a.test_break or ""
    if test_break and test_break not in GC_BREAKS:
        print(f"--break {test_break} is a cluster break; --mode gc takes one of {', '.join(GC_BREAKS)}",
              file=sys.stderr)
        return 2
    if a.seed is not None:
        r = run_seed(a.seed, test_break, keep_dir=a.keep_dir, verbose=a.verbose)
        print_run(r, f"seed {a.seed} (journal {'on' if r.journal else 'off'})",
                  [f"at step {r.failed_step}: {f}" for f in r.failures], replay_command(a.seed, test_break), a.json_path)
        return 0 if r.ok else 1

    def progress(r: dict, done: int, total: int) -> None:
        if not r["ok"]:
            print(f"{'CAUGHT' if test_break else 'FAIL'} seed {r['seed']} at step {r['failed_step']}:"
                  f" {r['failures'][0][:300]}\n  replay: {r['replay']}", file=sys.stderr, flush=True)
        if not a.quiet and (done % 20 == 0 or done == total):
            print(f"[{done}/{total}]", file=sys.stderr, flush=True)
    summary = run_many(range(a.start, a.start + a.seeds), test_break, jobs=a.jobs, json_path=a.json_path,
                       progress=progress)
    print(json.dumps(summary, indent=1))
    return 0 if not summary["failed"] else 1


__all__ = ["main", "print_run", "run_many", "run_seed", "summarize"]
