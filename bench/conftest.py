"""Shared benchmark fixtures: a scratch directory on the project's disk, entry sizes.

Benchmarks that fsync must write where the bookie would: `BK_BENCH_DIR` if set,
else `<repo>/.bench-tmp` (same filesystem as the work tree, not a tmpfs /tmp).
"""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest

ENTRY_SIZES = (100, 1024, 65536)
REPO_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def bench_base_dir() -> str:
    base = os.environ.get("BK_BENCH_DIR") or os.path.join(REPO_DIR, ".bench-tmp")
    os.makedirs(base, exist_ok=True)
    return base


@pytest.fixture
def bench_tmp_dir(request):
    """A fresh directory under bench_base_dir(), removed after the test."""
    path = tempfile.mkdtemp(prefix=f"{request.node.name[:40]}-".replace("/", "_"), dir=bench_base_dir())
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=ENTRY_SIZES, ids=lambda n: f"{n}B")
def entry_size(request) -> int:
    """Entry payload sizes every storage benchmark reports: 100 B, 1 KiB, 64 KiB."""
    return request.param
