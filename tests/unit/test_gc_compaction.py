"""GC and compaction inside one storage engine (bk.bookie.gc, bk.bookie.compactor):
whole-log deletion, compaction with the conditional index switch, an interrupted
compaction finished by the next pass, reads racing a compaction, disks full, and
the read-only gaps (recovery adds, WRITE_LAC, force_read_only)."""
import asyncio
import os

import pytest

from bk import eventloop
from bk.bookie import Bookie
from bk.entrylog import logger as logger_mod
from bk.entrylog.logger import DiskUsage
from bk.errors import BookieReadOnlyError, NoSuchLedgerError
from bk.index import Index
from bk.testing.engine_host import engine_config, expected_entry, ledger_key
from bk.testing.gc_host import DeletePolicy

SIZE = 1000


class Unreachable:
    async def find_garbage(self, local, delete):
        raise ConnectionError("metadata store unreachable")


def make_config(tmp_path, **extra):
    values = dict(entry_log_size_limit_bytes="64KiB", flush_interval_ms=100, gc_wait_time_ms=3_600_000)
    values.update(extra)
    return engine_config(str(tmp_path / "d"), **values)


def log_bytes(cfg) -> int:
    d = os.path.join(cfg.ledger_dirs[0], "current")
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".log"))


async def off_loop(fn, *args, **kwargs):
    """GC calls block and need the loop (owner thread): never call them on it."""
    return await asyncio.to_thread(fn, *args, **kwargs)


async def add(b, lid, eid, seed=1):
    await b.add_entry(lid, eid, expected_entry(seed, lid, eid, SIZE), ledger_key(1, lid))


async def fill(b, ledgers, count, start=0, per_checkpoint=10):
    """Adds to the ledgers in turn; a checkpoint every `per_checkpoint` rounds (a
    checkpoint writes its entries sorted by ledger: this mixes ledgers in each log)."""
    for eid in range(start, start + count):
        for lid in ledgers:
            await add(b, lid, eid)
        if (eid - start) % per_checkpoint == per_checkpoint - 1:
            await b.checkpoint()
    await b.checkpoint()


async def check_ledger(b, lid, count, seed=1):
    for eid in range(count):
        assert await b.read_entry(lid, eid) == expected_entry(seed, lid, eid, SIZE), (lid, eid)


def test_gc_deletes_whole_logs_and_compacts_the_rest(tmp_path):
    cfg = make_config(tmp_path)

    async def main():
        async with Bookie(cfg) as b:
            await fill(b, [5], 150)  # ledger 5 alone: logs of its own
            await fill(b, [1, 2, 3], 150)  # interleaved
            await fill(b, [4], 10)
            before = log_bytes(cfg)
            held = {lid: sum(m.get(lid, 0) for m in map(b.storage.entry_logger.ledgers_map,
                                                         b.storage.entry_logger.log_ids())) for lid in (2, 5)}
            b.gc.policy = DeletePolicy([2, 5])
            out = await off_loop(b.gc.trigger)
            assert out["ok"], out
            assert out["ledgers_deleted"] == [2, 5]
            assert out["logs_deleted"] and out["logs_compacted"] and out["compaction"] == "major"
            after = log_bytes(cfg)
            # the deleted ledgers' records are gone; what is left is at most the
            # survivors plus a few headers/maps and the current log's slack
            assert before - after >= held[2] + held[5] - 64 * 1024, (before, after, held)
            assert out["bytes_freed"] > 0 and out["bytes_rewritten"] > 0
            for lid in (1, 3):
                await check_ledger(b, lid, 150)
            await check_ledger(b, 4, 10)
            for lid in (2, 5):
                with pytest.raises(NoSuchLedgerError):
                    await b.read_entry(lid, 0)
            st = b.gc.status()
            assert st["passes"] == 1 and st["ledgers_deleted"] == 2 and st["compacting_logs"] == []
            assert all(r["usage"] >= 0.8 for r in b.gc.entry_log_usage() if r["source"] != "memory")
        async with Bookie(cfg) as b:
            for lid in (1, 3):
                await check_ledger(b, lid, 150)
            assert not b.ledger_exists(2) and not b.ledger_exists(5)
    eventloop.run(main())


def test_index_switch_is_conditional(tmp_path):
    idx = Index(str(tmp_path / "index"), make_config(tmp_path))
    try:
        with idx.write() as w:
            w.put_locations([(1, 0, 100), (1, 1, 200)])
        with idx.write() as w:
            moved = w.switch_locations([(1, 0, 100, 900), (1, 1, 555, 901), (1, 2, 300, 902)])
        assert moved == 1
        assert idx.get_locations([(1, 0), (1, 1), (1, 2)]) == [900, 200, None]
    finally:
        idx.close()


def test_entry_rewritten_during_compaction_keeps_its_newer_location(tmp_path):
    cfg = make_config(tmp_path, major_compaction_threshold=1.0, minor_compaction_threshold=1.0)

    async def main():
        async with Bookie(cfg) as b:
            await fill(b, [1], 150)
            storage = b.storage
            log_id = storage.entry_logger.closed_log_ids()[0]
            keys = [(1, e) for e in range(150)]
            stale = storage.index.get_locations(keys)
            victim = next(e for e, loc in enumerate(stale) if loc >> 32 == log_id)
            await add(b, 1, victim, seed=2)  # re-added: a newer location in the current log
            await b.checkpoint()
            real = storage.index.get_locations
            # the compactor's pre-check sees the old locations (as if the checkpoint
            # came right after it): only the switch inside the transaction protects
            storage.index.get_locations = lambda ks: [dict(zip(keys, stale))[k] for k in ks]
            try:
                r = await off_loop(b.gc.compactor.compact, log_id, lambda lid: True)
            finally:
                storage.index.get_locations = real
            assert r.deleted and r.entries_switched == r.entries_copied - 1
            assert await b.read_entry(1, victim) == expected_entry(2, 1, victim, SIZE)
            for eid in range(150):
                if eid != victim:
                    assert await b.read_entry(1, eid) == expected_entry(1, 1, eid, SIZE)
    eventloop.run(main())


class Crash(Exception):
    pass


@pytest.mark.parametrize("step", ["after_copy", "after_switch", "before_delete", "after_delete"])
def test_interrupted_compaction_is_finished_by_the_next_pass(tmp_path, step):
    cfg = make_config(tmp_path)

    async def main():
        b = Bookie(cfg)
        await b.start()
        await fill(b, [1, 2], 150)
        b.gc.policy = DeletePolicy([2])

        def hook(s, log_id):
            if s == step:
                raise Crash(s)
        b.gc.compactor.step_hook = hook
        out = await off_loop(b.gc.trigger)
        assert any("Crash" in e for e in out["errors"]), out
        assert b.gc.compactor.pending(), "the marker must outlive the interruption"
        await b.stop()
        b = Bookie(cfg)  # a restart: its first pass finishes the compaction
        await b.start()
        try:
            await check_ledger(b, 1, 150)
            out = await off_loop(b.gc.trigger)
            assert out["ok"], out
            assert b.gc.compactor.pending() == []
            await check_ledger(b, 1, 150)
            assert not b.ledger_exists(2)
            assert all(r["usage"] > 0.8 for r in b.gc.entry_log_usage())
        finally:
            await b.stop()
    eventloop.run(main())


def test_a_read_racing_compaction_follows_the_moved_entry(tmp_path):
    cfg = make_config(tmp_path)

    async def main():
        async with Bookie(cfg) as b:
            await fill(b, [1, 2], 100)
            storage = b.storage
            storage.read_cache.max_size_bytes = 0
            old = storage.index.get_location(1, 3)
            b.gc.policy = DeletePolicy([2])
            assert (await off_loop(b.gc.trigger))["logs_compacted"]
            assert storage.index.get_location(1, 3) != old
            real, calls = storage.index.get_location, []

            def first_stale(lid, eid):  # the lookup happened before the switch
                calls.append((lid, eid))
                return old if len(calls) == 1 else real(lid, eid)
            storage.index.get_location = first_stale
            try:
                got = await off_loop(storage.read_from_storage, 1, 3)
            finally:
                storage.index.get_location = real
            assert got == expected_entry(1, 1, 3, SIZE) and len(calls) == 2
    eventloop.run(main())


def test_a_failed_metadata_scan_deletes_nothing(tmp_path):
    cfg = make_config(tmp_path)

    async def main():
        async with Bookie(cfg) as b:
            await fill(b, [1, 2], 100)
            before = log_bytes(cfg)
            b.gc.policy = Unreachable()
            out = await off_loop(b.gc.trigger)
            assert not out["ok"] and "unreachable" in out["errors"][0]
            assert out["ledgers_deleted"] == [] and b.ledger_exists(2)
            assert log_bytes(cfg) >= before
            await check_ledger(b, 2, 100)
            b.gc.policy = DeletePolicy([2, 77])  # 77 is not local: ignored
            out = await off_loop(b.gc.trigger)
            assert out["ledgers_deleted"] == [2]
    eventloop.run(main())


@pytest.mark.parametrize("allow", [False, True])
def test_disks_full_suspend_compaction_unless_forced_gc_is_allowed(tmp_path, monkeypatch, allow):
    cfg = make_config(tmp_path, is_force_gc_allow_when_no_space=allow, disk_usage_threshold=0.9)

    async def main():
        async with Bookie(cfg) as b:
            await fill(b, [1, 2], 100)
            monkeypatch.setattr(logger_mod, "_dir_space", lambda path: DiskUsage(100, 1, 0.99))
            b.gc.policy = DeletePolicy([2])
            out = await off_loop(b.gc.run_pass)  # a scheduled pass, nothing due by the clock
            assert out["ledgers_deleted"] == [2]
            assert bool(out["logs_compacted"]) == allow
            assert out["compaction"] == ("major" if allow else None)
            if allow:
                assert b.gc._next_wait_s() == cfg.disk_check_interval_ms / 1000.0
            await check_ledger(b, 1, 100)
    eventloop.run(main())


def test_read_only_accepts_recovery_adds_and_refuses_write_lac(tmp_path):
    cfg = make_config(tmp_path, force_read_only=True)

    async def main():
        async with Bookie(cfg) as b:
            assert b.read_only
            b.set_read_only(False)
            assert b.read_only, "force_read_only wins"
            body = expected_entry(1, 1, 0, SIZE)
            with pytest.raises(BookieReadOnlyError):
                await b.add_entry(1, 0, body, ledger_key(1, 1))
            await b.add_entry(1, 0, body, ledger_key(1, 1), recovery=True)
            assert await b.read_entry(1, 0) == body
            with pytest.raises(BookieReadOnlyError):
                await b.write_lac(1, ledger_key(1, 1), b"lac")
    eventloop.run(main())


def test_compact_logs_compacts_exactly_the_planned_logs(tmp_path):
    """A compaction plan (bk analytics gc -> bk shell compact): the pass's scan-and-compare
    runs first, then exactly the listed logs are compacted, whatever their usage and
    whatever the thresholds say; the others, the current log and unknown ids are left."""
    cfg = make_config(tmp_path, major_compaction_threshold=0.0, minor_compaction_threshold=0.0)

    async def main():
        async with Bookie(cfg) as b:
            await fill(b, [1, 2, 3], 150)
            el = b.storage.entry_logger
            closed = sorted(el.closed_log_ids())
            assert len(closed) >= 4
            planned, kept = closed[:2], closed[2:]
            current = el.current_log_id
            b.gc.policy = DeletePolicy([2])
            out = await off_loop(b.gc.compact_logs, planned + [current, 0xFFFF])
            assert out["ok"], out
            assert out["ledgers_deleted"] == [2], "scan and compare ran first"
            assert out["compaction"] == "plan"
            assert out["plan"] == {**{i: "compacted" for i in planned}, current: "current", 0xFFFF: "not found"}
            assert sorted(out["logs_compacted"]) == planned and out["bytes_rewritten"] > 0
            left = set(el.log_ids())
            assert not left & set(planned) and set(kept) <= left, "only the planned logs went"
            for lid in (1, 3):
                await check_ledger(b, lid, 150)
            with pytest.raises(ValueError):
                b.gc.compact_logs([-1])
    eventloop.run(main())


def test_admin_socket_compacts_a_plan(tmp_path):
    from bk.server.admin import AdminServer, admin_call, gc_ops

    cfg = make_config(tmp_path, major_compaction_threshold=0.0, minor_compaction_threshold=0.0)

    async def main():
        async with Bookie(cfg) as b:
            await fill(b, [1, 2], 120)
            first = sorted(b.storage.entry_logger.closed_log_ids())[0]
            server = AdminServer(str(tmp_path / "a.sock"), gc_ops(b.gc))
            assert await server.start()
            try:
                out = await off_loop(admin_call, server.path, "gc_compact_logs", log_ids=[first])
                assert out["plan"] == {str(first): "compacted"}
                with pytest.raises(Exception, match="log_ids must be"):
                    await off_loop(admin_call, server.path, "gc_compact_logs", log_ids="1")
            finally:
                await server.stop()
    eventloop.run(main())
