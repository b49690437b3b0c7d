"""Helpers for the bookie-recovery scenarios against real bookie processes (LocalCluster on the
session's ZooKeeper), shared by test_autorecovery.py and test_recover_shell.py.

The checks after a recovery are REPLICATION.md's: no segment names the lost bookie,
every entry is on every bookie of its write set (a raw READ from each bookie,
digest-verified, with the payload the writer sent), closed ledgers keep their
lastEntryId and length, no under-replication marker or lock is left.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import shutil
import subprocess
import sys
import time
import uuid

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "unit"))

from test_replication import check_recovered, payloads, write_ledger  # noqa: E402,F401

from bk.meta.underreplication import LedgerUnderreplicationManager  # noqa: E402
from bk.testing.cluster import LocalCluster, run_shell  # noqa: E402

WAIT_S = 120.0  # bound for something that must happen (never a timing assertion)


def make_cluster(zk_server: str, tmp_path, bookies: int = 5, **overrides) -> LocalCluster:
    chroot = f"{zk_server}/rec-{uuid.uuid4().hex[:10]}"
    settings = dict(flush_interval_ms=200, lost_bookie_recovery_delay_s=0,
                    auditor_periodic_bookie_check_interval_s=3600, auditor_periodic_check_interval_s=0,
                    rereplication_entry_batch_size=64)
    settings.update(overrides)
    return LocalCluster(str(tmp_path), bookies=bookies, zk_connect=chroot, **settings)


def index_of(cluster: LocalCluster, bookie_id: str) -> int:
    return next(i for i, b in cluster.bookies.items() if b.bookie_id == bookie_id)


def wipe(cluster: LocalCluster, i: int) -> None:
    """The bookie's disks are gone: its journal, ledger and index directories."""
    assert not cluster.bookies[i].alive
    shutil.rmtree(os.path.join(cluster.data_dir, f"bookie-{i}"))


def log_text(cluster: LocalCluster, i: int) -> str:
    with open(cluster.bookies[i].log_path, "rb") as fh:
        return fh.read().decode(errors="replace")


async def shell(cluster: LocalCluster, *args: str, timeout_s: float = 120.0):
    return await asyncio.to_thread(run_shell, cluster.metadata_uri, *args, timeout_s=timeout_s)


async def until(predicate, what: str, wait_s: float = WAIT_S, poll_s: float = 0.1):
    deadline = time.monotonic() + wait_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {wait_s:.0f} s waiting for {what}")
        await asyncio.sleep(poll_s)


async def ledgers_naming(bkc, ledger_ids, bookie_id) -> list[int]:
    return [lid for lid in ledger_ids if bookie_id in (await bkc.get_ledger_metadata(lid)).bookies()]


async def wait_fully_replicated(bkc, ledger_ids, lost, wait_s: float = WAIT_S) -> None:
    urm = LedgerUnderreplicationManager(bkc.store)

    async def done():
        for bookie in lost:
            if await ledgers_naming(bkc, ledger_ids, bookie):
                return False
        # a worker deletes the marker, then releases its lock: both must be gone
        return not await urm.list_underreplicated_ledgers() and not await bkc.store.children(urm.paths.ur_locks)
    try:
        await until(done, f"every ledger off {sorted(lost)}, no marker and no lock left", wait_s)
    finally:
        await urm.close()


@contextlib.contextmanager
def autorecovery_process(bookie, *args: str):
    """A real `bk autorecovery --conf <bookie's file> ARGS...` process, once ready: yields it
    and its ready line (it fails the test with what it printed if it exits before it is
    ready); killed on the way out if still running."""
    proc = subprocess.Popen([sys.executable, "-m", "bk.cli.main", "autorecovery", "--conf", bookie.conf_path, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = []
        while f"autorecovery for bookie {bookie.bookie_id} ready" not in (line := proc.stdout.readline()):
            assert line, "".join(seen)  # exited before it was ready
            seen.append(line)
        yield proc, line
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
