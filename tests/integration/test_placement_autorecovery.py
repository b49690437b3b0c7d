"""The Auditor's placement check and its repair on real bookie processes and a real ZooKeeper (issue 31;
docs/PLACEMENT.md): four `bk bookie` processes with AutoRecovery on, racks from their registrations
(bookie_rack: two in /rack0, two in /rack1), auditor_periodic_placement_policy_check_interval_s and
repaired_placement_policy_not_adhering_bookie_enable in their TOML. A closed ledger (E2 WQ2 AQ2) is
written with its ensemble forced into /rack0, so its write quorum is in one rack. `bk shell triggeraudit`
makes the auditor check placement now: it marks the ledger, a replication worker moves one replica
to /rack1, and then the policy says MEETS_STRICT and every entry reads back, digest-verified, from
every bookie the new metadata names; the auditor's bookie exports the counts on /metrics.
Then a rack lost (racks from a topology script): the lost bookie's re-replication to a worker's own
bookie breaks the rack rule, the periodic check (every 1 s) marks the ledger and a worker repairs it."""
from __future__ import annotations

import asyncio
import pathlib
import sys
import urllib.request
import uuid

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "unit"))

from test_autorecovery_support import log_text, until  # noqa: E402
from test_replication import raw_entries_ok, write_ledger  # noqa: E402

from bk import eventloop  # noqa: E402
from bk.client import BookKeeper  # noqa: E402
from bk.meta.underreplication import LedgerUnderreplicationManager  # noqa: E402
from bk.replication.election import current_auditor  # noqa: E402
from bk.testing.cluster import LocalCluster, run_shell  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RACKS = ["/rack0", "/rack0", "/rack1", "/rack1"]
FAST = dict(add_timeout_s=5.0, read_timeout_s=5.0, connect_timeout_s=3.0)
WAIT_S = 60.0  # a bound for what must happen, never a timing assertion


def test_auditor_marks_a_one_rack_ledger_and_a_worker_moves_it_across_racks(zk_server, tmp_path):
    cluster = LocalCluster(str(tmp_path / "cluster"), bookies=0, autorecovery=True,
                           zk_connect=f"{zk_server}/ppc-{uuid.uuid4().hex[:8]}", flush_interval_ms=200,
                           lost_bookie_recovery_delay_s=0, auditor_periodic_check_interval_s=0,
                           auditor_periodic_bookie_check_interval_s=3600,
                           auditor_periodic_placement_policy_check_interval_s=3600,
                           repaired_placement_policy_not_adhering_bookie_enable=True)
    cluster.start()
    try:
        eventloop.run(scenario(cluster, cluster.add_racked_bookies(RACKS)))
    finally:
        cluster.stop()


async def scenario(cluster: LocalCluster, rack_of: dict[str, str]) -> None:
    rack0 = [b for b, r in rack_of.items() if r == "/rack0"]
    async with BookKeeper(cluster.metadata_uri, **FAST) as bkc:
        assert await bkc.placement.resolve_bookies(rack_of) == rack_of
        # the writer's policy would never choose this: the ensemble is forced (test_replication.write_ledger)
        lh, data = await write_ledger(bkc, 200, 2, 2, 2, ensemble=rack0, seed=31)
        assert bkc.placement.is_ensemble_adhering(rack0, 2, 2) == "FAIL"
        auditor = await until(lambda: current_auditor(bkc.store), "an auditor elected", WAIT_S)
        # the auditor ran its first placement check at start, before the ledger existed: ask for one now
        out = await asyncio.to_thread(run_shell, cluster.metadata_uri, "triggeraudit")
        assert out.returncode == 0, out.stderr or out.stdout

        async def moved():
            md = await bkc.get_ledger_metadata(lh.ledger_id)
            return md if set(md.segments[0][1]) != set(rack0) else None
        md = await repaired(bkc, lh.ledger_id, moved, "the ledger moved off its one rack")
        ensemble = md.segments[0][1]
        assert md.is_closed and md.last_entry_id == 199 and len(md.segments) == 1
        assert {rack_of[b] for b in ensemble} == {"/rack0", "/rack1"}
        assert bkc.placement.is_ensemble_adhering(ensemble, 2, 2) == "MEETS_STRICT"
        await raw_entries_ok(bkc, lh.ledger_id, data)  # every entry from every replica the metadata names
        # the auditor's bookie exports what its check found (the ledger, before the move)
        page = await asyncio.to_thread(_metrics, cluster.bookies[cluster.index_of(auditor)].http_url)
        assert "auditor_NUM_LEDGERS_NOT_ADHERING_TO_PLACEMENT_POLICY 1" in page, page[-2000:]
        assert "auditor_PLACEMENT_POLICY_CHECK_TIME" in page


async def repaired(bkc, ledger_id: int, condition, what: str):
    """Wait for `condition()` on the ledger's metadata, then for no marker and no lock left; the metadata."""
    await until(condition, what, WAIT_S)
    urm = LedgerUnderreplicationManager(bkc.store)

    async def idle() -> bool:
        return not await urm.list_underreplicated_ledgers() and not await bkc.store.children(urm.paths.ur_locks)
    try:
        await until(idle, "marker and lock gone", WAIT_S)
    finally:
        await urm.close()
    return await bkc.get_ledger_metadata(ledger_id)


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        return r.read().decode()


# A rack lost: the lost bookie's copies are re-replicated first (the worker copies to its own bookie,
# which here breaks the rack rule), then the periodic placement check marks the ledger and a worker
# moves that position again, to a bookie that keeps the rule. Racks from a topology script.
LOST_RACKS = ["/rack0", "/rack1", "/rack1", "/rack1", "/rack2", "/rack2"]


def test_after_a_lost_rack_the_periodic_check_repairs_what_re_replication_placed(zk_server, tmp_path):
    from bk.testing.ports import free_port
    from test_placement_racks import topology_script

    ports = {i: free_port() for i in range(len(LOST_RACKS))}
    rack_of = {f"127.0.0.1:{ports[i]}": rack for i, rack in enumerate(LOST_RACKS)}
    script = topology_script(tmp_path, rack_of)
    cluster = LocalCluster(str(tmp_path / "cluster"), bookies=0, autorecovery=True, bookie_ports=ports,
                           zk_connect=f"{zk_server}/ppl-{uuid.uuid4().hex[:8]}", flush_interval_ms=200,
                           lost_bookie_recovery_delay_s=0, auditor_periodic_check_interval_s=0,
                           auditor_periodic_bookie_check_interval_s=3600,
                           auditor_periodic_placement_policy_check_interval_s=1,
                           repaired_placement_policy_not_adhering_bookie_enable=True,
                           network_topology_script_file_name=script)
    cluster.start()
    try:
        for i in range(len(LOST_RACKS)):
            # bookie 5's AutoRecovery is off, so the only worker that can take bookie 0's place is bookie 3's
            cluster.add_bookie(i, wait=False, autorecovery_enabled=i != 5)
        for b in cluster.bookies.values():
            b.wait_ready()
        assert cluster.bookie_ids == list(rack_of)
        eventloop.run(lost_rack_scenario(cluster, rack_of, script))
    finally:
        cluster.stop()


async def lost_rack_scenario(cluster: LocalCluster, rack_of: dict[str, str], script: str) -> None:
    b = cluster.bookie_ids
    async with BookKeeper(cluster.metadata_uri, network_topology_script_file_name=script, **FAST) as bkc:
        assert await bkc.placement.resolve_bookies(rack_of) == rack_of
        first = [b[0], b[1], b[4], b[2]]  # E4 WQ2: every write quorum spans two racks
        assert bkc.placement.is_ensemble_adhering(first, 2, 2) == "MEETS_STRICT"
        lh, data = await write_ledger(bkc, 120, 4, 2, 2, ensemble=first, seed=32)
        await asyncio.to_thread(cluster.kill, 0)  # /rack0 is lost

        async def settled():
            md = await bkc.get_ledger_metadata(lh.ledger_id)
            return md if b[0] not in md.bookies() and b[3] not in md.bookies() else None
        # bookie 3 takes bookie 0's place (its own bookie: /rack1 beside /rack1), then the check moves it on
        md = await repaired(bkc, lh.ledger_id, settled, "bookie 0 replaced, and bookie 3 moved off again")
        assert md.segments == ((0, (b[5], b[1], b[4], b[2])),)
        assert bkc.placement.is_ensemble_adhering(md.segments[0][1], 2, 2) == "MEETS_STRICT"
        await raw_entries_ok(bkc, lh.ledger_id, data)
        # the way there: bookie 3 held the place (FAIL: beside bookies 1 and 2 of /rack1), then was moved
        logs = "".join(log_text(cluster, i) for i in cluster.bookies if i != 0)
        assert f"segment at 0 moved from {[b[3], b[1], b[4], b[2]]} to {[b[5], b[1], b[4], b[2]]}" in logs
