"""A real `bk bookie` process under abusive clients (issue 17, "Overload"; docs/OVERLOAD.md).

The scenarios are bench/overload.py's, at sizes that keep this file near a
minute: 10,000 idle connections, readers that never read 1 MiB answers, a
connection storm, and add floods beyond the write cache with the journal on
and off. Each asserts that the bookie is up, that a well-behaved client's adds
and reads came back byte-identical meanwhile (good_client raises otherwise),
that the bookie's peak anonymous resident memory (RssAnon: heap, caches,
buffers; not the pages of its mapped index file, which grow with the data
stored) stayed under its value before the scenario + its caches + what the
abusive connections may hold by the per-connection limits +
bench.overload.MARGIN_BYTES, and that its sockets went back to the count before
(no descriptor leak). Nothing here asserts a timing.
"""
import os
import resource

import pytest

from bench import overload
from bk import eventloop

pytestmark = pytest.mark.integration

IDLE_CONNECTIONS = 10_000


def check(r: dict) -> None:
    assert r["alive"], r
    assert r["within_bound"], f"peak RssAnon {r['anon_peak_mib']} MiB above the bound {r['anon_bound_mib']} MiB: {r}"
    assert r["sockets_after"] <= r["sockets_before"], f"sockets leaked: {r}"


@pytest.fixture(scope="module")
def target(zk_server, tmp_path_factory):
    with overload.bookie(str(tmp_path_factory.mktemp("overload")), f"{zk_server}/overload-{os.getpid()}") as t:
        yield t


def open_files_limits(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/limits") as fh:
        line = next(ln for ln in fh if ln.startswith("Max open files"))
    soft, hard = line.split()[3:5]
    return int(soft), int(hard) if hard.isdigit() else hard


def test_ten_thousand_idle_connections(target):
    soft, hard = open_files_limits(target.pid)
    assert soft == hard, "the bookie raises its soft open-files limit to the hard one at start"
    overload.raise_nofile()
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    count = min(IDLE_CONNECTIONS, soft - 500)  # this process holds one end of each
    assert count >= 1000, f"open-files limit {soft} too low for this test"
    r = eventloop.run(overload.idle_connections(target, count))
    check(r)
    assert r["connections"] == count and r["connect_failures"] == 0
    assert r["bookie_fds_with_connections"] >= r["fds_before"] + count  # the bookie accepted every one
    assert r["bytes_per_idle_connection"] <= overload.IDLE_CONNECTION_BUDGET_BYTES, r


def test_readers_that_never_read_stay_within_the_response_limit(target):
    # 2 x 400 answers of 1 MiB = 800 MiB if they piled up in the bookie (they did: the
    # transport took every answer after pausing); the bound is ~100 MiB over the start.
    r = eventloop.run(overload.slow_reader(target, readers=2, reads=400, entries=16, entry_bytes=1 << 20,
                                           hold_s=3.0))
    check(r)
    assert r["good_client"]["good_rounds"] >= 1


def test_connection_storm_leaves_no_descriptor_behind(target):
    r = eventloop.run(overload.storm(target, threads=2, seconds=3.0))
    check(r)
    assert r["connections"] > 0 and r["good_after"]["entries"] > 0


def test_add_flood_with_the_journal(target):
    r = eventloop.run(overload.flood(target, connections=3, entry_bytes=32 * 1024, seconds=3.0))
    check(r)
    assert r["other_errors"] == 0, r  # an add is acknowledged or refused with ETOOMANYREQUESTS
    assert r["acked_read_back"] == r["adds_acked"] + r["adds_after"] == r["adds_sent"] - r["too_many_requests"] \
        + overload.AFTER_FLOOD_ADDS


def test_add_flood_without_the_journal(zk_server, tmp_path_factory):
    with overload.bookie(str(tmp_path_factory.mktemp("overload-nojournal")),
                         f"{zk_server}/overload-nj-{os.getpid()}", journal_write_data=False) as t:
        r = eventloop.run(overload.flood(t, connections=3, entry_bytes=32 * 1024, seconds=3.0))
    check(r)
    assert r["other_errors"] == 0, r
    assert r["acked_read_back"] == r["adds_sent"] - r["too_many_requests"] + overload.AFTER_FLOOD_ADDS
