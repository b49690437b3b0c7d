"""BookieConnection writes big answers with os.writev (the GIL released) before its transport.

What the socket does not take goes to the transport, and nothing is written directly while
the transport still holds bytes, so the client reads every answer whole and in order. The
socket here is a real one with a small send buffer, so direct writes are cut short.
"""
import asyncio
import os
import socket
import types

import pytest

from bk import eventloop
from bk.config import load_config
from bk.proto.state import Event, State
from bk.server import connection as connection_mod
from bk.server import socket_writes
from bk.server.connection import DIRECT_WRITE_MIN_BYTES, BookieConnection
from bk.server.limits import BookieLimits
from bk.server.socket_writes import unwritten


def test_unwritten_cuts_at_every_place():
    out = [b"abc", bytearray(b"defg"), memoryview(b"hi")]
    whole = b"abcdefghi"
    for n in range(len(whole) + 1):
        assert b"".join(bytes(p) for p in unwritten(list(out), n)) == whole[n:]
    assert unwritten(list(out), 3)[0] is out[1]  # a whole part left is the part itself


def _server():
    cfg = load_config(env={}, overrides={})
    return types.SimpleNamespace(config=cfg, connections=set(), auth_provider=None,
                                 processor=types.SimpleNamespace(limits=BookieLimits(cfg)))


async def _connected(conn, small_receiver: bool = True):
    """`conn` serving one end of a socketpair with a 64 KiB send buffer (direct writes are
    cut short); the other end, non-blocking, for the test to read."""
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    if small_receiver:
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    b.setblocking(False)
    transport, _ = await asyncio.get_running_loop().connect_accepted_socket(lambda: conn, a)
    return transport, b


async def _received(b, want: bytes) -> bytes:
    """What arrives on b until len(want) bytes did, the peer closed, or 30 s passed (a lost
    byte fails the comparison instead of hanging the test)."""
    loop = asyncio.get_running_loop()
    got = bytearray()

    async def read_all():
        while len(got) < len(want):
            chunk = await loop.sock_recv(b, 1 << 20)
            if not chunk:
                return
            got.extend(chunk)

    try:
        await asyncio.wait_for(read_all(), 30)
    except asyncio.TimeoutError:
        pass
    return bytes(got)


def _answers(count: int, size: int) -> list[list[bytes]]:
    # read-answer-like lists of parts, each part distinct so a reordering shows
    return [[bytes([(i * 7 + j) % 251]) * size for j in range(4)] for i in range(count)]


@pytest.mark.parametrize("answers", [8, 40])
def test_big_answers_arrive_whole_and_in_order_through_a_small_socket(monkeypatch, answers):
    direct = []
    real_writev = os.writev

    def counting_writev(fd, bufs):
        n = real_writev(fd, bufs)
        direct.append((n, sum(map(len, bufs))))
        return n

    monkeypatch.setattr(socket_writes.os, "writev", counting_writev)

    async def main():
        conn = BookieConnection(_server())
        transport, b = await _connected(conn)
        assert conn._fd == transport.get_extra_info("socket").fileno()
        expect = []
        for i, parts in enumerate(_answers(answers, 48 * 1024)):
            conn.send(list(parts))
            expect.append(b"".join(parts))
            if i % 3 == 0:
                conn.send(b"small-%d" % i)  # below DIRECT_WRITE_MIN_BYTES: the transport's
                expect.append(b"small-%d" % i)
            if i % 5 == 4:
                await asyncio.sleep(0)  # a flush between some answers, several in one for others
        want = b"".join(expect)
        assert await _received(b, want) == want
        conn.transport.close()
        b.close()

    eventloop.run(main())
    # some answers went out directly, cut short by the small socket (the rest by the transport)
    assert direct and all(total >= DIRECT_WRITE_MIN_BYTES for _, total in direct)
    assert any(n < total for n, total in direct)


def test_after_start_tls_only_the_transport_writes():
    async def main():
        a, b = socket.socketpair()
        loop = asyncio.get_running_loop()
        server = _server()
        server.tls = object()  # configured: the connection's TLS phase starts PLAIN (bk.proto.state)
        conn = BookieConnection(server)
        transport, _ = await loop.connect_accepted_socket(lambda: conn, a)
        assert conn._fd >= 0
        conn.phase_event(Event.START_TLS)  # what bk.server.tls does: START_TLS, then the handshake
        conn.upgraded(transport, {"cipher": None, "peer": None})  # ... with the TLS transport
        assert conn._fd == -1 and conn.phase.tls is State.ENCRYPTED
        transport.close()
        b.close()

    eventloop.run(main())


def _logger_with_entries(tmp_path, count: int, size: int):
    from bk.entrylog import EntryLogger
    el = EntryLogger([str(tmp_path)], load_config(env={}, overrides={"num_read_worker_threads": 2}))
    entries = [(7).to_bytes(8, "big") + i.to_bytes(8, "big") + os.urandom(size) for i in range(count)]
    locs = el.add_entries(entries)
    el.flush()
    return el, entries, locs


@pytest.mark.parametrize("cached", [True, False], ids=["FileSpan", "BufferSpan"])
def test_span_answers_arrive_whole_and_in_order_and_give_everything_back(tmp_path, monkeypatch, cached):
    """Answers ending in entry-log spans (BATCH_READ from the logs) go out by sendfile / writev
    while the socket takes them; once the transport holds bytes, the spans left follow it in
    order. Every fd reference and buffer is given back."""
    from bk.entrylog import spans as spans_mod
    monkeypatch.setattr(spans_mod, "_page_cached", lambda fd, offset: cached)
    el, entries, locs = _logger_with_entries(tmp_path, 64, 40 * 1024)
    items = [len(e).to_bytes(4, "big") + e for e in entries]
    sendfiles = []
    real_sendfile = os.sendfile

    def counting_sendfile(*a):
        n = real_sendfile(*a)
        sendfiles.append(n)
        return n

    monkeypatch.setattr(socket_writes.os, "sendfile", counting_sendfile)
    threaded = []
    real_read_spans = connection_mod._read_spans
    monkeypatch.setattr(connection_mod, "_read_spans", lambda out: threaded.append(1) or real_read_spans(out))

    async def main():
        conn = BookieConnection(_server())
        transport, b = await _connected(conn)
        assert conn.takes_spans
        expect = []
        for i in range(0, 64, 4):
            span = el.read_span(7, i, locs[i:i + 4], 1 << 20)
            assert span.count == 4
            head = b"head-%d" % i
            conn.send([head, span])
            expect.append(head + b"".join(items[i:i + 4]))
            if i % 12 == 0:
                conn.send(b"x" * (300 * 1024))  # fills the socket: what follows waits in the transport
                expect.append(b"x" * (300 * 1024))
            if i % 8 == 4:
                await asyncio.sleep(0)
        want = b"".join(expect)
        assert await _received(b, want) == want
        conn.transport.close()
        b.close()

    eventloop.run(main())
    # FileSpans the socket did not take are read by a thread; what is left of a BufferSpan is
    # copied for the transport on the loop (it is in memory already)
    assert bool(threaded) == cached
    assert bool(sendfiles) == cached
    assert all(h.refs == 0 for h in el._files._open.values())
    assert len(el._direct_buffers._free) == el._direct_buffers._made
    el.close()


def test_what_follows_a_span_read_by_a_thread_waits_for_it(tmp_path, monkeypatch):
    from bk.entrylog import spans as spans_mod
    monkeypatch.setattr(spans_mod, "_page_cached", lambda fd, offset: True)
    el, entries, locs = _logger_with_entries(tmp_path, 8, 40 * 1024)
    real_read_spans = connection_mod._read_spans

    def slow_read_spans(out):
        import time
        time.sleep(0.2)  # the thread is slow: the loop flushes again meanwhile
        return real_read_spans(out)

    monkeypatch.setattr(connection_mod, "_read_spans", slow_read_spans)

    async def main():
        conn = BookieConnection(_server())
        transport, b = await _connected(conn, small_receiver=False)
        filler = b"x" * (300 * 1024)
        conn.send(filler)
        await asyncio.sleep(0)  # the transport holds bytes now: the span goes to the thread
        conn.send([b"head", el.read_span(7, 0, locs, 1 << 20)])
        await asyncio.sleep(0)
        conn.send(b"after")
        await asyncio.sleep(0.05)
        conn.send(b"later")
        want = filler + b"head" + b"".join(len(e).to_bytes(4, "big") + e for e in entries) + b"afterlater"
        assert await _received(b, want) == want
        conn.transport.close()
        b.close()

    eventloop.run(main())
    assert all(h.refs == 0 for h in el._files._open.values())
    el.close()


def test_a_span_that_cannot_be_read_closes_the_connection(tmp_path, monkeypatch):
    """A span the socket did not take and the thread cannot read (the file shrank, an I/O
    error): part of its answer may be out already, so the connection is closed, not left
    with a hole in its stream; the span's reference is given back."""
    from bk.entrylog import spans as spans_mod
    monkeypatch.setattr(spans_mod, "_page_cached", lambda fd, offset: True)
    el, entries, locs = _logger_with_entries(tmp_path, 8, 40 * 1024)

    async def main():
        conn = BookieConnection(_server())
        transport, b = await _connected(conn, small_receiver=False)
        conn.send(b"x" * (300 * 1024))
        await asyncio.sleep(0)  # the transport holds bytes now
        span = el.read_span(7, 0, locs, 1 << 20)
        os.truncate(span.path, 2048)
        conn.send([b"head", span])
        for _ in range(200):
            await asyncio.sleep(0.01)
            if transport.is_closing():
                break
        assert transport.is_closing()
        b.close()

    eventloop.run(main())
    assert all(h.refs == 0 for h in el._files._open.values())
    el.close()
