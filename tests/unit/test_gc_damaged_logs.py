"""GC and compaction never act on a partial view of an entry log (issue 27).

An entry log without its ledgers map (a crash leaves one) is learnt by a scan, and a
scan stops at the first damaged record: the ledgers it saw are only those before the
damage. Such a log is never deleted whole and never compacted on that view; what is
live in it is what the index places there. And one rule says a ledger is dead (gone
from memory AND from the committed index), for whole-log deletion and compaction alike.

Each scenario: ledger 2 (deleted) lies before a damaged record, live ledgers after it;
every live entry reads back byte for byte after GC and compaction, and after a restart.
"""
import asyncio
import json
import errno
import os

import pytest

from bk import eventloop
from bk.bookie import Bookie
from bk.errors import CorruptedStorageError, NoSuchLedgerError
from bk.entrylog.usage import read_ledgers_map
from bk.testing.corruption import damage_record_size, entry_records, logs_holding, strip_ledgers_map
from bk.testing.diskfaults import DiskFaults
from bk.testing.engine_host import engine_config, expected_entry, ledger_key
from bk.testing.gc_host import DeletePolicy

SIZE = 1000
COUNT = 20
NO_COMPACTION = dict(major_compaction_threshold=0, minor_compaction_threshold=0)


def make_config(tmp_path, **extra):
    values = dict(entry_log_size_limit_bytes="1MiB", flush_interval_ms=60_000, gc_wait_time_ms=3_600_000)
    values.update(extra)
    return engine_config(str(tmp_path / "d"), **values)


async def off_loop(fn, *args, **kwargs):
    return await asyncio.to_thread(fn, *args, **kwargs)


async def write(cfg, ledgers):
    """COUNT entries of each ledger, one checkpoint (records sorted by ledger in one
    log), then a clean stop: the log is closed with its ledgers map."""
    async with Bookie(cfg) as b:
        for lid in ledgers:
            for eid in range(COUNT):
                await b.add_entry(lid, eid, expected_entry(1, lid, eid, SIZE), ledger_key(1, lid))
        await b.checkpoint()


def damage_after(cfg, ledger_id, strip=True):
    """Garble the size field of `ledger_id`'s last record in the one log holding it;
    with `strip` the log loses its ledgers map first (as after a crash). Returns the path."""
    (path, _first, last), = logs_holding(cfg.ledger_dirs, ledger_id)
    if strip:
        strip_ledgers_map(path)
    damage_record_size(path, last)
    return path, last


async def check(b, ledgers, count=COUNT):
    for lid in ledgers:
        for eid in range(count):
            assert await b.read_entry(lid, eid) == expected_entry(1, lid, eid, SIZE), (lid, eid)


def log_id_of(path):
    return int(os.path.basename(path).split(".")[0], 16)


def test_map_less_log_damaged_in_the_middle_is_not_deleted_whole(tmp_path):
    """Fails before: the scan saw ledger 2 only; once 2 was deleted the log looked empty
    and was deleted with ledgers 3 and 4 in it."""
    cfg = make_config(tmp_path, **NO_COMPACTION)
    asyncio.run(write(cfg, [2, 3, 4]))
    (path, _, _), = logs_holding(cfg.ledger_dirs, 2)
    mapped = read_ledgers_map(path)
    path, damaged_at = damage_after(cfg, 2)
    log_id = log_id_of(path)

    async def main():
        async with Bookie(cfg) as b:
            b.gc.policy = DeletePolicy([2])
            out = await off_loop(b.gc.trigger)
            assert out["ledgers_deleted"] == [2]
            assert log_id not in out["logs_deleted"] and os.path.exists(path)
            st = b.gc.status()
            assert st["damaged_logs"] == {f"{log_id:x}": f"bad size field at offset {damaged_at}"}
            usage = {r["log_id"]: r for r in b.gc.entry_log_usage()}[log_id]
            # the index's view: ledgers 3 and 4, each COUNT records, as the log's own map had them
            assert usage["ledgers"] == {str(lid): n for lid, n in mapped.items() if lid != 2}
            assert usage["damage"].startswith("bad size field")
            await check(b, [3, 4])
            out = await off_loop(b.gc.trigger)  # a second pass keeps it too
            assert log_id not in out["logs_deleted"] and os.path.exists(path)
        async with Bookie(cfg) as b:
            await check(b, [3, 4])
            with pytest.raises(NoSuchLedgerError):
                await b.read_entry(2, 0)
    eventloop.run(main())


@pytest.mark.parametrize("live_before", [False, True], ids=["deleted-first", "live-first"])
def test_compaction_of_a_damaged_log_copies_what_the_index_places_past_the_damage(tmp_path, live_before):
    """Fails before: compaction copied what its scan saw (ledger 1), found no location
    of those ledgers left in the log and deleted it with ledgers 3 and 4 in it."""
    cfg = make_config(tmp_path)
    ledgers = [1, 2, 3, 4] if live_before else [2, 3, 4]
    asyncio.run(write(cfg, ledgers))
    path, _ = damage_after(cfg, 2)
    log_id = log_id_of(path)
    live = [lid for lid in ledgers if lid != 2]

    async def main():
        async with Bookie(cfg) as b:
            b.gc.policy = DeletePolicy([2])
            out = await off_loop(b.gc.trigger, force_major=True)
            assert out["ok"], out
            assert log_id in out["logs_compacted"] and not os.path.exists(path)
            assert b.gc.status()["damaged_logs"] == {}
            await check(b, live)
        async with Bookie(cfg) as b:
            await check(b, live)
            assert b.storage.index.locations_in_logs([log_id]) == {log_id: []}
    eventloop.run(main())


def test_a_damaged_entry_the_index_still_places_keeps_its_log(tmp_path):
    """The damaged record is a live entry's: everything else is copied, the log stays
    (the entry answers EIO, never "no such entry") and the pass says why."""
    cfg = make_config(tmp_path)
    asyncio.run(write(cfg, [2, 3, 4]))
    (path, _first, _last), = logs_holding(cfg.ledger_dirs, 3)
    strip_ledgers_map(path)
    (_p, offset, _size), = entry_records(cfg.ledger_dirs, 3, 5)
    damage_record_size(path, offset)
    log_id = log_id_of(path)

    async def main():
        async with Bookie(cfg) as b:
            b.gc.policy = DeletePolicy([2])
            out = await off_loop(b.gc.trigger, force_major=True)
            assert os.path.exists(path) and log_id not in out["logs_compacted"]
            assert any(f"{log_id:x} is damaged" in e and "1 unreadable" in e for e in out["errors"]), out
            await check(b, [4])
            for eid in [e for e in range(COUNT) if e != 5]:
                assert await b.read_entry(3, eid) == expected_entry(1, 3, eid, SIZE)
            with pytest.raises(CorruptedStorageError):
                await b.read_entry(3, 5)
            # only the damaged entry is left in the log, by the index
            assert [(lid, eid) for lid, eid, _ in b.storage.index.locations_in_logs([log_id])[log_id]] == [(3, 5)]
    eventloop.run(main())


def test_torn_tail_without_map_is_kept_until_the_index_is_empty_there(tmp_path):
    """A crash's log (no map, a torn last record) whose scan saw only deleted ledger 2
    before the tear: kept while the index places ledger 3 there, deleted once not."""
    cfg = make_config(tmp_path, **NO_COMPACTION)
    asyncio.run(write(cfg, [2, 3]))
    (path, _first, last), = logs_holding(cfg.ledger_dirs, 2)
    strip_ledgers_map(path)
    with open(path, "r+b") as fh:  # the size of 2's last record now runs past the file's end
        fh.seek(last)
        fh.write((os.path.getsize(path)).to_bytes(4, "big"))
    log_id = log_id_of(path)

    async def main():
        async with Bookie(cfg) as b:
            b.gc.policy = DeletePolicy([2])
            out = await off_loop(b.gc.trigger)
            assert log_id not in out["logs_deleted"] and os.path.exists(path)
            assert b.gc.status()["damaged_logs"][f"{log_id:x}"].startswith("torn tail")
            await check(b, [3])
            b.gc.policy = DeletePolicy([3])
            out = await off_loop(b.gc.trigger)
            assert out["ledgers_deleted"] == [3] and log_id in out["logs_deleted"], out
            assert not os.path.exists(path)
    eventloop.run(main())


@pytest.fixture
def faults():
    f = DiskFaults.install()
    yield f
    DiskFaults.uninstall()


def test_a_delete_whose_checkpoint_failed_leaves_its_entries_to_compaction(tmp_path, faults):
    """One rule for "dead". The index commit inside the delete fails (a full disk): the
    ledger is gone from memory only, the index still names its entries. Fails before:
    compaction took memory's word, did not copy ledger 2 and deleted its log; after a
    restart (whose stop could not checkpoint either) the index brought ledger 2 back
    with locations that answer EIO."""
    cfg = make_config(tmp_path, **NO_COMPACTION)
    asyncio.run(write(cfg, [2, 3, 5]))
    (path, _, _), = logs_holding(cfg.ledger_dirs, 2)
    log_id = log_id_of(path)

    async def main():
        async with Bookie(cfg) as b:
            b.gc.policy = DeletePolicy([5])  # dead for good: the log is under 1.0 usage now
            assert (await off_loop(b.gc.trigger))["ledgers_deleted"] == [5]
            rule = faults.fail(op="commit", errno=errno.ENOSPC, count=None)  # until healed
            b.gc.policy = DeletePolicy([2])
            out = await off_loop(b.gc.trigger)
            assert faults.hits(rule) >= 1 and not out["ok"], out
            assert out["ledgers_deleted"] == [] and not b.ledger_exists(2)  # forgotten in memory only
            faults.heal(rule)
            out = await off_loop(b.gc.compact_logs, [log_id])  # the next pass compacts its log
            assert out["plan"] == {log_id: "compacted"}, out
            await check(b, [3])
            faults.fail(op="commit", errno=errno.ENOSPC, count=None)  # the stop's checkpoint fails too
        faults.heal()
        async with Bookie(cfg) as b:
            assert b.was_unclean_shutdown
            assert b.ledger_exists(2)  # the delete never became durable: it is back, whole
            await check(b, [2, 3])
            b.gc.policy = DeletePolicy([2])
            out = await off_loop(b.gc.trigger)
            assert out["ok"] and out["ledgers_deleted"] == [2], out
            await check(b, [3])
    eventloop.run(main())


def test_shell_reports_a_damaged_log(tmp_path, capsys):
    """listfilesondisc marks the log DAMAGED with what the index still places in it;
    gcstatus (the GC's status through the same formatter) names it."""
    from bk.cli import shell_gc
    from bk.cli.main import main as bk_main
    cfg = make_config(tmp_path, **NO_COMPACTION)
    asyncio.run(write(cfg, [2, 3, 4]))
    path, damaged_at = damage_after(cfg, 2)
    log_id = log_id_of(path)
    assert bk_main(["shell", "--json", "listfilesondisc", "--ledger-dirs", *cfg.ledger_dirs]) == 0
    listed = json.loads(capsys.readouterr().out)
    row, = [r for r in listed["entry_logs"] if r["log_id"] == log_id]
    assert row["damage"] == f"torn tail at offset {damaged_at}" or row["damage"].startswith("bad size")
    assert row["indexed_entries"] == 3 * COUNT and listed["damaged_logs"] == 1
    assert bk_main(["shell", "listfilesondisc", "--ledger-dirs", *cfg.ledger_dirs]) == 0
    text = capsys.readouterr().out
    assert f"DAMAGED ({row['damage']}; the index places {3 * COUNT} entries here)" in text
    assert "1 damaged entry logs" in text

    async def status():
        async with Bookie(cfg) as b:
            await off_loop(b.gc.trigger)
            return b.gc.status()
    st = eventloop.run(status())
    shell_gc._call = lambda args, op, **kw: dict(st)  # the admin socket's answer, as the shell reads it
    text = shell_gc.gcstatus(None, None)["text"]
    assert f"DAMAGED entry log {log_id:x}: bad size field at offset {damaged_at}" in text
