"""Issue 27 on real `bk bookie` processes and a real ZooKeeper: entries lost with their entry
logs (one of two ledger dirs wiped, journal on and off; one log truncated; one log deleted)
are found at start, repaired from the peers and counted in `repairstatus`, every entry is
served again; and a journal-off bookie's crash fences only what BookKeeper fences (scenario
catalogue 19 and 21, TESTING.md). Crashes during such a repair: tests/crash/test_lost_log_repair_crash.py."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest

from bk.client import BookKeeper
from bk.formats import entrylog as fmt
from bk.meta.ledger_metadata import LedgerState
from bk.proto import StatusCode
from bk.testing.cluster import LocalCluster

from test_journal_off import FAST, PW, answers, metadata, payload, repair_status, run, wait_repaired, write_ledgers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

EOK = int(StatusCode.EOK)
CLOSED_N, OPEN_N = 1500, 600  # about 200 KB in each bookie: four entry logs of 64 KiB
BASE = dict(entry_log_size_limit_bytes="64KiB", zk_timeout_ms=4000, data_integrity_repair_retry_max_s=1.0)


def two_dirs(cluster, i: int) -> list[str]:
    d = os.path.join(cluster.data_dir, f"bookie-{i}")
    return [os.path.join(d, "ledgers"), os.path.join(d, "ledgers-2")]


@pytest.fixture
def make_cluster(zk_server, tmp_path):
    made = []

    def make(bookies: int = 3, **overrides) -> LocalCluster:
        """Bookie 0 has two ledger dirs (the index in the first); the others one."""
        c = LocalCluster(str(tmp_path / f"c{len(made)}"), bookies=0,
                         zk_connect=f"{zk_server}/lost-logs-{uuid.uuid4().hex[:8]}", **{**BASE, **overrides})
        made.append(c)
        c.start()
        c.add_bookie(0, ledger_dirs=two_dirs(c, 0))
        for i in range(1, bookies):
            c.add_bookie(i)
        return c
    yield make
    for c in made:
        c.stop()


def all_served(cluster, i: int, ledgers) -> None:
    bid = cluster.bookies[i].bookie_id

    async def check():
        for lid, n in ledgers:
            assert set((await answers(bid, lid, n)).values()) == {EOK}, (lid, n)
    run(check())


def logs_in(d: str) -> list[int]:
    return sorted(i for i in map(fmt.parse_log_file_name, os.listdir(fmt.log_dir(d))) if i is not None)


def spread_logs(cluster) -> list[int]:
    """With bookie 0 stopped: every other entry log into its second dir (as a bookie spreads
    its logs over its dirs); then it starts, serves from both, and stops cleanly."""
    first, second = two_dirs(cluster, 0)
    moved = logs_in(first)[0::2]
    for log_id in moved:
        os.rename(os.path.join(fmt.log_dir(first), fmt.log_file_name(log_id)),
                  os.path.join(fmt.log_dir(second), fmt.log_file_name(log_id)))
    cluster.start_bookie(0)
    return moved


def entrylogcheck(cluster, i: int) -> tuple[int, dict]:
    conf = os.path.join(cluster.data_dir, f"bookie-{i}.toml")
    out = subprocess.run([sys.executable, "-m", "bk.cli.main", "shell", "--conf", conf, "--json", "entrylogcheck"],
                         capture_output=True, text=True, timeout=60)
    return out.returncode, json.loads(out.stdout)


def check_repaired(cluster, found: dict, ledgers) -> dict:
    st = wait_repaired(cluster, 0)
    assert st["ledgers_left"] == 0 and st["errors"] == 0
    assert st["entries_lost"] == found["dead_entries"] > 0
    # copied from the peers; an open ledger's tail may come back through its recovery instead
    assert 0 < st["entries_copied"] <= found["dead_entries"] + st["ledgers_recovered"]
    all_served(cluster, 0, ledgers)
    return st


def test_wiped_second_ledger_dir_journal_off_is_repaired(make_cluster):
    cluster = make_cluster(journal_write_data=False)
    uri = cluster.metadata_uri
    closed_id, open_id = run(write_ledgers(uri, CLOSED_N, OPEN_N))
    assert cluster.stop_bookie(0) == 0
    spread_logs(cluster)
    all_served(cluster, 0, [(closed_id, CLOSED_N), (open_id, OPEN_N)])
    assert cluster.stop_bookie(0) == 0
    shutil.rmtree(two_dirs(cluster, 0)[1])  # the second disk is replaced
    rc, found = entrylogcheck(cluster, 0)
    assert rc == 1 and found["dead_entries"] > 0 and all(d["state"] == "missing" for d in found["dead_logs"])
    cluster.add_bookie(0, wait=False, ledger_dirs=two_dirs(cluster, 0), data_integrity_cookie_stamping_enabled=True)
    check_repaired(cluster, found, [(closed_id, CLOSED_N), (open_id, OPEN_N)])
    md = run(metadata(uri, open_id))
    assert md.state is LedgerState.CLOSED and md.last_entry_id == OPEN_N - 1  # fenced and recovered, not short
    assert cluster.stop_bookie(0) == 0
    rc, again = entrylogcheck(cluster, 0)  # the copies replaced every dead location
    assert rc == 0 and again["dead_entries"] == 0


def test_wiped_second_ledger_dir_journal_on_fixcookie_then_repaired(make_cluster):
    cluster = make_cluster()  # journal on: data_integrity_checking is off
    uri = cluster.metadata_uri
    closed_id, open_id = run(write_ledgers(uri, CLOSED_N, OPEN_N))
    assert cluster.stop_bookie(0) == 0
    spread_logs(cluster)
    assert cluster.stop_bookie(0) == 0
    shutil.rmtree(two_dirs(cluster, 0)[1])
    rc, found = entrylogcheck(cluster, 0)
    assert rc == 1 and found["dead_entries"] > 0
    b = cluster.bookies[0]
    b.start()
    assert b.proc.wait(60) != 0  # a lost cookie without the repair switched on: refuses, names the fix
    assert "refuses to start" in open(b.log_path).read()
    conf = os.path.join(cluster.data_dir, "bookie-0.toml")
    out = subprocess.run([sys.executable, "-m", "bk.cli.main", "shell", "--conf", conf, "--json", "fixcookie"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    cluster.start_bookie(0, wait=False)
    check_repaired(cluster, found, [(closed_id, CLOSED_N), (open_id, OPEN_N)])
    assert cluster.stop_bookie(0) == 0
    assert entrylogcheck(cluster, 0)[0] == 0


def test_truncated_entry_log_journal_on_is_repaired(make_cluster):
    cluster = make_cluster()
    closed_id, open_id = run(write_ledgers(cluster.metadata_uri, CLOSED_N, OPEN_N))
    assert cluster.stop_bookie(0) == 0
    first = two_dirs(cluster, 0)[0]
    victim = logs_in(first)[1]
    path = os.path.join(fmt.log_dir(first), fmt.log_file_name(victim))
    os.truncate(path, os.path.getsize(path) // 2 + 7)  # mid-record: the rest of the log is gone
    rc, found = entrylogcheck(cluster, 0)
    assert rc == 1 and [d["state"] for d in found["dead_logs"]] == ["truncated"]
    cluster.start_bookie(0, wait=False)
    st = check_repaired(cluster, found, [(closed_id, CLOSED_N), (open_id, OPEN_N)])
    assert st["entries_copied"] == found["dead_entries"]  # only what the cut took


def test_deleted_entry_log_journal_off_is_repaired(make_cluster):
    cluster = make_cluster(journal_write_data=False)
    closed_id, open_id = run(write_ledgers(cluster.metadata_uri, CLOSED_N, OPEN_N))
    assert cluster.stop_bookie(0) == 0
    first = two_dirs(cluster, 0)[0]
    os.remove(os.path.join(fmt.log_dir(first), fmt.log_file_name(logs_in(first)[0])))
    rc, found = entrylogcheck(cluster, 0)
    assert rc == 1 and [d["state"] for d in found["dead_logs"]] == ["missing"]
    cluster.start_bookie(0, wait=False)
    check_repaired(cluster, found, [(closed_id, CLOSED_N), (open_id, OPEN_N)])
    log = open(cluster.bookies[0].log_path).read()
    assert "entries of 1 ledgers are gone with their entry logs" in log or "entries of 2 ledgers" in log


def test_writer_whose_ensemble_left_the_bookie_keeps_writing_through_its_sigkill(make_cluster):
    """Journal off, SIGKILL: the writer moved off the bookie (an ensemble change), so the
    restarted bookie does not fence its ledger (BookKeeper's pre-boot rule); the writer keeps
    writing through the restart and the repair, and the bookie's old segment is repaired."""
    cluster = make_cluster(bookies=4, journal_write_data=False, flush_interval_ms=30000)
    uri = cluster.metadata_uri
    victim = cluster.bookies[0].bookie_id

    async def main():
        async with BookKeeper(uri, **FAST) as bkc:
            lh = None
            while lh is None or victim not in lh.ensemble:  # an ensemble with bookie 0 in it
                lh = await bkc.create_ledger(3, 3, 2, password=PW)
            for i in range(100):
                await lh.add_entry(payload(i))
            await asyncio.to_thread(cluster.kill, 0)  # only the write cache held them: lost
            n = 100
            while victim in lh.ensemble:
                await lh.add_entry(payload(n))
                n += 1
            await asyncio.to_thread(cluster.start_bookie, 0, False)
            done = asyncio.create_task(asyncio.to_thread(wait_repaired, cluster, 0))
            while not done.done() or n < 400:  # writing all through the restart and the repair
                await lh.add_entry(payload(n))
                n += 1
            st = await done
            await lh.close()
            md = await metadata(uri, lh.ledger_id)
            assert md.state is LedgerState.CLOSED and md.last_entry_id == n - 1
            moved_at = md.segments[1][0]
            assert victim in md.segments[0][1] and all(victim not in e for _, e in md.segments[1:])
            assert st["ledgers_recovered"] == 0 and st["errors"] == 0 and st["entries_copied"] == moved_at
            assert set((await answers(victim, lh.ledger_id, moved_at)).values()) == {EOK}  # its old segment
    run(main())
    log = open(cluster.bookies[0].log_path).read()
    assert "phase one done: 0 of" in log and "1 more in limbo unfenced" in log
    assert repair_status(cluster.metadata_uri, victim)["state"] == "done"
