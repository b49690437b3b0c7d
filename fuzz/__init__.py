"""Coverage-guided fuzzing of every bk parser that reads untrusted bytes (docs/FUZZING.md).

Targets live in fuzz/wire.py, fuzz/storage.py and fuzz/formats.py; TARGETS below names
them all. Each has a seed corpus in fuzz/corpus/<target>/ (made by `python -m fuzz seed`
from frames and files bk itself writes) and the inputs of bugs it found in
fuzz/regressions/<target>/ (replayed by tests/unit/test_fuzz_targets.py).
`python -m fuzz --help` runs them under atheris; fuzz/live.py fuzzes a running bookie.
"""
from __future__ import annotations

import importlib
import os

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS_DIR = os.path.join(HERE, "corpus")
REGRESSIONS_DIR = os.path.join(HERE, "regressions")
_MODULES = ("fuzz.wire", "fuzz.storage", "fuzz.formats")


def targets() -> dict:
    """name -> target function, over every target module."""
    out = {}
    for name in _MODULES:
        out.update(importlib.import_module(name).TARGETS)
    return out


def target_names() -> list[str]:
    return ["v2_request", "v2_response", "v3_request", "v3_response", "journal", "entrylog", "index",
            "cookie", "ledger_metadata", "gc_usage"]


def inputs(directory: str) -> list[tuple[str, bytes]]:
    """(file name, bytes) of every file in a corpus or regressions dir, by name."""
    if not os.path.isdir(directory):
        return []
    out = []
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            out.append((name, f.read()))
    return out
