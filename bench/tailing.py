"""Tailing-reader latency: from an add's acknowledgement to the tailing reader receiving it, one run.

    python -m bench.tailing                          # 2000 entries per row, 3 bookies
    python -m bench.tailing --entries 1000 --rounds 3 --json tail.json

Three bookies (LocalCluster, bench settings). Each row: one writer client adds `--entries`
entries of `--entry-size` bytes to a fresh ledger E=3 WQ=3 AQ=2, one at a time, one every
`--gap-ms` (a paced writer: the tail waits for each new entry); one reader client in the
same process tails it from entry 0 (`rh.tail(0)`, opened without recovery). Per entry the
latency is t(reader received it) - t(the writer's add_entry completed). Rows:
- `v3 long poll`: reader on v3, sequential long polls (the default);
- `v3 long poll, parallel`: every bookie of the ensemble asked at once;
- `v2 polling 50 ms` / `v2 polling 5 ms`: reader on v2 (no long poll), READ_LAC polls;
- `v3 long poll, explicit LAC 10 ms, idle gaps`: the writer pauses `--idle-gap-ms` after each
  add with explicit_lac_interval_ms=10, so an entry becomes visible by the explicit LAC
  rather than by the next add's piggyback (compare with the same row without explicit LAC);
  `--idle-entries` entries in these rows.
Beside each row, the add latency (add_entry start to completion) in the same row: the figure
the tail latency is compared with. A reader learns an entry is confirmed from the LAC stamped
on the next entry (or an explicit LAC), so its latency includes the gap to the next add.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

from bench.load import local_cluster
from bench.stats import fmt_num, latency_summary_ms, parse_size, positive_int, render_table, report_rows

PW = b"bench-tail"


async def tail_row(uri: str, args, name: str, *, reader_protocol: str, gap_ms: float, explicit_lac_ms: int = 0,
                   entries: int | None = None, **tail_options) -> dict:
    from bk.client import BookKeeper

    payload = os.urandom(args.entry_size)
    n = entries or args.entries
    acked: dict[int, float] = {}
    received: dict[int, float] = {}
    add_lat: list[float] = []
    async with BookKeeper(uri, explicit_lac_interval_ms=explicit_lac_ms) as wbk, \
            BookKeeper(uri, protocol=reader_protocol) as rbk:
        lh = await wbk.create_ledger(3, 3, 2, password=PW)
        rh = await rbk.open_ledger(lh.ledger_id, password=PW, recovery=False)
        tail = rh.tail(0, **tail_options)

        async def reader() -> None:
            async with tail:
                async for entry in tail:
                    received[entry.entry_id] = time.perf_counter()

        task = asyncio.ensure_future(reader())
        await asyncio.sleep(0.2)  # the reader is waiting before the first add
        for _ in range(n):
            t0 = time.perf_counter()
            eid = await lh.add_entry(payload)
            acked[eid] = t1 = time.perf_counter()
            add_lat.append(t1 - t0)
            await asyncio.sleep(gap_ms / 1000.0)
        await lh.close()
        await asyncio.wait_for(task, 60)
    lat = [received[e] - acked[e] for e in range(n)]  # every entry: the tail ended after the close
    last = n - 1  # the last entry is made visible by the close, not by the LAC: left out
    summary = latency_summary_ms(lat[:last])
    adds = latency_summary_ms(add_lat)
    return {"name": name, "entries": n, "p50": summary["p50"], "p99": summary["p99"], "max": summary["max"],
            "add_p50": adds["p50"], "add_p99": adds["p99"], "long_polls": tail.long_polls, "polls": tail.polls}


async def run(cluster, args) -> list[dict]:
    uri = cluster.metadata_uri
    variants = [
        ("v3 long poll", dict(reader_protocol="v3", gap_ms=args.gap_ms)),
        ("v3 long poll, parallel", dict(reader_protocol="v3", gap_ms=args.gap_ms, parallel=True)),
        ("v2 polling 50 ms", dict(reader_protocol="v2", gap_ms=args.gap_ms, poll_interval_s=0.05)),
        ("v2 polling 5 ms", dict(reader_protocol="v2", gap_ms=args.gap_ms, poll_interval_s=0.005)),
        ("v3 long poll, idle gaps", dict(reader_protocol="v3", gap_ms=args.idle_gap_ms, entries=args.idle_entries)),
        ("v3 long poll, idle gaps, explicit LAC 10 ms",
         dict(reader_protocol="v3", gap_ms=args.idle_gap_ms, entries=args.idle_entries, explicit_lac_ms=10)),
    ]
    rows = []
    for r in range(args.rounds):
        order = variants if r % 2 == 0 else list(reversed(variants))  # alternate between rounds
        for name, options in order:
            rows.append(await tail_row(uri, args, name, **options))
    return rows


def format_table(rows: list[dict]) -> str:
    headers = ["row", "entries", "tail p50 ms", "tail p99 ms", "tail max ms", "add p50 ms", "add p99 ms",
               "long polls", "polls"]
    body = [[r["name"], fmt_num(r["entries"]), fmt_num(r.get("p50"), 2), fmt_num(r.get("p99"), 2),
             fmt_num(r.get("max"), 1), fmt_num(r.get("add_p50"), 2), fmt_num(r.get("add_p99"), 2),
             fmt_num(r["long_polls"]), fmt_num(r["polls"])] for r in rows]
    return render_table(headers, body)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tailing", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--entries", type=positive_int, default=2000)
    p.add_argument("--entry-size", type=parse_size, default=1024)
    p.add_argument("--gap-ms", type=float, default=2.0, help="pause after each add (paced writer)")
    p.add_argument("--idle-gap-ms", type=float, default=50.0, help="pause after each add in the idle-gap rows")
    p.add_argument("--idle-entries", type=positive_int, default=200, help="entries of the idle-gap rows")
    p.add_argument("--rounds", type=positive_int, default=1)
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    from bk import eventloop

    with local_cluster(3, prefix="tailing") as cluster:
        rows = eventloop.run(run(cluster, args))
    report_rows(rows, format_table, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
