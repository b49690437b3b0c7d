"""Compaction benchmark: compaction MB/s, and adds/s with and without a compaction
running, in the same run, on one in-process storage engine (journal on by default).

    python -m bench.gc                       # 128 MiB per dataset, 4 KiB entries
    python -m bench.gc --dataset-mib 256 --entry-bytes 1024 --rate 32MiB --json out.json

Steps (each dataset: two ledgers written interleaved, one then deleted, so every
closed log is ~50% live and a major compaction rewrites half of it):
  1. dataset 1; adds alone for --add-s seconds (baseline before);
  2. compaction alone: MB/s of records rewritten (bytes_rewritten / duration) and
     of log scanned (the compacted logs' size / duration);
  3. dataset 2; compaction again while the same adds run, for as long as it runs:
     adds/s next to a compaction, and the compaction's MB/s under load;
  4. adds alone again (baseline after).
Adds: `--in-flight` outstanding Bookie.add_entry calls on one new ledger, each
acknowledged after its journal fsync; adds/s = acknowledged / wall time. The
data lives under <repo>/.bench-tmp (removed at the end).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import time

from bk import eventloop
from bk.bookie import Bookie
from bk.config import load_config
from bk.testing.gc_host import DeletePolicy

from .stats import fmt_num

MiB = 1024 * 1024


def _entry(lid: int, eid: int, payload: bytes) -> bytes:
    return lid.to_bytes(8, "big") + eid.to_bytes(8, "big") + (-1).to_bytes(8, "big", signed=True) + payload


async def _write_dataset(b: Bookie, ledgers: tuple[int, int], total_bytes: int, entry_bytes: int) -> None:
    payload = os.urandom(entry_bytes - 24)
    key = b"k" * 20
    per_ledger = total_bytes // entry_bytes // 2
    sem = asyncio.Semaphore(2000)

    async def one(lid, eid):
        try:
            await b.add_entry(lid, eid, _entry(lid, eid, payload), key)
        finally:
            sem.release()
    tasks = []
    for eid in range(per_ledger):
        for lid in ledgers:
            await sem.acquire()
            tasks.append(asyncio.ensure_future(one(lid, eid)))
        if eid % 500 == 499:  # a checkpoint writes sorted by ledger: mix them in every log
            await b.checkpoint()
    await asyncio.gather(*tasks)
    await b.checkpoint()


async def _adds(b: Bookie, ledger_id: int, start_eid: int, entry_bytes: int, in_flight: int,
                until) -> tuple[int, float]:
    """Adds until `until()` is true; (acknowledged, seconds)."""
    payload = os.urandom(entry_bytes - 24)
    key = b"k" * 20
    done = 0
    next_eid = start_eid
    t0 = time.perf_counter()

    async def worker():
        nonlocal done, next_eid
        while not until():
            eid = next_eid
            next_eid += 1
            await b.add_entry(ledger_id, eid, _entry(ledger_id, eid, payload), key)
            done += 1
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return done, time.perf_counter() - t0


async def run(args) -> dict:
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".bench-tmp", "gc")
    shutil.rmtree(root, ignore_errors=True)
    cfg = load_config(overrides=dict(
        journal_dirs=[os.path.join(root, "journal")], ledger_dirs=[os.path.join(root, "ledgers")],
        entry_log_size_limit_bytes=args.log_bytes, gc_wait_time_ms=3_600_000,
        compaction_rate_bytes_per_s=args.rate, journal_write_data=not args.no_journal), env={})
    b = Bookie(cfg)
    await b.start()
    gc = b.gc
    out: dict = {"dataset_bytes": args.dataset_mib * MiB, "entry_bytes": args.entry_bytes, "in_flight": args.in_flight,
                 "compaction_rate_bytes_per_s": cfg.compaction_rate_bytes_per_s, "journal": not args.no_journal}
    try:
        add_ledger, eid = 100, 0

        async def adds_for(seconds):
            nonlocal eid
            end = time.perf_counter() + seconds
            n, s = await _adds(b, add_ledger, eid, args.entry_bytes, args.in_flight, lambda: time.perf_counter() >= end)
            eid += n + args.in_flight
            return n / s

        async def compaction(dead, with_adds: bool):
            nonlocal eid
            gc.policy = DeletePolicy(dead)
            logs = {i: b.storage.entry_logger.log_file_bytes(i) for i in b.storage.entry_logger.closed_log_ids()}
            t0 = time.perf_counter()
            fut = asyncio.ensure_future(asyncio.to_thread(gc.trigger, force_major=True))
            rate = None
            if with_adds:
                n, s = await _adds(b, add_ledger, eid, args.entry_bytes, args.in_flight, fut.done)
                eid += n + args.in_flight
                rate = n / s
            result = await fut
            secs = time.perf_counter() - t0
            assert result["ok"], result
            scanned = sum(logs.get(i, 0) for i in result["logs_compacted"])
            return {"seconds": round(secs, 3), "logs_compacted": len(result["logs_compacted"]),
                    "rewritten_mb_per_s": round(result["bytes_rewritten"] / secs / 1e6, 1),
                    "scanned_mb_per_s": round(scanned / secs / 1e6, 1),
                    "bytes_rewritten": result["bytes_rewritten"], "bytes_freed": result["bytes_freed"],
                    "adds_per_s_during": None if rate is None else round(rate)}

        await _write_dataset(b, (1, 2), args.dataset_mib * MiB, args.entry_bytes)
        out["adds_per_s_before"] = round(await adds_for(args.add_s))
        out["compaction_alone"] = await compaction([2], with_adds=False)
        await _write_dataset(b, (3, 4), args.dataset_mib * MiB, args.entry_bytes)
        out["compaction_with_adds"] = await compaction([4], with_adds=True)
        out["adds_per_s_after"] = round(await adds_for(args.add_s))
    finally:
        await b.stop()
        shutil.rmtree(root, ignore_errors=True)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset-mib", type=int, default=128)
    p.add_argument("--entry-bytes", type=int, default=4096)
    p.add_argument("--log-bytes", default="16MiB", help="entry_log_size_limit_bytes")
    p.add_argument("--rate", default="0", help="compaction_rate_bytes_per_s (0 = unthrottled)")
    p.add_argument("--in-flight", type=int, default=200)
    p.add_argument("--add-s", type=float, default=5.0, help="seconds of adds alone, before and after")
    p.add_argument("--no-journal", action="store_true")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    out = eventloop.run(run(args))
    alone, loaded = out["compaction_alone"], out["compaction_with_adds"]
    print(f"compaction alone:     {alone['rewritten_mb_per_s']} MB/s rewritten, {alone['scanned_mb_per_s']} MB/s "
          f"of log scanned ({alone['logs_compacted']} logs, {alone['seconds']} s)")
    print(f"compaction with adds: {loaded['rewritten_mb_per_s']} MB/s rewritten, {loaded['scanned_mb_per_s']} MB/s "
          f"scanned ({loaded['logs_compacted']} logs, {loaded['seconds']} s)")
    print(f"adds/s ({out['entry_bytes']} B, {out['in_flight']} in flight): before {fmt_num(out['adds_per_s_before'])}, "
          f"during compaction {fmt_num(loaded['adds_per_s_during'])}, after {fmt_num(out['adds_per_s_after'])}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)


if __name__ == "__main__":
    main()
