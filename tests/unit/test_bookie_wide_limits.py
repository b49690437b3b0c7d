"""Issue 27: limits that hold for the whole bookie, not per connection (bk.server.limits), and v3
long polls parked on the ledger's LAC (a descriptor watcher and a loop timer, no polling task).

An in-process Bookie behind BookieConnections on fake transports: every connection's bytes are
delivered synchronously, so what is in progress at once is exactly what the test sent.
"""
import asyncio
import struct

import pytest

from bk.bookie import Bookie
from bk.bookie.ledger_descriptor import LedgerDescriptor
from bk.config import load_config
from bk.proto import AddRequest, FrameDecoder, ReadRequest, StatusCode, encode_request, master_key
from bk.proto import v3
from bk.proto.digest import DigestManager
from bk.proto.state import Event
from bk.server.connection import BookieConnection
from bk.server.processor import RequestProcessor

KEY = master_key(b"pw")
_LENGTH = struct.Struct(">I")


class Transport:
    def __init__(self):
        self.out = bytearray()
        self.paused = False
        self.closing = False

    def writelines(self, parts):
        for p in parts:
            self.out += p

    def write(self, data):
        self.out += data

    def pause_reading(self):
        self.paused = True

    def resume_reading(self):
        self.paused = False

    def is_closing(self):
        return self.closing

    def get_extra_info(self, name):
        return None

    def set_write_buffer_limits(self, high=None, low=None):
        pass

    def get_write_buffer_size(self):
        return 0

    def close(self):
        self.closing = True

    abort = close


def entry(ledger_id, entry_id, lac=None, payload=b"data"):
    lac = entry_id - 1 if lac is None else lac
    return DigestManager(ledger_id, "CRC32C", b"pw").frame_entry(entry_id, lac, len(payload), payload)


def add_frame(ledger_id, entry_id):
    return encode_request(AddRequest(0, KEY, ledger_id, entry_id, entry(ledger_id, entry_id)))


def long_poll_frame(txn_id, ledger_id, previous_lac, timeout_ms, piggyback=True):
    req = v3.Request()
    req.header.version, req.header.operation, req.header.txnId = 3, v3.OperationType.READ_ENTRY, txn_id
    r = req.readRequest
    r.ledgerId, r.entryId, r.previousLAC, r.timeOut = ledger_id, -1, previous_lac, timeout_ms
    if piggyback:
        r.flag = v3.READ_FLAG_ENTRY_PIGGYBACK
    return v3.frame(req)


def park(conn, ledger_id, txns, previous_lac=0, timeout_ms=60_000):
    for txn in txns:
        conn.data_received(long_poll_frame(txn, ledger_id, previous_lac, timeout_ms))


def v3_answers(transport):
    """Every whole v3 Response written so far (and forget them)."""
    out, data, at = [], bytes(transport.out), 0
    while at + 4 <= len(data):
        (n,) = _LENGTH.unpack_from(data, at)
        if at + 4 + n > len(data):
            break
        out.append(v3.parse(v3.Response, data[at + 4:at + 4 + n]))
        at += 4 + n
    del transport.out[:at]
    return out


class Server:
    def __init__(self, bookie, cfg):
        self.config = cfg
        self.connections = set()
        self.auth_provider = None
        self.processor = RequestProcessor(bookie, cfg)

    def connect(self, v2=True):
        conn = BookieConnection(self)
        transport = Transport()
        conn.connection_made(transport)
        if v2:  # known v2 from the start (bk.proto.state): no v3 detection
            conn.phase_event(Event.NOT_V3)
        return conn, transport


def with_bookie(tmp_path, test, **settings):
    async def main():
        cfg = load_config(env={}, overrides=dict(journal_dirs=[str(tmp_path / "j")], ledger_dirs=[str(tmp_path / "l")],
                                                 **settings))
        bookie = Bookie(cfg)
        await bookie.start()
        try:
            await test(bookie, Server(bookie, cfg))
        finally:
            await bookie.stop()
    asyncio.run(main())


async def until(check, iterations=20_000):
    """Loop iterations (sleep 0) until check() holds; no clock involved."""
    for _ in range(iterations):
        if check():
            return True
        await asyncio.sleep(0.0005)
    return check()


# ---------------------------------------------------------------- adds and reads in progress
def test_the_add_limit_holds_across_many_connections(tmp_path):
    """16 adds in progress bookie-wide, 40 connections of 10 adds each (each connection alone far
    below its own limit of 10,000): a connection delivers its adds only while it reads (as a
    socket would); the bookie never has more than twice 16 in progress, every connection
    stops reading once the limit is reached, and all 400 are answered (EOK, or ETOOMANYREQUESTS
    for what came past twice the limit), then everyone reads again."""
    async def test(bookie, server):
        limits = server.processor.limits
        conns = [server.connect() for _ in range(40)]
        unsent = set(range(40))
        peak, all_paused_seen = 0, False
        decoder = FrameDecoder()
        answers = {}

        def collect():
            for _c, t in conns:
                for r in decoder.feed_responses(bytes(t.out)):
                    answers[(r.ledger_id, r.entry_id)] = r.rc
                t.out.clear()
            return len(answers) == 400
        for _ in range(20_000):
            for i in sorted(unsent):
                conn, t = conns[i]
                if not t.paused:
                    conn.data_received(b"".join(add_frame(1000 + i, e) for e in range(10)))
                    unsent.discard(i)
                    peak = max(peak, limits.adds)
                    if limits.saturated():
                        assert all(t.paused for _c, t in conns)  # nobody reads on
                        all_paused_seen = True
            if collect() and not unsent:
                break
            await asyncio.sleep(0.0005)
        assert not unsent and len(answers) == 400
        assert peak <= 32 and all_paused_seen
        rcs = list(answers.values())
        assert set(rcs) <= {StatusCode.EOK, StatusCode.ETOOMANYREQUESTS}
        assert (limits.adds, limits.add_bytes) == (0, 0)
        assert await until(lambda: not any(t.paused for _c, t in conns)) and not limits.paused
        for (lid, eid), rc in answers.items():  # what was acknowledged is stored
            if rc == StatusCode.EOK:
                assert bytes(await bookie.read_entry(lid, eid)) == entry(lid, eid)
    with_bookie(tmp_path, test, max_adds_in_progress_limit=16)


def test_the_add_bytes_limit_holds_across_connections(tmp_path):
    size = len(entry(1, 0))

    async def test(bookie, server):
        limits = server.processor.limits
        conns = [server.connect() for _ in range(20)]
        peak = 0
        for i, (conn, _t) in enumerate(conns):
            conn.data_received(b"".join(add_frame(2000 + i, e) for e in range(10)))
            peak = max(peak, limits.add_bytes)
        assert peak <= 2 * 50 * size
        assert await until(lambda: limits.adds == 0 and not any(t.paused for _c, t in conns))
    with_bookie(tmp_path, test, max_add_bytes_in_progress_limit=50 * size)


def test_the_read_limit_holds_across_connections(tmp_path):
    async def test(bookie, server):
        for e in range(10):
            await bookie.add_entry(7, e, entry(7, e), KEY)
        await bookie.checkpoint()  # out of the write cache: reads take the slow path (a task)
        limits = server.processor.limits
        conns = [server.connect() for _ in range(5)]
        for conn, _t in conns:
            conn.data_received(b"".join(encode_request(ReadRequest(0, 7, e)) for e in range(6)))
            assert limits.reads <= 8
        assert all(t.paused for _c, t in conns)
        decoder, got = FrameDecoder(), []

        def collect():
            for _c, t in conns:
                got.extend(decoder.feed_responses(bytes(t.out)))
                t.out.clear()
            return len(got) == 30
        assert await until(collect)
        ok = [r for r in got if r.rc == StatusCode.EOK]
        assert len(ok) == 8 and all(bytes(r.body) == entry(7, r.entry_id) for r in ok)
        assert all(r.rc == StatusCode.ETOOMANYREQUESTS for r in got if r.rc != StatusCode.EOK)
        assert limits.reads == 0 and not any(t.paused for _c, t in conns)
    with_bookie(tmp_path, test, max_reads_in_progress_limit=4, read_cache_max_size_bytes="1MiB")


# ---------------------------------------------------------------- long polls
def test_lac_watchers_wake_once_when_the_lac_passes():
    desc = LedgerDescriptor(5)
    desc.lac = 3
    woken = []
    assert not desc.wait_for_lac_update(2, woken.append)  # already passed: not registered
    a, b = (lambda lac: woken.append(("a", lac))), (lambda lac: woken.append(("b", lac)))
    assert desc.wait_for_lac_update(3, a) and desc.wait_for_lac_update(4, b)
    desc.lac = 4
    assert woken == [("a", 4)] and list(desc.watchers) == [b]
    desc.cancel_wait_for_lac_update(b)
    desc.lac = 9
    assert woken == [("a", 4)] and not desc.watchers


def test_a_long_poll_is_answered_when_the_lac_moves_and_waits_without_a_task(tmp_path):
    async def test(bookie, server):
        await bookie.add_entry(9, 0, entry(9, 0), KEY)
        await bookie.add_entry(9, 1, entry(9, 1), KEY)  # LAC known: 0
        conn, t = server.connect(v2=False)
        tasks_before = len(asyncio.all_tasks())
        conn.data_received(long_poll_frame(1, 9, previous_lac=0, timeout_ms=60_000))
        for _ in range(50):
            await asyncio.sleep(0)
        assert v3_answers(t) == []  # parked
        assert len(asyncio.all_tasks()) == tasks_before  # nothing runs while it waits
        desc = bookie.storage.get_ledger(9)
        assert len(desc.watchers) == 1 and len(conn.long_polls) == 1
        assert server.processor.limits.long_polls == 1
        await bookie.add_entry(9, 2, entry(9, 2), KEY)  # piggybacks LAC 1
        assert not desc.watchers
        assert await until(lambda: len(t.out) > 0)
        (a,) = v3_answers(t)
        out = a.readResponse
        assert a.header.txnId == 1 and a.status == 0 and out.maxLAC == 1
        assert out.entryId == 1 and out.body == entry(9, 1)  # previousLAC + 1, piggybacked
        assert server.processor.limits.long_polls == 0 and conn.pending == 0 and not conn.long_polls
    with_bookie(tmp_path, test)


def test_a_long_poll_is_answered_at_its_timeout_by_a_loop_timer(tmp_path):
    async def test(bookie, server):
        await bookie.add_entry(10, 0, entry(10, 0), KEY)
        await bookie.add_entry(10, 1, entry(10, 1), KEY)  # LAC known: 0
        conn, t = server.connect(v2=False)
        conn.data_received(long_poll_frame(2, 10, previous_lac=0, timeout_ms=300))
        (poll,) = conn.long_polls
        assert isinstance(poll.timer, asyncio.TimerHandle)
        assert await until(lambda: len(t.out) > 0)
        (a,) = v3_answers(t)
        assert a.status == 0 and a.readResponse.maxLAC == 0 and not a.readResponse.HasField("body")
        assert not bookie.storage.get_ledger(10).watchers and server.processor.limits.long_polls == 0
    with_bookie(tmp_path, test)


def test_long_polls_beyond_the_limit_are_refused(tmp_path):
    async def test(bookie, server):
        await bookie.add_entry(11, 0, entry(11, 0), KEY)
        conn, t = server.connect(v2=False)
        other, t2 = server.connect(v2=False)
        park(conn, 11, range(3), previous_lac=5)
        other.data_received(long_poll_frame(99, 11, previous_lac=5, timeout_ms=60_000))
        await asyncio.sleep(0)
        (a,) = v3_answers(t2)  # the limit is the bookie's: another connection is refused too
        assert a.header.txnId == 99 and a.status == v3.v3_status(StatusCode.ETOOMANYREQUESTS)
        assert v3_answers(t) == [] and len(conn.long_polls) == 3 and other.pending == 0
        conn.connection_lost(None)  # frees the three
        other.data_received(long_poll_frame(100, 11, previous_lac=5, timeout_ms=60_000))
        assert len(other.long_polls) == 1 and v3_answers(t2) == []
        other.connection_lost(None)
    with_bookie(tmp_path, test, max_long_polls=3)


def test_a_lost_connection_removes_its_watchers_and_timers(tmp_path):
    async def test(bookie, server):
        await bookie.add_entry(12, 0, entry(12, 0), KEY)
        conn, t = server.connect(v2=False)
        park(conn, 12, range(5))
        desc = bookie.storage.get_ledger(12)
        polls = list(conn.long_polls)
        assert len(desc.watchers) == 5 and server.processor.limits.long_polls == 5
        conn.connection_lost(None)
        assert not desc.watchers and not conn.long_polls and all(p.timer.cancelled() for p in polls)
        assert server.processor.limits.long_polls == 0 and conn.pending == 0 and conn.idle.is_set()
        await bookie.add_entry(12, 1, entry(12, 1, lac=0), KEY)
        await bookie.add_entry(12, 2, entry(12, 2, lac=1), KEY)  # the LAC moves: nobody to answer
        for _ in range(20):
            await asyncio.sleep(0)
        assert bytes(t.out) == b""
    with_bookie(tmp_path, test)


def test_a_long_poll_woken_as_its_connection_goes_is_counted_once(tmp_path):
    async def test(bookie, server):
        await bookie.add_entry(13, 0, entry(13, 0), KEY)
        conn, t = server.connect(v2=False)
        conn.data_received(long_poll_frame(1, 13, previous_lac=0, timeout_ms=60_000))
        done = []
        bookie.add_entry_cb(13, 1, entry(13, 1, lac=1), KEY, False, lambda ctx, err: done.append(err), None)
        assert not bookie.storage.get_ledger(13).watchers  # woken: its answer is queued
        conn.connection_lost(None)  # before the queued answer runs
        assert await until(lambda: done == [None])
        for _ in range(20):
            await asyncio.sleep(0)
        assert server.processor.limits.long_polls == 0 and conn.pending == 0
    with_bookie(tmp_path, test)


def test_a_stopping_bookie_answers_parked_long_polls_at_once(tmp_path):
    async def test(bookie, server):
        await bookie.add_entry(14, 0, entry(14, 0), KEY)
        conn, t = server.connect(v2=False)
        park(conn, 14, range(3))
        assert server.processor.v3.wake_long_polls(server.connections) == 3
        assert await until(conn.idle.is_set)
        answers = v3_answers(t)
        assert sorted(a.header.txnId for a in answers) == [0, 1, 2]
        assert all(a.status == 0 and a.readResponse.maxLAC == -1 for a in answers)
        assert not bookie.storage.get_ledger(14).watchers and server.processor.limits.long_polls == 0
    with_bookie(tmp_path, test)


@pytest.mark.parametrize("key", ["max_adds_in_progress_limit", "max_add_bytes_in_progress_limit",
                                 "max_reads_in_progress_limit", "max_long_polls"])
def test_negative_limits_are_refused_by_name(key):
    from bk.errors import ConfigError
    with pytest.raises(ConfigError, match=f"bad value for '{key}'"):
        load_config(env={}, overrides={key: -1})
