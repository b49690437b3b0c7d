"""The chaos runner's client side (issue 28, bk/testing/chaos/clients.py) on fixed seeds: a
ledger of thousands of entries, v2 and v3 clients, bookies serving TLS (in-process and real
`bk bookie` processes), a writer killed mid-add, a writer alone cut off from one bookie, and two
clients racing to recover a ledger while its writer writes; every invariant holds in each run.

Seeds (their draws, from `generate`):
- 22: TLS, a 2,265-entry ledger (window 64) beside a 77-entry one; a power loss and a partition.
  Run in-process and with real bookie processes on ZooKeeper.
- 14: TLS, journal off; the writer killed mid-add (window 4) while a write ENOSPC hits a bookie.
- 98: TLS, journal off, a 3,678-entry ledger whose writer is killed mid-add.
- 146: a 2,362-entry ledger raced by two recovering clients while its writer writes, then cut
  off (alone) from one bookie; another ledger recovered by a second client.
About 25 s on two cores (the process run about 12 s).
"""
from __future__ import annotations

import re

import pytest

from bk.testing.chaos import run_one
from bk.testing.chaos.runner import stop_zookeeper

pytestmark = pytest.mark.integration

INPROCESS_SEEDS = [22, 14, 98, 146]


def _check(r) -> None:
    assert r.ok, f"seed {r.seed} ({r.mode}): {r.failures}\n  replay: {r.replay}\n  " + "\n  ".join(r.trace)


@pytest.mark.timeout(180)
def test_long_ledgers_v2_v3_tls_and_client_faults_keep_every_invariant():
    results = [run_one(seed, {"mode": "inprocess"}) for seed in INPROCESS_SEEDS]
    try:
        results.append(run_one(22, {"mode": "process"}))
    finally:
        stop_zookeeper()
    for r in results:
        _check(r)
    trace = "\n".join(line for r in results for line in r.trace)
    assert max(max(r.clients["entries"]) for r in results) >= 1000
    assert any(r.acked >= 1000 for r in results), [r.acked for r in results]  # a long ledger written through
    assert {p for r in results for p in r.clients["protocols"].values()} == {"v2", "v3"}
    assert {r.mode for r in results if r.clients["tls"]} == {"inprocess", "process"}
    # each client fault acted (not only drawn): a writer killed with adds in flight, a writer
    # alone cut off from a bookie through its own route, two clients racing one recovery
    killed = [int(n) for n in re.findall(r"writer \d+ killed with (\d+) adds in flight", trace)]
    assert len(killed) == 2 and sum(killed) > 0, killed
    assert "alone cut off from bookie" in trace
    assert "two clients race to recover ledger" in trace
    assert {f for r in results for f in r.clients["client_faults"]} == {"writer-crash", "client-partition",
                                                                         "recover-race"}
