"""Running without the journal (BP-46), with real `bk bookie` processes on a real ZooKeeper.

Scenario catalogue 13 and 14 (TESTING.md): journal-off bookies SIGKILLed (one, two, all
three) or wiped, restarted; what they acknowledged is never denied (no ENOENTRY, only
the entry or EUNKNOWNLEDGERSTATE), plain adds are EFENCED, the bookie repairs itself
from its peers, no ledger is closed below an acknowledged entry; a clean restart fences
nothing; a second crash during the repair loses nothing.

Every bookie runs with `journal_write_data = false` and a 30 s flush interval, so at a
SIGKILL every entry since the start is only in the write cache: lost for real.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

from bk import eventloop
from bk.client import BookKeeper, BookieClient
from bk.errors import LedgerRecoveryError
from bk.meta.ledger_manager import LedgerManager
from bk.meta.ledger_metadata import LedgerState
from bk.proto import DEFAULT_MAX_FRAME_SIZE_BYTES, DigestManager, StatusCode, master_key
from bk.client.quorum import AddFramer
from bk.testing.cluster import LocalCluster, run_shell
from bk.testing.powerloss import simulate_power_loss

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PW = b"pw"
EOK, ENOENTRY, ENOLEDGER = int(StatusCode.EOK), int(StatusCode.ENOENTRY), int(StatusCode.ENOLEDGER)
EFENCED, EUNKNOWN = int(StatusCode.EFENCED), int(StatusCode.EUNKNOWNLEDGERSTATE)
SLOW_REPAIR = dict(data_integrity_repair_rate_bytes_per_s=1, rereplication_entry_batch_size=1)
FAST = dict(add_timeout_s=3.0, read_timeout_s=3.0, connect_timeout_s=3.0)


@pytest.fixture
def cluster(zk_server, tmp_path):
    track = str(tmp_path / "fsync.track")  # every fsync logged: a power cut can be simulated
    c = LocalCluster(str(tmp_path / "c"), bookies=3, zk_connect=f"{zk_server}/journal-off-{uuid.uuid4().hex[:8]}",
                     env=dict(os.environ, BK_FSYNC_TRACK_FILE=track), journal_write_data=False,
                     flush_interval_ms=30000, data_integrity_repair_retry_max_s=1.0)
    c.start()
    c.track_file = track
    yield c
    c.stop()


def run(coro):
    return eventloop.run(asyncio.wait_for(coro, 200))


def payload(i: int) -> bytes:
    return b"entry-%d-" % i + bytes([i % 251]) * (i % 97)


async def write_ledgers(uri: str, closed_n: int = 20, open_n: int = 200):
    """A closed ledger and an open one (its writer stops adding), E3 WQ3 AQ2: every add acknowledged."""
    async with BookKeeper(uri, **FAST) as bkc:
        lc = await bkc.create_ledger(3, 3, 2, password=PW)
        for i in range(closed_n):
            await lc.add_entry(payload(i))
        await lc.close()
        lo = await bkc.create_ledger(3, 3, 2, password=PW)
        futs = [lo.async_add_entry(payload(i)) for i in range(open_n)]
        ids = await asyncio.gather(*futs)
        assert ids == list(range(open_n))
        return lc.ledger_id, lo.ledger_id


async def read_rc(bookie_id: str, ledger_id: int, entry_id: int):
    client = BookieClient(bookie_id, read_timeout_s=5.0, add_timeout_s=5.0)
    try:
        return await client.call(client.send_read, ledger_id, entry_id)
    finally:
        client.close()


async def answers(bookie_id: str, ledger_id: int, n: int) -> dict[int, int]:
    """rc of each entry 0..n-1 read from one bookie; an EOK must carry the original payload."""
    out = {}
    digest = DigestManager(ledger_id, "CRC32C", PW)
    for e in range(n):
        r = await read_rc(bookie_id, ledger_id, e)
        if r.rc == EOK:
            assert bytes(digest.verify_entry(e, r.body)[2]) == payload(e)
        out[e] = r.rc
    return out


async def plain_add_rc(bookie_id: str, ledger_id: int, entry_id: int) -> int:
    framer = AddFramer(DigestManager(ledger_id, "CRC32C", PW), master_key(PW), DEFAULT_MAX_FRAME_SIZE_BYTES)
    client = BookieClient(bookie_id, read_timeout_s=5.0, add_timeout_s=5.0)
    try:
        frame = framer.frame(entry_id, entry_id - 1, 0, b"late")
        return (await client.call(client.send_add, frame, ledger_id, entry_id)).rc
    finally:
        client.close()


async def metadata(uri: str, ledger_id: int):
    async with BookKeeper(uri) as bkc:
        return (await LedgerManager(bkc.store).read_ledger_metadata(ledger_id))[0]


def repair_status(uri: str, bookie_id: str) -> dict | None:
    out = run_shell(uri, "--json", "repairstatus", bookie_id)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["bookies"][0]["repair"]


def wait_repaired(cluster, i: int, timeout_s: float = 90.0) -> dict:
    b = cluster.bookies[i]
    b.wait_ready(timeout_s)  # registered: its status is published
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = repair_status(cluster.metadata_uri, b.bookie_id)
        if st is not None and st["state"] == "done":
            return st
        time.sleep(0.3)
    raise AssertionError(f"bookie {b.bookie_id} not repaired after {timeout_s}s: {st}")


def restart(cluster, i: int, **extra):
    """Start bookie i again on its directories (and with `extra` settings); wait until it listens."""
    b = cluster.add_bookie(i, wait=False, **extra)
    b.wait_serving()
    return b


def never_denied(rcs: dict[int, int]) -> None:
    denied = {e: rc for e, rc in rcs.items() if rc not in (EOK, EUNKNOWN)}
    assert not denied, f"acknowledged entries answered with an explicit negative or an error: {denied}"


# ------------------------------------------------------------------ one bookie
def test_one_bookie_sigkilled_never_denies_fences_and_repairs(cluster):
    uri = cluster.metadata_uri
    closed_id, open_id = run(write_ledgers(uri))
    victim = cluster.bookies[0].bookie_id
    cluster.kill(0)
    restart(cluster, 0, **SLOW_REPAIR)  # copying crawls: limbo can be seen on the wire

    async def check_limbo():
        rcs = await answers(victim, closed_id, 20)
        never_denied(rcs)
        assert EUNKNOWN in rcs.values()  # it did lose entries (the test can fail)
        never_denied(await answers(victim, open_id, 200))
        assert await plain_add_rc(victim, closed_id, 20) == EFENCED
        assert await plain_add_rc(victim, open_id, 200) == EFENCED
        client = BookieClient(victim, read_timeout_s=5.0)
        try:
            assert (await client.call(client.send_read_lac, closed_id)).rc == EUNKNOWN
        finally:
            client.close()
    run(check_limbo())
    url = cluster.bookies[0].http_url + "/api/v1/bookie/repair_status"
    for _ in range(100):  # the HTTP server starts just after the listener
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                rs = json.loads(resp.read())
            break
        except OSError:
            time.sleep(0.1)
    assert rs["dataIntegrityChecking"] and rs["needsIntegrityCheck"] and rs["limboLedgers"] >= 1
    assert rs["phaseOne"]["ledgers_marked"] == 2 and rs["repair"]["state"] == "running"

    # stopped cleanly half-way: the repair resumes at the next start (the flag survives)
    assert cluster.stop_bookie(0) == 0
    cluster.add_bookie(0, wait=False, data_integrity_repair_rate_bytes_per_s=0, rereplication_entry_batch_size=100)
    st = wait_repaired(cluster, 0)
    assert st["ledgers_left"] == 0 and st["errors"] == 0 and st["entries_copied"] > 0

    async def check_whole():
        assert set((await answers(victim, closed_id, 20)).values()) == {EOK}
        assert set((await answers(victim, open_id, 200)).values()) == {EOK}
        md = await metadata(uri, open_id)
        assert md.state is LedgerState.CLOSED and md.last_entry_id == 199  # recovered, not short
        assert (await read_rc(victim, closed_id, 20)).rc == ENOENTRY  # whole again: honest negatives
    run(check_whole())
    log = open(cluster.bookies[0].log_path).read()
    assert "phase one done: 2 of 2 ledgers fenced and in limbo" in log and "repair done:" in log



def test_sigterm_while_starting_abandons_the_start_and_the_repair_still_runs(cluster):
    """A crashed bookie's start waits for its old ZooKeeper session to expire before it
    registers; SIGTERM meanwhile stops it at once (before the "ready" line) with exit code
    0, and the next start still repairs what phase one marked."""
    uri = cluster.metadata_uri
    closed_id, _open_id = run(write_ledgers(uri, open_n=20))
    victim = cluster.bookies[0].bookie_id
    cluster.kill(0)
    b = restart(cluster, 0, zk_timeout_ms=30000)  # listening; registration waits for the expiry
    assert b.stop(timeout_s=20) == 0
    started = open(b.log_path).read()[b._log_offset:]
    assert "abandoning the start" in started and f"bookie {victim} ready" not in started
    cluster.add_bookie(0, wait=False)
    st = wait_repaired(cluster, 0)
    assert st["ledgers_left"] == 0

    async def whole():
        assert set((await answers(victim, closed_id, 20)).values()) == {EOK}
    run(whole())

def test_one_bookie_power_loss_torn_page_same_checks(cluster):
    """kill -9, then every file rolled back to its last fsync with a torn last page."""
    uri = cluster.metadata_uri

    async def first():
        ids = await write_ledgers(uri, closed_n=30)
        async with BookKeeper(uri, **FAST) as bkc:  # a checkpointed half and an unsynced half
            lh = await bkc.create_ledger(3, 3, 2, password=PW)
            for i in range(40):
                await lh.add_entry(payload(i))
            return ids, lh.ledger_id
    (closed_id, open_id), third_id = run(first())
    victim = cluster.bookies[0].bookie_id
    cluster.kill(0)
    cluster.bookies[0].proc.wait()
    report = simulate_power_loss(cluster.track_file, [os.path.join(cluster.data_dir, "bookie-0")], tear=True,
                                 rng=random.Random(7))
    restart(cluster, 0, **SLOW_REPAIR)

    async def check_limbo():
        for lid, n in ((closed_id, 30), (open_id, 200), (third_id, 40)):
            never_denied(await answers(victim, lid, n))
            assert await plain_add_rc(victim, lid, n) == EFENCED
    run(check_limbo())
    cluster.stop_bookie(0)
    cluster.add_bookie(0, wait=False, data_integrity_repair_rate_bytes_per_s=0, rereplication_entry_batch_size=100)
    wait_repaired(cluster, 0)

    async def check_whole():
        for lid, n in ((closed_id, 30), (open_id, 200), (third_id, 40)):
            assert set((await answers(victim, lid, n)).values()) == {EOK}, report
    run(check_whole())


# ------------------------------------------------------------------ two and three bookies
def test_two_of_three_sigkilled_closed_ledger_repaired_open_ledger_not_closed_short(cluster):
    uri = cluster.metadata_uri
    closed_id, open_id = run(write_ledgers(uri))
    cluster.kill(0)
    cluster.kill(1)
    for i in (0, 1):
        restart(cluster, i)

    async def check():
        for i in (0, 1):
            never_denied(await answers(cluster.bookies[i].bookie_id, open_id, 200))
        async with BookKeeper(uri, **FAST) as bkc:
            with pytest.raises(LedgerRecoveryError):
                await bkc.open_ledger(open_id, password=PW, recovery=True)
        md = await metadata(uri, open_id)
        assert md.state is not LedgerState.CLOSED  # entry 200 may have been acknowledged by the two
        # the closed ledger: the survivor held all of it; both crashed bookies copy it back
        deadline = time.monotonic() + 60
        while True:
            rcs = [await answers(cluster.bookies[i].bookie_id, closed_id, 20) for i in (0, 1)]
            if all(set(r.values()) == {EOK} for r in rcs) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        assert all(set(r.values()) == {EOK} for r in rcs), rcs
    run(check())
    for i in (0, 1):
        cluster.bookies[i].wait_ready(60)
        st = repair_status(uri, cluster.bookies[i].bookie_id)
        assert st["state"] == "running" and st["ledgers_left"] == 1 and st["errors"] >= 1


def test_all_three_sigkilled_recovery_refuses_and_says_data_may_be_lost(cluster):
    uri = cluster.metadata_uri
    _closed_id, open_id = run(write_ledgers(uri))
    for i in range(3):
        cluster.kill(i)
    for i in range(3):
        restart(cluster, i)

    async def check():
        for i in range(3):
            rcs = await answers(cluster.bookies[i].bookie_id, open_id, 200)
            never_denied(rcs)
            assert set(rcs.values()) == {EUNKNOWN}
        async with BookKeeper(uri, **FAST) as bkc:
            with pytest.raises(LedgerRecoveryError) as info:
                await bkc.open_ledger(open_id, password=PW, recovery=True)
        assert "EUNKNOWNLEDGERSTATE" in str(info.value)
        md = await metadata(uri, open_id)
        assert md.state is not LedgerState.CLOSED and md.last_entry_id == -1
    run(check())


# ------------------------------------------------------------------ clean stop
def test_clean_restart_fences_nothing_loses_nothing(cluster):
    uri = cluster.metadata_uri

    async def main():
        async with BookKeeper(uri, **FAST) as bkc:
            lh = await bkc.create_ledger(3, 3, 2, password=PW)
            for i in range(50):
                await lh.add_entry(payload(i))
            await asyncio.to_thread(cluster.stop_bookie, 0)  # SIGTERM
            await asyncio.to_thread(cluster.start_bookie, 0)  # waits until registered
            victim = cluster.bookies[0].bookie_id
            assert set((await answers(victim, lh.ledger_id, 50)).values()) == {EOK}
            assert (await read_rc(victim, lh.ledger_id, 50)).rc == ENOENTRY  # not in limbo
            for i in range(50, 60):  # not fenced: the writer carries on through the restarted bookie
                await lh.add_entry(payload(i))
            await lh.close()
            assert repair_status(uri, victim) is None
    run(main())
    assert "phase one" not in open(cluster.bookies[0].log_path).read()


# ------------------------------------------------------------------ a second crash during the repair
def test_second_crash_during_repair_loses_nothing(cluster):
    uri = cluster.metadata_uri
    closed_id, open_id = run(write_ledgers(uri, closed_n=60))
    victim = cluster.bookies[0].bookie_id
    cluster.kill(0)
    restart(cluster, 0, **SLOW_REPAIR)
    time.sleep(2.0)  # the open ledger is recovered and a few entries copied
    cluster.kill(0)
    restart(cluster, 0, data_integrity_repair_rate_bytes_per_s=0, rereplication_entry_batch_size=100)
    cluster.bookies[0].wait_ready(60)
    out = run_shell(uri, "--json", "repairstatus", victim, "--watch", "--timeout", "90", timeout_s=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["bookies"][0]["repair"]["state"] == "done"

    async def check():
        assert set((await answers(victim, closed_id, 60)).values()) == {EOK}
        assert set((await answers(victim, open_id, 200)).values()) == {EOK}
    run(check())
    log = open(cluster.bookies[0].log_path).read()
    assert log.count("phase one done") == 2


# ------------------------------------------------------------------ a wiped disk
def _wipe(cluster, i: int) -> None:
    d = os.path.join(cluster.data_dir, f"bookie-{i}")
    for sub in ("journal", "ledgers"):
        shutil.rmtree(os.path.join(d, sub))


def test_wiped_disk_refused_without_stamping_then_fixcookie_and_with_stamping(cluster):
    uri = cluster.metadata_uri
    closed_id, open_id = run(write_ledgers(uri))
    # without stamping: refuses to start and names the fix
    assert cluster.stop_bookie(0) == 0
    _wipe(cluster, 0)
    b = cluster.bookies[0]
    b.start()
    assert b.proc.wait(60) != 0
    text = open(b.log_path).read()
    assert "refuses to start" in text and "bk shell fixcookie" in text
    # the fix by hand, with the bookie stopped
    conf = os.path.join(cluster.data_dir, "bookie-0.toml")
    out = subprocess.run([sys.executable, "-m", "bk.cli.main", "shell", "--conf", conf, "--json", "fixcookie"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    fixed = json.loads(out.stdout)
    assert fixed["ledgers_marked"] == 2 and fixed["stamped"]
    cluster.start_bookie(0)
    wait_repaired(cluster, 0)

    # with stamping on: bookie 1 wiped boots, fences, stamps and repairs by itself
    assert cluster.stop_bookie(1) == 0
    _wipe(cluster, 1)
    cluster.add_bookie(1, wait=False, data_integrity_cookie_stamping_enabled=True)
    st = wait_repaired(cluster, 1)
    assert st["errors"] == 0
    assert "stamped the cookie" in open(cluster.bookies[1].log_path).read()

    async def check():
        for i in (0, 1):
            bid = cluster.bookies[i].bookie_id
            assert set((await answers(bid, closed_id, 20)).values()) == {EOK}
            assert set((await answers(bid, open_id, 200)).values()) == {EOK}
    run(check())
