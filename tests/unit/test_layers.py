"""ARCHITECTURE.md's import rules: each layer imports only from layers below it.

`errors, config` <- `_native` <- `proto, journal, entrylog, index` <- `bookie`
<- `server`; `meta` <- `client` <- `replication`; `server` may start
`replication`. kazoo is imported only in `bk.meta`, lmdb only in `bk.index`.
"""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "bk"
BASE = {"errors", "config", "fileio", "eventloop", "metrics"}

ALLOWED = {
    "errors": set(),
    "config": {"errors"},
    "fileio": {"errors"},
    "eventloop": set(),
    "metrics": set(),
    "_native": BASE,
    "proto": BASE | {"_native"},
    "journal": BASE | {"_native"},
    "entrylog": BASE | {"_native"},
    # the index persists journal log marks; LogMark is a plain NamedTuple
    "index": BASE | {"_native", "journal"},
    "bookie": BASE | {"_native", "journal", "entrylog", "index", "proto"},
    "meta": BASE,
    "client": BASE | {"_native", "proto", "meta"},
    "replication": BASE | {"_native", "proto", "meta", "client"},
    # the HTTP admin server reads ledgers and runs recovery with a client, as BookKeeper's does
    "server": BASE | {"_native", "proto", "journal", "entrylog", "index", "bookie", "meta", "client",
                      "replication"},
}
# Leaf modules with no bk imports that a lower layer may read: bk.proto.layout is the one
# definition of the wire layouts, and the pure kernel twins in bk._native use its names
# (the compiled kernels get them from its generated wire_layout.pxi).
LEAF_MODULES = {"bk.proto.layout": {"_native"}}
THIRD_PARTY_HOME = {"kazoo": {"meta"}, "lmdb": {"index"}, "prometheus_client": {"metrics"}, "aiohttp": {"server"}}


# spark/ (top level, its own layer): bk's pure format modules, bk.meta's API and the CLI's
# progress helper; never bk._native, the server, the bookie or kazoo.
SPARK_ROOT = ROOT.parent / "spark"
SPARK_ALLOWED_BK = {"bk.entrylog.format", "bk.entrylog.usage", "bk.proto.constants", "bk.errors", "bk.cli.progress",
                    "bk.entrylog"}  # `from bk.entrylog import format, usage`: the package loads lazily
SPARK_FORBIDDEN_THIRD_PARTY = {"kazoo", "lmdb", "aiohttp", "uvloop"}


def _spark_allows(name: str) -> bool:
    return name in SPARK_ALLOWED_BK or name == "bk.meta" or name.startswith("bk.meta.")


@pytest.mark.parametrize("path", sorted(SPARK_ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(SPARK_ROOT)))
def test_spark_imports_only_pure_modules_and_meta(path):
    for name in _imports(path):
        if name == "bk" or name.startswith("bk."):
            assert _spark_allows(name), f"spark/{path.name} must not import {name} (pure formats and bk.meta only)"
        assert name.split(".")[0] not in SPARK_FORBIDDEN_THIRD_PARTY, f"spark/{path.name} imports {name}"


def test_spark_pure_modules_stay_pure():
    """What spark/ may import from bk must not pull in _native, the server or kazoo itself."""
    for mod in ("entrylog/format.py", "entrylog/usage.py", "proto/constants.py", "cli/progress.py"):
        for name in _imports(ROOT / mod):
            assert not name.startswith(("bk._native", "bk.server", "bk.bookie", "bk.index", "kazoo", "lmdb")), \
                f"bk/{mod} imports {name}: spark/ relies on it being pure"


def test_spark_loads_no_native_server_or_kazoo():
    """At run time too: importing spark's modules (all but the pyspark-bound ones) loads none of them."""
    import subprocess
    import sys
    code = ("import sys, spark.logs, spark.metadata, spark.synth, spark.report, spark.gc_job; "
            "print([m for m in sys.modules if m.startswith(('bk._native', 'bk.server', 'bk.bookie', 'bk.index',"
            " 'kazoo', 'lmdb'))])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT.parent, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def _layer(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: pathlib.Path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def _modules():
    return sorted(p for p in ROOT.rglob("*.py") if _layer(p) in ALLOWED)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_follow_the_layers(path):
    layer = _layer(path)
    for name in _imports(path):
        parts = name.split(".")
        if layer in LEAF_MODULES.get(name, ()):
            continue
        if parts[0] == "bk" and len(parts) > 1 and parts[1] != layer:
            assert parts[1] in ALLOWED[layer], f"bk.{layer} ({path.name}) must not import {name}"
        if parts[0] in THIRD_PARTY_HOME:
            assert layer in THIRD_PARTY_HOME[parts[0]], f"{parts[0]} is imported outside {THIRD_PARTY_HOME[parts[0]]}"


def test_leaf_modules_import_nothing_from_bk():
    for name in LEAF_MODULES:
        path = ROOT.joinpath(*name.split(".")[1:]).with_suffix(".py")
        assert not [m for m in _imports(path) if m.split(".")[0] == "bk"], f"{name} must stay a leaf"
