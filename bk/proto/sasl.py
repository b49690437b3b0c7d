"""BookKeeper's SASL auth plugin ("sasl"), DIGEST-MD5 with JAAS credentials, both sides.

Apache BookKeeper's SASLBookieAuthProviderFactory / SASLClientProviderFactory exchange
SASL tokens in AUTH messages named `sasl`; without Kerberos they run DIGEST-MD5 (RFC 2831)
with protocol `bookkeeper` and server name `bookkeeper` (digest-uri "bookkeeper/bookkeeper",
realm "bookkeeper"), whatever the bookie's host is. Credentials come from a JAAS file:
the bookie's section (default `Bookie`) lists `user_<name>="<password>"`, a client's section
(default `BookKeeper`; the bookie's own client uses `Auditor`) holds `username` and
`password`. bk reads the same JAAS file the Java processes read.

The exchange (BookKeeper's AuthHandler): the client's first AUTH carries an empty token;
the bookie answers the DIGEST-MD5 challenge; the client's digest-response comes back with
`rspauth`, and the bookie counts the connection authenticated. A Java client then sends
one more, empty, AUTH (its SASL client answered nothing): the bookie answers it with an
empty token and the connection stays authenticated.

The mechanism is never written here: the server side is GNU SASL (libgsasl, through ctypes:
no maintained Python library implements the DIGEST-MD5 server), the client side pure-sasl
(as kazoo uses it). What bk adds is BookKeeper's policy around them: the digest-uri must be
"bookkeeper/bookkeeper", the authorization id (when sent) must equal the authentication id,
and that id must match `sasl_jaas_client_allowed_ids` (whole match, default ".*bookkeeper.*").
"""
from __future__ import annotations

import ctypes
import ctypes.util
import re
import threading

from bk.errors import ConfigError

from .auth import AuthenticationError

PLUGIN_NAME = "sasl"
SASL_PROTOCOL = "bookkeeper"  # SaslConstants.SASL_BOOKKEEPER_PROTOCOL
SASL_SERVER_NAME = "bookkeeper"  # SaslConstants.SASL_MD5_DUMMY_HOSTNAME: the same for every bookie
SASL_REALM = "bookkeeper"
DIGEST_URI = f"{SASL_PROTOCOL}/{SASL_SERVER_NAME}"
DEFAULT_BOOKIE_SECTION = "Bookie"
DEFAULT_CLIENT_SECTION = "BookKeeper"
DEFAULT_AUDITOR_SECTION = "Auditor"
DEFAULT_ALLOWED_IDS = ".*bookkeeper.*"
MAX_TOKEN_BYTES = 4096  # RFC 2831 caps a digest-response at 4096 bytes; more is refused unread


# ------------------------------------------------------------------ JAAS files
_JAAS_TOKEN = re.compile(r'\s*(?:"((?:[^"\\]|\\.)*)"|([{};=])|([^\s{};="]+))', re.S)


def parse_jaas(text: str) -> dict[str, list[dict[str, str]]]:
    """A JAAS login configuration: section name -> one option dict per login module.
    `Name { module.Class required key="value" key2=value2; ... };` with /* */ and // comments."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    tokens, pos = [], 0
    while pos < len(text):
        m = _JAAS_TOKEN.match(text, pos)
        if m is None:
            if text[pos:].strip():
                raise ValueError(f"unexpected text at offset {pos}: {text[pos:pos + 20]!r}")
            break
        pos = m.end()
        if m.group(1) is not None:
            tokens.append(("str", re.sub(r"\\(.)", r"\1", m.group(1))))
        elif m.group(2):
            tokens.append(("sym", m.group(2)))
        elif m.group(3):
            tokens.append(("word", m.group(3)))
    sections: dict[str, list[dict[str, str]]] = {}
    i = 0

    def take(kind=None, value=None):
        nonlocal i
        if i >= len(tokens):
            raise ValueError("the file ends inside a section")
        tok = tokens[i]
        if (kind and tok[0] != kind) or (value and tok[1] != value):
            raise ValueError(f"expected {value or kind}, found {tok[1]!r}")
        i += 1
        return tok[1]

    while i < len(tokens):
        name = take("word")
        take("sym", "{")
        modules = sections.setdefault(name, [])
        while i < len(tokens) and tokens[i] != ("sym", "}"):
            take("word")  # the login module's class
            take("word")  # its flag: required, requisite, sufficient, optional
            options: dict[str, str] = {}
            while i < len(tokens) and tokens[i] != ("sym", ";"):
                key = take("word")
                take("sym", "=")
                options[key] = take()
            take("sym", ";")
            modules.append(options)
        take("sym", "}")
        if i < len(tokens) and tokens[i] == ("sym", ";"):
            i += 1
    return sections


def jaas_section(path: str, section: str, setting: str) -> list[dict[str, str]]:
    """The option dicts of one JAAS section; ConfigError naming `setting` when it cannot be had."""
    try:
        with open(path, encoding="utf-8") as fh:
            sections = parse_jaas(fh.read())
    except OSError as e:
        raise ConfigError(f"bad value for {setting!r}: cannot read {path}: {e}") from None
    except ValueError as e:
        raise ConfigError(f"bad value for {setting!r}: {path} is not a JAAS file: {e}") from None
    if section not in sections:
        raise ConfigError(f"bad value for {setting!r}: {path} has no section {section!r} "
                          f"(it has {sorted(sections)})")
    return sections[section]


def client_credentials(path: str, section: str = DEFAULT_CLIENT_SECTION,
                       setting: str = "sasl_jaas_config_path") -> tuple[str, str]:
    """(username, password) of a client's JAAS section (DigestLoginModule's options)."""
    for options in jaas_section(path, section, setting):
        if "username" in options and "password" in options:
            return options["username"], options["password"]
    raise ConfigError(f"bad value for {setting!r}: section {section!r} of {path} has no username and password")


def bookie_credentials(path: str, section: str = DEFAULT_BOOKIE_SECTION,
                       setting: str = "sasl_jaas_config_path") -> dict[str, str]:
    """user -> password from a bookie's JAAS section (`user_<name>="<password>"` options)."""
    users = {key[len("user_"):]: value for options in jaas_section(path, section, setting)
             for key, value in options.items() if key.startswith("user_") and len(key) > len("user_")}
    if not users:
        raise ConfigError(f"bad value for {setting!r}: section {section!r} of {path} lists no user_<name>")
    return users


# ------------------------------------------------------------------ GNU SASL (server side)
_GSASL_OK, _GSASL_NEEDS_MORE, _GSASL_NO_CALLBACK = 0, 1, 51
_AUTHID, _AUTHZID, _PASSWORD, _SERVICE, _HOSTNAME, _REALM, _QOPS = 1, 2, 3, 5, 6, 11, 13
_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)


class _GnuSasl:
    """libgsasl, loaded once per process. Its callback finds the exchange of a session
    through `_exchanges` (session pointer -> exchange); only the password is asked for."""

    _lock = threading.Lock()
    _instance: "_GnuSasl | None" = None

    @classmethod
    def get(cls) -> "_GnuSasl":
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def __init__(self):
        name = ctypes.util.find_library("gsasl") or "libgsasl.so.18"
        try:
            lib = ctypes.CDLL(name)
        except OSError as e:
            raise ConfigError("bookie_auth_provider 'sasl' needs GNU SASL's library (Debian: apt-get install "
                              f"libgsasl18): {e}") from None
        p, vp, i = ctypes.POINTER, ctypes.c_void_p, ctypes.c_int
        lib.gsasl_init.argtypes = [p(vp)]
        lib.gsasl_callback_set.argtypes = [vp, _CALLBACK]
        lib.gsasl_server_start.argtypes = [vp, ctypes.c_char_p, p(vp)]
        lib.gsasl_step.argtypes = [vp, ctypes.c_char_p, ctypes.c_size_t, p(vp), p(ctypes.c_size_t)]
        lib.gsasl_property_set.argtypes = [vp, i, ctypes.c_char_p]
        lib.gsasl_property_fast.argtypes = [vp, i]
        lib.gsasl_property_fast.restype = ctypes.c_char_p
        lib.gsasl_strerror.argtypes = [i]
        lib.gsasl_strerror.restype = ctypes.c_char_p
        lib.gsasl_free.argtypes = [vp]
        lib.gsasl_finish.argtypes = [vp]
        self.lib = lib
        self.ctx = vp()
        rc = lib.gsasl_init(ctypes.byref(self.ctx))
        if rc != _GSASL_OK:
            raise ConfigError(f"GNU SASL cannot start: {lib.gsasl_strerror(rc).decode()}")
        self._exchanges: dict[int, "SaslServerExchange"] = {}
        self._callback = _CALLBACK(self._on_property)  # kept: libgsasl holds only the pointer
        lib.gsasl_callback_set(self.ctx, self._callback)

    def _on_property(self, _ctx, session, prop) -> int:
        try:
            exchange = self._exchanges.get(session)
            if prop != _PASSWORD or exchange is None:
                return _GSASL_NO_CALLBACK
            user = self.lib.gsasl_property_fast(session, _AUTHID)
            password = exchange.users.get(user.decode("utf-8", "replace")) if user else None
            if password is None:
                return _GSASL_NO_CALLBACK  # unknown user: the step fails as a wrong password does
            self.lib.gsasl_property_set(session, _PASSWORD, password.encode("utf-8"))
            return _GSASL_OK
        except Exception:  # an exception must not cross into C: refuse instead
            return _GSASL_NO_CALLBACK

    def start(self, exchange: "SaslServerExchange") -> int:
        session = ctypes.c_void_p()
        rc = self.lib.gsasl_server_start(self.ctx, b"DIGEST-MD5", ctypes.byref(session))
        if rc != _GSASL_OK:
            raise AuthenticationError(f"GNU SASL has no DIGEST-MD5 server: {self.lib.gsasl_strerror(rc).decode()}")
        for prop, value in ((_SERVICE, SASL_PROTOCOL), (_HOSTNAME, SASL_SERVER_NAME), (_REALM, SASL_REALM),
                            (_QOPS, "qop-auth")):
            self.lib.gsasl_property_set(session, prop, value.encode())
        self._exchanges[session.value] = exchange
        return session.value

    def step(self, session: int, data: bytes) -> tuple[int, bytes]:
        out, size = ctypes.c_void_p(), ctypes.c_size_t()
        rc = self.lib.gsasl_step(session, data, len(data), ctypes.byref(out), ctypes.byref(size))
        answer = b""
        if out.value:
            answer = ctypes.string_at(out.value, size.value)
            self.lib.gsasl_free(out)
        return rc, answer

    def prop(self, session: int, prop: int) -> str | None:
        value = self.lib.gsasl_property_fast(session, prop)
        return None if value is None else value.decode("utf-8", "replace")

    def finish(self, session: int) -> None:
        self._exchanges.pop(session, None)
        self.lib.gsasl_finish(session)

    def error(self, rc: int) -> str:
        return self.lib.gsasl_strerror(rc).decode()


_DIGEST_URI = re.compile(rb'(?:^|,)\s*digest-uri\s*=\s*"([^"]*)"')


class SaslServerExchange:
    """One connection's DIGEST-MD5 exchange on the bookie. `process(token)` ->
    (answer token, principal once authenticated, else None); AuthenticationError refuses."""

    def __init__(self, provider: "SaslServerProvider"):
        self.users = provider.users
        self.allowed_ids = provider.allowed_ids
        self._gsasl = _GnuSasl.get()
        self._session: int | None = self._gsasl.start(self)
        self._step = 0
        self.principal: str | None = None

    def process(self, token: bytes) -> tuple[bytes, str | None]:
        if self.principal is not None:
            return b"", self.principal  # a Java client's closing empty AUTH after rspauth
        if self._session is None:
            raise AuthenticationError("the SASL exchange already failed on this connection")
        try:
            return self._process(token)
        except AuthenticationError:
            self.close()
            raise

    def _process(self, token: bytes) -> tuple[bytes, str | None]:
        if len(token) > MAX_TOKEN_BYTES:
            raise AuthenticationError(f"SASL token of {len(token)} bytes (DIGEST-MD5 allows {MAX_TOKEN_BYTES})")
        if self._step == 0 and token:
            raise AuthenticationError("DIGEST-MD5 has no initial response: the first SASL token must be empty")
        if self._step == 1:
            m = _DIGEST_URI.search(token)
            if m is None or m.group(1).decode("utf-8", "replace").lower() != DIGEST_URI:
                raise AuthenticationError(f"DIGEST-MD5 digest-uri must be {DIGEST_URI!r}, "
                                          f"got {m.group(1) if m else None!r}")
        self._step += 1
        rc, answer = self._gsasl.step(self._session, token)
        if rc == _GSASL_NEEDS_MORE:
            return answer, None
        if rc != _GSASL_OK:
            user = self._gsasl.prop(self._session, _AUTHID)
            raise AuthenticationError(f"DIGEST-MD5 refused user {user!r}: {self._gsasl.error(rc)}")
        authid = self._gsasl.prop(self._session, _AUTHID) or ""
        authzid = self._gsasl.prop(self._session, _AUTHZID)
        self.close()
        if authzid and authzid != authid:
            raise AuthenticationError(f"SASL user {authid!r} asked to act as {authzid!r}")
        if not self.allowed_ids.fullmatch(authid):
            raise AuthenticationError(f"SASL user {authid!r} is not allowed by sasl_jaas_client_allowed_ids "
                                      f"{self.allowed_ids.pattern!r}")
        self.principal = authid
        return answer, authid

    def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            self._gsasl.finish(session)

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone already
            pass


class SaslServerProvider:
    """The bookie's SASL plugin: JAAS users and the allowed-ids rule; one exchange per connection."""

    plugin_name = PLUGIN_NAME

    def __init__(self, users: dict[str, str], allowed_ids: str = DEFAULT_ALLOWED_IDS):
        if not users:
            raise ValueError("the SASL provider needs at least one user")
        try:
            self.allowed_ids = re.compile(allowed_ids)
        except re.error as e:
            raise ConfigError(f"bad value for 'sasl_jaas_client_allowed_ids': {allowed_ids!r}: {e}") from None
        self.users = dict(users)
        _GnuSasl.get()  # a bookie without libgsasl fails at start, not at its first client

    def exchange(self) -> SaslServerExchange:
        return SaslServerExchange(self)


# ------------------------------------------------------------------ client side
class SaslClientProvider:
    """One connection's client side (pure-sasl's DIGEST-MD5): `init()` -> the empty first
    token, `process(answer)` -> the next token, or None once the bookie's rspauth verified."""

    plugin_name = PLUGIN_NAME

    def __init__(self, username: str, password: str):
        try:
            from puresasl.client import SASLClient
        except ImportError:  # pragma: no cover - a declared dependency
            raise ConfigError("SASL needs the pure-sasl package (pip install pure-sasl)") from None
        self._client = SASLClient(SASL_SERVER_NAME, service=SASL_PROTOCOL, mechanism="DIGEST-MD5",
                                  username=username, password=password)

    def init(self) -> bytes:
        return b""

    def process(self, payload: bytes) -> bytes | None:
        from puresasl import SASLError, SASLProtocolException

        if self._client.complete:
            return None
        try:
            answer = self._client.process(payload)
        except (SASLError, SASLProtocolException) as e:
            raise AuthenticationError(f"SASL: the bookie's answer does not verify: {e}") from None
        if self._client.complete:
            return None
        if not answer:
            raise AuthenticationError("SASL: the bookie's challenge gave no response (no nonce?)")
        return answer
