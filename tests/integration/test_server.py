"""A live bookie process (real ZooKeeper) against raw protocol traffic: good
requests, bad input, fencing, SIGTERM, kill -9, cookies."""
import asyncio
import os
import random
import signal
import struct
import subprocess
import sys

import pytest

from bk import eventloop
from bk.proto import (FLAG_DO_FENCING, FLAG_RECOVERY_ADD, AddRequest, FrameDecoder, ReadRequest, StatusCode,
                      encode_request, master_key)
from bk.proto.digest import DigestManager
from bk.testing.cluster import LocalCluster, write_toml
from bk.testing.transport import FakeTransport

pytestmark = pytest.mark.integration

KEY = master_key(b"pw")


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    c = LocalCluster(str(tmp_path_factory.mktemp("server")), bookies=1, zk_connect=f"{zk_server}/srv-{os.getpid()}")
    c.start()
    yield c
    c.stop()


class Raw:
    """One raw protocol connection."""

    def __init__(self, port):
        self.port = port
        self.decoder = FrameDecoder()
        self.items = []

    async def __aenter__(self):
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc):
        self.writer.close()

    def send(self, data: bytes):
        self.writer.write(data)

    async def recv(self, n=1, timeout=10):
        while len(self.items) < n:
            chunk = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not chunk:
                raise ConnectionError("closed by the bookie")
            self.items += self.decoder.feed_responses(chunk)
        out, self.items = self.items[:n], self.items[n:]
        return out

    async def recv_raw(self, timeout=10) -> bytes:
        """One frame body, undecoded (for answers to ops the client side does not know)."""
        raw = FrameDecoder()
        frames = []
        while not frames:
            chunk = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not chunk:
                raise ConnectionError("closed by the bookie")
            frames = raw.feed(chunk)
        assert len(frames) == 1
        return bytes(frames[0])

    async def closed_by_peer(self, timeout=10) -> bool:
        try:
            while True:
                chunk = await asyncio.wait_for(self.reader.read(65536), timeout)
                if not chunk:
                    return True
        except ConnectionResetError:
            return True


def port_of(cluster):
    return int(cluster.bookie_ids[0].rsplit(":", 1)[1])


def add_frame(ledger_id, entry_id, payload=b"data", key=KEY):
    body = DigestManager(ledger_id, "CRC32C", b"pw").frame_entry(entry_id, entry_id - 1, len(payload), payload)
    return encode_request(AddRequest(0, key, ledger_id, entry_id, body))


async def add_ok(port, ledger_id, entry_id):
    async with Raw(port) as c:
        c.send(add_frame(ledger_id, entry_id))
        (r,) = await c.recv()
        return r.rc


def test_add_and_read_over_the_wire(cluster):
    async def main():
        async with Raw(port_of(cluster)) as c:
            for e in range(100):
                c.send(add_frame(1, e, b"x%d" % e))
            rs = await c.recv(100)
            assert sorted(r.entry_id for r in rs) == list(range(100)) and {r.rc for r in rs} == {0}
            c.send(encode_request(ReadRequest(0, 1, 42)))
            c.send(encode_request(ReadRequest(0, 1, -1)))
            c.send(encode_request(ReadRequest(0, 1, 500)))
            c.send(encode_request(ReadRequest(0, 999, 0)))
            rs = {(r.entry_id, r.ledger_id): r for r in await c.recv(4)}
            dm = DigestManager(1, "CRC32C", b"pw")
            assert bytes(dm.verify_entry(42, rs[(42, 1)].body)[2]) == b"x42"
            assert bytes(dm.verify_entry(99, rs[(-1, 1)].body)[2]) == b"x99"
            assert rs[(500, 1)].rc == StatusCode.ENOENTRY
            assert rs[(0, 999)].rc == StatusCode.ENOLEDGER
    eventloop.run(main())


@pytest.mark.parametrize("bad", [
    struct.pack(">i", -1) + b"\x00" * 16,                  # negative length
    struct.pack(">i", 5 * 1024 * 1024 + 1),                # above max_frame_size_bytes
    struct.pack(">i", 2**31 - 1) + b"junk",                # absurd length
])
def test_bad_frame_lengths_close_only_that_connection(cluster, bad):
    async def main():
        port = port_of(cluster)
        async with Raw(port) as other:
            async with Raw(port) as c:
                c.send(bad)
                assert await c.closed_by_peer()
            other.send(add_frame(2, 0))
            (r,) = await other.recv()
            assert r.rc == 0
    eventloop.run(main())


def test_truncated_frames_and_random_bytes_do_not_hurt_the_bookie(cluster):
    async def main():
        port = port_of(cluster)
        rng = random.Random(7)
        for i in range(20):
            async with Raw(port) as c:
                if i % 2:
                    c.send(add_frame(3, i)[: rng.randrange(1, 40)])  # truncated, then the client leaves
                else:
                    c.send(bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 300))))
                await asyncio.sleep(0.01)
        assert await add_ok(port, 3, 1000) == 0
    eventloop.run(main())


def test_unknown_op_and_bad_ids_are_ebadreq_and_the_connection_lives(cluster):
    async def main():
        async with Raw(port_of(cluster)) as c:
            header = (2 << 24) | (9 << 16)
            c.send(struct.pack(">ii", 4 + 16, header) + b"\x00" * 16)     # op 9 does not exist
            answer = await c.recv_raw()  # BookKeeper's generic layout: header rc ledger entry
            assert struct.unpack(">iiqq", answer)[1] == StatusCode.EBADREQ
            c.send(encode_request(ReadRequest(0, 4, 0))[:-8] + struct.pack(">q", -7))  # read entry -7
            neg = bytearray(add_frame(4, 0))
            neg[4 + 4 + 20 + 8: 4 + 4 + 20 + 16] = struct.pack(">q", -3)  # add with entry id -3
            c.send(bytes(neg))
            rs = await c.recv(2)
            assert [r.rc for r in rs] == [StatusCode.EBADREQ] * 2
            c.send(add_frame(4, 0))
            (r,) = await c.recv()
            assert r.rc == 0
            c.send(encode_request(ReadRequest(0, 4, 0)))
            (r,) = await c.recv()
            assert r.rc == 0
    eventloop.run(main())


def test_wrong_master_key_is_eua_and_changes_nothing(cluster):
    async def main():
        port = port_of(cluster)
        assert await add_ok(port, 5, 0) == 0
        async with Raw(port) as c:
            c.send(add_frame(5, 1, key=master_key(b"wrong")))
            c.send(encode_request(ReadRequest(FLAG_DO_FENCING, 5, -1, master_key(b"wrong"))))
            rs = await c.recv(2)
            assert [r.rc for r in rs] == [StatusCode.EUA, StatusCode.EUA]
            c.send(encode_request(ReadRequest(0, 5, 1)))
            (r,) = await c.recv()
            assert r.rc == StatusCode.ENOENTRY
        assert await add_ok(port, 5, 1) == 0  # not fenced by the refused fencing read
    eventloop.run(main())


def test_fencing_read_fences_and_survives_restart(cluster):
    async def main():
        port = port_of(cluster)
        assert await add_ok(port, 6, 0) == 0
        async with Raw(port) as c:
            c.send(encode_request(ReadRequest(FLAG_DO_FENCING, 6, -1, KEY)))
            c.send(encode_request(ReadRequest(FLAG_DO_FENCING, 66, -1, KEY)))  # unknown ledger
            rs = {r.ledger_id: r for r in await c.recv(2)}
            assert rs[6].rc == 0 and rs[66].rc == StatusCode.ENOENTRY
        assert await add_ok(port, 6, 1) == StatusCode.EFENCED
        assert await add_ok(port, 66, 0) == StatusCode.EFENCED
    eventloop.run(main())
    cluster.kill(0)
    cluster.start_bookie(0)
    assert eventloop.run(add_ok(port_of(cluster), 6, 1)) == StatusCode.EFENCED
    log = open(cluster.bookies[0].log_path).read()
    assert "was not shut down cleanly" in log


def test_sigterm_stops_cleanly_with_exit_code_zero(cluster):
    b = cluster.bookies[0]
    assert eventloop.run(add_ok(port_of(cluster), 7, 0)) == 0
    offset = os.path.getsize(b.log_path)
    b.proc.send_signal(signal.SIGTERM)
    assert b.proc.wait(30) == 0
    cluster.start_bookie(0)
    tail = open(b.log_path).read()[offset:]
    assert "stopped" in tail and "was not shut down cleanly" not in tail
    assert eventloop.run(add_ok(port_of(cluster), 7, 1)) == 0


def test_cookie_mismatch_refuses_to_start(cluster, tmp_path):
    """The same directories under another bookie id: the cookie names the dir."""
    b = cluster.bookies[0]
    import tomllib
    with open(b.conf_path, "rb") as fh:
        conf = tomllib.load(fh)
    conf["bookie_port"] = conf["bookie_port"] + 1 if conf["bookie_port"] < 65000 else 30000
    other = str(tmp_path / "other.toml")
    write_toml(other, conf)
    out = subprocess.run([sys.executable, "-m", "bk.cli.main", "bookie", "--conf", other],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "cookie" in out.stderr.lower() and conf["journal_dirs"][0] in out.stderr


def test_bad_config_is_an_error_naming_the_key(tmp_path):
    conf = str(tmp_path / "bad.toml")
    write_toml(conf, {"bookie_port": 3181, "no_such_key": 1})
    out = subprocess.run([sys.executable, "-m", "bk.cli.main", "bookie", "--conf", conf],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "no_such_key" in out.stderr
    out = subprocess.run([sys.executable, "-m", "bk.cli.main", "bookie", "--set", "bookie_port=notaport"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "bookie_port" in out.stderr


# ---------------------------------------------------------------- add batches (one socket read of many ADDs)
def test_one_write_of_adds_reads_and_bad_adds_is_answered_per_request(cluster):
    async def main():
        async with Raw(port_of(cluster)) as c:
            reqs = []  # (frame, what the answer must be), sent in ONE write
            for e in range(6):
                reqs += [(add_frame(20, e), ("add", 20, e, 0)), (add_frame(21, e), ("add", 21, e, 0))]
            reqs.append((add_frame(21, 9, key=master_key(b"wrong")), ("add", 21, 9, StatusCode.EUA)))
            reqs.append((encode_request(ReadRequest(0, 20, 3)), ("read", 20, 3, 0)))  # sees the add before it
            neg = bytearray(add_frame(20, 6))
            neg[4 + 4 + 20 + 8: 4 + 4 + 20 + 16] = struct.pack(">q", -3)
            reqs.append((bytes(neg), ("add", 20, -3, StatusCode.EBADREQ)))
            reqs += [(add_frame(20, 6), ("add", 20, 6, 0)), (add_frame(21, 6), ("add", 21, 6, 0))]
            c.send(b"".join(frame for frame, _ in reqs))
            rs = await c.recv(len(reqs))
            got = sorted(("read" if hasattr(r, "body") else "add", r.ledger_id, r.entry_id, r.rc) for r in rs)
            assert got == sorted(want for _, want in reqs)
            c.send(encode_request(ReadRequest(0, 21, 9)))
            c.send(encode_request(ReadRequest(0, 21, -1)))
            rs = {r.entry_id: r for r in await c.recv(2)}
            assert rs[9].rc == StatusCode.ENOENTRY  # the wrong-key add stored nothing
            last = DigestManager(21, "CRC32C", b"pw").verify_entry(6, rs[-1].body)  # the last: entry 6
            assert rs[-1].rc == 0 and bytes(last[2]) == b"data"
    eventloop.run(main())


def test_one_write_to_a_fenced_ledger_refuses_all_but_recovery_adds(cluster):
    async def main():
        port = port_of(cluster)
        assert await add_ok(port, 22, 0) == 0
        async with Raw(port) as c:
            c.send(encode_request(ReadRequest(FLAG_DO_FENCING, 22, -1, KEY)))
            (r,) = await c.recv()
            assert r.rc == 0
            frames = [add_frame(22, 1), recovery_add_frame(22, 1), add_frame(22, 2), recovery_add_frame(22, 2)]
            c.send(b"".join(frames))
            rs = sorted((r.entry_id, r.rc) for r in await c.recv(4))
            assert rs == sorted([(1, StatusCode.EFENCED), (1, 0), (2, StatusCode.EFENCED), (2, 0)])
    eventloop.run(main())


def recovery_add_frame(ledger_id, entry_id, payload=b"data"):
    body = DigestManager(ledger_id, "CRC32C", b"pw").frame_entry(entry_id, entry_id - 1, len(payload), payload)
    return encode_request(AddRequest(FLAG_RECOVERY_ADD, KEY, ledger_id, entry_id, body))


@pytest.mark.parametrize("journal", [True, False])
def test_connection_batches_keep_accounting_and_refusals_of_one_by_one(tmp_path, journal):
    """In process (no ZooKeeper): a read of many adds is admitted, refused over twice the
    request limit, accounted and answered exactly as one add at a time would be."""
    from types import SimpleNamespace
    from bk.bookie import Bookie
    from bk.config import load_config
    from bk.server.connection import BookieConnection
    from bk.server.processor import RequestProcessor

    async def main():
        cfg = load_config(env={}, overrides=dict(
            journal_dirs=[str(tmp_path / "j")], ledger_dirs=[str(tmp_path / "l")], journal_write_data=journal,
            max_pending_requests_per_connection=4))
        bookie = Bookie(cfg)
        await bookie.start()
        try:
            server = SimpleNamespace(config=cfg, processor=RequestProcessor(bookie, cfg), connections=set())
            conn = BookieConnection(server)
            conn.connection_made(transport := FakeTransport())
            decoder = FrameDecoder()

            async def answers(n):
                got = []
                while len(got) < n:
                    await asyncio.sleep(0.005)
                    got += decoder.feed_responses(b"".join(transport.out))
                    transport.out.clear()
                return sorted((r.entry_id, r.rc) for r in got)

            # a batch under the limit, completed in two parts (the EUA at once, the rest when durable)
            wrong_key = add_frame(30, 99, key=master_key(b"no"))
            conn.data_received(b"".join([add_frame(30, 0), add_frame(30, 1), wrong_key, add_frame(30, 2)]))
            assert await answers(4) == [(0, 0), (1, 0), (2, 0), (99, StatusCode.EUA)]
            assert (conn.pending, conn.pending_bytes, conn.idle.is_set()) == (0, 0, True)
            # 10 adds, limit 2 x 4: with the journal on, 8 are in flight and 2 refused (reading
            # paused meanwhile); journal off, each completes at once and frees its slot
            conn.data_received(b"".join(add_frame(30, e) for e in range(3, 13)))
            assert transport.paused == journal
            refused = [(e, StatusCode.ETOOMANYREQUESTS) for e in (11, 12)] if journal else []
            ok = [(e, 0) for e in range(3, 11 if journal else 13)]
            assert await answers(10) == sorted(ok + refused)
            assert (conn.pending, conn.pending_bytes, conn.idle.is_set(), transport.paused) == (0, 0, True, False)
        finally:
            await bookie.stop()
    asyncio.run(main())
