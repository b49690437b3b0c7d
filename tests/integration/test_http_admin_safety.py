"""The HTTP admin server is safe by default (issue 30), on real `bk bookie` processes.

- with no http_server_address it listens on 127.0.0.1 only, even when the bookie
  itself binds every interface (bind_address = 0.0.0.0);
- beyond loopback with neither a token nor mutual TLS the bookie refuses to start
  and names the settings;
- beyond loopback with a token, data endpoints answer 401 without it, 200 with it;
- two bookies on one host with the same HTTP port both start: the second warns
  that its HTTP server is disabled and serves;
- HTTPS with the bookie's TLS files (bk.testing.certs), mutual TLS as the guard.
"""
from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
import uuid

import pytest

from bk import eventloop
from bk.client import BookKeeper
from bk.config import BookieConfig, load_config
from bk.errors import ConfigError
from bk.testing import certs
from bk.testing.cluster import LocalCluster, free_port, write_toml

pytestmark = pytest.mark.integration
TOKEN = "t0ken-30"


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    c = LocalCluster(str(tmp_path_factory.mktemp("httpsafe")), bookies=0,
                     zk_connect=f"{zk_server}/httpsafe-{uuid.uuid4().hex[:8]}", flush_interval_ms=200)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def get(url: str, token: str | None = None, context=None):
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30, context=context) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2.0):
            return True
    except OSError:
        return False


def write_ledger(cluster) -> int:
    async def go():
        async with BookKeeper(cluster.metadata_uri) as bkc:
            lh = await bkc.create_ledger(1, 1, 1, password=b"pw")
            await lh.add_entry(b"secret payload")
            await lh.close()
            return lh.ledger_id
    return eventloop.run(go())


def test_the_defaults_and_the_rule(tmp_path):
    cfg = BookieConfig()
    assert cfg.http_server_enabled and cfg.http_server_address == "" and not cfg.http_server_token
    conf = str(tmp_path / "open.toml")
    write_toml(conf, {"metadata_service_uri": "zk://127.0.0.1:1/x/ledgers", "http_server_address": "0.0.0.0"})
    with pytest.raises(ConfigError) as e:
        load_config(conf)
    for name in ("http_server_address", "http_server_token", "tls_client_authentication"):
        assert name in str(e.value)
    for ok in ({"http_server_address": "127.0.0.1"}, {"http_server_address": "::1"},
               {"http_server_address": "0.0.0.0", "http_server_token": "x"},
               {"http_server_address": "0.0.0.0", "http_server_enabled": False}):
        write_toml(conf, {"metadata_service_uri": "zk://127.0.0.1:1/x/ledgers", **ok})
        load_config(conf)


def test_default_listens_on_loopback_only_and_two_bookies_share_a_host(cluster):
    port = free_port()  # both bookies get the same HTTP port, as two with the default 8180 would
    b0 = cluster.add_bookie(0, bind_address="0.0.0.0", http_server_port=port)
    b1 = cluster.add_bookie(1, http_server_port=port)  # would exit today: port taken
    assert b0.alive and b1.alive
    assert get(f"http://127.0.0.1:{port}/heartbeat")[0] == 200
    # the bookie itself binds every interface; its HTTP server only 127.0.0.1
    assert reachable("127.0.0.2", int(b0.bookie_id.rpartition(":")[2]))
    assert not reachable("127.0.0.2", port)
    with open(b1.log_path, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    assert "WARNING" in text and "HTTP admin server DISABLED" in text and str(port) in text
    status, body = get(f"http://127.0.0.1:{port}/api/v1/bookie/list_bookies?type=rw")
    assert status == 200 and sorted(json.loads(body)) == sorted([b0.bookie_id, b1.bookie_id])


def test_beyond_loopback_without_auth_refuses_to_start(cluster):
    conf = os.path.join(cluster.data_dir, "open.toml")
    values = {**cluster.bookie_config(9, free_port()), "http_server_address": "0.0.0.0",
              "http_server_port": free_port()}
    write_toml(conf, values)
    proc = subprocess.run([sys.executable, "-m", "bk.cli.main", "bookie", "--conf", conf],
                          capture_output=True, text=True, timeout=60, env=cluster.env)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "http_server_address" in out and "http_server_token" in out, out


def test_beyond_loopback_with_a_token(cluster):
    http = free_port()
    cluster.add_bookie(2, http_server_address="0.0.0.0", http_server_port=http, http_server_token=TOKEN)
    lid = write_ledger(cluster)
    # reachable beyond 127.0.0.1 now (0.0.0.0), so ledger data needs the token
    for path in (f"/api/v1/ledger/read?ledger_id={lid}", f"/api/v1/ledger/metadata?ledger_id={lid}",
                 "/api/v1/ledger/list", "/api/v1/config/server_config"):
        assert get(f"http://127.0.0.2:{http}{path}")[0] == 401, path
        assert get(f"http://127.0.0.2:{http}{path}", token="wrong")[0] == 401, path
        status, body = get(f"http://127.0.0.2:{http}{path}", token=TOKEN)
        assert status == 200, (path, body)
    assert b"secret payload" in get(f"http://127.0.0.2:{http}/api/v1/ledger/read?ledger_id={lid}", token=TOKEN)[1]
    assert get(f"http://127.0.0.2:{http}/heartbeat")[0] == 200  # probes stay open


def test_https_with_mutual_tls(cluster, tmp_path):
    d = tmp_path
    ca_key, ca = certs.make_ca()
    key, cert = certs.make_cert((ca_key, ca), "bookie", dns=("localhost",), ips=("127.0.0.1",))
    ckey, ccert = certs.make_cert((ca_key, ca), "operator")
    ca_pem = certs.write_pem(d / "ca.pem", cert=ca)
    http = free_port()
    cluster.add_bookie(3, http_server_address="0.0.0.0", http_server_port=http, http_server_tls_enable=True,
                       tls_certificate_path=certs.write_pem(d / "b.crt", cert=cert),
                       tls_key_store=certs.write_pem(d / "b.key", key=key), tls_trust_store=ca_pem,
                       tls_client_authentication=True)
    url = f"https://127.0.0.1:{http}/api/v1/bookie/info"
    with_cert = ssl.create_default_context(cafile=ca_pem)
    with_cert.load_cert_chain(certs.write_pem(d / "c.crt", cert=ccert), certs.write_pem(d / "c.key", key=ckey))
    status, body = get(url, context=with_cert)
    assert status == 200 and "freeSpace" in json.loads(body)
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):  # no client certificate
        get(url, context=ssl.create_default_context(cafile=ca_pem))
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP is not served
        get(f"http://127.0.0.1:{http}/api/v1/bookie/info")
