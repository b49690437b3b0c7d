"""The local ZooKeeper launcher's configuration and error messages (no Java needed;
starting a real server is covered in tests/integration/test_meta_zk.py)."""
from __future__ import annotations

import socket

import pytest

from bk.testing import zookeeper
from bk.testing.zookeeper import (
    JAVA_MISSING,
    ZOOKEEPER_MISSING,
    LocalZooKeeper,
    ZooKeeperLaunchError,
    default_classpath,
    find_java,
    free_port,
)


def test_missing_java_names_the_package(monkeypatch, tmp_path):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no java here
    with pytest.raises(ZooKeeperLaunchError) as info:
        find_java()
    assert str(info.value) == "Java not found: apt-get install default-jre-headless" == JAVA_MISSING
    with pytest.raises(ZooKeeperLaunchError, match="default-jre-headless"):
        LocalZooKeeper(str(tmp_path / "zk")).start()


def test_missing_zookeeper_names_the_package(monkeypatch, tmp_path):
    monkeypatch.delenv("ZOOKEEPER_CLASSPATH", raising=False)
    monkeypatch.setattr(zookeeper, "ZOOKEEPER_JAR", str(tmp_path / "nope.jar"))
    with pytest.raises(ZooKeeperLaunchError) as info:
        default_classpath()
    assert str(info.value) == "ZooKeeper not found: apt-get install zookeeper" == ZOOKEEPER_MISSING


def test_classpath_override_and_default(monkeypatch, tmp_path):
    monkeypatch.setenv("ZOOKEEPER_CLASSPATH", "/x/a.jar:/x/conf")
    assert default_classpath() == "/x/a.jar:/x/conf"
    monkeypatch.delenv("ZOOKEEPER_CLASSPATH")
    jar = tmp_path / "zookeeper.jar"
    jar.write_bytes(b"")
    monkeypatch.setattr(zookeeper, "ZOOKEEPER_JAR", str(jar))
    monkeypatch.setattr(zookeeper, "LOG_JARS", (str(tmp_path / "missing-binding.jar"),))
    monkeypatch.setattr(zookeeper, "ZOOKEEPER_CONF_DIR", str(tmp_path))
    assert default_classpath() == f"{jar}:{tmp_path}"  # logging jars only when all exist


def test_generated_config_binds_loopback_with_short_ticks(tmp_path):
    zk = LocalZooKeeper(str(tmp_path), 23456, tick_time_ms=250)
    zk._write_config()
    config = dict(line.split("=", 1) for line in (tmp_path / "zoo.cfg").read_text().splitlines())
    assert config["clientPort"] == "23456" and config["clientPortAddress"] == "127.0.0.1"
    assert config["tickTime"] == "250" and config["admin.enableServer"] == "false"
    assert config["dataDir"] == str(tmp_path / "data") and config["maxClientCnxns"] == "0"
    assert set(config["4lw.commands.whitelist"].split(",")) >= {"ruok", "stat", "conf"}


def test_connect_string_needs_a_started_server(tmp_path):
    with pytest.raises(ZooKeeperLaunchError, match="not started"):
        LocalZooKeeper(str(tmp_path)).connect_string
    assert LocalZooKeeper(str(tmp_path), 4000).connect_string == "127.0.0.1:4000"


def test_free_port_is_bindable():
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
