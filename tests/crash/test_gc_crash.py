"""Crash tests of GC and compaction on a real process (bk.testing.gc_host).

The host writes four ledgers, then runs a GC pass that deletes two of them, deletes
whole logs and compacts the rest while adds go on; it SIGKILLs itself at one step
of the pass. The test then optionally simulates a power cut (every file back to its
last fsync, bk.testing.powerloss), restarts the engine in this process and checks:
- every entry the host reported durable reads back with its exact bytes (written
  before the pass, and added during it);
- a ledger the host reported deleted is not there (never readable again);
- the next GC pass finishes the interrupted work: no compaction left pending, the
  deleted ledgers gone, the entry logs smaller than before the first pass;
at every step, with the journal on and off; and again with one log that a crash left
without its ledgers map and with a garbage record in the middle (live ledger 3's
records past it), the compaction steps crashing in that log.
"""
import asyncio
import os
import subprocess
import sys

import pytest

from bk import eventloop
from bk.bookie import Bookie
from bk.errors import NoSuchLedgerError
from bk.testing.engine_host import expected_entry
from bk.testing.gc_host import DOOMED, ENTRY_BYTES, STEPS, DeletePolicy, gc_config, log_bytes
from bk.testing.powerloss import simulate_power_loss

pytestmark = pytest.mark.crash


def run_host(data_dir, track, step, journal_off, damaged=False):
    cmd = [sys.executable, "-m", "bk.testing.gc_host", "--data", data_dir, "--crash-at", step]
    if journal_off:
        cmd.append("--journal-off")
    if damaged:
        cmd.append("--damaged")
    env = dict(os.environ, BK_FSYNC_TRACK_FILE=track, PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == -9, f"the host was to die at {step}: rc {proc.returncode}\n{proc.stderr[-3000:]}"
    written, added, deleted, before = {}, set(), set(), None
    for line in proc.stdout.splitlines():
        kind, *rest = line.split()
        if kind == "W":
            written[int(rest[0])] = int(rest[1])
        elif kind == "A":
            added.add((int(rest[0]), int(rest[1])))
        elif kind == "D":
            deleted.add(int(rest[0]))
        elif kind == "B":
            before = int(rest[0])
    assert written and before, proc.stdout[-2000:]
    return written, added, deleted, before


async def verify(cfg, written, added, deleted, before, step):
    b = Bookie(cfg)
    await b.start()
    try:
        assert b.was_unclean_shutdown

        async def check_survivors():
            for lid, count in written.items():
                if lid in DOOMED:
                    continue
                for eid in range(count):
                    assert await b.read_entry(lid, eid) == expected_entry(1, lid, eid, ENTRY_BYTES), (lid, eid)
            for lid, eid in added:
                assert await b.read_entry(lid, eid) == expected_entry(1, lid, eid, ENTRY_BYTES), (lid, eid)
        await check_survivors()
        for lid in deleted:
            assert not b.ledger_exists(lid), f"deleted ledger {lid} is back after a crash at {step}"
            with pytest.raises(NoSuchLedgerError):
                await b.read_entry(lid, 0)
        b.gc.policy = DeletePolicy(DOOMED)
        out = await asyncio.to_thread(b.gc.trigger, force_major=True)
        assert out["ok"], out
        assert b.gc.compactor.pending() == [], "the interrupted compaction was not finished"
        for lid in DOOMED:
            assert not b.ledger_exists(lid)
        await check_survivors()
        assert log_bytes(cfg) < before, "the pass after the crash freed nothing"
    finally:
        await b.stop()


def crash_and_verify(tmp_path, step, power_loss, journal_off, damaged=False):
    data_dir = str(tmp_path / "data")
    track = str(tmp_path / "fsync.log")
    written, added, deleted, before = run_host(data_dir, track, step, journal_off, damaged)
    if not damaged and step != "after_ledger_delete" and step != "after_whole_log_delete":
        assert deleted == set(DOOMED)
    if power_loss:
        print(simulate_power_loss(track, [data_dir], tear=True))
    cfg = gc_config(data_dir, journal_off)
    os.environ["BK_FSYNC_TRACK_FILE"] = track
    try:
        eventloop.run(verify(cfg, written, added, deleted, before, step))
    finally:
        del os.environ["BK_FSYNC_TRACK_FILE"]


@pytest.mark.parametrize("journal_off", [False, True], ids=["journal", "no-journal"])
@pytest.mark.parametrize("power_loss", [False, True], ids=["kill9", "powerloss"])
@pytest.mark.parametrize("step", STEPS)
def test_crash_at_every_step_of_gc(tmp_path, step, power_loss, journal_off):
    crash_and_verify(tmp_path, step, power_loss, journal_off)


@pytest.mark.parametrize("journal_off", [False, True], ids=["journal", "no-journal"])
@pytest.mark.parametrize("power_loss", [False, True], ids=["kill9", "powerloss"])
@pytest.mark.parametrize("step", [s for s in STEPS if s != "after_ledger_delete"])
def test_crash_at_every_step_of_gc_with_a_damaged_log(tmp_path, step, power_loss, journal_off):
    crash_and_verify(tmp_path, step, power_loss, journal_off, damaged=True)
