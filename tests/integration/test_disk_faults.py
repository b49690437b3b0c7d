"""Disk faults that real disks have, on real `bk bookie` processes and a real ZooKeeper
(issue 17; docs/DISK-FAULTS.md). Faults reach the bookies through a control file
(BK_DISK_FAULTS, bk.testing.diskfaults): a failed journal fsync, a failed checkpoint
fsync with the journal off (BP-46), a full disk, and damaged entries on one replica.

What is checked: an fsync that fails is never followed by an acknowledgement of what it
covered; the bookie turns read-only, registers so and says why over HTTP; an
acknowledged entry is never denied (no ENOENTRY) and never read back wrong, through a
restart and through a crash with power loss; a full disk is read-only until room comes
back; a damaged entry is an EIO from its bookie and readers get it from another replica.
"""
from __future__ import annotations

import asyncio
import errno
import json
import os
import time
import urllib.request
import uuid

import pytest

from bk import eventloop
from bk.client import BookKeeper, BookieClient
from bk.client.quorum import AddFramer
from bk.config import load_config
from bk.fileio import disk_space
from bk.index import Index
from bk.meta import open_store
from bk.meta.registration import RegistrationManager
from bk.proto import DEFAULT_MAX_FRAME_SIZE_BYTES, DigestManager, StatusCode, master_key
from bk.testing.cluster import LocalCluster
from bk.testing.diskfaults import DiskFaultControl, flip_entry_bit
from bk.testing.powerloss import simulate_power_loss

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PW = b"pw"
EOK, ENOENTRY, EIO = int(StatusCode.EOK), int(StatusCode.ENOENTRY), int(StatusCode.EIO)
EREADONLY, EUNKNOWN = int(StatusCode.EREADONLY), int(StatusCode.EUNKNOWNLEDGERSTATE)
FAST = dict(add_timeout_s=5.0, read_timeout_s=5.0, connect_timeout_s=3.0)


def make_cluster(zk_server, tmp_path, bookies: int, **overrides) -> LocalCluster:
    ctl = DiskFaultControl(str(tmp_path / "faults.json"))
    track = str(tmp_path / "fsync.track")
    env = dict(os.environ, BK_FSYNC_TRACK_FILE=track, **ctl.env())
    overrides.setdefault("disk_check_interval_ms", 300)
    # A full disk here is an injected one (usage 1.0). The host's own fill is not the test's
    # to choose: CI machines were seen at 92.8% by statvfs (f_bavail of f_blocks), inside the
    # default 0.90-0.95 band where a healed bookie rightly stays read-only. So the band sits
    # above the host's fill, and a host too full for any band is a clear failure.
    host = disk_space(str(tmp_path)).usage
    assert host < 0.999, f"the test machine's disk is {host:.2%} full: too full to test disk faults"
    overrides.setdefault("disk_usage_threshold", 0.9999)
    overrides.setdefault("disk_usage_lwm_threshold", 0.999)
    c = LocalCluster(str(tmp_path / "c"), bookies=bookies, zk_connect=f"{zk_server}/df-{uuid.uuid4().hex[:8]}",
                     env=env, **overrides)
    c.faults = ctl
    c.track_file = track
    return c


def bookie_dir(c: LocalCluster, i: int) -> str:
    return os.path.join(c.data_dir, f"bookie-{i}")


def run(coro):
    return eventloop.run(asyncio.wait_for(coro, 200))


def payload(i: int) -> bytes:
    return b"entry-%d-" % i + bytes([i % 251]) * (50 + i % 97)


def http_state(c: LocalCluster, i: int) -> dict:
    with urllib.request.urlopen(c.bookies[i].http_url + "/api/v1/bookie/state", timeout=5) as r:
        return json.loads(r.read())


def metric(c: LocalCluster, i: int, name: str) -> float:
    with urllib.request.urlopen(c.bookies[i].http_url + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {name}")


def indexed(c: LocalCluster, i: int, ledger_id: int, n: int) -> bool:
    """Entries 0..n-1 have a location in bookie i's index (read beside the running bookie)."""
    cfg = load_config(env={}, overrides=dict(ledger_dirs=[os.path.join(bookie_dir(c, i), "ledgers")]))
    index = Index(cfg.resolved_index_dir, cfg, readonly=True)
    try:
        return all(index.get_location(ledger_id, e) is not None for e in range(n))
    finally:
        index.close()


def wait_for(pred, timeout_s: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def registered_readonly(uri: str) -> list[str]:
    store = await open_store(uri)
    try:
        return await RegistrationManager(store).readonly_bookies()
    finally:
        await store.close()


async def read_rc(bookie_id: str, ledger_id: int, entry_id: int):
    client = BookieClient(bookie_id, read_timeout_s=5.0, add_timeout_s=5.0)
    try:
        return await client.call(client.send_read, ledger_id, entry_id)
    finally:
        client.close()


async def add_rc(bookie_id: str, ledger_id: int, entry_id: int, data: bytes = b"raw") -> int:
    framer = AddFramer(DigestManager(ledger_id, "CRC32C", PW), master_key(PW), DEFAULT_MAX_FRAME_SIZE_BYTES)
    client = BookieClient(bookie_id, read_timeout_s=5.0, add_timeout_s=5.0)
    try:
        return (await client.call(client.send_add, framer.frame(entry_id, entry_id - 1, 0, data),
                                  ledger_id, entry_id)).rc
    finally:
        client.close()


async def answers(bookie_id: str, ledger_id: int, entries) -> dict[int, int]:
    """rc of each entry read from one bookie; an EOK must carry the original payload."""
    out = {}
    digest = DigestManager(ledger_id, "CRC32C", PW)
    for e in entries:
        r = await read_rc(bookie_id, ledger_id, e)
        if r.rc == EOK:
            assert bytes(digest.verify_entry(e, r.body)[2]) == payload(e), f"entry {e} read back wrong"
        out[e] = r.rc
    return out


# ------------------------------------------------------------------ journal fsync EIO
def test_journal_fsync_eio_no_ack_read_only_then_restart(zk_server, tmp_path):
    c = make_cluster(zk_server, tmp_path, 4).start()
    try:
        async def main():
            async with BookKeeper(c.metadata_uri, **FAST) as bkc:
                lh = await bkc.create_ledger(3, 3, 2, password=PW)  # one bookie left to replace the victim
                for i in range(10):
                    await lh.add_entry(payload(i))
                victim = lh.metadata.ensemble_for(0)[0]
                i = c.index_of(victim)
                rule = c.faults.fail(op="fsync", errno=errno.EIO,
                                     path_prefix=os.path.join(bookie_dir(c, i), "journal"), count=1)
                # the add that meets the failed fsync is never acknowledged by that bookie; with a
                # format-2 journal the idle zero-ahead's fsync may meet the fault first, and the
                # bookie is then read-only before the add arrives
                assert await add_rc(victim, lh.ledger_id + 1000, 0, payload(0)) in (EIO, EREADONLY)
                assert c.faults.hits(rule) == 1
                # the writer goes on (ensemble change); the bookie refuses plain adds
                for e in range(10, 20):
                    assert await lh.add_entry(payload(e)) == e
                assert victim not in lh.metadata.ensemble_for(19)  # replaced
                assert await add_rc(victim, lh.ledger_id + 2000, 0) == EREADONLY
                await lh.close()
                return lh.ledger_id, victim, i
        ledger_id, victim, i = run(main())
        state = wait_for(lambda: (s := http_state(c, i))["readOnly"] and s, what="read-only state")
        assert "journal 0" in state["storageFailure"] and "fsync" in state["readOnlyReason"]
        assert metric(c, i, "bookie_storage_failed") == 1.0
        wait_for(lambda: victim in run(registered_readonly(c.metadata_uri)), what="read-only registration")
        # acknowledged data is still served by the read-only bookie
        assert set(run(answers(victim, ledger_id, range(10))).values()) == {EOK}
        # a clean restart (the journal disk "replaced"): writable again, nothing lost
        c.faults.heal()
        c.stop_bookie(i)
        c.start_bookie(i)
        assert http_state(c, i)["readOnly"] is False
        assert set(run(answers(victim, ledger_id, range(10))).values()) == {EOK}

        async def read_all():
            async with BookKeeper(c.metadata_uri, **FAST) as bkc:
                rh = await bkc.open_ledger(ledger_id, PW)
                return [bytes(e.data) for e in await rh.read_entries(0, 19)]
        assert run(read_all()) == [payload(e) for e in range(20)]
    finally:
        c.stop()


# ------------------------------------------------------------------ checkpoint fsync, journal off
@pytest.mark.parametrize("crash", [False, True], ids=["restart", "crash-power-loss"])
def test_checkpoint_fsync_failure_journal_off_never_denies_an_acked_entry(zk_server, tmp_path, crash):
    """BP-46: the checkpoint is the only durability. Its entry-log fsync fails and the page
    cache drops what it covered. Every acknowledged entry must read back right from that
    bookie (the retry wrote it again into a new log), after a clean restart, and after a
    crash with power loss: then only the entry or EUNKNOWNLEDGERSTATE, never ENOENTRY."""
    c = make_cluster(zk_server, tmp_path, 3, journal_write_data=False, flush_interval_ms=300,
                     data_integrity_repair_retry_max_s=1.0).start()
    try:
        victim = c.bookies[0].bookie_id
        rule = c.faults.fail(op="fsync", errno=errno.EIO, path_prefix=os.path.join(bookie_dir(c, 0), "ledgers"),
                             count=1)
        n = 200

        async def write():
            async with BookKeeper(c.metadata_uri, **FAST) as bkc:
                lh = await bkc.create_ledger(3, 3, 3, password=PW)
                ids = await asyncio.gather(*[lh.async_add_entry(payload(i)) for i in range(n)])
                assert ids == list(range(n))
                return lh.ledger_id
        ledger_id = run(write())
        wait_for(lambda: c.faults.hits(rule) >= 1, what="the failed checkpoint fsync")
        state = wait_for(lambda: (s := http_state(c, 0))["readOnly"] and s, what="read-only state")
        assert "checkpoint" in state["storageFailure"]
        # a later checkpoint writes the held entries again, into a new entry log, and only
        # then are they indexed (read from disk, not from the write cache, from here on)
        wait_for(lambda: indexed(c, 0, ledger_id, n), what="the retried checkpoint")
        got = run(answers(victim, ledger_id, range(n)))
        assert set(got.values()) == {EOK}, {e: rc for e, rc in got.items() if rc != EOK}
        if crash:
            c.kill(0)
            simulate_power_loss(c.track_file, [bookie_dir(c, 0)], tear=True)
        else:
            c.stop_bookie(0)
        c.faults.heal()
        c.start_bookie(0)
        unclean = "was not shut down cleanly" in c.bookies[0]._log_tail(1 << 24)  # this run's log
        assert unclean == crash  # a clean stop after a good final checkpoint says so
        got = run(answers(victim, ledger_id, range(n)))
        assert ENOENTRY not in got.values()
        assert set(got.values()) <= {EOK, EUNKNOWN}
        if not crash:
            assert set(got.values()) == {EOK}
        else:  # the repair (BP-46 phase two) makes the bookie whole again from its peers
            wait_for(lambda: set(run(answers(victim, ledger_id, range(n))).values()) == {EOK}, 90,
                     "the BP-46 repair")
    finally:
        c.stop()


# ------------------------------------------------------------------ full disk
def test_full_disk_read_only_then_writable(zk_server, tmp_path):
    c = make_cluster(zk_server, tmp_path, 3).start()
    try:
        victim = c.bookies[1].bookie_id

        async def write(n0: int, n1: int, ledger_id=None):
            async with BookKeeper(c.metadata_uri, **FAST) as bkc:
                lh = await bkc.create_ledger(3, 3, 2, password=PW)
                for i in range(n0, n1):
                    await lh.add_entry(payload(i))
                await lh.close()
                return lh.ledger_id
        before = run(write(0, 30))
        rule = c.faults.full_disk(bookie_dir(c, 1))
        state = wait_for(lambda: (s := http_state(c, 1))["readOnly"] and s, what="read-only state")
        assert "disk" in state["readOnlyReason"] and state["storageFailure"] is None
        wait_for(lambda: victim in run(registered_readonly(c.metadata_uri)), what="read-only registration")
        assert run(add_rc(victim, 999_999, 0)) == EREADONLY
        assert set(run(answers(victim, before, range(30))).values()) == {EOK}  # reads go on
        c.faults.heal(rule)
        wait_for(lambda: not http_state(c, 1)["readOnly"], what="writable again")
        wait_for(lambda: victim not in run(registered_readonly(c.metadata_uri)), what="writable registration")
        assert run(add_rc(victim, 999_999, 0)) == EOK
        after = run(write(0, 30))  # a new ledger: entry ids 0..29 again
        assert set(run(answers(victim, after, range(30))).values()) == {EOK}
        assert set(run(answers(victim, before, range(30))).values()) == {EOK}
    finally:
        c.stop()


def test_journal_write_enospc_fails_the_add_and_recovers(zk_server, tmp_path):
    """A write ENOSPC on the journal (the checker still sees room): the add is not
    acknowledged, the bookie turns read-only, and once the checker runs again it is
    writable; the short write was cut, so a restart replays everything after it."""
    c = make_cluster(zk_server, tmp_path, 3, flush_interval_ms=60_000).start()
    try:
        victim = c.bookies[0].bookie_id
        rule = c.faults.fail(op="write", errno=errno.ENOSPC, path_prefix=os.path.join(bookie_dir(c, 0), "journal"),
                             count=1, partial_bytes=13)
        assert run(add_rc(victim, 42, 0, payload(0))) != EOK
        assert c.faults.hits(rule) == 1
        wait_for(lambda: not http_state(c, 0)["readOnly"], what="writable again")
        for e in range(0, 5):
            assert run(add_rc(victim, 42, e, payload(e))) == EOK
        c.faults.heal()  # counts are per process: a restarted bookie would meet the rule again
        c.kill(0)  # nothing checkpointed (60 s interval): a restart replays the journal
        c.start_bookie(0)
        assert set(run(answers(victim, 42, range(5))).values()) == {EOK}
    finally:
        c.stop()


# ------------------------------------------------------------------ damaged entries
def test_damaged_entries_are_eio_and_readers_use_another_replica(zk_server, tmp_path):
    c = make_cluster(zk_server, tmp_path, 3).start()
    try:
        victim = c.bookies[0].bookie_id
        n = 30

        async def write():
            async with BookKeeper(c.metadata_uri, **FAST) as bkc:
                closed = await bkc.create_ledger(3, 3, 2, password=PW)
                for i in range(n):
                    await closed.add_entry(payload(i))
                await closed.close()
                open_ = await bkc.create_ledger(3, 3, 3, password=PW)  # its writer goes away
                for i in range(n):
                    await open_.add_entry(payload(i))
                return closed.ledger_id, open_.ledger_id
        closed_id, open_id = run(write())
        c.stop_bookie(0)  # clean stop: everything is in the entry logs
        ledgers = [os.path.join(bookie_dir(c, 0), "ledgers")]
        for e in (3, 4, 5):  # one of three entries is read from bookie 0 first
            flip_entry_bit(ledgers, closed_id, e, part="ids", bit=40)  # claims e + 2**40: no real entry
        for e in (10, 11, 12):
            flip_entry_bit(ledgers, closed_id, e, part="payload")
        for e in (n - 3, n - 2, n - 1):  # the last entries of the open ledger: recovery reads them
            flip_entry_bit(ledgers, open_id, e, part="ids", bit=40)
        c.start_bookie(0)
        got = run(answers(victim, closed_id, [3, 4, 5]))
        assert got == {3: EIO, 4: EIO, 5: EIO}  # never ENOENTRY: the bookie may have lost them
        for e in (10, 11, 12):  # bytes come back, but the digest tells the reader they are bad
            r = run(read_rc(victim, closed_id, e))
            assert r.rc == EOK
            with pytest.raises(Exception):
                DigestManager(closed_id, "CRC32C", PW).verify_entry(e, r.body)
        assert metric(c, 0, "bookie_read_entry_corrupted") >= 3

        async def read_back():
            async with BookKeeper(c.metadata_uri, **FAST) as bkc:
                rh = await bkc.open_ledger(closed_id, PW)
                whole = [bytes(e.data) for e in await rh.read_entries(0, n - 1)]
                singles = [bytes((await rh.read_entry(e)).data) for e in range(n)]
                # recovery of the open ledger reads its last entries from every replica
                rec = await bkc.open_ledger(open_id, PW)
                assert rec.last_add_confirmed == n - 1
                recovered = [bytes(e.data) for e in await rec.read_entries(0, n - 1)]
                return whole, singles, recovered
        whole, singles, recovered = run(read_back())
        assert whole == singles == recovered == [payload(i) for i in range(n)]
    finally:
        c.stop()


def test_bp46_repair_copies_a_damaged_entry_from_another_replica(zk_server, tmp_path):
    """Journal off: bookie 0 crashes with every entry only in its write cache and repairs
    itself from its peers (BP-46 phase two); bookie 1's copies of some entries are damaged
    (EIO), so the repair must take those from bookie 2 and never store a bad copy."""
    c = make_cluster(zk_server, tmp_path, 3, journal_write_data=False, flush_interval_ms=30_000,
                     data_integrity_repair_retry_max_s=1.0).start()
    try:
        n = 60

        async def write():
            async with BookKeeper(c.metadata_uri, **FAST) as bkc:
                lh = await bkc.create_ledger(3, 3, 3, password=PW)
                for i in range(n):
                    await lh.add_entry(payload(i))
                await lh.close()
                return lh.ledger_id
        ledger_id = run(write())
        c.kill(0)  # its entries were only in the write cache: lost
        c.stop_bookie(1)  # clean: its entries are in its entry logs
        damaged = range(20, 26)
        for e in damaged:
            flip_entry_bit([os.path.join(bookie_dir(c, 1), "ledgers")], ledger_id, e, part="ids", bit=40)
        c.start_bookie(1)
        assert set(run(answers(c.bookies[1].bookie_id, ledger_id, damaged)).values()) == {EIO}
        c.start_bookie(0)  # unclean: phase one (fence, limbo), then the repair copies from 1 and 2
        victim = c.bookies[0].bookie_id
        got = run(answers(victim, ledger_id, range(n)))
        assert ENOENTRY not in got.values() and set(got.values()) <= {EOK, EUNKNOWN}
        wait_for(lambda: set(run(answers(victim, ledger_id, range(n))).values()) == {EOK}, 90, "the BP-46 repair")
        # the repair did meet the damaged copies (write sets rotate: bookie 1 comes first for some)
        assert metric(c, 1, "bookie_read_entry_corrupted") > len(damaged)
    finally:
        c.stop()
