"""The client against real bookie processes and a real ZooKeeper.

Quorum shapes 1/1/1, 3/2/2, 3/3/2, 5/3/2 with thousands of entries in flight
read back byte-identical; a bookie killed with SIGKILL mid-stream (ensemble
change, nothing acknowledged lost, valid segments); a read-only bookie never
chosen; ledger znodes decoded by an independent protobuf reader; the shell
commands as an operator runs them.
"""
import asyncio
import importlib.util
import json
import os
import pathlib
import random

import pytest

from bk import eventloop
from bk.client import BookKeeper
from bk.testing.cluster import LocalCluster, run_shell

pytestmark = pytest.mark.integration

_spec = importlib.util.spec_from_file_location(
    "meta_formats_reader", pathlib.Path(__file__).parents[1] / "unit" / "test_meta_formats.py")
_reader = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_reader)
decode_ledger_znode = _reader.decode_ledger_znode  # written from METADATA.md's table, not from bk.meta


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    c = LocalCluster(str(tmp_path_factory.mktemp("procs")), bookies=5, zk_connect=f"{zk_server}/procs-{os.getpid()}",
                     flush_interval_ms=500)
    c.start()
    yield c
    c.stop()


def payloads(n, seed):
    rng = random.Random(seed)
    return [rng.randbytes(rng.randrange(1, 2000)) for _ in range(n)]


async def write_and_read(uri, e, wq, aq, n, seed):
    data = payloads(n, seed)
    async with BookKeeper(uri) as bkc:
        lh = await bkc.create_ledger(ensemble_size=e, write_quorum_size=wq, ack_quorum_size=aq,
                                     digest_type="CRC32C", password=b"pw")
        ids = await asyncio.gather(*(lh.add_entry(d) for d in data))
        assert list(ids) == list(range(n))
        await lh.close()
        rh = await bkc.open_ledger(lh.ledger_id, password=b"pw")
        assert rh.last_add_confirmed == n - 1
        got = await rh.read_entries(0, n - 1)
        assert [bytes(x.data) for x in got] == data
        md = await bkc.get_ledger_metadata(lh.ledger_id)
        return lh.ledger_id, md


@pytest.mark.parametrize("e,wq,aq", [(1, 1, 1), (3, 2, 2), (3, 3, 2), (5, 3, 2)])
def test_quorum_shapes_read_back_identical(cluster, e, wq, aq):
    lid, md = eventloop.run(write_and_read(cluster.metadata_uri, e, wq, aq, 3000, seed=e * 100 + wq * 10 + aq))
    assert md.state.name == "CLOSED" and md.last_entry_id == 2999
    assert (md.ensemble_size, md.write_quorum_size, md.ack_quorum_size) == (e, wq, aq)


def test_znode_decodes_with_an_independent_reader(cluster):
    lid, md = eventloop.run(write_and_read(cluster.metadata_uri, 3, 2, 2, 10, seed=5))
    from kazoo.client import KazooClient
    connect, _, root = cluster.metadata_uri[len("zk://"):].partition("/")
    zk = KazooClient(hosts=connect)
    zk.start(timeout=15)
    try:
        path = f"/{root}/{lid // 10**8:02d}/{lid // 10**4 % 10**4:04d}/L{lid % 10**4:04d}"
        raw, _ = zk.get(path)
    finally:
        zk.stop()
        zk.close()
    d = decode_ledger_znode(raw)
    assert d["quorumSize"] == 2 and d["ensembleSize"] == 3 and d["ackQuorumSize"] == 2
    assert d["state"] == 3 and d["lastEntryId"] == 9  # CLOSED
    assert d["digestType"] == 3  # CRC32C
    assert [(first, tuple(members)) for first, members in d["segments"]] == [(f, tuple(b)) for f, b in md.segments]


def test_bookie_killed_mid_stream_changes_ensemble_and_loses_nothing(cluster):
    victim_holder = {}

    async def main():
        data = payloads(4000, seed=99)
        async with BookKeeper(cluster.metadata_uri) as bkc:
            lh = await bkc.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2,
                                         digest_type="CRC32C", password=b"pw")
            md = await bkc.get_ledger_metadata(lh.ledger_id)
            victim = md.segments[0][1][0]
            victim_holder["id"] = victim
            index = next(i for i, b in cluster.bookies.items() if b.bookie_id == victim)
            acked = {}

            async def add(i):
                eid = await lh.add_entry(data[i])
                acked[eid] = data[i]
            tasks = []
            for i in range(len(data)):
                tasks.append(asyncio.ensure_future(add(i)))
                if i == 1500:
                    await asyncio.sleep(0.05)
                    await asyncio.to_thread(cluster.kill, index)
                if i % 200 == 0:
                    await asyncio.sleep(0)
            await asyncio.gather(*tasks)
            await lh.close()
            md = await bkc.get_ledger_metadata(lh.ledger_id)
            assert len(md.segments) >= 2, "killing an ensemble member must change the ensemble"
            firsts = [s[0] for s in md.segments]
            assert firsts == sorted(set(firsts))
            for _, bookies in md.segments:
                assert len(set(bookies)) == 3
            assert victim not in md.segments[-1][1]
            rh = await bkc.open_ledger(lh.ledger_id, password=b"pw")
            got = {x.entry_id: bytes(x.data) for x in await rh.read_entries(0, rh.last_add_confirmed)}
            assert got == acked and len(acked) == 4000
        return index
    index = eventloop.run(main())
    cluster.start_bookie(index)


def test_read_only_bookie_is_never_chosen(cluster):
    ro = cluster.add_bookie(disk_usage_threshold=0.0001, disk_usage_lwm_threshold=0.00005)
    try:
        out = run_shell(cluster.metadata_uri, "listbookies", "--readonly")
        assert ro.bookie_id in out.stdout

        async def main():
            async with BookKeeper(cluster.metadata_uri) as bkc:
                for _ in range(15):
                    lh = await bkc.create_ledger(ensemble_size=5, write_quorum_size=2, ack_quorum_size=2)
                    md = await bkc.get_ledger_metadata(lh.ledger_id)
                    assert ro.bookie_id not in md.segments[0][1]
                    await lh.close()
        eventloop.run(main())
    finally:
        ro.stop()
        del cluster.bookies[ro.index]


def test_shell_commands(cluster):
    uri = cluster.metadata_uri
    out = run_shell(uri, "--json", "simpletest", "--ensemble", "3", "--write-quorum", "2", "--ack-quorum", "2",
                    "--entries", "500", "--keep")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    lid = result["ledger_id"]
    assert result["entries"] == 500 and result["write_entries_per_s"] > 0
    out = run_shell(uri, "listledgers")
    assert str(lid) in out.stdout.split()
    out = run_shell(uri, "--json", "ledgermetadata", str(lid))
    md = json.loads(out.stdout)
    assert md["state"] == "CLOSED" and md["last_entry_id"] == 499 and len(md["segments"][0]["bookies"]) == 3
    out = run_shell(uri, "readledger", str(lid), "--first", "10", "--last", "12", "--format", "hex")
    assert out.returncode == 0, out.stderr
    assert [line.split("\t")[0] for line in out.stdout.splitlines()] == ["10", "11", "12"]
    out = run_shell(uri, "deleteledger", str(lid), "--force")
    assert out.returncode == 0
    out = run_shell(uri, "ledgermetadata", str(lid))
    assert out.returncode == 1 and "error" in out.stderr
    out = run_shell(uri, "listbookies")
    assert out.returncode == 0 and len(out.stdout.split()) >= 5
    out = run_shell(uri, "readledger", "999999")
    assert out.returncode == 1
