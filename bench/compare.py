"""Side by side in one run: the raw disk, Redis, and bk bookies, same disk, sizes and depth.

    python -m bench.compare                                   # 100 B, 1 KiB, 64 KiB; 3 runs of 5 s each
    python -m bench.compare --sizes 1024 --runs 5 --duration-s 10 --in-flight 500
    python -m bench.compare --systems raw-disk,bk-1 --runs 1 --duration-s 2
    python -m bench.compare --systems bk-1 --sizes 1024 --half-peak     # + latency at half the peak
    python -m bench.compare --systems bk-1,java-bookie,bk-3,java-bookie-3 --sizes 1024,100   # against Java

Systems (SYSTEMS; `--systems` picks a subset):
  raw-disk         sequential write + fdatasync of the payload bytes in groups of
                   min(in_flight x size, 512 KiB) (bench.rawdisk): the physical limit
  redis-resp       redis-server, appendonly yes + appendfsync always, XADD from a
                   Python RESP client with a sliding window of in_flight (bench.redisbench)
  redis-benchmark  the same server config, `redis-benchmark -t set -P in_flight` (C client,
                   batch pipelining; its p99 is measured to the first reply of a batch)
  bk-1             one bookie, journal on (acks after the journal group's fsync), E=WQ=AQ=1
  bk-1-nojournal   one bookie, journal_write_data = false (BP-46), E=WQ=AQ=1
  bk-3             three bookies, journal on, E=3 WQ=2 AQ=2
  java-bookie      Apache BookKeeper's own bookie (../shared/java-bookkeeper, --java-release), E=WQ=AQ=1
  java-bookie-3    three Java bookies, E=3 WQ=2 AQ=2 (bench/java_bookie.py: JVM flags, layout)

With a Java system the run pairs it with its bk system (java-bookie with bk-1,
java-bookie-3 with bk-3, added if not asked for): every cluster of the run is
started once, before the first measurement, and stays up to the end (both
kinds up at once, the JVMs warm); each measurement writes a new ledger. The
table gets a bk÷Java column; then come the read rows (bk's client, single
READs v2/v3 at 8 and 100 in flight, and BATCH_READ where both sides have it;
write cache, read cache, cold; bench/compare_reads.py; `--no-reads`) and the
Java client's figures against both kinds (its driver; `--no-java-client`).

Everything writes under BK_BENCH_DIR or <repo>/.bench-tmp. Every (system, size,
run) gets a fresh server (a new LocalCluster on one shared ZooKeeper, each under
its own chroot; a new redis-server), so no run inherits another's files or
memory; the systems run interleaved, in an order rotated every run, so slow
phases of a noisy machine spread over all of them. bk runs use bench.load in
this process (one writer, one ledger, `in_flight` adds outstanding), like the
Redis client. The table shows medians over the runs; `±%` is half the
min..max range over the median. Peak RSS is per server process (VmRSS sampled
every 100 ms plus VmHWM at the end; for bk-3 the largest of the three). CPU is
% of one core over the measured window: `srv` summed over the server processes
(bookies, redis-server), `cli` the load generator (this process, every thread;
redis-benchmark's own process for that row; the writing loop for raw-disk).
Results: <out-dir>/compare-<time>.json and .png (the PNG needs matplotlib).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time

from . import REPO_DIR, bench_base_dir, scratch_dir
from .load import ADD_WINDOW, LoadSpec, bookie_pids, local_cluster, run_load
from .diskstats import BlockDevice
from .procmem import RssSampler
from .rawdisk import run_raw_disk
from .redisbench import REDIS_BENCHMARK_MISSING, REDIS_MISSING, RedisServer, run_redis_benchmark, run_resp_load
from .java_bookie import DEFAULT_RELEASE, JAVA_SYSTEMS, RELEASES, Fleet, render_java_client, \
    run_java_client_phase, summarize_java_client
from . import compare_reads
from .stats import fmt_num, human_size, median_or_none, positive_float, positive_int, ratio, render_table, size_list, \
    spread_pct

# system -> (label, bookies, E, WQ, AQ, bookie settings); non-bk systems have bookies None
BK_SYSTEMS = {
    "bk-1": ("bk, 1 bookie, journal on", 1, 1, 1, 1, {}),
    "bk-1-nojournal": ("bk, 1 bookie, journal off", 1, 1, 1, 1, {"journal_write_data": False}),
    "bk-3": ("bk, 3 bookies E3 WQ2 AQ2, journal on", 3, 3, 2, 2, {}),
}
SYSTEMS = ("raw-disk", "redis-resp", "redis-benchmark", *BK_SYSTEMS)  # the default set
ALL_SYSTEMS = (*SYSTEMS, *JAVA_SYSTEMS)  # the Java ones when asked for
LABELS = {"raw-disk": "raw disk, write+fdatasync groups", "redis-resp": "Redis AOF always, XADD, Python RESP client",
          "redis-benchmark": "Redis AOF always, SET, redis-benchmark -P",
          **{k: v[0] for k, v in BK_SYSTEMS.items()}, **{k: v[0] for k, v in JAVA_SYSTEMS.items()}}
SLOW_PHASE_S = 5.0  # a set-up/tear-down phase of bench.load slower than this is logged
HALF_PEAK_WINDOW_S = 0.5  # --half-peak: adds in flight allowed = rate x this (at least --in-flight)
REDIS_REFERENCE = "redis-resp"  # the Redis figure bk is divided by: a Python client like bk's
MATPLOTLIB_MISSING = "matplotlib not installed (pip install matplotlib): no PNG chart; the table and JSON are complete"


def system_list(text: str) -> list[str]:
    names = [s.strip() for s in str(text).split(",") if s.strip()]
    unknown = [s for s in names if s not in ALL_SYSTEMS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown system(s) {unknown or text!r};"
                                         f" choose from {', '.join(ALL_SYSTEMS)}")
    return [s for s in ALL_SYSTEMS if s in names]  # canonical order, no duplicates


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=size_list, default=[100, 1024, 65536], help="entry sizes (default 100,1024,65536)")
    p.add_argument("--runs", type=positive_int, default=3, help="runs per system and size; medians reported")
    p.add_argument("--duration-s", type=positive_float, default=5.0, help="seconds of load per measurement")
    p.add_argument("--in-flight", type=positive_int, default=1000, help="outstanding writes, every system")
    p.add_argument("--out-dir", default=os.path.join(REPO_DIR, "bench", "results"))
    p.add_argument("--systems", type=system_list, default=list(SYSTEMS),
                   help="comma list (default all but the Java ones): " + ",".join(ALL_SYSTEMS))
    p.add_argument("--redis-connections", type=positive_int, default=1,
                   help="connections the depth is split over, both Redis clients (bk: one per bookie)")
    p.add_argument("--no-chart", action="store_true", help="skip the PNG")
    p.add_argument("--half-peak", action="store_true",
                   help="afterwards, run every bk system again paced at half its median peak (open loop, as"
                        " bench.load --rate) and report its add latency there: issue 6's 'p99 at half the peak'")
    p.add_argument("--java-release", choices=RELEASES, default=DEFAULT_RELEASE, help="the Java bookies' release")
    p.add_argument("--read-entries", type=positive_int, default=20_000,
                   help="reads per read row (with a Java system; 1 KiB entries: --read-size)")
    p.add_argument("--read-size", type=positive_int, default=1024, help="entry size of the read rows")
    p.add_argument("--no-reads", action="store_true", help="with a Java system: skip the read rows")
    p.add_argument("--no-java-client", action="store_true", help="with a Java system: skip the Java client rows")
    p.add_argument("--warm-up-s", type=float, default=15.0,
                   help="with a Java system: seconds of 1 KiB adds on every paired cluster before the first"
                        " measurement, not counted (the JVMs' JIT: at load 10 on 2 cores C2 still took 40%% of"
                        " a Java bookie's CPU 9-15 s into its adds; bk's bookies get the same)")
    p.add_argument("--java-client-entries", type=positive_int, default=100_000,
                   help="adds per Java client run (it reads them back, recovers, reads again)")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.redis_connections > args.in_flight:
        parser.error("--redis-connections cannot exceed --in-flight")
    for java, spec in JAVA_SYSTEMS.items():  # a Java system is measured beside its bk system
        if java in args.systems and spec[5] not in args.systems:
            args.systems = [s for s in ALL_SYSTEMS if s in args.systems or s == spec[5]]
    if args.half_peak and any(s in JAVA_SYSTEMS for s in args.systems):
        parser.error("--half-peak is for bk systems on their own (not with a Java system)")
    return args


# ---------------------------------------------------------------- one measurement each
def _measurement(system: str, size: int, run: int, r: dict, peak_rss: dict, server_cpu: dict,
                 disk_mb_per_s: float | None = None) -> dict:
    return {"system": system, "entry_size": size, "run": run, "entries": r["entries"], "bytes": r["bytes"],
            "disk_mb_per_s": disk_mb_per_s,
            "elapsed_s": r["elapsed_s"], "entries_per_s": r["entries_per_s"], "mb_per_s": r["mb_per_s"],
            "latency_ms": r["latency_ms"], "peak_rss_mib": peak_rss, "server_cpu_pct": server_cpu,
            "client_cpu_pct": r.get("client_cpu_pct"), "errors": r.get("errors", 0),
            "error": r.get("error"), "detail": {k: v for k, v in r.items() if k in
                                                ("group_bytes", "command", "pipeline", "connections", "spec",
                                                      "phases_s", "service_latency_ms", "pacing_lag_ms")}}


def measure_raw(size: int, args, run: int) -> dict:
    r = run_raw_disk(size, args.in_flight, args.duration_s, bench_base_dir())
    return _measurement("raw-disk", size, run, r, {}, {})


def measure_redis(size: int, args, run: int, which: str, rate_hint: float | None) -> dict:
    with RedisServer() as server:
        with RssSampler({"redis-server": server.pid}) as rss:
            if which == "redis-resp":
                r = run_resp_load(server.port, size, args.in_flight, args.duration_s,
                                  connections=args.redis_connections)
            else:
                try:
                    r = run_redis_benchmark(server.port, size, args.in_flight,
                                            redis_benchmark_requests(args.duration_s, rate_hint),
                                            args.redis_connections, timeout_s=max(60.0, args.duration_s * 20))
                except RuntimeError as e:
                    alive = server.proc.poll() is None
                    raise RuntimeError(f"{e} (redis-server {'running' if alive else 'exited'}; its log ends:"
                                       f" {server.log_tail()!r})") from e
        return _measurement(which, size, run, r, rss.peak_mib(), rss.cpu_pct())


def redis_benchmark_requests(duration_s: float, rate_hint: float | None) -> int:
    """redis-benchmark takes a request count, not a duration: aim at `duration_s` at the
    rate the RESP client just saw (20,000/s when there is none), within 1,000..2,000,000."""
    per_s = rate_hint if rate_hint and rate_hint > 0 else 20_000
    return int(min(max(per_s * duration_s, 1_000), 2_000_000))


def measure_bk(system: str, size: int, args, run: int, zk_connect: str, rate: float | None = None,
               fleet: Fleet | None = None) -> dict:
    """One bk (or, with `fleet`, bk or Java) measurement; with `rate`, paced (open loop) with a window
    wide enough that a stall shorter than HALF_PEAK_WINDOW_S never holds the generator back."""
    _, bookies, e, wq, aq, settings = BK_SYSTEMS[system] if system in BK_SYSTEMS else JAVA_SYSTEMS[system]
    in_flight = max(args.in_flight, int(rate * HALF_PEAK_WINDOW_S)) if rate else args.in_flight
    spec = LoadSpec(duration_s=args.duration_s, entry_size=size, in_flight=in_flight, ensemble=e,
                    write_quorum=wq, ack_quorum=aq, rate=rate)
    with contextlib.ExitStack() as stack:
        if fleet is not None:
            uri, pids = fleet.clusters[system].metadata_uri, fleet.pids(system)
        else:
            cluster = stack.enter_context(local_cluster(bookies, zk_connect=zk_connect, prefix=f"cmp-{system}",
                                                        **settings))
            uri, pids = cluster.metadata_uri, bookie_pids(cluster)
        with RssSampler(pids, disk=BlockDevice.of(bench_base_dir())) as rss:
            s = run_load(uri, spec, on_mark=rss.mark)
    return _measurement(system, size, run, {**s["adds"], "spec": s["spec"], "phases_s": s["phases_s"]},
                        rss.peak_mib(), rss.cpu_pct(between=ADD_WINDOW), rss.disk_mb_per_s(ADD_WINDOW))


# ---------------------------------------------------------------- summary
def _total(values: dict) -> float | None:
    present = [v for v in values.values() if v is not None]
    return sum(present) if present else None


def summarize(measurements: list[dict], systems, sizes) -> list[dict]:
    """One row per (system, size) with medians over runs, spread, and bk's ratios to raw and Redis."""
    rows = []
    by = {}
    for m in measurements:
        by.setdefault((m["system"], m["entry_size"]), []).append(m)
    for size in sizes:
        med = {}
        for system in systems:
            ms = by.get((system, size))
            if not ms:
                continue
            rss_per_run = [max((v for v in m["peak_rss_mib"].values() if v), default=None) for m in ms]
            row = {"system": system, "label": LABELS[system], "entry_size": size, "runs": len(ms),
                   "entries_per_s": median_or_none(m["entries_per_s"] for m in ms),
                   "entries_per_s_runs": [m["entries_per_s"] for m in ms],
                   "spread_pct": spread_pct(m["entries_per_s"] for m in ms),
                   "mb_per_s": median_or_none(m["mb_per_s"] for m in ms),
                   "p99_ms": median_or_none(m["latency_ms"].get("p99") for m in ms),
                   "peak_rss_mib": median_or_none(rss_per_run), "peak_rss_mib_max": max(
                       (v for v in rss_per_run if v is not None), default=None),
                   "server_cpu_pct": median_or_none(_total(m["server_cpu_pct"]) for m in ms),
                   "client_cpu_pct": median_or_none(m.get("client_cpu_pct") for m in ms),
                   # raw-disk's payload MB/s is what its disk wrote; bk's device figure includes its overheads
                   "disk_mb_per_s": (median_or_none(m["mb_per_s"] for m in ms) if system == "raw-disk" else
                                     median_or_none(m.get("disk_mb_per_s") for m in ms)),
                   "errors": sum(m["errors"] for m in ms)}
            med[system] = row["entries_per_s"]
            rows.append(row)
        for row in rows:
            if row["entry_size"] == size and row["system"] in BK_SYSTEMS:
                java = next((j for j, v in JAVA_SYSTEMS.items() if v[5] == row["system"]), None)
                row["x_java"] = ratio(row["entries_per_s"], med.get(java))
                row["x_raw"] = ratio(row["entries_per_s"], med.get("raw-disk"))
                row["x_redis"] = ratio(row["entries_per_s"], med.get(REDIS_REFERENCE))
                row["x_redis_benchmark"] = ratio(row["entries_per_s"], med.get("redis-benchmark"))
    return rows


def render_summary(rows: list[dict]) -> str:
    headers = ["system", "size", "entries/s", "±%", "MB/s", "disk MB/s", "p99 ms", "peak RSS MiB", "srv CPU%",
               "cli CPU%", "bk/raw", "bk/Redis", "bk÷Java"]
    body = []
    for r in rows:
        x = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        body.append([r["system"], human_size(r["entry_size"]), fmt_num(r["entries_per_s"]),
                     "-" if r["spread_pct"] is None else f"{r['spread_pct']:.0f}", fmt_num(r["mb_per_s"], 1),
                     fmt_num(r.get("disk_mb_per_s"), 1), fmt_num(r["p99_ms"], 1), fmt_num(r["peak_rss_mib"]), fmt_num(r.get("server_cpu_pct")),
                     fmt_num(r.get("client_cpu_pct")),
                     x(r.get("x_raw")) if r["system"] in BK_SYSTEMS else "",
                     x(r.get("x_redis")) if r["system"] in BK_SYSTEMS else "",
                     x(r.get("x_java")) if r["system"] in BK_SYSTEMS else ""])
    return render_table(headers, body)


def summarize_half_peak(measurements: list[dict], sizes) -> list[dict]:
    """--half-peak: one row per (bk system, size), medians over runs of the paced latency,
    from when each add was due (what an application on that schedule sees) and from when
    it left (without the generator's own 1 ms-burst lag)."""
    by: dict = {}
    for m in measurements:
        by.setdefault((m["system"], m["entry_size"]), []).append(m)
    rows = []
    for size in sizes:
        for system in BK_SYSTEMS:
            ms = by.get((system, size))
            if not ms:
                continue
            sent = [m["detail"].get("service_latency_ms") or {} for m in ms]
            rows.append({"system": system, "entry_size": size, "runs": len(ms),
                         "rate": median_or_none(m["paced_rate"] for m in ms),
                         "entries_per_s": median_or_none(m["entries_per_s"] for m in ms),
                         "p50_ms": median_or_none(m["latency_ms"].get("p50") for m in ms),
                         "p99_ms": median_or_none(m["latency_ms"].get("p99") for m in ms),
                         "p99_ms_runs": [m["latency_ms"].get("p99") for m in ms],
                         "sent_p50_ms": median_or_none(x.get("p50") for x in sent),
                         "sent_p99_ms": median_or_none(x.get("p99") for x in sent),
                         "errors": sum(m["errors"] for m in ms)})
    return rows


def render_half_peak(rows: list[dict]) -> str:
    headers = ["system", "size", "paced at/s", "got/s", "p50 ms", "p99 ms", "sent p50", "sent p99"]
    body = [[r["system"], human_size(r["entry_size"]), fmt_num(r["rate"]), fmt_num(r["entries_per_s"]),
             fmt_num(r["p50_ms"], 2), fmt_num(r["p99_ms"], 2), fmt_num(r["sent_p50_ms"], 2),
             fmt_num(r["sent_p99_ms"], 2)] for r in rows]
    return render_table(headers, body)


def write_chart(rows: list[dict], path: str) -> str | None:
    """A grouped bar chart (entries/s and MB/s per size, one bar per system); None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    sizes = sorted({r["entry_size"] for r in rows})
    systems = [s for s in ALL_SYSTEMS if any(r["system"] == s for r in rows)]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    width = 0.8 / max(1, len(systems))
    for ax, key, title in ((axes[0], "entries_per_s", "entries/s (log)"), (axes[1], "mb_per_s", "MB/s")):
        for j, system in enumerate(systems):
            xs, ys, lo, hi = [], [], [], []
            for i, size in enumerate(sizes):
                r = next((r for r in rows if r["system"] == system and r["entry_size"] == size), None)
                if r is None or r[key] is None:
                    continue
                xs.append(i + (j - (len(systems) - 1) / 2) * width)
                ys.append(r[key])
                if key == "entries_per_s" and r["entries_per_s_runs"]:
                    lo.append(r[key] - min(r["entries_per_s_runs"]))
                    hi.append(max(r["entries_per_s_runs"]) - r[key])
            err = [lo, hi] if key == "entries_per_s" and lo else None
            ax.bar(xs, ys, width, label=system, yerr=err, capsize=2)
        ax.set_xticks(range(len(sizes)), [human_size(s) for s in sizes])
        ax.set_xlabel("entry size")
        ax.set_title(title)
        if key == "entries_per_s":
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle("durable writes, same disk, same in-flight depth (medians; bars = min..max of runs)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- the run
def environment() -> dict:
    def git(*argv):
        try:
            return subprocess.run(["git", "-C", REPO_DIR, *argv], capture_output=True, text=True,
                                  timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            return None
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "bk")
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "bench_dir": bench_base_dir(), "git": git("rev-parse", "--short", "HEAD"),
            # the bookies run this tree: uncommitted edits under bk/ are part of what was measured
            "bk_uncommitted": dirty.splitlines() if dirty else [], "loadavg_start": os.getloadavg()}


def run_compare(args, log=print) -> dict:
    systems = list(args.systems)
    notes = []
    redis_wanted = [s for s in systems if s.startswith("redis")]
    if redis_wanted and not shutil.which("redis-server"):
        log(REDIS_MISSING)
        notes.append(REDIS_MISSING)
        systems = [s for s in systems if not s.startswith("redis")]
    if "redis-benchmark" in systems and not shutil.which("redis-benchmark"):
        log(REDIS_BENCHMARK_MISSING)
        notes.append(REDIS_BENCHMARK_MISSING)
        systems.remove("redis-benchmark")
    zk = fleet = None
    if any(s in BK_SYSTEMS or s in JAVA_SYSTEMS for s in systems):
        from bk.testing.zookeeper import LocalZooKeeper, ZooKeeperLaunchError
        zk_dir = scratch_dir("cmp-zk")
        try:
            zk = LocalZooKeeper(zk_dir).start()
        except ZooKeeperLaunchError as e:
            msg = f"no local ZooKeeper ({e}): skipping the bk systems"
            log(msg)
            notes.append(msg)
            systems = [s for s in systems if s not in BK_SYSTEMS and s not in JAVA_SYSTEMS]
            shutil.rmtree(zk_dir, ignore_errors=True)
            zk = None
    out = {"config": {"sizes": args.sizes, "runs": args.runs, "duration_s": args.duration_s,
                      "in_flight": args.in_flight, "systems": systems, "redis_connections": args.redis_connections},
           "environment": environment(), "notes": notes, "measurements": [], "failures": [], "half_peak": [],
           "reads": [], "java_client": []}
    cluster_no = 0
    try:
        if any(s in JAVA_SYSTEMS for s in systems):
            out["config"].update(java_release=args.java_release, read_entries=args.read_entries,
                                 read_size=args.read_size, java_client_entries=args.java_client_entries)
            paired = [s for s in systems if s in BK_SYSTEMS or s in JAVA_SYSTEMS]
            try:
                fleet = Fleet(zk.connect_string, paired, args.java_release,
                              {k: (v[1], v[5]) for k, v in BK_SYSTEMS.items()}).start(log)
            except Exception as e:  # noqa: BLE001 - e.g. JavaMissing: said, the run goes on without Java
                why = f"{type(e).__name__}: {e}"
                out["failures"].append({"system": ",".join(paired), "entry_size": 0, "run": 0, "phase": "start",
                                        "error": why})
                log(f"the paired clusters could not start, the Java systems are left out: {why}")
                systems = [s for s in systems if s not in JAVA_SYSTEMS]
                out["config"]["systems"] = systems
            if fleet is not None and args.warm_up_s > 0:
                for system in fleet.clusters:
                    spec = BK_SYSTEMS.get(system) or JAVA_SYSTEMS[system]
                    run_load(fleet.clusters[system].metadata_uri,
                             LoadSpec(duration_s=args.warm_up_s, entry_size=1024, in_flight=args.in_flight,
                                      ensemble=spec[2], write_quorum=spec[3], ack_quorum=spec[4]))
                log(f"fleet: warmed up ({args.warm_up_s:g} s of adds each, not counted)")
        for run in range(args.runs):
            for size in args.sizes:
                order = systems[run % len(systems):] + systems[:run % len(systems)] if systems else []
                resp_rate = None
                # redis-benchmark sizes its request count from redis-resp's rate: keep resp first.
                if "redis-resp" in order and "redis-benchmark" in order:
                    order.remove("redis-benchmark")
                    order.insert(order.index("redis-resp") + 1, "redis-benchmark")
                for system in order:
                    def measure(system=system, size=size, run=run):
                        nonlocal resp_rate, cluster_no
                        if system == "raw-disk":
                            return measure_raw(size, args, run)
                        if system in ("redis-resp", "redis-benchmark"):
                            m = measure_redis(size, args, run, system, resp_rate)
                            if system == "redis-resp":
                                resp_rate = m["entries_per_s"]
                            return m
                        cluster_no += 1
                        kw = {"fleet": fleet} if fleet is not None and system in fleet.clusters else {}
                        return measure_bk(system, size, args, run, f"{zk.connect_string}/bench-{cluster_no}", **kw)
                    m = _attempt(out, log, args, system, size, run, measure)
                    if m is None:
                        continue
                    out["measurements"].append(m)
                    rss = max((v for v in m["peak_rss_mib"].values() if v), default=None)
                    log(f"run {run + 1}/{args.runs} {human_size(size):>6} {system:15} {m['entries_per_s']:>12,.0f}"
                        f" entries/s {m['mb_per_s']:8.1f} MB/s p99 {fmt_num(m['latency_ms'].get('p99'), 1):>8} ms"
                        f" rss {fmt_num(rss)} MiB cpu srv {fmt_num(_total(m['server_cpu_pct']))}%"
                        f" cli {fmt_num(m['client_cpu_pct'])}% load {m['loadavg_1m_before']:.1f}"
                        + (f" ERRORS {m['errors']}: {m['error']}" if m["errors"] else ""))
        if args.half_peak:
            peaks = {(r["system"], r["entry_size"]): r["entries_per_s"]
                     for r in summarize(out["measurements"], systems, args.sizes)
                     if r["system"] in BK_SYSTEMS and r["entries_per_s"]}
            bk_systems = [x for x in systems if x in BK_SYSTEMS]
            for run in range(args.runs):
                for size in args.sizes:
                    for system in bk_systems[run % len(bk_systems):] + bk_systems[:run % len(bk_systems)]:
                        peak = peaks.get((system, size))
                        if not peak:  # every peak run of it failed
                            continue
                        rate = peak / 2

                        def paced(system=system, size=size, run=run, rate=rate):
                            nonlocal cluster_no
                            cluster_no += 1
                            return measure_bk(system, size, args, run, f"{zk.connect_string}/bench-{cluster_no}",
                                              rate=rate)
                        m = _attempt(out, log, args, system, size, run, paced, "half-peak ")
                        if m is None:
                            continue
                        m["paced_rate"] = rate
                        out["half_peak"].append(m)
                        lat, svc = m["latency_ms"], m["detail"].get("service_latency_ms") or {}
                        log(f"half-peak {run + 1}/{args.runs} {human_size(size):>6} {system:15} at {rate:>10,.0f}"
                            f" adds/s: from due p50 {fmt_num(lat.get('p50'), 2)} p99 {fmt_num(lat.get('p99'), 2)} ms,"
                            f" from sent p50 {fmt_num(svc.get('p50'), 2)} p99 {fmt_num(svc.get('p99'), 2)} ms"
                            + (f" ERRORS {m['errors']}: {m['error']}" if m["errors"] else ""))
        if fleet is not None and not args.no_reads:
            run_read_phase(fleet, args, out, log)
        if fleet is not None and not args.no_java_client:
            ms, fails = run_java_client_phase(fleet, args.sizes, args.runs, args.java_client_entries,
                                              args.in_flight, args.java_release, log)
            out["java_client"] += ms
            out["failures"] += fails
    finally:
        if fleet is not None:
            fleet.stop()
        if zk is not None:
            zk.stop()
            shutil.rmtree(zk.data_dir, ignore_errors=True)
    out["environment"]["loadavg_end"] = os.getloadavg()
    out["summary"] = summarize(out["measurements"], systems, args.sizes)
    out["half_peak_summary"] = summarize_half_peak(out["half_peak"], args.sizes)
    out["reads_summary"] = compare_reads.summarize_reads(out["reads"])
    out["java_client_summary"] = summarize_java_client(out["java_client"])
    return out


def run_read_phase(fleet: Fleet, args, out: dict, log) -> None:
    """compare_reads' rows on every paired cluster: each prepared once, then the runs, the clusters
    in an order rotated every run."""
    from bk.eventloop import loop_factory
    import asyncio
    targets = []
    for system, c in fleet.clusters.items():
        # BATCH_READ rows on one-bookie clusters (E == WQ), where the bookie has the op (bk; Java from 4.17)
        batch = system == "bk-1" or (system == "java-bookie" and args.java_release != "4.15.5")
        target = compare_reads.ReadTarget(system, c.metadata_uri, c.data_dir, batch)
        try:
            with asyncio.Runner(loop_factory=loop_factory()) as runner:
                runner.run(compare_reads.prepare(target, args.runs, args.read_entries, args.read_size))
            targets.append(target)
        except Exception as e:  # noqa: BLE001 - that cluster's rows are missing, the failure says why
            out["failures"].append({"system": system, "phase": "reads", "run": 0, "entry_size": args.read_size,
                                    "error": f"{type(e).__name__}: {e}"})
            log(f"reads: preparing {system} FAILED: {e}")
    for run in range(args.runs):
        for target in targets[run % len(targets):] + targets[:run % len(targets)] if targets else []:
            try:
                with asyncio.Runner(loop_factory=loop_factory()) as runner:
                    out["reads"] += runner.run(compare_reads.measure_run(target, run, args.read_entries,
                                                                         args.read_size, log))
            except Exception as e:  # noqa: BLE001
                out["failures"].append({"system": target.system, "phase": "reads", "run": run,
                                        "entry_size": args.read_size, "error": f"{type(e).__name__}: {e}"})
                log(f"reads run {run + 1} {target.system} FAILED: {e}")


def _attempt(out: dict, log, args, system: str, size: int, run: int, measure, tag: str = "") -> dict | None:
    """Run one measurement; a failure is recorded and logged and gives None (the others go on)."""
    load_before = os.getloadavg()[0]
    t = time.monotonic()
    try:
        m = measure()
    except Exception as e:  # noqa: BLE001 - one failed measurement must not lose the others
        why = f"{type(e).__name__}: {e}"
        out["failures"].append({"system": system, "entry_size": size, "run": run, "error": why,
                                "phase": tag.strip() or "peak"})
        log(f"{tag}run {run + 1}/{args.runs} {human_size(size):>6} {system:15} FAILED: {why}")
        return None
    slow = {k: round(v, 1) for k, v in m["detail"].get("phases_s", {}).items() if k != "adds" and v > SLOW_PHASE_S}
    if slow:
        log(f"  note: slow client phases outside the measured window (s): {slow}")
    m["loadavg_1m_before"] = load_before
    m["wall_s"] = time.monotonic() - t
    return m


def main(argv=None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: every cluster this run started is stopped and its directory removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    log(f"bench.compare: sizes {args.sizes}, {args.runs} run(s) x {args.duration_s:g} s, {args.in_flight} in flight,"
        f" systems {','.join(args.systems)}; files under {bench_base_dir()}")
    result = run_compare(args, log)
    print()
    print(render_summary(result["summary"]))
    if result["half_peak_summary"]:
        print("\nadd latency at half the median peak (paced, open loop; p50/p99 from when each add was due,"
              " 'sent' from when it left):")
        print(render_half_peak(result["half_peak_summary"]))
    if result["reads_summary"]:
        print(f"\nreads, bk's client, {human_size(args.read_size)} entries, medians of {args.runs}"
              f" (Java {args.java_release}):")
        print(compare_reads.render_reads(result["reads_summary"]))
    if result["java_client_summary"]:
        print(f"\nthe Java client ({args.java_release}, its driver: {args.in_flight} adds in flight; reads of"
              " 100-entry readEntries, 8 in flight, one READ per entry):")
        print(render_java_client(result["java_client_summary"]))
    for note in result["notes"]:
        print(f"note: {note}")
    for f in result["failures"]:
        print(f"FAILED: {f['system']} {human_size(f['entry_size'])} run {f['run'] + 1}"
              f" ({f.get('phase', 'peak')}): {f['error']}")
    os.makedirs(args.out_dir, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    json_path = os.path.join(args.out_dir, f"compare-{stamp}.json")
    with open(json_path, "w") as fh:
        json.dump(result, fh, indent=2)
    print(f"JSON: {json_path}")
    if not args.no_chart:
        png = write_chart(result["summary"], os.path.join(args.out_dir, f"compare-{stamp}.png"))
        print(f"chart: {png}" if png else MATPLOTLIB_MISSING)
    return 1 if result["failures"] or any(r["errors"] for r in result["summary"]) or any(
        r.get("bk_errors") or r.get("java_errors") for r in result["reads_summary"]) else 0


if __name__ == "__main__":
    sys.exit(main())
