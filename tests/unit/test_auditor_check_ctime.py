"""The auditor's recorded last run of its ledger check (BookKeeper's checkallledgersctime
znode), which `bk shell forceauditchecks` sets back: an auditor that starts runs an overdue
check at once, waits out a recent one, and records each run; with no record it waits a
whole interval as before. The znode holds BookKeeper's CheckAllLedgersFormat (field 1, an
int64 of ms), so a Java auditor reads what bk writes and the other way round.
"""
from __future__ import annotations

import asyncio
import time

from test_client_support import FakeCluster, run_async, until

from bk.client import BookKeeper
from bk.meta.underreplication import LedgerUnderreplicationManager
from bk.replication import Auditor

HOUR = 3600.0
DAYS_21_MS = 21 * 24 * 3600 * 1000


async def auditor_with(bkc, ctime_ms):
    urm = LedgerUnderreplicationManager(bkc.store)
    if ctime_ms is not None:
        await urm.set_check_ctime("checkallledgers", ctime_ms)
    auditor = Auditor(bkc, urm, "auditor:1", check_interval_s=HOUR, bookie_check_interval_s=0)
    runs = []
    real = auditor.check_all_ledgers

    async def counted():
        runs.append(time.time())
        return await real()
    auditor.check_all_ledgers = counted
    return await auditor.start(), urm, runs


@run_async
async def test_overdue_check_runs_at_start_and_is_recorded():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        forced = int(time.time() * 1000) - DAYS_21_MS
        auditor, urm, runs = await auditor_with(bkc, forced)
        try:
            await until(lambda: runs, "the overdue ledger check ran")
            await until(lambda: _after(urm, forced), "its run recorded")
        finally:
            await auditor.stop()
        data, _ = await bkc.store.get(urm.paths.check_ctime("checkallledgers"))
        assert data[0] == 0x08  # protobuf field 1, varint: BookKeeper's CheckAllLedgersFormat


async def _after(urm, ms):
    return (await urm.get_check_ctime("checkallledgers") or 0) > ms


@run_async
async def test_recent_or_unrecorded_check_waits():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        for ctime in (None, int(time.time() * 1000)):  # unrecorded first: a recent record next
            auditor, urm, runs = await auditor_with(bkc, ctime)
            try:
                await asyncio.sleep(0.5)
                assert runs == []
            finally:
                await auditor.stop()
