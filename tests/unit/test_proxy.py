"""bk.testing.proxy: a fault-injecting proxy in front of a fake bookie speaking v2 framing."""
import asyncio
import os
import random
import socket
import socketserver
import struct
import threading

import pytest

from bk.proto import (
    FLAG_DO_FENCING, FLAG_RECOVERY_ADD, AddRequest, AddResponse, DigestManager, FrameDecoder, ReadRequest,
    ReadResponse, StatusCode, decode_request, decode_response, encode_request, encode_response, master_key,
)
from bk.testing.proxy import (
    DOWN, UP, Proxy, Rule, ThreadedProxy, add_request, add_response, fencing_read, read_request,
)

KEY = master_key(b"pw")
WAIT_S = 10.0


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def add_frame(ledger_id, entry_id, payload=b"x" * 20, flags=0):
    body = DigestManager(ledger_id, "CRC32C", b"pw").frame_entry(entry_id, entry_id - 1, 0, payload)
    return encode_request(AddRequest(flags, KEY, ledger_id, entry_id, body))


def read_frame(ledger_id, entry_id, fencing=False):
    return encode_request(ReadRequest(FLAG_DO_FENCING if fencing else 0, ledger_id, entry_id,
                                      KEY if fencing else None))


def raw_frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def split(stream: bytes) -> list[bytes]:
    return [raw_frame(bytes(b)) for b in FrameDecoder().feed(stream)]


def random_stream(rng, count=80) -> bytes:
    parts = []
    for i in range(count):
        r = rng.random()
        if r < 0.4:
            parts.append(add_frame(rng.randrange(1, 4), i, rng.randbytes(rng.randrange(0, 3000))))
        elif r < 0.6:
            parts.append(read_frame(rng.randrange(1, 4), rng.randrange(-1, 50), fencing=rng.random() < 0.3))
        elif r < 0.8:  # framed garbage: must be forwarded untouched
            parts.append(raw_frame(rng.randbytes(rng.randrange(0, 200))))
        else:
            parts.append(encode_response(AddResponse(rng.choice([0, 104]), 1, i)))
    return b"".join(parts)


async def until(predicate, what="condition"):
    """Poll until predicate() holds; fail after WAIT_S (never asserts how long it took)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


class FakeBookie:
    """Records every byte per connection; answers ADD with EOK and READ with ENOENTRY."""

    def __init__(self, answer=True):
        self.answer = answer
        self.conns = []

    async def start(self, host="127.0.0.1"):
        self.server = await asyncio.start_server(self._handle, host, 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self):
        for c in self.conns:
            c["writer"].close()
        self.server.close()
        await self.server.wait_closed()

    async def _handle(self, reader, writer):
        c = {"received": bytearray(), "writer": writer, "eof": False, "reset": False}
        self.conns.append(c)
        decoder = FrameDecoder()
        try:
            while data := await reader.read(65536):
                c["received"] += data
                if not self.answer:
                    continue
                for body in decoder.feed(data):
                    try:
                        msg = decode_request(body)
                    except Exception:
                        continue
                    if isinstance(msg, AddRequest):
                        writer.write(encode_response(AddResponse(0, msg.ledger_id, msg.entry_id)))
                    elif isinstance(msg, ReadRequest):
                        writer.write(encode_response(ReadResponse(int(StatusCode.ENOENTRY), msg.ledger_id,
                                                                  msg.entry_id)))
        except ConnectionResetError:
            c["reset"] = True
        c["eof"] = True
        writer.close()

    def received(self, i=0) -> bytes:
        return bytes(self.conns[i]["received"]) if len(self.conns) > i else b""


CLIENTS = []


async def connect(proxy):
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    CLIENTS.append(writer)
    return reader, writer


async def finish(bookie, proxy):
    await proxy.stop()
    await bookie.stop()
    while CLIENTS:
        CLIENTS.pop().close()
    await asyncio.sleep(0)  # let the transports finish closing


async def read_exactly(reader, n):
    return await asyncio.wait_for(reader.readexactly(n), WAIT_S)


async def setup(answer=True, **kwargs):
    bookie = await FakeBookie(answer).start()
    proxy = await Proxy("127.0.0.1", bookie.port, **kwargs).start()
    return bookie, proxy


# ------------------------------------------------------------------ pass-through
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pass_through_is_byte_identical_both_ways(seed):
    async def main():
        rng = random.Random(seed)
        bookie, proxy = await setup(answer=False)
        reader, writer = await connect(proxy)
        up = random_stream(rng) + b"\x00\x00\x01"  # ends inside a length prefix
        pos = 0
        while pos < len(up):  # random chunking, including mid-prefix splits
            n = rng.randrange(1, 5000)
            writer.write(up[pos:pos + n])
            await writer.drain()
            pos += n
        await until(lambda: bookie.received() == up[:-3], "up stream")
        down = random_stream(rng)
        bookie.conns[0]["writer"].write(down)
        assert await read_exactly(reader, len(down)) == down
        writer.close()  # the incomplete tail is forwarded at EOF
        await until(lambda: bookie.received() == up, "incomplete tail")
        st = proxy.stats()
        assert st[UP]["bytes"] == len(up) and st[DOWN]["bytes"] == len(down)
        assert st[UP]["passed"] == st[UP]["frames"] and st[UP]["undecodable"] > 0
        await finish(bookie, proxy)
    run(main())


def test_bad_length_prefix_switches_to_raw_forwarding():
    async def main():
        bookie, proxy = await setup(answer=False, max_frame_size_bytes=1000)
        proxy.add_rule(Rule(direction=UP, match=add_request(), action="drop"))
        _, writer = await connect(proxy)
        head = add_frame(1, 0) + read_frame(1, 0)
        tail = struct.pack(">i", 5000) + b"z" * 100 + add_frame(1, 1)  # unsplittable from here on
        writer.write(head + tail)
        await until(lambda: bookie.received() == read_frame(1, 0) + tail, "raw tail")
        assert proxy.stats()[UP]["raw_chunks"] >= 1 and proxy.stats()[UP]["dropped"] == 1
        await finish(bookie, proxy)
    run(main())


# ------------------------------------------------------------------ frame rules
def test_drop_add_request_by_ledger_and_entry():
    async def main():
        bookie, proxy = await setup(answer=False)
        rule = proxy.add_rule(Rule(direction=UP, match=add_request(7, entry_id={2, 4}), action="drop"))
        _, writer = await connect(proxy)
        frames = [add_frame(7, e) for e in range(6)] + [add_frame(8, 2)]
        writer.write(b"".join(frames))
        want = b"".join(f for i, f in enumerate(frames) if i not in (2, 4))
        await until(lambda: bookie.received() == want, "frames except dropped")
        assert rule.hits == 2 and proxy.stats()[UP]["dropped"] == 2
        await finish(bookie, proxy)
    run(main())


def test_drop_fencing_reads_only():
    async def main():
        bookie, proxy = await setup(answer=False)
        proxy.add_rule(Rule(direction=UP, match=fencing_read(5), action="drop"))
        _, writer = await connect(proxy)
        frames = [read_frame(5, -1, fencing=True), read_frame(5, 3), read_frame(6, -1, fencing=True),
                  read_frame(5, 4, fencing=True), add_frame(5, 9, flags=FLAG_RECOVERY_ADD)]
        writer.write(b"".join(frames))
        want = frames[1] + frames[2] + frames[4]
        await until(lambda: bookie.received() == want, "non-fencing frames")
        await finish(bookie, proxy)
    run(main())


def test_hold_and_release_in_order():
    async def main():
        bookie, proxy = await setup(answer=False)
        proxy.add_rule(Rule(direction=UP, match=add_request(3, entry_id={1, 2}), action="hold"))
        _, writer = await connect(proxy)
        frames = [add_frame(3, e) for e in range(4)]
        writer.write(b"".join(frames))
        await proxy.wait_held(2, timeout_s=WAIT_S)
        await until(lambda: bookie.received() == frames[0] + frames[3], "unheld frames")
        held = proxy.held(UP)
        assert [(m.ledger_id, m.entry_id) for _, _, m in held] == [(3, 1), (3, 2)]
        assert proxy.release_held(match=add_request(entry_id=2)) == 1
        await until(lambda: bookie.received() == frames[0] + frames[3] + frames[2], "released 2")
        assert proxy.release_held() == 1
        await until(lambda: bookie.received() == frames[0] + frames[3] + frames[2] + frames[1], "released 1")
        st = proxy.stats()[UP]
        assert st["held"] == 2 and st["released"] == 2 and proxy.held_count() == 0
        proxy.clear_rules()
        proxy.add_rule(Rule(direction=UP, match=add_request(3), action="hold"))
        more = [add_frame(3, e) for e in range(10, 15)]
        writer.write(b"".join(more))
        await proxy.wait_held(5, timeout_s=WAIT_S)
        before = bookie.received()
        assert proxy.release_held(UP) == 5
        await until(lambda: bookie.received() == before + b"".join(more), "all released in hold order")
        await finish(bookie, proxy)
    run(main())


def test_discard_held_loses_frames():
    async def main():
        bookie, proxy = await setup(answer=False)
        proxy.add_rule(Rule(direction=UP, match=add_request(entry_id=0), action="hold"))
        _, writer = await connect(proxy)
        writer.write(add_frame(1, 0) + add_frame(1, 1))
        await proxy.wait_held(1, timeout_s=WAIT_S)
        assert proxy.discard_held(direction=UP) == 1
        assert proxy.release_held() == 0
        writer.write(add_frame(1, 2))
        await until(lambda: bookie.received() == add_frame(1, 1) + add_frame(1, 2), "others")
        assert proxy.stats()[UP]["discarded"] == 1
        await finish(bookie, proxy)
    run(main())


def test_drop_and_hold_responses_down():
    async def main():
        bookie, proxy = await setup()
        proxy.add_rule(Rule(direction=DOWN, match=add_response(entry_id=1), action="drop"))
        proxy.add_rule(Rule(direction=DOWN, match=add_response(entry_id=3), action="hold"))
        reader, writer = await connect(proxy)
        writer.write(b"".join(add_frame(2, e) for e in range(5)))
        resp = [encode_response(AddResponse(0, 2, e)) for e in range(5)]
        assert await read_exactly(reader, 3 * len(resp[0])) == resp[0] + resp[2] + resp[4]
        await proxy.wait_held(1, DOWN, timeout_s=WAIT_S)
        assert decode_response(memoryview(resp[3])[4:]) == proxy.held(DOWN)[0][2]
        proxy.release_held(DOWN)
        assert await read_exactly(reader, len(resp[3])) == resp[3]
        assert len(bookie.received()) == 5 * len(add_frame(2, 0))
        await finish(bookie, proxy)
    run(main())


def test_once_rule_hits_first_match_only():
    async def main():
        bookie, proxy = await setup(answer=False)
        rule = proxy.add_rule(Rule(direction=UP, match=add_request(), action="drop", once=True))
        _, writer = await connect(proxy)
        writer.write(add_frame(1, 0) + add_frame(1, 1) + add_frame(1, 2))
        await until(lambda: bookie.received() == add_frame(1, 1) + add_frame(1, 2), "rest")
        assert rule.hits == 1 and rule not in proxy.rules
        await finish(bookie, proxy)
    run(main())


def test_first_matching_rule_wins_and_pass_exempts():
    async def main():
        bookie, proxy = await setup(answer=False)
        proxy.add_rule(Rule(direction=UP, match=add_request(entry_id=1), action="pass"))
        proxy.add_rule(Rule(direction=UP, action="drop"))  # everything else, undecodable included
        _, writer = await connect(proxy)
        writer.write(add_frame(1, 0) + raw_frame(b"junk") + add_frame(1, 1) + read_frame(1, 1))
        await until(lambda: proxy.stats()[UP]["frames"] == 4, "all judged")
        writer.write(b"")
        await until(lambda: bookie.received() == add_frame(1, 1), "exempt frame")
        assert proxy.stats()[UP]["dropped"] == 3
        await finish(bookie, proxy)
    run(main())


def test_predicate_errors_do_not_match_and_undecodable_frames_pass():
    async def main():
        bookie, proxy = await setup(answer=False)
        proxy.add_rule(Rule(direction=UP, match=lambda m: m.no_such_field == 1, action="drop"))
        proxy.add_rule(Rule(direction=UP, match=lambda m: True, action="drop"))  # decoded messages only
        _, writer = await connect(proxy)
        junk = raw_frame(struct.pack(">I", 0x02090000) + b"unknown op")
        writer.write(add_frame(1, 0) + junk)
        await until(lambda: proxy.stats()[UP]["frames"] == 2, "judged")
        await until(lambda: bookie.received() == junk, "undecodable frame")
        st = proxy.stats()[UP]
        assert st["match_errors"] == 1 and st["undecodable"] == 1 and st["dropped"] == 1
        await finish(bookie, proxy)
    run(main())


def test_delay_keeps_order_and_delivers():
    async def main():
        bookie, proxy = await setup(answer=False)
        proxy.add_rule(Rule(direction=UP, match=add_request(entry_id=0), action="delay", delay_s=0.05))
        _, writer = await connect(proxy)
        frames = [add_frame(1, e) for e in range(3)]
        writer.write(b"".join(frames))
        await until(lambda: bookie.received() == b"".join(frames), "delayed stream")
        assert proxy.stats()[UP]["delayed"] == 1
        await finish(bookie, proxy)
    run(main())


def test_long_delay_holds_back_later_frames_of_the_same_stream_only():
    async def main():
        bookie, proxy = await setup(answer=False)
        proxy.add_rule(Rule(direction=UP, match=add_request(ledger_id=1), action="delay", delay_s=3600))
        _, w1 = await connect(proxy)
        w1.write(add_frame(1, 0) + add_frame(2, 0))  # the second frame queues behind the delayed one
        await until(lambda: proxy.stats()[UP]["frames"] == 2, "judged")
        _, w2 = await connect(proxy)  # another connection is not slowed down
        w2.write(add_frame(2, 5))
        await until(lambda: bookie.received(1) == add_frame(2, 5), "second connection")
        assert bookie.received(0) == b""
        await finish(bookie, proxy)
    run(main())


# ------------------------------------------------------------------ connections
def test_per_connection_rules_by_id_and_client_port():
    async def main():
        bookie, proxy = await setup(answer=False)
        _, w1 = await connect(proxy)
        _, w2 = await connect(proxy)
        await proxy.wait_connections(2, timeout_s=WAIT_S)
        port2 = w2.get_extra_info("sockname")[1]
        infos = {c.client_port: c for c in proxy.connections()}
        first = infos[w1.get_extra_info("sockname")[1]]
        proxy.add_rule(Rule(direction=UP, action="drop", connection=first.id))
        proxy.add_rule(Rule(direction=UP, match=add_request(entry_id=1), action="drop",
                            connection=lambda c: c.client_port == port2))
        w1.write(add_frame(1, 0))
        w2.write(add_frame(1, 0) + add_frame(1, 1) + add_frame(1, 2))
        await until(lambda: proxy.stats()[UP]["frames"] == 4, "judged")
        await until(lambda: len(bookie.conns) == 2, "two upstream connections")
        by_len = sorted(bookie.received(i) for i in range(2))
        assert by_len == [b"", add_frame(1, 0) + add_frame(1, 2)]
        await finish(bookie, proxy)
    run(main())


def test_blackhole_accepts_never_forwards_never_closes_then_heals():
    async def main():
        bookie, proxy = await setup(answer=False)
        _, w1 = await connect(proxy)
        w1.write(add_frame(1, 0))
        await until(lambda: bookie.received(0) == add_frame(1, 0), "before blackhole")
        proxy.set_blackhole(True)
        w1.write(add_frame(1, 1))
        r2, w2 = await connect(proxy)  # accepted, but no upstream connection is made
        w2.write(add_frame(2, 0))
        await proxy.wait_connections(2, timeout_s=WAIT_S)
        await asyncio.sleep(0.05)
        assert len(bookie.conns) == 1 and bookie.received(0) == add_frame(1, 0)
        assert proxy.stats()["connections_open"] == 2 and not r2.at_eof()
        proxy.set_blackhole(False)
        await until(lambda: bookie.received(0) == add_frame(1, 0) + add_frame(1, 1), "healed stream")
        await until(lambda: bookie.received(1) == add_frame(2, 0), "healed new connection")
        await finish(bookie, proxy)
    run(main())


def test_close_rule_sends_eof_and_reset_rule_resets():
    async def main():
        bookie, proxy = await setup(answer=False)
        proxy.add_rule(Rule(direction=UP, match=add_request(ledger_id=1), action="close"))
        proxy.add_rule(Rule(direction=UP, match=add_request(ledger_id=2), action="reset"))
        r1, w1 = await connect(proxy)
        w1.write(add_frame(3, 0) + add_frame(1, 0) + add_frame(3, 1))
        assert await asyncio.wait_for(r1.read(), WAIT_S) == b""
        await until(lambda: bookie.conns and bookie.conns[0]["eof"], "upstream closed")
        assert bookie.received(0) == add_frame(3, 0)
        r2, w2 = await connect(proxy)
        w2.write(add_frame(2, 0))
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(r2.read(), WAIT_S)
        await until(lambda: proxy.stats()["connections_open"] == 0, "connections gone")
        assert proxy.stats()[UP]["closes"] == 2
        await finish(bookie, proxy)
    run(main())


def test_close_connections_api_and_bookie_side_eof():
    async def main():
        bookie, proxy = await setup(answer=False)
        r1, _ = await connect(proxy)
        r2, w2 = await connect(proxy)
        await proxy.wait_connections(2, timeout_s=WAIT_S)
        first = min(c.id for c in proxy.connections())
        assert proxy.close_connections(first) == 1
        assert await asyncio.wait_for(r1.read(), WAIT_S) == b""
        w2.write(add_frame(1, 0))
        await until(lambda: len(bookie.conns) == 2 and bookie.received(1) == add_frame(1, 0), "second alive")
        bookie.conns[1]["writer"].close()  # the bookie hangs up: the client sees EOF
        assert await asyncio.wait_for(r2.read(), WAIT_S) == b""
        await finish(bookie, proxy)
    run(main())


def test_routes_a_bookie_id_through_the_proxy_with_a_second_loopback_address():
    """The recipe for scenarios: bookie bound to 127.0.0.2:P, proxy on 127.0.0.1:P (the bookie id)."""
    async def main():
        for _ in range(5):  # 127.0.0.1:P may be taken by someone else: pick another P
            bookie = await FakeBookie().start("127.0.0.2")
            try:
                proxy = await Proxy("127.0.0.2", bookie.port, "127.0.0.1", bookie.port).start()
                break
            except OSError:
                await bookie.stop()
        else:
            pytest.skip("no port free on both loopback addresses")
        assert proxy.address == f"127.0.0.1:{bookie.port}"
        proxy.add_rule(Rule(direction="both", match=add_request(entry_id=0), action="drop"))
        reader, writer = await connect(proxy)
        writer.write(add_frame(1, 0) + add_frame(1, 1))
        assert await read_exactly(reader, 24 + 4) == encode_response(AddResponse(0, 1, 1))
        await finish(bookie, proxy)
    run(main())


def test_async_context_manager():
    async def main():
        bookie = await FakeBookie().start()
        async with Proxy("127.0.0.1", bookie.port) as proxy:
            reader, writer = await connect(proxy)
            writer.write(add_frame(1, 0))
            assert await read_exactly(reader, 28) == encode_response(AddResponse(0, 1, 0))
        assert await asyncio.wait_for(reader.read(), WAIT_S) == b""
        await finish(bookie, proxy)
    run(main())


def test_target_down_closes_client():
    async def main():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            dead_port = s.getsockname()[1]
        proxy = await Proxy("127.0.0.1", dead_port).start()
        reader, _ = await connect(proxy)
        assert await asyncio.wait_for(reader.read(), WAIT_S) == b""
        await proxy.stop()
        CLIENTS.pop().close()
    run(main())


def test_stop_closes_everything_and_forgets_held():
    async def main():
        bookie, proxy = await setup(answer=False)
        proxy.add_rule(Rule(direction=UP, action="hold"))
        reader, writer = await connect(proxy)
        writer.write(add_frame(1, 0))
        await proxy.wait_held(1, timeout_s=WAIT_S)
        port = proxy.port
        mine = os.path.join("bk", "testing", "proxy.py")
        tasks = lambda: [t for t in asyncio.all_tasks() if t.get_coro().cr_code.co_filename.endswith(mine)]
        assert len(tasks()) == 5  # the connection handler and its four pump loops
        await proxy.stop()
        assert tasks() == []
        assert await asyncio.wait_for(reader.read(), WAIT_S) == b""
        assert proxy.connections() == [] and proxy.held_count() == 0
        assert proxy.stats()[UP]["discarded"] == 1
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)
        await until(lambda: bookie.conns[0]["eof"], "upstream closed")
        assert bookie.received() == b""
        await proxy.stop()  # idempotent
        await finish(bookie, proxy)
    run(main())


def test_queue_stays_bounded_under_a_delay():
    async def main():
        bookie, proxy = await setup(answer=False, max_queued_bytes=10_000)
        proxy.add_rule(Rule(direction=UP, action="delay", delay_s=3600))
        _, writer = await connect(proxy)
        big = b"".join(add_frame(1, e, b"y" * 1000) for e in range(2000))  # ~2 MB
        writer.write(big)
        await until(lambda: proxy.stats()[UP]["frames"] >= 5, "some frames judged")
        await asyncio.sleep(0.1)  # give the proxy every chance to over-read
        conn = next(iter(proxy._connections.values()))
        pump = conn.pumps[UP]
        assert pump.queued_bytes < 10_000 + 65536 + 2000
        assert proxy.stats()[UP]["frames"] < 2000
        await finish(bookie, proxy)
    run(main())


def test_rule_validation():
    with pytest.raises(ValueError):
        Rule(action="explode")
    with pytest.raises(ValueError):
        Rule(direction="sideways")
    with pytest.raises(ValueError):
        Rule(action="delay", delay_s=-1)
    assert read_request(1, 2, fencing=False)(ReadRequest(0, 1, 2))
    assert not read_request(1, 2, fencing=False)(ReadRequest(FLAG_DO_FENCING, 1, 2, KEY))


# ------------------------------------------------------------------ threaded form
class _SyncBookie(socketserver.BaseRequestHandler):
    def handle(self):
        decoder = FrameDecoder()
        while data := self.request.recv(65536):
            self.server.received += data
            for body in decoder.feed(data):
                msg = decode_request(body)
                if isinstance(msg, AddRequest):
                    self.request.sendall(encode_response(AddResponse(0, msg.ledger_id, msg.entry_id)))


def test_threaded_proxy_from_synchronous_code():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _SyncBookie)
    server.daemon_threads = True
    server.received = bytearray()
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        with ThreadedProxy("127.0.0.1", server.server_address[1]) as proxy:
            proxy.add_rule(Rule(direction=UP, match=add_request(entry_id=1), action="hold"))
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as s:
                s.sendall(add_frame(4, 0) + add_frame(4, 1) + add_frame(4, 2))
                one = len(encode_response(AddResponse(0, 4, 0)))
                got = b""
                while len(got) < 2 * one:
                    got += s.recv(4096)
                assert got == encode_response(AddResponse(0, 4, 0)) + encode_response(AddResponse(0, 4, 2))
                proxy.wait_held(1, timeout_s=WAIT_S)
                assert proxy.held_count() == 1 and proxy.release_held() == 1
                got = b""
                while len(got) < one:
                    got += s.recv(4096)
                assert got == encode_response(AddResponse(0, 4, 1))
                assert proxy.stats()[UP]["released"] == 1 and len(proxy.connections()) == 1
                with pytest.raises(TimeoutError):
                    proxy.wait_held(5, timeout_s=0.05)
            port = proxy.port
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=WAIT_S).close()
        with pytest.raises(RuntimeError):
            proxy.stats()
        with pytest.raises(AttributeError):
            proxy.no_such_method()
    finally:
        server.shutdown()
        server.server_close()


# ------------------------------------------------------------------ with the real client and bookies
def test_real_client_and_bookies_through_proxies_with_history_check(tmp_path):
    """Bookies bound to 127.0.0.2, one proxy per bookie id on 127.0.0.1: the writer's adds
    to bookie 0 are held back (AQ 2 is met by the others), released after the writer closed;
    the recorded history then passes the invariant checker for two independent readers."""
    from bk.client import BookKeeper
    from bk.testing.history import History, assert_closed, check_ledger, entries_to_map
    from bk.testing.inprocess import InProcessCluster

    async def main():
        async with InProcessCluster(tmp_path, bookies=3, bind_address="127.0.0.2") as cluster:
            proxies = []
            try:
                for i in sorted(cluster.servers):
                    port = cluster.ports[i]
                    proxies.append(await Proxy("127.0.0.2", port, "127.0.0.1", port).start())
                held = Rule(direction=UP, match=add_request(entry_id=range(3, 6)), action="hold")
                by_id = {p.address: p for p in proxies}
                h = History()
                async with BookKeeper(cluster.metadata_uri) as writer:
                    lh = await writer.create_ledger(3, 3, 2, password=b"pw")
                    by_id[lh.ensemble[0]].add_rule(held)
                    for i in range(10):
                        assert await h.add(lh, b"entry-%d" % i) == i
                    await by_id[lh.ensemble[0]].wait_held(3, UP, timeout_s=WAIT_S)
                    await h.close(lh)
                    assert by_id[lh.ensemble[0]].release_held() == 3
                    ledger_id = lh.ledger_id
                reads = []
                for _ in range(2):
                    async with BookKeeper(cluster.metadata_uri) as reader:
                        rh = await reader.open_ledger(ledger_id, password=b"pw")
                        reads.append(entries_to_map(await rh.read_entries(0, rh.last_add_confirmed)))
                        metadata = rh.metadata
                assert_closed(metadata, ledger_id)
                check_ledger(h, ledger_id, metadata, reads, check_length=True).assert_ok()
                assert held.hits == 3 and sum(p.stats()[UP]["frames"] for p in proxies) >= 30
            finally:
                for p in proxies:
                    await p.stop()

    run(main())
