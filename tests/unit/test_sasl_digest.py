"""BookKeeper's SASL plugin (bk/proto/sasl.py): JAAS files, and the bookie's DIGEST-MD5 side
(GNU SASL) against the client's (pure-sasl), with BookKeeper's policy around them."""
import pytest

from bk.errors import ConfigError
from bk.proto.auth import AuthenticationError
from bk.proto.sasl import (SaslClientProvider, SaslServerProvider, bookie_credentials, client_credentials,
                           parse_jaas)

JAAS = """/* as BookKeeper's jaas_md5.conf */
Bookie {
       org.apache.zookeeper.server.auth.DigestLoginModule required
       user_hd="testpwd"
       user_bookkeeper-x="p\\"w";   // escaped quote
};
BookKeeper {
       org.apache.zookeeper.server.auth.DigestLoginModule required
       username="hd"
       password=testpwd;
};
"""


def test_jaas_sections_as_bookkeeper_writes_them(tmp_path):
    p = tmp_path / "jaas.conf"
    p.write_text(JAAS)
    assert parse_jaas(JAAS)["Bookie"] == [{"user_hd": "testpwd", "user_bookkeeper-x": 'p"w'}]
    assert bookie_credentials(str(p)) == {"hd": "testpwd", "bookkeeper-x": 'p"w'}
    assert client_credentials(str(p)) == ("hd", "testpwd")
    with pytest.raises(ConfigError, match="no section 'Auditor'"):
        client_credentials(str(p), "Auditor")
    with pytest.raises(ConfigError, match="cannot read"):
        bookie_credentials(str(tmp_path / "missing.conf"))
    p.write_text("Bookie { broken")
    with pytest.raises(ConfigError, match="not a JAAS file"):
        bookie_credentials(str(p))


def exchange(server, client):
    """Run one AUTH exchange as bk/client/wire_v3.py and bk/server/auth.py do: (principal, rounds)."""
    conn = server.exchange()
    token, rounds = client.init(), 0
    while token is not None:
        rounds += 1
        answer, principal = conn.process(token)
        token = client.process(answer)
        if token is None:
            return principal, rounds
    raise AssertionError("unreachable")


def test_digest_md5_right_password_and_policy():
    server = SaslServerProvider({"bookkeeper-a": "pw-a", "other": "pw-o"})
    assert exchange(server, SaslClientProvider("bookkeeper-a", "pw-a")) == ("bookkeeper-a", 2)
    # the Java client sends one more, empty, AUTH after rspauth: answered empty, still authenticated
    conn, client = server.exchange(), SaslClientProvider("bookkeeper-a", "pw-a")
    challenge, principal = conn.process(client.init())
    assert principal is None and b"nonce=" in challenge
    rspauth, principal = conn.process(client.process(challenge))
    assert principal == "bookkeeper-a" and rspauth.startswith(b"rspauth=")
    assert client.process(rspauth) is None
    assert conn.process(b"") == (b"", "bookkeeper-a")


@pytest.mark.parametrize("user,password,why", [
    ("bookkeeper-a", "wrong", "refused user"),       # wrong password
    ("bookkeeper-nobody", "pw", "refused user"),     # unknown user
    ("other", "pw-o", "not allowed"),                # right password, id outside saslJaasClientAllowedIds
])
def test_digest_md5_refusals(user, password, why):
    server = SaslServerProvider({"bookkeeper-a": "pw-a", "other": "pw-o"})
    with pytest.raises(AuthenticationError, match=why):
        exchange(server, SaslClientProvider(user, password))


def test_first_token_must_be_empty_and_digest_uri_checked():
    server = SaslServerProvider({"bookkeeper-a": "pw-a"})
    with pytest.raises(AuthenticationError, match="must be empty"):
        server.exchange().process(b"x")
    conn = server.exchange()
    challenge, _ = conn.process(b"")
    from puresasl.client import SASLClient
    other = SASLClient("otherhost", service="bookkeeper", mechanism="DIGEST-MD5", username="bookkeeper-a",
                       password="pw-a")
    other.process()
    with pytest.raises(AuthenticationError, match="digest-uri"):
        conn.process(other.process(challenge))
    with pytest.raises(AuthenticationError, match="already failed"):
        conn.process(b"")


def test_client_refuses_a_forged_rspauth():
    server = SaslServerProvider({"bookkeeper-a": "pw-a"})
    conn, client = server.exchange(), SaslClientProvider("bookkeeper-a", "pw-a")
    challenge, _ = conn.process(client.init())
    client.process(challenge)
    with pytest.raises(AuthenticationError, match="does not verify"):
        client.process(b"rspauth=00000000000000000000000000000000")


def test_bookie_settings_and_its_own_client(tmp_path):
    """bookie_auth_provider = "sasl": the server provider takes the Bookie section's users and the
    allowed-ids rule; the bookie's own client (AutoRecovery) logs in with the Auditor section."""
    from bk.client import BookKeeper
    from bk.config import load_config
    from bk.server.auth import provider_from_config

    p = tmp_path / "jaas.conf"
    p.write_text(JAAS + 'Auditor {\n  org.apache.zookeeper.server.auth.DigestLoginModule required\n'
                        '  username="bookkeeper-x" password="p\\"w";\n};\n')
    cfg = load_config(env={}, overrides={"bookie_auth_provider": "sasl", "sasl_jaas_config_path": str(p),
                                         "sasl_jaas_client_allowed_ids": "bookkeeper-.*"})
    server = provider_from_config(cfg)
    assert server.plugin_name == "sasl" and server.users == {"hd": "testpwd", "bookkeeper-x": 'p"w'}
    own = BookKeeper.for_bookie(cfg)
    assert exchange(server, own.wire.auth_plugin()) == ("bookkeeper-x", 2)
    # "hd" has the right password but is outside sasl_jaas_client_allowed_ids
    with pytest.raises(AuthenticationError, match="not allowed"):
        exchange(server, SaslClientProvider("hd", "testpwd"))
    # a client whose JAAS file lacks its section fails at construction, naming the file and section
    from bk.errors import IncorrectParameterError
    with pytest.raises(IncorrectParameterError, match="no section 'Nope'"):
        BookKeeper("zk://127.0.0.1:1/ledgers", sasl_jaas_config_path=str(p), sasl_jaas_client_section_name="Nope")
