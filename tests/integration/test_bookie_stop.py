"""A bookie always stops (issue 27; docs/OPERATIONS.md "Stopping"): a SIGTERM'd `bk bookie`,
`bk autorecovery` or `bk standalone` is gone within shutdown_timeout_ms whatever ZooKeeper
(stopped, paused), a peer (paused) or a disk (an fsync that hangs) does, and its exit status
says whether the stop was clean: 0 = everything durable and the unclean-shutdown flag
cleared, 3 = stopped but not cleanly (flag left set), 4 = a second signal. With the journal
off, the next boot runs BP-46 phase one exactly when the stop was not clean.

Real processes and real ZooKeeper servers (each ZooKeeper test owns one, to stop or pause
it). The waits are bounded generously (shutdown_timeout_ms + 20 s): what is asserted is
that the process exited and how, never how fast.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from bk import eventloop
from bk.client import BookKeeper
from bk.config import load_config
from bk.index import Index
from bk.index.state import UNCLEAN_SHUTDOWN
from bk.testing.cluster import LocalCluster, write_toml
from bk.testing.diskfaults import DiskFaultControl
from bk.testing.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TIMEOUT_MS = 3000
BOUND_S = TIMEOUT_MS / 1000 + 20  # generous: the process must be gone, however slow the machine
EXIT_CLEAN, EXIT_UNCLEAN, EXIT_FORCED = 0, 3, 4
PW = b"pw"
PHASE_ONE = "may have lost data"  # bk.server.integrity.run_phase_one's log line
UNCLEAN_BOOT = "was not shut down cleanly"
FAST = dict(add_timeout_s=5.0, read_timeout_s=5.0, connect_timeout_s=3.0)


def make_cluster(tmp_path, bookies: int, *, zk_server: str | None = None, **overrides) -> LocalCluster:
    """Journal off (BP-46), a short shutdown timeout, a disk-fault control file. Without
    zk_server the cluster owns its ZooKeeper, on a fixed port so that it can be restarted."""
    ctl = DiskFaultControl(str(tmp_path / "faults.json"))
    values = dict(journal_write_data=False, shutdown_timeout_ms=TIMEOUT_MS, flush_interval_ms=500,
                  zk_timeout_ms=4000)
    values.update(overrides)
    if zk_server is None:
        c = LocalCluster(str(tmp_path / "c"), bookies=bookies, zk_port=free_port(),
                         env=dict(os.environ, **ctl.env()), **values)
    else:
        c = LocalCluster(str(tmp_path / "c"), bookies=bookies, zk_connect=f"{zk_server}/stop-{uuid.uuid4().hex[:8]}",
                         env=dict(os.environ, **ctl.env()), **values)
    c.faults = ctl
    return c


def payload(i: int) -> bytes:
    return b"stop-%d-" % i + bytes([i % 251]) * (40 + i % 61)


def run(coro, timeout_s: float = 120):
    return eventloop.run(asyncio.wait_for(coro, timeout_s))


async def write(uri: str, ensemble: int, n: int) -> int:
    async with BookKeeper(uri, **FAST) as bkc:
        lh = await bkc.create_ledger(ensemble, ensemble, ensemble, password=PW)
        for i in range(n):
            await lh.add_entry(payload(i))
        return lh.ledger_id


async def read_back(uri: str, ledger_id: int, n: int) -> list[bytes]:
    async with BookKeeper(uri, **FAST) as bkc:
        rh = await bkc.open_ledger(ledger_id, PW)
        return [bytes(e.data) for e in await rh.read_entries(0, n - 1)]


def sigterm_and_wait(b) -> int:
    """SIGTERM one bookie process; its exit status. Fails (and kills it) if it is still running
    BOUND_S later: that is the defect."""
    b.proc.send_signal(signal.SIGTERM)
    try:
        return b.proc.wait(BOUND_S)
    except subprocess.TimeoutExpired:
        b.proc.kill()
        b.proc.wait()
        pytest.fail(f"bookie {b.bookie_id} still running {BOUND_S:.0f} s after SIGTERM"
                    f" (shutdown_timeout_ms={TIMEOUT_MS}); log tail:\n{b._log_tail()}")


def run_log(b) -> str:
    """The bookie's log since its last start."""
    return b._log_tail(1 << 24)


def unclean_flag(c: LocalCluster, i: int) -> bool:
    """The unclean-shutdown flag in stopped bookie i's index."""
    d = os.path.join(c.data_dir, f"bookie-{i}", "ledgers")
    cfg = load_config(env={}, overrides=dict(ledger_dirs=[d]))
    index = Index(cfg.resolved_index_dir, cfg, readonly=True)
    try:
        return index.get_flag(UNCLEAN_SHUTDOWN)
    finally:
        index.close()


def wait_for(pred, timeout_s: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def take_zookeeper_down(c: LocalCluster, how: str) -> bool:
    """Stop or pause (SIGSTOP) the cluster's own ZooKeeper; True when paused (to SIGCONT)."""
    if how == "stopped":
        c.zk.stop()
    else:
        os.kill(c.zk.pid, signal.SIGSTOP)
    time.sleep(1.0)  # let the session notice (or not): either way the stop must end
    return how == "paused"


def restart_and_check_boot(c: LocalCluster, i: int, *, clean: bool) -> str:
    """Start bookie i again; its boot runs BP-46 phase one exactly when the stop was not clean."""
    c.start_bookie(i)
    text = run_log(c.bookies[i])
    assert (UNCLEAN_BOOT in text) == (not clean), text[-3000:]
    assert (PHASE_ONE in text) == (not clean), text[-3000:]
    return text


# ------------------------------------------------------------------ ZooKeeper stopped / paused
@pytest.mark.parametrize("zk_fault", ["stopped", "paused"])
def test_sigterm_with_zookeeper_down_stops_clean_within_the_timeout(tmp_path, zk_fault):
    """Deregistration cannot reach ZooKeeper: it is abandoned (the znode is ephemeral), the
    final checkpoint still makes everything durable, so the stop is clean (exit 0, flag
    cleared) and the next boot runs no phase one."""
    c = make_cluster(tmp_path, 1).start()
    paused = False
    try:
        ledger_id = run(write(c.metadata_uri, 1, 50))
        b = c.bookies[0]
        paused = take_zookeeper_down(c, zk_fault)
        code = sigterm_and_wait(b)
        text = run_log(b)
        assert code == EXIT_CLEAN, text[-3000:]
        assert "abandoned: deregistering" in text, text[-3000:]  # the log says what was abandoned
        assert not unclean_flag(c, 0)
        if paused:
            os.kill(c.zk.pid, signal.SIGCONT)
            paused = False
        else:
            c.zk.start()
        restart_and_check_boot(c, 0, clean=True)
        assert run(read_back(c.metadata_uri, ledger_id, 50)) == [payload(i) for i in range(50)]
    finally:
        if paused:
            os.kill(c.zk.pid, signal.SIGCONT)
        c.stop()


# ------------------------------------------------------------------ a disk whose fsync hangs
def test_sigterm_with_a_hung_fsync_exits_unclean_and_the_next_boot_runs_phase_one(tmp_path, zk_server):
    """The final checkpoint cannot finish: the bookie leaves at the deadline anyway, with exit
    3, the flag set and the abandoned checkpoint named; the next boot (disk healed) runs
    phase one and every acknowledged entry reads back."""
    c = make_cluster(tmp_path, 2, zk_server=zk_server).start()
    try:
        ledger_id = run(write(c.metadata_uri, 2, 40))
        b = c.bookies[0]
        rule = c.faults.hang(op="fsync", path_prefix=os.path.join(c.data_dir, "bookie-0", "ledgers"))
        code = sigterm_and_wait(b)
        text = run_log(b)
        assert c.faults.hits(rule) >= 1  # the fsync did hang
        assert code == EXIT_UNCLEAN, text[-3000:]
        assert "final checkpoint" in text and "abandon" in text, text[-3000:]
        c.faults.heal()
        assert unclean_flag(c, 0)
        restart_and_check_boot(c, 0, clean=False)
        assert run(read_back(c.metadata_uri, ledger_id, 40)) == [payload(i) for i in range(40)]
    finally:
        c.faults.heal()
        c.stop()


def test_second_sigterm_exits_at_once_with_the_flag_set(tmp_path, zk_server):
    c = make_cluster(tmp_path, 1, zk_server=zk_server, shutdown_timeout_ms=600_000).start()
    try:
        run(write(c.metadata_uri, 1, 10))
        b = c.bookies[0]
        c.faults.hang(op="fsync", path_prefix=os.path.join(c.data_dir, "bookie-0", "ledgers"))
        b.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "stopping (SIGTERM)" in run_log(b), what="the stop to begin")
        code = sigterm_and_wait(b)  # the second one; the deadline is 10 minutes away
        assert code == EXIT_FORCED, run_log(b)[-3000:]
        assert "second SIGTERM" in run_log(b)
        c.faults.heal()
        assert unclean_flag(c, 0)
        restart_and_check_boot(c, 0, clean=False)
    finally:
        c.faults.heal()
        c.stop()


# ------------------------------------------------------------------ a peer paused
def test_sigterm_while_repairing_from_a_paused_peer_stops_within_the_timeout(tmp_path, zk_server):
    """A journal-off bookie crashed (SIGKILL); at its restart phase one puts its ledger in
    limbo and the repair reads from the only other replica, which is paused. A SIGTERM then
    ends the bookie within the timeout; phase one had completed and the checkpoint works, so
    the stop is clean and the repair resumes at the next boot."""
    c = make_cluster(tmp_path, 2, zk_server=zk_server).start()
    peer = c.bookies[1]
    try:
        ledger_id = run(write(c.metadata_uri, 2, 200))
        c.kill(0)
        peer.proc.send_signal(signal.SIGSTOP)
        c.start_bookie(0)
        b = c.bookies[0]
        assert PHASE_ONE in run_log(b)
        time.sleep(1.0)  # the repair is now waiting on the paused peer
        code = sigterm_and_wait(b)
        text = run_log(b)
        assert code == EXIT_CLEAN, text[-3000:]
        assert not unclean_flag(c, 0)
        peer.proc.send_signal(signal.SIGCONT)
        text = restart_and_check_boot(c, 0, clean=True)
        assert run(read_back(c.metadata_uri, ledger_id, 200)) == [payload(i) for i in range(200)]
    finally:
        peer.signal(signal.SIGCONT)
        c.stop()


# ------------------------------------------------------------------ bk autorecovery, bk standalone
@pytest.mark.parametrize("zk_fault", ["stopped", "paused"])
def test_autorecovery_with_zookeeper_down_exits_within_the_timeout(tmp_path, zk_fault):
    """`bk autorecovery`, elected auditor, cannot withdraw its vote before the deadline: it
    leaves within the timeout with exit 3 (the vote ends with the session) and says what it
    abandoned."""
    c = make_cluster(tmp_path, 1).start()
    proc = None
    paused = False
    try:
        conf = str(tmp_path / "ar.toml")
        # a session timeout longer than the stop's: a paused server is not noticed before the deadline
        write_toml(conf, {**c.bookie_config(0, int(c.bookies[0].bookie_id.rpartition(":")[2])),
                          "zk_timeout_ms": 10_000})
        log_path = tmp_path / "ar.log"
        with open(log_path, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "bk.cli.main", "autorecovery", "--conf", conf],
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(lambda: b"is the auditor" in log_path.read_bytes() or proc.poll() is not None,
                 what="autorecovery elected")
        assert proc.poll() is None, log_path.read_text()
        paused = take_zookeeper_down(c, zk_fault)
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(BOUND_S)
        except subprocess.TimeoutExpired:
            pytest.fail("bk autorecovery still running after SIGTERM:\n" + log_path.read_text()[-3000:])
        text = log_path.read_text()
        # the lock and vote could not be released (they end with the session): not clean, and said
        assert code == EXIT_UNCLEAN, text[-3000:]
        assert "abandoned" in text, text[-3000:]
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if paused:
            os.kill(c.zk.pid, signal.SIGCONT)
        c.stop()


@pytest.fixture
def default_ports():
    """`bk standalone` takes bookie port 3181 and HTTP 8180 when free: not while
    test_standalone_ports (another xdist worker) counts on getting them twice."""
    from bk.testing.ports import well_known_ports
    with well_known_ports():
        yield


def test_standalone_with_its_zookeeper_killed_stops_its_bookies_cleanly(tmp_path, default_ports):
    """`bk standalone` whose ZooKeeper died: SIGTERM stops every bookie within the timeout,
    each cleanly (deregistration abandoned, checkpoint done), and standalone exits 0."""
    data = tmp_path / "sa"
    proc = subprocess.Popen([sys.executable, "-m", "bk.cli.main", "standalone", "--bookies", "1",
                             "--data-dir", str(data), "--zk-port", str(free_port()),
                             "--shutdown-timeout-ms", str(TIMEOUT_MS)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("Press Ctrl-C"):
                break
        assert "bk standalone is running" in "".join(lines), "".join(lines)
        zk_pid = int(subprocess.run(["pgrep", "-f", f"{data}/zookeeper/zoo.cfg"], capture_output=True, text=True)
                     .stdout.split()[0])
        os.kill(zk_pid, signal.SIGKILL)
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=BOUND_S + 10)  # + standalone's own margin
        except subprocess.TimeoutExpired:
            pytest.fail("bk standalone still running after SIGTERM")
        bookie_log = (data / "bookie-0.log").read_text()
        assert proc.returncode == EXIT_CLEAN, out + bookie_log[-3000:]
        assert "stopped (clean" in bookie_log, bookie_log[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
