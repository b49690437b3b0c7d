"""The operator shell commands as subprocesses against real bookie processes and ZooKeeper,
each with and without --json: global options anywhere on the line, bookieinfo, clusterinfo,
whatisinstanceid, bookiesanity, queryautorecoverystatus, readledger --bookie,
ledgermetadata --dump/--restore, nukeexistingcluster; then, on a stopped bookie's files
and without any metadata store, lastmark, readjournal, readlog and localconsistencycheck
(which must find a damaged entry log).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest

from bk import eventloop
from bk.client import BookKeeper
from bk.testing.cluster import LocalCluster, write_toml

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    c = LocalCluster(str(tmp_path_factory.mktemp("shellops")), bookies=3,
                     zk_connect=f"{zk_server}/shellops-{uuid.uuid4().hex[:8]}", flush_interval_ms=200)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def bk(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BK_")}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "bk.cli.main", "--log-level", "WARNING", "shell", *args],
                          capture_output=True, text=True, timeout=120, env=env)


def ok(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 0, out.stderr
    return out.stdout


def js(out: subprocess.CompletedProcess):
    body = json.loads(ok(out))
    assert not (isinstance(body, dict) and "text" in body), "--json carries machine fields only"
    return body


def failed(out: subprocess.CompletedProcess, words: str) -> None:
    assert out.returncode == 1, out.stdout
    assert words in out.stderr, out.stderr


def write_ledger(cluster, entries: int, ensemble: int = 3, write_quorum: int = 3) -> int:
    async def go():
        async with BookKeeper(cluster.metadata_uri) as bkc:
            lh = await bkc.create_ledger(ensemble, write_quorum, write_quorum, password=b"pw")
            for i in range(entries):
                await lh.add_entry(b"shell-entry-%d" % i)
            await lh.close()
            return lh.ledger_id
    return eventloop.run(go())


def test_global_options_go_anywhere(cluster):
    uri = cluster.metadata_uri
    before = js(bk("--json", "--metadata-uri", uri, "listbookies"))
    assert js(bk("listbookies", "--json", "--metadata-uri", uri)) == before
    assert js(bk("--metadata-uri", uri, "listbookies", "--json")) == before
    assert sorted(before["bookies"]) == sorted(cluster.bookie_ids)
    conf = cluster.bookies[0].conf_path
    assert js(bk("listbookies", "--conf", conf, "--json")) == before
    failed(bk("listbookies"), "no metadata service")


def test_cluster_commands(cluster):
    uri = ("--metadata-uri", cluster.metadata_uri)
    instance = js(bk(*uri, "whatisinstanceid", "--json"))["instance_id"]
    assert instance and f"instance id: {instance}" in ok(bk(*uri, "whatisinstanceid"))
    info = js(bk(*uri, "clusterinfo", "--json"))
    assert info["instance_id"] == instance and info["writable_bookies"] == 3 and info["unavailable_bookies"] == 0
    assert "3 writable" in ok(bk(*uri, "clusterinfo"))
    rows = js(bk(*uri, "bookieinfo", "--json"))["bookies"]
    assert sorted(r["bookie_id"] for r in rows) == sorted(cluster.bookie_ids)
    for r in rows:
        assert r["state"] == "writable" and 0 < r["free_bytes"] <= r["total_bytes"]
        assert r["http"] == cluster.bookies[cluster.index_of(r["bookie_id"])].http_url
    one = cluster.bookie_ids[1]
    assert [r["bookie_id"] for r in js(bk(*uri, "bookieinfo", one, "--json"))["bookies"]] == [one]
    assert one in ok(bk(*uri, "bookieinfo", one))
    failed(bk(*uri, "bookieinfo", "127.0.0.1:1"), "not registered")
    sanity = js(bk(*uri, "bookiesanity", "--bookie", one, "--json"))
    assert sanity == {"ok": True, "bookie_id": one, "entries": 10}
    assert "succeeded" in ok(bk(*uri, "bookiesanity", "--bookie", one))
    failed(bk(*uri, "bookiesanity", "--bookie", "127.0.0.1:1"), "not registered")
    failed(bk(*uri, "bookiesanity"), "--bookie")
    status = js(bk(*uri, "queryautorecoverystatus", "--json"))
    assert status == {"ledger_replication_enabled": True, "ledgers": []}
    assert "0 under-replicated" in ok(bk(*uri, "queryautorecoverystatus"))


def test_readledger_from_one_bookie(cluster):
    uri = ("--metadata-uri", cluster.metadata_uri)
    ledger_id = write_ledger(cluster, 12, ensemble=3, write_quorum=2)
    seen = {}
    for b in cluster.bookie_ids:
        rows = js(bk(*uri, "readledger", str(ledger_id), "--bookie", b, "--json"))["entries"]
        for r in rows:
            assert r["data"] == f"shell-entry-{r['entry_id']}"
            seen.setdefault(r["entry_id"], set()).add(b)
    assert sorted(seen) == list(range(12)) and all(len(v) == 2 for v in seen.values())  # WQ 2 of 3
    text = ok(bk(*uri, "readledger", str(ledger_id), "--bookie", cluster.bookie_ids[0]))
    assert "shell-entry-" in text
    failed(bk(*uri, "readledger", str(ledger_id), "--bookie", "10.9.9.9:1"), "in no ensemble")


def test_ledgermetadata_dump_and_restore(cluster, tmp_path):
    uri = ("--metadata-uri", cluster.metadata_uri)
    ledger_id = write_ledger(cluster, 5)
    shown = js(bk(*uri, "ledgermetadata", str(ledger_id), "--json"))
    dump = str(tmp_path / "md.bin")
    assert js(bk(*uri, "ledgermetadata", str(ledger_id), "--dump", dump, "--json"))["bytes"] == os.path.getsize(dump)
    failed(bk(*uri, "ledgermetadata", str(ledger_id), "--restore", dump), "--force")
    ok(bk(*uri, "deleteledger", str(ledger_id), "--force"))
    failed(bk(*uri, "ledgermetadata", str(ledger_id)), "no metadata")
    assert "created" in ok(bk(*uri, "ledgermetadata", str(ledger_id), "--restore", dump))
    back = js(bk(*uri, "ledgermetadata", str(ledger_id), "--json"))
    assert {k: v for k, v in back.items() if k != "version"} == {k: v for k, v in shown.items() if k != "version"}
    assert js(bk(*uri, "ledgermetadata", str(ledger_id), "--restore", dump, "--force", "--json"))["action"] == \
        "overwrote"
    failed(bk(*uri, "ledgermetadata", str(ledger_id), "--restore", str(tmp_path / "missing")), "cannot read")


def test_nukeexistingcluster_is_guarded_by_the_instance_id(cluster, zk_server):
    uri = ("--metadata-uri", cluster.metadata_uri)
    failed(bk(*uri, "nukeexistingcluster", "--instance-id", "not-it"), "does not match")
    instance = js(bk(*uri, "whatisinstanceid", "--json"))["instance_id"]
    failed(bk(*uri, "nukeexistingcluster", "--instance-id", instance), "bookies are running")
    assert js(bk(*uri, "whatisinstanceid", "--json"))["instance_id"] == instance  # untouched
    spare = ("--metadata-uri", f"zk://{zk_server}/nuke-{uuid.uuid4().hex[:8]}/ledgers")
    spare_id = js(bk(*spare, "initnewcluster", "--json"))["instance_id"]
    assert js(bk(*spare, "nukeexistingcluster", "--instance-id", spare_id, "--json"))["ok"] is True
    failed(bk(*spare, "whatisinstanceid"), "error")


def test_local_file_commands_on_a_stopped_bookie(cluster, tmp_path):
    ledger_id = write_ledger(cluster, 8)  # on every bookie
    cluster.stop_bookie(2)
    conf = cluster.bookies[2].conf_path
    # no metadata store anywhere: not in the environment, not on the line, and a conf whose URI is dead
    marks = js(bk("lastmark", "--conf", conf, "--json"))["marks"]
    assert len(marks) == 1 and marks[0]["log_file_id"] >= 1 and marks[0]["log_file_offset"] > 0
    assert "LastMark: logFileId" in ok(bk("lastmark", "--conf", conf))
    journal = js(bk("readjournal", "--conf", conf, "--json", "--ledger", str(ledger_id), "--print-msg"))
    assert journal["bad_data_at"] is None
    entries = [r for r in journal["rows"] if r["entry_id"] >= 0]
    if entries:  # the newest journal file may have rolled past these adds; then the older one has them
        assert entries[0]["data"].endswith(f"shell-entry-{entries[0]['entry_id']}")
    assert "records" in ok(bk("readjournal", "--conf", conf))
    failed(bk("readjournal", "--conf", conf, "ffff"), "no journal file")
    log = js(bk("readlog", "--conf", conf, "0", "--json", "--ledger", str(ledger_id), "--print-msg"))
    assert log["clean"] and [r["entry_id"] for r in log["rows"]] == list(range(8))
    assert all(r["data"].endswith(f"shell-entry-{r['entry_id']}") for r in log["rows"])
    assert f"ledger {ledger_id} entry 0" in ok(bk("readlog", "--conf", conf, "0", "--ledger", str(ledger_id)))
    failed(bk("readlog", "--conf", conf, "zz"), "not hex")
    check = js(bk("localconsistencycheck", "--conf", conf, "--json"))
    assert check["ok"] and check["locations_checked"] >= 8 and check["problems"] == []
    assert "consistent" in ok(bk("localconsistencycheck", "--conf", conf))

    # a copy of the bookie whose entry log lost its records: the check must say so (exit 1)
    src = os.path.join(cluster.data_dir, "bookie-2")
    copy = str(tmp_path / "copy")
    shutil.copytree(src, copy)
    conf_copy = str(tmp_path / "copy.toml")
    write_toml(conf_copy, {"journal_dirs": [os.path.join(copy, "journal")],
                           "ledger_dirs": [os.path.join(copy, "ledgers")]})
    log_path = os.path.join(copy, "ledgers", "current", "0.log")
    with open(log_path, "r+b") as fh:
        fh.truncate(1024)  # the header only
    out = bk("localconsistencycheck", "--conf", conf_copy, "--json")
    assert out.returncode == 1
    body = json.loads(out.stdout)
    assert not body["ok"] and body["problems"] and "no record at offset" in body["problems"][0]["problem"]
    cluster.start_bookie(2)
