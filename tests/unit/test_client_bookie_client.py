"""BookieClient: one connection per bookie, matching, coalesced writes, timeouts, reconnects."""
from __future__ import annotations

import asyncio
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from test_client_support import DROP, EOK, FakeBookie, run_async, until  # noqa: E402

from bk.client.bookie_client import BookieClient, BookieClientPool  # noqa: E402
from bk.client.quorum import AddFramer  # noqa: E402
from bk.client.wire_v3 import ClientWireOptions  # noqa: E402
from bk.errors import BookieConnectionError, BookieIOError, BookieTimeoutError  # noqa: E402
from bk.proto import DigestManager, StatusCode, encode_request, master_key  # noqa: E402
from bk.proto.messages import AddRequest, ReadRequest  # noqa: E402
from bk.testing.ports import free_port  # noqa: E402

KEY = master_key(b"pw")


def framer(ledger_id: int = 1) -> AddFramer:
    return AddFramer(DigestManager(ledger_id, "CRC32C"), KEY, 1 << 20)


class Collector:
    def __init__(self):
        self.answers = []

    def __call__(self, response, err):
        self.answers.append((response, err))


def test_add_frame_equals_the_codec_encoding():
    dm = DigestManager(5, "MAC", b"pw")
    f = AddFramer(dm, KEY, 1 << 20).frame(3, 2, 100, b"payload")
    assert f == encode_request(AddRequest(0, KEY, 5, 3, dm.frame_entry(3, 2, 100, b"payload")))
    recovery = AddFramer(dm, KEY, 1 << 20).frame_with_flags(2, 3, 2, 100, b"payload")
    assert recovery == encode_request(AddRequest(2, KEY, 5, 3, dm.frame_entry(3, 2, 100, b"payload")))


@run_async
async def test_many_requests_in_flight_are_matched_by_key_even_out_of_order():
    bookie = await FakeBookie().start()
    client = BookieClient(bookie.bookie_id)
    try:
        f = framer()
        bookie.hold()
        got = Collector()
        for e in range(200):
            client.send_add(f.frame(e, e - 1, e + 1, b"x"), 1, e, got)
        await until(lambda: bookie.held == 200, "200 adds at the bookie")
        assert client.pending_count == 200
        bookie.release(reverse=True)
        await until(lambda: len(got.answers) == 200, "200 answers")
        assert sorted(r.entry_id for r, err in got.answers) == list(range(200))
        assert all(err is None and r.rc == EOK for r, err in got.answers)
        assert client.pending_count == 0 and client.connects == 1
    finally:
        client.close()
        await bookie.stop()


@run_async
async def test_same_key_requests_are_answered_fifo_and_read_of_last_entry_matches():
    bookie = await FakeBookie().start()
    client = BookieClient(bookie.bookie_id)
    try:
        f = framer()
        assert (await client.call(client.send_add, f.frame(0, -1, 1, b"a"), 1, 0)).rc == EOK
        reads = [client.call(client.send_read, 1, 0) for _ in range(5)]
        last = client.call(client.send_read, 1, -1)
        none = client.call(client.send_read, 1, 9)
        answers = await asyncio.gather(*reads, last, none)
        assert all(a.rc == EOK and a.entry_id == 0 for a in answers[:5])
        assert answers[5].rc == EOK and answers[5].body == bookie.entries[(1, 0)]
        assert answers[6].rc == StatusCode.ENOENTRY
    finally:
        client.close()
        await bookie.stop()


@run_async
async def test_batch_read_lac_and_bookie_info_are_matched():
    bookie = await FakeBookie().start()
    # the fake speaks v2 with bk's extension op codes (a real client sends these three ops in v3)
    client = BookieClient(bookie.bookie_id, wire=ClientWireOptions(v2_extensions=True))
    try:
        f = framer()
        for e in range(4):
            await client.call(client.send_add, f.frame(e, e - 1, e + 1, bytes([e])), 1, e)
        b1 = client.call(client.send_batch_read, 1, 0, 3, 1 << 20)
        b2 = client.call(client.send_batch_read, 1, 2, 10, 1 << 20)
        lac = client.call(client.send_read_lac, 1)
        info = client.call(client.send_bookie_info, 3)
        r1, r2, rl, ri = await asyncio.gather(b1, b2, lac, info)
        assert r1.entries == [bookie.entries[(1, e)] for e in range(3)]
        assert r2.entries == [bookie.entries[(1, e)] for e in (2, 3)]
        assert rl.last_entry == bookie.entries[(1, 3)] and rl.lac_buf is None
        assert ri.rc == EOK and ri.total_disk_bytes > 0
        dm = DigestManager(1, "CRC32C")
        assert (await client.call(client.send_write_lac, 1, KEY, 2, dm.frame_lac(2))).rc == EOK
        assert (await client.call(client.send_read_lac, 1)).lac_buf == dm.frame_lac(2)
    finally:
        client.close()
        await bookie.stop()


@run_async
async def test_writes_of_one_loop_iteration_are_coalesced():
    bookie = await FakeBookie().start()
    client = BookieClient(bookie.bookie_id)
    try:
        await client.call(client.send_read, 1, 0)  # connect
        calls = []
        protocol = client._core.protocol
        real = protocol.transport

        class Spy:
            def writelines(self, frames):
                frames = list(frames)
                calls.append(len(frames))
                real.writelines(frames)

            def __getattr__(self, name):
                return getattr(real, name)

        protocol.transport = Spy()
        f = framer()
        futures = [client.call(client.send_add, f.frame(e, -1, e + 1, b"p"), 1, e) for e in range(300)]
        await asyncio.gather(*futures)
        assert calls == [300]
    finally:
        client.close()
        await bookie.stop()


@run_async
async def test_connection_loss_fails_every_pending_request_then_reconnects_on_demand():
    bookie = await FakeBookie().start()
    client = BookieClient(bookie.bookie_id)
    try:
        bookie.add_hook = lambda req: DROP
        f = framer()
        futures = [client.call(client.send_add, f.frame(e, -1, e + 1, b"p"), 1, e) for e in range(50)]
        await until(lambda: len(bookie.requests) == 50, "requests at the bookie")
        bookie.kill_connections()
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert all(isinstance(r, BookieConnectionError) and isinstance(r, BookieIOError) for r in results)
        assert client.pending_count == 0 and client.suspect()
        bookie.add_hook = None
        assert (await client.call(client.send_add, f.frame(0, -1, 1, b"p"), 1, 0)).rc == EOK
        assert client.connects == 2
    finally:
        client.close()
        await bookie.stop()


@run_async
async def test_unreachable_bookie_fails_requests_with_a_connection_error():
    client = BookieClient(f"127.0.0.1:{free_port()}")
    with pytest.raises(BookieConnectionError, match="cannot connect"):
        await client.call(client.send_read, 1, 0)
    client.close()


@run_async
async def test_timeout_fails_the_request_and_a_late_answer_is_ignored():
    bookie = await FakeBookie().start()
    client = BookieClient(bookie.bookie_id, read_timeout_s=0.05)
    try:
        bookie.hold()
        with pytest.raises(BookieTimeoutError, match="READ_ENTRY of ledger 1 entry 0"):
            await client.call(client.send_read, 1, 0)
        assert client.pending_count == 0
        assert bookie.release() == 1  # the late answer arrives and is dropped
        answer = await client.call(client.send_read, 1, 0)
        assert answer.rc == StatusCode.ENOLEDGER
        assert client.connects == 1
    finally:
        client.close()
        await bookie.stop()


@run_async
async def test_timeouts_expire_same_key_requests_in_order_and_custom_timeouts_are_honoured():
    bookie = await FakeBookie().start()
    client = BookieClient(bookie.bookie_id, read_timeout_s=10.0)
    try:
        bookie.hold()
        answers = Collector()
        client.send_read(1, 0, answers)  # the default 10 s: must outlive the short ones below
        client.send_read(1, 0, answers, timeout_s=0.05)  # same key, queued behind the first
        client.send_read(1, 5, answers, timeout_s=0.05)
        await until(lambda: len(answers.answers) == 2, "the two short requests to expire")
        assert all(isinstance(err, BookieTimeoutError) for _, err in answers.answers)
        assert client.pending_count == 1  # the 10 s read of entry 0 is still pending
        assert bookie.release() == 3  # answers: entry 0 goes to the pending read, the rest are dropped
        await until(lambda: len(answers.answers) == 3, "the long read's answer")
        response, err = answers.answers[2]
        assert err is None and response.entry_id == 0 and client.pending_count == 0
    finally:
        client.close()
        await bookie.stop()


@run_async
async def test_malformed_response_drops_the_connection_and_fails_pending():
    bookie = await FakeBookie().start()
    client = BookieClient(bookie.bookie_id)
    try:
        await client.call(client.send_read, 1, 0)
        bookie.read_hook = lambda req: DROP
        pending = client.call(client.send_read, 1, 5)
        await until(lambda: len(bookie.requests) == 2, "read at the bookie")
        conn = next(iter(bookie.connections))
        conn.send(b"\x00\x00\x00\x05\x02\x01\x00\x00\x00")  # ADD response of 5 bytes
        with pytest.raises(BookieConnectionError, match="malformed"):
            await pending
        bookie.read_hook = None
        assert (await client.call(client.send_read, 1, 0)).rc == StatusCode.ENOLEDGER
        assert client.connects == 2
    finally:
        client.close()
        await bookie.stop()


@run_async
async def test_closed_client_and_pool_refuse_requests():
    bookie = await FakeBookie().start()
    pool = BookieClientPool()
    try:
        client = pool.get(bookie.bookie_id)
        assert pool.get(bookie.bookie_id) is client
        bookie.read_hook = lambda req: DROP
        pending = client.call(client.send_read, 1, 0)
        await until(lambda: bookie.requests, "read at the bookie")
        pool.close()
        with pytest.raises(BookieConnectionError):
            await pending
        with pytest.raises(BookieConnectionError):
            await client.call(client.send_read, 1, 0)
        with pytest.raises(BookieConnectionError):
            pool.get("127.0.0.1:1")
    finally:
        await bookie.stop()


@run_async
async def test_fencing_read_needs_a_key():
    bookie = await FakeBookie().start()
    client = BookieClient(bookie.bookie_id)
    try:
        with pytest.raises(ValueError):
            client.send_read(1, -1, lambda r, e: None, flags=1)
        r = await client.call(client.send_read, 1, -1, flags=1, master_key=KEY)
        assert r.rc == StatusCode.ENOENTRY and 1 in bookie.fenced
        assert ("fence", 1, -1) in bookie.requests
        assert encode_request(ReadRequest(1, 1, -1, KEY))  # the codec agrees it is well formed
    finally:
        client.close()
        await bookie.stop()
