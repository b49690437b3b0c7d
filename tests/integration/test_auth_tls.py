"""Authentication and TLS on a real `bk bookie` process, driven by the .proto-facts client
(v3_wire.py) and Python's ssl; certificates are made here with `cryptography`."""
import asyncio
import os
import ssl
import struct
import time

import pytest

from bk import eventloop
from bk.proto import AddRequest, encode_request, master_key
from bk.proto.auth import sign_token
from bk.proto.digest import DigestManager
from bk.testing.certs import make_ca, make_cert, write_pem
from bk.testing.cluster import LocalCluster

from v3_wire import STATUS, V3Client, add_body, decode, encode, one, read_body, sync_start_tls

pytestmark = pytest.mark.integration

KEY = master_key(b"pw")
SECRET_KEY = b"0123456789abcdef0123456789abcdef"


def entry(ledger_id, entry_id, payload=b"data"):
    return DigestManager(ledger_id, "CRC32C", b"pw").frame_entry(entry_id, entry_id - 1, len(payload), payload)


def port_of(cluster):
    return int(cluster.bookie_ids[0].rsplit(":", 1)[1])


# ---------------------------------------------------------------- authentication
@pytest.fixture(scope="module")
def auth_cluster(zk_server, tmp_path_factory):
    d = tmp_path_factory.mktemp("auth")
    (d / "secret.key").write_bytes(SECRET_KEY)
    (d / "shared.secret").write_bytes(b"let-me-in\n")
    c = LocalCluster(str(d), bookies=1, zk_connect=f"{zk_server}/auth-{os.getpid()}",
                     bookie_auth_provider="token", auth_token_secret_key_path=str(d / "secret.key"),
                     auth_token_shared_secret_path=str(d / "shared.secret"))
    c.start()
    yield c
    c.stop()


def test_unauthenticated_requests_get_eua(auth_cluster):
    async def main():
        async with V3Client(port_of(auth_cluster)) as c:
            a = await c.call("ADD_ENTRY", add_body(1, 0, KEY, entry(1, 0)))
            assert a.status == STATUS["EUA"]
            assert (await c.call("READ_ENTRY", read_body(1, 0))).status == STATUS["EUA"]
            assert (await c.call("GET_BOOKIE_INFO", [(1, 3)])).status == STATUS["EUA"]
        async with V3Client(port_of(auth_cluster)) as c:  # v2 too, in the v2 layout
            c.send(encode_request(AddRequest(0, KEY, 1, 0, entry(1, 0))))
            raw = await c.frame()
            assert struct.unpack(">Iiqq", raw)[1:] == (102, 1, 0)
    eventloop.run(main())


def test_wrong_token_is_refused_and_the_connection_closed(auth_cluster):
    async def main():
        bad = sign_token("mallory", b"not-the-key")
        expired = sign_token("alice", SECRET_KEY, expires_at_s=time.time() - 60)
        for payload in (bad.encode(), expired.encode(), b"wrong-shared-secret"):
            async with V3Client(port_of(auth_cluster)) as c:
                a = await c.call("AUTH", [(1, "bk-token"), (2, payload)])
                assert a.status == STATUS["EUA"]
                assert await c.closed_by_peer()
        async with V3Client(port_of(auth_cluster)) as c:  # another plugin's name: closed at once
            c.send(b"".join([]))
            txn = c.next_txn()
            from v3_wire import request
            c.send(request("AUTH", txn, [(1, "SASL"), (2, SECRET_KEY)]))
            a = (await c.answers())[0]
            assert a.status == STATUS["EUA"] and await c.closed_by_peer()
    eventloop.run(main())


def test_right_token_is_served_and_the_principal_logged(auth_cluster):
    async def main():
        token = sign_token("pulsar-broker-1", SECRET_KEY, expires_at_s=time.time() + 3600)
        async with V3Client(port_of(auth_cluster)) as c:
            a = await c.call("AUTH", [(1, "bk-token"), (2, token.encode())])
            assert a.status == 0 and a.field(1) == b"bk-token"
            assert (await c.call("ADD_ENTRY", add_body(2, 0, KEY, entry(2, 0)))).status == 0
            a = await c.call("READ_ENTRY", read_body(2, 0))
            assert a.status == 0 and a.field(4) == entry(2, 0)
        async with V3Client(port_of(auth_cluster)) as c:  # v2 AUTH with the shared secret, then v2 adds
            msg = encode([(1, "bk-token"), (2, b"let-me-in")])
            c.send(struct.pack(">iI", 4 + len(msg), (2 << 24) | (3 << 16)) + msg)
            raw = await c.frame()
            assert one(decode(raw[4:]), 1) == b"bk-token"
            c.send(encode_request(AddRequest(0, KEY, 2, 1, entry(2, 1))))
            assert struct.unpack(">Iiqq", await c.frame())[1:] == (0, 2, 1)
    eventloop.run(main())
    log = open(auth_cluster.bookies[0].log_path).read()
    assert "authenticated as 'pulsar-broker-1'" in log and "authenticated as 'shared-secret'" in log


# ---------------------------------------------------------------- TLS
@pytest.fixture(scope="module")
def tls_setup(zk_server, tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    ca = make_ca()
    server = make_cert(ca, "bookie", dns=("localhost",))
    files = dict(ca=write_pem(d / "ca.pem", cert=ca[1]), cert=write_pem(d / "bookie.pem", cert=server[1]),
                 key=write_pem(d / "bookie.key", key=server[0]))
    c = LocalCluster(str(d), bookies=1, zk_connect=f"{zk_server}/tls-{os.getpid()}",
                     tls_certificate_path=files["cert"], tls_key_store=files["key"], tls_trust_store=files["ca"],
                     tls_cert_files_refresh_duration_s=1)
    c.start()
    yield c, ca, files, d
    c.stop()


def client_context(ca_cert_path, cert=None, key=None):
    ctx = ssl.create_default_context(cafile=ca_cert_path)  # hostname verification on
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


def test_tls_upgrade_then_v3_and_v2_over_tls(tls_setup):
    cluster, _ca, files, _d = tls_setup

    async def main():
        async with V3Client(port_of(cluster), host="localhost") as c:
            a = await c.start_tls(client_context(files["ca"]), "localhost")
            assert a.status == 0
            assert c.writer.get_extra_info("ssl_object") is not None
            assert (await c.call("ADD_ENTRY", add_body(10, 0, KEY, entry(10, 0)))).status == 0
            c.send(encode_request(AddRequest(0, KEY, 10, 1, entry(10, 1))))  # a v2 client after START_TLS
            assert struct.unpack(">Iiqq", await c.frame())[1:] == (0, 10, 1)
    eventloop.run(main())
    log = open(cluster.bookies[0].log_path).read()
    assert "is protected" in log


def test_answers_to_requests_behind_start_tls_go_out_encrypted(tls_setup):
    """The Java client sends its first AUTH right behind START_TLS, before the handshake: the
    START_TLS answer alone comes back in plain text, the AUTH answer encrypted after it (in plain
    text it would land in the client's handshake, which then fails)."""
    import socket

    from v3_wire import Answer, OP, request

    cluster, _ca, files, _d = tls_setup
    with socket.create_connection(("127.0.0.1", port_of(cluster)), timeout=10) as sock:
        sock.sendall(request("START_TLS", 1, []) + request("AUTH", 2, [(1, "AuthDisabledPlugin"), (2, b"")]))
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + struct.unpack_from(">i", buf)[0]:
            buf += sock.recv(65536)
        assert Answer(buf[4:]).status == STATUS["EOK"]
        time.sleep(0.2)  # room for a wrongly plain AUTH answer to arrive before the handshake
        sock.setblocking(False)
        try:
            early = sock.recv(65536)
        except BlockingIOError:
            early = b""
        sock.setblocking(True)
        assert buf[4 + struct.unpack_from(">i", buf)[0]:] + early == b"", "plain-text bytes after START_TLS's answer"
        with client_context(files["ca"]).wrap_socket(sock, server_hostname="localhost") as tls:
            data = b""
            while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
                data += tls.recv(65536)
            answer = Answer(data[4:4 + struct.unpack_from(">i", data)[0]])
            assert (answer.op, answer.txn_id, answer.status) == (OP["AUTH"], 2, STATUS["EOK"]), answer


def test_wrong_hostname_is_refused_by_the_client(tls_setup):
    cluster, _ca, files, _d = tls_setup
    with pytest.raises(ssl.SSLCertVerificationError, match="[Hh]ostname"):
        sync_start_tls(port_of(cluster), client_context(files["ca"]), "bookie.example.com")
    sync_start_tls(port_of(cluster), client_context(files["ca"]), "localhost").close()


def test_mutual_tls_client_certificate_is_checked(tls_setup):
    cluster, ca, files, d = tls_setup
    good = make_cert(ca, "pulsar-broker", dns=())
    other_ca = make_ca("someone else")
    stranger = make_cert(other_ca, "stranger", dns=())
    good_files = (write_pem(d / "client.pem", cert=good[1]), write_pem(d / "client.key", key=good[0]))
    bad_files = (write_pem(d / "stranger.pem", cert=stranger[1]), write_pem(d / "stranger.key", key=stranger[0]))

    async def main():
        async with V3Client(port_of(cluster), host="localhost") as c:
            await c.start_tls(client_context(files["ca"], *good_files), "localhost")
            assert (await c.call("ADD_ENTRY", add_body(11, 0, KEY, entry(11, 0)))).status == 0
        async with V3Client(port_of(cluster), host="localhost") as c:  # a certificate of another CA
            try:
                await c.start_tls(client_context(files["ca"], *bad_files), "localhost")
                await c.call("ADD_ENTRY", add_body(11, 1, KEY, entry(11, 1)))
            except (ssl.SSLError, ConnectionError):
                pass
            else:
                raise AssertionError("a client certificate of another CA was accepted")
    eventloop.run(main())
    assert "client certificate pulsar-broker" in open(cluster.bookies[0].log_path).read()


def test_expired_certificate_is_refused_and_reload_replaces_it(tls_setup):
    cluster, ca, files, _d = tls_setup

    def handshake():
        with sync_start_tls(port_of(cluster), client_context(files["ca"]), "localhost") as s:
            return s.getpeercert()

    before = handshake()
    expired = make_cert(ca, "bookie", expired=True)
    write_pem(files["key"], key=expired[0])
    write_pem(files["cert"], cert=expired[1])
    time.sleep(1.5)  # tls_cert_files_refresh_duration_s = 1
    with pytest.raises(ssl.SSLCertVerificationError, match="expired"):
        handshake()
    fresh = make_cert(ca, "bookie")
    write_pem(files["key"], key=fresh[0])
    write_pem(files["cert"], cert=fresh[1])
    time.sleep(1.5)
    after = handshake()
    assert int(after["serialNumber"], 16) == fresh[1].serial_number != int(before["serialNumber"], 16)
    assert "reloaded the bookie's TLS certificate files" in open(cluster.bookies[0].log_path).read()


def test_required_client_certificate(tls_setup):
    """tls_client_authentication: a client without a certificate cannot talk to the bookie."""
    cluster, ca, files, d = tls_setup
    b = cluster.add_bookie(1, tls_client_authentication=True)
    port = int(b.bookie_id.rsplit(":", 1)[1])
    good = make_cert(ca, "pulsar-broker-2", dns=())
    good_files = (write_pem(d / "client2.pem", cert=good[1]), write_pem(d / "client2.key", key=good[0]))

    async def main():
        async with V3Client(port, host="localhost") as c:
            await c.start_tls(client_context(files["ca"], *good_files), "localhost")
            assert (await c.call("ADD_ENTRY", add_body(12, 0, KEY, entry(12, 0)))).status == 0
        async with V3Client(port, host="localhost") as c:
            try:
                await c.start_tls(client_context(files["ca"]), "localhost")  # no client certificate
                await c.call("ADD_ENTRY", add_body(12, 1, KEY, entry(12, 1)))
            except (ssl.SSLError, ConnectionError, asyncio.IncompleteReadError):
                pass
            else:
                raise AssertionError("served a client without a certificate")
    try:
        eventloop.run(main())
    finally:
        cluster.stop_bookie(1)


# ---------------------------------------------------------------- bk's own client with auth and TLS
def _adds_with(port_owner, wire, ledger_id):
    from bk.client.bookie_client import BookieClient
    from bk.client.quorum import AddFramer

    async def main():
        client = BookieClient(port_owner.bookie_ids[0], wire=wire)
        try:
            framer = AddFramer(DigestManager(ledger_id, "CRC32C", b"pw"), KEY, 1 << 20)
            answers = [await client.call(client.send_add, framer.frame(e, e - 1, e + 1, b"y"), ledger_id, e)
                       for e in range(3)]
            return [a.rc for a in answers]
        finally:
            client.close()
    return eventloop.run(main())


@pytest.mark.parametrize("protocol", ["v2", "v3"])
def test_bk_client_authenticates_with_a_token(auth_cluster, protocol):
    from bk.client.wire_v3 import ClientWireOptions
    token = sign_token("bk-writer", SECRET_KEY)
    assert _adds_with(auth_cluster, ClientWireOptions.build(protocol=protocol, auth_token=token),
                      20 + (protocol == "v3")) == [0, 0, 0]
    assert _adds_with(auth_cluster, ClientWireOptions.build(protocol=protocol), 22) == [102, 102, 102]
    from bk.errors import BookieConnectionError
    with pytest.raises(BookieConnectionError):
        _adds_with(auth_cluster, ClientWireOptions.build(protocol=protocol, auth_token="nope"), 23)


@pytest.mark.parametrize("protocol", ["v2", "v3"])
def test_bk_client_tls_verifies_the_hostname_by_default(tls_setup, protocol):
    import dataclasses

    from bk.client.wire_v3 import ClientWireOptions
    from bk.errors import BookieConnectionError
    cluster, _ca, files, _d = tls_setup
    wire = ClientWireOptions.build(protocol=protocol, tls_trust_store=files["ca"])
    # the certificate names localhost, the bookie id 127.0.0.1: refused
    with pytest.raises(BookieConnectionError, match="certificate verify failed|IP address mismatch"):
        _adds_with(cluster, wire, 30)
    named = dataclasses.replace(wire, tls_server_hostname="localhost")
    assert _adds_with(cluster, named, 31 + (protocol == "v3")) == [0, 0, 0]
    unchecked = ClientWireOptions.build(protocol=protocol, tls_trust_store=files["ca"],
                                        tls_hostname_verification=False)
    assert _adds_with(cluster, unchecked, 33 + (protocol == "v3")) == [0, 0, 0]


def test_requests_before_a_bad_frame_length_are_still_gated(auth_cluster):
    async def main():
        async with V3Client(port_of(auth_cluster)) as c:
            from v3_wire import request
            c.send(request("ADD_ENTRY", 1, add_body(40, 0, KEY, entry(40, 0))) + struct.pack(">i", -1))
            (a,) = await c.answers()
            assert a.status == STATUS["EUA"]
            assert await c.closed_by_peer()
        async with V3Client(port_of(auth_cluster)) as c:
            token = sign_token("reader", SECRET_KEY)
            assert (await c.call("AUTH", [(1, "bk-token"), (2, token.encode())])).status == 0
            assert (await c.call("READ_ENTRY", read_body(40, 0))).status == STATUS["ENOLEDGER"]
    eventloop.run(main())


# ---------------------------------------------------------------- a secured cluster's own clients
def test_bookies_own_clients_and_the_shell_authenticate(zk_server, tmp_path):
    """With bk-token on every bookie (secret key only): a journal-off bookie crashed and
    restarted repairs itself through peers that demand a token (its repair client signs one
    for its own id), and `bk shell` works with BK_CLIENT_AUTH_TOKEN and is refused without."""
    import json
    import subprocess
    import sys
    (tmp_path / "secret.key").write_bytes(SECRET_KEY)
    c = LocalCluster(str(tmp_path / "c"), bookies=3, zk_connect=f"{zk_server}/auth-own-{os.getpid()}",
                     bookie_auth_provider="token", auth_token_secret_key_path=str(tmp_path / "secret.key"),
                     journal_write_data=False, flush_interval_ms=30000)
    c.start()
    try:
        def shell(*args, token=None):
            env = dict(os.environ)
            env.pop("BK_CLIENT_AUTH_TOKEN", None)
            if token:
                env["BK_CLIENT_AUTH_TOKEN"] = token
            return subprocess.run([sys.executable, "-m", "bk.cli.main", "shell", "--metadata-uri", c.metadata_uri,
                                   "--json", *args], capture_output=True, text=True, timeout=120, env=env)
        token = sign_token("operator", SECRET_KEY)
        out = shell("simpletest", "--entries", "200", "--ensemble", "3", "--write-quorum", "3", "--ack-quorum", "2",
                    "--keep", token=token)
        assert out.returncode == 0, out.stderr
        assert shell("simpletest", "--entries", "10").returncode != 0  # no token: the bookies refuse
        c.kill(0)
        c.start_bookie(0)  # waits until registered
        deadline = time.monotonic() + 90
        while True:
            st = json.loads(shell("repairstatus", c.bookies[0].bookie_id).stdout)["bookies"][0]["repair"]
            if st and st["state"] == "done" or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert st["state"] == "done" and st["entries_copied"] > 0 and st["errors"] == 0, st
    finally:
        c.stop()
