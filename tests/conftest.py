"""Fixtures shared by every test directory.

`zk_server`: one real ZooKeeper for the whole session (bk.testing.zookeeper),
as its connect string `127.0.0.1:<port>`. Tests must not share state through
it: each uses its own root, e.g. from `zk_metadata_uri`
(`zk://127.0.0.1:<port>/t-<random>/ledgers`). Without Java or ZooKeeper the
tests that need it are skipped, unless BK_REQUIRE_ZK=1 makes that a failure.
"""
from __future__ import annotations

import os
import uuid

import pytest


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory):
    from bk.testing.zookeeper import LocalZooKeeper, ZooKeeperLaunchError

    server = LocalZooKeeper(str(tmp_path_factory.mktemp("zookeeper")))
    try:
        server.start()
    except ZooKeeperLaunchError as e:
        if os.environ.get("BK_REQUIRE_ZK") == "1":
            raise
        pytest.skip(f"no local ZooKeeper: {e}")
    try:
        yield server.connect_string
    finally:
        server.stop()


@pytest.fixture
def zk_metadata_uri(zk_server) -> str:
    """A metadata service URI with a root of its own on the session's ZooKeeper."""
    return f"zk://{zk_server}/t-{uuid.uuid4().hex[:12]}/ledgers"


@pytest.fixture
def fadvise_calls(monkeypatch):
    """Every os.posix_fadvise call as (offset, length, advice), still passed to the kernel."""
    calls = []
    real = os.posix_fadvise

    def record(fd, offset, length, how):
        calls.append((offset, length, how))
        return real(fd, offset, length, how)
    monkeypatch.setattr(os, "posix_fadvise", record)
    return calls


@pytest.fixture
def io_uring_reads() -> None:
    """For tests of the bookie's io_uring reads (bk.bookie.read_ring): they fail where the
    ring cannot run (scripts/setup builds it; a machine without io_uring is not this
    project's platform), except in the pure-twin run (BK_NO_NATIVE=1), which has no native
    module by design and reads through the read threads."""
    from bk.bookie.read_ring import ring_unavailable
    why = ring_unavailable()
    if why is None:
        return
    if os.environ.get("BK_NO_NATIVE", "").strip().lower() in ("1", "true", "yes"):
        pytest.skip("BK_NO_NATIVE=1: no native modules in this run (reads go through the read threads)")
    pytest.fail(f"the bookie cannot read through io_uring here: {why}")
