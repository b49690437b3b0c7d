"""The import rules of ../shared/docs/ARCHITECTURE.md, checked on every source file.

`errors, config, metrics` <- `_native` <- `proto, journal, entrylog, index` <- `bookie`
<- `server`; `meta` <- `client` <- `replication`; `server` may start `replication`;
`spark/` imports only pure format modules and `meta` through its public API (no `_native`,
no kazoo, no server). kazoo is imported only in `bk.meta`, lmdb only in `bk.index`.

Covered: every .py, .pyx, .pxd and .pxi under bk/ (cli/ and testing/ included), spark/ and
fuzz/; absolute and relative imports (`from . import x`, `from ..proto import y`), `cimport`,
and imports inside functions (a lazy import is still a dependency). `from pkg import name`
counts as an import of `pkg.name` when that is a module. Dynamic imports
(importlib.import_module with a computed name) are not seen.

KNOWN_VIOLATIONS lists the imports that break the rule today, each with the issue 29 part that
removes it; the list is exact (a fixed one must leave the list too), so it only shrinks.
"""
import ast
import pathlib
import re
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
ROOT = REPO / "bk"
SOURCE_SUFFIXES = (".py", ".pyx", ".pxd", ".pxi")

# Modules at the bottom that every layer may import. `formats` is issue 29's leaf package of wire
# and disk layouts (it imports nothing else from bk); fileio and eventloop are the file layer and
# the loop selector, both below everything that does I/O.
BASE = {"errors", "config", "fileio", "eventloop", "metrics", "formats"}
_STORAGE = BASE | {"_native", "proto", "journal", "entrylog", "index", "bookie"}
_BK_LAYERS = _STORAGE | {"server", "meta", "client", "replication"}

ALLOWED = {
    "bk": set(),  # bk/__init__.py: the version, nothing else
    "errors": set(),
    "config": {"errors"},
    "fileio": {"errors"},
    "eventloop": set(),
    "metrics": set(),
    "formats": set(),
    "_native": BASE,
    "proto": BASE | {"_native"},
    "journal": BASE | {"_native"},
    "entrylog": BASE | {"_native"},
    "index": BASE | {"_native"},
    "bookie": BASE | {"_native", "journal", "entrylog", "index", "proto"},
    "meta": BASE,
    "client": BASE | {"_native", "proto", "meta"},
    "replication": BASE | {"_native", "proto", "meta", "client"},
    # the HTTP admin server reads ledgers and runs recovery with a client, as BookKeeper's does
    "server": _STORAGE | {"meta", "client", "replication"},
    # the command line is the top: it starts bookies, AutoRecovery, the Spark job, and (standalone,
    # tests' disk faults) the shipped harness
    "cli": _BK_LAYERS | {"testing", "spark"},
    # the shipped harness drives everything but the command line; production never imports it
    "testing": _BK_LAYERS,
    # the fuzzers feed bytes to the real code and may use the harness
    "fuzz": _BK_LAYERS | {"testing"},
}
THIRD_PARTY_HOME = {"kazoo": {"meta"}, "lmdb": {"index"}, "prometheus_client": {"metrics"}, "aiohttp": {"server"},
                    "uvloop": {"eventloop"}, "pyspark": {"spark", "testing"}}

# spark/ (top level, its own layer): bk's pure format modules (bk.formats, the leaf package of
# every layout, and the two below), bk.meta's API and the CLI's progress helper; never
# bk._native, the server, the bookie or kazoo.
SPARK_ALLOWED_BK = {"bk.entrylog.usage", "bk.errors", "bk.cli.progress",
                    "bk.entrylog"}  # `from bk.entrylog import usage`: the package loads lazily
SPARK_FORBIDDEN_THIRD_PARTY = {"kazoo", "lmdb", "aiohttp", "uvloop"}


def _spark_allows_meta(name: str) -> bool:
    return name == "bk.meta" or name.startswith("bk.meta.")


def _spark_allows(name: str) -> bool:
    """bk's pure modules above, the leaf layout package bk.formats, and bk.meta's API."""
    return name in SPARK_ALLOWED_BK or _spark_allows_meta(name) or name == "bk.formats" or name.startswith("bk.formats.")


# (importing file, imported module) -> the issue 29 part that removes it. Exact: see the docstring.
# (issue 29's "One home for every format" removed the last four: the kernels' pure twins read
# bk.formats.wire, the index's log marks are bk.formats.journal.LogMark.)
KNOWN_VIOLATIONS: dict[tuple[str, str], str] = {}


def _layer_of(path: pathlib.Path) -> str:
    rel = path.relative_to(REPO)
    if rel.parts == ("bk", "__init__.py"):
        return "bk"
    if rel.parts[0] != "bk":
        return rel.parts[0]  # spark, fuzz
    return rel.parts[1] if len(rel.parts) > 2 else pathlib.Path(rel.parts[1]).stem


def _module_of(path: pathlib.Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(path: pathlib.Path) -> str:
    module = _module_of(path)
    return module if path.stem == "__init__" else module.rpartition(".")[0]


def _is_module(name: str) -> bool:
    base = REPO.joinpath(*name.split("."))
    return base.is_dir() or any(base.with_suffix(s).exists() for s in (".py", ".pyx", ".pxd"))


def _absolute(path: pathlib.Path, level: int, module: str | None) -> str:
    """The absolute name of `from <level dots><module> import ...` written in `path`."""
    if not level:
        return module or ""
    package = _package_of(path).split(".")
    if level - 1 > len(package) - 1:
        raise AssertionError(f"{path}: relative import beyond the top package")
    base = package[:len(package) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _from_names(path: pathlib.Path, level: int, module: str | None, names) -> list[str]:
    """`from X import a, b` imports X.a when that is a module, else X (the name lives in X)."""
    base = _absolute(path, level, module)
    out = []
    for name in names:
        sub = f"{base}.{name}" if base else name
        out.append(sub if name != "*" and _is_module(sub) else base)
    return out


def _python_imports(path: pathlib.Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            out.update(_from_names(path, node.level, node.module, [a.name for a in node.names]))
    return out


_STRINGS = re.compile(r'""".*?"""|\'\'\'.*?\'\'\'', re.S)
_COMMENT = re.compile(r"#.*$", re.M)
_CY_IMPORT = re.compile(r"^[ \t]*c?import[ \t]+([^\n]+)", re.M)
_CY_FROM = re.compile(r"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+c?import[ \t]+(\([^)]*\)|[^\n]+)", re.M)


def _cython_imports(path: pathlib.Path) -> set[str]:
    """import/cimport lines of a .pyx/.pxd/.pxi (Cython is not Python: read the lines)."""
    text = _COMMENT.sub("", _STRINGS.sub("", path.read_text()))
    out = set()
    for m in _CY_IMPORT.finditer(text):
        out.update(part.split()[0] for part in m.group(1).split(","))
    for m in _CY_FROM.finditer(text):
        names = [n.split()[0] for n in m.group(3).strip("()").split(",") if n.strip()]
        out.update(_from_names(path, len(m.group(1)), m.group(2) or None, names))
    return out


def _imports(path: pathlib.Path) -> set[str]:
    return _python_imports(path) if path.suffix == ".py" else _cython_imports(path)


def _sources():
    return sorted(p for top in ("bk", "spark", "fuzz") for p in (REPO / top).rglob("*")
                  if p.suffix in SOURCE_SUFFIXES and "__pycache__" not in p.parts)


def _violations(path: pathlib.Path) -> dict[str, str]:
    """Imported module -> why it breaks the rule, for one source file."""
    layer = _layer_of(path)
    out = {}
    for name in sorted(_imports(path)):
        parts = name.split(".")
        top = parts[0]
        if top in THIRD_PARTY_HOME and layer not in THIRD_PARTY_HOME[top]:
            out[name] = f"{top} is imported only in {sorted(THIRD_PARTY_HOME[top])}"
        if layer == "spark":
            if top == "bk" and not _spark_allows(name):
                out[name] = "spark/ imports pure format modules and bk.meta only"
            elif top in SPARK_FORBIDDEN_THIRD_PARTY:
                out[name] = "spark/ never imports kazoo, lmdb, aiohttp or uvloop"
            elif top == "fuzz":
                out[name] = "spark/ never imports fuzz/"
            continue
        if top in ("spark", "fuzz") and top != layer and top not in ALLOWED[layer]:
            out[name] = f"{layer} must not import {top}/"
        if top == "bk" and len(parts) > 1:
            target = parts[1]
            if target != layer and target not in ALLOWED[layer]:
                out[name] = f"bk.{layer} imports only from {sorted(ALLOWED[layer])}"
    return out


def _rel(path: pathlib.Path) -> str:
    return str(path.relative_to(REPO))


@pytest.mark.parametrize("path", _sources(), ids=_rel)
def test_imports_follow_the_layers(path):
    layer = _layer_of(path)
    assert layer in ALLOWED or layer == "spark", f"{_rel(path)}: layer {layer} has no rule in ALLOWED"
    found = {name: why for name, why in _violations(path).items() if (_rel(path), name) not in KNOWN_VIOLATIONS}
    assert not found, f"{_rel(path)}: " + "; ".join(f"imports {n}: {w}" for n, w in found.items())


def test_known_violations_are_still_there():
    """A fixed violation leaves KNOWN_VIOLATIONS with its fix, so the list stays exact."""
    gone = [(f, name) for f, name in KNOWN_VIOLATIONS if name not in _violations(REPO / f)]
    assert not gone, f"fixed, now remove from KNOWN_VIOLATIONS: {gone}"


def test_the_reader_sees_every_kind_of_import(tmp_path, monkeypatch):
    """Relative imports resolve against the file's package; cimport and Cython's from-imports
    are read; a docstring or comment mentioning an import is not one."""
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    pkg = tmp_path / "bk" / "client"
    pkg.mkdir(parents=True)
    for mod in ("__init__.py", "x.py"):
        (pkg / mod).write_text("")
    (tmp_path / "bk" / "__init__.py").write_text("")
    (tmp_path / "bk" / "proto").mkdir()
    (tmp_path / "bk" / "proto" / "__init__.py").write_text("")
    (tmp_path / "bk" / "proto" / "layout.py").write_text("")
    src = pkg / "m.py"
    src.write_text("from . import x\nfrom .. import proto\nfrom ..proto.layout import A\n"
                   "def f():\n    from ..server import y\n")
    assert _python_imports(src) == {"bk.client.x", "bk.proto", "bk.proto.layout", "bk.server"}
    pyx = pkg / "k.pyx"
    pyx.write_text('"""from bk.cli import z"""\n# import bk.testing\ncimport cython\n'
                   "from libc.stdint cimport uint64_t\nfrom bk.proto.layout import (\n    A,\n    B)\n"
                   "from .x cimport f\nimport bk.meta.zk as zk, bk.errors\n")
    assert _cython_imports(pyx) == {"cython", "libc.stdint", "bk.proto.layout", "bk.client.x", "bk.meta.zk",
                                    "bk.errors"}
    assert _violations(src) == {"bk.server": "bk.client imports only from " + str(sorted(ALLOWED["client"]))}


def _module_path(name: str) -> pathlib.Path:
    base = REPO.joinpath(*name.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def test_what_spark_imports_from_bk_stays_pure():
    """Every bk module spark/ imports (but bk.meta's API) must not pull in _native, the server,
    the bookie, the index or kazoo itself."""
    used = {name for path in _sources() if _layer_of(path) == "spark" for name in _imports(path)
            if name.startswith("bk.") and not _spark_allows_meta(name)}
    assert used, "spark/ imports bk's format modules"
    for name in sorted(used):
        for imp in _imports(_module_path(name)):
            assert not imp.startswith(("bk._native", "bk.server", "bk.bookie", "bk.index", "kazoo", "lmdb")), \
                f"{name} imports {imp}: spark/ relies on it being pure"


def test_spark_loads_no_native_server_or_kazoo():
    """At run time too: importing spark's modules (all but the pyspark-bound ones) loads none of them."""
    import subprocess
    code = ("import sys, spark.logs, spark.metadata, spark.synth, spark.report, spark.gc_job; "
            "print([m for m in sys.modules if m.startswith(('bk._native', 'bk.server', 'bk.bookie', 'bk.index',"
            " 'kazoo', 'lmdb'))])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
