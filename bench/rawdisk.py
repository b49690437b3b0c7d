"""The disk alone: sequential write + fdatasync of the same bytes, in groups.

    python -m bench.rawdisk --entry-size 1024 --in-flight 1000 --duration-s 5

This is the physical limit a durable log on this disk works against. A bookie
with its journal on acknowledges an add once the journal group holding it is
fsynced; with `in_flight` adds outstanding a group can hold at most
in_flight x entry_size bytes, and the journal caps a group at
`journal_buffered_writes_threshold_bytes` (512 KiB). So the disk is written in
groups of `group_bytes(entry_size, in_flight)` = min(in_flight x entry_size,
512 KiB), rounded down to whole entries (at least one), each followed by
fdatasync, into one file that grows (no preallocation, as the journal's
first pass over a new file), and, as the journal does by default
(`journal_remove_pages_from_cache`), the synced whole pages are dropped from
the page cache after each fdatasync (`--keep-pages` keeps them: on this VM
writing into fresh page-cache pages costs 3x the CPU and a third of the
throughput). Entries/s = bytes/s / entry_size; the latency is
the write + fdatasync time of one group: what every entry of the group waits.

Payload bytes only: the bookie also writes record headers, the entry's
BookKeeper header and digest, so bk/raw slightly flatters the disk.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from . import bench_base_dir
from .stats import MB, human_size, latency_summary_ms, parse_size, positive_float, positive_int, rate

GROUP_CAP_BYTES = 512 * 1024  # the journal's journal_buffered_writes_threshold_bytes default


def group_bytes(entry_size: int, in_flight: int, cap_bytes: int = GROUP_CAP_BYTES) -> int:
    """Bytes per write+fdatasync: what `in_flight` outstanding entries can fill, capped, whole entries."""
    if entry_size < 1 or in_flight < 1 or cap_bytes < 1:
        raise ValueError(f"entry_size, in_flight and cap_bytes must be >= 1 ({entry_size}, {in_flight}, {cap_bytes})")
    entries = max(1, min(in_flight, cap_bytes // entry_size))
    return entries * entry_size


def run_raw_disk(entry_size: int, in_flight: int, duration_s: float, directory: str | None = None,
                 cap_bytes: int = GROUP_CAP_BYTES, drop_pages: bool = True) -> dict:
    """Write + fdatasync groups for `duration_s` into a scratch file under `directory` (removed after)."""
    directory = directory or bench_base_dir()
    size = group_bytes(entry_size, in_flight, cap_bytes)
    buf = os.urandom(size)
    path = os.path.join(directory, f"rawdisk-{os.getpid()}-{time.monotonic_ns()}.dat")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    latencies = []
    written = dropped = 0
    perf = time.perf_counter
    try:
        cpu0, t0 = time.process_time(), perf()
        deadline = t0 + duration_s
        now = t0
        while now < deadline:
            view = memoryview(buf)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fdatasync(fd)
            written += size
            if drop_pages and written - dropped >= 4096:  # whole pages, as the journal
                end = written & ~4095
                os.posix_fadvise(fd, dropped, end - dropped, os.POSIX_FADV_DONTNEED)
                dropped = end
            t = perf()
            latencies.append(t - now)
            now = t
        elapsed = now - t0
        cpu_s = time.process_time() - cpu0
    finally:
        os.close(fd)
        os.unlink(path)
    entries = written // entry_size
    return {"system": "raw-disk", "entry_size": entry_size, "group_bytes": size, "groups": len(latencies),
            "entries": entries, "bytes": written, "elapsed_s": elapsed, "entries_per_s": rate(entries, elapsed),
            "mb_per_s": rate(written, elapsed) / MB,
            "latency_ms": latency_summary_ms(np.asarray(latencies)), "latency_unit": "group write+fdatasync",
            "drop_pages": drop_pages,
            "client_cpu_pct": 100.0 * rate(cpu_s, elapsed)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rawdisk", description=__doc__.split("\n\n")[0])
    p.add_argument("--entry-size", type=parse_size, default=1024)
    p.add_argument("--in-flight", type=positive_int, default=1000)
    p.add_argument("--duration-s", type=positive_float, default=5.0)
    p.add_argument("--dir", default=None, help="where to write (default: BK_BENCH_DIR or <repo>/.bench-tmp)")
    p.add_argument("--keep-pages", action="store_true",
                   help="keep written pages in the page cache (default: drop them after each fdatasync, as the journal)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    if args.entry_size < 1:
        p.error("--entry-size must be >= 1")
    r = run_raw_disk(args.entry_size, args.in_flight, args.duration_s, args.dir, drop_pages=not args.keep_pages)
    lat = r["latency_ms"]
    print(f"raw disk: {human_size(r['entry_size'])} entries in groups of {human_size(r['group_bytes'])}:"
          f" {r['entries_per_s']:,.0f} entries/s, {r['mb_per_s']:.1f} MB/s; group write+fdatasync ms"
          f" p50 {lat['p50']:.2f} p99 {lat['p99']:.2f} ({r['groups']} groups in {r['elapsed_s']:.2f} s"
          f"{', pages kept in the page cache' if args.keep_pages else ''})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(r, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
