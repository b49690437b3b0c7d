"""Crash tests of the repair of entries lost with their entry logs (issue 27).

A real cluster (ZooKeeper, three `bk bookie` processes). Round after round: a new closed
ledger is written, bookie 0 is stopped cleanly and loses its newest entry logs (deleted),
then runs as bk.testing.repair_host, which SIGKILLs it at one step of the repair: a copy
stored, about to clear a ledger's limbo, limbo cleared, about to clear the
needs-integrity-check flag, flag cleared. Optionally every file of bookie 0 is then
rolled back to its last fsync with a torn last page (bk.testing.powerloss). The next start
must find what is still missing, finish the repair, and serve every entry of every ledger
with its bytes. Journal on and off.
"""
from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import uuid

import pytest

from bk import eventloop
from bk.client import BookKeeper, BookieClient
from bk.formats import entrylog as fmt
from bk.proto import DigestManager, StatusCode
from bk.testing.cluster import LocalCluster, run_shell
from bk.testing.powerloss import simulate_power_loss
from bk.testing.repair_host import STEPS

pytestmark = [pytest.mark.crash, pytest.mark.integration, pytest.mark.timeout(600)]

PW = b"pw"
EOK = int(StatusCode.EOK)
N = 250


def run(coro):
    return eventloop.run(asyncio.wait_for(coro, 200))


def payload(lid: int, i: int) -> bytes:
    return b"crash-%d-%d-" % (lid, i) + bytes([(lid + i) % 251]) * 400


async def write(uri: str) -> int:
    async with BookKeeper(uri, add_timeout_s=5.0, read_timeout_s=5.0) as bkc:
        lh = await bkc.create_ledger(3, 3, 2, password=PW)
        for i in range(N):
            await lh.add_entry(payload(lh.ledger_id, i))
        await lh.close()
        return lh.ledger_id


async def served(bookie_id: str, ledgers) -> dict:
    """{(ledger, entry): rc} of every entry bookie_id does not serve with its bytes."""
    bad = {}
    client = BookieClient(bookie_id, read_timeout_s=5.0)
    try:
        for lid in ledgers:
            digest = DigestManager(lid, "CRC32C", PW)
            for e in range(N):
                r = await client.call(client.send_read, lid, e)
                if r.rc != EOK or bytes(digest.verify_entry(e, r.body)[2]) != payload(lid, e):
                    bad[(lid, e)] = r.rc
    finally:
        client.close()
    return bad


def wait_done(cluster, step: str, timeout_s: float = 120.0) -> dict | None:
    """The repair's final status, or None when this start had nothing to repair: only right
    after the flag was cleared durably (a repair starts before the bookie registers, so a
    registered bookie without a status started none)."""
    import json
    b = cluster.bookies[0]
    b.wait_ready(timeout_s)
    out = run_shell(cluster.metadata_uri, "--json", "repairstatus", b.bookie_id)
    assert out.returncode == 0, out.stderr
    if json.loads(out.stdout)["bookies"][0]["repair"] is None:
        assert step == "finished", f"no repair after a crash at {step}"
        return None
    out = run_shell(cluster.metadata_uri, "--json", "repairstatus", b.bookie_id, "--watch", "--timeout",
                    str(timeout_s), timeout_s=timeout_s + 30)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)["bookies"][0]["repair"]


@pytest.mark.parametrize("cut", ["kill9", "power_loss"])
@pytest.mark.parametrize("journal", ["on", "off"])
def test_crash_at_every_repair_step_then_the_next_start_finishes(zk_server, tmp_path, journal, cut):
    track = str(tmp_path / "fsync.track")
    env = dict(os.environ, BK_FSYNC_TRACK_FILE=track)
    cluster = LocalCluster(str(tmp_path / "c"), bookies=3, zk_connect=f"{zk_server}/lost-crash-{uuid.uuid4().hex[:8]}",
                           env=env, journal_write_data=(journal == "on"), entry_log_size_limit_bytes="64KiB",
                           zk_timeout_ms=4000, data_integrity_repair_retry_max_s=1.0)
    cluster.start()
    try:
        uri, victim = cluster.metadata_uri, cluster.bookies[0]
        logdir = fmt.log_dir(os.path.join(cluster.data_dir, "bookie-0", "ledgers"))
        ledgers = []
        rng = random.Random(f"{journal}-{cut}")
        for step in STEPS:
            seen = {i for i in map(fmt.parse_log_file_name, os.listdir(logdir)) if i is not None}
            ledgers.append(run(write(uri)))
            assert cluster.stop_bookie(0) == 0
            new = sorted(i for i in map(fmt.parse_log_file_name, os.listdir(logdir)) if i is not None and i not in seen)
            assert new, "the new ledger went into no new entry log"
            for log_id in new:
                os.remove(os.path.join(logdir, fmt.log_file_name(log_id)))
            with open(os.path.join(cluster.data_dir, f"host-{step}.log"), "w") as out:
                host = subprocess.run([sys.executable, "-m", "bk.testing.repair_host", "--conf", victim.conf_path,
                                       "--crash-at", step], stdout=subprocess.PIPE, stderr=out, text=True,
                                      env=env, timeout=120)
            assert host.returncode == -9 and f"CRASH {step}" in host.stdout, (step, host.returncode, host.stdout)
            if cut == "power_loss":
                simulate_power_loss(track, [os.path.join(cluster.data_dir, "bookie-0")], tear=True, rng=rng)
            cluster.start_bookie(0, wait=False)
            st = wait_done(cluster, step)
            assert st is None or (st["state"] == "done" and st["ledgers_left"] == 0), (step, st)
            bad = run(served(victim.bookie_id, ledgers))
            assert not bad, f"after a crash at {step} ({cut}, journal {journal}): not served {sorted(bad)[:10]}"
    finally:
        cluster.stop()
