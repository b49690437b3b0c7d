"""The bookie's side of authentication: one ServerSession per connection (bk/proto/auth.py plugins).

With `bookie_auth_provider` empty, every connection is authenticated from the
start and an AUTH request (v2 or v3) is answered as BookKeeper's bookie does with
authentication off: EOK with the plugin name `AuthDisabledPlugin` and an empty
payload.

With a provider configured (BookKeeper's AuthHandler.ServerSideHandler):
- until the exchange succeeds, every request but AUTH and START_TLS is answered
  EUA in its own layout (v3: the request's header with status EUA);
- an AUTH naming another plugin, or a payload the provider refuses, closes the
  connection (v3: after an EUA answer);
- success logs the principal with the peer address.

A provider with `exchange()` (BookKeeper's SASL plugin, bk/proto/sasl.py) keeps state per
connection: each connection gets its own exchange at its first AUTH, and the connection
counts as authenticated only once that exchange names a principal (DIGEST-MD5 takes two
AUTH round trips; the answers in between carry the challenge).

Whether the connection is authenticated is its auth phase (bk.proto.state): UNAUTHENTICATED
until an exchange names a principal (AUTH_OK), AUTH_OFF without a provider. The session
fires AUTH_STEP / AUTH_OK on its connection and keeps only the exchange and the principal.
"""
from __future__ import annotations

import logging
import weakref

from bk.errors import ConfigError, UnauthorizedAccessError
from bk.proto import AuthRequest, MessageEncodeError, encode_error_response, encode_response, AuthResponse
from bk.proto import v3
from bk.proto.auth import AUTH_DISABLED_PLUGIN_NAME, AuthenticationError, TokenAuthProvider
from bk.proto.state import Event, State

log = logging.getLogger(__name__)
_EUA = UnauthorizedAccessError.code
PROVIDERS = ("", "token", "sasl")


def _read_secret(path: str, key: str) -> bytes | None:
    if not path:
        return None
    try:
        with open(path, "rb") as fh:
            data = fh.read().strip()
    except OSError as e:
        raise ConfigError(f"bad value for {key!r}: cannot read {path}: {e}") from None
    if not data:
        raise ConfigError(f"bad value for {key!r}: {path} is empty")
    return data


def provider_from_config(config):
    """The server provider `bookie_auth_provider` names, or None (authentication off)."""
    name = config.bookie_auth_provider
    if not name:
        return None
    if name == "sasl":
        from bk.proto import sasl

        if not config.sasl_jaas_config_path:
            raise ConfigError("bookie_auth_provider 'sasl' needs sasl_jaas_config_path (the JAAS file whose "
                              f"{config.sasl_jaas_bookie_section_name!r} section lists user_<name>=\"<password>\")")
        users = sasl.bookie_credentials(config.sasl_jaas_config_path, config.sasl_jaas_bookie_section_name)
        return sasl.SaslServerProvider(users, config.sasl_jaas_client_allowed_ids)
    if name != "token":
        raise ConfigError(f"bad value for 'bookie_auth_provider': {name!r} (use '', 'token' or 'sasl')")
    secret_key = _read_secret(config.auth_token_secret_key_path, "auth_token_secret_key_path")
    shared = _read_secret(config.auth_token_shared_secret_path, "auth_token_shared_secret_path")
    if secret_key is None and shared is None:
        raise ConfigError("bookie_auth_provider 'token' needs auth_token_secret_key_path or "
                          "auth_token_shared_secret_path")
    return TokenAuthProvider(secret_key, shared)


def _auth_message(plugin_name: str, payload: bytes):
    msg = v3.AuthMessage()
    msg.authPluginName = plugin_name
    msg.payload = payload
    return msg


class ServerSession:
    """Authentication state of one connection."""

    __slots__ = ("provider", "_conn", "principal", "_exchange")

    def __init__(self, provider, conn):
        self.provider = provider
        # weak: the connection holds its session; a strong reference back made every closed
        # connection a cycle for the cyclic GC, holding its buffers and queued items meanwhile
        self._conn = weakref.ref(conn)
        self.principal = None
        self._exchange = None  # the connection's own exchange, for providers that keep state

    @property
    def conn(self):
        """The connection (alive whenever a request of it is being handled)."""
        return self._conn()

    # ------------------------------------------------------------ gate (unauthenticated only)
    def admit(self, items: list) -> list:
        """The requests of one read on an UNAUTHENTICATED connection that may pass: AUTH and
        START_TLS; the rest become EUA answers (bytes, kept in place so answers stay in order).
        The reads after a successful AUTH are not gated (the connection drops its `_admit`)."""
        out = []
        for item in items:
            if isinstance(item, AuthRequest) or (isinstance(item, v3.Request)
                                                   and item.header.operation in (v3.OperationType.AUTH,
                                                                                 v3.OperationType.START_TLS)):
                out.append(item)
            else:
                out.append(self._refusal(item))
        return out

    @staticmethod
    def _refusal(item) -> bytes:
        if type(item) is v3.V3ReadRequest:  # the kernel's plain READ: the Request it stands for
            item = v3.read_request(item)
        if isinstance(item, v3.V3AddRequest):
            return v3.encode_add_responses((item,), _EUA)
        if isinstance(item, v3.Request):
            return v3.frame(v3.response_for(item.header, _EUA))
        op = getattr(item, "op", None)
        version = getattr(item, "version", None)
        try:
            return encode_error_response(op, _EUA, getattr(item, "ledger_id", None), getattr(item, "entry_id", None),
                                         getattr(item, "request_id", None),
                                         version if version in (0, 1, 2) else 2)
        except MessageEncodeError:
            return encode_error_response(None, _EUA)

    # ------------------------------------------------------------ AUTH requests
    def auth_v2(self, req) -> None:
        conn = self.conn
        try:
            incoming = v3.parse(v3.AuthMessage, req.payload)
        except v3.V3DecodeError as e:
            log.warning("closing connection from %s: malformed v2 AUTH: %s", conn.peer, e)
            conn.close()
            return
        answer = self._process(incoming)
        if answer is None:
            conn.close()
            return
        conn.send(encode_response(AuthResponse(answer.SerializeToString()), req.version))

    def auth_v3(self, req) -> None:
        conn = self.conn
        answer = self._process(req.authRequest) if req.HasField("authRequest") else None
        if answer is None:
            conn.send(v3.frame(v3.response_for(req.header, _EUA)))
            conn.close()
            return
        resp = v3.response_for(req.header)
        resp.authResponse.CopyFrom(answer)
        conn.send(v3.frame(resp))

    def _process(self, incoming):
        """The AuthMessage to answer with, or None to refuse (logged)."""
        conn = self.conn
        if self.provider is None:
            log.info("ignoring auth operation from client %s (authentication is off)", conn.peer)
            return _auth_message(AUTH_DISABLED_PLUGIN_NAME, b"")
        name = self.provider.plugin_name
        if incoming.authPluginName != name:
            log.error("refusing AUTH from %s: plugin %r, this bookie uses %r", conn.peer,
                      incoming.authPluginName, name)
            return None
        try:
            if self._exchange is None:
                self._exchange = self.provider.exchange() if hasattr(self.provider, "exchange") else self.provider
            payload, principal = self._exchange.process(incoming.payload)
        except AuthenticationError as e:
            log.warning("refusing AUTH from %s: %s", conn.peer, e)
            return None
        if principal is None:  # a step of a longer exchange: not authenticated by it
            conn.phase_event(Event.AUTH_STEP)
            return _auth_message(name, payload)
        if conn.phase.auth is State.UNAUTHENTICATED:
            log.info("connection from %s authenticated as %r (%s)", conn.peer, principal, name)
        conn.phase_event(Event.AUTH_OK)
        self.principal = principal
        return _auth_message(name, payload)
