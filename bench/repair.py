"""BP-46 measurements: phase one at scale, and a bookie repairing itself beside manual recovery.

    python -m bench.repair                          # 100,000 ledgers for phase one; 256 MB repaired
    python -m bench.repair --phase-one-ledgers 20000 --mb 64 --json out.json

Phase one (in-memory metadata store, one Bookie on a temporary directory): N ledgers'
metadata name the bookie; `run_phase_one` reads all of it, fences every ledger and puts it
in limbo, and makes it durable with one checkpoint. Printed: seconds and ledgers per second.

Repair beside manual recovery (real ZooKeeper, real `bk bookie` processes, journal off):
three bookies V, A, B hold `--mb` MB in `--entry-size` entries over four ledgers E=3 WQ=3
AQ=2, so V holds all of it. V is stopped and its disks wiped, then started with cookie
stamping on: phase one, then phase two copies everything back from A and B. Its MB/s is
bytes copied over the repair's own elapsed time (its status). Then a fourth bookie T joins,
V is stopped and wiped again, and `BookieRecovery` (what `bk shell recover` runs) copies V's
share to T: its MB/s over its own run, in the same run of this script, on the same data.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time

from bk import eventloop

KiB = 1024


async def phase_one(ledgers: int) -> dict:
    from bk.bookie import Bookie
    from bk.config import load_config
    from bk.meta import open_store
    from bk.meta.cluster import init_new_cluster
    from bk.meta.ledger_manager import LedgerManager
    from bk.meta.ledger_metadata import LedgerMetadata
    from bk.server.integrity import run_phase_one

    uri = f"mem://bench-phase-one-{os.getpid()}/ledgers"
    store = await open_store(uri)
    await init_new_cluster(store)
    me, others = "127.0.0.1:3181", ["127.0.0.1:3182", "127.0.0.1:3183", "127.0.0.1:3184"]
    lm = LedgerManager(store)
    t0 = time.perf_counter()
    for i in range(ledgers):
        md = LedgerMetadata.new((me, others[i % 3], others[(i + 1) % 3]), 2, 2, password=b"pw")
        await lm.create_ledger_metadata(i, md)
    created_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="bk-phase-one-") as d:
        cfg = load_config(overrides=dict(metadata_service_uri=uri, journal_dirs=[f"{d}/j"], ledger_dirs=[f"{d}/l"],
                                         journal_write_data=False), env={})
        bookie = Bookie(cfg)
        await bookie.start()
        try:
            t0 = time.perf_counter()
            result = await run_phase_one(store, bookie, me, "benchmark")
            elapsed = time.perf_counter() - t0
            assert result.ledgers_marked == ledgers and len(bookie.limbo_ledgers()) == ledgers
        finally:
            await bookie.stop()
    await store.close()
    return {"ledgers": ledgers, "seconds": round(elapsed, 3), "ledgers_per_s": round(ledgers / elapsed),
            "metadata_created_s": round(created_s, 3)}


async def _fill(uri: str, mb: int, entry_size: int) -> tuple[list[int], int]:
    from bk.client import BookKeeper

    payload = os.urandom(entry_size)
    per_ledger = max(1, mb * 1024 * 1024 // entry_size // 4)
    ids = []
    async with BookKeeper(uri) as bkc:
        for _ in range(4):
            lh = await bkc.create_ledger(3, 3, 2, password=b"pw")
            window = asyncio.Semaphore(64)
            errors = []

            def done(_eid, err, window=window):
                window.release()
                if err is not None:
                    errors.append(err)
            for _ in range(per_ledger):
                await window.acquire()
                lh.async_add_entry(payload, done)
            for _ in range(64):
                await window.acquire()
            if errors:
                raise errors[0]
            await lh.close()
            ids.append(lh.ledger_id)
    return ids, per_ledger * 4 * entry_size


def _wipe(cluster, i: int) -> None:
    cluster.stop_bookie(i)
    shutil.rmtree(os.path.join(cluster.data_dir, f"bookie-{i}"))


def _repair_status(uri: str, bookie_id: str) -> dict | None:
    from bk.testing.cluster import run_shell
    out = run_shell(uri, "--json", "repairstatus", bookie_id)
    return json.loads(out.stdout)["bookies"][0]["repair"] if out.returncode == 0 else None


def repair_vs_manual(mb: int, entry_size: int) -> dict:
    from bk.client import BookKeeper
    from bk.replication import BookieRecovery
    from bk.testing.cluster import LocalCluster

    base = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".bench-tmp")
    os.makedirs(base, exist_ok=True)
    data = tempfile.mkdtemp(prefix="repair-", dir=base)
    cluster = LocalCluster(data, bookies=3, journal_write_data=False, write_cache_max_size_bytes="64MiB")
    try:
        cluster.start()
        uri = cluster.metadata_uri
        _ledgers, nbytes = eventloop.run(_fill(uri, mb, entry_size))
        victim = cluster.bookies[0].bookie_id
        _wipe(cluster, 0)
        cluster.add_bookie(0, wait=True, data_integrity_cookie_stamping_enabled=True)
        while True:
            st = _repair_status(uri, victim)
            if st is not None and st["state"] == "done":
                break
            time.sleep(0.2)
        repair = {"bytes": st["bytes_copied"], "entries": st["entries_copied"], "seconds": st["elapsed_s"],
                  "mb_per_s": round(st["bytes_copied"] / 1e6 / st["elapsed_s"], 1)}
        cluster.add_bookie(3, wait=True)
        _wipe(cluster, 0)

        async def manual():
            async with BookKeeper(uri) as bkc:
                t0 = time.perf_counter()
                summary = await BookieRecovery(bkc).recover(victim, target=cluster.bookies[3].bookie_id)
                return summary, time.perf_counter() - t0
        summary, seconds = eventloop.run(manual())
        copied = sum(r.bytes for r in summary.results)
        manual_fig = {"bytes": copied, "seconds": round(seconds, 3), "mb_per_s": round(copied / 1e6 / seconds, 1)}
        return {"payload_bytes": nbytes, "entry_size": entry_size, "repair": repair, "manual_recovery": manual_fig}
    finally:
        cluster.stop()
        shutil.rmtree(data, ignore_errors=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phase-one-ledgers", type=int, default=100_000)
    p.add_argument("--mb", type=int, default=256, help="MB the repaired bookie lost (0: skip that part)")
    p.add_argument("--entry-size", type=int, default=64 * KiB)
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args(argv)
    out = {}
    if args.phase_one_ledgers:
        out["phase_one"] = r = eventloop.run(phase_one(args.phase_one_ledgers))
        print(f"phase one: {r['ledgers']:,} ledgers fenced and in limbo in {r['seconds']} s"
              f" ({r['ledgers_per_s']:,} ledgers/s; in-memory metadata store)")
    if args.mb:
        out["repair"] = r = repair_vs_manual(args.mb, args.entry_size)
        rp, mr = r["repair"], r["manual_recovery"]
        print(f"repair (phase two, wiped bookie): {rp['bytes'] / 1e6:.0f} MB in {rp['seconds']} s ="
              f" {rp['mb_per_s']} MB/s ({rp['entries']:,} entries of {r['entry_size']} B)")
        print(f"manual recovery (BookieRecovery to a new bookie): {mr['bytes'] / 1e6:.0f} MB in {mr['seconds']} s ="
              f" {mr['mb_per_s']} MB/s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
