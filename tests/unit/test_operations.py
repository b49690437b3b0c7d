"""One handler per operation for v2 and v3 (bk.server.operations), converted at the v3 edge
(bk.proto.v3: request_to_v3/request_from_v3, response_to_v3/response_to_v2): the table is
complete, the conversion round-trips, and a v2 and a v3 request of the same operation reach the
same handler and get the same answer from a real Bookie. In process, on a stand-in transport."""
import asyncio

import pytest

from bk.config import load_config
from bk.proto import (FLAG_DO_FENCING, BatchReadRequest, FrameDecoder, GetBookieInfoRequest, GetBookieInfoResponse,
                      ReadLacRequest, ReadLacResponse, ReadRequest, ReadResponse, WriteLacRequest, WriteLacResponse,
                      decode_response, encode_request, master_key)
from bk.proto import v3
from bk.proto.digest import DigestManager
from bk.proto.messages import (AddResponse, ForceLedgerRequest, ForceLedgerResponse, GetListOfEntriesRequest,
                               LongPollReadRequest, LongPollReadResponse)
from bk.server.operations import ERROR_ANSWERS, Operations, error_answer
from bk.testing.transport import FakeTransport

KEY = master_key(b"pw")
LEDGER = 9
DM = DigestManager(LEDGER, "CRC32C", b"pw")
V3 = v3.PROTOCOL_VERSION_V3

REQUESTS = [
    ReadRequest(0, LEDGER, 3, None, V3),
    ReadRequest(FLAG_DO_FENCING, LEDGER, -1, KEY, V3),
    LongPollReadRequest(LEDGER, -1, 4, 1000, True),
    LongPollReadRequest(LEDGER, 6, 4, 0, False),
    ReadLacRequest(0, LEDGER, V3),
    WriteLacRequest(0, KEY, LEDGER, 5, DM.frame_lac(5), V3),
    GetBookieInfoRequest(0, 3, V3),
    ForceLedgerRequest(LEDGER),
    GetListOfEntriesRequest(LEDGER),
]
ANSWERS = [
    AddResponse(0, LEDGER, 3),
    ReadResponse(0, LEDGER, 3, b"entry"),
    ReadResponse(2, LEDGER, 3),
    LongPollReadResponse(0, LEDGER, 5, b"entry", 5),
    LongPollReadResponse(0, LEDGER, -1, b"", 4),
    ReadLacResponse(0, LEDGER, DM.frame_lac(5), b"last"),
    ReadLacResponse(0, LEDGER, None, b"last"),
    WriteLacResponse(104, LEDGER),
    GetBookieInfoResponse(0, 10, 20),
    GetBookieInfoResponse(106),
    ForceLedgerResponse(0, LEDGER),
]


def test_every_operation_has_an_error_answer_and_every_v3_one_a_conversion():
    ops = Operations(None, None)
    assert set(ops.handlers) == set(ERROR_ANSWERS)
    for t in ops.handlers:
        if t is not BatchReadRequest:  # v2 only
            assert t in v3._REQUEST_TO_V3, t
    assert {type(r) for r in REQUESTS} == set(ops.handlers) - {BatchReadRequest}
    assert v3.SERVED == {v3.OperationType(op) for op, _ in v3._REQUEST_TO_V3.values()} - {v3.OperationType.ADD_ENTRY}


@pytest.mark.parametrize("msg", REQUESTS, ids=lambda m: type(m).__name__)
def test_a_neutral_request_comes_back_from_its_v3_frame(msg):
    frame = v3.frame(v3.request_to_v3(msg, 17))
    req = v3.parse(v3.Request, frame[4:])
    assert req.header.txnId == 17 and v3.request_from_v3(req) == msg


@pytest.mark.parametrize("answer", ANSWERS, ids=lambda a: f"{type(a).__name__}-{a[0]}")
def test_a_neutral_answer_comes_back_from_its_v3_frame(answer):
    header = v3.Request().header  # the request's, which the answer echoes
    op = next(c.op for c in v3._OPERATIONS if type(answer) in c.answers)
    header.version, header.operation, header.txnId = V3, op, 5
    resp = v3.response_to_v3(header, answer)
    assert resp.header == header and resp.status == v3.v3_status(answer[0])
    assert v3.response_to_v2(v3.frame(resp)[4:]) == answer


def test_error_answers_are_the_v3_error_layout():
    """What v3.error_response writes for a refused request is the error answer converted."""
    for msg in REQUESTS:
        req = v3.request_to_v3(msg, 3)
        got = v3.response_to_v3(req.header, error_answer(msg, 106)).SerializeToString()
        assert got == v3.error_response(req, 106).SerializeToString(), msg


@pytest.mark.parametrize("field, value", [("ledgerId", -1), ("entryId", -2), ("masterKey", b"short")])
def test_v3_requests_the_bookie_cannot_serve_are_bad_requests(field, value):
    req = v3.request_to_v3(REQUESTS[1], 1)
    setattr(req.readRequest, field, value)
    with pytest.raises(v3.V3RequestError) as ei:
        v3.request_from_v3(req)
    assert ei.value.code == 100  # EBADREQ


# ---------------------------------------------------------------- v2 and v3 against one bookie
def _serve(tmp_path, frames_of_conns):
    """Feed each list of request frames to its own connection of one in-process bookie holding
    entries 0..3 of LEDGER and an explicit LAC; the answer frames of each connection."""
    from types import SimpleNamespace
    from bk.bookie import Bookie
    from bk.server.connection import BookieConnection
    from bk.server.processor import RequestProcessor

    async def main():
        cfg = load_config(env={}, overrides=dict(journal_dirs=[str(tmp_path / "j")],
                                                 ledger_dirs=[str(tmp_path / "l")]))
        bookie = Bookie(cfg)
        await bookie.start()
        try:
            for e in range(4):
                await bookie.add_entry(LEDGER, e, DM.frame_entry(e, e - 1, 10 * (e + 1), b"x" * 10), KEY)
            await bookie.write_lac(LEDGER, KEY, DM.frame_lac(2))
            proc = RequestProcessor(bookie, cfg)
            server = SimpleNamespace(config=cfg, processor=proc, connections=set())
            out = []
            for frames in frames_of_conns:
                conn = BookieConnection(server)
                conn.connection_made(transport := FakeTransport())
                conn.data_received(b"".join(frames))
                got, decoder = [], FrameDecoder()
                for _ in range(400):
                    await asyncio.sleep(0.005)
                    got += decoder.feed(b"".join(transport.out))
                    transport.out.clear()
                    if len(got) >= len(frames):
                        break
                out.append([bytes(f) for f in got])
            await proc.drain()
            return out
        finally:
            await bookie.stop()
    return asyncio.run(main())


# (a cached READ is answered by the reads kernel, a plain cold one by bk.server.cold_reads, not a handler; the LAC written is the one the
# bookie has, so that each connection reads the same; the fence is of a ledger no other asks)
V2_ASKED = [ReadRequest(0, LEDGER, 2), ReadRequest(0, LEDGER, 7), ReadLacRequest(0, LEDGER),
            WriteLacRequest(0, KEY, LEDGER, 2, DM.frame_lac(2)), GetBookieInfoRequest(0, 0),
            ReadRequest(FLAG_DO_FENCING, LEDGER + 1, -1, KEY)]


def test_v2_and_v3_get_the_same_answers_from_the_same_handlers(tmp_path, monkeypatch):
    called = []
    for name in ("read", "read_lac", "write_lac", "bookie_info"):
        handler = getattr(Operations, name)

        async def recording(self, req, _handler=handler, _name=name):
            called.append((_name, req[:-1] if hasattr(req, "version") else req))  # the same, but its version
            return await _handler(self, req)
        monkeypatch.setattr(Operations, name, recording)
    v3_frames = [v3.frame(v3.request_to_v3(m._replace(version=V3), i + 1)) for i, m in enumerate(V2_ASKED)]
    v2_answers, v3_answers = _serve(tmp_path, [[encode_request(m) for m in V2_ASKED], v3_frames])
    v2_answers = sorted(map(repr, (_as_read(decode_response(f)) for f in v2_answers)))  # in completion order
    v3_answers = sorted(repr(v3.response_to_v2(f)) for f in v3_answers)
    assert v3_answers == v2_answers and len(v2_answers) == len(V2_ASKED)
    assert f"ReadLacResponse(rc=0, ledger_id={LEDGER}, lac_buf=<{len(DM.frame_lac(2))} bytes>" in "".join(v2_answers)
    # the v2 connection's, then the v3 one's: the cached READ (single_reads) and the plain READ of
    # a missing entry (a batch in the read threads: cold_reads) reach no handler
    n = len(called) // 2
    assert sorted(called[:n]) == sorted(called[n:]) and n == len(V2_ASKED) - 2


def _as_read(answer):
    """A v2 answer as the client reads its v3 form (bodies as bytes)."""
    if type(answer) is ReadResponse and answer.body is not None:
        return answer._replace(body=bytes(answer.body))
    if type(answer) is ReadLacResponse:
        return answer._replace(lac_buf=answer.lac_buf and bytes(answer.lac_buf),
                               last_entry=answer.last_entry and bytes(answer.last_entry))
    return answer
