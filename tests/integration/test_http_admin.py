"""The HTTP admin API and /metrics of real `bk bookie` processes on a real ZooKeeper.

One cluster for the module: bookies 0 and 1 with the defaults (mutations off, no
token), bookie 2 with mutations on and a bearer token. Every endpoint with good and
bad requests; /metrics parsed with prometheus_client's parser and seen to move when
adds happen; the bookie still serves after all the bad requests.
"""
from __future__ import annotations

import json
import os
import urllib.error
import time
import urllib.request
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bk import eventloop
from bk.client import BookKeeper
from bk.testing.cluster import LocalCluster

pytestmark = pytest.mark.integration
TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    c = LocalCluster(str(tmp_path_factory.mktemp("http")), bookies=2, zk_connect=f"{zk_server}/http-{uuid.uuid4().hex[:8]}",
                     autorecovery=True, flush_interval_ms=200)
    c.start()
    try:
        c.add_bookie(2, http_server_mutations_enabled=True, http_server_token=TOKEN, log_format="json",
                     log_file=os.path.join(c.data_dir, "bookie-2-json.log"), log_level="INFO,bk.server=DEBUG")
        yield c
    finally:
        c.stop()


def call(cluster, i: int, path: str, method: str = "GET", body=None, token: str | None = None):
    """(status, headers, decoded body: JSON when it is JSON, else text)."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(cluster.bookies[i].http_url + path, data=data, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, headers, raw = resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as e:
        status, headers, raw = e.code, e.headers, e.read()
    text = raw.decode()
    if headers.get("Content-Type", "").startswith("application/json"):
        return status, headers, json.loads(text)
    return status, headers, text


def write_ledger(cluster, entries: int, ensemble: int = 3) -> int:
    async def go():
        async with BookKeeper(cluster.metadata_uri) as bkc:
            lh = await bkc.create_ledger(ensemble, ensemble, ensemble, password=b"pw")
            for i in range(entries):
                await lh.add_entry(b"entry-%d" % i)
            await lh.close()
            return lh.ledger_id
    return eventloop.run(go())


def assert_error(answer, status: int):
    got, _headers, body = answer
    assert got == status, body
    assert isinstance(body, dict) and body["status"] == status and body["error"], body


def test_bookie_endpoints(cluster):
    b0 = cluster.bookies[0]
    assert call(cluster, 0, "/heartbeat")[:3:2] == (200, "OK\n")
    status, _, cfg = call(cluster, 0, "/api/v1/config/server_config")
    assert status == 200 and cfg["bookie_port"] == int(b0.bookie_id.rpartition(":")[2])
    assert call(cluster, 2, "/api/v1/config/server_config", token=TOKEN)[2]["http_server_token"] == "<set>"
    status, _, info = call(cluster, 0, "/api/v1/bookie/info")
    assert status == 200 and 0 < info["freeSpace"] <= info["totalSpace"]
    assert call(cluster, 0, "/api/v1/bookie/state")[2] == {
        "running": True, "readOnly": False, "shuttingDown": False, "availableForHighPriorityWrites": True,
        "readOnlyReason": None, "storageFailure": None, "diskFull": None}
    assert call(cluster, 0, "/api/v1/bookie/state/readonly")[2] == {"readOnly": False}
    assert call(cluster, 0, "/api/v1/bookie/is_ready")[0] == 200
    status, _, rw = call(cluster, 0, "/api/v1/bookie/list_bookies?type=rw")
    assert status == 200 and sorted(rw) == sorted(cluster.bookie_ids)
    assert set(call(cluster, 0, "/api/v1/bookie/list_bookies?type=rw&print_hostnames=true")[2].values()) == {"127.0.0.1"}
    assert_error(call(cluster, 0, "/api/v1/bookie/list_bookies"), 400)
    assert_error(call(cluster, 0, "/api/v1/bookie/list_bookies?type=rw&print_hostnames=maybe"), 400)
    status, _, infos = call(cluster, 0, "/api/v1/bookie/list_bookie_info")
    assert status == 200 and set(infos) == {*cluster.bookie_ids, "clusterInfo"}
    assert infos["clusterInfo"]["total"] == sum(infos[b]["total"] for b in cluster.bookie_ids)
    status, _, marks = call(cluster, 0, "/api/v1/bookie/last_log_mark")
    (mark, pos), = marks.items()  # BookKeeper's GetLastLogMarkService shape
    assert status == 200 and mark.startswith("LastLogMark: Journal Id - ") and mark.endswith(".txn)"), marks
    assert pos.startswith("Pos - ") and int(pos[6:]) >= 0, marks
    status, _, files = call(cluster, 0, "/api/v1/bookie/list_disk_file")
    assert status == 200 and files["journal files"].endswith(".txn") and "index files" in files
    assert set(call(cluster, 0, "/api/v1/bookie/list_disk_file?file_type=journal")[2]) == {"journal files"}
    assert_error(call(cluster, 0, "/api/v1/bookie/list_disk_file?file_type=cookies"), 400)
    status, _, rs = call(cluster, 0, "/api/v1/bookie/repair_status")  # journal on: nothing to repair
    assert status == 200 and rs == {"dataIntegrityChecking": False, "needsIntegrityCheck": False,
                                    "limboLedgers": 0, "phaseOne": None, "repair": None}
    status, _, ci = call(cluster, 0, "/api/v1/bookie/cluster_info")
    assert status == 200 and ci["writableBookiesCount"] == 3 and ci["auditorElected"] in (True, False)


def test_ledger_endpoints(cluster):
    ledger_id = write_ledger(cluster, 20)
    status, _, ledgers = call(cluster, 0, "/api/v1/ledger/list")
    assert status == 200 and str(ledger_id) in ledgers
    status, _, ledgers = call(cluster, 0, "/api/v1/ledger/list?print_metadata=true")
    assert ledgers[str(ledger_id)]["state"] == "CLOSED" and ledgers[str(ledger_id)]["last_entry_id"] == 19
    status, _, md = call(cluster, 1, f"/api/v1/ledger/metadata?ledger_id={ledger_id}")
    assert status == 200 and md[str(ledger_id)]["ensemble_size"] == 3
    assert_error(call(cluster, 1, "/api/v1/ledger/metadata?ledger_id=987654321"), 404)
    assert_error(call(cluster, 1, "/api/v1/ledger/metadata?ledger_id=abc"), 400)
    assert_error(call(cluster, 1, "/api/v1/ledger/metadata?ledger_id=-1"), 400)
    assert_error(call(cluster, 1, "/api/v1/ledger/metadata"), 400)
    status, _, entries = call(cluster, 0, f"/api/v1/ledger/read?ledger_id={ledger_id}&start_entry_id=3&end_entry_id=5")
    assert status == 200 and entries == {"3": "entry-3", "4": "entry-4", "5": "entry-5"}
    status, _, entries = call(cluster, 0, f"/api/v1/ledger/read?ledger_id={ledger_id}&start_entry_id=18&encoding=base64")
    assert entries == {"18": "ZW50cnktMTg=", "19": "ZW50cnktMTk="}
    assert_error(call(cluster, 0, f"/api/v1/ledger/read?ledger_id={ledger_id}&start_entry_id=5&end_entry_id=25"), 404)
    assert_error(call(cluster, 0, f"/api/v1/ledger/read?ledger_id={ledger_id}&start_entry_id=5&end_entry_id=2"), 400)
    assert_error(call(cluster, 0, "/api/v1/ledger/read?ledger_id=987654321"), 404)


def test_errors_methods_and_guards(cluster):
    assert_error(call(cluster, 0, "/api/v1/no/such/thing"), 404)
    status, headers, body = call(cluster, 0, "/heartbeat", method="POST", body=b"x")
    assert status == 405 and headers["Allow"] == "GET" and body["status"] == 405
    assert_error(call(cluster, 0, "/api/v1/bookie/info", method="DELETE"), 405)
    # mutations are off by default: 403, and nothing changed
    assert_error(call(cluster, 0, "/api/v1/bookie/state/readonly", method="PUT", body={"readOnly": True}), 403)
    assert call(cluster, 0, "/api/v1/bookie/state/readonly")[2] == {"readOnly": False}
    assert_error(call(cluster, 0, "/api/v1/autorecovery/trigger_audit", method="PUT"), 403)
    # bookie 2 wants its token, except on the probes and /metrics
    assert_error(call(cluster, 2, "/api/v1/bookie/state"), 401)
    assert_error(call(cluster, 2, "/api/v1/bookie/state", token="wrong"), 401)
    assert call(cluster, 2, "/api/v1/bookie/state", token=TOKEN)[0] == 200
    assert call(cluster, 2, "/heartbeat")[0] == 200
    assert call(cluster, 2, "/api/v1/bookie/is_ready")[0] == 200
    assert call(cluster, 2, "/metrics")[0] == 200
    # bad bodies
    assert_error(call(cluster, 2, "/api/v1/bookie/state/readonly", "PUT", b"{not json", token=TOKEN), 400)
    assert_error(call(cluster, 2, "/api/v1/bookie/state/readonly", "PUT", {"readOnly": "perhaps"}, token=TOKEN), 400)
    assert_error(call(cluster, 2, "/api/v1/autorecovery/lost_bookie_recovery_delay", "PUT", {"delay_seconds": -1},
                      token=TOKEN), 400)
    assert_error(call(cluster, 2, "/api/v1/autorecovery/bookie", "PUT", {"bookie_src": "not a bookie"}, token=TOKEN),
                 400)
    assert_error(call(cluster, 2, "/api/v1/autorecovery/decommission", "PUT",
                      {"bookie_src": cluster.bookie_ids[0]}, token=TOKEN), 400)  # it is running
    assert_error(call(cluster, 2, "/api/v1/autorecovery/status", "PUT", token=TOKEN), 400)
    # none of it hurt the bookies
    for i in cluster.bookies:
        assert cluster.bookies[i].alive and call(cluster, i, "/heartbeat")[0] == 200


def test_mutations(cluster):
    b2 = cluster.bookies[2].bookie_id
    put = lambda path, body=None: call(cluster, 2, path, "PUT", body, token=TOKEN)  # noqa: E731
    assert put("/api/v1/bookie/state/readonly", {"readOnly": True})[2] == {"readOnly": True}
    assert call(cluster, 0, "/api/v1/bookie/list_bookies?type=ro")[2] == {b2: None}
    assert call(cluster, 2, "/api/v1/bookie/state", token=TOKEN)[2]["readOnly"] is True
    assert put("/api/v1/bookie/state/readonly", {"readOnly": False})[2] == {"readOnly": False}
    assert b2 in call(cluster, 0, "/api/v1/bookie/list_bookies?type=rw")[2]
    assert put("/api/v1/autorecovery/lost_bookie_recovery_delay", {"delay_seconds": 7})[2] == {
        "lostBookieRecoveryDelay": 7}
    assert call(cluster, 0, "/api/v1/autorecovery/lost_bookie_recovery_delay")[2] == {"lostBookieRecoveryDelay": 7}
    assert put("/api/v1/autorecovery/status?enabled=false")[2] == {"enabled": False}
    assert call(cluster, 0, "/api/v1/autorecovery/status")[2] == {"enabled": False}
    assert put("/api/v1/autorecovery/status?enabled=true")[2] == {"enabled": True}
    assert put("/api/v1/autorecovery/trigger_audit")[0] == 200
    status, _, who = call(cluster, 0, "/api/v1/autorecovery/who_is_auditor")
    assert status == 200 and who["Auditor"] in cluster.bookie_ids
    status, _, ur = call(cluster, 0, "/api/v1/autorecovery/list_under_replicated_ledger")
    assert status == 200 and ur == []
    assert call(cluster, 0, "/api/v1/autorecovery/list_under_replicated_ledger?printmissingreplica=true")[2] == {}
    ledger_id = write_ledger(cluster, 3)
    assert call(cluster, 2, f"/api/v1/ledger/delete?ledger_id={ledger_id}", "DELETE", token=TOKEN)[0] == 200
    assert_error(call(cluster, 0, f"/api/v1/ledger/metadata?ledger_id={ledger_id}"), 404)
    put("/api/v1/autorecovery/lost_bookie_recovery_delay", {"delay_seconds": 0})
    # GC: the deleted ledger's bytes are collected by a forced pass
    assert call(cluster, 2, "/api/v1/bookie/gc", token=TOKEN)[2] == {"is_in_force_gc": "false"}
    status, _, said = put("/api/v1/bookie/gc", {"forceMajor": True})  # answers at once, as BookKeeper's
    assert status == 200 and said.startswith("Triggered GC on BookieServer: "), said
    deadline = time.monotonic() + 60
    while call(cluster, 2, "/api/v1/bookie/gc", token=TOKEN)[2] == {"is_in_force_gc": "true"}:
        assert time.monotonic() < deadline, "the triggered GC pass did not end"
        time.sleep(0.1)
    status, _, details = call(cluster, 2, "/api/v1/bookie/gc_details", token=TOKEN)
    assert status == 200 and details[0]["passes"] >= 1 and details[0]["last_pass"]["ok"]
    assert details[0]["ledgers_deleted"] >= 1, details  # the deleted ledger (status keeps counts)
    assert_error(put("/api/v1/bookie/gc", {"forceMajor": "yes"}), 400)
    assert_error(call(cluster, 0, "/api/v1/bookie/gc", "PUT", {}), 403)  # mutations off on bookie 0


def scrape(cluster, i: int) -> dict:
    """{sample name + sorted labels: value} from /metrics, through prometheus_client's parser."""
    status, headers, text = call(cluster, i, "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_move_with_adds(cluster):
    ok = (("success", "true"),)
    before = scrape(cluster, 0)
    for name in ("bookie_SERVER_STATUS", "bookie_write_cache_size", "bookie_ledgers_count",
                 "bookie_journal_JOURNAL_QUEUE_SIZE", "bookie_WRITE_BYTES", "bookie_READ_BYTES"):
        assert (name, ()) in before, name
    assert before[("bookie_SERVER_STATUS", ())] == 1
    ledger_id = write_ledger(cluster, 40)  # E = WQ = AQ = 3: every bookie gets every entry
    call(cluster, 0, f"/api/v1/ledger/read?ledger_id={ledger_id}&start_entry_id=0&end_entry_id=9")
    after = scrape(cluster, 0)

    def grew(name, labels=()):
        return after[(name, labels)] - before.get((name, labels), 0)
    assert grew("bookkeeper_server_ADD_ENTRY_REQUEST_count", ok) >= 40
    assert grew("bookkeeper_server_ADD_ENTRY_count", ok) == grew("bookkeeper_server_ADD_ENTRY_REQUEST_count", ok)
    assert grew("bookkeeper_server_ADD_ENTRY_REQUEST_sum", ok) > 0
    # BookKeeper's summary shape (the default): quantiles over the last minute, 1.0 = the largest
    p50 = after[("bookkeeper_server_ADD_ENTRY_REQUEST", (("quantile", "0.5"), ("success", "true")))]
    top = after[("bookkeeper_server_ADD_ENTRY_REQUEST", (("quantile", "1.0"), ("success", "true")))]
    assert 0 < p50 <= top
    assert grew("bookie_WRITE_BYTES") >= 40 * (24 + len(b"entry-0"))
    assert grew("bookie_journal_JOURNAL_SYNC_count", ok) >= 1
    assert grew("bookie_journal_JOURNAL_ADD_ENTRY_count", ok) >= 40
    assert grew("bookie_journal_JOURNAL_WRITE_BYTES") > grew("bookie_WRITE_BYTES") * 0.9
    assert grew("bookie_journal_JOURNAL_FORCE_WRITE_BATCH_ENTRIES_count") >= 1
    # the admin's read went to some of the three bookies, as reads or batch reads
    pages = [after, scrape(cluster, 1), scrape(cluster, 2)]
    assert sum(p[("bookkeeper_server_READ_ENTRY_REQUEST_count", ok)] +
               p[("bookkeeper_server_BATCH_READ_ENTRY_REQUEST_count", ok)] for p in pages) >= 1
    assert sum(p[("bookie_READ_BYTES", ())] for p in pages) >= 10 * (24 + len(b"entry-0"))
    assert after[("bookie_ledgers_count", ())] >= 1


def test_a_bookie_logs_json_lines_with_its_id_to_its_log_file(cluster):
    b2 = cluster.bookies[2]
    with open(os.path.join(cluster.data_dir, "bookie-2-json.log")) as fh:
        lines = [json.loads(line) for line in fh]
    assert lines and all(r["bookie_id"] == b2.bookie_id for r in lines)
    assert any(r["logger"] == "bk.server.server" and "serving on port" in r["message"] for r in lines)
    assert any(r["logger"] == "bk.server.http_admin" and b2.http_url in r["message"] for r in lines)
