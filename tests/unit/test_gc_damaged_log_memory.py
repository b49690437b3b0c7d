"""GC's look at a damaged entry log costs bounded memory, whatever the index places in it.

A damaged 1 GiB log of small entries holds millions of locations; GC used to materialise
every one of them (a list of tuples, and a list of their record sizes) each time it asked
the index what is live in such a log, and again right before deleting it: a bookie could
be killed for memory by its own GC pass, and again at every restart. Here the index places
400,000 locations of ledger 3 in a damaged log; a GC pass (no compaction) must stay within
a bound that does not grow with that number (tracemalloc's peak)."""
import asyncio
import tracemalloc

from bk import eventloop
from bk.bookie import Bookie
from bk.index import Index
from bk.testing.gc_host import DeletePolicy

from tests.unit.test_gc_damaged_logs import NO_COMPACTION, damage_after, log_id_of, make_config, off_loop, write

NAMED = 400_000
PEAK_BOUND = 24 * 1024 * 1024  # the index walk's own batch is ~7 MiB; the old lists were ~60 MiB


def test_gc_pass_over_a_damaged_log_with_many_locations_has_bounded_memory(tmp_path):
    cfg = make_config(tmp_path, **NO_COMPACTION)
    asyncio.run(write(cfg, [2, 3]))
    path, _ = damage_after(cfg, 2)
    log_id = log_id_of(path)
    idx = Index(cfg.resolved_index_dir, cfg)
    try:
        with idx.write() as w:  # ledger 3's further entries, as the index names them in the log
            base = 1000
            w.put_location_lists([3] * NAMED, list(range(base, base + NAMED)),
                                 [(log_id << 32) | (1 << 31) | i for i in range(NAMED)])
        idx.sync()
    finally:
        idx.close()

    async def main():
        async with Bookie(cfg) as b:
            b.gc.policy = DeletePolicy([2])
            tracemalloc.start()
            try:
                out = await off_loop(b.gc.trigger)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert out["ledgers_deleted"] == [2] and log_id not in out["logs_deleted"], out
            assert peak < PEAK_BOUND, f"GC pass peaked at {peak / 2**20:.1f} MiB"
            usage = {r["log_id"]: r for r in b.gc.entry_log_usage()}[log_id]
            assert set(usage["ledgers"]) == {"3"}
    eventloop.run(main())
