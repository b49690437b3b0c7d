"""Per-bookie connections: one asyncio connection per bookie, many requests in flight.

`BookieClient` owns the connection to one bookie; `BookieClientPool` hands out
one client per bookie id. Requests are callback based (no task or future per
request on the add path): `callback(response, error)` gets exactly one of a
decoded response message or an exception, exactly once.

Matching (v2 has no transaction id, PROTOCOL.md): a response is matched to the
oldest pending request with the same key - `(ADD, ledger, entry)`,
`(READ, ledger, entry)`, `(BATCH_READ, request_id)`, `(READ_LAC, ledger)`,
`(WRITE_LAC, ledger)`, `(GET_BOOKIE_INFO,)`. Two requests with one key carry the
same question, so even when a bookie answers them out of order each answer is
a correct answer to either. A READ of entry -1 is matched under entry -1; an
answer naming a real entry id with no request under that id falls back to a
pending `-1` read of the ledger.

Invariants:
- Writes are coalesced: frames queued during one loop iteration leave in one
  `writelines` call (and frames queued while connecting leave on connect).
- Connection loss (or a malformed response, which drops the connection) fails
  every pending request of that bookie with BookieConnectionError; the next
  request reconnects on demand.
- Timeouts are swept, not armed per request: a pending request is a
  `(callback, deadline)` pair in the pending table, and one timer per client
  walks the table every `timeout / 8` (at most 0.5 s) and expires what is due.
  No per-request timer, task or queue entry: an answered request is gone at
  once (nothing keeps it alive for the cyclic GC to walk). A request that times
  out fails with BookieTimeoutError and is forgotten; a late answer to it is
  dropped or matched to a newer request with the same key (which asked the same
  question).
- BATCH_READ (v2 op code 7) came with BookKeeper 4.17: an older bookie drops the connection on it
  (or answers EBADREQ). A connection that dies with a BATCH_READ pending marks the bookie
  `batch_reads_refused` for this client's lifetime (logged once): readers then read its entries
  one by one. Everything pending on that connection fails with BatchReadDropError, which tells a
  reader the bookie is most likely alive and worth one more try (read_ops.ReadEntryOp).
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import socket
from collections import deque
from typing import Callable

from bk import _native
from bk.errors import BKError, BookieConnectionError, BookieTimeoutError, ProtocolError
from bk.meta.registration import split_bookie_id
from bk.proto import (
    DEFAULT_MAX_FRAME_SIZE_BYTES, FLAG_DO_FENCING, BadFrameLengthError, BatchReadRequest,
    BatchReadResponse, FrameDecoder, GetBookieInfoRequest, GetBookieInfoResponse, OpCode, ReadLacRequest,
    ReadLacResponse, ReadRequest, ReadResponse, ResponseDecodeError, WriteLacRequest, WriteLacResponse,
    encode_request,
)
from bk.proto import v3
from bk.formats.wire import MASTER_KEY_LENGTH, READ_HEADER, READ_REQUEST_BYTES, READ_REQUEST_FRAME

from bk.proto.messages import ForceLedgerRequest, LongPollReadRequest
from bk.proto.v3 import LongPollReadResponse

from .wire_v3 import ClientWireOptions, V3Frame, V3Transport, handshake

log = logging.getLogger(__name__)
_core = _native.load("core", "bk.client")
RequestCore = _core.RequestCore

FORCE = "FORCE_LEDGER"  # v3 only: (FORCE, ledger) keys a FORCE_LEDGER (no v2 op code)
ADD, READ, READ_LAC, WRITE_LAC, INFO, BATCH = (
    int(OpCode.ADD_ENTRY), int(OpCode.READ_ENTRY), int(OpCode.READ_LAC), int(OpCode.WRITE_LAC),
    int(OpCode.GET_BOOKIE_INFO), int(OpCode.BATCH_READ_ENTRY))

Callback = Callable[[object, "BaseException | None"], None]

_read_req = READ_REQUEST_FRAME


class BatchReadDropError(BookieConnectionError):
    """The connection was lost while a BATCH_READ was pending: the bookie most likely refused the
    op (it predates 4.17), not crashed, so a request that failed with it may be sent once more."""

# A bookie that failed within this many seconds is "suspect": readers try it last.
SUSPECT_S = 5.0
EAGER_FLUSH_BYTES = _core.EAGER_FLUSH_BYTES  # the core's flush bound (core_py explains it)


class _BookieProtocol(asyncio.BufferedProtocol):
    """The transport adapter of one connection; forwards to its BookieClient.

    A BufferedProtocol: the transport reads into the decoder's buffers, so the rest of a
    large answer (a batch read's 1 MiB) lands straight in that frame's own buffer, and the
    entries the client checks are views of it (framing.py).

    While the connection is set up (START_TLS, AUTH: wire_v3.handshake) every frame waits in
    `setup_frames` for `exchange`, in order (a Java bookie may send one nobody asked for); on
    a v3 connection frames are v3 Responses, turned into the v2 answers the request core
    matches (FrameDecoder.feed_v3_responses)."""

    __slots__ = ("client", "core", "decoder", "transport", "v3", "lost", "_waiter", "setup_frames")

    def __init__(self, client: "BookieClient"):
        self.client = client
        self.core = client._core
        self.decoder = FrameDecoder(client.max_frame_size_bytes)
        self.transport = None
        self.v3 = False
        self.lost = False  # connection_lost has run (maybe before _connect made it current)
        self._waiter: asyncio.Future | None = None
        self.setup_frames: list | None = None  # during set-up: frames not yet taken by `exchange`

    def connection_made(self, transport) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int):
        return self.decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        data = self.decoder.received(nbytes)
        if data is not None:
            self.data_received(data)

    def data_received(self, data) -> None:
        if self.setup_frames is not None or self.v3:
            self._frames_received(data)
            return
        try:
            items = self.decoder.feed_responses(data)
        except BadFrameLengthError as e:
            self.core.dispatch_all(self, e.frames)
            self.client._protocol_error(self, e)
            return
        self.core.dispatch_all(self, items)

    def _frames_received(self, data) -> None:
        try:
            setup = self.setup_frames is not None
            frames = self.decoder.feed(data) if setup else self.decoder.feed_v3_responses(data)
        except BadFrameLengthError as e:
            self.client._protocol_error(self, e)
            return
        if setup:
            self.setup_frames.extend(bytes(f) for f in frames)
            if self.setup_frames and self._waiter is not None and not self._waiter.done():
                self._waiter.set_result(None)
            return
        self.core.dispatch_all(self, frames)

    async def exchange(self, frame: bytes) -> bytes:
        """Send one set-up request (none when `frame` is empty) and take the next frame that
        came in (no request is pending yet); wire_v3.handshake ends the set-up."""
        if self.setup_frames is None:
            self.setup_frames = []
        if frame:
            self.transport.write(frame)
        while not self.setup_frames:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.setup_frames.pop(0)

    def connection_lost(self, exc) -> None:
        self.lost = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(BookieConnectionError(f"connection lost during set-up: {exc}"))
            return
        self.client._connection_lost(self, exc)


class BookieClient:
    """The connection to one bookie and its pending requests.

    The request path is a core object (`self._core`, a RequestCore of bk/client/_core.pyx or its
    twin core_py.py): it holds the connection state and the pending table in declared fields, and
    calls this class back only through the hooks given to it here."""

    def __init__(self, bookie_id: str, *, add_timeout_s: float = 10.0, read_timeout_s: float = 10.0,
                 connect_timeout_s: float = 10.0, max_frame_size_bytes: int = DEFAULT_MAX_FRAME_SIZE_BYTES,
                 address: tuple[str, int] | None = None, wire: ClientWireOptions | None = None):
        self.bookie_id = bookie_id
        self.wire = wire or ClientWireOptions()
        self._side_client: "BookieClient | None" = None  # the other protocol's connection (wire_v3 docstring)
        self._long_poll_client: "BookieClient | None" = None  # v3 long polls only (send_long_poll)
        self.host, self.port = address or split_bookie_id(bookie_id)
        self.connect_timeout_s = float(connect_timeout_s)
        self.max_frame_size_bytes = max_frame_size_bytes
        self._loop = asyncio.get_running_loop()
        # core.pending: key -> (callback, deadline) of the oldest pending request with that key;
        # later requests with a key already pending (rare) wait in core.queued, in send order
        core = self._core = RequestCore(
            bookie_id, self._loop, float(add_timeout_s), float(read_timeout_s), refuse_closed=self._refuse_closed,
            queue=self._queue, arm_sweep=self._arm_sweep, start_connect=self._start_connect, key_for=self._key_for,
            promote=self._promote)
        self.send_add = core.send_add  # the core's own methods: no Python frame in between
        self._send = core.send
        self._request_ids = itertools.count(1)
        self.last_failure_at: float | None = None  # loop time of the last timeout / connection failure
        self.connects = 0  # connections made (tests and stats)
        # Set once the bookie dropped a connection on BATCH_READ or answered it EBADREQ: never
        # sent it a batch again (module docstring). A side connection reports to its main client.
        self.batch_reads_refused = False
        self._main: "BookieClient | None" = None

    @property
    def add_timeout_s(self) -> float:
        return self._core.add_timeout_s

    @property
    def read_timeout_s(self) -> float:
        return self._core.read_timeout_s

    def __repr__(self) -> str:
        core = self._core
        state = "connected" if core.protocol else ("connecting" if core.connect_task else "idle")
        return f"BookieClient({self.bookie_id}, {state}, {core.pending_count} pending)"

    @property
    def connected(self) -> bool:
        return self._core.protocol is not None

    @property
    def pending_count(self) -> int:
        return self._core.pending_count

    def suspect(self) -> bool:
        """True if this bookie failed recently (readers try it last)."""
        at = self.last_failure_at
        return at is not None and self._loop.time() - at < SUSPECT_S

    # ------------------------------------------------------------ requests
    def send_read(self, ledger_id: int, entry_id: int, callback: Callback, *, flags: int = 0,
                  master_key: bytes | None = None, timeout_s: float | None = None) -> None:
        """READ of one entry (-1 = the bookie's last entry); fencing reads carry the key."""
        if flags == 0 and master_key is None and ledger_id >= 0 and entry_id >= -1:
            frame = _read_req.pack(READ_REQUEST_BYTES, READ_HEADER, ledger_id, entry_id)
        else:
            if flags & FLAG_DO_FENCING and (master_key is None or len(master_key) != MASTER_KEY_LENGTH):
                raise ValueError("a fencing read needs the ledger's 20-byte master key")
            frame = encode_request(ReadRequest(flags, ledger_id, entry_id, master_key))
        self._send((READ, ledger_id, entry_id), frame, callback,
                   self.read_timeout_s if timeout_s is None else timeout_s)

    def send_batch_read(self, ledger_id: int, start_entry_id: int, max_count: int, max_size_bytes: int,
                        callback: Callback, *, flags: int = 0, master_key: bytes | None = None,
                        timeout_s: float | None = None) -> int:
        """BATCH_READ from `start_entry_id`; returns the request id it is matched by."""
        if self.batch_reads_refused:
            raise BatchReadDropError(f"bookie {self.bookie_id} does not serve BATCH_READ")
        if self.wire.protocol == "v3":  # BATCH_READ exists only in v2
            return self._side().send_batch_read(ledger_id, start_entry_id, max_count, max_size_bytes, callback,
                                                flags=flags, master_key=master_key, timeout_s=timeout_s)
        request_id = next(self._request_ids)
        frame = encode_request(BatchReadRequest(flags, ledger_id, start_entry_id, request_id, max_count,
                                                max_size_bytes, master_key))
        self._send((BATCH, request_id), frame, callback, self.read_timeout_s if timeout_s is None else timeout_s)
        return request_id

    def _v3_only(self) -> bool:
        """True: READ_LAC, WRITE_LAC, GET_BOOKIE_INFO go over a v3 side connection."""
        return self.wire.protocol == "v2" and not self.wire.v2_extensions

    def _side(self) -> "BookieClient":
        side = self._side_client
        if side is None:
            other = "v2" if self.wire.protocol == "v3" else "v3"
            side = self._side_client = BookieClient(
                self.bookie_id, add_timeout_s=self.add_timeout_s, read_timeout_s=self.read_timeout_s,
                connect_timeout_s=self.connect_timeout_s, max_frame_size_bytes=self.max_frame_size_bytes,
                address=(self.host, self.port), wire=dataclasses.replace(self.wire, protocol=other))
            side._main = self
        return side

    def refuse_batch_reads(self, why: str) -> None:
        """Read this bookie entry by entry from now on (logged the first time only)."""
        main = self._main or self
        if not main.batch_reads_refused:
            main.batch_reads_refused = True
            log.warning("bookie %s %s: it predates BookKeeper 4.17 (no BATCH_READ); this client reads its"
                        " entries one by one from now on", main.bookie_id, why)

    def _lost_error(self, message: str) -> BookieConnectionError:
        """The error for everything pending on a lost connection (a refused BATCH_READ is named)."""
        if any(key[0] == BATCH for key in self._core.pending):
            self.refuse_batch_reads("closed the connection with a BATCH_READ pending")
            return BatchReadDropError(f"{message} (with a BATCH_READ pending: the bookie most likely refused it)")
        return BookieConnectionError(message)

    def send_read_lac(self, ledger_id: int, callback: Callback, timeout_s: float | None = None) -> None:
        if self._v3_only():
            return self._side().send_read_lac(ledger_id, callback, timeout_s)
        self._send((READ_LAC, ledger_id), encode_request(ReadLacRequest(0, ledger_id)), callback,
                   self.read_timeout_s if timeout_s is None else timeout_s)

    def send_write_lac(self, ledger_id: int, master_key: bytes, lac: int, lac_buf: bytes, callback: Callback,
                       timeout_s: float | None = None) -> None:
        if self._v3_only():
            return self._side().send_write_lac(ledger_id, master_key, lac, lac_buf, callback, timeout_s)
        frame = encode_request(WriteLacRequest(0, master_key, ledger_id, lac, lac_buf))
        self._send((WRITE_LAC, ledger_id), frame, callback, self.add_timeout_s if timeout_s is None else timeout_s)

    def send_long_poll(self, ledger_id: int, previous_lac: int, timeout_ms: int, callback: Callback) -> None:
        """v3 long-poll READ (BookKeeper's readEntryWaitForLACUpdate, entry -1 with the entry
        previous_lac + 1 piggybacked): answered with a LongPollReadResponse once the
        bookie's LAC passes previous_lac or after timeout_ms. Long polls go on a v3 connection of
        their own: v3 answers are turned into v2 ones matched by (READ, ledger, entry), and a long
        poll's answer (entry -1 or previous_lac + 1) must never be taken for a plain read's."""
        if self.wire.protocol != "v3":
            raise BookieConnectionError(f"bookie {self.bookie_id}: long polls need the v3 protocol")
        client = self._long_poll_client
        if client is None:
            client = self._long_poll_client = BookieClient(
                self.bookie_id, add_timeout_s=self.add_timeout_s, read_timeout_s=self.read_timeout_s,
                connect_timeout_s=self.connect_timeout_s, max_frame_size_bytes=self.max_frame_size_bytes,
                address=(self.host, self.port), wire=self.wire)
        frame = V3Frame.of(LongPollReadRequest(ledger_id, -1, previous_lac, timeout_ms, True))
        client._send((READ, ledger_id, -1), frame, callback, timeout_ms / 1000.0 + self.read_timeout_s)

    def v3_client(self) -> "BookieClient":
        """The connection for what only v3 carries (DEFERRED_SYNC adds, FORCE_LEDGER): this one when
        it speaks v3, else its v3 side connection."""
        return self if self.wire.protocol == "v3" else self._side()

    def send_force_ledger(self, ledger_id: int, callback: Callback, timeout_s: float | None = None) -> None:
        """FORCE_LEDGER (v3): answered with a ForceLedgerResponse once the bookie made every entry of
        the ledger it acknowledged before durable (BookKeeper's ForceLedgerOp, one bookie)."""
        if self.wire.protocol != "v3":
            return self._side().send_force_ledger(ledger_id, callback, timeout_s)
        from .wire_v3 import V3Frame
        self._send((FORCE, ledger_id), V3Frame.of(ForceLedgerRequest(ledger_id)), callback,
                   self.add_timeout_s if timeout_s is None else timeout_s)

    def send_bookie_info(self, requested_info: int, callback: Callback, timeout_s: float | None = None) -> None:
        if self._v3_only():
            return self._side().send_bookie_info(requested_info, callback, timeout_s)
        self._send((INFO,), encode_request(GetBookieInfoRequest(0, requested_info)), callback,
                   self.read_timeout_s if timeout_s is None else timeout_s)

    def call(self, send: Callable, *args, **kwargs) -> asyncio.Future:
        """Run one `send_*` method and return a future of its response (errors raise)."""
        fut = self._loop.create_future()

        def done(response, err) -> None:
            if fut.done():
                return
            if err is not None:
                fut.set_exception(err)
            else:
                fut.set_result(response)

        send(*args, done, **kwargs)
        return fut

    # the hooks of the request core (bk/client/_core.pyx, twin core_py.py): its rare paths
    def _refuse_closed(self, callback: Callback) -> None:
        callback(None, BookieConnectionError(f"bookie {self.bookie_id}: client is closed"))

    def _queue(self, key: tuple, request: tuple) -> None:
        """A second request with a key already pending waits behind it, in send order."""
        queued = self._core.queued.get(key)
        if queued is None:
            queued = self._core.queued[key] = deque()
        queued.append(request)

    def _start_connect(self) -> None:
        self._core.connect_task = self._loop.create_task(self._connect(), name=f"connect-{self.bookie_id}")

    # ------------------------------------------------------------ connection
    async def _connect(self) -> None:
        core = self._core
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, protocol = await self._loop.create_connection(lambda: _BookieProtocol(self), self.host, self.port)
            if not self.wire.plain:
                try:
                    async with asyncio.timeout(self.connect_timeout_s):
                        await handshake(self._loop, protocol, self.wire, self.host, self.bookie_id)
                except BaseException:
                    protocol.transport.abort()
                    raise
            if self.wire.protocol == "v3":
                protocol.transport = V3Transport(protocol.transport)
                protocol.v3 = True
        except (OSError, asyncio.TimeoutError, BKError) as e:  # ssl.SSLError is an OSError
            core.connect_task = None
            why = "timed out" if isinstance(e, asyncio.TimeoutError) else str(e)
            self._fail_all(BookieConnectionError(f"cannot connect to bookie {self.bookie_id}: {why}"))
            return
        except asyncio.CancelledError:
            core.connect_task = None
            raise
        core.connect_task = None
        if core.closed:
            protocol.transport.close()
            return
        if protocol.lost:  # the peer closed before this task resumed: its connection_lost was ignored
            self._fail_all(BookieConnectionError(f"connection to bookie {self.bookie_id} lost as it was made"))
            return
        sock = protocol.transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        core.protocol = protocol
        self.connects += 1
        core.flush()

    def _connection_lost(self, protocol: _BookieProtocol, exc) -> None:
        if protocol is not self._core.protocol:
            return
        self._core.protocol = None
        why = f": {exc}" if exc else ""
        self._fail_all(self._lost_error(f"connection to bookie {self.bookie_id} lost{why}"))

    def _protocol_error(self, protocol: _BookieProtocol, err: ProtocolError) -> None:
        log.warning("bookie %s sent malformed data, dropping the connection: %s", self.bookie_id, err)
        if protocol is self._core.protocol:
            self._core.protocol = None
            self._fail_all(self._lost_error(f"bookie {self.bookie_id} sent a malformed response: {err}"))
        protocol.transport.abort()

    def _fail_all(self, err: BaseException) -> None:
        """Fail every pending request (they were all sent on the connection that is gone)."""
        core = self._core
        self.last_failure_at = self._loop.time()
        pending, core.pending = core.pending, {}
        queued, core.queued = core.queued, {}
        core.pending_count = 0
        core.out = []
        core.out_bytes = 0
        for key, (callback, _) in pending.items():
            _call(callback, None, err)
            for callback, _ in queued.get(key, ()):
                _call(callback, None, err)

    def close(self) -> None:
        """Fail everything pending and drop the connection; the client cannot be reused."""
        core = self._core
        core.closed = True
        if core.connect_task is not None:
            core.connect_task.cancel()
            core.connect_task = None
        if core.sweep_handle is not None:
            core.sweep_handle.cancel()
            core.sweep_handle = None
        protocol, core.protocol = core.protocol, None
        for other in (self._side_client, self._long_poll_client):
            if other is not None:
                other.close()
        self._fail_all(BookieConnectionError(f"bookie {self.bookie_id}: client closed"))
        if protocol is not None:
            protocol.transport.close()

    # ------------------------------------------------------------ responses
    # RequestCore.dispatch_all matches ADD answers itself and asks this for the rest.
    def _key_for(self, protocol: _BookieProtocol, msg):
        """The pending-table key `msg` answers; None to skip it, False after a protocol error."""
        t = type(msg)
        if t is ReadResponse or t is LongPollReadResponse:
            key = (READ, msg.ledger_id, msg.entry_id)
            return key if key in self._core.pending else (READ, msg.ledger_id, -1)
        if t is BatchReadResponse:
            return (BATCH, msg.request_id)
        if t is ReadLacResponse:
            return (READ_LAC, msg.ledger_id)
        if t is WriteLacResponse:
            return (WRITE_LAC, msg.ledger_id)
        if t is v3.ForceLedgerResponse:
            return (FORCE, msg.ledger_id)
        if t is GetBookieInfoResponse:
            return (INFO,)
        if t is ResponseDecodeError:
            self._protocol_error(protocol, msg)
            return False
        log.debug("bookie %s: ignoring %r", self.bookie_id, msg)  # AUTH answers: we never authenticate
        return None

    def _promote(self, key: tuple) -> None:
        """The oldest queued request with `key` (if any) becomes the pending one."""
        queued = self._core.queued.get(key)
        if queued:
            self._core.pending[key] = queued.popleft()
            if not queued:
                del self._core.queued[key]

    # ------------------------------------------------------------ timeouts
    def _arm_sweep(self) -> None:
        tick = self._core.shortest_timeout_s / 8
        self._core.sweep_handle = self._loop.call_later(min(max(tick, 0.005), 0.5), self._sweep)

    def _sweep(self) -> None:
        """Expire every request whose deadline passed (the oldest of a key first)."""
        core = self._core
        core.sweep_handle = None
        now = self._loop.time()
        expired = [(key, request) for key, request in core.pending.items() if request[1] <= now]
        for key, queued in core.queued.items():
            for request in [r for r in queued if r[1] <= now]:
                queued.remove(request)
                expired.append((key, request))
        for key in [k for k, q in core.queued.items() if not q]:
            del core.queued[key]
        for key, request in expired:
            if core.pending.get(key) is request:
                del core.pending[key]
                self._promote(key)
            core.pending_count -= 1
            self.last_failure_at = now
            _call(request[0], None, BookieTimeoutError(
                f"bookie {self.bookie_id} did not answer {_describe(key)} in time"))
        if core.pending:
            self._arm_sweep()


def _call(callback: Callback, msg, err) -> None:
    try:
        callback(msg, err)
    except Exception:  # a caller's bug must not break the connection
        log.exception("request callback failed")


def _describe(key: tuple) -> str:
    op = key[0] if type(key[0]) is str else OpCode(key[0]).name
    if key[0] in (ADD, READ):
        return f"{op} of ledger {key[1]} entry {key[2]}"
    if key[0] == BATCH:
        return f"{op} request {key[1]}"
    return f"{op}" + (f" of ledger {key[1]}" if len(key) > 1 else "")


class BookieClientPool:
    """One BookieClient per bookie id, created on first use."""

    def __init__(self, *, add_timeout_s: float = 10.0, read_timeout_s: float = 10.0, connect_timeout_s: float = 10.0,
                 max_frame_size_bytes: int = DEFAULT_MAX_FRAME_SIZE_BYTES,
                 resolve: Callable[[str], tuple[str, int]] | None = None, wire: ClientWireOptions | None = None):
        self.wire = wire
        self.add_timeout_s = add_timeout_s
        self.read_timeout_s = read_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_frame_size_bytes = max_frame_size_bytes
        self._resolve = resolve
        self._clients: dict[str, BookieClient] = {}
        self._closed = False

    def get(self, bookie_id: str) -> BookieClient:
        client = self._clients.get(bookie_id)
        if client is None:
            if self._closed:
                raise BookieConnectionError(f"bookie {bookie_id}: the client pool is closed")
            address = self._resolve(bookie_id) if self._resolve is not None else None
            client = self._clients[bookie_id] = BookieClient(
                bookie_id, add_timeout_s=self.add_timeout_s, read_timeout_s=self.read_timeout_s,
                connect_timeout_s=self.connect_timeout_s, max_frame_size_bytes=self.max_frame_size_bytes,
                address=address, wire=self.wire)
        return client

    def suspect(self, bookie_id: str) -> bool:
        client = self._clients.get(bookie_id)
        return client is not None and client.suspect()

    def clients(self) -> dict[str, BookieClient]:
        return dict(self._clients)

    def close(self) -> None:
        self._closed = True
        clients, self._clients = self._clients, {}
        for client in clients.values():
            client.close()
