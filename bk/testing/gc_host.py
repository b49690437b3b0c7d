"""A real process running one GC pass on a storage engine, for crash tests.

    python -m bk.testing.gc_host --data DIR [--crash-at STEP] [--journal-off] [--seed S]

It writes ledger 4 alone (logs of its own), then ledgers 1, 2, 3 interleaved
(checkpoints mix them in each log), then runs one GC pass that deletes ledgers 2
and 4 (as if their metadata were gone) and compacts everything it can (major
compaction, threshold 0.8), while ledger 3 keeps receiving adds. With --crash-at
the process SIGKILLs itself at that step of the pass (GarbageCollector and
EntryLogCompactor step hooks): after_ledger_delete, after_whole_log_delete,
after_copy, after_switch, before_delete, after_delete. It prints, each line once
the fact is durable:

    W <ledger> <count>     entries 0..count-1 of the ledger are written and checkpointed
    A <ledger> <entry>     an add during the pass, acknowledged and checkpointed
    D <ledger>             the pass deleted the ledger, durably
    B <bytes>              the entry logs' size before the pass
    DONE                   the pass ended without the crash step being reached

Entry bytes are engine_host.expected_entry(seed, ledger, entry, ENTRY_BYTES).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

from bk import eventloop
from bk.bookie import Bookie
from bk.testing.engine_host import engine_config, expected_entry, ledger_key

ENTRY_BYTES = 1000
WRITTEN = 120  # entries per ledger before the pass
DOOMED = (2, 4)
STEPS = ("after_ledger_delete", "after_whole_log_delete", "after_copy", "after_switch", "before_delete",
         "after_delete")


def gc_config(data_dir: str, journal_off: bool = False, **extra):
    values = dict(entry_log_size_limit_bytes="64KiB", flush_interval_ms=100, gc_wait_time_ms=3_600_000)
    values.update(extra)
    return engine_config(data_dir, journal_off, **values)


class DeletePolicy:
    """The metadata comparison's verdict, fixed: these ledgers have no metadata."""

    def __init__(self, dead):
        self.dead = set(dead)

    async def find_garbage(self, local, delete):
        return {"ledgers": await delete(sorted(self.dead))}


def log_bytes(cfg) -> int:
    d = os.path.join(cfg.ledger_dirs[0], "current")
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".log"))


async def add(bookie, seed, lid, eid):
    await bookie.add_entry(lid, eid, expected_entry(seed, lid, eid, ENTRY_BYTES), ledger_key(seed, lid))


async def run(args) -> None:
    out = sys.stdout

    def say(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    cfg = gc_config(args.data, args.journal_off)
    bookie = Bookie(cfg)
    await bookie.start()
    for eid in range(WRITTEN):  # ledger 4 alone: whole logs of a deleted ledger
        await add(bookie, args.seed, 4, eid)
    await bookie.checkpoint()
    for eid in range(WRITTEN):
        for lid in (1, 2, 3):
            await add(bookie, args.seed, lid, eid)
        if eid % 10 == 9:
            await bookie.checkpoint()
    await bookie.checkpoint()
    for lid in (1, 2, 3, 4):
        say(f"W {lid} {WRITTEN}")
    say(f"B {log_bytes(cfg)}")

    def crash_at(step: str, log_id: int) -> None:
        if step == "after_ledger_delete":  # the deletion is durable here
            for lid in DOOMED:
                say(f"D {lid}")
        if step == args.crash_at:
            os.kill(os.getpid(), signal.SIGKILL)

    gc = bookie.gc
    gc.policy = DeletePolicy(DOOMED)
    gc.step_hook = crash_at
    gc.compactor.step_hook = crash_at
    stop = asyncio.Event()

    async def adder() -> None:  # adds next to the compaction; printed once checkpointed
        eid = WRITTEN
        while not stop.is_set():
            batch = list(range(eid, eid + 5))
            for e in batch:
                await add(bookie, args.seed, 3, e)
            await bookie.checkpoint()
            for e in batch:
                say(f"A 3 {e}")
            eid += 5
    task = asyncio.ensure_future(adder())
    result = await asyncio.to_thread(gc.trigger, force_major=True)
    stop.set()
    await task
    await bookie.stop()
    say("DONE" if result["ok"] else f"FAILED {result['errors']}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--crash-at", choices=STEPS, default=None)
    p.add_argument("--journal-off", action="store_true")
    p.add_argument("--seed", type=int, default=1)
    eventloop.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    main()
