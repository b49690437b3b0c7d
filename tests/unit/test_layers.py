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
