"""Read latency with one of three bookies paused (SIGSTOP): speculative reads off and on, one run.

    python -m bench.slow_bookie_reads                         # 20 s per row
    python -m bench.slow_bookie_reads --row-seconds 10 --rounds 2 --json slow.json

Three bookies (LocalCluster, bench settings), one closed ledger E=3 WQ=3 AQ=2 of
`--entries` entries of `--entry-size` bytes. Each row is a fresh client (so no bookie
starts out "suspect") reading random single entries at `--rate` reads/s (open loop: a read
starts when due, whatever the earlier ones do, and its latency counts from then) for
`--row-seconds`; the read timeout is the client's default (10 s) in every row:
- `healthy`: nothing paused, speculative reads at their default (2000 ms);
- `paused, speculative off`: the ledger's first bookie SIGSTOPped, speculative_read_timeout_ms=0;
- `paused, speculative 2000 ms`: the same bookie paused, BookKeeper's default;
- `paused, speculative <N> ms`: the same with `--short-ms` (default 100).
The paused rows run back to back with the bookie stopped throughout (SIGCONT at the end, and in
a finally); with `--rounds` > 1 the rows alternate and each figure is the median of the rounds.

What the rows show: a third of the reads ask the paused bookie first. Without speculation such a
read waits for the read timeout (10 s); once one has timed out the client ranks that bookie last
for 5 s (bookie_client.SUSPECT_S), then asks it again - so of every 15 s, the reads that start in
the first 10 and ask it first take up to 10 s. With speculation they take the speculative timeout.
A closed loop (N readers, each waiting for its read) would hide this: a stalled reader starts no
reads, the others start thousands, and p99 looks healthy. Per row: reads/s,
p50/p99/p999/max latency (ms), and the speculative requests sent (SPECULATIVE_READ_COUNT).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import time

from bench.load import local_cluster
from bench.stats import (fmt_num, latency_summary_ms, parse_size, positive_float, positive_int, report_rows,
                         render_table)

PW = b"bench-slow"


async def write_ledger(uri: str, entries: int, entry_size: int) -> tuple[int, list[str]]:
    from bk.client import BookKeeper

    payload = os.urandom(entry_size)
    async with BookKeeper(uri) as bkc:
        lh = await bkc.create_ledger(3, 3, 2, password=PW)
        for first in range(0, entries, 256):
            await asyncio.gather(*(lh.add_entry(payload) for _ in range(first, min(first + 256, entries))))
        await lh.close()
        return lh.ledger_id, list(lh.metadata.segments[0][1])


async def read_row(uri: str, ledger_id: int, args, name: str, seed: int, **client_options) -> dict:
    """Open loop: a read of a random entry starts every 1/rate s whatever the earlier ones do, and
    its latency counts from when it was due (a stalled read does not hold the next ones back,
    so the stall shows in the percentiles instead of being hidden by fewer reads)."""
    from bk.client import BookKeeper
    from bk.client.speculative import SPECULATIVE_READ_COUNT

    async with BookKeeper(uri, **client_options) as bkc:
        rh = await bkc.open_ledger(ledger_id, PW)
        last = rh.last_add_confirmed
        rng = random.Random(seed)
        latencies: list[float] = []
        speculative_before = SPECULATIVE_READ_COUNT.value

        async def one(entry_id: int, due: float) -> None:
            await rh.read_entry(entry_id)
            latencies.append(time.perf_counter() - due)

        tasks = []
        start = time.perf_counter()
        count = int(args.rate * args.row_seconds)
        for i in range(count):
            due = start + i / args.rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(rng.randint(0, last), due)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    out = {"name": name, "reads": len(latencies), "reads_per_s": len(latencies) / elapsed,
           "speculative_reads": SPECULATIVE_READ_COUNT.value - speculative_before}
    out.update(latency_summary_ms(latencies))
    return out


async def run(cluster, args) -> list[dict]:
    uri = cluster.metadata_uri
    ledger_id, ensemble = await write_ledger(uri, args.entries, args.entry_size)
    paused = cluster.bookies[cluster.index_of(ensemble[0])]
    rows: list[dict] = []
    for r in range(args.rounds):
        seed = args.seed + r
        rows.append(await read_row(uri, ledger_id, args, "healthy", seed))
        paused.signal(signal.SIGSTOP)
        try:
            variants = [("paused, speculative off", 0), ("paused, speculative 2000 ms", 2000),
                        (f"paused, speculative {args.short_ms} ms", args.short_ms)]
            if r % 2:
                variants.reverse()  # alternate the order of the paused rows between rounds
            for name, ms in variants:
                rows.append(await read_row(uri, ledger_id, args, name, seed, speculative_read_timeout_ms=ms))
        finally:
            paused.signal(signal.SIGCONT)
    return rows


def format_table(rows: list[dict]) -> str:
    headers = ["row", "reads", "reads/s", "p50 ms", "p99 ms", "p999 ms", "max ms", "speculative"]
    body = [[r["name"], fmt_num(r["reads"]), fmt_num(r["reads_per_s"]), fmt_num(r.get("p50"), 2),
             fmt_num(r.get("p99"), 1), fmt_num(r.get("p999"), 1), fmt_num(r.get("max"), 1),
             fmt_num(r["speculative_reads"])] for r in rows]
    return render_table(headers, body)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.slow_bookie_reads", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--entries", type=positive_int, default=5000)
    p.add_argument("--entry-size", type=parse_size, default=1024)
    p.add_argument("--rate", type=positive_float, default=200.0, help="reads started per second (open loop)")
    p.add_argument("--row-seconds", type=positive_float, default=20.0)
    p.add_argument("--short-ms", type=positive_int, default=100, help="the short speculative timeout row")
    p.add_argument("--rounds", type=positive_int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    from bk import eventloop

    with local_cluster(3, prefix="slowreads") as cluster:
        rows = eventloop.run(run(cluster, args))
    report_rows(rows, format_table, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
