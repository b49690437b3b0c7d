"""Single READ_ENTRY requests (v2 and v3), pipelined, from one connection and from many.

    python -m bench.single_reads                          # 1 KiB entries, one bookie, 3 runs
    python -m bench.single_reads --runs 1 --entries 20000 --json single.json

The Java client's `readEntries` (what Pulsar's consumers call) sends one READ per entry;
bk's client does too when E != WQ. This tool sends exactly that, with its own minimal
client (bk.proto encoders, request frames built before the clock starts, one write per
batch of answers received: a closed loop of `depth` READs in flight per connection), so
the bookie, not a client library, is what is measured.

Sources, each its own ledger (written by bk's client, E=WQ=AQ=1):
- `write-cache`: entries still in the write cache (`flush_interval_ms` raised, and written
  after the filler);
- `read-cache`: a ledger pushed out to the entry logs by a filler of twice the write cache,
  read once before the timed pass (so its entries are in the read cache);
- `cold`: like read-cache, but read for the first time, the bookie's pages dropped
  (posix_fadvise DONTNEED) just before: every file's (`--cold all`: bk's LMDB index too, while
  the Java bookie's index pages stay in its heap, IndexInMemoryPageManager) or the entry
  logs' only (`--cold entry-logs`); read in entry order, so the read-ahead serves most of it.
  Each cold row has a ledger of its own.

Shapes: `1x8`, `1x100` (one connection, 8 / 100 READs in flight) and `8x8`
(8 connections, 8 each); each for v2 and v3. Per row: reads/s (median over runs) and
the median p50/p99 latency of one READ, and the bookie process's CPU time per READ
(`cpu us`: user + system, read from /proc; steadier than reads/s on a busy machine). `--java` runs the same rows against a Java
bookie too (bench.java_bookie, when present) for bk ÷ Java.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pathlib
import statistics
import sys
import time

import numpy as np

from bk.proto import ReadRequest, encode_request
from bk.proto import v3

from . import bench_base_dir
from .load import bookie_setting, local_cluster
from .procmem import read_cpu_s
from .reads import drop_page_cache, write_ledger
from .stats import latency_summary_ms, parse_size, positive_int

SHAPES = {"1x8": (1, 8), "1x100": (1, 100), "8x8": (8, 8)}
SOURCES = ("write-cache", "read-cache", "cold")
# --cold: which files' pages a cold row drops. "all" includes the index (bk's LMDB lives in the page
# cache; the Java bookie's index pages live in its heap, LedgerCache, where no drop reaches them);
# "entry-logs" drops the entries' files only, both bookies' (*.log), as a bookie long up has it.
COLD_SUFFIX = {"all": "", "entry-logs": ".log"}
_V2_READ_RESPONSE_FIXED = 4 + 4 + 16  # header, rc, ledger id, entry id


def v2_frames(ledger_id: int, ids) -> list[bytes]:
    return [encode_request(ReadRequest(0, ledger_id, e)) for e in ids]


def v3_frames(ledger_id: int, ids, txn0: int = 1) -> list[bytes]:
    out = []
    for i, e in enumerate(ids):
        req = v3.Request()
        req.header.version = v3.PROTOCOL_VERSION_V3
        req.header.operation = v3.OperationType.READ_ENTRY
        req.header.txnId = txn0 + i
        req.readRequest.ledgerId = ledger_id
        req.readRequest.entryId = e
        out.append(v3.frame(req))
    return out


class _Reader(asyncio.Protocol):
    """A closed loop of `depth` READs: every answer received lets one more request go (sent
    together, once per data_received). Answers are checked for status and size."""

    def __init__(self, frames: list[bytes], first: int, depth: int, entry_size: int, version: int, done: asyncio.Future):
        self.frames = frames
        self.first = first
        self.depth = depth
        self.entry_size = entry_size
        self.version = version
        self.done = done
        self.next = 0
        self.answered = 0
        self.buf = bytearray()
        self.sent_at: list[float] = [0.0] * len(frames)
        self.latencies: list[float] = []
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def start(self) -> None:
        self._send(self.depth)

    def _send(self, n: int) -> None:
        a, b = self.next, min(self.next + n, len(self.frames))
        if a >= b:
            return
        now = time.perf_counter()
        sent_at = self.sent_at
        for i in range(a, b):
            sent_at[i] = now
        self.next = b
        self.transport.write(b"".join(self.frames[a:b]))

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos, n, got = 0, len(buf), 0
        now = time.perf_counter()
        lat = self.latencies
        while n - pos >= 4:
            ln = int.from_bytes(buf[pos:pos + 4], "big")
            if n - pos - 4 < ln:
                break
            body = memoryview(buf)[pos + 4:pos + 4 + ln]
            self._check(body)
            if self.version == 2:
                lat.append(now - self.sent_at[int.from_bytes(body[16:24], "big") - self.first])
            del body
            pos += 4 + ln
            got += 1
        if pos:
            del buf[:pos]
        # v3: latency from the send of the oldest unanswered request (answers may overtake
        # each other: a cache hit passes a miss), v2: from the send of the entry's own request
        if self.version != 2:
            for i in range(self.answered, self.answered + got):
                lat.append(now - self.sent_at[i])
        self.answered += got
        if self.answered >= len(self.frames):
            if not self.done.done():
                self.done.set_result(None)
            return
        self._send(got)

    def _check(self, body: memoryview) -> None:
        if self.version == 2:
            rc = int.from_bytes(body[4:8], "big", signed=True)
            if rc != 0 or len(body) < _V2_READ_RESPONSE_FIXED + self.entry_size:  # + the entry's header
                self._fail(f"v2 READ answer rc={rc} length={len(body)}")
        elif self.answered % 64 == 0:  # parsing every v3 answer would measure protobuf
            resp = v3.parse(v3.Response, body)
            if resp.status != 0 or len(resp.readResponse.body) < self.entry_size:
                self._fail(f"v3 READ answer status={resp.status} body={len(resp.readResponse.body)}")

    def _fail(self, why: str) -> None:
        if not self.done.done():
            self.done.set_exception(AssertionError(why))
        self.transport.close()

    def connection_lost(self, exc) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"connection lost after {self.answered} answers: {exc}"))


async def read_pass(host: str, port: int, ledger_id: int, first: int, count: int, version: int, shape: str,
                    entry_size: int) -> dict:
    """Read entries first..first+count-1 once, split in order over the shape's connections."""
    conns, depth = SHAPES[shape]
    loop = asyncio.get_running_loop()
    per = count // conns
    readers = []
    for c in range(conns):
        ids = range(first + c * per, first + (c + 1) * per)
        frames = v2_frames(ledger_id, ids) if version == 2 else v3_frames(ledger_id, ids)
        done = loop.create_future()
        _, proto = await loop.create_connection(lambda f=frames, d=done, a=ids[0]: _Reader(f, a, depth, entry_size, version, d),
                                                host, port)
        readers.append(proto)
    t0 = time.perf_counter()
    for r in readers:
        r.start()
    try:
        await asyncio.wait_for(asyncio.gather(*(r.done for r in readers)), 120)
    finally:
        elapsed = time.perf_counter() - t0
        for r in readers:
            r.transport.close()
    lat = np.asarray([x for r in readers for x in r.latencies], dtype=np.float64)
    return {"reads": per * conns, "elapsed_s": elapsed, "reads_per_s": per * conns / elapsed,
            "latency_ms": latency_summary_ms(lat)}


def row_keys(versions, shapes, sources):
    return [(src, f"v{v}", shape) for src in sources for v in versions for shape in shapes]


async def run_once(target: tuple, args, keys) -> dict:
    """One run against `target` (metadata_uri, bookie_id, data_dir, pid): fresh ledgers for every
    row, then the rows in order. Returns {key: result}, each with the bookie process's CPU time
    per read (us): on a loaded machine a steadier figure than reads/s."""
    from bk.client import BookKeeper

    size = args.entry_size
    payload = os.urandom(size)
    n = args.entries
    metadata_uri, bookie_id, data_dir, pid = target
    host, _, port = bookie_id.rpartition(":")
    out = {}
    async with BookKeeper(metadata_uri) as bkc:
        pushed = {k: await write_ledger(bkc, payload, n, 200) for k in keys if k[0] != "write-cache"}
        if pushed:  # a filler of twice the write cache pushes them out to the entry logs
            await write_ledger(bkc, payload, 2 * args.write_cache // size + 1, 200)
        hot = await write_ledger(bkc, payload, n, 200)
        await asyncio.sleep(1.0)  # the checkpoint that moved the ledgers out has synced the logs
        for key in keys:
            src, ver, shape = key
            version = int(ver[1:])
            if src == "write-cache":
                ledger = hot
            else:
                ledger = pushed[key]
                if src == "read-cache":
                    await read_pass(host, port, ledger, 0, n, 2, "1x100", size)
                else:
                    drop_page_cache(data_dir, COLD_SUFFIX[args.cold])
            print(f"  reading {src} {ver} {shape}", file=sys.stderr, flush=True)
            cpu0 = read_cpu_s(pid)
            out[key] = r = await read_pass(host, port, ledger, 0, n, version, shape, size)
            r["server_cpu_us_per_read"] = (read_cpu_s(pid) - cpu0) * 1e6 / r["reads"]
            print(f"  {target[1]} {src:11} {ver} {shape:5} {r['reads_per_s']:10,.0f}/s p50 {r['latency_ms']['p50']:.2f}"
                  f" p99 {r['latency_ms']['p99']:.2f} ms, server {r['server_cpu_us_per_read']:.1f} us CPU/read", file=sys.stderr)
    return out


def summarize(runs: list[dict], keys, system: str) -> list[dict]:
    rows = []
    for key in keys:
        rs = [r[key] for r in runs]
        rows.append({"system": system, "source": key[0], "protocol": key[1], "shape": key[2],
                     "reads_per_s": statistics.median(r["reads_per_s"] for r in rs),
                     "runs": [r["reads_per_s"] for r in rs],
                     "server_cpu_us_per_read": statistics.median(r["server_cpu_us_per_read"] for r in rs),
                     "p50_ms": statistics.median(r["latency_ms"]["p50"] for r in rs),
                     "p99_ms": statistics.median(r["latency_ms"]["p99"] for r in rs)})
    return rows


def format_table(rows: list[dict], java: dict | None = None) -> str:
    """bk's rows; with `java` ({(source, protocol, shape): row}) its reads/s and p50/p99 beside
    them, and bk ÷ Java."""
    head = f"{'source':12} {'proto':5} {'shape':6} {'bk reads/s':>10} {'p50 ms':>7} {'p99 ms':>7} {'cpu us':>6}"
    if java:
        head += f" {'Java reads/s':>12} {'p50 ms':>7} {'p99 ms':>7} {'cpu us':>6} {'bk/Java':>7}"
    lines = [head + "  bk runs"]
    for r in rows:
        line = (f"{r['source']:12} {r['protocol']:5} {r['shape']:6} {r['reads_per_s']:10,.0f}"
                f" {r['p50_ms']:7.2f} {r['p99_ms']:7.2f} {r['server_cpu_us_per_read']:6.1f}")
        j = (java or {}).get((r["source"], r["protocol"], r["shape"]))
        if j:
            line += (f" {j['reads_per_s']:12,.0f} {j['p50_ms']:7.2f} {j['p99_ms']:7.2f} {j['server_cpu_us_per_read']:6.1f}"
                     f" {r['reads_per_s'] / j['reads_per_s']:7.2f}")
        lines.append(line + "  " + " ".join(f"{x:,.0f}" for x in r["runs"]))
    return "\n".join(lines)


@contextlib.contextmanager
def java_bookie(cluster, base: str, write_cache: int):
    """A Java bookie (../shared/java-bookkeeper, tests/interop's helpers) on the cluster's
    ZooKeeper under a metadata root of its own; yields its (metadata_uri, bookie_id, data_dir)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "interop"))
    import interop_support as ji

    connect = cluster.metadata_uri.removeprefix("zk://").rpartition("/")[0]
    uri = f"zk://{connect}/java-ledgers"
    ji.format_root(uri)
    jb = ji.JavaBookie(uri, pathlib.Path(base) / "java-0", ji.DEFAULT_RELEASE)
    jb.start()
    try:
        ji.wait_registered(uri, [jb])
        yield uri, jb.bookie_id, str(jb.directory), jb.proc.pid
    finally:
        jb.stop()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.single_reads", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--entry-size", type=parse_size, default=1024)
    p.add_argument("--entries", type=positive_int, default=20_000, help="entries read per row")
    p.add_argument("--runs", type=positive_int, default=3)
    p.add_argument("--versions", default="2,3")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--sources", default=",".join(SOURCES))
    p.add_argument("--write-cache", type=parse_size, default=32 * 1024 * 1024)
    p.add_argument("--bookie-set", type=bookie_setting, action="append", default=[], metavar="KEY=VALUE",
                   help="a bookie setting (repeatable)")
    p.add_argument("--java", action="store_true", help="the same rows against a Java bookie too, runs alternated")
    p.add_argument("--cold", choices=sorted(COLD_SUFFIX), default="all",
                   help="what a cold row drops from the page cache: every file of the bookie (default; bk's "
                        "LMDB index included, the Java bookie's index pages stay in its heap) or its entry "
                        "logs only")
    p.add_argument("--warm-up-runs", type=int, default=1, metavar="N",
                   help="untimed runs of every row on each bookie first (default 1): the Java bookie's JIT "
                        "compiles its read path during the first one (117 us of CPU per READ against 30-50 warm)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    keys = row_keys([int(v) for v in args.versions.split(",")], args.shapes.split(","), args.sources.split(","))
    from bk import eventloop
    print(f"starting a LocalCluster with 1 bookie under {bench_base_dir()}; load {os.getloadavg()}",
          file=sys.stderr)
    settings = {"flush_interval_ms": 600_000, "write_cache_max_size_bytes": args.write_cache,
                **dict(args.bookie_set)}
    runs, java_runs = [], []
    with local_cluster(1, prefix="sreads", **settings) as cluster, contextlib.ExitStack() as stack:
        bk_target = (cluster.metadata_uri, cluster.bookies[0].bookie_id, os.path.join(cluster.data_dir, "bookie-0"),
                     cluster.bookies[0].proc.pid)
        java_target = stack.enter_context(java_bookie(cluster, cluster.data_dir, args.write_cache)) \
            if args.java else None
        for i in range(args.warm_up_runs):
            print(f"warm-up run {i + 1}/{args.warm_up_runs} (not counted)", file=sys.stderr)
            for target in (bk_target, java_target):
                if target is not None:
                    eventloop.run(run_once(target, args, keys))
        for i in range(args.runs):
            print(f"run {i + 1}/{args.runs}", file=sys.stderr)
            # alternated: which system goes first changes every run
            order = [bk_target, java_target] if i % 2 == 0 else [java_target, bk_target]
            for target in order:
                if target is not None:
                    (runs if target is bk_target else java_runs).append(
                        eventloop.run(run_once(target, args, keys)))
    rows = summarize(runs, keys, "bk")
    java_rows = summarize(java_runs, keys, "java") if java_runs else []
    print(f"single READs, {args.entry_size} B entries, {args.entries} per row, medians of {args.runs};"
          f" load after {os.getloadavg()}")
    print(format_table(rows, {(r["source"], r["protocol"], r["shape"]): r for r in java_rows}))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"spec": vars(args) | {"bookie_set": dict(args.bookie_set)}, "rows": rows + java_rows},
                      fh, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
