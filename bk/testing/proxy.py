"""A fault-injecting loopback TCP proxy for BookKeeper v2 traffic.

Put a `Proxy` in front of a bookie, let clients use its port, and make the
network misbehave on purpose (`ThreadedProxy`: the same API, blocking, with
its own event loop in a thread, for tests driving bookie processes):

    async with Proxy("127.0.0.1", bookie_port) as proxy:
        proxy.add_rule(Rule(direction="up", match=fencing_read(ledger_id), action="drop"))
        proxy.add_rule(Rule(direction="up", match=add_request(ledger_id, entry_id=7), action="hold"))
        await proxy.wait_held(1)      # the add reached the proxy and is held
        proxy.release_held()          # ... and now reaches the bookie

To route a bookie id `127.0.0.1:P` through a proxy, bind the bookie to another
loopback address (bind_address 127.0.0.2, port P) and listen on 127.0.0.1:P.

"up" is client -> bookie (frames decoded with bk.proto.decode_request), "down"
bookie -> client (decode_response). Each accepted connection gets a
ConnectionInfo (counter id, client host/port); rules may be limited to some.
The first matching rule (insertion order) decides; no match = pass:
- pass:  forward (exempts frames from later rules);   drop: discard silently;
- hold:  set aside, later frames pass it; `release_held()` sends held frames
         in hold order, `discard_held()` loses them;
- delay: forward after `delay_s`; the stream stays FIFO, so frames behind a
         delayed one wait too (a slow link, not a reordering one);
- close: read no more from that side, deliver what was queued before the
         frame, then close both sides (FIN); reset: abort both now (RST).
A rule with `match=None` sees every frame, undecodable ones included; a
predicate sees decoded messages only, and one that raises does not match.

Invariants:
- Forwarded bytes are never changed. A length prefix that is negative or
  above `max_frame_size_bytes` switches that direction to raw mode: chunks go
  through as they arrive, seen only by `match=None` rules. An incomplete
  frame at EOF is forwarded too.
- Per connection and direction, everything not held keeps its order.
- Bounded memory: besides held frames, a direction buffers one partial frame
  and at most `max_queued_bytes` awaiting write; while that is full the proxy
  stops reading, so TCP pushes back on the sender.
- Blackhole stops all reading and forwarding without closing anything; new
  connections are accepted but not connected onward. Lifting it resumes the
  intact streams (as TCP does after a partition heals); drop rules lose bytes.
- EOF from either side closes the connection once what that side sent before
  it is delivered (BookKeeper peers never half-close). Held frames of a closed
  connection are discarded. `stop()` closes the listener and everything.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Callable, Container

from bk.proto.codec import decode_request, decode_response
from bk.proto.constants import DEFAULT_MAX_FRAME_SIZE_BYTES, FLAG_DO_FENCING, FLAG_RECOVERY_ADD
from bk.proto.messages import AddRequest, AddResponse, BatchReadRequest, ReadRequest, ReadResponse

UP, DOWN = "up", "down"
DIRECTIONS = (UP, DOWN)
ACTIONS = ("pass", "drop", "hold", "delay", "close", "reset")
_READ_CHUNK_BYTES = 64 * 1024
_i32 = struct.Struct(">i")
_STAT_KEYS = ("frames", "bytes", "passed", "dropped", "held", "delayed", "released", "discarded",
              "closes", "undecodable", "raw_chunks", "match_errors")
_COUNTER = {"pass": "passed", "drop": "dropped", "hold": "held", "delay": "delayed", "close": "closes",
            "reset": "closes"}


@dataclass(frozen=True)
class ConnectionInfo:
    """One accepted client connection: `id` counts from 1 per proxy."""

    id: int
    client_host: str
    client_port: int


@dataclass(eq=False)
class Rule:
    """What to do with frames of `direction` ("up", "down" or "both") that match.

    `match(msg) -> bool` gets the decoded bk.proto message (None = every frame);
    `connection` is None (all), a connection id, or a predicate on ConnectionInfo;
    `once` removes the rule after its first hit. `hits` counts matched frames.
    """

    direction: str = UP
    match: Callable[[object], bool] | None = None
    action: str = "drop"
    delay_s: float = 0.0
    once: bool = False
    connection: int | Callable[[ConnectionInfo], bool] | None = None
    hits: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.direction not in (UP, DOWN, "both"):
            raise ValueError(f"rule direction must be 'up', 'down' or 'both', got {self.direction!r}")
        if self.action not in ACTIONS:
            raise ValueError(f"rule action must be one of {ACTIONS}, got {self.action!r}")
        if not isinstance(self.delay_s, (int, float)) or self.delay_s < 0:
            raise ValueError(f"delay_s must be a number >= 0, got {self.delay_s!r}")
        if self.match is not None and not callable(self.match):
            raise ValueError("match must be a callable taking a decoded message, or None")

    def _applies(self, direction: str, conn: ConnectionInfo) -> bool:
        return self.direction in ("both", direction) and _selected(self.connection, conn)


def _selected(connection, conn: ConnectionInfo) -> bool:
    """`connection` is None (every connection), a connection id, or a predicate on ConnectionInfo."""
    if connection is None:
        return True
    return connection == conn.id if isinstance(connection, int) else bool(connection(conn))


# ------------------------------------------------------------------ matchers
def _id_ok(want, got) -> bool:
    return want is None or (got == want if isinstance(want, int) else got in want)


def _matcher(types, ledger_id, entry_id, flag: int = 0, flag_set: bool | None = None, rc: int | None = None):
    def match(m) -> bool:
        return (isinstance(m, types) and _id_ok(ledger_id, m.ledger_id) and _id_ok(entry_id, m.entry_id)
                and (flag_set is None or bool(m.flags & flag) == flag_set) and (rc is None or m.rc == rc))
    return match


def add_request(ledger_id: int | None = None, entry_id: int | Container[int] | None = None,
                recovery: bool | None = None) -> Callable[[object], bool]:
    """ADD requests, optionally of one ledger / some entry ids / with or without FLAG_RECOVERY_ADD."""
    return _matcher(AddRequest, ledger_id, entry_id, FLAG_RECOVERY_ADD, recovery)


def read_request(ledger_id: int | None = None, entry_id: int | Container[int] | None = None,
                 fencing: bool | None = None) -> Callable[[object], bool]:
    """READ and BATCH_READ requests; `fencing` filters on FLAG_DO_FENCING."""
    return _matcher((ReadRequest, BatchReadRequest), ledger_id, entry_id, FLAG_DO_FENCING, fencing)


def fencing_read(ledger_id: int | None = None) -> Callable[[object], bool]:
    """Reads carrying FLAG_DO_FENCING: recovery's fence (entry -1) and its recovery reads."""
    return read_request(ledger_id, fencing=True)


def add_response(ledger_id: int | None = None, entry_id: int | Container[int] | None = None,
                 rc: int | None = None) -> Callable[[object], bool]:
    """ADD responses, optionally of one ledger / some entry ids / one return code."""
    return _matcher(AddResponse, ledger_id, entry_id, rc=rc)


def read_response(ledger_id: int | None = None, entry_id: int | Container[int] | None = None,
                  rc: int | None = None) -> Callable[[object], bool]:
    return _matcher(ReadResponse, ledger_id, entry_id, rc=rc)


# ------------------------------------------------------------------ plumbing
class _Pump:
    """One direction of one connection: read loop -> judge -> FIFO queue -> write loop."""

    def __init__(self, conn: "_Connection", direction: str, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter):
        self.conn, self.direction, self.reader, self.writer = conn, direction, reader, writer
        self.buf = bytearray()  # an incomplete frame
        self.raw = False  # a bad length prefix made the stream unsplittable: forward chunks as they come
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()  # (send_at, frame)
        self.queued_bytes = 0
        self.held: list[tuple[bytes, object]] = []  # (frame, decoded message or None)
        self.wakeup, self.room = asyncio.Event(), asyncio.Event()  # queue not empty / below max_queued_bytes
        self.room.set()
        self.eof = False
        self.closing = False  # a close rule fired: read no further, close when the queue reaches it

    def enqueue(self, frame: bytes | None, send_at: float = 0.0) -> None:
        self.queue.append((send_at, frame))
        self.queued_bytes += len(frame or b"")
        if self.queued_bytes >= self.conn.proxy.max_queued_bytes:
            self.room.clear()
        self.wakeup.set()

    def split(self, data: bytes) -> list[tuple[bytes, bool]]:
        """(frame, framed) for each whole frame (prefix included, bytes unchanged) or raw chunk."""
        if self.raw:
            return [(bytes(data), False)]
        buf = self.buf
        buf += data
        out, pos, n, limit = [], 0, len(buf), self.conn.proxy.max_frame_size_bytes
        mv = memoryview(buf)
        while n - pos >= 4:
            (length,) = _i32.unpack_from(mv, pos)
            if length < 0 or length > limit:
                self.raw = True
                out.append((bytes(mv[pos:]), False))
                pos = n
                break
            if pos + 4 + length > n:
                break
            out.append((bytes(mv[pos:pos + 4 + length]), True))
            pos += 4 + length
        mv.release()  # a live export would forbid resizing the buffer
        del buf[:pos]
        return out

    async def read_loop(self) -> None:
        proxy = self.conn.proxy
        try:
            while True:
                await self.room.wait()
                await proxy._healed.wait()
                data = await self.reader.read(_READ_CHUNK_BYTES)
                if not data:
                    break
                for frame, framed in self.split(data):
                    if self.conn.closed or self.closing:
                        return
                    proxy._judge(self, frame, framed)
            if self.buf:  # an incomplete frame at EOF: forward it as it is
                proxy._judge(self, bytes(self.buf), False)
        except (ConnectionError, OSError):
            self.conn.close()
            return
        self.eof = True
        self.wakeup.set()

    async def write_loop(self) -> None:
        proxy = self.conn.proxy
        loop = asyncio.get_running_loop()
        try:
            while True:
                while not self.queue:
                    if self.eof:
                        self.conn.close()  # this side ended and everything before the end is delivered
                        return
                    self.wakeup.clear()
                    await self.wakeup.wait()
                send_at, frame = self.queue[0]
                wait_s = send_at - loop.time()
                if wait_s > 0:
                    await asyncio.sleep(wait_s)
                await proxy._healed.wait()
                self.queue.popleft()
                if frame is None:
                    self.conn.close()
                    return
                self.queued_bytes -= len(frame)
                if self.queued_bytes < proxy.max_queued_bytes:
                    self.room.set()
                self.writer.write(frame)
                await self.writer.drain()
        except (ConnectionError, OSError):
            self.conn.close()


class _Connection:
    def __init__(self, proxy: "Proxy", info: ConnectionInfo, client_reader, client_writer):
        self.proxy, self.info, self.client_reader, self.client_writer = proxy, info, client_reader, client_writer
        self.upstream_writer: asyncio.StreamWriter | None = None
        self.pumps: dict[str, _Pump] = {}
        self.tasks: list[asyncio.Task] = []
        self.closed = False
        self.done = asyncio.Event()

    async def run(self) -> None:
        proxy = self.proxy
        try:
            if not proxy._healed.is_set():  # a blackholed proxy accepts but does not connect onward
                waits = [asyncio.ensure_future(proxy._healed.wait()), asyncio.ensure_future(self.done.wait())]
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                for w in waits:
                    w.cancel()
                if self.closed:
                    return
            try:
                up_reader, up_writer = await asyncio.open_connection(proxy.target_host, proxy.target_port)
            except OSError:
                self.close()  # the target is down: the client sees its connection closed
                return
            if self.closed:
                up_writer.close()
                return
            self.upstream_writer = up_writer
            self.pumps = {UP: _Pump(self, UP, self.client_reader, up_writer),
                          DOWN: _Pump(self, DOWN, up_reader, self.client_writer)}
            for pump in self.pumps.values():
                self.tasks.append(asyncio.ensure_future(pump.read_loop()))
                self.tasks.append(asyncio.ensure_future(pump.write_loop()))
            await self.done.wait()
        finally:
            self.close()
            if self.tasks:
                await asyncio.gather(*self.tasks, return_exceptions=True)

    def close(self, reset: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        for pump in self.pumps.values():
            self.proxy._count(pump.direction, "discarded", len(pump.held))
            pump.held.clear()
        me = asyncio.current_task()
        for task in self.tasks:
            if task is not me:
                task.cancel()
        for writer in (self.client_writer, self.upstream_writer):
            if writer is None:
                continue
            if reset:
                sock = writer.get_extra_info("socket")
                try:
                    if sock is not None:  # linger 0: close sends RST instead of FIN
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass
                writer.transport.abort()
            else:
                writer.close()
        self.proxy._connections.pop(self.info.id, None)
        self.done.set()
        self.proxy._notify()


# ------------------------------------------------------------------ the proxy
class Proxy:
    """Loopback TCP proxy in front of one bookie; runs in the caller's event loop."""

    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1", listen_port: int = 0,
                 *, max_frame_size_bytes: int = DEFAULT_MAX_FRAME_SIZE_BYTES,
                 max_queued_bytes: int = 8 * 1024 * 1024):
        if max_queued_bytes < 1:
            raise ValueError(f"max_queued_bytes must be >= 1, got {max_queued_bytes}")
        self.target_host, self.target_port = target_host, int(target_port)
        self.listen_host, self.listen_port = listen_host, int(listen_port)
        self.max_frame_size_bytes, self.max_queued_bytes = max_frame_size_bytes, max_queued_bytes
        self.rules: list[Rule] = []
        self._server: asyncio.base_events.Server | None = None
        self._connections: dict[int, _Connection] = {}
        self._handlers: set[asyncio.Task] = set()
        self._ids = itertools.count(1)
        self._accepted = 0
        self._healed: asyncio.Event | None = None
        self._blackhole = self._stopped = False
        self._stats = {d: dict.fromkeys(_STAT_KEYS, 0) for d in DIRECTIONS}
        self._waiters: list[tuple[Callable[[], bool], asyncio.Future]] = []

    # -- lifecycle
    async def start(self) -> "Proxy":
        if self._server is not None:
            raise RuntimeError("proxy already started")
        self._healed, self._stopped = asyncio.Event(), False
        if not self._blackhole:
            self._healed.set()
        self._server = await asyncio.start_server(self._accept, self.listen_host, self.listen_port)
        self.listen_port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def port(self) -> int:
        """The port clients connect to (known after start())."""
        return self.listen_port

    @property
    def address(self) -> str:
        """`host:port` of the listener, the form bookie ids take."""
        return f"{self.listen_host}:{self.listen_port}"

    async def stop(self) -> None:
        """Close the listener and every connection; held frames are forgotten. Idempotent."""
        server, self._server, self._stopped = self._server, None, True
        if server is not None:
            server.close()
        for conn in list(self._connections.values()):
            conn.close()  # each handler returns once its connection is closed (never cancel a
        handlers = list(self._handlers)  # stream callback task: 3.11's streams log that as an error)
        if handlers:
            await asyncio.gather(*handlers, return_exceptions=True)
        if server is not None:
            await server.wait_closed()
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(RuntimeError("proxy stopped"))

    __aenter__ = start

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername") or ("?", 0)
        info = ConnectionInfo(next(self._ids), str(peer[0]), int(peer[1]))
        conn = _Connection(self, info, reader, writer)
        if self._stopped:  # raced stop()
            writer.close()
            return
        self._connections[info.id] = conn
        self._accepted += 1
        task = asyncio.current_task()
        self._handlers.add(task)
        self._notify()
        try:
            await conn.run()
        finally:
            self._handlers.discard(task)

    # -- rules
    def add_rule(self, rule: Rule) -> Rule:
        self.rules.append(rule)
        return rule

    def remove_rule(self, rule: Rule) -> None:
        if rule in self.rules:
            self.rules.remove(rule)

    def clear_rules(self) -> None:
        """Back to pass-through for new frames (held frames stay held)."""
        self.rules.clear()

    def set_blackhole(self, on: bool) -> None:
        self._blackhole = bool(on)
        if self._healed is not None:
            (self._healed.clear if on else self._healed.set)()

    def _judge(self, pump: _Pump, frame: bytes, framed: bool) -> None:
        direction, conn = pump.direction, pump.conn
        st = self._stats[direction]
        st["frames"] += 1
        st["bytes"] += len(frame)
        msg = None
        if framed:
            try:
                msg = (decode_request if direction == UP else decode_response)(memoryview(frame)[4:])
            except Exception:  # malformed content: forwarded untouched, only match=None rules see it
                st["undecodable"] += 1
        else:
            st["raw_chunks"] += 1
        rule = self._first_match(direction, conn.info, msg)
        action = rule.action if rule is not None else "pass"
        st[_COUNTER[action]] += 1
        if action == "pass":
            pump.enqueue(frame)
        elif action == "hold":
            pump.held.append((frame, msg))
        elif action == "delay":
            pump.enqueue(frame, asyncio.get_running_loop().time() + rule.delay_s)
        elif action == "close":  # FIN once everything queued before this frame is written
            pump.closing = True
            pump.enqueue(None)
        elif action == "reset":  # RST now: whatever is queued is lost
            conn.close(reset=True)
        self._notify()

    def _first_match(self, direction: str, conn: ConnectionInfo, msg) -> Rule | None:
        for rule in self.rules:
            if not rule._applies(direction, conn):
                continue
            if rule.match is not None:
                if msg is None:
                    continue
                try:
                    if not rule.match(msg):
                        continue
                except Exception:
                    self._stats[direction]["match_errors"] += 1
                    continue
            rule.hits += 1
            if rule.once:
                self.remove_rule(rule)
            return rule
        return None

    # -- held frames
    def release_held(self, direction: str | None = None, connection=None,
                     match: Callable[[object], bool] | None = None) -> int:
        """Send held frames (of one direction / connection / matching) in the order they were held."""
        return self._take_held(direction, connection, match, release=True)

    def discard_held(self, direction: str | None = None, connection=None,
                     match: Callable[[object], bool] | None = None) -> int:
        """Forget held frames: they are lost, as if dropped."""
        return self._take_held(direction, connection, match, release=False)

    def _take_held(self, direction, connection, match, release: bool) -> int:
        n = 0
        for conn in list(self._connections.values()):
            for d, pump in conn.pumps.items():
                if direction not in (None, d) or not _selected(connection, conn.info):
                    continue
                keep, chosen = [], []
                for item in pump.held:
                    (chosen if match is None or _safe_match(match, item[1]) else keep).append(item)
                pump.held = keep
                for frame, _ in chosen if release else ():
                    pump.enqueue(frame)
                self._count(d, "released" if release else "discarded", len(chosen))
                n += len(chosen)
        self._notify()
        return n

    def held(self, direction: str | None = None) -> list[tuple[ConnectionInfo, str, object]]:
        """(connection, direction, decoded message or None) of every held frame, in hold order per stream."""
        return [(conn.info, d, msg) for conn in list(self._connections.values())
                for d, pump in conn.pumps.items() if direction in (None, d) for _, msg in pump.held]

    def held_count(self, direction: str | None = None) -> int:
        return len(self.held(direction))

    # -- connections and statistics
    def connections(self) -> list[ConnectionInfo]:
        return [conn.info for conn in list(self._connections.values())]

    def close_connections(self, connection=None, reset: bool = False) -> int:
        """Close (FIN) or reset (RST) the selected connections; returns how many."""
        chosen = [conn for conn in list(self._connections.values()) if _selected(connection, conn.info)]
        for conn in chosen:
            conn.close(reset=reset)
        return len(chosen)

    def stats(self) -> dict:
        """Per-direction counters plus connection counts (a copy)."""
        out = {d: dict(v) for d, v in self._stats.items()}
        out["connections_open"] = len(self._connections)
        out["connections_total"] = self._accepted
        return out

    def _count(self, direction: str, key: str, n: int) -> None:
        self._stats[direction][key] += n

    # -- waiting for the network to reach a state
    def _notify(self) -> None:
        for pred, fut in self._waiters:
            if not fut.done():
                try:
                    if pred():
                        fut.set_result(True)
                except Exception as e:
                    fut.set_exception(e)

    async def wait_until(self, predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
        """Return once `predicate()` holds (checked after every frame and connection event)."""
        if predicate():
            return
        fut = asyncio.get_running_loop().create_future()
        item = (predicate, fut)
        self._waiters.append(item)
        try:
            async with asyncio.timeout(timeout_s):
                await fut
        except asyncio.TimeoutError:
            raise TimeoutError(f"proxy condition not reached within {timeout_s} s; stats {self.stats()}") from None
        finally:
            self._waiters.remove(item)

    async def wait_held(self, count: int = 1, direction: str | None = None, timeout_s: float = 10.0) -> None:
        await self.wait_until(lambda: self.held_count(direction) >= count, timeout_s)

    async def wait_hits(self, rule: Rule, count: int = 1, timeout_s: float = 10.0) -> None:
        await self.wait_until(lambda: rule.hits >= count, timeout_s)

    async def wait_connections(self, count: int = 1, timeout_s: float = 10.0) -> None:
        await self.wait_until(lambda: len(self._connections) >= count, timeout_s)


def _safe_match(match, msg) -> bool:
    if msg is None:
        return False
    try:
        return bool(match(msg))
    except Exception:
        return False


class ThreadedProxy:
    """The same proxy driven from synchronous code: its own event loop in a daemon thread.

    Proxy's methods (`_CALLS`, `_WAITS`) run in that loop and block until done;
    rule predicates run in that thread; the waits raise TimeoutError.
    """

    _CALLS = frozenset(("add_rule", "remove_rule", "clear_rules", "set_blackhole", "release_held", "discard_held",
                        "held", "held_count", "connections", "close_connections", "stats"))
    _WAITS = frozenset(("wait_until", "wait_held", "wait_hits", "wait_connections"))

    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1", listen_port: int = 0,
                 **kwargs):
        self.proxy = Proxy(target_host, target_port, listen_host, listen_port, **kwargs)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> "ThreadedProxy":
        if self._thread is not None:
            raise RuntimeError("proxy already started")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="bk-proxy", daemon=True)
        self._thread.start()
        try:
            self._run(self.proxy.start())
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        try:
            if self.proxy._server is not None:
                self._run(self.proxy.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
            self._thread = None

    def __enter__(self) -> "ThreadedProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self, coro):
        if self._thread is None:
            coro.close()
            raise RuntimeError("proxy is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _call(self, fn, *args, **kwargs):
        async def call():
            return fn(*args, **kwargs)
        return self._run(call())

    port = property(lambda self: self.proxy.port)
    address = property(lambda self: self.proxy.address)
    rules = property(lambda self: self._call(lambda: list(self.proxy.rules)))

    def __getattr__(self, name: str):
        if name in ThreadedProxy._WAITS:
            return lambda *args, **kwargs: self._run(getattr(self.proxy, name)(*args, **kwargs))
        if name in ThreadedProxy._CALLS:
            return lambda *args, **kwargs: self._call(getattr(self.proxy, name), *args, **kwargs)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
