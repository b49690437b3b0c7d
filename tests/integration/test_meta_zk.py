"""The metadata behaviour suite on a real ZooKeeper (and, side by side, on the
in-memory store), plus the local ZooKeeper launcher.

The behaviour tests are the `@behaviour` functions of tests/unit/test_meta_store.py
and tests/unit/test_meta_managers.py, collected here again with an `env`
fixture parametrized over both stores: the same assertions must hold for
ZooKeeper and for the in-memory store. One ZooKeeper serves the whole session
(`zk_server` in tests/conftest.py); every test gets a root of its own.
"""
from __future__ import annotations

import asyncio
import os
import pathlib
import sys
import uuid

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "unit"))

import test_meta_managers  # noqa: E402
import test_meta_store  # noqa: E402
from test_meta_store import StoreEnv, run_async  # noqa: E402

from bk.errors import MetadataStoreError  # noqa: E402
from bk.meta import EventType, SessionState, open_store  # noqa: E402
from bk.testing.zookeeper import LocalZooKeeper, four_letter_word  # noqa: E402

pytestmark = pytest.mark.integration

for _module in (test_meta_store, test_meta_managers):
    for _name, _test in vars(_module).items():
        if _name.startswith("test_") and getattr(_test, "shared_behaviour", False):
            globals()[_name] = _test


@pytest.fixture(params=["memory", "zk"])
def env(request):
    if request.param == "memory":
        return StoreEnv(f"mem://it-{uuid.uuid4().hex}/ledgers")
    connect = request.getfixturevalue("zk_server")
    return StoreEnv(f"zk://{connect}/t-{uuid.uuid4().hex[:12]}/ledgers", session_timeout_s=5.0)


# ---------------------------------------------------------------------- launcher
def test_session_server_answers_and_is_standalone_on_loopback(zk_server):
    host, port = zk_server.rsplit(":", 1)
    assert host == "127.0.0.1"
    assert four_letter_word(host, int(port), "ruok") == b"imok"
    assert b"Mode: standalone" in four_letter_word(host, int(port), "srvr")


def test_launcher_start_stop_and_log(tmp_path):
    zk = LocalZooKeeper(str(tmp_path))
    with zk:
        assert zk.is_running()
        assert four_letter_word("127.0.0.1", zk.port, "ruok") == b"imok"
        assert zk.metadata_uri() == f"zk://127.0.0.1:{zk.port}/ledgers"
        port = zk.port
    assert not zk.is_running()
    with pytest.raises(OSError):
        four_letter_word("127.0.0.1", port, "ruok", timeout_s=1.0)
    config = (tmp_path / "zoo.cfg").read_text()
    assert "clientPortAddress=127.0.0.1" in config and f"clientPort={port}" in config
    assert os.path.getsize(tmp_path / "zookeeper.log") > 0  # log4j binding found: the server logs


def test_launcher_reports_a_port_in_use(tmp_path, zk_server):
    from bk.testing.zookeeper import ZooKeeperLaunchError

    busy_port = int(zk_server.rsplit(":", 1)[1])
    with pytest.raises(ZooKeeperLaunchError, match="exited"):
        LocalZooKeeper(str(tmp_path), busy_port, start_timeout_s=30).start()


@run_async
async def test_connecting_to_nothing_is_a_clear_metadata_error():
    from bk.testing.zookeeper import free_port

    with pytest.raises(MetadataStoreError, match="cannot connect to ZooKeeper"):
        await open_store(f"zk://127.0.0.1:{free_port()}/ledgers", connect_timeout_s=1.0)


@run_async
async def test_zk_store_survives_a_server_restart(tmp_path):
    """Connection loss: the store reports SUSPENDED, reconnects to the restarted
    server with the same session, and reads work again."""
    zk = LocalZooKeeper(str(tmp_path)).start()
    try:
        store = await open_store(zk.metadata_uri(), session_timeout_s=10.0)
        try:
            await store.create("/kept", b"v")
            _, _, dropped = await store.get_watched("/kept")
            states = []
            store.add_session_listener(states.append)
            zk.stop()
            # kazoo drops every watch when the connection goes: each fires once, so
            # the watcher knows to re-read and re-arm
            assert (await asyncio.wait_for(dropped, 30)).type is EventType.DISCONNECTED
            zk = LocalZooKeeper(str(tmp_path), zk.port).start()
            for _ in range(200):
                if states and states[-1] is SessionState.CONNECTED:
                    break
                await asyncio.sleep(0.1)
            assert await store.get("/kept") == (b"v", 0)
            assert SessionState.SUSPENDED in states and states[-1] is SessionState.CONNECTED
        finally:
            await store.close()
    finally:
        zk.stop()


@run_async
async def test_failed_watched_reads_leave_no_watch_behind(zk_metadata_uri):
    from bk.errors import MetadataNotFoundError

    store = await open_store(zk_metadata_uri)
    try:
        with pytest.raises(MetadataNotFoundError):
            await store.get("/missing", lambda event: None)
        with pytest.raises(MetadataNotFoundError):
            await store.children("/missing", lambda event: None)
        assert store._wrappers == {}  # white-box: no forwarding entry for a watch ZooKeeper never set
        await store.exists("/missing", lambda event: None)  # this one is set (fires on create)
        assert len(store._wrappers) == 1
    finally:
        await store.close()
