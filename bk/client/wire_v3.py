"""The client's v3 wire, TLS and AUTH: how a BookieClient connection speaks to a bookie.

ClientWireOptions (one per BookKeeper client) says which protocol the
connections speak, whether they upgrade to TLS, and which auth plugin they
present. The request path (bk/client/_core.pyx and its twin) only knows v2
frames and v2 answers; a v3 connection translates at the transport:
`V3Transport.writelines` turns each v2 request frame into a v3 Request (a txnId
per frame; ADDs by the codec kernel, the others through the neutral message and
bk.proto.v3.request_to_v3, the conversion the bookie reads back) and FrameDecoder.feed_v3_responses turns
each v3 Response back into the v2 answer message the core matches (ADD/READ by
ledger and entry, LAC and info by ledger).

Operations BookKeeper defines only in v3 (READ_LAC, WRITE_LAC,
GET_BOOKIE_INFO) go over v3 unless `v2_extensions` says the bookies are bk
ones (bk bookies also serve them as v2 op codes 4..6); a v2 client opens a
second, v3 connection for them. BATCH_READ exists only in v2: a v3 client
sends it on a second, v2 connection.

Connection set-up (`handshake`, before any queued request leaves): START_TLS
in plain v3 and the TLS handshake (hostname verification on unless turned
off), then the AUTH exchange when a plugin is configured. A bookie answering
with the `AuthDisabledPlugin` name has authentication off: the client goes on.
"""
from __future__ import annotations

import ssl
from dataclasses import dataclass

from bk.errors import BookieConnectionError, UnauthorizedAccessError
from bk.proto import AddRequest, AuthRequest, MessageEncodeError, decode_request, encode_request
from bk.proto import v3
from bk.proto.auth import AUTH_DISABLED_PLUGIN_NAME, TokenClientAuthProvider
from bk.formats.wire import ADD_ENTRY_OFFSET, ADD_KEY_OFFSET, HEADER, IDS, OP_ADD_ENTRY, OP_AUTH, split_header

Op = v3.OperationType
PROTOCOLS = ("v2", "v3")


@dataclass(frozen=True)
class ClientWireOptions:
    protocol: str = "v2"
    tls: ssl.SSLContext | None = None  # START_TLS on every connection when set
    tls_server_hostname: str | None = None  # None: the bookie's host; checked unless the context says no
    auth_plugin: object | None = None  # a factory: () -> client auth provider (init/process/plugin_name)
    v2_extensions: bool = False  # True: the bookies are bk's (READ_LAC/WRITE_LAC/INFO over v2 op codes 4..6)

    @property
    def plain(self) -> bool:
        return self.tls is None and self.auth_plugin is None

    @classmethod
    def build(cls, *, protocol: str = "v2", tls_trust_store: str | None = None,
              tls_certificate_path: str | None = None, tls_key_store: str | None = None,
              tls_hostname_verification: bool = True, auth_token: str | None = None,
              auth_plugin=None, v2_extensions: bool = False) -> "ClientWireOptions":
        """From BookKeeper(...)'s options: PEM files as the bookie's tls_* settings name them."""
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
        ctx = None
        if tls_trust_store or tls_certificate_path:
            ctx = ssl.create_default_context(cafile=tls_trust_store)  # verifies the chain and the hostname
            if not tls_hostname_verification:
                ctx.check_hostname = False  # BookKeeper's CVE-2022-32531 was this off by default
            if tls_certificate_path:
                ctx.load_cert_chain(tls_certificate_path, tls_key_store)
        if auth_token is not None and auth_plugin is None:
            auth_plugin = lambda: TokenClientAuthProvider(auth_token)  # noqa: E731
        return cls(protocol, ctx, None, auth_plugin, v2_extensions)


# ---------------------------------------------------------------- v2 request frame -> v3 Request
def _v3_request(op, txn_id: int):
    """A Request of the connection set-up (START_TLS, AUTH), which has no neutral message."""
    req = v3.Request()
    h = req.header
    h.version, h.operation, h.txnId = v3.PROTOCOL_VERSION_V3, op, txn_id
    return req


def request_to_v3(frame, txn_id: int) -> bytes:
    """The v3 frame asking what the v2 request `frame` (length prefix included) asks."""
    body = memoryview(frame)[4:]
    version, op, flags = split_header(HEADER.unpack_from(body)[0])
    if op == OP_ADD_ENTRY:  # no full decode of the entry (the codec kernel takes nearly every ADD)
        msg = AddRequest(flags, bytes(body[ADD_KEY_OFFSET:ADD_ENTRY_OFFSET]), *IDS.unpack_from(body, ADD_ENTRY_OFFSET),
                         bytes(body[ADD_ENTRY_OFFSET:]), version)
    else:
        msg = decode_request(body)
    try:
        return v3.frame(v3.request_to_v3(msg, txn_id))  # the same conversion the bookie reads back
    except MessageEncodeError:
        raise BookieConnectionError(f"{type(msg).__name__} has no v3 form") from None


class V3Frame(bytes):
    """A request with no v2 form (a long-poll READ, FORCE_LEDGER): its v3 frame (txnId 0) as bytes,
    so the request core queues and counts it like any frame, and the Request itself, which
    V3Transport stamps with the connection's next txnId when it leaves."""

    @classmethod
    def of(cls, msg) -> "V3Frame":
        """`msg`: the neutral request (bk.proto.messages), converted as every v3 request is."""
        req = v3.request_to_v3(msg, 0)
        f = cls(v3.frame(req))
        f.request = req
        return f


class V3Transport:
    """The transport the request core writes v2 frames to, on a v3 connection."""

    __slots__ = ("transport", "_txn")

    def __init__(self, transport):
        self.transport = transport
        self._txn = 0

    def writelines(self, frames) -> None:
        out = []
        add, read = v3.v3_add_request_from_v2, v3.v3_read_request_from_v2
        for frame in frames:
            self._txn += 1
            if type(frame) is V3Frame:
                frame.request.header.txnId = self._txn
                out.append(v3.frame(frame.request))
                continue
            # the kernels take plain ADDs and READs; the protobuf library the rest
            out.append(add(frame, self._txn) or read(frame, self._txn) or request_to_v3(frame, self._txn))
        self.transport.writelines(out)

    def write(self, frame) -> None:
        self.writelines((frame,))

    def __getattr__(self, name):
        return getattr(self.transport, name)


# ---------------------------------------------------------------- connection set-up
async def handshake(loop, protocol, options: ClientWireOptions, host: str, bookie_id: str) -> None:
    """START_TLS and AUTH on a fresh connection (`protocol.exchange(frame) -> answer frame body`)."""
    try:
        await _handshake(loop, protocol, options, host, bookie_id)
    finally:
        protocol.setup_frames = None  # set-up over: frames go to the request core from now on


async def _handshake(loop, protocol, options: ClientWireOptions, host: str, bookie_id: str) -> None:
    if options.tls is not None:
        req = _v3_request(Op.START_TLS, 0)
        req.startTLSRequest.SetInParent()
        answer = v3.parse(v3.Response, await protocol.exchange(v3.frame(req)))
        if answer.status != 0:
            raise BookieConnectionError(f"bookie {bookie_id} refused START_TLS (status {answer.status}):"
                                        " is TLS configured there?")
        protocol.transport = await loop.start_tls(protocol.transport, protocol, options.tls,
                                                  server_hostname=options.tls_server_hostname or host)
    if options.auth_plugin is not None:
        await _authenticate(protocol, options, bookie_id)


def _is_start_tls_answer(raw) -> bool:
    """Whether a frame met on a v2 connection is a v3 START_TLS Response: a v2 header starts with
    its protocol version (0..3), a v3 Response with its header field's tag (0x0A)."""
    if not raw or raw[0] != 0x0A:
        return False
    try:
        return v3.parse(v3.Response, bytes(raw)).header.operation == Op.START_TLS
    except v3.V3DecodeError:
        return False


async def _authenticate(protocol, options: ClientWireOptions, bookie_id: str) -> None:
    provider = options.auth_plugin()
    payload = provider.init()
    txn = 0
    while payload is not None:
        msg = v3.AuthMessage()
        msg.authPluginName, msg.payload = provider.plugin_name, payload
        if options.protocol == "v3":
            txn += 1
            req = _v3_request(Op.AUTH, txn)
            req.authRequest.CopyFrom(msg)
            resp = v3.parse(v3.Response, await protocol.exchange(v3.frame(req)))
            while resp.header.operation == Op.START_TLS:
                # A Java bookie answers START_TLS a second time (EIO) once the handshake is done and
                # the connection is not authenticated yet; its own client ignores that answer.
                resp = v3.parse(v3.Response, await protocol.exchange(b""))
            if resp.status != 0 or not resp.HasField("authResponse"):
                raise UnauthorizedAccessError(f"bookie {bookie_id} refused authentication (status {resp.status})")
            answer = resp.authResponse
        else:
            raw = await protocol.exchange(encode_request(AuthRequest(0, msg.SerializeToString())))
            while _is_start_tls_answer(raw):  # the Java bookie's second START_TLS answer (above), in v3
                raw = await protocol.exchange(b"")
            if split_header(HEADER.unpack_from(raw)[0])[1] != OP_AUTH:
                raise UnauthorizedAccessError(f"bookie {bookie_id} refused authentication")
            answer = v3.parse(v3.AuthMessage, bytes(raw[HEADER.size:]))
        if answer.authPluginName == AUTH_DISABLED_PLUGIN_NAME:
            return  # authentication is off on that bookie
        payload = provider.process(answer.payload)

