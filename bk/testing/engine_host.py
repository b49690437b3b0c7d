"""A real process hosting one bookie storage engine, for crash tests.

    python -m bk.testing.engine_host --data DIR [--ledgers 4] [--entry-size 100]
        [--in-flight 64] [--fence-after N] [--journal-off] [--seed S]

It adds entries to several ledgers with many adds in flight and reports, on
stdout, one line per completed operation *after* the bookie acknowledged it:

    A <ledger> <entry>     the add was acknowledged
    F <ledger>             the fence returned (durable)
    K <ledger> <key hex>   the ledger's master key (printed before its first add)

so a test can kill it at any moment (kill -9, then maybe a simulated power
loss) and check that everything it printed is still there after a restart.
Entry bytes are a pure function of (seed, ledger, entry): `expected_entry`.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import sys

from bk import eventloop
from bk.bookie import Bookie
from bk.config import load_config


def ledger_key(seed: int, ledger_id: int) -> bytes:
    return hashlib.sha1(b"ledger" + f"pw-{seed}-{ledger_id}".encode()).digest()


def expected_entry(seed: int, ledger_id: int, entry_id: int, size: int) -> bytes:
    head = ledger_id.to_bytes(8, "big", signed=True) + entry_id.to_bytes(8, "big", signed=True)
    head += (entry_id - 1).to_bytes(8, "big", signed=True) + size.to_bytes(8, "big")
    block = hashlib.sha256(f"{seed}:{ledger_id}:{entry_id}".encode()).digest()
    payload = (block * (size // len(block) + 1))[:size]
    return head + payload


def engine_config(data_dir: str, journal_off: bool = False, **extra):
    overrides = dict(
        journal_dirs=[os.path.join(data_dir, "journal")],
        ledger_dirs=[os.path.join(data_dir, "ledgers")],
        journal_write_data=not journal_off,
        flush_interval_ms=200,
        entry_log_size_limit_bytes="1MiB",
        journal_max_size_bytes="1MiB",
        write_cache_max_size_bytes="4MiB",
    )
    overrides.update(extra)
    return load_config(overrides=overrides, env={})


async def run(args) -> None:
    bookie = Bookie(engine_config(args.data, args.journal_off))
    await bookie.start()
    out = sys.stdout
    lines: list[str] = []
    fenced: set[int] = set()
    next_id = {lid: bookie.storage.last_entry_id(lid) + 1 if bookie.ledger_exists(lid)
               and bookie.storage.last_entry_id(lid) is not None else 0
               for lid in range(1, args.ledgers + 1)}
    for lid in next_id:
        lines.append(f"K {lid} {ledger_key(args.seed, lid).hex()}\n")
    sem = asyncio.Semaphore(args.in_flight)
    done = 0

    finished = 0  # adds whose A/E line is in `lines`, not yet written

    async def add(lid: int, eid: int) -> None:
        nonlocal done, finished
        try:
            await bookie.add_entry(lid, eid, expected_entry(args.seed, lid, eid, args.entry_size),
                                   ledger_key(args.seed, lid))
            lines.append(f"A {lid} {eid}\n")
            done += 1
        except Exception as e:  # fenced ledgers refuse adds; anything else is reported
            lines.append(f"E {lid} {eid} {type(e).__name__}\n")
        finished += 1

    async def flusher() -> None:
        # An add's slot is freed only once its line is on the pipe, so a reader that is
        # killed with us knows: nothing was submitted beyond its printed acks + in_flight.
        nonlocal finished
        while True:
            if lines:
                chunk = "".join(lines)
                lines.clear()
                freed, finished = finished, 0
                out.write(chunk)
                out.flush()
                for _ in range(freed):
                    sem.release()
            await asyncio.sleep(0.001)

    flush_task = asyncio.ensure_future(flusher())
    ledgers = list(next_id)
    i = 0
    while args.max_entries == 0 or i < args.max_entries:
        lid = ledgers[i % len(ledgers)]
        i += 1
        if lid in fenced:
            continue
        if args.fence_after and done >= args.fence_after * (len(fenced) + 1) and len(fenced) < len(ledgers) - 1:
            await bookie.fence_ledger(lid, ledger_key(args.seed, lid))
            fenced.add(lid)
            lines.append(f"F {lid}\n")
            continue
        await sem.acquire()
        eid = next_id[lid]
        next_id[lid] += 1
        asyncio.ensure_future(add(lid, eid))
    for _ in range(args.in_flight):
        await sem.acquire()
    await bookie.stop()
    flush_task.cancel()
    out.write("".join(lines) + "DONE\n")
    out.flush()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--ledgers", type=int, default=4)
    p.add_argument("--entry-size", type=int, default=100)
    p.add_argument("--in-flight", type=int, default=64)
    p.add_argument("--fence-after", type=int, default=0, help="fence one more ledger every N acks")
    p.add_argument("--max-entries", type=int, default=0, help="stop after N adds (0 = until killed)")
    p.add_argument("--journal-off", action="store_true")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    if os.environ.get("BK_DISK_FAULTS"):  # injected disk faults (bk.testing.diskfaults)
        from bk.testing.diskfaults import install_from_env
        install_from_env()
    eventloop.run(run(args))


if __name__ == "__main__":
    main()
