"""Ports for test servers (bk.testing.ports) and the bookie's own port settings.

CI once failed when a proxied cluster picked the same port for a bookie and for its
HTTP admin server: both were checked free before either was bound.
"""
import pytest

from bk.config import load_config
from bk.errors import ConfigError
from bk.testing import ports


def test_free_port_never_hands_out_a_port_twice(monkeypatch):
    # Every candidate is free and the random draw always names the same port: the
    # second call must not return it again although nothing has bound it yet.
    monkeypatch.setattr(ports, "_handed_out", set())
    monkeypatch.setattr(ports._rng, "randrange", lambda low, high: 20000)
    monkeypatch.setattr(ports, "port_is_free", lambda port, host="127.0.0.1": True)
    first = ports.free_port()
    second = ports.free_port()
    assert first == 20000
    assert second != first


def test_free_port_fallback_skips_handed_out_ports(monkeypatch):
    monkeypatch.setattr(ports, "_handed_out", set())
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (10500, 65000))  # no room below the range
    got = {ports.free_port() for _ in range(50)}
    assert len(got) == 50


def test_http_port_equal_to_bookie_port_is_a_config_error():
    with pytest.raises(ConfigError, match="http_server_port"):
        load_config(env={}, overrides={"bookie_port": "4181", "http_server_port": "4181"})
    # the same port is fine when the HTTP server is off
    cfg = load_config(env={}, overrides={"bookie_port": "4181", "http_server_port": "4181",
                                         "http_server_enabled": "false"})
    assert cfg.http_server_port == cfg.bookie_port
