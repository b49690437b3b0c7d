"""GC on a real cluster: real ZooKeeper, three `bk bookie` processes with small entry
logs, six ledgers written interleaved, three deleted by a client. `bk shell
triggergc` (through each bookie's admin socket) makes every bookie's ledger dir
shrink by what the deleted ledgers held there, every surviving entry reads back
byte for byte before and after a restart, and the local-file commands agree."""
import asyncio
import json
import os
import random
import subprocess
import sys
import uuid

import time

import pytest

from bk import eventloop
from bk.client import BookKeeper
from bk.entrylog.usage import list_entry_logs, read_log_metadata
from bk.testing.cluster import LocalCluster

LEDGERS = 6
ROUNDS = 30
PER_ROUND = 8


@pytest.fixture
def cluster(zk_server, tmp_path):
    c = LocalCluster(str(tmp_path / "cluster"), bookies=3, zk_connect=f"{zk_server}/gc-{uuid.uuid4().hex[:8]}",
                     entry_log_size_limit_bytes="64KiB", flush_interval_ms=100, gc_wait_time_ms=3_600_000,
                     write_cache_max_size_bytes="4MiB",
                     # every log holding a deleted byte is compacted: the dirs must shrink by all of it
                     major_compaction_threshold=1.0)
    c.start()
    yield c
    c.stop()


def shell(cluster, *args):
    out = subprocess.run([sys.executable, "-m", "bk.cli.main", "--log-level", "WARNING", "shell", "--json", *args],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr + out.stdout
    return json.loads(out.stdout)


def ledger_dir(cluster, i):
    return os.path.join(cluster.data_dir, f"bookie-{i}", "ledgers")


def log_bytes(cluster, i) -> int:
    return sum(os.path.getsize(p) for _, p in list_entry_logs(ledger_dir(cluster, i)))


def held_by(cluster, i, ledgers) -> tuple[int, int]:
    """Bytes the ledgers' records take in bookie i's logs: (in all logs, in the newest
    one, which is the log being written and is never collected)."""
    logs = list_entry_logs(ledger_dir(cluster, i))
    per = [sum(n for lid, n in read_log_metadata(p).ledgers.items() if lid in ledgers) for _, p in logs]
    return sum(per), per[-1]


async def write(uri):
    rng = random.Random(7)
    data: dict[int, list[bytes]] = {}
    async with BookKeeper(uri) as bkc:
        handles = [await bkc.create_ledger(3, 3, 3, digest_type="CRC32C", password=b"pw") for _ in range(LEDGERS)]
        for lh in handles:
            data[lh.ledger_id] = []
        for _ in range(ROUNDS):  # interleaved: every checkpoint mixes the ledgers in a log
            for lh in handles:
                batch = [rng.randbytes(rng.randrange(500, 2500)) for _ in range(PER_ROUND)]
                await asyncio.gather(*(lh.add_entry(b) for b in batch))
                data[lh.ledger_id] += batch
            await asyncio.sleep(0.02)
        for lh in handles:
            await lh.close()
        doomed = [lh.ledger_id for lh in handles[::2]]
        for lid in doomed:
            await bkc.delete_ledger(lid)
    return data, doomed


async def read_back(uri, data):
    async with BookKeeper(uri) as bkc:
        for lid, entries in data.items():
            rh = await bkc.open_ledger(lid, password=b"pw", recovery=False)
            got = await rh.read_entries(0, len(entries) - 1)
            assert [bytes(e.data) for e in got] == entries, f"ledger {lid} differs"
            await rh.close()


def test_deleted_ledgers_give_their_disk_back(cluster):
    data, doomed = eventloop.run(write(cluster.metadata_uri))
    survivors = {lid: d for lid, d in data.items() if lid not in doomed}
    time.sleep(0.5)  # the last checkpoint (flush_interval_ms=100)
    before = {i: log_bytes(cluster, i) for i in cluster.bookies}
    held = {i: held_by(cluster, i, set(doomed)) for i in cluster.bookies}
    listed = shell(cluster, "listfilesondisc", "--ledger-dirs", ledger_dir(cluster, 0))
    assert listed["live_bytes"] == listed["total_bytes"], "nothing is collected yet: all live locally"
    for i in cluster.bookies:
        out = shell(cluster, "triggergc", "--ledger-dirs", ledger_dir(cluster, i))
        assert out["ok"], out
        assert sorted(out["ledgers_deleted"]) == sorted(doomed)
        assert out["logs_compacted"] or out["logs_deleted"]
        after = log_bytes(cluster, i)
        total_held, in_current = held[i]
        print(f"bookie {i}: entry logs {before[i]} -> {after} bytes (-{before[i] - after}); the deleted ledgers "
              f"held {total_held} ({in_current} in the log being written); GC says freed {out['bytes_freed']}, "
              f"rewrote {out['bytes_rewritten']}")
        # Everything the deleted ledgers held is gone, except in the log being written.
        assert before[i] - after >= total_held - in_current
        assert total_held > before[i] // 3
        st = shell(cluster, "gcstatus", "--ledger-dirs", ledger_dir(cluster, i))
        assert st["passes"] >= 1 and st["ledgers_deleted"] == len(doomed) and st["bytes_freed"] > 0
    listed = shell(cluster, "listfilesondisc", "--ledger-dirs", ledger_dir(cluster, 1))
    live = sum(r["live_bytes"] for r in listed["entry_logs"])
    assert live == listed["live_bytes"] and listed["live_bytes"] < listed["total_bytes"] + 1
    one = listed["entry_logs"][0]
    meta = shell(cluster, "readlogmetadata", f"{one['log_id']:x}", "--ledger-dirs", ledger_dir(cluster, 1))
    assert meta["total_bytes"] == one["total_bytes"]
    assert {x["ledger_id"] for x in meta["ledgers"] if x["live"]} <= set(survivors)
    eventloop.run(read_back(cluster.metadata_uri, survivors))
    for i in list(cluster.bookies):
        cluster.stop_bookie(i)
        cluster.start_bookie(i)
    eventloop.run(read_back(cluster.metadata_uri, survivors))
