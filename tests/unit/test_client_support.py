"""Fake bookies for the client tests, and tests of the fakes themselves.

`FakeBookie` is an asyncio server on 127.0.0.1 speaking the v2 wire protocol
through bk.proto (FrameDecoder.feed_requests, encode_response), backed by a
dict. It follows the bookie rules the client depends on (master key set once,
EUA on a different key, fencing, EFENCED for normal adds of a fenced ledger,
READ of -1 = last entry answered under entry id -1) and can misbehave on
demand:
- `add_hook(req)` / `read_hook(req)` (reads and batch reads): return an rc
  to answer with, DROP to never answer, or None for normal processing;
- `hold()` / `release(reverse=False)`: queue answers and send them later
  (optionally in reverse order: out-of-order answers);
- `corrupt(ledger, entry)`: serve that entry with a flipped payload byte;
- `gate_reads(predicate)`: answers to matching READs wait until the returned
  asyncio.Event is set (answers to other requests go out meanwhile);
- `limbo(ledger)`: answer like a BP-46 bookie whose ledger is in limbo (entries
  it has are served; READ of -1 and missing entries: EUNKNOWNLEDGERSTATE);
- `stop()` / `start()` (same port) / `kill_connections()`.
Every request is logged in `requests` as (op name, ledger_id, entry_id).

`FakeCluster` puts N fake bookies on a fresh in-memory metadata store
(mem://), registered like real bookies (each with its own session), and can
switch one to read-only or unregister it.
"""
from __future__ import annotations

import asyncio
import functools
import uuid

import pytest

from bk.eventloop import loop_factory
from bk.meta import open_store
from bk.meta.cluster import init_new_cluster
from bk.meta.registration import RegistrationManager
from bk.proto import (
    FLAG_DO_FENCING, FLAG_RECOVERY_ADD, AddRequest, AddResponse, BatchReadRequest, BatchReadResponse,
    FrameDecoder, GetBookieInfoRequest, GetBookieInfoResponse, ReadLacRequest, ReadLacResponse, ReadRequest,
    ReadResponse, RequestDecodeError, StatusCode, WriteLacRequest, WriteLacResponse, encode_response,
    error_response_for,
)

DROP = "drop"
WAIT_S = 20.0  # bound for something that must happen (never a timing assertion)
EOK, ENOLEDGER, ENOENTRY = 0, int(StatusCode.ENOLEDGER), int(StatusCode.ENOENTRY)


def run_async(fn):
    """Run an async test on a fresh uvloop event loop, bounded."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            return runner.run(asyncio.wait_for(fn(*args, **kwargs), 120))

    return wrapper


async def until(predicate, what: str = "condition", wait_s: float = WAIT_S):
    """Poll a (sync or async) predicate until true; fails the test after wait_s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


class _FakeConnection(asyncio.Protocol):
    def __init__(self, bookie: "FakeBookie"):
        self.bookie = bookie
        self.decoder = FrameDecoder()
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport
        self.bookie.connections.add(self)

    def connection_lost(self, exc):
        self.bookie.connections.discard(self)

    def data_received(self, data):
        for req in self.decoder.feed_requests(data):
            self.bookie._handle(self, req)

    def send(self, frame: bytes):
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(frame)


class FakeBookie:
    def __init__(self):
        self.entries: dict[tuple[int, int], bytes] = {}
        self.keys: dict[int, bytes] = {}
        self.fenced: set[int] = set()
        self.lac_bufs: dict[int, bytes] = {}
        self.corrupted: set[tuple[int, int]] = set()
        self.requests: list[tuple[str, int, int]] = []
        self.add_hook = None
        self.read_hook = None
        self.connections: set[_FakeConnection] = set()
        self.server = None
        self.port = 0
        self._held: list | None = None
        self._gate = None  # (predicate, asyncio.Event)
        self._later: set = set()

    @property
    def bookie_id(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> "FakeBookie":
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: _FakeConnection(self), "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            self.kill_connections()
            await self.server.wait_closed()
            self.server = None

    def kill_connections(self) -> None:
        for conn in list(self.connections):
            conn.transport.abort()

    def hold(self) -> None:
        if self._held is None:
            self._held = []

    def release(self, reverse: bool = False) -> int:
        held, self._held = self._held or [], None
        for conn, frame in reversed(held) if reverse else held:
            conn.send(frame)
        return len(held)

    @property
    def held(self) -> int:
        return len(self._held or ())

    def corrupt(self, ledger_id: int, entry_id: int) -> None:
        self.corrupted.add((ledger_id, entry_id))

    def gate_reads(self, predicate) -> asyncio.Event:
        event = asyncio.Event()
        self._gate = (predicate, event)
        return event

    def limbo(self, ledger_id: int) -> None:
        limbo = int(StatusCode.EUNKNOWNLEDGERSTATE)

        def hook(req):
            if req.ledger_id == ledger_id and (req.entry_id == -1 or (ledger_id, req.entry_id) not in self.entries):
                return limbo
            return None

        self.read_hook = hook

    def ledger_entries(self, ledger_id: int) -> dict[int, bytes]:
        return {e: body for (lid, e), body in self.entries.items() if lid == ledger_id}

    # ------------------------------------------------------------ serving
    def _answer(self, conn, frame: bytes) -> None:
        if self._held is not None:
            self._held.append((conn, frame))
        else:
            conn.send(frame)

    async def _answer_later(self, event: asyncio.Event, conn, frame: bytes) -> None:
        await event.wait()
        self._answer(conn, frame)

    def _handle(self, conn, req) -> None:
        if isinstance(req, RequestDecodeError):
            self._answer(conn, error_response_for(req))
            return
        if isinstance(req, AddRequest):
            self.requests.append(("add", req.ledger_id, req.entry_id))
            rc = self.add_hook(req) if self.add_hook else None
            if rc == DROP:
                return
            if rc is None:
                rc = self._add(req)
            self._answer(conn, encode_response(AddResponse(rc, req.ledger_id, req.entry_id)))
        elif isinstance(req, ReadRequest):
            self.requests.append(("fence" if req.flags & FLAG_DO_FENCING else "read", req.ledger_id, req.entry_id))
            rc = self.read_hook(req) if self.read_hook else None
            if rc == DROP:
                return
            if rc is not None:
                frame = encode_response(ReadResponse(rc, req.ledger_id, req.entry_id))
            else:
                frame = encode_response(self._read(req))
            if self._gate is not None and self._gate[0](req):
                task = asyncio.ensure_future(self._answer_later(self._gate[1], conn, frame))
                self._later.add(task)
                task.add_done_callback(self._later.discard)
                return
            self._answer(conn, frame)
        elif isinstance(req, BatchReadRequest):
            self.requests.append(("batch", req.ledger_id, req.start_entry_id))
            rc = self.read_hook(req) if self.read_hook else None
            if rc == DROP:
                return
            if rc is not None:
                self._answer(conn, encode_response(
                    BatchReadResponse(rc, req.ledger_id, req.start_entry_id, req.request_id, [])))
                return
            entries = []
            for eid in range(req.start_entry_id, req.start_entry_id + max(1, req.max_count)):
                body = self._stored(req.ledger_id, eid)
                if body is None:
                    break
                entries.append(body)
            rc = EOK if entries else (ENOENTRY if self._has_ledger(req.ledger_id) else ENOLEDGER)
            self._answer(conn, encode_response(
                BatchReadResponse(rc, req.ledger_id, req.start_entry_id, req.request_id, entries)))
        elif isinstance(req, ReadLacRequest):
            self.requests.append(("read_lac", req.ledger_id, -1))
            last = self._last(req.ledger_id)
            self._answer(conn, encode_response(ReadLacResponse(
                EOK if self._has_ledger(req.ledger_id) else ENOLEDGER, req.ledger_id,
                self.lac_bufs.get(req.ledger_id), self._stored(req.ledger_id, last) if last is not None else None)))
        elif isinstance(req, WriteLacRequest):
            self.requests.append(("write_lac", req.ledger_id, req.lac))
            rc = self._check_key(req.ledger_id, req.master_key)
            if rc == EOK:
                self.lac_bufs[req.ledger_id] = req.lac_buf
            self._answer(conn, encode_response(WriteLacResponse(rc, req.ledger_id)))
        elif isinstance(req, GetBookieInfoRequest):
            self._answer(conn, encode_response(GetBookieInfoResponse(EOK, 1 << 30, 1 << 31)))

    def _check_key(self, ledger_id: int, key: bytes) -> int:
        known = self.keys.setdefault(ledger_id, key)
        return EOK if known == key else int(StatusCode.EUA)

    def _add(self, req: AddRequest) -> int:
        rc = self._check_key(req.ledger_id, req.master_key)
        if rc != EOK:
            return rc
        if req.ledger_id in self.fenced and not req.flags & FLAG_RECOVERY_ADD:
            return int(StatusCode.EFENCED)
        self.entries[(req.ledger_id, req.entry_id)] = req.body
        return EOK

    def _has_ledger(self, ledger_id: int) -> bool:
        return ledger_id in self.keys or any(lid == ledger_id for lid, _ in self.entries)

    def _last(self, ledger_id: int):
        ids = [e for lid, e in self.entries if lid == ledger_id]
        return max(ids) if ids else None

    def _stored(self, ledger_id: int, entry_id: int):
        body = self.entries.get((ledger_id, entry_id))
        if body is not None and (ledger_id, entry_id) in self.corrupted:
            body = body[:-1] + bytes([body[-1] ^ 0xFF]) if len(body) > 32 else body[:8] + b"\xff" * 8 + body[16:]
        return body

    def _read(self, req: ReadRequest) -> ReadResponse:
        lid = req.ledger_id
        if req.flags & FLAG_DO_FENCING:
            rc = self._check_key(lid, req.master_key)
            if rc != EOK:
                return ReadResponse(rc, lid, req.entry_id)
            self.fenced.add(lid)
        if not self._has_ledger(lid):
            return ReadResponse(ENOLEDGER, lid, req.entry_id)
        eid = self._last(lid) if req.entry_id == -1 else req.entry_id
        body = self._stored(lid, eid) if eid is not None else None
        if body is None:
            return ReadResponse(ENOENTRY, lid, req.entry_id)
        return ReadResponse(EOK, lid, req.entry_id, body)


class FakeCluster:
    """N fake bookies registered on a fresh in-memory metadata store."""

    def __init__(self, bookies: int = 3):
        self.count = bookies
        self.metadata_uri = f"mem://client-{uuid.uuid4().hex[:12]}/ledgers"
        self.bookies: list[FakeBookie] = []
        self.registrations: dict[str, RegistrationManager] = {}
        self.store = None

    async def __aenter__(self) -> "FakeCluster":
        self.store = await open_store(self.metadata_uri)
        await init_new_cluster(self.store)
        for _ in range(self.count):
            await self.add_bookie()
        return self

    async def __aexit__(self, *exc) -> None:
        for bookie in self.bookies:
            await bookie.stop()
        for rm in self.registrations.values():
            await rm.close()
            await rm.store.close()
        await self.store.close()

    async def add_bookie(self, readonly: bool = False) -> FakeBookie:
        bookie = await FakeBookie().start()
        self.bookies.append(bookie)
        rm = RegistrationManager(await open_store(self.metadata_uri))
        self.registrations[bookie.bookie_id] = rm
        await rm.register(bookie.bookie_id, readonly=readonly)
        return bookie

    def by_id(self, bookie_id: str) -> FakeBookie:
        return next(b for b in self.bookies if b.bookie_id == bookie_id)

    async def set_readonly(self, bookie: FakeBookie, readonly: bool = True) -> None:
        await self.registrations[bookie.bookie_id].register(bookie.bookie_id, readonly=readonly)

    async def kill(self, bookie: FakeBookie) -> None:
        """Stop the bookie and remove its registration (as its session would expire)."""
        await bookie.stop()
        await self.registrations[bookie.bookie_id].unregister(bookie.bookie_id)


# ---------------------------------------------------------------------- the fakes' own tests
@run_async
async def test_fake_cluster_registers_writable_and_readonly_bookies():
    async with FakeCluster(3) as cluster:
        rm = RegistrationManager(cluster.store)
        assert sorted(await rm.writable_bookies()) == sorted(b.bookie_id for b in cluster.bookies)
        await cluster.set_readonly(cluster.bookies[0])
        assert cluster.bookies[0].bookie_id not in await rm.writable_bookies()
        assert await rm.readonly_bookies() == [cluster.bookies[0].bookie_id]
        await cluster.kill(cluster.bookies[1])
        assert cluster.bookies[1].bookie_id not in await rm.writable_bookies()


@run_async
async def test_fake_bookie_keeps_the_first_key_and_fences():
    from bk.client.bookie_client import BookieClient
    from bk.client.quorum import AddFramer
    from bk.proto import DigestManager, master_key

    bookie = await FakeBookie().start()
    try:
        client = BookieClient(bookie.bookie_id)
        framer = AddFramer(DigestManager(7, "CRC32C"), master_key(b"a"), 1 << 20)
        r = await client.call(client.send_add, framer.frame(0, -1, 1, b"x"), 7, 0)
        assert r.rc == EOK
        other = AddFramer(DigestManager(7, "CRC32C"), master_key(b"b"), 1 << 20)
        assert (await client.call(client.send_add, other.frame(1, -1, 2, b"y"), 7, 1)).rc == StatusCode.EUA
        fence = await client.call(client.send_read, 7, -1, flags=FLAG_DO_FENCING, master_key=master_key(b"a"))
        assert fence.rc == EOK and fence.entry_id == -1 and 7 in bookie.fenced
        assert (await client.call(client.send_add, framer.frame(1, 0, 2, b"y"), 7, 1)).rc == StatusCode.EFENCED
        client.close()
    finally:
        await bookie.stop()


def test_run_async_uses_a_fresh_loop():
    seen = []

    @run_async
    async def probe():
        seen.append(asyncio.get_running_loop())

    probe()
    probe()
    assert len(seen) == 2 and seen[0] is not seen[1]
    with pytest.raises(AssertionError):
        run_async(until)(lambda: False, "never", 0.01)
