"""The protocol settings block of BookieConfig (issue 16): bad combinations name the key."""
import pytest

from bk.config import load_config
from bk.errors import ConfigError
from bk.meta import security_options
from bk.server.auth import provider_from_config
from bk.server.tls import ServerTls


@pytest.mark.parametrize("overrides, key", [
    ({"bookie_auth_provider": "kerberos"}, "bookie_auth_provider"),
    ({"bookie_auth_provider": "sasl"}, "sasl_jaas_config_path"),  # no JAAS file of users
    ({"tls_certificate_path": "/x.pem"}, "tls_certificate_path"),  # no key
    ({"tls_key_store_type": "JKS"}, "tls_key_store_type"),
    ({"tls_provider": "JDK"}, "tls_provider"),
    ({"tls_client_authentication": "true"}, "tls_client_authentication"),  # no trust store
    ({"zk_enable_security": "true"}, "zk_enable_security"),  # no credentials
])
def test_bad_protocol_settings_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key):
        load_config(env={}, overrides=overrides)


def test_token_provider_needs_a_readable_secret(tmp_path):
    cfg = load_config(env={}, overrides={"bookie_auth_provider": "token"})
    with pytest.raises(ConfigError, match="auth_token_secret_key_path"):
        provider_from_config(cfg)
    missing = load_config(env={}, overrides={"bookie_auth_provider": "token",
                                             "auth_token_secret_key_path": str(tmp_path / "nope")})
    with pytest.raises(ConfigError, match="cannot read"):
        provider_from_config(missing)
    (tmp_path / "k").write_bytes(b"key\n")
    ok = load_config(env={}, overrides={"bookie_auth_provider": "token",
                                        "auth_token_secret_key_path": str(tmp_path / "k")})
    assert provider_from_config(ok).secret_key == b"key"
    assert provider_from_config(load_config(env={})) is None


def test_unreadable_tls_files_are_a_config_error(tmp_path):
    cfg = load_config(env={}, overrides={"tls_certificate_path": str(tmp_path / "c.pem"),
                                         "tls_key_store": str(tmp_path / "k.pem")})
    with pytest.raises(ConfigError, match="TLS files"):
        ServerTls(cfg)
    assert ServerTls.from_config(load_config(env={})) is None


def test_zookeeper_digest_file(tmp_path):
    assert security_options("", False) == {}
    (tmp_path / "d").write_text("bk:pw\n")
    assert security_options(str(tmp_path / "d"), True) == {"zk_digest_auth": "bk:pw", "zk_enable_security": True}
    (tmp_path / "bad").write_text("no-colon")
    with pytest.raises(ConfigError, match="user:password"):
        security_options(str(tmp_path / "bad"), False)
