"""Load generator: adds (and optionally reads back) against a bookie or a cluster.

    python -m bench.load                                   # own 1-bookie LocalCluster, 10 s of 1 KiB adds
    python -m bench.load --metadata-uri zk://127.0.0.1:2181/ledgers --count 200000 --entry-size 100
    python -m bench.load --bookies 3 --ensemble 3 --write-quorum 2 --ack-quorum 2 --writers 2 --reads
    python -m bench.load --no-journal --json out.json

Each writer (one process per `--writers`, one BookKeeper client each) creates
`--ledgers` ledgers and keeps `--in-flight` adds outstanding across them
(round-robin), for `--duration-s` seconds or until `--count` adds (in total,
over all writers) were issued. An add's latency is perf_counter() from just
before `async_add_entry` (so it includes the client's framing and digest) to
the moment its completion callback runs. Throughput is acknowledged adds over
the time from the common start to the last acknowledgement (writers start
together behind a barrier; perf_counter is CLOCK_MONOTONIC, shared by
processes). One warm-up add per ledger (connections, first metadata) is done
before the clock starts and is not counted. Every entry carries the same
random payload. With `--reads` the ledgers are closed and read back in
ranges (`READ_CHUNK_ENTRIES` per call, in_flight/READ_CHUNK_ENTRIES calls
outstanding), checking every payload; read latency is per range call.

Without `--metadata-uri` a LocalCluster (real ZooKeeper + `--bookies`
bookie processes, bookie cache sizes at the bookie defaults) is started under
<repo>/.bench-tmp and removed at the end; the bookies' peak RSS and their CPU
over the add window are reported, and the writer's own CPU always is.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import multiprocessing
import os
import shutil
import sys
import time
import tomllib
from functools import partial

import numpy as np

from . import bench_base_dir, child_env, scratch_dir
from .diskstats import BlockDevice
from .procmem import RssSampler
from .stats import MB, human_size, latency_summary_ms, parse_size, positive_float, positive_int, rate

READ_CHUNK_ENTRIES = 256
DEFAULT_DURATION_S = 10.0
# LocalCluster sizes its caches for tests (32 MiB); a benchmark runs the bookie's own defaults.
BENCH_BOOKIE_SETTINGS = {"write_cache_max_size_bytes": "64MiB", "read_cache_max_size_bytes": "64MiB"}
ADD_WINDOW = ("adds_start", "adds_end")  # the RssSampler marks run_writer sets
DRAIN_TIMEOUT_S = 60.0  # the client times an add out after 10 s; this only bounds a wedged run
WRITER_START_TIMEOUT_S = 120.0


PACE_MIN_SLEEP_S = 0.001


@dataclasses.dataclass(frozen=True)
class LoadSpec:
    duration_s: float | None = None  # at most one of duration_s / count; neither means 10 s
    count: int | None = None  # adds (run_load splits it over the writers)
    entry_size: int = 1024
    ledgers: int = 1
    in_flight: int = 1000  # per writer, over all its ledgers
    ensemble: int = 1
    write_quorum: int = 1
    ack_quorum: int = 1
    reads: bool = False
    digest_type: str = "CRC32C"
    rate: float | None = None  # adds/s per writer on a fixed schedule (open loop); None = as fast as possible
    client: tuple = ()  # (name, value) pairs of BookKeeper(...) options: protocol, tls_trust_store, ...

    def __post_init__(self):
        if self.duration_s is None and self.count is None:
            object.__setattr__(self, "duration_s", DEFAULT_DURATION_S)
        if self.duration_s is not None and self.count is not None:
            raise ValueError("give duration_s or count, not both")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")
        if self.count is not None and self.count < 1:
            raise ValueError(f"count must be >= 1, got {self.count}")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be > 0, got {self.rate}")
        for name in ("entry_size", "ledgers", "in_flight", "ensemble", "write_quorum", "ack_quorum"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.ack_quorum <= self.write_quorum <= self.ensemble:
            raise ValueError(f"need ack quorum <= write quorum <= ensemble, got"
                             f" E={self.ensemble} WQ={self.write_quorum} AQ={self.ack_quorum}")


# ---------------------------------------------------------------- one writer
async def run_writer(metadata_uri: str, spec: LoadSpec, *, start_barrier=None, on_mark=None) -> dict:
    """One BookKeeper client driving `spec`; returns raw figures (numpy latency arrays, seconds).

    `on_mark(label)`, if given, is called with "adds_start" and "adds_end" at the
    edges of the measured window (RssSampler.mark, for the servers' CPU)."""
    from bk import eventloop
    from bk.client import BookKeeper
    from bk.errors import BKError

    loop = asyncio.get_running_loop()
    payload = os.urandom(spec.entry_size)
    perf = time.perf_counter
    marks = [("begin", perf())]  # phase boundaries: a slow set-up or tear-down shows in "phases_s"
    async with BookKeeper(metadata_uri, **dict(spec.client)) as bkc:
        marks.append(("connect", perf()))
        handles = [await bkc.create_ledger(spec.ensemble, spec.write_quorum, spec.ack_quorum,
                                           digest_type=spec.digest_type, password=b"")
                   for _ in range(spec.ledgers)]
        marks.append(("create", perf()))
        await asyncio.gather(*(lh.add_entry(payload) for lh in handles))  # warm-up, not counted
        marks.append(("warm_up", perf()))
        if start_barrier is not None:
            await loop.run_in_executor(None, start_barrier.wait)

        # Adds use the callback form of async_add_entry (no future per add); each
        # ledger's entry ids are consecutive, so issue times are kept per ledger by id.
        issue_t: list[list[float]] = [[] for _ in handles]
        sent_t: list[list[float]] = [[] for _ in handles]  # paced runs only: when each add left
        service: list[float] = []  # paced runs only: ack - left (without the generator's lag)
        paced = bool(spec.rate)
        first_id = [lh.last_add_pushed + 1 for lh in handles]
        latencies: list[float] = []
        done_t: list[float] = []
        state = {"errors": 0, "error": None, "waiter": None}
        inflight = 0  # adds issued and not completed (closure cells: the hot counters stay off dict lookups)

        def done(li, entry_id, err):
            nonlocal inflight
            inflight -= 1
            if err is None:
                t = perf()
                done_t.append(t)
                k = entry_id - first_id[li]
                latencies.append(t - issue_t[li][k])
                if paced:
                    service.append(t - sent_t[li][k])
            else:
                state["errors"] += 1
                if state["error"] is None:
                    state["error"] = repr(err)
            waiter = state["waiter"]
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

        callbacks = [partial(done, li) for li in range(len(handles))]

        async def wait_for_completion(timeout_s: float | None = None) -> None:
            # The waiter is registered before this coroutine first yields, so a completion
            # arriving at any later point wakes it. (Wrapping this coroutine in
            # asyncio.wait_for would run it as a task one loop step later: the last
            # completion could slip in before the waiter exists and the drain would
            # sleep until its timeout.)
            state["waiter"] = waiter = loop.create_future()
            try:
                if timeout_s is None:
                    await waiter
                else:
                    await asyncio.wait_for(waiter, timeout_s)
            finally:
                state["waiter"] = None

        depth, n_ledgers = spec.in_flight, len(handles)
        remaining = spec.count if spec.count is not None else float("inf")
        if on_mark is not None:
            on_mark("adds_start")
        eventloop.tune_gc()  # what a long-running writer does after start-up (docs/BENCHMARKS.md)
        cpu0, t0 = time.process_time(), perf()
        deadline = t0 + spec.duration_s if spec.duration_s is not None else float("inf")
        seq = 0
        interval_s = 1.0 / spec.rate if spec.rate else 0.0
        pacing_lag: list[float] = []  # paced: how late each add left (the generator's own delay)
        while remaining > 0 and state["errors"] == 0:
            if inflight >= depth:
                await wait_for_completion()
                continue
            now = perf()
            if now >= deadline:
                break
            li = seq % n_ledgers
            if interval_s:
                # Open loop: add number `seq` is due at t0 + seq * interval. Its latency
                # counts from when it was due, not when it left, so a stall of the
                # system is charged to every add it delayed (no coordinated omission).
                due = t0 + seq * interval_s
                if due > now:
                    # the loop's timers have ~1 ms resolution: sleep at least that long
                    # (adds then leave in small bursts) instead of spinning on shorter sleeps
                    await asyncio.sleep(max(due - now, PACE_MIN_SLEEP_S))
                    continue
                pacing_lag.append(now - due)
                sent_t[li].append(now)
                now = due
            issue_t[li].append(now)
            try:
                handles[li].async_add_entry(payload, callbacks[li])
            except BKError as e:  # the ledger can take no more adds (fenced, closed, no bookies)
                state["errors"] += 1
                state["error"] = state["error"] or repr(e)
                break
            inflight += 1
            seq += 1
            remaining -= 1
        drain_deadline = perf() + DRAIN_TIMEOUT_S
        while inflight > 0 and perf() < drain_deadline:
            with contextlib.suppress(asyncio.TimeoutError):
                await wait_for_completion(max(0.0, drain_deadline - perf()))
        if inflight > 0:
            state["errors"] += inflight
            state["error"] = state["error"] or f"{inflight} adds unanswered after {DRAIN_TIMEOUT_S} s"
        t_end = max(done_t) if done_t else t0
        cpu_s = time.process_time() - cpu0
        if on_mark is not None:
            on_mark("adds_end")
        marks.append(("adds", perf()))
        latency_s = np.asarray(latencies, dtype=np.float64)
        for lh in handles:
            with contextlib.suppress(BKError):
                await lh.close()
        marks.append(("close_ledgers", perf()))
        reads = await read_back(bkc, handles, payload, spec) if spec.reads else None
        marks.append(("reads", perf()))
    marks.append(("close_client", perf()))
    phases_s = {name: t - marks[i][1] for i, (name, t) in enumerate(marks[1:])}
    return {"t_start": t0, "t_end": t_end, "cpu_s": cpu_s, "entries": len(done_t), "errors": state["errors"],
            "error": state["error"], "latency_s": latency_s, "reads": reads, "phases_s": phases_s,
            "pacing_lag_s": np.asarray(pacing_lag, dtype=np.float64),
            "service_s": np.asarray(service, dtype=np.float64),
            "ledger_ids": [lh.ledger_id for lh in handles]}


async def read_back(bkc, handles, payload: bytes, spec: LoadSpec) -> dict:
    """Read every ledger back in ranges, checking every payload; per-call latency."""
    perf = time.perf_counter
    ranges = []
    for lh in handles:
        rh = await bkc.open_ledger(lh.ledger_id, password=b"")
        last = rh.last_add_confirmed
        ranges.extend((rh, first, min(first + READ_CHUNK_ENTRIES - 1, last))
                      for first in range(0, last + 1, READ_CHUNK_ENTRIES))
    latencies, counts = [], {"entries": 0, "mismatches": 0, "errors": 0, "error": None}
    queue = iter(ranges)

    async def reader():
        for rh, first, last in queue:
            t = perf()
            try:
                entries = await rh.read_entries(first, last)
            except Exception as e:  # noqa: BLE001 - reported, the other readers go on
                counts["errors"] += 1
                counts["error"] = counts["error"] or repr(e)
                continue
            latencies.append(perf() - t)
            counts["entries"] += len(entries)
            counts["mismatches"] += sum(1 for e in entries if e.data != payload)
            if len(entries) != last - first + 1:
                counts["mismatches"] += abs(last - first + 1 - len(entries))

    t0 = perf()
    await asyncio.gather(*(reader() for _ in range(max(1, spec.in_flight // READ_CHUNK_ENTRIES))))
    return {**counts, "t_start": t0, "t_end": perf(), "latency_s": np.asarray(latencies, dtype=np.float64)}


# ---------------------------------------------------------------- several writers
def _writer_process(metadata_uri: str, spec: LoadSpec, barrier, results) -> None:
    from bk import eventloop
    try:
        results.put(("ok", eventloop.run(run_writer(metadata_uri, spec, start_barrier=barrier))))
    except BaseException as e:  # noqa: BLE001 - the parent reports it
        barrier.abort()
        results.put(("error", f"{type(e).__name__}: {e}"))


def split_count(total: int, writers: int) -> list[int]:
    """`total` adds over `writers` as evenly as possible (earlier writers take the remainder)."""
    base, extra = divmod(total, writers)
    return [base + (1 if i < extra else 0) for i in range(writers)]


def run_load(metadata_uri: str, spec: LoadSpec, writers: int = 1, on_mark=None) -> dict:
    """Run `writers` writers (in this process when 1, else one process each); aggregated summary.

    `spec.count`, if set, is the total over all writers. `on_mark` (see run_writer)
    is only called with one writer: several run in other processes."""
    from bk import eventloop
    if writers < 1:
        raise ValueError(f"writers must be >= 1, got {writers}")
    if writers == 1:
        return summarize([eventloop.run(run_writer(metadata_uri, spec, on_mark=on_mark))], spec, writers)
    specs = [spec] * writers
    if spec.count is not None:
        if spec.count < writers:
            raise ValueError(f"count {spec.count} is smaller than the number of writers {writers}")
        specs = [dataclasses.replace(spec, count=c) for c in split_count(spec.count, writers)]
    ctx = multiprocessing.get_context("spawn")  # no inherited event loop, kazoo or sampler threads
    barrier = ctx.Barrier(writers, timeout=WRITER_START_TIMEOUT_S)
    results = ctx.Queue()
    procs = [ctx.Process(target=_writer_process, args=(metadata_uri, s, barrier, results), daemon=True)
             for s in specs]
    for p in procs:
        p.start()
    budget_s = WRITER_START_TIMEOUT_S + DRAIN_TIMEOUT_S + (spec.duration_s or 600.0) * 2 + (120 if spec.reads else 0)
    raw, failures = [], []
    try:
        for _ in procs:
            kind, value = results.get(timeout=budget_s)
            (raw if kind == "ok" else failures).append(value)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    if failures:
        raise RuntimeError(f"{len(failures)} of {writers} writers failed: {failures[0]}")
    return summarize(raw, spec, writers)


def summarize(raw: list[dict], spec: LoadSpec, writers: int) -> dict:
    """One summary over the writers' raw figures: totals, rates over the common window, percentiles."""
    entries = sum(r["entries"] for r in raw)
    elapsed_s = max(r["t_end"] for r in raw) - min(r["t_start"] for r in raw)
    errors = sum(r["errors"] for r in raw)
    adds = {"entries": entries, "bytes": entries * spec.entry_size, "elapsed_s": elapsed_s,
            "entries_per_s": rate(entries, elapsed_s), "mb_per_s": rate(entries * spec.entry_size, elapsed_s) / MB,
            "latency_ms": latency_summary_ms(np.concatenate([r["latency_s"] for r in raw])),
            # paced runs: how late the generator itself issued adds (part of every latency above)
            "pacing_lag_ms": (latency_summary_ms(np.concatenate([r["pacing_lag_s"] for r in raw]))
                              if spec.rate else None),
            # paced runs: from when each add left to its ack (the system, without that lag)
            "service_latency_ms": (latency_summary_ms(np.concatenate([r["service_s"] for r in raw]))
                                   if spec.rate else None),
            "errors": errors, "error": next((r["error"] for r in raw if r["error"]), None),
            # CPU of the writer processes (every thread) over the add window, 100 = one core
            "client_cpu_pct": 100.0 * rate(sum(r["cpu_s"] for r in raw), elapsed_s)}
    # the slowest writer's time in each phase (connect, create, warm_up, adds, close_ledgers, reads, close_client)
    phases = {k: max(r["phases_s"][k] for r in raw) for k in raw[0]["phases_s"]} if "phases_s" in raw[0] else {}
    out = {"spec": dataclasses.asdict(spec), "writers": writers, "adds": adds, "reads": None, "phases_s": phases,
           "ledger_ids": [i for r in raw for i in r["ledger_ids"]]}
    if spec.reads:
        rr = [r["reads"] for r in raw]
        n = sum(r["entries"] for r in rr)
        el = max(r["t_end"] for r in rr) - min(r["t_start"] for r in rr)
        out["reads"] = {"entries": n, "bytes": n * spec.entry_size, "elapsed_s": el, "entries_per_s": rate(n, el),
                        "mb_per_s": rate(n * spec.entry_size, el) / MB,
                        "latency_ms": latency_summary_ms(np.concatenate([r["latency_s"] for r in rr])),
                        "chunk_entries": READ_CHUNK_ENTRIES, "mismatches": sum(r["mismatches"] for r in rr),
                        "errors": sum(r["errors"] for r in rr),
                        "error": next((r["error"] for r in rr if r["error"]), None)}
    return out


# ---------------------------------------------------------------- own cluster
@contextlib.contextmanager
def local_cluster(bookies: int = 1, *, zk_connect: str | None = None, prefix: str = "load", **settings):
    """A LocalCluster under bench_base_dir() with the bench bookie settings; removed on exit."""
    from bk.testing.cluster import LocalCluster
    data_dir = scratch_dir(prefix)
    cluster = LocalCluster(data_dir, bookies=bookies, zk_connect=zk_connect, env=child_env(),
                           **{**BENCH_BOOKIE_SETTINGS, **settings})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def run_on_cluster(args, run, prefix: str):
    """`run(metadata_uri, args)` on the event loop against `args.metadata_uri`, else against a
    local_cluster of `args.bookies` bookies started for it; returns what it returned."""
    from bk import eventloop
    if args.metadata_uri:
        return eventloop.run(run(args.metadata_uri, args))
    print(f"starting a LocalCluster with {args.bookies} bookie(s) under {bench_base_dir()}", file=sys.stderr)
    with local_cluster(args.bookies, prefix=prefix) as cluster:
        return eventloop.run(run(cluster.metadata_uri, args))


def print_summary(summary: dict, format_table, args) -> None:
    """The table on stdout, and the summary as JSON to `args.json` when given."""
    print(format_table(summary))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=2)


def bookie_pids(cluster) -> dict:
    return {f"bookie-{i}": b.proc.pid for i, b in cluster.bookies.items() if b.proc is not None}


# ---------------------------------------------------------------- command line
def setting_value(text: str):
    """A --bookie-set value as TOML would read it (true, 42, 1.5, "x"); anything else is a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def bookie_setting(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), setting_value(value.strip())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--metadata-uri", help="an existing cluster (default: start a LocalCluster for this run)")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--duration-s", type=positive_float,
                      help=f"issue adds for this long (default {DEFAULT_DURATION_S:g})")
    when.add_argument("--count", type=positive_int, help="issue this many adds in total, then stop")
    p.add_argument("--entry-size", type=parse_size, default=1024, help="payload bytes (1024, 64KiB, ...)")
    p.add_argument("--ledgers", type=positive_int, default=1, help="ledgers per writer (round-robin)")
    p.add_argument("--in-flight", type=positive_int, default=1000, help="outstanding adds per writer")
    p.add_argument("--ensemble", type=positive_int, default=1)
    p.add_argument("--write-quorum", type=positive_int, default=1)
    p.add_argument("--ack-quorum", type=positive_int, default=1)
    p.add_argument("--writers", type=positive_int, default=1, help="writer processes")
    p.add_argument("--rate", type=positive_float, default=None, metavar="ADDS_PER_S",
                   help="total adds/s over all writers on a fixed schedule (latency at a given load: p99 at"
                        " half the peak); latency counts from when each add was due. Default: as fast as"
                        " --in-flight allows")
    p.add_argument("--reads", action="store_true", help="read every ledger back afterwards")
    p.add_argument("--json", metavar="PATH", help="write the summary as JSON here")
    own = p.add_argument_group("own cluster (no --metadata-uri)")
    own.add_argument("--bookies", type=positive_int, default=1)
    own.add_argument("--no-journal", action="store_true", help="journal_write_data = false (BP-46 journal off)")
    own.add_argument("--bookie-set", type=bookie_setting, action="append", default=[], metavar="KEY=VALUE",
                     help="a bookie setting for the started bookies (repeatable)")
    return p


def parse_args(argv=None) -> tuple[LoadSpec, argparse.Namespace]:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.entry_size < 1:
        parser.error("--entry-size must be >= 1")
    try:
        spec = LoadSpec(duration_s=args.duration_s, count=args.count, entry_size=args.entry_size, ledgers=args.ledgers,
                        in_flight=args.in_flight, ensemble=args.ensemble, write_quorum=args.write_quorum,
                        ack_quorum=args.ack_quorum, reads=args.reads,
                        rate=args.rate / args.writers if args.rate else None)
    except ValueError as e:
        parser.error(str(e))
    if args.count is not None and args.count < args.writers:
        parser.error(f"--count {args.count} is smaller than --writers {args.writers}")
    if args.metadata_uri is None and args.bookies < spec.ensemble:
        parser.error(f"--ensemble {spec.ensemble} needs at least that many --bookies (got {args.bookies})")
    if args.metadata_uri is not None and (args.no_journal or args.bookie_set or args.bookies != 1):
        parser.error("--bookies/--no-journal/--bookie-set configure the own cluster; not with --metadata-uri")
    args.settings = dict(args.bookie_set)
    if args.no_journal:
        args.settings["journal_write_data"] = False
    return spec, args


def _ms(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def _num(v, unit: str) -> str:
    return "-" if v is None else f"{v:.0f}{' ' if unit == 'MiB' else ''}{unit}"


def format_summary(summary: dict) -> str:
    s, a = summary["spec"], summary["adds"]
    how = f"{s['duration_s']:g} s" if s["duration_s"] is not None else f"{s['count']} adds"
    lines = [f"bk load: {summary['writers']} writer(s) x {s['ledgers']} ledger(s), E/WQ/AQ {s['ensemble']}/"
             f"{s['write_quorum']}/{s['ack_quorum']}, {human_size(s['entry_size'])} entries, {s['in_flight']} in"
             f" flight per writer, {how}"
             + (f", paced at {s['rate'] * summary['writers']:,.0f} adds/s" if s.get("rate") else "")]
    for name, part in (("adds", a), ("reads", summary.get("reads"))):
        if part is None:
            continue
        lat = part["latency_ms"]
        extra = f", mismatches {part['mismatches']}" if "mismatches" in part else ""
        if "client_cpu_pct" in part:
            extra += f"; client CPU {part['client_cpu_pct']:.0f}%"
        lines.append(f"{name:5}: {part['entries']} entries in {part['elapsed_s']:.2f} s = {part['entries_per_s']:,.0f}"
                     f" entries/s, {part['mb_per_s']:.1f} MB/s; latency ms p50 {_ms(lat['p50'])} p99 {_ms(lat['p99'])}"
                     f" p999 {_ms(lat['p999'])} max {_ms(lat['max'])}; errors {part['errors']}{extra}")
        if part.get("error"):
            lines.append(f"       first error: {part['error']}")
        lag = part.get("pacing_lag_ms")
        if lag:
            lines.append(f"       of which the generator's own pacing lag (add left after it was due): ms p50"
                         f" {_ms(lag['p50'])} p99 {_ms(lag['p99'])} max {_ms(lag['max'])}")
        svc = part.get("service_latency_ms")
        if svc:
            lines.append(f"       from when each add left to its ack: ms p50 {_ms(svc['p50'])} p99 {_ms(svc['p99'])}"
                         f" p999 {_ms(svc['p999'])} max {_ms(svc['max'])}")
    slow = {k: round(v, 1) for k, v in summary.get("phases_s", {}).items() if k not in ("adds", "reads") and v > 5}
    if slow:
        lines.append(f"note: slow client phases outside the measured window (s): {slow}")
    rss, cpu = summary.get("bookie_peak_rss_mib"), summary.get("bookie_cpu_pct") or {}
    if rss:
        lines.append("bookies: " + ", ".join(
            f"{k} peak RSS {_num(v, 'MiB')} CPU {_num(cpu.get(k), '%')}" for k, v in rss.items()))
    disk = summary.get("disk") or {}
    if disk.get("mb_per_s") is not None:
        lines.append(f"disk : {disk['device']} written {disk['mb_per_s']:.1f} MB/s over the add window (every"
                     " write to the device: compare with python -m bench.rawdisk)")
    return "\n".join(lines)


def main(argv=None) -> int:
    spec, args = parse_args(argv)
    if args.metadata_uri:
        summary = run_load(args.metadata_uri, spec, args.writers)
    else:
        print(f"starting a LocalCluster with {args.bookies} bookie(s) under {bench_base_dir()}", file=sys.stderr)
        with local_cluster(args.bookies, **args.settings) as cluster:
            disk = BlockDevice.of(bench_base_dir())
            with RssSampler(bookie_pids(cluster), disk=disk) as rss:
                summary = run_load(cluster.metadata_uri, spec, args.writers, on_mark=rss.mark)
            summary["bookie_peak_rss_mib"] = rss.peak_mib()
            summary["bookie_cpu_pct"] = rss.cpu_pct(between=ADD_WINDOW)
            # what the bookies' disk wrote over the add window (journal + entry logs + index + anything else)
            summary["disk"] = {"device": disk.name if disk else None, "mb_per_s": rss.disk_mb_per_s(ADD_WINDOW)}
            summary["bookie_settings"] = {**BENCH_BOOKIE_SETTINGS, **args.settings}
    print(format_summary(summary))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=2)
    failed = summary["adds"]["errors"] or (summary["reads"] and (summary["reads"]["errors"]
                                                                  or summary["reads"]["mismatches"]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
