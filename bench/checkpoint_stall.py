"""How long a checkpoint holds the event loop and the GIL (issue 32), one bookie's storage in process.

A LedgerStorage owned by an asyncio loop takes paced puts (the add path's storage step: `--rate`
entries/s of `--entry-size` bytes, in 1 ms batches) while its flush thread checkpoints every
`--checkpoint-every-s`. Probes (bk.testing.stallprobe): the loop's lag (a callback every 0.1 ms)
and the GIL hold (a thread sleeping 0.1 ms). Reported, inside checkpoints and outside: the longest
loop stall, the longest GIL wait, and p99/p999 of a put batch's delay from when it was due.

    python -m bench.checkpoint_stall --duration-s 8 --rate 100000 --entry-size 100
"""
from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time

from bk.bookie.ledger_storage import LedgerStorage
from bk.config import load_config
from bk.testing.stallprobe import GilProbe, LoopLagProbe, _Samples


async def _run(args, root: str) -> dict:
    config = load_config(env={}, overrides={"ledger_dirs": [f"{root}/ledgers"], "journal_dirs": [f"{root}/journal"],
                                            "flush_interval_ms": int(args.checkpoint_every_s * 1000)})
    storage = LedgerStorage(config)
    loop = asyncio.get_running_loop()
    windows: list[tuple[float, float]] = []
    plain = storage.checkpoint

    def timed_checkpoint() -> None:
        t0 = time.monotonic()
        try:
            plain()
        finally:
            windows.append((t0, time.monotonic()))
    storage.checkpoint = timed_checkpoint  # the flush thread calls self.checkpoint()
    storage.start(loop)
    lids = list(range(1, args.ledgers + 1))
    for lid in lids:
        storage.create_ledger(lid)
    payload = b"x" * args.entry_size
    gil, lag, adds = GilProbe().start(), LoopLagProbe(loop).start(), _Samples()
    per_ms = max(1, int(args.rate / 1000))
    next_id = {lid: 0 for lid in lids}
    start = time.monotonic()
    due = start
    k = 0
    try:
        while due - start < args.duration_s:
            now = time.monotonic()
            if now < due:
                await asyncio.sleep(due - now)
            for _ in range(per_ms):
                lid = lids[k % len(lids)]
                k += 1
                while not storage.put(lid, next_id[lid], payload):
                    await storage.wait_for_room(5.0)
                next_id[lid] += 1
            done = time.monotonic()
            adds.samples.append((done, done - due))
            due += 0.001
            await asyncio.sleep(0)
    finally:
        lag.stop()
        gil.stop()
        await asyncio.to_thread(storage.stop)
        storage.close_index()
    ms = 1000.0
    return {
        "checkpoints": len(windows), "checkpoint_ms_max": round(max((b - a for a, b in windows), default=0) * ms, 1),
        "loop_stall_ms_in": round(lag.max_in(windows) * ms, 2), "loop_stall_ms_out": round(lag.max_outside(windows) * ms, 2),
        "gil_hold_ms_in": round(gil.max_in(windows) * ms, 2), "gil_hold_ms_out": round(gil.max_outside(windows) * ms, 2),
        "put_p99_ms_in": round(adds.percentile(0.99, windows, True) * ms, 2),
        "put_p999_ms_in": round(adds.percentile(0.999, windows, True) * ms, 2),
        "put_p99_ms_out": round(adds.percentile(0.99, windows, False) * ms, 2),
        "put_p999_ms_out": round(adds.percentile(0.999, windows, False) * ms, 2),
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration-s", type=float, default=8.0)
    p.add_argument("--rate", type=float, default=100000.0, help="entries/s put")
    p.add_argument("--entry-size", type=int, default=100)
    p.add_argument("--ledgers", type=int, default=4)
    p.add_argument("--checkpoint-every-s", type=float, default=1.0)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bk-ckpt-stall-") as root:
        print(json.dumps(asyncio.run(_run(args, root))))


if __name__ == "__main__":
    main()
