"""TLS on the bookie port: BookKeeper's START_TLS upgrade, with Python's ssl under uvloop.

A client that wants TLS sends a v3 START_TLS request in plain text as its
first frame. Without TLS configured the bookie answers EBADREQ (BookKeeper's
answer) and the connection stays plain. With TLS it answers EOK (still in
plain text), then runs the server side of a TLS handshake on the same socket
(`loop.start_tls`); everything after is encrypted and may be v2 or v3 (a Java
client in v2 mode keeps using v2 frames after its v3 START_TLS).

ServerTls builds the ssl.SSLContext from the `tls_*` settings (PEM files
named after BookKeeper's tlsCertificatePath, tlsKeyStore, tlsTrustStore...):
the bookie's certificate chain and key, and, when a trust store is set, the
CAs of client certificates (required with tls_client_authentication: mutual
TLS). With tls_cert_files_refresh_duration_s > 0 the files are checked that
often and a changed file is loaded into a new context for the handshakes that
follow; connections already encrypted keep their session (a bad new file is
logged and the old context kept).
"""
from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time

from bk.errors import BadRequestError, ConfigError
from bk.proto import v3
from bk.proto.state import Event, State

log = logging.getLogger(__name__)
HANDSHAKE_TIMEOUT_S = 10.0


def _read_password(path: str) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as fh:
        return fh.read().strip()


class ServerTls:
    """The bookie's TLS context, reloaded when its files change."""

    def __init__(self, config):
        self.config = config
        self._paths = [p for p in (config.tls_certificate_path, config.tls_key_store, config.tls_trust_store,
                                   config.tls_key_store_password_path) if p]
        self._refresh_s = float(config.tls_cert_files_refresh_duration_s)
        self._checked_at = time.monotonic()
        self._stamps = self._file_stamps()
        try:
            self._context = self._build()
        except (OSError, ssl.SSLError, ValueError) as e:
            raise ConfigError(f"cannot load the bookie's TLS files ({', '.join(self._paths)}): {e}") from None
        self.reloads = 0

    @classmethod
    def from_config(cls, config) -> "ServerTls | None":
        return cls(config) if config.tls_certificate_path else None

    def _file_stamps(self) -> list:
        out = []
        for p in self._paths:
            try:
                st = os.stat(p)
                out.append((st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                out.append(None)
        return out

    def _build(self) -> ssl.SSLContext:
        cfg = self.config
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(cfg.tls_certificate_path, cfg.tls_key_store,
                            password=_read_password(cfg.tls_key_store_password_path))
        if cfg.tls_trust_store:
            ctx.load_verify_locations(cafile=cfg.tls_trust_store)
            ctx.verify_mode = ssl.CERT_REQUIRED if cfg.tls_client_authentication else ssl.CERT_OPTIONAL
        return ctx

    def context(self) -> ssl.SSLContext:
        """The context for a new handshake (reloaded first when a file changed and the refresh is due)."""
        if self._refresh_s > 0 and time.monotonic() - self._checked_at >= self._refresh_s:
            self._checked_at = time.monotonic()
            stamps = self._file_stamps()
            if stamps != self._stamps:
                try:
                    self._context = self._build()
                    self._stamps = stamps
                    self.reloads += 1
                    log.info("reloaded the bookie's TLS certificate files")
                except (OSError, ssl.SSLError, ValueError) as e:
                    log.error("keeping the previous TLS context: cannot load the changed files: %s", e)
        return self._context


def start_tls(conn, req, server_tls: ServerTls | None) -> None:
    """Answer a v3 START_TLS on `conn` and, when its TLS phase allows one (bk.proto.state: TLS
    configured, no START_TLS before), upgrade the connection."""
    if server_tls is None or not conn.phase.allows(Event.START_TLS):
        state = conn.phase.tls
        log.error("START_TLS from %s but %s", conn.peer, "TLS is not configured" if server_tls is None
                  or state is State.NO_TLS else f"the connection's TLS is {state.value} already")
        conn.send(v3.frame(v3.response_for(req.header, BadRequestError.code)))
        return
    resp = v3.response_for(req.header)
    resp.startTLSResponse.SetInParent()
    conn.send(v3.frame(resp))
    conn.flush_now()  # the answer leaves in plain text, before the handshake
    # The client's ClientHello may arrive before the handshake task runs: it must not reach the
    # frame decoder. loop.start_tls takes the paused transport over and reads for TLS.
    conn.transport.pause_reading()
    conn.phase_event(Event.START_TLS)  # answers queued from now on wait for the handshake
    task = asyncio.ensure_future(_handshake(conn, server_tls.context()))
    conn.server.processor._tasks.add(task)
    task.add_done_callback(conn.server.processor._tasks.discard)


async def _handshake(conn, context: ssl.SSLContext) -> None:
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
            new_transport = await loop.start_tls(conn.transport, conn, context, server_side=True)
    except (OSError, ssl.SSLError, asyncio.TimeoutError, ConnectionError) as e:
        log.error("TLS handshake with %s failed: %s", conn.peer, e or type(e).__name__)
        conn.phase_event(Event.HANDSHAKE_FAILED)
        conn.abort()
        return
    ssl_object = new_transport.get_extra_info("ssl_object")
    peer_cert = new_transport.get_extra_info("peercert")
    subject = dict(x[0] for x in peer_cert.get("subject", ())) if peer_cert else {}
    conn.upgraded(new_transport, {"cipher": ssl_object.cipher()[0] if ssl_object else None,
                                  "peer": subject.get("commonName")})
    log.info("connection from %s is protected (%s%s)", conn.peer, conn.tls["cipher"],
             f", client certificate {conn.tls['peer']}" if conn.tls["peer"] else "")
