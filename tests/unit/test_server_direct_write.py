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
from bk.server import connection as connection_mod
from bk.server.connection import DIRECT_WRITE_MIN_BYTES, BookieConnection, unwritten


def test_unwritten_cuts_at_every_place():
    out = [b"abc", bytearray(b"defg"), memoryview(b"hi")]
    whole = b"abcdefghi"
    for n in range(len(whole) + 1):
        assert b"".join(bytes(p) for p in unwritten(list(out), n)) == whole[n:]
    assert unwritten(list(out), 3)[0] is out[1]  # a whole part left is the part itself


def _server():
    cfg = load_config(env={}, overrides={})
    return types.SimpleNamespace(config=cfg, connections=set(), auth_provider=None,
                                 processor=types.SimpleNamespace())


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

    monkeypatch.setattr(connection_mod.os, "writev", counting_writev)

    async def main():
        a, b = socket.socketpair()
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        loop = asyncio.get_running_loop()
        conn = BookieConnection(_server())
        await loop.connect_accepted_socket(lambda: conn, a)
        assert conn._fd == a.fileno()
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
        b.setblocking(False)
        got = bytearray()

        async def read_all():
            while len(got) < len(want):
                chunk = await loop.sock_recv(b, 1 << 20)
                assert chunk, "the connection closed early"
                got.extend(chunk)

        try:
            await asyncio.wait_for(read_all(), 30)  # a lost byte fails here instead of hanging
        except asyncio.TimeoutError:
            pass
        assert len(got) == len(want) and got == want
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
        conn = BookieConnection(_server())
        transport, _ = await loop.connect_accepted_socket(lambda: conn, a)
        assert conn._fd >= 0
        conn.upgraded(transport)  # what bk.server.tls calls with the TLS transport
        assert conn._fd == -1
        transport.close()
        b.close()

    eventloop.run(main())
