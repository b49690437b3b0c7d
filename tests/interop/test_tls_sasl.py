"""TLS and SASL between Apache BookKeeper (Java) and bk, both ways (docs/INTEROP.md).

- Three bk bookies with TLS (PEM, SAN localhost + 127.0.0.1) and BookKeeper's SASL plugin
  (DIGEST-MD5, users from a JAAS file): the Java client, configured as BookKeeper's TLS and
  SASL docs say (tlsProviderFactoryClass, JDK provider, PEM trust store, hostname
  verification; clientAuthProviderFactoryClass=SASLClientProviderFactory and a JAAS file
  through -Djava.security.auth.login.config), writes and reads back; with a wrong password,
  an unknown CA or a certificate naming another host it is refused.
- One Java bookie (4.17.4) with TLS and SASL on: bk's client (tls_trust_store, hostname
  verification on, sasl_jaas_config_path) writes, reads back, recovers; with a wrong CA it
  fails naming the certificate.
Certificates are made here with `cryptography` (bk.testing.certs); nothing is skipped when a
Java part is missing: interop_support fails the test."""
from __future__ import annotations

import logging
import os
import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from interop_support import (  # noqa: E402
    JAVA_BK, JVM_TIMEOUT_S, PASSWORD, RELEASES, JavaBookie, format_root, fresh_root, java_client, java_payload,
    require_java_bk, run_async, wait_registered,
)

from bk.client import BookKeeper  # noqa: E402
from bk.errors import BKError  # noqa: E402
from bk.testing.certs import make_ca, make_cert, write_pem  # noqa: E402
from bk.testing.cluster import LocalCluster  # noqa: E402

USER, SECRET = "bookkeeper-client", "s3cret-pw"  # the id matches saslJaasClientAllowedIds' default
TLS_FACTORY = "org.apache.bookkeeper.tls.TLSContextFactory"
SASL_CLIENT = "org.apache.bookkeeper.sasl.SASLClientProviderFactory"
SASL_BOOKIE = "org.apache.bookkeeper.sasl.SASLBookieAuthProviderFactory"


def jaas(path: pathlib.Path, password: str = SECRET) -> str:
    """A JAAS file as BookKeeper's own SASL tests write one (ZooKeeper's DigestLoginModule)."""
    module = "org.apache.zookeeper.server.auth.DigestLoginModule required"
    path.write_text(f'Bookie {{\n  {module}\n  user_{USER}="{SECRET}";\n}};\n'
                    f'BookKeeper {{\n  {module}\n  username="{USER}"\n  password="{password}";\n}};\n'
                    f'Auditor {{\n  {module}\n  username="{USER}"\n  password="{password}";\n}};\n')
    return str(path)


@pytest.fixture(scope="module")
def secrets(tmp_path_factory):
    d = tmp_path_factory.mktemp("secrets")
    ca, other_ca = make_ca("interop CA"), make_ca("another CA")
    f = {"ca": write_pem(d / "ca.pem", cert=ca[1]), "other_ca": write_pem(d / "other-ca.pem", cert=other_ca[1])}
    for name, kwargs in (("bookie", {"dns": ("localhost",), "ips": ("127.0.0.1",)}),
                         ("elsewhere", {"dns": ("elsewhere.example",)})):  # a good CA, another host's name
        key, cert = make_cert(ca, name, **kwargs)
        f[name + "_cert"], f[name + "_key"] = write_pem(d / f"{name}.crt", cert=cert), write_pem(d / f"{name}.key", key)
    f["jaas"] = jaas(d / "jaas.conf")
    f["jaas_wrong"] = jaas(d / "jaas-wrong.conf", password="not-the-password")
    return f


def java_tls_conf(trust_store: str) -> list[str]:
    """BookKeeper's client TLS settings: JDK provider (Debian has no netty-tcnative), PEM trust store."""
    return ["--conf", f"tlsProviderFactoryClass={TLS_FACTORY}", "--conf", "tlsProvider=JDK",
            "--conf", "clientTrustStoreType=PEM", "--conf", f"clientTrustStore={trust_store}",
            "--conf", "tlsHostnameVerificationEnabled=true"]


def java_run(command, uri, *args, jaas_path=None, check=True):
    """A Java client run; with `jaas_path` it logs in through SASL (JAAS via JAVA_TOOL_OPTIONS)."""
    extra = ["--conf", f"clientAuthProviderFactoryClass={SASL_CLIENT}"] if jaas_path else []
    with pytest.MonkeyPatch.context() as mp:
        if jaas_path:
            mp.setenv("JAVA_TOOL_OPTIONS", f"-Djava.security.auth.login.config={jaas_path}")
        return java_client(command, uri, *args, *extra, check=check)


# ---------------------------------------------------------------- the Java client against bk bookies
def bk_cluster(interop_zk, tmp_path_factory, name: str, bookies: int, secrets, cert: str = "bookie", **settings):
    """bk bookies with TLS (certificate `cert` from `secrets`) on a root of their own, stopped after."""
    c = LocalCluster(str(tmp_path_factory.mktemp(name)), bookies=bookies, zk_connect=fresh_root(interop_zk, name),
                     http_server_enabled=False, tls_certificate_path=secrets[cert + "_cert"],
                     tls_key_store=secrets[cert + "_key"], **settings)
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def bk_secure(interop_zk, tmp_path_factory, secrets):
    """Three bk bookies with TLS and BookKeeper's SASL plugin (users from the JAAS file)."""
    yield from bk_cluster(interop_zk, tmp_path_factory, "bksecure", 3, secrets, bookie_auth_provider="sasl",
                          sasl_jaas_config_path=secrets["jaas"])


@pytest.mark.parametrize("protocol", ["v3", "v2"])
def test_java_client_tls_and_sasl_to_bk_bookies(bk_secure, secrets, protocol):
    """TLS with hostname verification and DIGEST-MD5: the Java client writes, reads back, recovers
    (v2: useV2WireProtocol=true, its AUTH in the v2 layout after a v3 START_TLS)."""
    answer = java_run("bench", bk_secure.metadata_uri, "-e", "3", "-w", "2", "-a", "2", "-n", "300", "-s", "512",
                      "-k", "50", *(["--v2"] if protocol == "v2" else []), *java_tls_conf(secrets["ca"]),
                      jaas_path=secrets["jaas"])
    assert answer["ok"], answer


def test_bk_client_reads_what_the_secure_java_client_wrote(bk_secure, secrets):
    """bk's own client, with TLS and SASL from the same JAAS file, on the same bookies."""
    answer = java_run("bench", bk_secure.metadata_uri, "-e", "3", "-w", "3", "-a", "2", "-n", "50", "-s", "100",
                      *java_tls_conf(secrets["ca"]), jaas_path=secrets["jaas"])
    ledger_id = answer["ledger_id"]

    async def go():
        async with BookKeeper(bk_secure.metadata_uri, protocol="v3", tls_trust_store=secrets["ca"],
                              sasl_jaas_config_path=secrets["jaas"]) as bkc:
            rh = await bkc.open_ledger(ledger_id, PASSWORD)
            assert rh.last_add_confirmed == 49
            assert [e.data for e in await rh.read_entries(0, 49)] == [java_payload(i, 100) for i in range(50)]
    run_async(go())


def test_java_client_wrong_sasl_password_is_refused(bk_secure, secrets):
    answer = java_run("bench", bk_secure.metadata_uri, "-e", "1", "-w", "1", "-a", "1", "-n", "1",
                      "--timeout-s", "5", *java_tls_conf(secrets["ca"]), jaas_path=secrets["jaas_wrong"], check=False)
    assert not answer.get("ok") and answer.get("adds_failed") == 1, answer
    logs = "".join(pathlib.Path(b.log_path).read_text(errors="replace") for b in bk_secure.bookies.values())
    assert f"DIGEST-MD5 refused user '{USER}'" in logs, logs[-3000:]


def java_refused(uri: str, *args: str) -> str:
    """A Java client bench of one entry that must fail: its answer and log, lower-cased."""
    require_java_bk()
    out = subprocess.run(["bash", str(JAVA_BK / "run-client.sh"), "bench", "--metadata-uri", uri, "-e", "1", "-w", "1",
                          "-a", "1", "-n", "1", "--timeout-s", "5", *args],
                         env={**os.environ, "BK_CLIENT_HEAP": "256m"}, capture_output=True, text=True,
                         timeout=JVM_TIMEOUT_S)
    assert out.returncode != 0 and '"ok": false' in out.stdout, (out.stdout, out.stderr[-3000:])
    return (out.stdout + out.stderr).lower()


def tls_lines(log: str) -> str:
    return "\n".join(line for line in log.splitlines() if "ssl" in line or "handshake" in line or "secure" in line)


@pytest.fixture(scope="module")
def bk_one(interop_zk, tmp_path_factory, secrets):
    """One bk bookie with TLS (the right certificate), for the refusals: a lone bookie lets the Java
    client give up at once instead of walking the ensemble."""
    yield from bk_cluster(interop_zk, tmp_path_factory, "bkone", 1, secrets)


def test_java_client_with_another_ca_is_refused(bk_one, secrets):
    log = java_refused(bk_one.metadata_uri, *java_tls_conf(secrets["other_ca"]))
    assert "pkix path building failed" in log and "failed to establish a secure connection" in log, tls_lines(log)


# ---------------------------------------------------------------- a certificate naming another host
@pytest.fixture(scope="module")
def bk_elsewhere(interop_zk, tmp_path_factory, secrets):
    """One bk bookie whose certificate (from the right CA) names elsewhere.example, not 127.0.0.1."""
    yield from bk_cluster(interop_zk, tmp_path_factory, "bkelsewhere", 1, secrets, cert="elsewhere")


def test_java_client_refuses_a_certificate_for_another_host(bk_elsewhere, secrets):
    log = java_refused(bk_elsewhere.metadata_uri, *java_tls_conf(secrets["ca"]))
    # the JDK checks the name the address resolves to ("localhost"): the certificate names neither
    assert "tls handshake failed" in log and "no subject alternative dns name matching" in log, tls_lines(log)


async def add_one(bkc) -> None:
    lh = await bkc.create_ledger(1, 1, 1, digest_type="CRC32C", password=PASSWORD)
    await lh.add_entry(b"x")


def bk_refused(uri: str, caplog, **options) -> str:
    """bk's client adds one entry to a lone bookie it must not reach: the add fails, and the
    client's log says why it dropped that bookie (the connection error)."""
    async def go():
        async with BookKeeper(uri, connect_timeout_s=5, add_timeout_s=10, **options) as bkc:
            with pytest.raises(BKError):
                await add_one(bkc)
    with caplog.at_level(logging.INFO, logger="bk.client"):
        run_async(go())
    return "\n".join(r.getMessage() for r in caplog.records if "cannot connect" in r.getMessage())


def test_bk_client_refuses_a_certificate_for_another_host(bk_elsewhere, secrets, caplog):
    why = bk_refused(bk_elsewhere.metadata_uri, caplog, tls_trust_store=secrets["ca"])
    assert "certificate verify failed" in why and "mismatch" in why, why  # "IP address mismatch, ..."


# ---------------------------------------------------------------- bk's client against a Java bookie
@pytest.fixture(scope="module", params=RELEASES)
def java_secure(request, interop_zk, tmp_path_factory, secrets):
    """One Java bookie (4.17.4, 4.15.5) with TLS (JDK provider, PEM files) and SASL (JAAS section Bookie)."""
    uri = f"zk://{fresh_root(interop_zk, 'javasecure')}/ledgers"
    format_root(uri)
    conf = {"tlsProviderFactoryClass": TLS_FACTORY, "tlsProvider": "JDK",
            "tlsKeyStoreType": "PEM", "tlsKeyStore": secrets["bookie_key"],
            "tlsCertificatePath": secrets["bookie_cert"], "tlsTrustStoreType": "PEM", "tlsTrustStore": secrets["ca"],
            "bookieAuthProviderFactoryClass": SASL_BOOKIE}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JAVA_TOOL_OPTIONS", f"-Djava.security.auth.login.config={secrets['jaas']}")
        bookie = JavaBookie(uri, tmp_path_factory.mktemp("java-secure") / "bookie", request.param, conf=conf).start()
    try:
        wait_registered(uri, [bookie])
        yield uri, bookie
    finally:
        bookie.stop()


def payload(i: int) -> bytes:
    return b"secure-%05d-" % i + bytes([i & 0xFF]) * (i % 200)


@pytest.mark.parametrize("protocol", ["v3", "v2"])
def test_bk_client_tls_and_sasl_to_java_bookie(java_secure, secrets, protocol):
    uri, bookie = java_secure

    async def go():
        opts = dict(protocol=protocol, tls_trust_store=secrets["ca"], sasl_jaas_config_path=secrets["jaas"])
        async with BookKeeper(uri, **opts) as bkc:
            lh = await bkc.create_ledger(1, 1, 1, digest_type="CRC32C", password=PASSWORD)
            await lh.add_entries([payload(i) for i in range(200)])
            assert [e.data for e in await lh.read_entries(0, 199)] == [payload(i) for i in range(200)]
            async with BookKeeper(uri, **opts) as other:  # the writer never closes: recovery
                rh = await other.open_ledger(lh.ledger_id, PASSWORD, recovery=True)
                assert rh.is_closed and rh.last_add_confirmed == 199
                assert [e.data async for e in rh.read_entries_iter(0)] == [payload(i) for i in range(200)]
    run_async(go())
    assert bookie.alive


def test_bk_client_with_another_ca_is_refused_by_java_bookie(java_secure, secrets, caplog):
    uri, _ = java_secure
    why = bk_refused(uri, caplog, tls_trust_store=secrets["other_ca"], sasl_jaas_config_path=secrets["jaas"])
    assert "certificate verify failed" in why and "unable to get local issuer certificate" in why, why
