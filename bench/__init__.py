"""Benchmarks for bk: pytest-benchmark micro benchmarks and the macro tools.

    python -m pytest bench/ --benchmark-only     micro benchmarks + one real-bookie run
    python -m bench.load                          load generator (adds, optional reads)
    python -m bench.compare                       raw disk vs Redis vs bk, side by side
    python -m bench.rawdisk                       the disk alone (write + fdatasync groups)
    python -m bench.redisbench                    Redis alone (appendfsync always)
    python -m bench.overload                      a bookie under abusive clients (docs/OVERLOAD.md)
    python -m bench.admin_load                    add latency while the admin API's large answers are pulled

Every tool writes where the bookie would: `BK_BENCH_DIR` if set, else
`<repo>/.bench-tmp` (the work tree's filesystem, not a tmpfs /tmp), so the
figures of one run are comparable: same disk, same entry sizes, same depth.
See docs/BENCHMARKS.md for what each number means.
"""
from __future__ import annotations

import os
import tempfile

REPO_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def bench_base_dir() -> str:
    """The directory benchmark files go to (created if missing)."""
    base = os.environ.get("BK_BENCH_DIR") or os.path.join(REPO_DIR, ".bench-tmp")
    os.makedirs(base, exist_ok=True)
    return base


def scratch_dir(prefix: str) -> str:
    """A fresh directory under bench_base_dir(); the caller removes it."""
    return tempfile.mkdtemp(prefix=prefix + "-", dir=bench_base_dir())


def child_env() -> dict:
    """The environment for processes we start (bookies): `bk` importable from this tree."""
    env = dict(os.environ)
    parts = [REPO_DIR] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    return env
