"""BookieConnection's response limit against a transport that never drains (no sockets).

Regression for issue 17's slow reader: reads already taken in were answered into
the transport after it paused writing, so a client sending reads of big entries
and never reading made the bookie hold every answer (1,000 reads of 1 MiB: 39 ->
1,468 MiB RSS). Now at most max_response_bytes_per_connection plus one answer
per read slot waits unwritten, and every read is still answered once the client
reads.
"""
import asyncio
import types

import pytest

from bk.config import load_config
from bk.proto import FrameDecoder, ReadLacRequest, ReadRequest, encode_request, v3
from bk.proto.state import Event
from bk.server.connection import BookieConnection
from bk.server.processor import RequestProcessor

ENTRY_BYTES = 256 * 1024
LIMIT_BYTES = 1024 * 1024


class _Bookie:
    """Even entries are cached (answered without a task), odd ones are read from 'disk'."""

    def read_cached(self, ledger_id, entry_id):
        return bytes([entry_id % 256]) * ENTRY_BYTES if entry_id % 2 == 0 else None

    def read_ahead_for(self, ledger_id, entry_id):
        return None  # no read-ahead in flight

    def read_on(self, hits):
        pass  # nothing to read ahead

    async def read_entry(self, ledger_id, entry_id):
        await asyncio.sleep(0)
        return bytes([entry_id % 256]) * ENTRY_BYTES

    def read_entries_cb(self, keys, done, ctx):  # a cold batch (bk.server.cold_reads), answered later
        asyncio.get_running_loop().call_soon(done, ctx, [bytes([e % 256]) * ENTRY_BYTES for _, e in keys])


class _StuckTransport:
    """Keeps every byte written (the client does not read) until drain()."""

    def __init__(self):
        self.buffered: list[bytes] = []
        self.high = 64 * 1024
        self.paused_reading = False
        self.protocol = None
        self.writing_paused = False

    def set_write_buffer_limits(self, high=None, low=None):
        self.high = high

    def get_write_buffer_size(self):
        return sum(map(len, self.buffered))

    def is_closing(self):
        return False

    def writelines(self, parts):
        self.buffered.append(b"".join(parts))
        if self.get_write_buffer_size() > self.high and not self.writing_paused:
            self.writing_paused = True
            self.protocol.pause_writing()

    def drain(self) -> bytes:
        out = b"".join(self.buffered)
        self.buffered.clear()
        if self.writing_paused:
            self.writing_paused = False
            self.protocol.resume_writing()
        return out

    def pause_reading(self):
        self.paused_reading = True

    def resume_reading(self):
        self.paused_reading = False

    def get_extra_info(self, name):
        return None

    def close(self):
        pass

    abort = close


def _connection():
    cfg = load_config(env={}, overrides={"max_response_bytes_per_connection": LIMIT_BYTES,
                                         "max_reads_in_progress_per_connection": 2})
    server = types.SimpleNamespace(config=cfg, connections=set(), auth_provider=None)
    server.processor = RequestProcessor(_Bookie(), cfg)
    conn = BookieConnection(server)
    transport = _StuckTransport()
    transport.protocol = conn
    conn.connection_made(transport)
    conn.phase_event(Event.NOT_V3)  # v2 from the start: no v3 detection
    return conn, transport


def test_answers_wait_in_the_bookie_up_to_the_limit_and_all_arrive_once_read():
    async def main():
        conn, transport = _connection()
        n = 200  # 50 MiB of answers if they all piled up
        conn.data_received(b"".join(encode_request(ReadRequest(0, 7, e)) for e in range(n)))
        peak = 0
        for _ in range(50):
            await asyncio.sleep(0)
            peak = max(peak, transport.get_write_buffer_size() + getattr(conn, "_out_bytes", 0))
        # the limit, plus one answer per read slot (2) and the one that crossed the limit
        assert peak <= LIMIT_BYTES + 3 * (ENTRY_BYTES + 64)
        assert conn.pending > 0 and transport.paused_reading  # the rest wait, reading stopped
        got = []
        decoder = FrameDecoder(8 * 1024 * 1024)
        for _ in range(10_000):  # the client reads now and then
            got += decoder.feed_responses(transport.drain())
            if len(got) == n:
                break
            for _ in range(5):
                await asyncio.sleep(0)
        assert sorted(r.entry_id for r in got) == list(range(n))
        assert all(r.rc == 0 and bytes(r.body) == bytes([r.entry_id % 256]) * ENTRY_BYTES for r in got)
        assert conn.pending == 0 and conn.idle.is_set() and not transport.paused_reading
    asyncio.run(main())


def test_reads_waiting_for_room_are_forgotten_when_the_client_goes():
    async def main():
        conn, transport = _connection()
        conn.data_received(b"".join(encode_request(ReadRequest(0, 7, e)) for e in range(100)))
        for _ in range(20):
            await asyncio.sleep(0)
        assert conn.pending > 0
        conn.connection_lost(None)
        for _ in range(20):
            await asyncio.sleep(0)
        assert conn.pending == 0 and conn.idle.is_set() and not conn._reads_waiting
    asyncio.run(main())


def test_a_closed_connection_is_freed_without_the_cyclic_gc():
    # Its auth session pointed back at it, so every closed connection (and the items and
    # buffers it held) waited for a full collection: after the live fuzzer's 1M bad frames
    # over ~1,500 connections the bookie held hundreds of them.
    import gc
    import weakref

    class _Transport(_StuckTransport):
        pass  # no reference to its protocol: only the connection's own cycles are tested

    async def main():
        cfg = load_config(env={}, overrides={})
        server = types.SimpleNamespace(config=cfg, connections=set(), auth_provider=None)
        server.processor = RequestProcessor(_Bookie(), cfg)
        conn = BookieConnection(server)
        conn.connection_made(_Transport())
        conn.data_received(b"\x00\x00\x00\x08" + bytes(8) + b"\x00\x00\x00\x04\xff\xff\xff\xff")  # bad op, bad version
        conn.connection_lost(None)
        gone = weakref.ref(conn)
        del conn
        for _ in range(3):
            await asyncio.sleep(0)  # a flush it scheduled runs
        assert gone() is None
    gc.disable()
    try:
        asyncio.run(main())
    finally:
        gc.enable()


class _SlowLacBookie:
    """READ_LAC answers once `gate` opens: the last entry is read from 'disk'."""

    def __init__(self):
        self.gate = asyncio.Event()

    def read_lac(self, ledger_id):
        return b"lac"

    def read_cached(self, ledger_id, entry_id):
        return None

    def read_ahead_for(self, ledger_id, entry_id):
        return None

    def read_on(self, hits):
        pass

    async def read_entry(self, ledger_id, entry_id):
        await self.gate.wait()
        return b"e" * 64


@pytest.mark.parametrize("wire", ["v2", "v3"])
def test_read_lac_takes_a_read_slot_on_both_wires(wire):
    """READ_LAC answers with an entry, so it waits for one of the connection's read slots
    (max_reads_in_progress_per_connection, here 2) on v3 as on v2; all are answered."""
    async def main():
        cfg = load_config(env={}, overrides={"max_reads_in_progress_per_connection": 2})
        bookie = _SlowLacBookie()
        server = types.SimpleNamespace(config=cfg, connections=set(), auth_provider=None)
        server.processor = RequestProcessor(bookie, cfg)
        conn = BookieConnection(server)
        transport = _StuckTransport()
        transport.protocol = conn
        conn.connection_made(transport)
        n = 5
        if wire == "v2":
            conn.phase_event(Event.NOT_V3)
            conn.data_received(b"".join(encode_request(ReadLacRequest(0, 7)) for _ in range(n)))
        else:
            conn.data_received(b"".join(v3.frame(v3.request_to_v3(ReadLacRequest(0, 7), t)) for t in range(n)))
        for _ in range(20):
            await asyncio.sleep(0)
        assert (conn._reads_running, len(conn._reads_waiting)) == (2, n - 2)
        bookie.gate.set()
        for _ in range(50):
            await asyncio.sleep(0)
        data = transport.drain()
        if wire == "v2":
            got = FrameDecoder(1 << 20).feed_responses(data)
            assert [(r.rc, r.lac_buf, bytes(r.last_entry)) for r in got] == [(0, b"lac", b"e" * 64)] * n
        else:
            got, at = [], 0
            while at < len(data):  # 4-byte length, then a v3 Response
                size = int.from_bytes(data[at:at + 4], "big")
                got.append(v3.response_to_v2(data[at + 4:at + 4 + size]))
                at += 4 + size
            assert [(r.rc, r.lac_buf, bytes(r.last_entry)) for r in got] == [(0, b"lac", b"e" * 64)] * n
        assert conn._reads_running == 0 and not conn._reads_waiting
    asyncio.run(main())
