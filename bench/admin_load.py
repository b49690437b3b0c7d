"""1 KiB add latency on one bookie while a client pulls large admin answers (issue 30).

    python -m bench.admin_load                       # 100k ledgers, 3 rounds x (quiet, pulled) of 8 s
    python -m bench.admin_load --ledgers 20000 --rounds 5 --round-s 10 --json out.json

One bookie process (LocalCluster: real ZooKeeper, bookie defaults but 1 MiB entry logs so
there are many of them) is prepared with `--ledgers` ledgers' metadata (written straight to
the metadata store, as many as a busy cluster lists) and `--logs-mib` MiB of 1 KiB entries
spread over `--data-ledgers` real ledgers (so entry_log_usage has that many logs, each with
that many ledgers in its map). Then rounds alternate, "quiet" and "pulled", each
`--round-s` seconds of 1 KiB adds from this process (one client, ensemble 1, `--in-flight`
adds outstanding, closed loop). In a "pulled" round a separate process GETs
/api/v1/bookie/entry_log_usage and /api/v1/ledger/list?print_metadata=true (everything, no
page: the worst case) back to back as fast as the bookie answers. Reported per mode: the
median over rounds of each round's p50/p99 add latency and adds/s, and the puller's answers
per round and mean answer time. Compare rows of one run only (docs/BENCHMARKS.md).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import time
import urllib.request

from . import child_env, scratch_dir
from .stats import latency_summary_ms

PULL_PATHS = ("/api/v1/bookie/entry_log_usage", "/api/v1/ledger/list?print_metadata=true")


def puller(base_url: str, stop, counts) -> None:
    """GET the large answers back to back until `stop` is set; counts[0] answers, counts[1] ms."""
    while not stop.is_set():
        for path in PULL_PATHS:
            t0 = time.perf_counter()
            with urllib.request.urlopen(base_url + path, timeout=300) as resp:
                body = resp.read()
            json.loads(body)
            with counts.get_lock():
                counts[0] += 1
                counts[1] += (time.perf_counter() - t0) * 1000
            if stop.is_set():
                return


async def prepare(metadata_uri: str, bookie_id: str, ledgers: int, data_ledgers: int, logs_mib: int) -> None:
    from bk.client import BookKeeper
    from bk.meta.ledger_manager import LedgerManager
    from bk.meta.ledger_metadata import LedgerMetadata

    async with BookKeeper(metadata_uri) as bkc:
        lm = LedgerManager(bkc.store)
        first = 1 << 40  # far from the client's generated ids
        for start in range(0, ledgers, 500):
            await asyncio.gather(*(lm.create_ledger_metadata(first + i, LedgerMetadata.new([bookie_id], 1, 1))
                                   for i in range(start, min(ledgers, start + 500))))
        handles = await asyncio.gather(*(bkc.create_ledger(1, 1, 1) for _ in range(data_ledgers)))
        payload = os.urandom(1024)
        total = logs_mib * 1024
        for start in range(0, total, 512):
            await asyncio.gather(*(handles[(start + i) % data_ledgers].add_entry(payload)
                                   for i in range(min(512, total - start))))
        await asyncio.gather(*(h.close() for h in handles))


async def add_round(metadata_uri: str, seconds: float, in_flight: int) -> dict:
    from bk.client import BookKeeper

    async with BookKeeper(metadata_uri) as bkc:
        lh = await bkc.create_ledger(1, 1, 1)
        payload = os.urandom(1024)
        await lh.add_entry(payload)  # warm-up, not counted
        latencies: list[float] = []
        end = time.perf_counter() + seconds

        async def writer():
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                await lh.add_entry(payload)
                latencies.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await asyncio.gather(*(writer() for _ in range(in_flight)))
        elapsed = time.perf_counter() - t0
        await lh.close()
        await bkc.delete_ledger(lh.ledger_id)
    out = latency_summary_ms(latencies)
    out["adds_per_s"] = len(latencies) / elapsed
    return out


def main(argv=None) -> int:
    from bk import eventloop
    from bk.testing.cluster import LocalCluster

    p = argparse.ArgumentParser(prog="python -m bench.admin_load", description=__doc__.split("\n")[0])
    p.add_argument("--ledgers", type=int, default=100_000, help="ledgers' metadata in the store (ledger/list)")
    p.add_argument("--data-ledgers", type=int, default=1000, help="real ledgers the prefill spreads entries over")
    p.add_argument("--logs-mib", type=int, default=48, help="MiB of 1 KiB entries written first (1 MiB logs)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of each mode, alternated")
    p.add_argument("--round-s", type=float, default=8.0)
    p.add_argument("--in-flight", type=int, default=8)
    p.add_argument("--json", help="write the figures here too")
    args = p.parse_args(argv)

    data = scratch_dir("admin-load")
    os.environ.update({k: v for k, v in child_env().items() if k == "PYTHONPATH"})
    cluster = LocalCluster(data, bookies=1, entry_log_size_limit_bytes="1MiB", write_cache_max_size_bytes="64MiB",
                           read_cache_max_size_bytes="64MiB", gc_wait_time_ms=3_600_000)
    rows: dict[str, list[dict]] = {"quiet": [], "pulled": []}
    pulls: list[tuple[int, float]] = []
    try:
        cluster.start()
        b = cluster.bookies[0]
        t0 = time.monotonic()
        eventloop.run(prepare(cluster.metadata_uri, b.bookie_id, args.ledgers, args.data_ledgers, args.logs_mib))
        print(f"prepared {args.ledgers} ledgers' metadata, {args.logs_mib} MiB over {args.data_ledgers} ledgers"
              f" in {time.monotonic() - t0:.0f} s; load {os.getloadavg()}", flush=True)
        for r in range(args.rounds):
            for mode in ("quiet", "pulled"):
                stop, counts = multiprocessing.Event(), multiprocessing.Array("d", 2)
                proc = None
                if mode == "pulled":
                    proc = multiprocessing.Process(target=puller, args=(b.http_url, stop, counts), daemon=True)
                    proc.start()
                    time.sleep(1.0)  # the puller is pulling when the adds start
                row = eventloop.run(add_round(cluster.metadata_uri, args.round_s, args.in_flight))
                if proc is not None:
                    stop.set()
                    proc.join(300)
                    pulls.append((int(counts[0]), counts[1] / max(1, counts[0])))
                rows[mode].append(row)
                print(f"round {r + 1} {mode:6s}: p50 {row['p50']:.2f} ms  p99 {row['p99']:.2f} ms"
                      f"  {row['adds_per_s']:.0f} adds/s" + (f"  ({pulls[-1][0]} answers, mean"
                                                             f" {pulls[-1][1]:.0f} ms)" if proc else ""), flush=True)
    finally:
        cluster.stop()
        shutil.rmtree(data, ignore_errors=True)
    out = {mode: {k: statistics.median(row[k] for row in rs) for k in ("p50", "p99", "adds_per_s")}
           for mode, rs in rows.items()}
    out["pulled"]["answers_per_round"] = statistics.median(n for n, _ in pulls)
    out["pulled"]["answer_ms"] = statistics.median(ms for _, ms in pulls)
    out["settings"] = vars(args)
    out["load"] = os.getloadavg()
    print(json.dumps(out, indent=2))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
