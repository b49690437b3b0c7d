"""Deferred-sync adds and force() beside normal adds, in one run (issue 31).

    python -m bench.deferred                         # 1 bookie, 1 KiB, 1000 in flight, 3 rounds x 3 s
    python -m bench.deferred --bookies 3 --ensemble 3 --write-quorum 2 --ack-quorum 2 --json out.json

One LocalCluster (or `--metadata-uri`), one client (protocol v3: DEFERRED_SYNC exists only there),
a new ledger per row and round, rows in a new random order every round. Throughput rows use the
callback window of bench.forms (`--in-flight` adds outstanding) for `--duration-s`:
- normal:          durable adds (each acknowledged after the bookies' journal fsync)
- normal-v2:       the same with the default v2 client (the project's usual figure)
- deferred:        DEFERRED_SYNC adds, one force() at the end (counted in the time)
- deferred+force:  DEFERRED_SYNC adds with a force() after every `--force-every` acknowledged adds
Latency rows (one at a time, for `--duration-s`):
- add-latency:     `await lh.add_entry(x)` on a normal ledger (the durable single add)
- force-latency:   `await lh.force()` after a burst of `--burst` deferred adds (the price of durability
                   when it is wanted), beside deferred-add-latency, `await lh.add_entry(x)` of one
                   deferred add
Medians over rounds; latencies are p50/p99 over every sample of every round.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time

from .forms import form_callback
from .load import print_summary, run_on_cluster
from .stats import human_size, parse_size, positive_float, positive_int

RATE_ROWS = ("normal", "normal-v2", "deferred", "deferred+force")
LATENCY_ROWS = ("add-latency", "deferred-add-latency", "force-latency")
DEFERRED = {"DEFERRED_SYNC"}


async def rate_row(bkc, row: str, payload: bytes, args) -> float:
    deferred = row.startswith("deferred")
    lh = await bkc.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum,
                                 write_flags=DEFERRED if deferred else ())
    await lh.add_entry(payload)  # warm-up: connections, not counted
    t0 = time.perf_counter()
    deadline = t0 + args.duration_s
    n = 0
    if row == "deferred+force":
        while time.perf_counter() < deadline:
            n += await _adds(lh, payload, args.in_flight, args.force_every)
            await lh.force()
    else:
        n = await form_callback(lh, payload, args.in_flight, deadline)
        if deferred:
            await lh.force()
    elapsed = time.perf_counter() - t0
    assert lh.last_add_confirmed == lh.last_add_acked
    await lh.close()
    await bkc.delete_ledger(lh.ledger_id)
    return n / elapsed


async def _adds(lh, payload: bytes, depth: int, count: int) -> int:
    """`count` adds through a window of `depth` (callbacks); returns once all are acknowledged."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    state = {"sent": 0, "acked": 0, "in_flight": 0}

    def sent_more() -> None:
        while state["in_flight"] < depth and state["sent"] < count:
            state["sent"] += 1
            state["in_flight"] += 1
            lh.async_add_entry(payload, on_done)

    def on_done(entry_id, err) -> None:
        if err is not None:
            if not done.done():
                done.set_exception(err)
            return
        state["in_flight"] -= 1
        state["acked"] += 1
        if state["acked"] == count:
            if not done.done():
                done.set_result(count)
        else:
            sent_more()

    sent_more()
    return await done


async def latency_rows(bkc, payload: bytes, args, samples: dict) -> None:
    plain = await bkc.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum)
    deferred = await bkc.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum, write_flags=DEFERRED)
    for lh in (plain, deferred):
        await lh.add_entry(payload)
    for row, fn in random.sample([("add-latency", lambda: plain.add_entry(payload)),
                                  ("deferred-add-latency", lambda: deferred.add_entry(payload))], 2):
        deadline = time.perf_counter() + args.duration_s / 2
        while time.perf_counter() < deadline:
            t = time.perf_counter()
            await fn()
            samples[row].append((time.perf_counter() - t) * 1000.0)
    deadline = time.perf_counter() + args.duration_s
    while time.perf_counter() < deadline:
        await _adds(deferred, payload, args.burst, args.burst)
        t = time.perf_counter()
        await deferred.force()
        samples["force-latency"].append((time.perf_counter() - t) * 1000.0)
    for lh in (plain, deferred):
        await lh.close()
        await bkc.delete_ledger(lh.ledger_id)


async def run_rounds(metadata_uri: str, args) -> dict:
    from bk.client import BookKeeper

    payload = bytes(range(256)) * (args.entry_size // 256) + bytes(args.entry_size % 256)
    rates: dict[str, list[float]] = {r: [] for r in RATE_ROWS}
    samples: dict[str, list[float]] = {r: [] for r in LATENCY_ROWS}
    rng = random.Random(args.seed)
    async with BookKeeper(metadata_uri, protocol="v3") as v3, BookKeeper(metadata_uri) as v2:
        for r in range(args.rounds):
            for row in rng.sample(RATE_ROWS + ("latency",), len(RATE_ROWS) + 1):
                await asyncio.sleep(args.settle_s)
                if row == "latency":
                    await latency_rows(v3, payload, args, samples)
                    print(f"round {r + 1} latency rows: {sum(map(len, samples.values()))} samples so far",
                          file=sys.stderr)
                    continue
                rate = await rate_row(v2 if row == "normal-v2" else v3, row, payload, args)
                rates[row].append(rate)
                print(f"round {r + 1} {row:15} {rate:12,.0f} adds/s", file=sys.stderr)
    return {"rates": rates, "samples": samples}


def _quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def summarize(results: dict, args) -> dict:
    ref = statistics.median(results["rates"]["normal"])
    rows = {row: {"per_s": v, "median_per_s": statistics.median(v), "ratio_to_normal": statistics.median(v) / ref}
            for row, v in results["rates"].items()}
    lat = {row: {"samples": len(v), "p50_ms": _quantile(v, 0.5), "p99_ms": _quantile(v, 0.99)}
           for row, v in results["samples"].items() if v}
    return {"spec": {k: getattr(args, k) for k in ("entry_size", "in_flight", "rounds", "duration_s", "bookies",
                                                   "ensemble", "write_quorum", "ack_quorum", "force_every",
                                                   "burst")},
            "rates": rows, "latencies": lat}


def format_table(summary: dict) -> str:
    s = summary["spec"]
    lines = [f"bk deferred sync: {human_size(s['entry_size'])} entries, {s['in_flight']} in flight, E/WQ/AQ "
             f"{s['ensemble']}/{s['write_quorum']}/{s['ack_quorum']}, {s['bookies']} bookie(s), {s['rounds']} rounds x"
             f" {s['duration_s']:g} s",
             f"{'row':22} {'adds/s':>10} {'x normal':>9}   runs"]
    for row, v in summary["rates"].items():
        runs = " ".join(f"{x / 1000:.1f}k" for x in v["per_s"])
        lines.append(f"{row:22} {v['median_per_s']:10,.0f} {v['ratio_to_normal']:9.2f}   {runs}")
    lines.append(f"{'latency':22} {'p50 ms':>10} {'p99 ms':>9}   samples")
    for row, v in summary["latencies"].items():
        lines.append(f"{row:22} {v['p50_ms']:10.2f} {v['p99_ms']:9.2f}   {v['samples']}")
    lines.append(f"deferred+force: a force() every {s['force_every']} adds; force-latency: after a burst of"
                 f" {s['burst']} deferred adds")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.deferred", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--metadata-uri", help="an existing cluster (default: start a LocalCluster)")
    p.add_argument("--rounds", type=positive_int, default=3)
    p.add_argument("--duration-s", type=positive_float, default=3.0)
    p.add_argument("--entry-size", type=parse_size, default=1024)
    p.add_argument("--in-flight", type=positive_int, default=1000)
    p.add_argument("--force-every", type=positive_int, default=1000)
    p.add_argument("--burst", type=positive_int, default=100)
    p.add_argument("--bookies", type=positive_int, default=1)
    p.add_argument("--ensemble", type=positive_int, default=1)
    p.add_argument("--write-quorum", type=positive_int, default=1)
    p.add_argument("--ack-quorum", type=positive_int, default=1)
    p.add_argument("--settle-s", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    print_summary(summarize(run_on_cluster(args, run_rounds, "deferred"), args), format_table, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
