"""Crash tests on a real process hosting the storage engine.

A bookie engine runs in `python -m bk.testing.engine_host`, adding entries with
many in flight and printing what was acknowledged. The test kills it with
SIGKILL at a random moment, optionally simulates a power cut (every file rolled
back to its last fsynced size, maybe with a torn last page), restarts the engine
in this process and checks:
- every acknowledged entry is back with its exact bytes;
- every acknowledged fence still holds, and master keys are back (EUA on a
  wrong key);
- nothing that was never written appears (every stored entry is the exact
  bytes the host would have written, and no id beyond what was submitted).
Seeds are printed on failure so a run can be repeated.
"""
import asyncio
import hashlib
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from bk import eventloop
from bk.bookie import Bookie
from bk.errors import (CorruptedStorageError, LedgerFencedError, NoSuchEntryError, NoSuchLedgerError,
                       UnauthorizedAccessError)
from bk.testing.engine_host import engine_config, expected_entry, ledger_key
from bk.testing.powerloss import halt_without_checkpoint, simulate_power_loss

pytestmark = pytest.mark.crash

LEDGERS = 4
ENTRY_SIZE = 100
IN_FLIGHT = 64
WRONG_KEY = hashlib.sha1(b"ledger-wrong").digest()


class Host:
    """The engine host process and the acknowledgements it printed."""

    def __init__(self, data_dir, seed, track_file, journal_off=False, fence_after=0, entry_size=ENTRY_SIZE,
                 extra_env=None):
        env = dict(os.environ, BK_FSYNC_TRACK_FILE=track_file, PYTHONUNBUFFERED="1", **(extra_env or {}))
        cmd = [sys.executable, "-m", "bk.testing.engine_host", "--data", data_dir, "--ledgers", str(LEDGERS),
               "--entry-size", str(entry_size), "--in-flight", str(IN_FLIGHT), "--seed", str(seed)]
        if journal_off:
            cmd.append("--journal-off")
        if fence_after:
            cmd += ["--fence-after", str(fence_after)]
        self.acked: dict[int, set[int]] = {lid: set() for lid in range(1, LEDGERS + 1)}
        self.fenced: set[int] = set()
        self.lines = 0
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for raw in self.proc.stdout:
            parts = raw.decode().split()
            if not parts:
                continue
            self.lines += 1
            if parts[0] == "A":
                self.acked[int(parts[1])].add(int(parts[2]))
            elif parts[0] == "F":
                self.fenced.add(int(parts[1]))

    def acked_count(self):
        return sum(len(s) for s in self.acked.values())

    def kill_after(self, min_acks: int, extra_s: float, timeout_s: float = 60.0):
        deadline = time.monotonic() + timeout_s
        while self.acked_count() < min_acks:
            if self.proc.poll() is not None:
                raise AssertionError(f"engine host died: {self.proc.stderr.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError("engine host made no progress")
            time.sleep(0.01)
        time.sleep(extra_s)
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._reader.join(timeout=10)
        self.proc.stderr.close()


async def verify(data_dir, seed, host: Host, *, journal_off=False, entry_size=ENTRY_SIZE):
    bookie = Bookie(engine_config(data_dir, journal_off))
    await bookie.start()
    try:
        assert bookie.was_unclean_shutdown, "a killed bookie must be detected as unclean"
        for lid in range(1, LEDGERS + 1):
            acked = host.acked[lid]
            if not bookie.ledger_exists(lid):
                assert not acked or journal_off, f"ledger {lid} lost with {len(acked)} acked entries"
                continue
            last = bookie.storage.last_entry_id(lid)
            top = max(acked, default=-1)
            # the host submits at most IN_FLIGHT beyond what it saw acknowledged
            limit = top + IN_FLIGHT + 1
            if last is not None:
                assert last <= limit, f"ledger {lid}: entry {last} was never submitted (limit {limit})"
            for eid in range(0, (last if last is not None else -1) + 1):
                try:
                    data = await bookie.read_entry(lid, eid)
                except NoSuchEntryError:
                    assert journal_off or eid not in acked, f"acked entry {lid}/{eid} lost"
                    continue
                assert data == expected_entry(seed, lid, eid, entry_size), f"entry {lid}/{eid} has wrong bytes"
            if not journal_off:
                missing = [e for e in acked if last is None or e > last]
                assert not missing, f"ledger {lid}: acked entries {sorted(missing)[:5]} lost"
            with pytest.raises(UnauthorizedAccessError):  # the master key is back
                await bookie.fence_ledger(lid, WRONG_KEY)
        for lid in host.fenced:
            assert bookie.is_fenced(lid), f"fence on ledger {lid} lost"
            with pytest.raises(LedgerFencedError):
                await bookie.add_entry(lid, 10**6, expected_entry(seed, lid, 10**6, entry_size),
                                       ledger_key(seed, lid))
    finally:
        await bookie.stop()


def crash_once(tmp_path, seed, *, power_loss=False, tear=False, journal_off=False, fence_after=0,
               entry_size=ENTRY_SIZE, prior: "Host | None" = None):
    rng = random.Random(seed)
    data_dir = str(tmp_path / f"run-{seed}")
    track = str(tmp_path / f"fsync-{seed}.log")
    host = Host(data_dir, seed, track, journal_off=journal_off, fence_after=fence_after, entry_size=entry_size)
    host.kill_after(min_acks=rng.randrange(50, 3000), extra_s=rng.uniform(0.0, 0.5))
    assert host.acked_count() > 0
    if prior is not None:  # an earlier run in the same directory: its acks must hold too
        for lid, acked in prior.acked.items():
            host.acked[lid] |= acked
        host.fenced |= prior.fenced
    if power_loss:
        report = simulate_power_loss(track, [data_dir], tear=tear, rng=rng)
        print(report)
    # The verifying restart writes (replay, checkpoint) too: track its fsyncs, so a
    # later power cut in the same directory knows what this process made durable.
    os.environ["BK_FSYNC_TRACK_FILE"] = track
    try:
        eventloop.run(verify(data_dir, seed, host, journal_off=journal_off, entry_size=entry_size))
    finally:
        del os.environ["BK_FSYNC_TRACK_FILE"]
    return host


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_kill9_during_adds_keeps_every_acked_entry(tmp_path, seed):
    print(f"seed={seed}")
    crash_once(tmp_path, seed, fence_after=400)


@pytest.mark.parametrize("seed", [21, 22, 23])
def test_power_loss_keeps_every_acked_entry_and_fence(tmp_path, seed):
    print(f"seed={seed}")
    crash_once(tmp_path, seed, power_loss=True, fence_after=300)


@pytest.mark.parametrize("seed", [31, 32, 33])
def test_power_loss_with_torn_page(tmp_path, seed):
    print(f"seed={seed}")
    crash_once(tmp_path, seed, power_loss=True, tear=True, fence_after=300)


def test_power_loss_large_entries(tmp_path):
    crash_once(tmp_path, 41, power_loss=True, tear=True, entry_size=64 * 1024)


def test_crash_again_after_recovering_from_power_loss(tmp_path):
    """Recover from a power cut, write more, lose power again: both runs' acks hold."""
    first = crash_once(tmp_path, 51, power_loss=True, tear=True, fence_after=200)
    crash_once(tmp_path, 51, power_loss=True, tear=True, prior=first)


@pytest.mark.parametrize("seed,tear", [(61, False), (62, True), (63, True)])
def test_journal_off_crash_invents_nothing_and_keeps_fences(tmp_path, seed, tear):
    """Journal off (BP-46): acked entries may be lost, but fences (journaled) hold, the
    crash is detected (unclean flag), and nothing invented or corrupt appears."""
    crash_once(tmp_path, seed, power_loss=True, tear=tear, journal_off=True, fence_after=300)


# ---------------------------------------------------------------- flipped bytes
def _write_and_stop(cfg, ledger_id=1, count=200, checkpoint=True):
    async def main():
        b = Bookie(cfg)
        await b.start()
        for eid in range(count):
            await b.add_entry(ledger_id, eid, expected_entry(1, ledger_id, eid, 100), ledger_key(1, ledger_id))
        if checkpoint:
            await b.stop()
        else:  # leave everything in the journal
            halt_without_checkpoint(b)
    eventloop.run(main())


def test_flipped_byte_in_entry_log_is_an_error_not_a_missing_entry(tmp_path):
    cfg = engine_config(str(tmp_path / "d"))
    _write_and_stop(cfg)
    logdir = os.path.join(cfg.ledger_dirs[0], "current")
    log_file = os.path.join(logdir, sorted(f for f in os.listdir(logdir) if f.endswith(".log"))[0])
    # entry 50's record: find it by its ids, flip a byte of its entry id
    with open(log_file, "r+b") as fh:
        data = fh.read()
        needle = (1).to_bytes(8, "big") + (50).to_bytes(8, "big")
        pos = data.index(needle)
        fh.seek(pos + 15)
        fh.write(bytes([data[pos + 15] ^ 0x01]))

    async def check():
        b = Bookie(cfg)
        await b.start()
        try:
            b.storage.read_cache.max_size_bytes = 0  # no read-ahead hiding the record
            with pytest.raises(CorruptedStorageError):
                await b.read_entry(1, 50)
            assert await b.read_entry(1, 49) == expected_entry(1, 1, 49, 100)
        finally:
            await b.stop()
    eventloop.run(check())


def test_flipped_byte_in_journal_before_tail_stops_the_start(tmp_path):
    cfg = engine_config(str(tmp_path / "d"), flush_interval_ms=600_000)
    _write_and_stop(cfg, checkpoint=False)
    jdir = os.path.join(cfg.journal_dirs[0], "current")
    jfile = os.path.join(jdir, sorted(f for f in os.listdir(jdir) if f.endswith(".txn"))[-1])
    with open(jfile, "r+b") as fh:
        data = fh.read()
        pos = data.index((1).to_bytes(8, "big") + (20).to_bytes(8, "big")) + 40  # inside entry 20's payload
        fh.seek(pos)
        fh.write(bytes([data[pos] ^ 0xFF]))

    async def start():
        b = Bookie(cfg)
        await b.start()
        await b.stop()
    with pytest.raises(CorruptedStorageError) as info:
        eventloop.run(start())
    assert os.path.basename(jfile) in str(info.value)


def test_unknown_ledger_after_crash_is_no_ledger(tmp_path):
    cfg = engine_config(str(tmp_path / "d"))
    _write_and_stop(cfg, count=5, checkpoint=False)

    async def check():
        b = Bookie(cfg)
        await b.start()
        try:
            with pytest.raises(NoSuchLedgerError):
                await b.read_entry(999, 0)
        finally:
            await b.stop()
    eventloop.run(check())


# ---------------------------------------------------------------- disk faults, then a crash
@pytest.mark.parametrize("where,journal_off,seed", [
    ("journal", False, 71), ("journal", False, 72),
    ("ledgers", False, 73), ("ledgers", False, 74),
    ("ledgers", True, 75), ("ledgers", True, 76),
])
def test_failed_fsync_then_power_loss_keeps_every_acked_entry(tmp_path, where, journal_off, seed):
    """fsyncgate, crash-tested (docs/DISK-FAULTS.md). An fsync of the journal or of an entry
    log fails (EIO) and the page cache drops what it covered (the injected fault zeroes
    it); the host keeps adding; it is killed at a random moment after, and power is lost.
    Every entry acknowledged before the kill is back with its bytes (journal on), and no
    stored entry reads back wrong (journal off: acked entries may be lost by design, never
    invented or corrupt). An ack after the failed fsync, or a checkpoint trusting a second
    fsync of the same file, shows up here as a lost or zeroed entry."""
    from bk.testing.diskfaults import DiskFaultControl

    print(f"seed={seed}")
    rng = random.Random(seed)
    data_dir = str(tmp_path / "run")
    track = str(tmp_path / "fsync.log")
    ctl = DiskFaultControl(str(tmp_path / "faults.json"))
    # the journal fsyncs once per group (hundreds a second), the entry logs once per checkpoint
    after = rng.randrange(50, 400) if where == "journal" else rng.randrange(4, 12)
    rule = ctl.fail(op="fsync", path_prefix=os.path.join(data_dir, where), count=1, after=after)
    host = Host(data_dir, seed, track, journal_off=journal_off, fence_after=300, extra_env=ctl.env())
    deadline = time.monotonic() + 60
    while ctl.hits(rule) < 1:
        assert host.proc.poll() is None, f"engine host died: {host.proc.stderr.read().decode()[-2000:]}"
        assert time.monotonic() < deadline, "the fault never fired"
        time.sleep(0.01)
    host.kill_after(min_acks=0, extra_s=rng.uniform(0.0, 0.6))
    assert host.acked_count() > 0
    simulate_power_loss(track, [data_dir], tear=True, rng=rng)
    os.environ["BK_FSYNC_TRACK_FILE"] = track
    try:
        eventloop.run(verify(data_dir, seed, host, journal_off=journal_off))
    finally:
        del os.environ["BK_FSYNC_TRACK_FILE"]
