"""A real bookie process whose BP-46 repair SIGKILLs it at one step, for crash tests.

    python -m bk.testing.repair_host --conf BOOKIE.toml --crash-at STEP

It runs the bookie of that configuration (a BookieServer, as `bk bookie` does) with the
repair's calls into the Bookie wrapped, and kills itself (SIGKILL: no checkpoint, no
deregistration) at STEP:

    copying         a copy from a peer was stored (in the write cache), the next not yet
    clear_limbo     the repair is about to clear the limbo of a ledger it copied entries into
                    (its copies are in the write cache; the checkpoint that makes them durable
                    with the cleared limbo has not run)
    limbo_cleared   that clear_limbo returned: the copies and the cleared limbo are durable
    finish          every ledger is done; the needs-integrity-check flag is about to be cleared
    finished        the flag is cleared, durably

The test restarts the bookie (optionally after a simulated power cut) and checks that
the next start finishes the repair and that every entry is served. Exit status 3: the
repair ended without reaching STEP (the test's setup did not leave it anything to do).
Test-only behaviour lives here and is injected into one process: nothing in bk/server or
bk/replication knows about it.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from bk import eventloop
from bk.config import load_config

STEPS = ("copying", "clear_limbo", "limbo_cleared", "finish", "finished")


def _die(step: str) -> None:
    print(f"CRASH {step}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def inject(bookie, step: str) -> None:
    """Wrap the Bookie methods the repair calls (instance attributes, looked up per call)."""
    copied: set[int] = set()
    add_entry_cb, clear_limbo, finish = bookie.add_entry_cb, bookie.clear_limbo, bookie.finish_integrity_check

    def add_entry_cb_then_die(ledger_id, entry_id, entry, master_key, recovery, cb, ctx, *rest):
        add_entry_cb(ledger_id, entry_id, entry, master_key, recovery, cb, ctx, *rest)
        if recovery:
            copied.add(ledger_id)
            if step == "copying":
                _die(step)

    async def clear_limbo_then_die(ledger_ids):
        mine = copied.intersection(ledger_ids)
        if mine and step == "clear_limbo":
            _die(step)
        await clear_limbo(ledger_ids)
        if mine and step == "limbo_cleared":
            _die(step)

    async def finish_then_die():
        if step == "finish":
            _die(step)
        await finish()
        if step == "finished":
            _die(step)

    bookie.add_entry_cb = add_entry_cb_then_die
    bookie.clear_limbo = clear_limbo_then_die
    bookie.finish_integrity_check = finish_then_die


async def serve(cfg, step: str) -> int:
    from bk.server import BookieServer

    server = BookieServer(cfg)
    inject(server.bookie, step)
    await server.start()
    try:
        while server.repair is not None and not server.repair.done:
            await asyncio.sleep(0.05)
        print("DONE without reaching the step", flush=True)
        return 3
    finally:
        await server.stop()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m bk.testing.repair_host")
    p.add_argument("--conf", required=True)
    p.add_argument("--crash-at", required=True, choices=STEPS)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(eventloop.run(serve(load_config(args.conf), args.crash_at)))


if __name__ == "__main__":
    main()
