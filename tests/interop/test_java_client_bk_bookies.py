"""Apache BookKeeper's Java client (4.17.4) against three bk bookies (real `bk bookie` processes).

Each run is the Java driver (run-client.sh): `bench` creates a ledger, adds entries with many in
flight, reads them back, closes, opens it with recovery from a second Java client and reads every
payload again; `features` checks readLastConfirmed, long poll, explicit LAC, force/DEFERRED_SYNC,
getBookieInfo, getListOfEntriesOfLedger, BATCH_READ (4.17, v2) and fencing. Both at the client's
defaults (v3) and with useV2WireProtocol=true, every digest type the driver takes."""
from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from interop_support import fresh_root, java_client, wait_registered  # noqa: E402

from bk.testing.cluster import LocalCluster  # noqa: E402

DIGESTS = ("CRC32", "CRC32C", "MAC", "DUMMY")
# What the Java client itself does not do over v2 (useV2WireProtocol=true): it fails these checks
# the same way against its own 4.17.4 bookies (long poll gives no entry; FORCE_LEDGER and
# DEFERRED_SYNC are IllegalOp; GET_LIST_OF_ENTRIES_OF_LEDGER has no v2 form).
JAVA_V2_LACKS = {
    "long poll readLastConfirmedAndEntry(10) while the writer adds 10, 11",
    "force (FORCE_LEDGER)",
    "getListOfEntriesOfLedger (GET_LIST_OF_ENTRIES_OF_LEDGER)",
    "DEFERRED_SYNC writes + force",
}


@pytest.fixture(scope="module")
def bk_cluster(interop_zk, tmp_path_factory):
    cluster = LocalCluster(str(tmp_path_factory.mktemp("bk-bookies")), 3,
                           zk_connect=fresh_root(interop_zk, "bkbookies"), http_server_enabled=False)
    cluster.start()
    try:
        wait_registered(cluster.metadata_uri, list(cluster.bookies.values()))
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.parametrize("digest", DIGESTS)
@pytest.mark.parametrize("protocol", ["v3", "v2"])
def test_java_client_bench(bk_cluster, protocol, digest):
    # E == WQ for half the runs (the Java client's batch reads where it uses them), striped for the rest
    wq = "3" if DIGESTS.index(digest) % 2 == 0 else "2"
    n = 2000
    answer = java_client("bench", bk_cluster.metadata_uri, "-e", "3", "-w", wq, "-a", "2", "--digest", digest,
                         "-n", str(n), "-s", "1024", "-k", "200", "--delete",
                         *(["--v2"] if protocol == "v2" else []))
    assert answer["protocol"] == protocol and answer["digest"] == digest
    assert answer["adds_failed"] == 0 and answer["lac_after_writes"] == n - 1
    assert answer["read_back"]["ok"] and answer["read_back"].get("bad_payloads", 0) == 0
    assert answer["lac_after_recovery"] == n - 1 and answer["closed_after_recovery"]
    assert answer["read_after_recovery"]["ok"]
    ensemble = set(answer["ensemble_bookies"].strip("[]").replace(" ", "").split(","))
    assert ensemble == set(bk_cluster.bookie_ids)


@pytest.mark.parametrize("protocol", ["v3", "v2"])
def test_java_client_features(bk_cluster, protocol):
    answer = java_client("features", bk_cluster.metadata_uri, "-e", "3", "-w", "3", "-a", "2",
                         *(["--v2"] if protocol == "v2" else []), check=protocol == "v3")
    checks = {c["name"]: c for c in answer["checks"]}
    assert len(checks) == 12, sorted(checks)
    lacking = JAVA_V2_LACKS if protocol == "v2" else set()
    failed = {name for name, c in checks.items() if not c.get("ok")}
    # batchReadAsync included: a 4.17 Java client hands a short BATCH_READ answer to its caller as
    # it is, so its check fails ("unexpected: N entries") unless the bookie answers all 10
    assert failed == lacking, [checks[name] for name in failed ^ lacking]
    skipped = {name for name, c in checks.items() if str(c.get("detail", "")).startswith("skipped")}
    # BATCH_READ from a 4.17 Java client goes over v2 only: it must have run there
    assert {name for name in skipped if name.startswith("batchReadAsync")} == (
        set() if protocol == "v2" else {name for name in checks if name.startswith("batchReadAsync")})


@pytest.mark.parametrize("protocol", ["v3", "v2"])
def test_java_client_of_4_15_5(bk_cluster, protocol):
    """The older Java client (no BATCH_READ at all) against bk bookies: bench and features."""
    v2 = ["--v2"] if protocol == "v2" else []
    n = 2000
    answer = java_client("bench", bk_cluster.metadata_uri, "-e", "3", "-w", "3", "-a", "2", "-n", str(n),
                         "-s", "1024", "-k", "200", "--delete", *v2, release="release-4.15.5")
    assert answer["adds_failed"] == 0 and answer["read_back"]["ok"]
    assert answer["lac_after_recovery"] == n - 1 and answer["read_after_recovery"]["ok"]
    answer = java_client("features", bk_cluster.metadata_uri, "-e", "3", "-w", "3", "-a", "2", *v2,
                         release="release-4.15.5", check=protocol == "v3")
    checks = {c["name"]: c for c in answer["checks"]}
    failed = {name for name, c in checks.items() if not c.get("ok")}
    assert failed == (JAVA_V2_LACKS if v2 else set()), [checks[name] for name in failed]
    batch = [c for name, c in checks.items() if name.startswith("batchReadAsync")]
    assert batch and all(str(c.get("detail", "")).startswith("skipped") for c in batch)
