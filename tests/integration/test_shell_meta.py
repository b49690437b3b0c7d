"""The shell commands that change or read cluster metadata, as subprocesses against real
ZooKeeper and bookie processes: endpointinfo, updatebookieinledger, updateledgers (the
hostname <-> ip switch), forceauditchecks, and closeledger on a ledger that recovery
refuses to close (two of its three bookies stopped): what each replica holds, then the
close at an operator-chosen entry only with --i-accept-data-loss. The update commands
are run on ledgers whose metadata names bookies that are not running (they refuse while
the old bookie is registered), so no bookie needs to move.
"""
from __future__ import annotations

import os
import time
import uuid

import pytest

from bk import eventloop
from bk.client import BookKeeper
from bk.meta import open_store
from bk.meta.ledger_manager import LedgerManager
from bk.meta.ledger_metadata import LedgerMetadata
from bk.testing.cluster import LocalCluster, write_toml

from test_shell_ops import bk, failed, js, ok  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    c = LocalCluster(str(tmp_path_factory.mktemp("shellmeta")), bookies=3,
                     zk_connect=f"{zk_server}/shellmeta-{uuid.uuid4().hex[:8]}", flush_interval_ms=200)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def meta_call(cluster, fn):
    async def go():
        store = await open_store(cluster.metadata_uri)
        try:
            return await fn(LedgerManager(store))
        finally:
            await store.close()
    return eventloop.run(go())


def make_ledgers(cluster, ensembles: list[list[list[str]]]) -> list[int]:
    """Ledgers with just metadata: each a list of segments' ensembles (E=3, a segment per 10 entries)."""
    async def go(lm):
        ids = []
        for segs in ensembles:
            lid = await lm.generate_ledger_id()
            md = LedgerMetadata(3, 2, 2, tuple((10 * i, tuple(e)) for i, e in enumerate(segs)), password=b"pw")
            await lm.create_ledger_metadata(lid, md)
            ids.append(lid)
        return ids
    return meta_call(cluster, go)


def segments(cluster, lid: int) -> list:
    async def go(lm):
        return [list(b) for _, b in (await lm.read_ledger_metadata(lid))[0].segments]
    return meta_call(cluster, go)


def test_endpointinfo(cluster):
    uri, b0 = cluster.metadata_uri, cluster.bookie_ids[0]
    d = js(bk("--metadata-uri", uri, "endpointinfo", "-b", b0, "--json"))
    protocols = {e["protocol"]: e for e in d["endpoints"]}
    host, port = b0.rsplit(":", 1)
    assert protocols["bookie-rpc"]["host"] == host and protocols["bookie-rpc"]["port"] == int(port)
    assert "http" in protocols
    text = ok(bk("--metadata-uri", uri, "endpointinfo", "-b", b0))
    assert f"bookie-rpc {b0}" in text
    failed(bk("--metadata-uri", uri, "endpointinfo", "-b", "10.9.9.9:3181"), "does not exist")


def test_updatebookieinledger(cluster):
    uri, live = cluster.metadata_uri, cluster.bookie_ids[0]
    old, new = "10.1.1.1:3181", "10.1.1.9:3181"
    a = ["10.1.1.2:3181", "10.1.1.3:3181"]
    l1, l2, other = make_ledgers(cluster, [[[old, *a], [*a, "10.1.1.4:3181"], [old, *a]],
                                           [[*a, old]], [["10.1.1.5:3181", *a]]])
    # the source bookie is running: refused, nothing changes
    failed(bk("--metadata-uri", uri, "updatebookieinledger", "-sb", live, "-db", new, "--force"), "registered")
    failed(bk("--metadata-uri", uri, "updatebookieinledger", "-sb", old, "-db", "nonsense", "--force"),
           "not host:port")
    d = js(bk("--metadata-uri", uri, "updatebookieinledger", "-srcBookie", old, "-destBookie", new,
              "-updatespersec", "50", "-limit", "1", "--force", "--json"))
    assert d["updated"] == [l1]
    assert segments(cluster, l1) == [[new, *a], [*a, "10.1.1.4:3181"], [new, *a]]
    assert segments(cluster, l2) == [[*a, old]]
    out = ok(bk("--metadata-uri", uri, "updatebookieinledger", "-sb", old, "-db", new, "-updatespersec", "50",
                "-verbose", "--force"))
    assert f"ledger {l2}: {old} -> {new}" in out and "in 1 of 1 ledgers" in out
    assert segments(cluster, l2) == [[*a, new]]
    assert segments(cluster, other) == [["10.1.1.5:3181", *a]]
    # a destination already in the ensemble would name it twice: that ledger fails, unchanged
    (l3,) = make_ledgers(cluster, [[["10.1.1.6:3181", "10.1.1.7:3181", "10.1.1.8:3181"]]])
    out = bk("--metadata-uri", uri, "updatebookieinledger", "-sb", "10.1.1.6:3181", "-db", "10.1.1.7:3181",
             "--force")
    assert out.returncode == 1 and f"ledger {l3}: FAILED" in out.stdout and "twice" in out.stdout
    assert segments(cluster, l3) == [["10.1.1.6:3181", "10.1.1.7:3181", "10.1.1.8:3181"]]


def test_updateledgers_hostname_and_back(cluster, tmp_path):
    uri = cluster.metadata_uri
    others = ["10.2.2.2:4999", "10.2.2.3:4999"]
    (lid,) = make_ledgers(cluster, [[["127.0.0.1:4998", *others]]])
    conf = str(tmp_path / "renamed.toml")
    write_toml(conf, {"metadata_service_uri": uri, "bookie_port": 4998, "advertised_address": "localhost",
                      "ledger_dirs": [str(tmp_path / "l")], "journal_dirs": [str(tmp_path / "j")]})
    failed(bk("--conf", conf, "updateledgers", "-bookieId", "ip", "--force"), "host name localhost")
    d = js(bk("--conf", conf, "updateledgers", "-bookieId", "hostname", "-updatespersec", "50", "--force", "--json"))
    assert (d["src_bookie"], d["dest_bookie"], d["updated"]) == ("127.0.0.1:4998", "localhost:4998", [lid])
    assert segments(cluster, lid) == [["localhost:4998", *others]]
    write_toml(conf, {"metadata_service_uri": uri, "bookie_port": 4998, "advertised_address": "127.0.0.1",
                      "ledger_dirs": [str(tmp_path / "l")], "journal_dirs": [str(tmp_path / "j")]})
    d = js(bk("--conf", conf, "updateledgers", "-bookieId", "ip", "-updatespersec", "50", "--force", "--json"))
    assert d["updated"] == [lid] and segments(cluster, lid) == [["127.0.0.1:4998", *others]]


def test_forceauditchecks(cluster):
    from bk.meta.underreplication import LedgerUnderreplicationManager
    uri = cluster.metadata_uri
    failed(bk("--metadata-uri", uri, "forceauditchecks"), "choose at least one check")
    before = int(time.time() * 1000)
    d = js(bk("--metadata-uri", uri, "forceauditchecks", "-calc", "-ppc", "-rc", "--json"))
    assert d["checks"] == ["checkallledgers", "placementpolicycheck", "replicascheck"]

    async def read(store):
        urm = LedgerUnderreplicationManager(store)
        return {c: await urm.get_check_ctime(c) for c in urm.CHECKS}
    got = meta_call(cluster, lambda lm: read(lm.store))
    day = 24 * 3600 * 1000
    assert all(before - 21 * day - 60_000 <= v <= before - 21 * day + 60_000 for v in got.values()), got


def test_closeledger_when_recovery_refuses(cluster):
    uri = cluster.metadata_uri

    async def write():
        async with BookKeeper(uri) as bkc:
            lh = await bkc.create_ledger(3, 3, 2, password=b"pw")
            for i in range(6):
                await lh.add_entry(b"entry-%d" % i)
            return lh.ledger_id  # left OPEN: the writer "crashed"
    lid = eventloop.run(write())
    kept = cluster.bookie_ids[0]
    cluster.stop_bookie(1)
    cluster.stop_bookie(2)

    async def recover():
        async with BookKeeper(uri, read_timeout_s=3) as bkc:
            await bkc.open_ledger(lid, password=b"pw", recovery=True)
    with pytest.raises(Exception):
        eventloop.run(recover())  # one of three answers cannot decide: recovery refuses

    d = js(bk("--metadata-uri", uri, "closeledger", str(lid), "--json"))
    assert d["state"] in ("OPEN", "IN_RECOVERY") and d["closed_last_entry"] is None
    assert d["replicas"][kept]["last_entry"] == 5
    assert sum("error" in r for r in d["replicas"].values()) == 2
    failed(bk("--metadata-uri", uri, "closeledger", str(lid), "--at-entry", "4"), "--i-accept-data-loss")
    failed(bk("--metadata-uri", uri, "closeledger", str(lid), "--at-entry", "9", "--i-accept-data-loss"),
           "no replica that answered holds entry 9")
    d = js(bk("--metadata-uri", uri, "closeledger", str(lid), "--at-entry", "4", "--i-accept-data-loss", "--json"))
    assert (d["state"], d["closed_last_entry"], d["entries_given_up"]) == ("CLOSED", 4, 1)
    assert d["fenced"][kept] is True

    async def check():
        store = await open_store(uri)
        try:
            md, _ = await LedgerManager(store).read_ledger_metadata(lid)
        finally:
            await store.close()
        return md
    md = eventloop.run(check())
    assert md.is_closed and md.last_entry_id == 4 and md.length == sum(len(b"entry-%d" % i) for i in range(5))
    failed(bk("--metadata-uri", uri, "closeledger", str(lid), "--at-entry", "3", "--i-accept-data-loss"),
           "already closed")


def test_initbookie(cluster, tmp_path):
    """Runs after closeledger's test stopped bookies 1 and 2: their ids keep their cookies."""
    uri = cluster.metadata_uri
    failed(bk("--conf", cluster.bookies[0].conf_path, "initbookie"), "is not empty")

    def conf(name: str, port: int) -> str:
        path = str(tmp_path / f"{name}.toml")
        write_toml(path, {"metadata_service_uri": uri, "bookie_port": port, "advertised_address": "127.0.0.1",
                          "ledger_dirs": [str(tmp_path / name / "l")], "journal_dirs": [str(tmp_path / name / "j")]})
        return path
    live_port, stopped_port = (int(cluster.bookie_ids[i].rsplit(":", 1)[1]) for i in (0, 1))
    failed(bk("--conf", conf("live", live_port), "initbookie"), "is registered")
    failed(bk("--conf", conf("stopped", stopped_port), "initbookie"), "still has a cookie")
    d = js(bk("--conf", conf("new", 4997), "initbookie", "--json"))
    assert d["ok"] and d["bookie_id"] == "127.0.0.1:4997"
    assert not os.path.exists(tmp_path / "new"), "initbookie changes nothing"
