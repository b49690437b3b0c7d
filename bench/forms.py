"""The ways a Python application adds and reads, side by side in one run.

    python -m bench.forms                                  # 1 bookie, 1 KiB, 1000 in flight, 3 rounds x 3 s
    python -m bench.forms --rounds 5 --duration-s 5 --json forms.json
    python -m bench.forms --forms callback,gather,task --bookies 3 --ensemble 3 --write-quorum 2 --ack-quorum 2

One LocalCluster (or `--metadata-uri`), one client process. Every round runs
every form once, on a new ledger each, for `--duration-s` seconds, in a new
random order every round (a slow minute of a shared machine, or the bookie
still flushing what the form before wrote, spreads over all forms), with
`--settle-s` of quiet before each form; the table gives the median adds/s of
each form and its ratio to the median of the callback form. Adds per second = acknowledged adds / (last ack - start).
No GC tuning unless `--tune-gc` (the issue's table was measured without it).

Add forms (D = `--in-flight`):
- callback:       `lh.async_add_entry(data, callback)`, a sliding window of D (bench.load's form)
- future-gather:  `await asyncio.gather(*(lh.async_add_entry(data) for _ in range(D)))`, repeated
- gather:         `await asyncio.gather(*(lh.add_entry(data) for _ in range(D)))`, repeated
- task:           one task per add running `await lh.add_entry(data)`, an asyncio.Semaphore(D) window
- batch:          `await lh.add_entries([data] * D)`, with two batches of D/2 outstanding (the next one
                  is issued before the previous is awaited, so the bookie never runs dry)
- writer:         `async with lh.writer(max_in_flight=D) as w: await w.add(data)`
- gather-coroutine: gather over `add(data)`, an `async def` around `lh.add_entry` (what `gather` over
                  add_entry cost while add_entry was a coroutine: the "before" row, in the same run)

Read forms (`--reads`), over the ledger the callback form wrote in that round:
- read-ranges:    `await rh.read_entries(a, a + 255)` with D/256 ranges outstanding (bench.load --reads)
- read-iter:      `async for entry in rh.read_entries_iter(0, last, chunk_entries=256, read_ahead=D/256)`
"""
from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time

from .load import print_summary, run_on_cluster
from .stats import human_size, parse_size, positive_float, positive_int

ADD_FORMS = ("callback", "future-gather", "gather", "task", "batch", "writer", "gather-coroutine")
READ_FORMS = ("read-ranges", "read-iter")
READ_CHUNK_ENTRIES = 256


async def form_callback(lh, payload: bytes, depth: int, deadline: float) -> int:
    loop = asyncio.get_running_loop()
    in_flight = done_count = 0
    waiter = None

    def done(entry_id, err) -> None:
        nonlocal in_flight, done_count
        if err is not None:
            raise err
        in_flight -= 1
        done_count += 1
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    perf, add = time.perf_counter, lh.async_add_entry
    while perf() < deadline:
        if in_flight >= depth:
            waiter = loop.create_future()
            await waiter
            continue
        add(payload, done)
        in_flight += 1
    while in_flight:
        waiter = loop.create_future()
        await waiter
    return done_count


async def form_future_gather(lh, payload: bytes, depth: int, deadline: float) -> int:
    n = 0
    while time.perf_counter() < deadline:
        n += len(await asyncio.gather(*(lh.async_add_entry(payload) for _ in range(depth))))
    return n


async def form_gather(lh, payload: bytes, depth: int, deadline: float) -> int:
    n = 0
    while time.perf_counter() < deadline:
        n += len(await asyncio.gather(*(lh.add_entry(payload) for _ in range(depth))))
    return n


async def form_gather_coroutine(lh, payload: bytes, depth: int, deadline: float) -> int:
    async def add(data):
        return await lh.add_entry(data)

    n = 0
    while time.perf_counter() < deadline:
        n += len(await asyncio.gather(*(add(payload) for _ in range(depth))))
    return n


async def form_task(lh, payload: bytes, depth: int, deadline: float) -> int:
    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(depth)
    tasks: set = set()
    done = [0]

    async def one() -> None:
        try:
            await lh.add_entry(payload)
            done[0] += 1
        finally:
            sem.release()

    while time.perf_counter() < deadline:
        await sem.acquire()
        task = loop.create_task(one())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    return done[0]


async def form_batch(lh, payload: bytes, depth: int, deadline: float) -> int:
    batch = [payload] * max(1, depth // 2)
    n = 0
    previous = lh.add_entries(batch)
    while time.perf_counter() < deadline:
        following = lh.add_entries(batch)
        n += len(await previous)
        previous = following
    return n + len(await previous)


async def form_writer(lh, payload: bytes, depth: int, deadline: float) -> int:
    perf = time.perf_counter
    async with lh.writer(max_in_flight=depth) as w:
        while perf() < deadline:
            await w.add(payload)
    return w.acknowledged


async def read_ranges(rh, last: int, depth: int) -> int:
    ranges = iter(range(0, last + 1, READ_CHUNK_ENTRIES))
    got = [0]

    async def reader() -> None:
        for first in ranges:
            entries = await rh.read_entries(first, min(first + READ_CHUNK_ENTRIES - 1, last))
            got[0] += len(entries)  # (not `got[0] += len(await ...)`: that reads got[0] before the await)

    await asyncio.gather(*(reader() for _ in range(max(1, depth // READ_CHUNK_ENTRIES))))
    return got[0]


async def read_iter(rh, last: int, depth: int) -> int:
    n = 0
    async for _ in rh.read_entries_iter(0, last, chunk_entries=READ_CHUNK_ENTRIES,
                                        read_ahead=max(1, depth // READ_CHUNK_ENTRIES)):
        n += 1
    return n


ADDERS = {"callback": form_callback, "future-gather": form_future_gather, "gather": form_gather, "task": form_task,
          "batch": form_batch, "writer": form_writer, "gather-coroutine": form_gather_coroutine}
READERS = {"read-ranges": read_ranges, "read-iter": read_iter}


async def run_rounds(metadata_uri: str, args) -> dict:
    from bk import eventloop
    from bk.client import BookKeeper

    payload = bytes(range(256)) * (args.entry_size // 256) + bytes(args.entry_size % 256)
    results: dict[str, list[float]] = {f: [] for f in args.forms + (list(READ_FORMS) if args.reads else [])}
    async with BookKeeper(metadata_uri) as bkc:
        if args.tune_gc:
            eventloop.tune_gc()
        rng = random.Random(args.seed)
        for r in range(args.rounds):
            order = rng.sample(args.forms, len(args.forms))
            written = None
            for form in order:
                await asyncio.sleep(args.settle_s)
                lh = await bkc.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum, password=b"")
                await lh.add_entry(payload)  # warm-up: connections, not counted
                t0 = time.perf_counter()
                n = await ADDERS[form](lh, payload, args.in_flight, t0 + args.duration_s)
                elapsed = time.perf_counter() - t0
                results[form].append(n / elapsed)
                await lh.close()
                if form == "callback":
                    written = lh
                else:
                    await bkc.delete_ledger(lh.ledger_id)
                print(f"round {r + 1} {form:14} {n / elapsed:12,.0f} adds/s", file=sys.stderr)
            if args.reads and written is not None:
                rh = await bkc.open_ledger(written.ledger_id, password=b"")
                last = rh.last_add_confirmed
                for form in (READ_FORMS if r % 2 == 0 else READ_FORMS[::-1]):
                    t0 = time.perf_counter()
                    n = await READERS[form](rh, last, args.in_flight)
                    elapsed = time.perf_counter() - t0
                    assert n == last + 1, (form, n, last)
                    results[form].append(n / elapsed)
                    print(f"round {r + 1} {form:14} {n / elapsed:12,.0f} entries/s", file=sys.stderr)
            if written is not None:
                await bkc.delete_ledger(written.ledger_id)
    return results


def summarize(results: dict, args) -> dict:
    # ratios per round (the form against the reference measured in the same round, minutes apart at
    # most), then their median: steadier on a shared machine than a ratio of medians
    rows = {}
    for form, rates in results.items():
        ref = results.get("callback") if form in ADD_FORMS else results.get("read-ranges")
        ratios = [a / b for a, b in zip(rates, ref)] if ref else []
        rows[form] = {"per_s": rates, "median_per_s": statistics.median(rates),
                      "ratios": ratios, "median_ratio": statistics.median(ratios) if ratios else None}
    return {"spec": {"entry_size": args.entry_size, "in_flight": args.in_flight, "rounds": args.rounds,
                     "duration_s": args.duration_s, "ensemble": args.ensemble, "write_quorum": args.write_quorum,
                     "ack_quorum": args.ack_quorum, "bookies": args.bookies, "tune_gc": args.tune_gc,
                     "settle_s": args.settle_s},
            "forms": rows}


def format_table(summary: dict) -> str:
    s = summary["spec"]
    lines = [f"bk forms: {human_size(s['entry_size'])} entries, {s['in_flight']} in flight, E/WQ/AQ {s['ensemble']}/"
             f"{s['write_quorum']}/{s['ack_quorum']}, {s['rounds']} rounds x {s['duration_s']:g} s, medians",
             f"{'form':16} {'per s':>10} {'ratio':>6}{'':13}   runs"]
    for form, row in summary["forms"].items():
        runs = " ".join(f"{v / 1000:.0f}k" for v in row["per_s"])
        ratio = "-" if row["median_ratio"] is None else f"{row['median_ratio']:.2f}"
        spread = "" if not row["ratios"] else f" ({min(row['ratios']):.2f}-{max(row['ratios']):.2f})"
        lines.append(f"{form:16} {row['median_per_s']:10,.0f} {ratio:>6}{spread:13}   {runs}")
    lines.append("ratio: median over rounds of the form's rate over the callback form's (reads: read-ranges')"
                 " in the same round, (min-max)")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.forms", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--metadata-uri", help="an existing cluster (default: start a LocalCluster)")
    p.add_argument("--forms", default=",".join(ADD_FORMS), help=f"add forms to run (of {', '.join(ADD_FORMS)})")
    p.add_argument("--reads", action="store_true", help="also read back with both read forms")
    p.add_argument("--rounds", type=positive_int, default=3)
    p.add_argument("--duration-s", type=positive_float, default=3.0)
    p.add_argument("--entry-size", type=parse_size, default=1024)
    p.add_argument("--in-flight", type=positive_int, default=1000)
    p.add_argument("--bookies", type=positive_int, default=1)
    p.add_argument("--ensemble", type=positive_int, default=1)
    p.add_argument("--write-quorum", type=positive_int, default=1)
    p.add_argument("--ack-quorum", type=positive_int, default=1)
    p.add_argument("--settle-s", type=float, default=1.0, help="quiet time before each form (the bookie catches up)")
    p.add_argument("--seed", type=int, default=1, help="of the random form order")
    p.add_argument("--tune-gc", action="store_true", help="gc.freeze() and a larger young generation first")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    args.forms = [f.strip() for f in args.forms.split(",") if f.strip()]
    bad = [f for f in args.forms if f not in ADDERS]
    if bad or (args.reads and "callback" not in args.forms):
        p.error(f"unknown forms {bad}" if bad else "--reads reads what the callback form wrote: include it")
    print_summary(summarize(run_on_cluster(args, run_rounds, "forms"), args), format_table, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
