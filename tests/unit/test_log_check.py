"""The entry-log check of every start (bk.bookie.log_check): entries whose entry log is missing
or cut short are missing, never "stored"; reads of them are errors, never "no such entry";
a copy replaces the dead location; no new log takes a lost id; `bk shell entrylogcheck`."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys

import pytest

from bk.bookie import Bookie
from bk.bookie.log_check import check_entry_logs
from bk.formats import entrylog as fmt
from bk.errors import LedgerLimboError, NoSuchEntryError, StorageError
from bk.testing.cluster import write_toml

from test_bookie import KEY, entry, make_config

LEDGERS, ENTRIES = (1, 2, 3), 120
PAYLOAD = bytes(700)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def two_dirs(tmp_path, **kw):
    return make_config(tmp_path, ledger_dirs=[str(tmp_path / "l0"), str(tmp_path / "l1")],
                       entry_log_size_limit_bytes="64KiB", **kw)


def body(lid: int, eid: int) -> bytes:
    return entry(lid, eid, PAYLOAD + b"%d-%d" % (lid, eid))


async def fill(cfg) -> None:
    """Several entry logs (64 KiB each), everything checkpointed, a clean stop."""
    b = Bookie(cfg)
    await b.start()
    for eid in range(ENTRIES):
        for lid in LEDGERS:
            await b.add_entry(lid, eid, body(lid, eid), KEY)
        if eid % 10 == 9:
            await b.checkpoint()
    await b.stop()


def locations(cfg) -> dict[tuple[int, int], int]:
    from bk.index import Index
    index = Index(cfg.resolved_index_dir, cfg, readonly=True)
    try:
        return {(lid, eid): loc for lid, eid, loc in index.iter_locations()}
    finally:
        index.close()


def filled(tmp_path):
    """A stopped bookie with several entry logs, and where its index places every entry."""
    cfg = two_dirs(tmp_path)
    run(fill(cfg))
    return cfg, locations(cfg)


def move_logs(cfg, log_ids) -> None:
    """Put these logs in the second ledger dir (a bookie spreads its logs over its dirs)."""
    src, dst = fmt.log_dir(cfg.ledger_dirs[0]), fmt.log_dir(cfg.ledger_dirs[1])
    os.makedirs(dst, exist_ok=True)
    for log_id in log_ids:
        name = fmt.log_file_name(log_id)
        if os.path.exists(os.path.join(dst, name)):
            continue  # the bookie put it there itself (it picks a dir by free space, which other tests move)
        os.rename(os.path.join(src, name), os.path.join(dst, name))


def test_wiped_second_ledger_dir_entries_are_missing_and_reads_fail(tmp_path):
    cfg, where = filled(tmp_path)
    logs = sorted({loc >> 32 for loc in where.values()})
    assert len(logs) >= 4
    lost_logs = {logs[1], logs[-1]}  # one in the middle, and the highest: its id must not be reborn
    move_logs(cfg, lost_logs)
    shutil.rmtree(cfg.ledger_dirs[1])  # the wiped disk
    lost = {k for k, loc in where.items() if loc >> 32 in lost_logs}

    async def main():
        b = Bookie(cfg)
        await b.start()
        try:
            found = b.log_check
            assert {d.log_id for d in found.dead_logs} == lost_logs
            assert all(d.state == "missing" for d in found.dead_logs)
            assert found.dead_entries == len(lost) and found.locations == len(where)
            assert found.ledgers == {lid: sum(1 for k in lost if k[0] == lid) for lid in LEDGERS if any(
                k[0] == lid for k in lost)}
            assert b.storage.entry_logger.current_log_id > max(lost_logs)
            for lid in LEDGERS:
                want = sorted(e for (l, e) in lost if l == lid)
                assert b.missing_entries(lid, range(ENTRIES)) == want
            lid, eid = min(lost)
            with pytest.raises(StorageError):  # EIO: another replica is asked, never ENOENTRY
                await b.read_entry(lid, eid)
            # a copy (a recovery add) replaces the dead location, durably
            await b.add_entry(lid, eid, body(lid, eid), KEY, recovery=True)
            assert eid not in b.missing_entries(lid, range(ENTRIES))
            await b.checkpoint()
            assert eid not in b.missing_entries(lid, range(ENTRIES))
            assert await b.read_entry(lid, eid) == body(lid, eid)
        finally:
            await b.stop()
        b = Bookie(cfg)
        await b.start()
        try:
            assert b.log_check.dead_entries == len(lost) - 1  # found again at every start until copied
            assert await b.read_entry(lid, eid) == body(lid, eid)
        finally:
            await b.stop()
    run(main())


def test_truncated_log_entries_past_the_cut_are_missing(tmp_path):
    cfg, where = filled(tmp_path)
    logs = sorted({loc >> 32 for loc in where.values()})
    victim = logs[1]
    in_victim = sorted((loc & 0xFFFFFFFF, k) for k, loc in where.items() if loc >> 32 == victim)
    # cut in the middle of a record: it and every later one are gone, the earlier ones whole
    cut_record = len(in_victim) // 2
    cut_at = in_victim[cut_record][0] + 100
    path = os.path.join(fmt.log_dir(cfg.ledger_dirs[0]), fmt.log_file_name(victim))
    os.truncate(path, cut_at)
    gone = {k for _, k in in_victim[cut_record:]}

    async def main():
        b = Bookie(cfg)
        await b.start()
        try:
            (d,) = b.log_check.dead_logs
            assert (d.log_id, d.state, d.file_bytes) == (victim, "truncated", cut_at)
            assert d.dead == len(gone) and d.dead_from == in_victim[cut_record][0]
            for lid in LEDGERS:
                assert b.missing_entries(lid, range(ENTRIES)) == sorted(e for (l, e) in gone if l == lid)
            whole = in_victim[cut_record - 1][1]
            assert await b.read_entry(*whole) == body(*whole)
            with pytest.raises(StorageError):
                await b.read_entry(*in_victim[cut_record][1])
        finally:
            await b.stop()
    run(main())


def test_whole_logs_report_nothing_and_ledgers_map_truncation_is_harmless(tmp_path):
    cfg, where = filled(tmp_path)
    first = min(loc >> 32 for loc in where.values())
    path = os.path.join(fmt.log_dir(cfg.ledger_dirs[0]), fmt.log_file_name(first))
    # a closed log loses the tail of its ledgers map: its records are all there
    end = max(loc & 0xFFFFFFFF for loc in where.values() if loc >> 32 == first) + 4 + len(body(1, 0)) + 8
    os.truncate(path, end + 3)
    from bk.index import Index
    index = Index(cfg.resolved_index_dir, cfg, readonly=True)
    try:
        found = check_entry_logs(index, cfg.ledger_dirs, cfg.max_frame_size_bytes)
    finally:
        index.close()
    assert not found.dead_logs and found.locations == len(where) and found.dead_entries == 0


def test_limbo_ledger_with_a_lost_log_answers_an_error_never_no_such_entry(tmp_path):
    cfg, where = filled(tmp_path)
    lost_log = sorted({loc >> 32 for loc in where.values()})[2]
    os.remove(os.path.join(fmt.log_dir(cfg.ledger_dirs[0]), fmt.log_file_name(lost_log)))
    lid, eid = min(k for k, loc in where.items() if loc >> 32 == lost_log)

    async def main():
        b = Bookie(cfg)
        await b.start()
        try:
            await b.mark_for_integrity_check([(lid, KEY)])
            for _ in range(2):
                with pytest.raises((StorageError, LedgerLimboError)) as info:
                    await b.read_entry(lid, eid)
                assert not isinstance(info.value, NoSuchEntryError)
        finally:
            await b.stop()
    run(main())


def test_shell_entrylogcheck_reports_a_stopped_bookies_lost_logs(tmp_path):
    cfg = two_dirs(tmp_path)
    run(fill(cfg))
    conf = str(tmp_path / "bookie.toml")
    write_toml(conf, dict(journal_dirs=cfg.journal_dirs, ledger_dirs=cfg.ledger_dirs,
                          entry_log_size_limit_bytes=cfg.entry_log_size_limit_bytes))

    def shell():
        return subprocess.run([sys.executable, "-m", "bk.cli.main", "shell", "--conf", conf, "--json", "entrylogcheck"],
                              capture_output=True, text=True, timeout=60, cwd=os.getcwd())
    out = shell()
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["ok"] and json.loads(out.stdout)["dead_entries"] == 0
    where = locations(cfg)
    lost_log = sorted({loc >> 32 for loc in where.values()})[1]
    move_logs(cfg, [lost_log])
    shutil.rmtree(cfg.ledger_dirs[1])
    out = shell()
    assert out.returncode == 1, out.stderr
    got = json.loads(out.stdout)
    lost = [k for k, loc in where.items() if loc >> 32 == lost_log]
    assert not got["ok"] and got["dead_entries"] == len(lost)
    assert got["dead_logs"] == [{"log_id": f"{lost_log:x}", "state": "missing", "file_bytes": 0, "named": len(lost),
                                 "dead": len(lost), "dead_from": 0}]
    assert sum(got["ledgers"].values()) == len(lost)
    text = subprocess.run([sys.executable, "-m", "bk.cli.main", "shell", "--conf", conf, "entrylogcheck"],
                          capture_output=True, text=True, timeout=60)
    assert text.returncode == 1 and f"log {lost_log:x}: missing" in text.stdout
