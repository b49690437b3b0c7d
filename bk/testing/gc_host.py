"""A real process running one GC pass on a storage engine, for crash tests.

    python -m bk.testing.gc_host --data DIR [--crash-at STEP] [--journal-off] [--seed S] [--damaged]

It writes ledger 4 alone (logs of its own), then ledgers 1, 2, 3 interleaved
(checkpoints mix them in each log), then runs one GC pass that deletes ledgers 2
and 4 (as if their metadata were gone) and compacts everything it can (major
compaction, threshold 0.8), while ledger 3 keeps receiving adds. With --crash-at
the process SIGKILLs itself at that step of the pass (GarbageCollector and
EntryLogCompactor step hooks): after_ledger_delete, after_whole_log_delete,
after_copy, after_switch, before_delete, after_delete. With --damaged the host
first stops the engine and makes one log that holds ledger 2 look like a crash's
log with a garbage record in the middle (no ledgers map; the size field of ledger
2's last record there garbled, ledger 3's records after it), restarts, and the
compaction steps crash only in that log, after_copy and after_switch at its second
batch: the one that copies what the index places past the damage. It prints, each line once the fact is durable:

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
from bk.testing.corruption import damage_record_size, logs_holding, strip_ledgers_map
from bk.testing.engine_host import engine_config, expected_entry, ledger_key

ENTRY_BYTES = 1000
WRITTEN = 120  # entries per ledger before the pass
DOOMED = (2, 4)
COMPACTION_STEPS = ("after_copy", "after_switch", "before_delete", "after_delete")
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


def damage_mid_log(cfg) -> int:
    """The first log holding ledger 2 followed by ledger 3: stripped of its map, ledger
    2's last record there garbled. Returns its id (the engine must be stopped)."""
    for path, _first, last in logs_holding(cfg.ledger_dirs, 2):
        if any(p == path and last3 > last for p, _, last3 in logs_holding(cfg.ledger_dirs, 3)):
            strip_ledgers_map(path)
            damage_record_size(path, last)
            return int(os.path.basename(path).split(".")[0], 16)
    raise LookupError("no log holds ledger 3 after ledger 2")


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
    target = None
    if args.damaged:
        await bookie.stop()
        target = damage_mid_log(cfg)
        bookie = Bookie(cfg)
        await bookie.start()
    for lid in (1, 2, 3, 4):
        say(f"W {lid} {WRITTEN}")
    say(f"B {log_bytes(cfg)}")

    seen: dict[str, int] = {}

    def crash_at(step: str, log_id: int) -> None:
        if step == "after_ledger_delete":  # the deletion is durable here
            for lid in DOOMED:
                say(f"D {lid}")
        if step != args.crash_at:
            return
        if target is not None and step in COMPACTION_STEPS:
            if log_id != target:
                return
            seen[step] = seen.get(step, 0) + 1
            if step in ("after_copy", "after_switch") and seen[step] < 2:
                return  # the first batch is what the scan saw; the second, what the index places past it
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
    p.add_argument("--damaged", action="store_true", help="one log without its map and with a garbage record")
    eventloop.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    main()
