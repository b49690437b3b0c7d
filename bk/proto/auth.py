"""Authentication plugins for the bookie protocol's AUTH exchange (both sides, sans-I/O).

An AUTH request and answer carry BookKeeper's `AuthMessage {authPluginName,
payload}`: in v3 inside Request.authRequest / Response.authResponse, in v2 as
the whole body after the header. The plugin names must match on both sides
(a bookie closes a connection that names another plugin, as BookKeeper does).

With authentication off a bookie answers every AUTH with the plugin name
`AuthDisabledPlugin` and an empty payload (BookKeeper's reply), and a client
that reads that name considers itself authenticated.

Shipped plugin, "bk-token" (TokenAuthProvider): the client presents a token
once; the bookie accepts
- a signed token: a JWT signed with HMAC-SHA256 (HS256) under the bookie's
  secret key, whose `sub` is the principal and whose `exp`, when present, has
  not passed (the token Pulsar issues with `bin/pulsar tokens create
  --secret-key`, that its bookkeeperClientAuthenticationParameters carry);
- or a shared secret, compared in constant time (principal "shared-secret").
BookKeeper's SASL plugin (DIGEST-MD5) is bk/proto/sasl.py; Kerberos is not supported.

A provider object holds one connection's exchange. Server side:
`process(payload) -> (answer payload, principal)`; raise AuthenticationError
to refuse. Client side: `init() -> first payload`, `process(answer) -> next
payload or None (done)`.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

from bk.errors import BKError

AUTH_DISABLED_PLUGIN_NAME = "AuthDisabledPlugin"
TOKEN_PLUGIN_NAME = "bk-token"
SHARED_SECRET_PRINCIPAL = "shared-secret"


class AuthenticationError(BKError):
    """An AUTH exchange was refused (bad token, expired, wrong plugin)."""


def _b64url_decode(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def sign_token(subject: str, secret_key: bytes, expires_at_s: float | None = None) -> str:
    """A JWT (HS256) for `subject`, as Pulsar's `tokens create --secret-key` makes them."""
    claims = {"sub": subject}
    if expires_at_s is not None:
        claims["exp"] = int(expires_at_s)
    head = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    body = _b64url(json.dumps(claims, separators=(",", ":")).encode())
    sig = hmac.new(secret_key, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{_b64url(sig)}"


def verify_token(token: str, secret_key: bytes, now_s: float | None = None) -> str:
    """The principal (`sub`) of a valid HS256 token; AuthenticationError otherwise."""
    try:
        head_b64, body_b64, sig_b64 = token.split(".")
        head = json.loads(_b64url_decode(head_b64))
        claims = json.loads(_b64url_decode(body_b64))
        sig = _b64url_decode(sig_b64)
    except (ValueError, TypeError) as e:
        raise AuthenticationError(f"malformed token: {e}") from None
    if not isinstance(head, dict) or head.get("alg") != "HS256":
        raise AuthenticationError("token is not signed with HS256")
    want = hmac.new(secret_key, f"{head_b64}.{body_b64}".encode(), hashlib.sha256).digest()
    if not hmac.compare_digest(want, sig):
        raise AuthenticationError("token signature does not verify")
    if not isinstance(claims, dict) or not isinstance(claims.get("sub"), str) or not claims["sub"]:
        raise AuthenticationError("token has no subject")
    exp = claims.get("exp")
    if exp is not None and (time.time() if now_s is None else now_s) >= exp:
        raise AuthenticationError(f"token of {claims['sub']} expired")
    return claims["sub"]


class TokenAuthProvider:
    """Server side of "bk-token" (one per connection)."""

    plugin_name = TOKEN_PLUGIN_NAME

    def __init__(self, secret_key: bytes | None = None, shared_secret: bytes | None = None):
        if not secret_key and not shared_secret:
            raise ValueError("the token provider needs a secret key or a shared secret")
        self.secret_key = secret_key
        self.shared_secret = shared_secret

    def process(self, payload: bytes) -> tuple[bytes, str]:
        if self.shared_secret and hmac.compare_digest(payload, self.shared_secret):
            return b"", SHARED_SECRET_PRINCIPAL
        if not self.secret_key:
            raise AuthenticationError("wrong shared secret")
        try:
            token = payload.decode("ascii")
        except UnicodeDecodeError:
            raise AuthenticationError("token is not ASCII") from None
        return b"", verify_token(token, self.secret_key)


class TokenClientAuthProvider:
    """Client side of "bk-token": presents the token (or shared secret) once."""

    plugin_name = TOKEN_PLUGIN_NAME

    def __init__(self, token: str | bytes):
        self.token = token.encode("ascii") if isinstance(token, str) else bytes(token)

    def init(self) -> bytes:
        return self.token

    def process(self, payload: bytes) -> bytes | None:
        return None  # the bookie's EOK answer ends the exchange
