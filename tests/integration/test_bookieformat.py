"""`bk shell bookieformat` against real bookie processes on ZooKeeper: its guards, and a crash
at every step (kill at each point, then the bookie must refuse to start as if intact, and a
second run must finish the format)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from bk import eventloop
from bk.client import BookKeeper
from bk.testing.cluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(params=[True, False], ids=["journal-on", "journal-off"])
def cluster(zk_server, tmp_path, request):
    c = LocalCluster(str(tmp_path / "c"), bookies=3, zk_connect=f"{zk_server}/format-{uuid.uuid4().hex[:8]}",
                     flush_interval_ms=200, journal_write_data=request.param)
    c.start()
    yield c
    c.stop()


def fmt(cluster, i: int, *extra: str, crash_after: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if crash_after:
        env["BK_TEST_FORMAT_CRASH_AFTER"] = crash_after
    conf = os.path.join(cluster.data_dir, f"bookie-{i}.toml")
    return subprocess.run([sys.executable, "-m", "bk.cli.main", "shell", "--conf", conf, "bookieformat", *extra],
                          capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)


def ledger(cluster, delete: bool) -> int:
    async def go():
        async with BookKeeper(cluster.metadata_uri) as bkc:
            lh = await bkc.create_ledger(3, 3, 3, password=b"pw")
            for i in range(50):
                await lh.add_entry(b"x" * 100)
            await lh.close()
            if delete:
                await bkc.delete_ledger(lh.ledger_id)
            return lh.ledger_id
    return eventloop.run(go())


def files_in(cluster, i: int) -> int:
    d = os.path.join(cluster.data_dir, f"bookie-{i}")
    return sum(len(files) for _, _, files in os.walk(d))


def test_guards_running_named_and_unconfirmed(cluster):
    kept = ledger(cluster, delete=False)
    out = fmt(cluster, 2, "--yes")
    assert out.returncode == 1 and "stop the bookie first" in out.stderr
    cluster.stop_bookie(2)
    before = files_in(cluster, 2)
    out = fmt(cluster, 2, "--yes")
    assert out.returncode == 1 and "1 ledgers still name" in out.stderr and str(kept) in out.stderr
    out = fmt(cluster, 2, "--force")  # no terminal, no --yes
    assert out.returncode == 1 and "confirm with --yes" in out.stderr
    assert files_in(cluster, 2) == before  # nothing deleted by any refusal
    out = fmt(cluster, 2, "--yes", "--force", "--delete-cookie", "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["formatted"] and res["ledgers_naming_it"] == 1 and res["zk_cookie_deleted"] and "text" not in res
    assert files_in(cluster, 2) == 0
    cluster.start_bookie(2)  # a new bookie now: stamps fresh cookies
    assert "ready" in open(cluster.bookies[2].log_path).read()


@pytest.mark.parametrize("step", ["dir-cookie:1", "dir-cookie:2", "data:1", "data:2"])
def test_crash_at_each_step_then_refused_then_finished(cluster, step):
    ledger(cluster, delete=True)  # the bookie holds data no ledger needs any more
    cluster.stop_bookie(2)
    out = fmt(cluster, 2, "--yes", "--delete-cookie", crash_after=step)
    assert out.returncode == 137, out.stderr
    b = cluster.bookies[2]
    b.start()  # the half-formatted bookie must not boot as if intact
    assert b.proc.wait(60) != 0
    assert "refuses to start" in open(b.log_path).read()[b._log_offset:]
    out = fmt(cluster, 2, "--yes", "--delete-cookie")
    assert out.returncode == 0, out.stderr
    assert files_in(cluster, 2) == 0
    cluster.start_bookie(2)
