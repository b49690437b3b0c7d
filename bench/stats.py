"""Small numeric and formatting helpers shared by the benchmark tools.

Units: latencies are recorded in seconds (time.perf_counter deltas) and
reported in milliseconds; MB is 10**6 bytes (MB/s as disks and networks quote
it); MiB (2**20) is used only for memory.
"""
from __future__ import annotations

import argparse
import math
import re
import statistics
from typing import Iterable, Sequence

import numpy as np

MB = 1_000_000
MiB = 1 << 20
PERCENTILES = (("p50", 50.0), ("p99", 99.0), ("p999", 99.9))
_SIZE_RE = re.compile(r"^\s*(\d+)\s*(b|k|kb|kib|m|mb|mib)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {None: 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": MiB, "mb": MiB, "mib": MiB}


def latency_summary_ms(latencies_s) -> dict:
    """p50/p99/p999/mean/max in milliseconds of a sequence of latencies in seconds.

    Percentiles use linear interpolation between closest ranks (numpy's default),
    so p999 of fewer than 1000 samples is an interpolation toward the maximum,
    not an observed value; `samples` says how many there were. An empty input
    gives None for every figure (nothing completed - not zero latency)."""
    arr = np.asarray(latencies_s, dtype=np.float64)
    if arr.size == 0:
        return {"samples": 0, "p50": None, "p99": None, "p999": None, "mean": None, "max": None}
    ms = arr * 1000.0
    out = {"samples": int(ms.size)}
    values = np.percentile(ms, [p for _, p in PERCENTILES])
    for (name, _), value in zip(PERCENTILES, values):
        out[name] = float(value)
    out["mean"] = float(ms.mean())
    out["max"] = float(ms.max())
    return out


def median_rows(rows: list[dict]) -> list[dict]:
    """One row per `name` (first-seen order): the median of each figure over the rounds (a figure
    missing from any round is left out), and `rounds`."""
    names = list(dict.fromkeys(r["name"] for r in rows))
    out = []
    for name in names:
        same = [r for r in rows if r["name"] == name]
        merged = {"name": name, "rounds": len(same)}
        for key in same[0]:
            if key != "name" and all(r[key] is not None for r in same):
                merged[key] = statistics.median(r[key] for r in same)
        out.append(merged)
    return out


def report_rows(rows: list[dict], format_table, args) -> list[dict]:
    """Print the medians of `rows` (median_rows) as `format_table` lays them out, and write every row,
    the medians and the settings to `args.json` when it is set; returns the medians."""
    summary = median_rows(rows)
    print(format_table(summary))
    if args.json:
        import json
        with open(args.json, "w") as fh:
            json.dump({"spec": vars(args), "rows": rows, "medians": summary}, fh, indent=2)
    return summary


def rate(count: float, elapsed_s: float) -> float:
    """count / elapsed_s, 0.0 when no time passed (never a division error)."""
    return count / elapsed_s if elapsed_s > 0 else 0.0


def median_or_none(values: Iterable) -> float | None:
    """The median of the values that are not None (None when there are none)."""
    present = [v for v in values if v is not None]
    return float(statistics.median(present)) if present else None


def spread_pct(values: Iterable) -> float | None:
    """Half the range as a percentage of the median: a plain noise figure for a few runs."""
    present = [v for v in values if v is not None]
    if len(present) < 2:
        return None
    mid = statistics.median(present)
    if mid == 0:
        return None
    return 100.0 * (max(present) - min(present)) / 2.0 / mid


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def parse_size(text: str) -> int:
    """'100', '1024', '1KiB', '64k', '1MiB' -> bytes (k/K/KiB/KB all mean 1024)."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (use bytes, or a K/KiB/M/MiB suffix)")
    unit = m.group(2).lower() if m.group(2) else None
    return int(m.group(1)) * _SIZE_UNITS[unit]


def size_list(text: str) -> list[int]:
    """An argparse type: '100,1024,64KiB' -> [100, 1024, 65536], every size > 0."""
    try:
        sizes = [parse_size(part) for part in str(text).split(",") if part.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not sizes:
        raise argparse.ArgumentTypeError("no sizes given")
    if any(s <= 0 for s in sizes):
        raise argparse.ArgumentTypeError(f"sizes must be > 0, got {text!r}")
    return sizes


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def human_size(n_bytes: int) -> str:
    """65536 -> '64KiB', 1000 -> '1000B' (exact only: no rounding that hides a size)."""
    for unit, scale in (("MiB", MiB), ("KiB", 1024)):
        if n_bytes >= scale and n_bytes % scale == 0:
            return f"{n_bytes // scale}{unit}"
    return f"{n_bytes}B"


def fmt_num(value, digits: int = 0) -> str:
    """A table cell: '-' for missing, thousands separators for big numbers."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def render_table(headers: Sequence[str], rows: Sequence[Sequence], align: str | None = None) -> str:
    """A fixed-width text table. `align` has one 'l' or 'r' per column (default:
    first column left, the rest right). Cells are str()'d; rows shorter than the
    header are padded with blanks."""
    ncol = len(headers)
    align = align or ("l" + "r" * (ncol - 1))
    if len(align) != ncol:
        raise ValueError(f"align has {len(align)} columns, headers {ncol}")
    cells = [[str(h) for h in headers]]
    for row in rows:
        if len(row) > ncol:
            raise ValueError(f"row has {len(row)} cells, headers {ncol}: {row!r}")
        cells.append([str(c) for c in row] + [""] * (ncol - len(row)))
    widths = [max(len(r[i]) for r in cells) for i in range(ncol)]

    def line(r):
        return "  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(r, widths, align)).rstrip()

    out = [line(cells[0]), "  ".join("-" * w for w in widths)]
    out.extend(line(r) for r in cells[1:])
    return "\n".join(out)
