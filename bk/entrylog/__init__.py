"""Append-only entry logs: EntryLogger (writer + readers), LogScan, usage figures.

The byte formats are bk/formats/entrylog.py's. The names below load lazily, so
`import bk.entrylog.usage` (the pure module an outside reader such as spark/ uses)
never loads the native kernels that the EntryLogger needs.
"""
import importlib

_EXPORTS = {
    "EntryLogger": "logger", "DiskUsage": "logger",
    "LogScan": "files", "SCAN_CLEAN": "files", "SCAN_TRUNCATED": "files", "SCAN_BAD_SIZE": "files",
    "SCAN_REASONS": "files",
    "make_location": "format", "split_location": "format",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'bk.entrylog' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"bk.entrylog.{module}"), name)
    globals()[name] = value
    return value
