"""The GC analytics on a real cluster, end to end: analyse, compact by the plan, analyse again.

Real ZooKeeper, three `bk bookie` processes with small entry logs; a client writes
ledgers (ensemble 3, write quorum 2: each entry on two of the three bookies) with
known payloads, interleaved so logs mix live and doomed ledgers, then deletes some.
The expected figures are computed here from what was written: entry e of a ledger
lives on ensemble[(e + k) % 3] for k < 2, and takes exactly
    4 (the log's size field) + 32 (ledger, entry, LAC, length) + 4 (CRC32C) + payload
bytes in a log. The job (ledger dirs + full scan) must find exactly those live and
reclaimable bytes per bookie; `bk shell compact --plan` (HTTP, discovered from the
registration) compacts exactly the planned logs; the second analysis, over the
bookies' HTTP endpoint this time, finds the planned logs gone, the live bytes
unchanged and the reclaimable bytes down by what the plan said. The report renders
in headless Chromium.
"""
import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
import uuid

import pytest

from bk import eventloop
from bk.client import BookKeeper
from bk.entrylog.usage import list_entry_logs, read_log_metadata
from bk.meta import open_store
from bk.meta.ledger_manager import LedgerManager
from bk.testing.cluster import LocalCluster

RECORD_OVERHEAD_BYTES = 4 + 32 + 4
LEDGERS = 8
ROUNDS = 12
PER_ROUND = 6


@pytest.fixture
def cluster(zk_server, tmp_path):
    c = LocalCluster(str(tmp_path / "cluster"), bookies=3, zk_connect=f"{zk_server}/an-{uuid.uuid4().hex[:8]}",
                     entry_log_size_limit_bytes="64KiB", flush_interval_ms=100, gc_wait_time_ms=3_600_000,
                     write_cache_max_size_bytes="4MiB", major_compaction_threshold=0.0,
                     minor_compaction_threshold=0.0, http_server_mutations_enabled=True)
    c.start()
    yield c
    c.stop()


async def write(uri):
    rng = random.Random(11)
    sizes: dict[int, list[int]] = {}
    async with BookKeeper(uri) as bkc:
        handles = []
        for i in range(LEDGERS):
            custom = {"application": b"pulsar", "component": b"managed-ledger",
                      "pulsar/managed-ledger": f"public/default/persistent/t{i % 3}".encode()}
            handles.append(await bkc.create_ledger(3, 2, 2, digest_type="CRC32C", password=b"pw",
                                                   custom_metadata=custom))
        for lh in handles:
            sizes[lh.ledger_id] = []
        for _ in range(ROUNDS):
            for lh in handles:
                batch = [rng.randbytes(rng.randrange(200, 2000)) for _ in range(PER_ROUND)]
                await asyncio.gather(*(lh.add_entry(b) for b in batch))
                sizes[lh.ledger_id] += [len(b) for b in batch]
            await asyncio.sleep(0.02)
        for lh in handles:
            await lh.close()
        doomed = [lh.ledger_id for lh in handles[::3]]
        ensembles = {}
        store = await open_store(uri)
        try:
            manager = LedgerManager(store)
            for lid in sizes:
                md, _ = await manager.read_ledger_metadata(lid)
                assert len(md.segments) == 1, "no ensemble change expected"
                ensembles[lid] = md.segments[0][1]
        finally:
            await store.close()
        for lid in doomed:
            await bkc.delete_ledger(lid)
    return sizes, ensembles, doomed


def expected_bytes(sizes, ensembles, doomed):
    """bookie id -> {"live": bytes, "deleted": bytes, "entries": count}."""
    out = {}
    for lid, payloads in sizes.items():
        ens = ensembles[lid]
        for e, n in enumerate(payloads):
            for k in range(2):
                b = out.setdefault(ens[(e + k) % 3], {"live": 0, "deleted": 0, "entries": 0})
                b["deleted" if lid in doomed else "live"] += RECORD_OVERHEAD_BYTES + n
                b["entries"] += 1
    return out


def on_disk(cluster, i) -> int:
    d = os.path.join(cluster.data_dir, f"bookie-{i}", "ledgers")
    return sum(read_log_metadata(p).total_bytes for _, p in list_entry_logs(d))


def job_args(cluster, out, **kw):
    base = dict(metadata_uri=cluster.metadata_uri, ledger_dirs=None, remote=False, urls=None, out=out, master=None,
                threshold=None, scan=False, token="", driver_memory="512m", json=False)
    base.update(kw)
    return argparse.Namespace(**base)


def test_analyse_compact_by_plan_analyse_again(spark, chromium, cluster, tmp_path):
    from spark import report
    from spark.gc_job import run

    sizes, ensembles, doomed = eventloop.run(write(cluster.metadata_uri))
    want = expected_bytes(sizes, ensembles, doomed)
    index = {b.bookie_id: i for i, b in cluster.bookies.items()}
    deadline = time.monotonic() + 30
    while any(on_disk(cluster, index[b]) < w["live"] + w["deleted"] for b, w in want.items()):
        assert time.monotonic() < deadline, "the bookies did not flush what they acknowledged"
        time.sleep(0.2)

    out = str(tmp_path / "report")
    dirs = [os.path.join(cluster.data_dir, f"bookie-{i}", "ledgers") for i in cluster.bookies]
    first = run(job_args(cluster, out, ledger_dirs=dirs, scan=True, threshold=0.95))
    got = {b["bookie_id"]: b for b in first["bookies"]}
    assert set(got) == set(want)
    for b, w in want.items():
        assert got[b]["live_bytes"] == w["live"], b
        assert got[b]["reclaimable_bytes"] == w["deleted"] == got[b]["deleted_bytes"], b
        assert got[b]["total_bytes"] == w["live"] + w["deleted"], b
    assert first["space"]["over_replicated_bytes"] == 0 and first["space"]["under_replicated_count"] == 0
    scan = {s["bookie_id"]: s for s in first["scan"]}
    for b, w in want.items():
        assert scan[b]["entries"] == w["entries"] and scan[b]["checksum_failures"] == 0, scan[b]
    owners = {o["owner"]: o for o in first["space"]["top_owners"]}
    assert owners["(deleted ledgers)"]["bytes"] == sum(w["deleted"] for w in want.values())
    assert sum(o["bytes"] for o in owners.values()) == first["totals"]["total_bytes"]
    plan = first["plan"]
    assert plan["threshold"] == 0.95 and plan["logs"], "the doomed ledgers leave logs under 0.95"
    assert plan["bytes_reclaimed"] > 0 and len(first["what_if"]["total"]) == 19
    # the summary's per-log rows add up to the per-bookie figures
    for b in want:
        logs = [r for r in first["entry_logs"] if r["bookie_id"] == b]
        assert sum(r["live_bytes"] for r in logs) == got[b]["live_bytes"]

    # a person can read the report: render it in a real browser
    png = report.screenshot(os.path.join(out, "report.html"), str(tmp_path / "report.png"), chromium)
    import matplotlib.image
    pixels = matplotlib.image.imread(png)
    assert pixels.shape[0] >= 1000 and pixels.std() > 0.05, "the page rendered blank"

    # hand each bookie its list: the real command, bookies found through their registration
    res = subprocess.run([sys.executable, "-m", "bk.cli.main", "--log-level", "WARNING", "shell", "--json",
                          "--metadata-uri", cluster.metadata_uri, "compact", "--plan", os.path.join(out, "summary.json")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr + res.stdout
    done = json.loads(res.stdout)
    planned: dict[str, set] = {}
    for item in plan["logs"]:
        planned.setdefault(item["bookie_id"], set()).add(item["log_id"])
    assert set(done["bookies"]) == set(planned)
    for b, r in done["bookies"].items():
        assert {int(k) for k in r["outcome"]} == planned[b]
        assert set(r["outcome"].values()) <= {"compacted", "deleted"}, r
        assert r["ledgers_deleted"] == len(doomed)
    assert done["bytes_freed"] > 0
    print(f"plan: {len(plan['logs'])} logs, reclaims {plan['bytes_reclaimed']}, rewrites {plan['bytes_rewritten']};"
          f" bookies freed {done['bytes_freed']}")

    # a bad plan body is refused with a clear error, and changes nothing
    import urllib.error
    import urllib.request
    url = cluster.bookies[0].http_url + "/api/v1/bookie/gc/compact"
    req = urllib.request.Request(url, data=b'{"logIds": "all"}', method="PUT")
    with pytest.raises(urllib.error.HTTPError) as bad:
        urllib.request.urlopen(req, timeout=30)
    assert bad.value.code == 400 and b"logIds" in bad.value.read()

    # analyse again, over the bookies' HTTP endpoints this time
    second = run(job_args(cluster, out, remote=True, threshold=0.95))
    again = {b["bookie_id"]: b for b in second["bookies"]}
    for b, w in want.items():
        present = {r["log_id"] for r in second["entry_logs"] if r["bookie_id"] == b}
        assert not present & planned.get(b, set()), "compacted logs are gone"
        assert again[b]["live_bytes"] == w["live"], "compaction copies every live byte"
        freed = sum(r["total_bytes"] - r["live_bytes"] for r in plan["logs"] if r["bookie_id"] == b)
        assert again[b]["reclaimable_bytes"] == w["deleted"] - freed, b
    # the Parquet dataset holds both runs, partitioned by run date
    runs = spark.read.parquet(os.path.join(out, "parquet", "bookies"))
    assert runs.select("run_id").distinct().count() == 2 and "run_date" in runs.columns
