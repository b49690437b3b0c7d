"""How long a checkpoint holds the event loop and the GIL (issue 32), one bookie's storage in process.

A LedgerStorage owned by an asyncio loop takes paced puts (the add path's storage step: `--rate`
entries/s of `--entry-size` bytes, in 1 ms batches) while its flush thread checkpoints every
`--checkpoint-every-s`. Probes (bk.testing.stallprobe): the loop's lag (a callback every 0.1 ms)
and the GIL hold (a thread sleeping 0.1 ms), with the bookie's GC settings. Reported, inside
checkpoints and outside: the longest loop stall, the longest GIL wait, and p99/p999 of a put
batch's delay from when it was due.

`--phases` also times each step of a checkpoint (taking the half's entries out, writing the
entry log, the index puts, the entry log's fsync, the index transaction, the index sync,
freeing the half) and names, per step, the longest GIL wait and loop stall that overlapped it: where the hold is.

    python -m bench.checkpoint_stall --duration-s 8 --rate 100000 --entry-size 100 --phases
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time

from bk.bookie import ledger_storage as ls_mod
from bk.bookie.ledger_storage import LedgerStorage
from bk.bookie.write_cache import WriteCache
from bk import eventloop
from bk.config import load_config
from bk.index.index import Index, IndexWriter
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
    phases = _PhaseClock(storage) if args.phases else None
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
        if phases is not None:
            phases.undo()
    ms = 1000.0
    out = {
        "checkpoints": len(windows), "checkpoint_ms_max": round(max((b - a for a, b in windows), default=0) * ms, 1),
        "loop_stall_ms_in": round(lag.max_in(windows) * ms, 2), "loop_stall_ms_out": round(lag.max_outside(windows) * ms, 2),
        "loop_lag_p99_ms_in": round(lag.percentile(0.99, windows, True) * ms, 3),
        "loop_lag_p999_ms_in": round(lag.percentile(0.999, windows, True) * ms, 3),
        "loop_lag_p99_ms_out": round(lag.percentile(0.99, windows, False) * ms, 3),
        "loop_lag_p999_ms_out": round(lag.percentile(0.999, windows, False) * ms, 3),
        "gil_hold_ms_in": round(gil.max_in(windows) * ms, 2), "gil_hold_ms_out": round(gil.max_outside(windows) * ms, 2),
        "put_p99_ms_in": round(adds.percentile(0.99, windows, True) * ms, 2),
        "put_p999_ms_in": round(adds.percentile(0.999, windows, True) * ms, 2),
        "put_p99_ms_out": round(adds.percentile(0.99, windows, False) * ms, 2),
        "put_p999_ms_out": round(adds.percentile(0.999, windows, False) * ms, 2),
    }
    if phases is not None:
        out["phases"] = phases.report(gil, lag)
    return out


class _PhaseClock:
    """Times the steps of the flush thread's checkpoint by wrapping the calls it makes
    (measurement only, undone after the run). A step's hold is the longest probe sample
    whose wait overlapped one of its runs."""

    def __init__(self, storage: LedgerStorage) -> None:
        self.spans: list[tuple[str, float, float]] = []
        self._undo: list = []
        logger = storage.entry_logger
        if hasattr(WriteCache, "sorted_chunks"):  # each chunk taken is one run of the step
            self._wrap(WriteCache, "sorted_chunks", "take entries out", generator=True)
        else:  # a build before chunked flushes (before/after runs)
            self._wrap(WriteCache, "sorted_columns", "take entries out")
        self._wrap(logger, "add_entries", "entry log writes")
        self._wrap(IndexWriter, "put_location_lists", "index puts")
        self._wrap(logger, "flush", "entry log fsync")
        self._wrap(Index, "write", "index txn (whole)", context=True)
        self._wrap(storage, "sync_index", "index sync")
        self._wrap(WriteCache, "release", "free the half")
        if hasattr(ls_mod, "_free_in_steps"):  # a build before chunked flushes (before/after runs)
            self._wrap(ls_mod, "_free_in_steps", "free: sorted lists")
        self._wrap(storage, "_flush_half", "flush (whole)")

    def _wrap(self, owner, name: str, label: str, context: bool = False, generator: bool = False) -> None:
        plain = getattr(owner, name)
        spans, clock = self.spans, time.monotonic
        if generator:
            def wrapped(*a, **kw):
                it = plain(*a, **kw)
                while True:
                    t0 = clock()
                    try:
                        item = next(it)
                    except StopIteration:
                        return
                    finally:
                        spans.append((label, t0, clock()))
                    yield item
        elif context:
            @contextlib.contextmanager
            def wrapped(*a, **kw):
                t0 = clock()
                with plain(*a, **kw) as w:
                    yield w
                spans.append((label, t0, clock()))
        else:
            def wrapped(*a, **kw):
                t0 = clock()
                try:
                    return plain(*a, **kw)
                finally:
                    spans.append((label, t0, clock()))
        had = name in vars(owner) if not isinstance(owner, type) else True
        setattr(owner, name, wrapped)
        self._undo.append((owner, name, plain, had))

    def undo(self) -> None:
        for owner, name, plain, had in reversed(self._undo):
            if isinstance(owner, type) or had:
                setattr(owner, name, plain)
            else:
                delattr(owner, name)

    def report(self, gil: GilProbe, lag: LoopLagProbe) -> dict:
        ms = 1000.0
        by: dict[str, dict] = {}
        for label, t0, t1 in self.spans:
            row = by.setdefault(label, {"runs": 0, "ms_max": 0.0, "gil_hold_ms": 0.0, "loop_stall_ms": 0.0})
            row["runs"] += 1
            row["ms_max"] = max(row["ms_max"], (t1 - t0) * ms)
            for key, probe in (("gil_hold_ms", gil), ("loop_stall_ms", lag)):
                row[key] = max(row[key], probe.max_in([(t0, t1)]) * ms)
        return {label: {k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}
                for label, row in by.items()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration-s", type=float, default=8.0)
    p.add_argument("--rate", type=float, default=100000.0, help="entries/s put")
    p.add_argument("--entry-size", type=int, default=100)
    p.add_argument("--ledgers", type=int, default=4)
    p.add_argument("--checkpoint-every-s", type=float, default=1.0)
    p.add_argument("--phases", action="store_true", help="time each step of a checkpoint and name its longest hold")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bk-ckpt-stall-") as root:
        # with a bookie's GC settings (bk/cli/bookie.py): start-up objects frozen out of the
        # cyclic GC's sight, a 20,000-object young generation. The loop stays asyncio's own:
        # uvloop's millisecond timers would turn the 0.1 ms lag probe into a busy loop.
        eventloop.tune_gc()
        print(json.dumps(asyncio.run(_run(args, root))))


if __name__ == "__main__":
    main()
