"""Rack-aware placement on real bookie processes and a real ZooKeeper (issue 31), racks assigned by
BookKeeper's network topology script (network_topology_script_file_name): five `bk bookie`
processes in four racks (rack0 holds two). Ledgers E=3 WQ=2 AQ=2 are placed so that every write
quorum spans two racks; then rack0's bookies are SIGKILLed while the writers add: writes go on, the
ensemble changes replace them with bookies that keep the rule, and every acknowledged entry reads
back (invariants 1, 2, 4 via bk.testing.history)."""
from __future__ import annotations

import asyncio
import uuid

import pytest

from bk import eventloop
from bk.client import BookKeeper
from bk.client.placement.search import write_quorum_windows
from bk.testing.cluster import LocalCluster
from bk.testing.history import History, check_ledger, entries_to_map

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PW = b"racks"
RACKS = ["/rack0", "/rack0", "/rack1", "/rack2", "/rack3"]
FAST = dict(add_timeout_s=5.0, read_timeout_s=5.0, connect_timeout_s=3.0)


def topology_script(tmp_path, mapping: dict[str, str]) -> str:
    table = tmp_path / "racks.txt"
    table.write_text("".join(f"{b} {r}\n" for b, r in mapping.items()))
    calls = tmp_path / "script-calls.txt"
    script = tmp_path / "topology.sh"
    # As a ScriptBasedMapping script: one answer per argument, in order; unknown -> /default-rack.
    script.write_text("#!/bin/sh\n"
                      f'echo "$@" >> {calls}\n'
                      'for a in "$@"; do\n'
                      f'  r=$(awk -v b="$a" \'$1 == b {{print $2}}\' {table})\n'
                      '  echo "${r:-/default-rack}"\n'
                      'done\n')
    script.chmod(0o755)
    return str(script)


def spans_two_racks(ensemble, rack_of, wq: int) -> bool:
    return all(len({rack_of[ensemble[j]] for j in w}) >= 2 for w in write_quorum_windows(len(ensemble), wq))


def test_ensembles_follow_racks_and_survive_a_lost_rack(zk_server, tmp_path):
    cluster = LocalCluster(str(tmp_path / "cluster"), bookies=len(RACKS),
                           zk_connect=f"{zk_server}/racks-{uuid.uuid4().hex[:8]}", flush_interval_ms=200)
    cluster.start()
    try:
        rack_of = dict(zip(cluster.bookie_ids, RACKS))
        script = topology_script(tmp_path, rack_of)
        eventloop.run(scenario(cluster, rack_of, script))
        assert (tmp_path / "script-calls.txt").read_text().strip()  # the racks came from the script
    finally:
        cluster.stop()


async def scenario(cluster: LocalCluster, rack_of: dict[str, str], script: str) -> None:
    h = History()
    async with BookKeeper(cluster.metadata_uri, network_topology_script_file_name=script, **FAST) as bkc:
        assert bkc.placement.name == "rackaware"  # the client default
        rack0 = {b for b, r in rack_of.items() if r == "/rack0"}
        handles = []
        for _ in range(40):  # placement is random within the rule: keep ledgers until 3 use rack0
            lh = await bkc.create_ledger(3, 2, 2, password=PW)
            assert spans_two_racks(lh.ensemble, rack_of, 2), lh.ensemble
            assert bkc.placement.is_ensemble_adhering(lh.ensemble, 2, 2) == "MEETS_STRICT"
            if rack0 & set(lh.ensemble) or len(handles) < 1:
                handles.append(lh)
            else:
                await lh.close()
            if sum(bool(rack0 & set(x.ensemble)) for x in handles) >= 3:
                break
        assert sum(bool(rack0 & set(x.ensemble)) for x in handles) >= 3

        async def write(lh, start: int, n: int) -> None:
            sem = asyncio.Semaphore(16)

            async def one(i: int) -> None:
                async with sem:
                    await h.add(lh, b"rack-%d-%d-" % (lh.ledger_id, i) + bytes(i % 97))
            await asyncio.gather(*(one(i) for i in range(start, start + n)))

        await asyncio.gather(*(write(lh, 0, 50) for lh in handles))
        for i in sorted(cluster.index_of(b) for b in rack0):
            await asyncio.to_thread(cluster.kill, i)  # the whole rack is lost
        await asyncio.gather(*(write(lh, 50, 100) for lh in handles))  # writes go on
        for lh in handles:
            await h.close(lh)
            md = await bkc.get_ledger_metadata(lh.ledger_id)
            if rack0 & set(md.segments[0][1]):
                assert len(md.segments) >= 2  # an ensemble change replaced the lost rack
            last = md.segments[-1][1]
            assert not rack0 & set(last)
            assert spans_two_racks(last, rack_of, 2), md.segments  # the replacements kept the rule
            assert bkc.placement.is_ensemble_adhering(last, 2, 2) == "MEETS_STRICT"
    async with BookKeeper(cluster.metadata_uri, **FAST) as reader:
        for lh in handles:
            rh = await reader.open_ledger(lh.ledger_id, password=PW)
            got = entries_to_map(await rh.read_entries(0, rh.last_add_confirmed))
            check_ledger(h, lh.ledger_id, rh.metadata, [got], check_length=True).assert_ok()
            assert rh.last_add_confirmed == 149


def test_racks_published_in_the_bookies_registration(zk_server, tmp_path):
    """No script or mapping: each bookie's TOML bookie_rack is published as its registration property
    `rack` and the client places by it (and weighs by the free space the bookies report)."""
    cluster = LocalCluster(str(tmp_path / "cluster"), bookies=0,
                           zk_connect=f"{zk_server}/regracks-{uuid.uuid4().hex[:8]}")
    cluster.start()
    try:
        rack_of = cluster.add_racked_bookies(["/east/r1", "/east/r1", "/west/r2", "/west/r2"],
                                             bookie_isolation_group="tenant")
        eventloop.run(registration_scenario(cluster, rack_of))
    finally:
        cluster.stop()


async def registration_scenario(cluster: LocalCluster, rack_of: dict[str, str]) -> None:
    async with BookKeeper(cluster.metadata_uri, enforce_min_num_racks_per_write_quorum=True,
                          isolation_bookie_groups="tenant", disk_weight_based_placement_enabled=True, **FAST) as bkc:
        assert await bkc.placement.resolve_bookies(rack_of) == rack_of
        for _ in range(5):
            lh = await bkc.create_ledger(2, 2, 2, password=PW)
            assert {rack_of[b] for b in lh.ensemble} == {"/east/r1", "/west/r2"}
            await lh.add_entry(b"x")
            await lh.close()
        disk = bkc.placement.topology.disk  # GET_BOOKIE_INFO of every writable bookie, for the weights
        assert set(disk) == set(rack_of) and all(0 < free <= total for free, total in disk.values())
