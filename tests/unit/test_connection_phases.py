"""BookieConnection drives its phase table (bk.proto.state): v2 detection, AUTH admission,
START_TLS and closing move the phase, and the attributes the hot path reads follow it.

The processor here only routes AUTH and START_TLS to the connection as bk.server.processor
and bk.server.v3 do and records everything else: the phases are the connection's."""
import asyncio
import struct
import types

import pytest

from bk.config import load_config
from bk.proto import (AddRequest, AuthRequest, FrameDecoder, ReadRequest, decode_response, encode_request)
from bk.proto import v3
from bk.proto.auth import AuthenticationError
from bk.proto.state import Event, PhaseError, State
from bk.server import tls as tls_mod
from bk.server.connection import BookieConnection
from bk.server.limits import BookieLimits
from bk.testing.transport import FakeTransport

EUA, EBADREQ = 102, 100


class _Processor:
    def __init__(self, cfg):
        self.limits = BookieLimits(cfg)
        self._tasks: set = set()
        self.seen: list = []

    def dispatch(self, req, conn):
        if isinstance(req, AuthRequest):
            conn.auth_request_v2(req)
        elif isinstance(req, v3.Request) and req.header.operation == v3.OperationType.AUTH:
            conn.auth_request_v3(req)
        elif isinstance(req, v3.Request) and req.header.operation == v3.OperationType.START_TLS:
            conn.start_tls_v3(req)
        else:
            self.seen.append(req)

    def add_run(self, items, conn):
        self.seen.extend(items)

    def read_run(self, items, conn):  # a read of v3 Requests and READs comes as one run
        for item in items:
            self.dispatch(item, conn)


class _Provider:
    """A token-like plugin: b"step" is one round of a longer exchange, b"ok" names a principal."""
    plugin_name = "test-plugin"

    def process(self, payload):
        if payload == b"step":
            return b"challenge", None
        if payload == b"ok":
            return b"", "alice"
        raise AuthenticationError("bad token")


def _connection(provider=None, server_tls=None):
    cfg = load_config(env={}, overrides={})
    server = types.SimpleNamespace(config=cfg, connections=set(), auth_provider=provider, tls=server_tls,
                                   processor=_Processor(cfg))
    conn = BookieConnection(server)
    transport = FakeTransport()
    conn.connection_made(transport)
    return conn, transport, server.processor


def _answers(transport) -> list:
    out = FrameDecoder().feed(b"".join(transport.out))
    transport.out.clear()
    return out


def _v3_frame(op, txn, **body):
    req = v3.Request()
    req.header.version, req.header.operation, req.header.txnId = v3.PROTOCOL_VERSION_V3, op, txn
    if op == v3.OperationType.START_TLS:
        req.startTLSRequest.SetInParent()
    elif op == v3.OperationType.AUTH:
        req.authRequest.authPluginName, req.authRequest.payload = body["plugin"], body["payload"]
    elif op == v3.OperationType.READ_ENTRY:
        req.readRequest.ledgerId, req.readRequest.entryId = 1, 0
    return v3.frame(req)


def _v2_auth(payload: bytes, plugin: str = _Provider.plugin_name) -> bytes:
    msg = v3.AuthMessage()
    msg.authPluginName, msg.payload = plugin, payload
    return encode_request(AuthRequest(0, msg.SerializeToString()))


def _run(body):
    async def main():
        body()
    asyncio.run(main())


def test_the_first_frame_that_is_no_v3_request_makes_the_connection_v2_for_good():
    def body():
        conn, transport, proc = _connection()
        conn.data_received(_v3_frame(v3.OperationType.READ_ENTRY, 1))
        assert conn.phase.wire is State.MAYBE_V3 and conn._v2_feed is None
        conn.data_received(encode_request(ReadRequest(0, 1, 2)) + _v3_frame(v3.OperationType.READ_ENTRY, 2))
        assert conn.phase.wire is State.V2 and conn._v2_feed == conn.decoder.feed_requests
        kinds = [type(r).__name__ for r in proc.seen]
        assert kinds[:2] == ["V3ReadRequest", "ReadRequest"]
        assert "V3ReadRequest" not in kinds[2:] and "Request" not in kinds[2:]  # v2 for good
        with pytest.raises(PhaseError):  # there is no way back
            conn.phase_event(Event.NOT_V3)
    _run(body)


@pytest.mark.parametrize("protocol", ["v2", "v3"])
def test_requests_wait_for_auth_and_pass_once_it_names_a_principal(protocol):
    if protocol == "v2":
        gated = encode_request(AddRequest(0, b"k" * 20, 1, 0, struct.pack(">qq", 1, 0) + b"d" * 16 + b"entry"))
    else:
        gated = _v3_frame(v3.OperationType.READ_ENTRY, 9)

    def auth(payload, txn):
        if protocol == "v2":
            return _v2_auth(payload)
        return _v3_frame(v3.OperationType.AUTH, txn, plugin=_Provider.plugin_name, payload=payload)

    def refused_eua(frame) -> bool:
        if protocol == "v2":
            return decode_response(bytes(frame)).rc == EUA
        return v3.parse(v3.Response, bytes(frame)).status == v3.v3_status(EUA)

    def body():
        conn, transport, proc = _connection(_Provider())
        conn.data_received(gated)
        conn._flush()
        [refused] = _answers(transport)
        assert refused_eua(refused) and proc.seen == []
        assert conn.phase.auth is State.UNAUTHENTICATED and conn._admit is not None
        conn.data_received(auth(b"step", 1))  # DIGEST-MD5's challenge round: not yet
        assert conn.phase.auth is State.UNAUTHENTICATED and conn.session.principal is None
        conn.data_received(auth(b"ok", 2))
        assert conn.phase.auth is State.AUTHENTICATED and conn._admit is None
        assert conn.session.principal == "alice"
        conn.data_received(gated)
        assert len(proc.seen) == 1
        conn.data_received(auth(b"ok", 3))  # a Java SASL client's last empty AUTH: still authenticated
        assert conn.phase.auth is State.AUTHENTICATED and conn.phase.life is State.OPEN
        conn.data_received(auth(b"wrong", 4))  # refused: the connection closes
        assert conn.phase.life is State.CLOSING and transport.closing
        assert conn.phase.wire is (State.V2 if protocol == "v2" else State.MAYBE_V3)
    _run(body)


def test_without_a_provider_auth_is_off_and_nothing_is_gated():
    def body():
        conn, transport, proc = _connection()
        assert conn.phase.auth is State.AUTH_OFF and conn._admit is None
        conn.data_received(encode_request(ReadRequest(0, 1, 2)) + _v2_auth(b"anything"))
        assert [type(r) for r in proc.seen] == [ReadRequest]
        assert conn.phase.auth is State.AUTH_OFF  # answered AuthDisabledPlugin, no transition
    _run(body)


def test_start_tls_without_tls_configured_is_refused_and_changes_nothing():
    def body():
        conn, transport, proc = _connection()
        conn.data_received(_v3_frame(v3.OperationType.START_TLS, 1))
        conn._flush()
        [answer] = _answers(transport)
        assert v3.parse(v3.Response, bytes(answer)).status == v3.v3_status(EBADREQ)
        assert conn.phase.tls is State.NO_TLS and not conn._holding and not transport.paused
    _run(body)


def test_start_tls_holds_answers_until_the_handshake_is_done(monkeypatch):
    handshakes = []

    async def handshake(conn, context):  # the real one needs a socket: bk/integration/test_auth_tls.py
        handshakes.append(context)
    monkeypatch.setattr(tls_mod, "_handshake", handshake)
    server_tls = types.SimpleNamespace(context=lambda: "ctx")

    def body():
        conn, transport, proc = _connection(server_tls=server_tls)
        assert conn.phase.tls is State.PLAIN
        # START_TLS and, in the same read, a second START_TLS and a READ (a Java client's AUTH
        # comes right behind its START_TLS the same way): their answers wait for the handshake
        conn.data_received(_v3_frame(v3.OperationType.START_TLS, 1) + _v3_frame(v3.OperationType.START_TLS, 2)
                           + _v3_frame(v3.OperationType.READ_ENTRY, 3))
        [accepted] = _answers(transport)  # the first answer left in plain text, before the handshake
        assert v3.parse(v3.Response, bytes(accepted)).status == 0
        assert conn.phase.tls is State.HANDSHAKING and conn._holding and transport.paused
        assert len(proc.seen) == 1  # the READ
        conn.send(b"\x00\x00\x00\x01x")  # an answer queued while handshaking waits
        conn._flush()
        assert transport.out == []
        encrypted = FakeTransport()
        conn.upgraded(encrypted, {"cipher": "TLS_AES_128_GCM_SHA256", "peer": None})
        assert conn.phase.tls is State.ENCRYPTED and not conn._holding and conn.tls["cipher"]
        conn._flush()
        second, held = _answers(encrypted)
        assert v3.parse(v3.Response, bytes(second)).status == v3.v3_status(EBADREQ)  # one START_TLS only
        assert bytes(held) == b"x"
        conn.data_received(_v3_frame(v3.OperationType.START_TLS, 4))
        conn._flush()
        [again] = _answers(encrypted)
        assert v3.parse(v3.Response, bytes(again)).status == v3.v3_status(EBADREQ)
        assert conn.phase.tls is State.ENCRYPTED
    _run(body)
    assert handshakes == ["ctx"]


def test_close_then_lost():
    def body():
        conn, transport, proc = _connection()
        conn.close()
        assert conn.phase.life is State.CLOSING and transport.closing and not conn.closed
        conn.close()  # again: still closing
        conn.connection_lost(None)
        assert conn.phase.life is State.CLOSED and conn.closed
        conn.close()  # after the loss: nothing to do
        conn.send(b"\x00\x00\x00\x01x")
        assert transport.out == []
        with pytest.raises(PhaseError, match="life phase is CLOSED: event LOST"):
            conn.connection_lost(None)
    _run(body)


def test_a_bad_frame_length_closes_after_the_requests_before_it():
    def body():
        conn, transport, proc = _connection()
        conn.data_received(encode_request(ReadRequest(0, 1, 2)) + b"\xff\xff\xff\xff" + b"x" * 8)
        assert conn.phase.wire is State.V2 and conn.phase.life is State.CLOSING and transport.closing
        assert [type(r) for r in proc.seen] == [ReadRequest]
    _run(body)
