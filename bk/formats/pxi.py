"""Generates bk/_native/formats.pxi, the Cython view of bk/formats: one C enum per module.

Each module lists in CYTHON_NAMES the integers its kernels use; they become C constants with
the module's prefix (wire WL_, journal JN_, entrylog EL_, index IX_), so a kernel's literal
sizes and offsets are these names and never numbers of its own. setup.py rewrites the file
before every build (it imports this module by path: bk/formats imports nothing else from bk),
and tests/unit/test_formats.py fails when the committed copy is stale.
"""
from __future__ import annotations

from bk.formats import entrylog, index, journal, wire

PXI_PATH = ("bk", "_native", "formats.pxi")  # relative to the repository root
PREFIXES = (("WL_", wire), ("JN_", journal), ("EL_", entrylog), ("IX_", index))


def pxi_text() -> str:
    """The generated bk/_native/formats.pxi."""
    lines = ["# GENERATED from bk/formats/*.py by setup.py (bk/formats/pxi.py, pxi_text()): do not edit.",
             "# tests/unit/test_formats.py fails when this copy is stale."]
    for prefix, module in PREFIXES:
        lines += ["", f"# {module.__name__}", "cdef enum:"]
        for name in module.CYTHON_NAMES:
            value = getattr(module, name)
            if not isinstance(value, int) or not -(1 << 31) <= value < 1 << 31:
                raise ValueError(f"{module.__name__}.{name} = {value!r} is no C int for the enum")
            lines.append(f"    {prefix}{name} = {value}")
    return "\n".join(lines) + "\n"
