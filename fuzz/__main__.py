"""`python -m fuzz`: run the fuzz targets under atheris (libFuzzer), make their seed corpus,
replay inputs. See docs/FUZZING.md.

  python -m fuzz list
  python -m fuzz run TARGET [--runs N | --seconds S | --hours H] [--seed N] [--work DIR]
  python -m fuzz all --seconds S          every target in turn, S seconds each
  python -m fuzz replay TARGET FILE...    run the target on saved inputs (a crash's artifact)
  python -m fuzz seed                     rewrite fuzz/corpus/ from frames and files bk writes
  python -m fuzz live [--frames N] ...    malformed frames against a running bookie (fuzz/live.py)

`run` works in a child process per target (libFuzzer exits the process when it is done):
the repo's corpus is read, never written; new coverage goes to --work (a temp dir by
default) and a crashing input to fuzz/crashes/<target>/ (move it to fuzz/regressions/ with
its fix). Each run prints one summary line: `fuzz TARGET: N execs in S s, crashes C`.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import fuzz

MEMORY_LIMIT_BYTES = 6 << 30  # address space of a fuzzing child: an allocation beyond is a bug
INPUT_TIMEOUT_S = 10  # one input running longer than this is a hang
MAX_LEN = 16384


def _child(name: str, runs: int | None, seconds: float | None, seed: int, work: str, crashes: str) -> None:
    """In the fuzzing process: instrument bk, hand the target to libFuzzer (never returns)."""
    import atheris

    limit_memory()
    with atheris.instrument_imports(include=["bk", "fuzz"]):
        target = fuzz.targets()[name]
    args = [sys.argv[0], work, os.path.join(fuzz.CORPUS_DIR, name), f"-seed={seed}", f"-max_len={MAX_LEN}",
            f"-timeout={INPUT_TIMEOUT_S}", "-rss_limit_mb=4096", f"-artifact_prefix={crashes}/",
            "-print_final_stats=1"]
    if os.path.isdir(os.path.join(fuzz.REGRESSIONS_DIR, name)):
        args.insert(3, os.path.join(fuzz.REGRESSIONS_DIR, name))
    if runs is not None:
        args.append(f"-runs={runs}")
    if seconds is not None:
        args.append(f"-max_total_time={max(1, int(seconds))}")
    atheris.Setup(args, target)
    atheris.Fuzz()


def run(name: str, runs: int | None = None, seconds: float | None = None, seed: int = 1,
        work: str | None = None, quiet: bool = False) -> dict:
    """Fuzz one target in a child process; {target, execs, seconds, crashes, returncode, output}."""
    crashes = os.path.join(fuzz.HERE, "crashes", name)
    os.makedirs(crashes, exist_ok=True)
    tmp = None
    if work is None:
        tmp = tempfile.TemporaryDirectory(prefix=f"bk-fuzz-{name}-")
        work = tmp.name
    cmd = [sys.executable, "-m", "fuzz", "_child", name, "--seed", str(seed), "--work", work, "--crashes", crashes]
    if runs is not None:
        cmd += ["--runs", str(runs)]
    if seconds is not None:
        cmd += ["--seconds", str(seconds)]
    start = time.monotonic()
    from fuzz.storage import SCRATCH_ENV, shm_dir
    scratch = tempfile.mkdtemp(prefix=f"bk-fuzz-{name}-", dir=shm_dir())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(fuzz.HERE),
                                                                      os.environ.get("PYTHONPATH")])))
    env[SCRATCH_ENV] = scratch
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    elapsed = time.monotonic() - start
    if tmp is not None:
        tmp.cleanup()
    out = proc.stdout + proc.stderr
    execs = [int(m) for m in re.findall(r"stat::number_of_executed_units: (\d+)", out)]
    found = len(re.findall(r"(?m)^(?:==\d+== ERROR: libFuzzer|=== Uncaught Python exception)", out))
    result = {"target": name, "execs": execs[-1] if execs else 0, "seconds": round(elapsed, 1),
              "crashes": found + (1 if proc.returncode and not found else 0), "returncode": proc.returncode,
              "output": out}
    if not quiet:
        print(f"fuzz {name}: {result['execs']} execs in {result['seconds']} s, crashes {result['crashes']}"
              f" (exit {proc.returncode})", flush=True)
        if proc.returncode:
            print(out[-4000:], file=sys.stderr)
    return result


def limit_memory() -> None:
    """The fuzzing children's address-space limit (replays use it too, to fail the same way).
    Also silences logging: the readers log every torn tail and bad header they meet, which a
    fuzzer meets thousands of times a second."""
    logging.disable(logging.CRITICAL)
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def replay(name: str, paths: list[str]) -> int:
    limit_memory()
    target = fuzz.targets()[name]
    bad = 0
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        try:
            target(data)
            print(f"{path}: ok")
        except Exception as e:  # noqa: BLE001 - report every failure, then exit non-zero
            bad += 1
            print(f"{path}: {type(e).__name__}: {e}")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list")
    sub.add_parser("seed")
    for cmd in ("run", "all", "_child"):
        p = sub.add_parser(cmd)
        if cmd != "all":
            p.add_argument("target", choices=fuzz.target_names())
        p.add_argument("--runs", type=int)
        p.add_argument("--seconds", type=float)
        p.add_argument("--hours", type=float)
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--work")
        p.add_argument("--report", help="append one JSON line per target (target, execs, seconds, crashes)")
        if cmd == "_child":
            p.add_argument("--crashes", required=True)
    p = sub.add_parser("replay")
    p.add_argument("target", choices=fuzz.target_names())
    p.add_argument("paths", nargs="+")
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["live"]:
        from fuzz import live
        return live.main(argv[1:])
    args = ap.parse_args(argv)
    if args.cmd == "list":
        print("\n".join(fuzz.target_names()))
        return 0
    if args.cmd == "seed":
        from fuzz import seeds
        seeds.write_corpus()
        return 0
    if args.cmd == "replay":
        return replay(args.target, args.paths)
    seconds = args.hours * 3600 if args.hours else args.seconds
    if args.runs is None and seconds is None:
        ap.error("give --runs, --seconds or --hours")
    if args.cmd == "_child":
        _child(args.target, args.runs, seconds, args.seed, args.work, args.crashes)
        return 0
    names = fuzz.target_names() if args.cmd == "all" else [args.target]
    results = []
    for n in names:
        work = os.path.join(args.work, n) if args.work else None  # one corpus dir per target
        if work:
            os.makedirs(work, exist_ok=True)
        results.append(run(n, args.runs, seconds, args.seed, work))
        if args.report:
            with open(args.report, "a") as f:
                f.write(json.dumps({k: v for k, v in results[-1].items() if k != "output"}) + "\n")
    return 1 if any(r["returncode"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
