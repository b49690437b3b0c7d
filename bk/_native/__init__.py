"""The one place that chooses native (Cython) or pure-Python byte kernels.

A kernel NAME lives in `bk/_native/_NAME.pyx` (compiled to `bk._native._NAME`)
with a pure twin `bk/_native/NAME_py.py` exposing the same functions. The one
kernel outside bk/_native is the client's add path, `bk/client/_core.pyx` with
its twin `bk/client/core_py.py` (domain objects, so it lives with the client).
`BK_NO_NATIVE=1` forces the twins; `BK_REQUIRE_NATIVE=1` makes a missing
compiled module an ImportError instead of a silent fallback.

One native module has no twin: the bookie's io_uring (`bk/bookie/_ring.pyx`, built only
where liburing is). `load_optional` gives it or None; its callers then take another path
(the bookie's read threads), and `BK_NO_NATIVE=1` chooses that path too.
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType

_chosen: dict[str, str] = {}


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def load_pure(name: str, package: str = "bk._native") -> ModuleType:
    return importlib.import_module(f"{package}.{name}_py")


def load_native(name: str, package: str = "bk._native") -> ModuleType | None:
    """The compiled kernel, or None when it was not built."""
    try:
        return importlib.import_module(f"{package}._{name}")
    except ImportError:
        return None


def load(name: str, package: str = "bk._native") -> ModuleType:
    """Kernel NAME of `package` (bk._native's byte kernels; bk.client's add path as `core`)."""
    if _flag("BK_NO_NATIVE"):
        _chosen[name] = "pure"
        return load_pure(name, package)
    mod = load_native(name, package)
    if mod is None:
        if _flag("BK_REQUIRE_NATIVE"):
            raise ImportError(
                f"native kernel {package}._{name} is not built and BK_REQUIRE_NATIVE=1; "
                "run `pip install -e .` with Cython and a C compiler"
            )
        _chosen[name] = "pure"
        return load_pure(name, package)
    _chosen[name] = "native"
    return mod


def load_optional(name: str, package: str) -> ModuleType | None:
    """A native module without a pure twin, or None (not built, or BK_NO_NATIVE=1)."""
    mod = None if _flag("BK_NO_NATIVE") else load_native(name, package)
    _chosen[name] = "native" if mod is not None else "absent"
    return mod


def chosen() -> dict[str, str]:
    """Which implementation each loaded kernel uses (for logs and benchmarks)."""
    return dict(_chosen)
