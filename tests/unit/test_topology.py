"""Where bookie locations come from (bk.client.topology): the topology script, a static mapping,
Pulsar's /bookies znode, registration properties, and the default rack; and the BookKeeper client
wiring (its keyword arguments, create_ledger placing by rack on fake bookies)."""
from __future__ import annotations

import json
import pathlib
import sys
import uuid

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from test_client_support import run_async  # noqa: E402

from bk.client import BookKeeper  # noqa: E402
from bk.client.placement import EnsemblePlacementPolicy, PlacementSettings  # noqa: E402
from bk.client.topology import NetworkTopology, RackLayout  # noqa: E402
from bk.errors import IncorrectParameterError  # noqa: E402
from bk.meta import open_store  # noqa: E402
from bk.meta.registration import BookieServiceInfo, RegistrationManager  # noqa: E402


def script(tmp_path, body: str) -> str:
    path = tmp_path / "topology.sh"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


@run_async
async def test_script_is_called_in_batches_and_cached(tmp_path):
    calls = tmp_path / "calls"
    path = script(tmp_path, f'echo "$@" >> {calls}\nfor a in "$@"; do p=${{a##*:}}; echo "/rack$((p % 3))"; done\n')
    topo = NetworkTopology(script=path, script_number_args=2)
    bookies = [f"127.0.0.1:{3180 + i}" for i in range(5)]
    got = await topo.resolve(bookies)
    assert got == {b: f"/rack{(3180 + i) % 3}" for i, b in enumerate(bookies)}
    assert [len(line.split()) for line in calls.read_text().splitlines()] == [2, 2, 1]
    await topo.resolve(bookies)  # cached, as ScriptBasedMapping's answers
    assert len(calls.read_text().splitlines()) == 3


@run_async
async def test_a_failing_script_leaves_the_default_rack_and_is_retried(tmp_path):
    flag = tmp_path / "ok"
    path = script(tmp_path, f'[ -e {flag} ] || exit 3\nfor a in "$@"; do echo /r1; done\n')
    topo = NetworkTopology(script=path)
    assert await topo.resolve(["h:1"]) == {"h:1": "/default-rack"}
    flag.write_text("")
    assert await topo.resolve(["h:1"]) == {"h:1": "/default-rack"}  # not run again at once
    topo._script_failed_at -= 60
    assert await topo.resolve(["h:1"]) == {"h:1": "/r1"}
    wrong = NetworkTopology(script=script(tmp_path, "echo /a /b\n"))
    assert await wrong.resolve(["h:1"]) == {"h:1": "/default-rack"}  # two answers for one bookie
    with pytest.raises(IncorrectParameterError, match="not an executable"):
        NetworkTopology(script=str(tmp_path / "missing.sh"))


def test_static_mapping_forms(tmp_path):
    assert RackLayout.load({"h:1": "r1", "h2": "/r2", "x:1": "/"}).locations == {"h:1": "/r1", "h2": "/r2"}
    (tmp_path / "m.json").write_text(json.dumps({"g": {"h:1": {"rack": "/east/r1", "hostname": "h"}}}))
    layout = RackLayout.load(str(tmp_path / "m.json"))
    assert layout.location("h:1") == "/east/r1" and layout.groups_of("h:1") == {"g"}
    (tmp_path / "bad.txt").write_text("h:1\n")
    with pytest.raises(IncorrectParameterError, match="bad.txt:1"):
        RackLayout.load(str(tmp_path / "bad.txt"))
    (tmp_path / "hosts.txt").write_text("10.0.0.5 /r5\n")
    assert RackLayout.load(str(tmp_path / "hosts.txt")).location("10.0.0.5:3181") == "/r5"  # a host: all its bookies


@run_async
async def test_znode_layout_registration_properties_and_precedence(tmp_path):
    store = await open_store(f"mem://{uuid.uuid4().hex}/ledgers")
    reg = RegistrationManager(store, reregister_on_expiry=False)
    try:
        await store.create("/bookies", json.dumps(
            {"default": {"a:1": {"rack": "east/r1"}, "b:1": {"rack": "/east/r2"}}}).encode())
        await reg.register("c:1", service_info=BookieServiceInfo.for_bookie("c:1", {"rack": "/west/r3", "group": "g2"}))
        await reg.register("d:1")
        topo = NetworkTopology(mapping={"b:1": "/static/r"})
        topo.bind(store=store, registration=reg)
        got = await topo.resolve(["a:1", "b:1", "c:1", "d:1"])
        assert got == {"a:1": "/east/r1", "b:1": "/static/r", "c:1": "/west/r3", "d:1": "/default-rack"}
        assert topo.groups_of("a:1") == {"default"} and topo.groups_of("c:1") == {"g2"}
        await store.set("/bookies", b"not json")
        topo._znode_read_at = float("-inf")
        assert (await topo.resolve(["e:1"]))["e:1"] == "/default-rack"  # a broken layout is ignored, logged
    finally:
        await reg.close()
        await store.close()


@run_async
async def test_client_takes_the_settings_and_places_by_rack(tmp_path):
    from test_client_support import FakeCluster

    async with FakeCluster(6) as cluster:
        ids = [b.bookie_id for b in cluster.bookies]
        mapping = {b: f"/rack{i % 3}" for i, b in enumerate(ids)}
        with pytest.raises(IncorrectParameterError):
            BookKeeper(cluster.metadata_uri, ensemble_placement_policy="nearest")
        async with BookKeeper(cluster.metadata_uri, network_topology_mapping=mapping,
                              enforce_min_num_racks_per_write_quorum=True) as bkc:
            assert bkc.placement.name == "rackaware"
            for _ in range(10):
                lh = await bkc.create_ledger(3, 3, 2)
                assert len({mapping[b] for b in lh.ensemble}) == 3
                assert bkc.placement.is_ensemble_adhering(lh.ensemble, 3, 2) == "MEETS_STRICT"
                await lh.close()
    assert EnsemblePlacementPolicy.from_settings(PlacementSettings(ensemble_placement_policy="default")).name == "default"


@run_async
async def test_manual_recovery_chooses_targets_that_keep_the_racks():
    """The only target keeping both write quorums of [lost, b, c] (E=3, WQ=2) on two racks is the
    bookie of the fourth rack; three same-rack spares would break the rule (a random choice takes
    one of them 3 times in 4)."""
    from test_client_support import FakeCluster

    from bk.replication.bookie_recovery import BookieRecovery

    async with FakeCluster(7) as cluster:
        ids = [b.bookie_id for b in cluster.bookies]
        mapping = dict(zip(ids, ["/r0", "/r1", "/r2", "/r2", "/r2", "/r2", "/r3"]))
        lost, b, c, good = ids[0], ids[1], ids[2], ids[6]
        async with BookKeeper(cluster.metadata_uri, network_topology_mapping=mapping, add_timeout_s=2) as bkc:
            ledgers = []
            for _ in range(4):
                bkc.placement.new_ensemble = lambda size, writable, exclude=(), **_: [lost, b, c]
                lh = await bkc.create_ledger(3, 2, 2, password=b"pw")
                del bkc.placement.new_ensemble
                for i in range(10):
                    await lh.add_entry(b"e%d" % i)
                await lh.close()
                ledgers.append(lh.ledger_id)
            await cluster.kill(cluster.by_id(lost))
            summary = await BookieRecovery(bkc).recover(lost)
            assert summary.ok
            for ledger_id in ledgers:
                md = await bkc.get_ledger_metadata(ledger_id)
                assert md.segments[-1][1] == (good, b, c)
                assert bkc.placement.is_ensemble_adhering(md.segments[-1][1], 2, 2) == "MEETS_STRICT"


@run_async
async def test_free_space_is_asked_of_new_bookies_and_again_after_the_interval():
    """GET_BOOKIE_INFO (the real round trip is in tests/integration/test_placement_racks.py): asked of
    every writable bookie not asked within get_bookie_info_interval_seconds; a failure is asked again."""
    import asyncio
    from types import SimpleNamespace

    asked = []

    class Client:
        def __init__(self, bookie):
            self.bookie = bookie

        def send_bookie_info(self, *a):
            pass

        def call(self, send, requested):
            asked.append(self.bookie)
            fut = asyncio.get_running_loop().create_future()
            if self.bookie == "down:1" and asked.count("down:1") == 1:
                fut.set_exception(OSError("connection refused"))
            else:
                fut.set_result(SimpleNamespace(free_disk_bytes=len(self.bookie), total_disk_bytes=100))
            return fut

    class Pool:
        @staticmethod
        def get(bookie):
            return Client(bookie)

    topo = NetworkTopology(bookie_info_interval_s=3600)
    topo.bind(pool=Pool)
    await topo.update(["a:1", "down:1"], disk_info=True)
    assert topo.disk == {"a:1": (3, 100)} and sorted(asked) == ["a:1", "down:1"]
    await topo.update(["a:1", "down:1", "bb:1"], disk_info=True)  # the failed one again, the new one
    assert sorted(asked) == ["a:1", "bb:1", "down:1", "down:1"]
    assert topo.disk == {"a:1": (3, 100), "down:1": (6, 100), "bb:1": (4, 100)}
    await topo.update(["a:1", "down:1", "bb:1"])  # weighting off: nobody is asked
    assert len(asked) == 4


@run_async
async def test_reads_go_to_the_local_rack_first_when_reordering_is_on():
    from test_client_support import FakeCluster

    async with FakeCluster(3) as cluster:
        ids = [b.bookie_id for b in cluster.bookies]
        mapping = dict(zip(ids, ["/dc1/r0", "/dc1/r1", "/dc2/r2"]))
        for enabled in (True, False):
            async with BookKeeper(cluster.metadata_uri, network_topology_mapping=mapping,
                                  reorder_read_sequence_enabled=enabled) as bkc:
                bkc.placement.new_ensemble = lambda size, writable, exclude=(), **_: list(ids)
                lh = await bkc.create_ledger(3, 2, 2)
                for i in range(30):
                    await lh.add_entry(b"e%d" % i)
                await lh.close()
                bkc.placement.local_location = "/dc1/r1"  # the client sits in ids[1]'s rack
                for b in cluster.bookies:
                    b.requests.clear()
                rh = await bkc.open_ledger(lh.ledger_id)
                await rh.read_entries(0, 29)
                reads = {b.bookie_id: {e for op, lid, e in b.requests if op == "read" and lid == lh.ledger_id
                                       and e >= 0} for b in cluster.bookies}
                # write set of e: ids[e % 3], ids[(e + 1) % 3]; ids[1] holds e % 3 in (0, 1)
                local = {e for e in range(30) if e % 3 in (0, 1)}
                if enabled:
                    assert reads[ids[1]] == local
                    assert reads[ids[0]] == {e for e in range(30) if e % 3 == 2}  # same region before dc2
                    assert reads[ids[2]] == set()
                else:  # write-set order: the first bookie of each write set
                    assert reads[ids[0]] == {e for e in range(30) if e % 3 == 0}


@run_async
async def test_per_ledger_isolation_groups_from_custom_metadata_hold_through_an_ensemble_change():
    """Pulsar's EnsemblePlacementPolicyConfig in the ledger's custom metadata names its groups; the
    replacement after a bookie dies comes from them too, not from the client's default group."""
    from test_client_support import FakeCluster

    async with FakeCluster(7) as cluster:
        ids = [b.bookie_id for b in cluster.bookies]
        layout = {"tenant": {b: {"rack": f"/r{i % 2}"} for i, b in enumerate(ids[:4])},
                  "others": {b: {"rack": f"/r{i % 2}"} for i, b in enumerate(ids[4:])}}
        policy_config = json.dumps({
            "policyClass": "org.apache.pulsar.bookie.rackawareness.IsolatedBookieEnsemblePlacementPolicy",
            "properties": {"isolationBookieGroups": "tenant", "secondaryIsolationBookieGroups": ""}}).encode()
        async with BookKeeper(cluster.metadata_uri, network_topology_mapping=layout, isolation_bookie_groups="others",
                              add_timeout_s=2) as bkc:
            plain = await bkc.create_ledger(3, 2, 2)
            assert set(plain.ensemble) <= set(ids[4:])  # the client's groups
            await plain.close()
            lh = await bkc.create_ledger(3, 2, 2, custom_metadata={"EnsemblePlacementPolicyConfig": policy_config})
            assert set(lh.ensemble) <= set(ids[:4])
            for i in range(10):
                await lh.add_entry(b"a%d" % i)
            victim = lh.ensemble[0]
            await cluster.kill(cluster.by_id(victim))
            for i in range(10):
                await lh.add_entry(b"b%d" % i)
            await lh.close()
            md = await bkc.get_ledger_metadata(lh.ledger_id)
            assert len(md.segments) == 2 and victim not in md.segments[-1][1]
            assert set(md.segments[-1][1]) <= set(ids[:4])  # the replacement came from the ledger's group
            bad = await bkc.create_ledger(3, 2, 2, custom_metadata={"EnsemblePlacementPolicyConfig": b"{not json"})
            assert set(bad.ensemble) <= set(ids[4:])  # unreadable: the client's groups, logged
            await bad.close()


def test_the_bookies_own_client_takes_the_placement_keys_from_its_toml(tmp_path):
    from bk.config import load_config

    conf = tmp_path / "bookie.toml"
    conf.write_text('ensemble_placement_policy = "regionaware"\nrepp_regions_to_write = "east;west"\n'
                    'min_num_racks_per_write_quorum = 3\nreorder_read_sequence_enabled = true\n'
                    'isolation_bookie_groups = "tenant"\n')
    bkc = BookKeeper.for_bookie(load_config(str(conf)))
    assert bkc.placement.name == "regionaware" and bkc.placement.regions_to_write == ("east", "west")
    assert bkc.placement.min_racks == 3 and bkc.placement.settings.reorder_read_sequence_enabled
    assert bkc.placement.isolation == ({"tenant"}, set())
    assert BookKeeper.for_bookie(load_config(None)).placement.name == "rackaware"
