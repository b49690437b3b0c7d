"""Reads: sequential and random, from the write cache, the read cache and the entry logs, beside the
raw disk's read rate in the same run.

    python -m bench.reads                                # 64 KiB entries, 384 MiB cold ledger, 1 bookie
    python -m bench.reads --entry-size 1KiB --cold-bytes 128MiB --json reads.json

One bookie (LocalCluster, default caches: 64 MiB write cache, 64 MiB read
cache; `flush_interval_ms` raised so that only a full write cache flushes,
which keeps what was written last in the write cache).

Every cold row reads bytes that nothing has read since they were written. On
this VM the host caches what the guest read last, past O_DIRECT and past
dropping the guest's page cache: a freshly written 1 GiB file read with
O_DIRECT ran at 1,574 MB/s, then 2,429 and 2,357 read again
(docs/BENCHMARKS.md, eleventh round). A row that re-reads bytes measures that
cache, not the disk, so each cold row gets bytes of its own. Steps:

1. write two cold ledgers of `--cold-bytes` (one for the sequential scan, one
   for random reads), then a filler ledger of twice the write cache: the cold
   ledgers are then entirely in the entry logs and the filler's last entries
   are still in the write cache;
2. drop the page cache of the bookie's entry logs (posix_fadvise DONTNEED on
   its files; they were fsynced by the checkpoint, so the pages are clean);
3. `entry-log seq`: read the first cold ledger from entry 0 in ranges of
   `--range-entries`, `--in-flight` entries outstanding (each range is a
   BATCH_READ, answered from the entry log as it lies there: one O_DIRECT read
   of the range's records, or os.sendfile when they are in the page cache;
   docs/STORAGE.md);
4. `entry-log seq again`: read again the last quarter of the read cache's size of
   that ledger. Since BATCH_READs of the entry logs bypass the read cache,
   this reads them from the entry logs again (page cache or disk); single
   READs still fill the read cache (`bench.forms --reads`);
5. `entry-log rand`: drop the page cache again, read `--random-reads` entries
   of the second cold ledger at random ids, one READ each, `--in-flight`
   outstanding;
6. `write-cache seq` / `write-cache rand`: the last quarter of the write
   cache's size of the filler ledger;
7. the disk's own read rate, each row on a file of `--cold-bytes` of its own,
   written and fsynced in the same directory and its pages dropped:
   `raw-disk seq`: front to back in 1 MiB preads, WILLNEED for 4 MiB blocks
   up to 9 MiB ahead and no kernel readahead (how the bookie read a scan
   before spans; faster here than the kernel's own readahead);
   `raw-disk seq direct`: front to back in 1 MiB O_DIRECT reads;
   `raw-disk rand` / `raw-disk rand direct`: `--random-reads` entry-size
   reads at random offsets, `--in-flight` threads (queue depth), through the
   page cache / with O_DIRECT;
8. `raw-disk logs reread`: the bookie's entry-log files read again with
   O_DIRECT - bytes the scan has just read, so what the host's cache adds
   (shown, not compared).

Per row: entries/s, MB/s (payload; MB = 10^6 bytes) and the p50/p99 of one
request (a range read for seq, one entry for rand; raw-disk: one read call).
`cold/raw` is the entry-log row's MB/s over the fastest first-read raw-disk
row of the same pattern in the run. The O_DIRECT rows are left out where the
file system refuses O_DIRECT (tmpfs).
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import errno
import json
import mmap
import os
import threading
import random
import sys
import time

import numpy as np

from bk.formats.entrylog import LOG_SUFFIX

from . import bench_base_dir, scratch_dir
from .load import bookie_setting, local_cluster
from .stats import MB, human_size, latency_summary_ms, parse_size, positive_int

RAW_SEQ_READ_BYTES = 1024 * 1024
RAW_HINT_BYTES = 4 * RAW_SEQ_READ_BYTES
RAW_HINT_AHEAD_BYTES = 9 * RAW_SEQ_READ_BYTES


def drop_page_cache(path: str, suffix: str = "") -> int:
    """posix_fadvise(DONTNEED) every file under `path` whose name ends with `suffix` (clean pages
    only go); returns files touched."""
    n = 0
    for root, _, files in os.walk(path):
        for name in files:
            if not name.endswith(suffix):
                continue
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                n += 1
            finally:
                os.close(fd)
    return n


def row(name: str, entries: int, entry_size: int, elapsed_s: float, latencies_s: list) -> dict:
    return {"name": name, "entries": entries, "elapsed_s": elapsed_s, "entries_per_s": entries / elapsed_s,
            "mb_per_s": entries * entry_size / elapsed_s / MB,
            "latency_ms": latency_summary_ms(np.asarray(latencies_s, dtype=np.float64))}


async def write_ledger(bkc, payload: bytes, count: int, in_flight: int):
    lh = await bkc.create_ledger(1, 1, 1, password=b"")
    async with lh.writer(max_in_flight=in_flight) as w:
        for _ in range(count):
            await w.add(payload)
    await lh.close()
    return lh.ledger_id


async def read_seq(rh, first: int, last: int, range_entries: int, in_flight: int, payload: bytes):
    ranges = iter(range(first, last + 1, range_entries))
    latencies: list[float] = []
    got = [0]

    async def reader() -> None:
        for a in ranges:
            t = time.perf_counter()
            entries = await rh.read_entries(a, min(a + range_entries - 1, last))
            latencies.append(time.perf_counter() - t)
            if any(e.data != payload for e in entries):
                raise AssertionError(f"payload mismatch in entries {a}..")
            got[0] += len(entries)

    t0 = time.perf_counter()
    await asyncio.gather(*(reader() for _ in range(max(1, in_flight // range_entries))))
    return got[0], time.perf_counter() - t0, latencies


async def read_random(rh, first: int, last: int, count: int, in_flight: int, payload: bytes, seed: int):
    rng = random.Random(seed)
    ids = iter([rng.randint(first, last) for _ in range(count)])
    latencies: list[float] = []

    async def reader() -> None:
        for entry_id in ids:
            t = time.perf_counter()
            entry = await rh.read_entry(entry_id)
            latencies.append(time.perf_counter() - t)
            if entry.data != payload:
                raise AssertionError(f"payload mismatch in entry {entry_id}")

    t0 = time.perf_counter()
    await asyncio.gather(*(reader() for _ in range(in_flight)))
    return count, time.perf_counter() - t0, latencies


def read_front_to_back(fd: int, latencies: list, hinted: bool = False) -> int:
    """Read a file in RAW_SEQ_READ_BYTES preads, timing each; `hinted`: WILLNEED for
    RAW_HINT_BYTES blocks up to RAW_HINT_AHEAD_BYTES ahead. Returns bytes read."""
    offset = hinted_to = 0
    while True:
        while hinted and hinted_to < offset + RAW_HINT_AHEAD_BYTES:
            os.posix_fadvise(fd, hinted_to, RAW_HINT_BYTES, os.POSIX_FADV_WILLNEED)
            hinted_to += RAW_HINT_BYTES
        t = time.perf_counter()
        data = os.pread(fd, RAW_SEQ_READ_BYTES, offset)
        latencies.append(time.perf_counter() - t)
        if not data:
            return offset
        offset += len(data)


def log_paths(data_dir: str) -> list[str]:
    """The bookie's entry-log files under data_dir, in name order."""
    return sorted(os.path.join(root, name) for root, _, files in os.walk(data_dir)
                  for name in files if name.endswith(LOG_SUFFIX))


def _open_direct(path: str) -> int | None:
    """An O_DIRECT read fd, or None where the file system refuses O_DIRECT (tmpfs: EINVAL)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError as e:
        if e.errno == errno.EINVAL:
            return None
        raise


def read_direct_front_to_back(fd: int, buf: mmap.mmap, latencies: list) -> int:
    """Read an O_DIRECT fd front to back in len(buf) reads into buf (page-aligned, reused:
    fresh memory for each read cost more CPU than the page cache's copy). Returns bytes read."""
    offset = 0
    while True:
        t = time.perf_counter()
        n = os.preadv(fd, [buf], offset)
        latencies.append(time.perf_counter() - t)
        offset += n
        if n < len(buf):  # the end (only the last read may be short: offsets stay aligned)
            return offset


def raw_log_rereads(data_dir: str, entry_size: int) -> dict | None:
    """The bookie's entry-log files read again with O_DIRECT, 1 MiB reads, one thread, right
    after the scan read them: what the host's cache of the last-read bytes adds. None on tmpfs."""
    paths = log_paths(data_dir)
    buf = mmap.mmap(-1, RAW_SEQ_READ_BYTES)
    latencies: list[float] = []
    n = 0
    t0 = time.perf_counter()
    for path in paths:
        fd = _open_direct(path)
        if fd is None:
            return None
        try:
            n += read_direct_front_to_back(fd, buf, latencies)
        finally:
            os.close(fd)
    return row("raw-disk logs reread", n // entry_size, entry_size, time.perf_counter() - t0, latencies)


@contextlib.contextmanager
def fresh_file(directory: str, name: str, total_bytes: int):
    """A file of total_bytes (random bytes, 1 MiB writes), fsynced, its pages dropped, removed
    afterwards: read by one row only, so that no row reads bytes another has just read."""
    path = os.path.join(directory, name)
    block = os.urandom(RAW_SEQ_READ_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            written = 0
            while written < total_bytes:
                written += os.write(fd, block)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        yield path
    finally:
        os.unlink(path)


def raw_seq(path: str, entry_size: int, direct: bool) -> dict | None:
    """A file front to back in 1 MiB reads: with O_DIRECT (None on tmpfs), or through the page
    cache with WILLNEED hints and no kernel readahead (read_front_to_back)."""
    fd = _open_direct(path) if direct else os.open(path, os.O_RDONLY)
    if fd is None:
        return None
    try:
        latencies: list[float] = []
        t0 = time.perf_counter()
        if direct:
            n = read_direct_front_to_back(fd, mmap.mmap(-1, RAW_SEQ_READ_BYTES), latencies)
        else:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            n = read_front_to_back(fd, latencies, hinted=True)
        name = "raw-disk seq direct" if direct else "raw-disk seq"
        return row(name, n // entry_size, entry_size, time.perf_counter() - t0, latencies)
    finally:
        os.close(fd)


def raw_random(path: str, offsets: list, entry_size: int, depth: int, direct: bool) -> dict | None:
    """Entry-size reads at `offsets`, `depth` threads: through the page cache, or with O_DIRECT
    (None on tmpfs; an entry size that is not a multiple of 4 KiB is read 4 KiB-aligned)."""
    fd = _open_direct(path) if direct else os.open(path, os.O_RDONLY)
    if fd is None:
        return None
    local = threading.local()
    latencies: list[float] = []

    def one(offset: int) -> None:
        if direct:
            start = offset & ~4095
            length = (offset + entry_size - start + 4095) & ~4095
            buf = getattr(local, "buf", None)
            if buf is None or len(buf) != length:
                buf = local.buf = mmap.mmap(-1, length)
            t = time.perf_counter()
            os.preadv(fd, [buf], start)
        else:
            t = time.perf_counter()
            os.pread(fd, entry_size, offset)
        latencies.append(time.perf_counter() - t)

    try:
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(depth) as pool:
            list(pool.map(one, offsets))
        name = "raw-disk rand direct" if direct else "raw-disk rand"
        return row(name, len(offsets), entry_size, time.perf_counter() - t0, latencies)
    finally:
        os.close(fd)


def raw_disk_reads(directory: str, total_bytes: int, entry_size: int, random_reads: int, depth: int, seed: int):
    """The disk's own read rate, each row on a fresh file: sequential 1 MiB reads through the
    page cache and with O_DIRECT, random entry-size reads through the page cache and with O_DIRECT."""
    rng = random.Random(seed)
    slots = total_bytes // entry_size
    offsets = [rng.randrange(slots) * entry_size for _ in range(random_reads)]
    rows = []
    for name, read in (("raw-seq", lambda path: raw_seq(path, entry_size, False)),
                       ("raw-seq-direct", lambda path: raw_seq(path, entry_size, True)),
                       ("raw-rand", lambda path: raw_random(path, offsets, entry_size, depth, False)),
                       ("raw-rand-direct", lambda path: raw_random(path, offsets, entry_size, depth, True))):
        with fresh_file(directory, name, total_bytes) as path:
            result = read(path)
        if result is not None:
            rows.append(result)
    return rows


async def run(cluster, args) -> list[dict]:
    from bk.client import BookKeeper

    size = args.entry_size
    payload = os.urandom(size)
    cache_bytes = 64 * 1024 * 1024  # the bookie defaults bench.load's clusters run with
    cold_count = max(1, args.cold_bytes // size)
    filler_count = 2 * cache_bytes // size
    tail = max(1, cache_bytes // 4 // size)
    data_dir = os.path.join(cluster.data_dir, "bookie-0")
    rows = []
    async with BookKeeper(cluster.metadata_uri) as bkc:
        print(f"writing 2 x {cold_count} + {filler_count} entries of {human_size(size)}", file=sys.stderr)
        cold = await write_ledger(bkc, payload, cold_count, args.in_flight)
        cold_rand = await write_ledger(bkc, payload, cold_count, args.in_flight)
        filler = await write_ledger(bkc, payload, filler_count, args.in_flight)
        await asyncio.sleep(1.0)  # the checkpoint that moved the cold ledger out has synced its entry logs
        rh = await bkc.open_ledger(cold, password=b"", recovery=False)
        last = rh.last_add_confirmed
        drop_page_cache(data_dir)
        n, s, lat = await read_seq(rh, 0, last, args.range_entries, args.in_flight, payload)
        rows.append(row("entry-log seq", n, size, s, lat))
        first = max(0, last - tail + 1)
        n, s, lat = await read_seq(rh, first, last, args.range_entries, args.in_flight, payload)
        rows.append(row("entry-log seq again", n, size, s, lat))
        drop_page_cache(data_dir)
        rr = await bkc.open_ledger(cold_rand, password=b"", recovery=False)
        n, s, lat = await read_random(rr, 0, rr.last_add_confirmed, args.random_reads, args.in_flight, payload,
                                      args.seed)
        rows.append(row("entry-log rand", n, size, s, lat))
        fh = await bkc.open_ledger(filler, password=b"", recovery=False)
        flast = fh.last_add_confirmed
        n, s, lat = await read_seq(fh, flast - tail + 1, flast, args.range_entries, args.in_flight, payload)
        rows.append(row("write-cache seq", n, size, s, lat))
        n, s, lat = await read_random(fh, flast - tail + 1, flast, min(args.random_reads, 4 * tail), args.in_flight,
                                      payload, args.seed)
        rows.append(row("write-cache rand", n, size, s, lat))
        reread = raw_log_rereads(data_dir, size)
        if reread is not None:
            rows.append(reread)
    return rows


def format_table(summary: dict) -> str:
    s = summary["spec"]
    lines = [f"bk reads: {human_size(s['entry_size'])} entries, cold ledger {human_size(s['cold_bytes'])},"
             f" {s['in_flight']} in flight, ranges of {s['range_entries']}",
             f"{'source':20} {'entries/s':>10} {'MB/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'cold/raw':>8}  raw row"]
    for r in summary["rows"]:
        lat = r["latency_ms"] or {}
        ratio = f"{r['cold_over_raw']:.2f}" if r.get("cold_over_raw") is not None else ""
        lines.append(f"{r['name']:20} {r['entries_per_s']:10,.0f} {r['mb_per_s']:8.1f} {lat.get('p50', 0):8.2f}"
                     f" {lat.get('p99', 0):8.2f} {ratio:>8}  {r.get('raw_best', '')}".rstrip())
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.reads", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--entry-size", type=parse_size, default=64 * 1024)
    p.add_argument("--cold-bytes", type=parse_size, default=384 * 1024 * 1024)
    p.add_argument("--in-flight", type=positive_int, default=64, help="entries outstanding (reads and writes)")
    p.add_argument("--range-entries", type=positive_int, default=16, help="entries per sequential range read")
    p.add_argument("--random-reads", type=positive_int, default=2000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--bookie-set", type=bookie_setting, action="append", default=[], metavar="KEY=VALUE",
                   help="a bookie setting (repeatable)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    from bk import eventloop
    print(f"starting a LocalCluster with 1 bookie under {bench_base_dir()}", file=sys.stderr)
    with local_cluster(1, prefix="reads", **{"flush_interval_ms": 600_000, **dict(args.bookie_set)}) as cluster:
        rows = eventloop.run(run(cluster, args))
    raw_dir = scratch_dir("rawread")
    try:
        raw_rows = raw_disk_reads(raw_dir, args.cold_bytes, args.entry_size, args.random_reads,
                                  args.in_flight, args.seed)
    finally:
        os.rmdir(raw_dir)
    rows += raw_rows
    by = {r["name"]: r for r in rows}
    for cold, raw_names in (("entry-log seq", ("raw-disk seq", "raw-disk seq direct")),
                            ("entry-log rand", ("raw-disk rand", "raw-disk rand direct"))):
        best = max((by[name] for name in raw_names if name in by), key=lambda r: r["mb_per_s"])
        by[cold]["cold_over_raw"] = by[cold]["mb_per_s"] / best["mb_per_s"]
        by[cold]["raw_best"] = best["name"]
    summary = {"spec": {k: getattr(args, k) for k in ("entry_size", "cold_bytes", "in_flight", "range_entries",
                                                      "random_reads")},
               "bookie_settings": dict(args.bookie_set),
               "rows": rows}
    print(format_table(summary))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
