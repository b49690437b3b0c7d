"""AutoRecovery inside real bookie processes on a real ZooKeeper (TESTING.md scenarios 8, 9, 10).

1. A bookie is killed (SIGKILL) and its disks wiped: every ledger that used it -
   closed ones of several shapes, one with two segments, one whose writer keeps
   writing, one whose writer is idle - returns to full replication; the idle
   writer's ledger is fenced and closed after the grace period and its next add
   fails; the active writer is not disturbed.
2. The auditor is killed while the audit of a lost bookie is pending (the
   lost-bookie delay), and then the worker holding the lock of an open ledger
   (during its grace period) is killed: a new auditor is elected and audits,
   the lock is released when the worker's session dies, another worker
   finishes, replication completes.
3. The lost-bookie delay postpones the audit and a bookie back in time cancels
   it; with replication disabled the markers appear but nothing is copied until
   it is enabled again; decommissionbookie moves everything off a stopped bookie
   and deletes its cookie.
"""
from __future__ import annotations

import asyncio
import json

import pytest

from test_autorecovery_support import (
    check_recovered, index_of, ledgers_naming, log_text, make_cluster, payloads, shell, until,
    wait_fully_replicated, wipe, write_ledger,
)

from bk import eventloop
from bk.client import BookKeeper
from bk.errors import LedgerClosedError, LedgerFencedError
from bk.meta.underreplication import LedgerUnderreplicationManager
from bk.replication import current_auditor

pytestmark = pytest.mark.integration


async def add_fails(writer) -> None:
    with pytest.raises((LedgerFencedError, LedgerClosedError)):
        await writer.add_entry(b"after the fence")


# ---------------------------------------------------------------------- scenario 1
async def lost_bookie_scenario(cluster) -> None:
    async with BookKeeper(cluster.metadata_uri, add_timeout_s=3) as bkc:
        ids = cluster.bookie_ids
        victim = ids[0]
        others = ids[1:]
        closed = {}
        for i, shape in enumerate(((3, 2, 2), (3, 3, 2), (4, 3, 2), (2, 2, 2))):
            lh, data = await write_ledger(bkc, 300, *shape, seed=i, ensemble=[victim] + others[:shape[0] - 1])
            closed[lh.ledger_id] = data
        big, big_data = await write_ledger(bkc, 0, close=False, ensemble=[victim, others[0], others[1]])
        big_data = [bytes([i % 251]) * 16384 + b"%d" % i for i in range(600)]  # ~10 MB
        await asyncio.gather(*(big.add_entry(x) for x in big_data))
        await big.close()
        closed[big.ledger_id] = big_data
        # two segments, the victim in both: a bookie of the first fails mid-stream (stopped, then back)
        two, two_data = await write_ledger(bkc, 50, close=False, seed=7, ensemble=[victim, others[0], others[1]])
        await asyncio.to_thread(cluster.stop_bookie, index_of(cluster, others[0]))
        more = payloads(50, 8)
        await asyncio.gather(*(two.add_entry(x) for x in more))
        await two.close()
        await asyncio.to_thread(cluster.start_bookie, index_of(cluster, others[0]))
        assert len(two.metadata.segments) == 2 and all(victim in e for _, e in two.metadata.segments)
        closed[two.ledger_id] = two_data + more
        idle, idle_data = await write_ledger(bkc, 40, close=False, seed=9, ensemble=[victim, others[2], others[1]])
        active, active_data = await write_ledger(bkc, 40, close=False, seed=10, ensemble=[victim, others[3], others[2]])

        out = await shell(cluster, "lostbookierecoverydelay", "--set", "0")  # from 60 during the set-up
        assert out.returncode == 0 and "0 s" in out.stdout
        i = index_of(cluster, victim)
        await asyncio.to_thread(cluster.kill, i)
        wipe(cluster, i)
        more = payloads(40, 11)
        await asyncio.gather(*(active.add_entry(x) for x in more))  # its writer moves off the victim itself
        active_data += more

        await wait_fully_replicated(bkc, [*closed, idle.ledger_id, active.ledger_id], {victim})
        for lid, data in closed.items():
            await check_recovered(bkc, lid, data, victim, last_entry_id=len(data) - 1)
        await check_recovered(bkc, idle.ledger_id, idle_data, victim, last_entry_id=39)  # fenced + closed
        await add_fails(idle)
        md = await bkc.get_ledger_metadata(active.ledger_id)
        assert not md.is_closed
        await check_recovered(bkc, active.ledger_id, active_data, victim)
        assert await active.add_entry(b"still writing") == 80
        await active.close()
        logs = "".join(log_text(cluster, j) for j in cluster.bookies if j != i)
        assert "fully replicated" in logs and "fencing and closing it" in logs


def test_a_wiped_bookie_is_replaced_in_every_ledger(zk_server, tmp_path):
    # A delay of 60 s while the ledgers are set up (a bookie is restarted for the two-segment ledger)
    cluster = make_cluster(zk_server, tmp_path, autorecovery=True, lost_bookie_recovery_delay_s=60,
                           open_ledger_rereplication_grace_period_ms=3000)
    with cluster:
        eventloop.run(lost_bookie_scenario(cluster))


# ---------------------------------------------------------------------- scenario 2
async def whoisauditor(cluster) -> str | None:
    out = await shell(cluster, "--json", "whoisauditor")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["auditor"]


def audited(cluster, auditor: str, bookie: str) -> bool:
    return any("auditing lost bookie(s)" in line and bookie in line
               for line in log_text(cluster, index_of(cluster, auditor)).splitlines())


async def killed_auditor_and_worker_scenario(cluster) -> None:
    async with BookKeeper(cluster.metadata_uri, add_timeout_s=3) as bkc:
        ids = cluster.bookie_ids
        auditor = await until(lambda: whoisauditor(cluster), "an auditor")
        victim = next(b for b in ids if b != auditor)
        others = [b for b in ids if b != victim]
        ledgers = {}
        for k in range(4):
            ensemble = [victim] + [others[(k + j) % len(others)] for j in range(2)]
            lh, data = await write_ledger(bkc, 100, seed=k, ensemble=ensemble)
            ledgers[lh.ledger_id] = data
        idle, idle_data = await write_ledger(bkc, 30, close=False, seed=20, ensemble=[victim, others[1], others[2]])

        vi, ai = index_of(cluster, victim), index_of(cluster, auditor)
        await asyncio.to_thread(cluster.kill, vi)
        wipe(cluster, vi)
        # The auditor notices the loss (when the victim's session expires) and waits the delay: kill it then.
        await until(lambda: f"auditing ['{victim}'] in" in log_text(cluster, ai), "the audit pending on the auditor")
        await asyncio.to_thread(cluster.kill, ai)
        urm = LedgerUnderreplicationManager(bkc.store)
        new_auditor = await until(lambda: _other_auditor(bkc, auditor), "a new auditor")
        assert new_auditor not in (auditor, victim)
        await asyncio.to_thread(cluster.start_bookie, ai)
        # A worker takes the idle ledger and waits its grace period holding the lock: kill that worker.
        holder = await until(lambda: urm.lock_holder(idle.ledger_id), "a worker locks the open ledger")
        hi = index_of(cluster, holder)
        await asyncio.to_thread(cluster.kill, hi)
        await until(lambda: _lock_not_held_by(urm, idle.ledger_id, holder), "the dead worker's lock released")
        await asyncio.to_thread(cluster.start_bookie, hi)

        await wait_fully_replicated(bkc, [*ledgers, idle.ledger_id], {victim})
        for lid, data in ledgers.items():
            await check_recovered(bkc, lid, data, victim, last_entry_id=len(data) - 1)
        await check_recovered(bkc, idle.ledger_id, idle_data, victim, last_entry_id=29)
        await add_fails(idle)
        assert audited(cluster, new_auditor, victim) and not audited(cluster, auditor, victim)
        assert await whoisauditor(cluster) not in (None, auditor)
        await urm.close()


async def _other_auditor(bkc, old: str):
    current = await current_auditor(bkc.store)
    return current if current not in (None, old) else None


async def _lock_not_held_by(urm, ledger_id: int, holder: str) -> bool:
    return await urm.lock_holder(ledger_id) != holder


def test_killed_auditor_and_killed_worker_are_replaced(zk_server, tmp_path):
    cluster = make_cluster(zk_server, tmp_path, autorecovery=True, lost_bookie_recovery_delay_s=4,
                           open_ledger_rereplication_grace_period_ms=8000)
    with cluster:
        eventloop.run(killed_auditor_and_worker_scenario(cluster))


# ---------------------------------------------------------------------- scenario 3
async def switches_scenario(cluster) -> None:
    async with BookKeeper(cluster.metadata_uri) as bkc:
        ids = cluster.bookie_ids
        late, disabled, gone = ids[0], ids[1], ids[2]
        ledgers = {}
        for k, ensemble in enumerate(([late, ids[3], ids[4]], [disabled, ids[3], ids[4]], [gone, ids[3], ids[4]],
                                      [late, disabled, gone])):
            lh, data = await write_ledger(bkc, 60, seed=k, ensemble=ensemble)
            ledgers[lh.ledger_id] = data
        auditor = await until(lambda: whoisauditor(cluster), "an auditor")
        ai = index_of(cluster, auditor)
        urm = LedgerUnderreplicationManager(bkc.store)

        # (a) the delay postpones the audit; the bookie comes back in time: cancelled
        out = await shell(cluster, "lostbookierecoverydelay", "--set", "30")
        assert out.returncode == 0 and "30 s" in out.stdout
        li = index_of(cluster, late)
        if li == ai:  # the auditor must survive this part: use another bookie
            late, li = ids[1], index_of(cluster, ids[1])
        await asyncio.to_thread(cluster.stop_bookie, li)
        await until(lambda: f"auditing ['{late}'] in 30 s" in log_text(cluster, ai), "audit postponed")
        assert not await urm.list_underreplicated_ledgers()
        await asyncio.to_thread(cluster.start_bookie, li)
        await until(lambda: "audit cancelled" in log_text(cluster, ai), "audit cancelled")
        assert not await urm.list_underreplicated_ledgers()

        # (b) replication disabled: marked, not copied; enabled: replicated
        out = await shell(cluster, "autorecovery", "--disable")
        assert out.returncode == 0 and "DISABLED" in out.stdout
        out = await shell(cluster, "lostbookierecoverydelay", "--set", "0")
        assert out.returncode == 0
        victim = next(b for b in (disabled, gone, ids[3]) if b not in (auditor, late))
        vi = index_of(cluster, victim)
        await asyncio.to_thread(cluster.stop_bookie, vi)
        wipe(cluster, vi)
        using = await ledgers_naming(bkc, ledgers, victim)
        out = await until(lambda: _marked_for(cluster, victim, len(using)), "markers naming the lost bookie")
        rows = json.loads(out.stdout)["ledgers"]
        assert sorted(r["ledger_id"] for r in rows) == sorted(using)
        assert all(r["missing_replicas"] == [victim] and r["worker"] is None for r in rows)
        await asyncio.sleep(3)  # workers are alive and polling: nothing may be copied while disabled
        assert sorted(await ledgers_naming(bkc, ledgers, victim)) == sorted(using)
        assert len(await urm.list_underreplicated_ledgers()) == len(using)
        out = await shell(cluster, "autorecovery", "--enable")
        assert out.returncode == 0 and "is enabled" in out.stdout
        await wait_fully_replicated(bkc, list(ledgers), {victim})
        for lid in using:
            await check_recovered(bkc, lid, ledgers[lid], victim, last_entry_id=59)

        # (c) decommission a stopped (intact) bookie: a long delay does not hold it up (it triggers the audit)
        out = await shell(cluster, "lostbookierecoverydelay", "--set", "3600")
        assert out.returncode == 0
        leaving = None
        for b in cluster.bookie_ids:
            if b not in (auditor, victim) and await ledgers_naming(bkc, ledgers, b):
                leaving = b
                break
        out = await shell(cluster, "decommissionbookie", leaving)
        assert out.returncode == 1 and "stop it before decommissioning" in out.stderr
        await asyncio.to_thread(cluster.stop_bookie, index_of(cluster, leaving))
        using = await ledgers_naming(bkc, ledgers, leaving)
        out = await shell(cluster, "decommissionbookie", leaving, "--timeout", "100")
        assert out.returncode == 0, out.stderr
        assert "cookie deleted" in out.stdout and f"{len(using)}/{len(using)} ledger(s) moved" in out.stdout
        assert not await ledgers_naming(bkc, ledgers, leaving)
        assert leaving not in await bkc.registration.known_bookies()
        for lid in using:
            await check_recovered(bkc, lid, ledgers[lid], leaving, last_entry_id=59)
        assert not audited(cluster, auditor, late)  # the cancelled audit never ran
        out = await shell(cluster, "autorecovery", "--status")
        assert out.returncode == 0 and f"auditor: {auditor}" in out.stdout
        await urm.close()


async def _marked_for(cluster, bookie: str, count: int):
    out = await shell(cluster, "--json", "listunderreplicated", "--missing-replica", bookie, "--print-worker")
    assert out.returncode == 0, out.stderr
    return out if len(json.loads(out.stdout)["ledgers"]) == count else None


def test_delay_disable_and_decommission_switches(zk_server, tmp_path):
    cluster = make_cluster(zk_server, tmp_path, autorecovery=True)
    with cluster:
        eventloop.run(switches_scenario(cluster))
