"""BookieConnection: the asyncio Protocol adapter between a socket and the codec.

One instance per client connection. Bytes in go through the sans-I/O
FrameDecoder (a malformed frame length closes this connection only); decoded
requests go to the RequestProcessor in order, each run of consecutive ADDs of
one read as one batch (`RequestProcessor.add_run`). Responses are queued and
written once per loop iteration, so every ADD completed by one journal group
(delivered in one loop callback) leaves in one write: ADD responses are
encoded together by the codec kernel.

Backpressure: when more than `max_pending_requests_per_connection` requests or
`max_pending_bytes_per_connection` bytes are in flight, or the socket's send
buffer is full (the client is not reading), the connection stops reading; it
resumes at half the limit. Requests beyond twice the request limit (possible
inside one large read) are refused with ETOOMANYREQUESTS. A batch is
accounted as a whole (`begin_many`/`end_many`) only when all of it fits under
that limit; otherwise its adds are admitted one at a time, so refusals are
exactly those of one-by-one dispatch.

Responses are bounded too (`max_response_bytes_per_connection`, docs/OVERLOAD.md):
the transport's high-water mark is that limit, so a client that does not read
its answers stops having its requests read once that many bytes wait unwritten
(queued here or in the transport). Requests already read cannot pile answers up
behind it either: a read that answers with entries starts (`run_read`) only in
one of the connection's `max_reads_in_progress_per_connection` read slots and only while the
unwritten bytes are within the limit; until then it waits as its request alone.
So a connection holds at most the limit plus one answer per read slot (plus its
requests in flight, bounded by the request limits above).

Bookie-wide limits (bk.server.limits, issue 27): every ADD and read is also counted in the
one BookieLimits all connections share (`begin_add`/`begin_many`/`begin_read` and their
ends). When one of its counts reaches its limit, the connection whose bytes reached it and
every other connection still reading stop reading (`_pause_for_limits`) and wait in
`limits.paused` until every count is back to half; a request arriving beyond twice a limit
(the rest of a socket read) is refused like one beyond the connection's own. v3 long polls
parked on a ledger's LAC are in `long_polls`, cancelled when the connection is lost.

Phases (bk.proto.state): the connection's protocol detection, START_TLS, AUTH and closing
are one ConnectionPhase moved only by `phase_event`, which fires an event through the table
(a forbidden one is a PhaseError) and derives the four attributes the hot path reads instead
of the phase: `_v2_feed` (wire V2), `_admit` (auth UNAUTHENTICATED), `_holding` (tls
HANDSHAKING) and `closed` (life CLOSED). Nothing else sets them, so a request costs no phase
lookup. Protocol detection (BookKeeper's BookieProtoEncoding.RequestDecoder): every frame
is first parsed as a v3 Request until one fails to parse; from that frame on the
connection is v2 for good (NOT_V3), and takes the v2 kernel path. A v2 frame
never parses as v3, so a v2 client costs one failed parse per connection. v3
ADDs are answered in v3 by `send_add_results`; the other v3 operations go to
bk.server.v3. Authentication (bk.server.auth) and TLS (bk.server.tls) hang off
this class through `auth_request_v2/v3` and `start_tls_v3`, and fire their events here.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque

from bk.entrylog.spans import FileSpan
from bk.errors import ProtocolError, StorageError
from bk.proto import (PROTOCOL_VERSION, AddRequest, BadFrameLengthError, FrameDecoder, MessageEncodeError,
                      ReadRequest, RequestDecodeError, encode_add_acks, encode_add_responses, error_response_for)
from bk.proto import v3
from bk.proto.state import ConnectionPhase, Event, State
from bk.proto.v3 import V3AddRequest

from . import auth, tls
from .socket_writes import _SPANS, _copy_buffer_spans, _plain_socket_fd, _read_spans, _release_spans, _write_direct

log = logging.getLogger(__name__)
_ADDS_ONLY = {AddRequest}
_V3_ADDS_ONLY = {V3AddRequest}
_READS_ONLY = {ReadRequest}
# READs mostly (a run of them: one client's readEntries), plain ones decoded by the kernel
_V3_REQUEST_TYPES = {v3.Request, v3.V3ReadRequest}
_ADD_TYPES = (AddRequest, V3AddRequest)
DECODE_SLICE_BYTES = 16 * 1024
_WHOLE_READ = 1 << 62
# Answers of at least this many bytes are written by os.writev, which releases the GIL, before
# the transport sees them: uvloop's write holds the GIL through the syscall, and the copy into
# the socket (plus, on loopback, the receiver's TCP work) was half of the loop's GIL time in a
# cold scan, time the read threads could not run in. Small answers (ADD acks) stay with the
# transport: a GIL round trip costs more than their copy.
DIRECT_WRITE_MIN_BYTES = 64 * 1024


class BookieConnection(asyncio.Protocol):
    def __init__(self, server):
        self.server = server
        self.processor = server.processor
        self.limits = server.processor.limits  # bookie-wide (bk.server.limits)
        cfg = server.config
        self.decoder = FrameDecoder(cfg.max_frame_size_bytes)
        self.max_pending = cfg.max_pending_requests_per_connection
        self.max_pending_bytes = cfg.max_pending_bytes_per_connection
        self.max_response_bytes = cfg.max_response_bytes_per_connection
        self._out_bytes = 0  # bytes in self._out (answers queued for this iteration's write)
        self._read_slots = cfg.max_reads_in_progress_per_connection  # reads answering with entries at once
        self._reads_running = 0
        self._reads_waiting: deque = deque()  # (start, req) of reads begun, not started (run_read)
        self.transport: asyncio.Transport | None = None
        self._fd = -1  # the plain socket's fd for _write_direct; -1: the transport writes all
        self.peer = "?"
        self.pending = 0
        self.pending_bytes = 0
        self._out: list = []  # buffers, and spans of entry logs (BATCH_READ answers, bk.entrylog.spans)
        self._spans = 0  # answers in self._out that end in a span
        self._held_bytes = 0  # answers whose spans a thread is reading for the transport (_read_spans)
        self._add_rows: list[tuple[int, int, int]] = []
        self._flush_scheduled = False
        self._reading_paused = False
        self._writing_paused = False
        self._loop = asyncio.get_event_loop()
        self.idle = asyncio.Event()
        self.idle.set()
        self._slice_bytes = DECODE_SLICE_BYTES  # see data_received
        provider = getattr(server, "auth_provider", None)  # None: auth off
        self.session = auth.ServerSession(provider, self)
        self.phase = ConnectionPhase(tls_configured=getattr(server, "tls", None) is not None,
                                     auth_required=provider is not None)
        self._derive()  # closed, _v2_feed, _admit, _holding: see phase_event
        self.tls = None  # the TLS session's info (cipher, client certificate) once ENCRYPTED
        self.long_polls: set = set()  # v3 long polls parked for this connection (bk.server.v3)

    # ------------------------------------------------------------ phases (bk.proto.state)
    def phase_event(self, event: Event) -> None:
        """Move the connection's phase by the table (PhaseError, nothing changed, when it forbids
        `event` now) and re-derive what the hot path reads of it."""
        self.phase.fire(event)
        self._derive()

    def _derive(self) -> None:
        phase = self.phase
        self.closed = phase.life is State.CLOSED
        self._v2_feed = self.decoder.feed_requests if phase.wire is State.V2 else None  # None: detecting
        self._admit = None if phase.admitted else self.session.admit  # the session holds us weakly: no cycle
        self._holding = phase.tls is State.HANDSHAKING  # answers wait to leave encrypted (_flush)

    # ------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport
        # pause_writing once the unwritten answers exceed the response limit (resume_writing
        # at a quarter of it, the transport's default low-water mark)
        transport.set_write_buffer_limits(high=self.max_response_bytes)
        self._fd = _plain_socket_fd(transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.server.connections.add(self)

    def connection_lost(self, exc) -> None:
        self.phase_event(Event.LOST)
        self.server.connections.discard(self)
        _release_spans(self._out)
        self._out.clear()
        self._out_bytes = 0
        self._spans = 0
        self._add_rows.clear()
        self.limits.forget(self)
        waiting = len(self._reads_waiting)
        if waiting:  # never started: nobody will answer them
            self._reads_waiting.clear()
            self.end_reads(waiting)
        if self.long_polls:  # their watchers and timers go with the connection
            polls, self.long_polls = self.long_polls, set()
            for poll in polls:
                poll.cancel()

    def data_received(self, data: bytes) -> None:
        # A read is decoded a slice at a time: every item of a slice exists at once (a 6-byte bad
        # frame decodes to a ~600-byte error object), so a 256 KiB read of tiny frames held ~25 MB
        # until it was dispatched, and the allocator kept that peak as RSS (the live fuzzer,
        # docs/FUZZING.md: +42% after 1M frames; with 64 KiB slices still +33%). A connection
        # whose last read was all ADDs reads whole (slices would cut its batches: -10% for 1 KiB
        # adds); any other read puts it back to slices. A frame cut by a slice boundary is
        # carried by the decoder as one cut by a read boundary is.
        step = self._slice_bytes
        if len(data) <= step:
            self._received(data)
            return
        view = memoryview(data)
        for start in range(0, len(data), step):
            if self.transport.is_closing():
                return
            self._received(view[start:start + step])

    def _received(self, data) -> None:
        feed = self._v2_feed
        try:
            items = feed(data) if feed is not None else self._feed_detecting(data)
        except BadFrameLengthError as e:
            log.warning("closing connection from %s: %s", self.peer, e)
            admit = self._admit
            for item in e.frames if admit is None else admit(e.frames):  # complete requests before it count
                self._dispatch(item)
            self.close()
            return
        except ProtocolError as e:
            log.warning("closing connection from %s: %s", self.peer, e)
            self.abort()
            return
        admit = self._admit
        if admit is not None:
            items = admit(items)
        if len(items) == 1:
            self._dispatch(items[0])
        elif items:
            self._dispatch_all(items)
        if not self._reading_paused:
            if self.limits.saturated():
                self._pause_for_limits()
            elif self.pending >= self.max_pending or self.pending_bytes >= self.max_pending_bytes:
                self._stop_reading()

    def _stop_reading(self) -> None:
        self._reading_paused = True
        self.transport.pause_reading()

    def pause_writing(self) -> None:  # the client is not reading its responses
        self._writing_paused = True
        if not self._reading_paused:
            self._stop_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._reads_waiting:
            self._start_reads()
        self.maybe_resume()

    def has_room(self) -> bool:
        """Whether the responses not yet written (queued here or in the transport) are
        within max_response_bytes_per_connection (always, once closed)."""
        return (self.closed or self._out_bytes + self._held_bytes + self.transport.get_write_buffer_size()
                <= self.max_response_bytes)

    def room(self) -> int:
        """Bytes the unwritten responses may still grow by before has_room() turns False (negative:
        over the limit; always room once closed)."""
        if self.closed:
            return self.max_response_bytes
        return self.max_response_bytes - (self._out_bytes + self._held_bytes + self.transport.get_write_buffer_size())

    @property
    def takes_spans(self) -> bool:
        """Whether answers may carry spans of entry logs: only a plain socket can be written
        directly (sendfile, writev); TLS goes through the transport."""
        return self._fd >= 0

    def run_read(self, start, req) -> None:
        """A read that answers with entries, already counted by begin(): `start(req, self)`
        now if a read slot is free and the output has room, else once both are (in
        arrival order). The started read calls read_done() once its answer is sent."""
        if self._reads_running < self._read_slots and not self._reads_waiting and self.has_room():
            self._reads_running += 1
            start(req, self)
        else:
            self._reads_waiting.append((start, req))

    def read_done(self, n: int = 1) -> None:
        self._reads_running -= n
        if self._reads_waiting:
            self._start_reads()

    def read_answered(self) -> None:
        """A started read answered at once (bk.server.single_reads.answer_cached): its slot is
        free; the caller (run_read, _start_reads) starts the next one."""
        self._reads_running -= 1

    def _start_reads(self) -> None:
        waiting = self._reads_waiting
        while waiting and self._reads_running < self._read_slots and self.has_room():
            self._reads_running += 1
            start, req = waiting.popleft()
            start(req, self)

    def _feed_detecting(self, data) -> list:
        """Requests while the connection may still speak v3 (FrameDecoder.feed_v3_requests)."""
        try:
            return self.decoder.feed_v3_requests(data)
        finally:
            if self.decoder.v3_failed:
                self.phase_event(Event.NOT_V3)
                log.debug("connection from %s speaks v2", self.peer)

    # ------------------------------------------------------------ requests
    def _dispatch(self, item) -> None:
        if self.transport.is_closing():  # closed for a bad frame earlier in this read: drop the rest
            return
        if type(item) is bytes:  # a ready answer (a malformed v3 ADD's, or an auth refusal)
            self.send(item)
            return
        if isinstance(item, RequestDecodeError):
            try:
                self.send(error_response_for(item))
            except MessageEncodeError:  # AUTH has no error layout
                log.warning("closing connection from %s: %s", self.peer, item)
                self.close()  # answers owed to the requests before it still leave
            return
        self.processor.dispatch(item, self)

    def _dispatch_all(self, items: list) -> None:
        """Requests of one read in order; each run of consecutive ADDs goes to the
        processor as one batch (a read or other op between two adds ends a run, so
        every request still sees the effects of all requests before it)."""
        add_run = self.processor.add_run
        types = set(map(type, items))
        if types == _ADDS_ONLY or types == _V3_ADDS_ONLY:
            self._slice_bytes = _WHOLE_READ
            add_run(items, self)
            return
        self._slice_bytes = DECODE_SLICE_BYTES
        if types == _READS_ONLY or types and types <= _V3_REQUEST_TYPES:  # bk.server.single_reads
            self.processor.read_run(items, self)
            return
        start = -1  # first add of the current run (a run is all v2 or all v3 adds)
        for i, item in enumerate(items):
            if self.transport.is_closing():  # one bad frame closed the connection: none after it runs
                return
            if type(item) in _ADD_TYPES:
                if start < 0:
                    start = i
                    continue
                if type(item) is type(items[start]):
                    continue
                add_run(items[start:i], self)
                start = i
                continue
            if start >= 0:
                add_run(items[start:i], self)
                start = -1
            self._dispatch(item)
        if start >= 0:
            add_run(items[start:], self)

    # Accounting: begin* count a request in flight (False: refuse it, nothing counted), end*
    # once it is answered. Adds and reads are counted bookie-wide too (self.limits).
    def begin(self, nbytes: int = 0) -> bool:
        """A request that is neither an add nor a read (WRITE_LAC, GET_BOOKIE_INFO, a v3 long poll)."""
        if self.pending >= 2 * self.max_pending:
            return False
        self._begun(1, nbytes)
        return True

    def begin_add(self, nbytes: int) -> bool:
        """One ADD of `nbytes`."""
        if self.pending >= 2 * self.max_pending or not self.limits.admit_adds(1, nbytes):
            return False
        self._begun(1, nbytes)
        return True

    def begin_many(self, n: int, nbytes: int) -> bool:
        """n adds the caller checked fit under the connection's refusal limit; False (nothing
        counted) when they do not fit under the bookie-wide one."""
        if not self.limits.admit_adds(n, nbytes):
            return False
        self._begun(n, nbytes)
        return True

    def begin_read(self) -> bool:
        """A READ, BATCH_READ or READ_LAC (v2 or v3)."""
        if self.pending >= 2 * self.max_pending or not self.limits.admit_read():
            return False
        self._begun(1, 0)
        return True

    def _begun(self, n: int, nbytes: int) -> None:
        self.pending += n
        self.pending_bytes += nbytes
        self.idle.clear()

    def end(self, nbytes: int = 0) -> None:
        self._ended(1, nbytes)

    def end_add(self, nbytes: int) -> None:
        self.end_many(1, nbytes)

    def end_many(self, n: int, nbytes: int) -> None:
        limits = self.limits
        limits.adds -= n
        limits.add_bytes -= nbytes
        if limits.paused:
            limits.resume_if_below_half()
        self._ended(n, nbytes)

    def end_read(self) -> None:
        self.end_reads(1)

    def end_reads(self, n: int) -> None:
        limits = self.limits
        limits.reads -= n
        if limits.paused:
            limits.resume_if_below_half()
        self._ended(n, 0)

    def _ended(self, n: int, nbytes: int) -> None:
        self.pending -= n
        self.pending_bytes -= nbytes
        if self.pending == 0:
            self.idle.set()
        if self._reading_paused:
            self.maybe_resume()

    def _pause_for_limits(self) -> None:
        """A bookie-wide limit is reached: this connection stops reading, and so does every other
        one that reads (a flood over 1,000 connections: each one left reading delivered one more
        socket read past the limit, most of it then refused ETOOMANYREQUESTS). One pass over the
        connections per time the limits are reached; they all read again at half."""
        limits = self.limits
        first = not limits.paused
        self._stop_reading()
        limits.pause(self)
        for conn in self.server.connections if first else ():
            if not conn._reading_paused and not conn.closed:
                conn._stop_reading()
                limits.pause(conn)

    def maybe_resume(self) -> None:
        """Read again if no limit holds this connection (bk.server.limits calls it at half)."""
        if (self._reading_paused and not self._writing_paused and not self.closed
                and self.pending <= self.max_pending // 2 and self.pending_bytes <= self.max_pending_bytes // 2):
            limits = self.limits
            if self in limits.paused:  # stopped for the bookie-wide limits: they resume it
                return
            if limits.saturated():  # its own limits cleared while the bookie's are reached
                limits.pause(self)
                return
            self._reading_paused = False
            self.transport.resume_reading()

    # ------------------------------------------------------------ responses
    def send(self, frame) -> None:
        """Whole frames: bytes, or a list of buffers that concatenate to them (encode_response_parts:
        they go to the writev as they are, a read answer's entries uncopied)."""
        if self.closed:
            if type(frame) is list:
                _release_spans(frame)
            return
        if self._add_rows:  # keep responses in completion order
            self._out.append(encode_add_responses(self._add_rows))
            self._add_rows = []
        if type(frame) is list:
            self._out += frame
            self._out_bytes += sum(map(len, frame))
            if type(frame[-1]) in _SPANS:  # a span is the last part of its answer (codec)
                self._spans += 1
        else:
            self._out.append(frame)
            self._out_bytes += len(frame)
        self._schedule_flush()

    def send_add_result(self, rc: int, req) -> None:
        """The answer to one ADD (v2 or v3) with v2 status `rc`."""
        if self.closed:
            return
        version = req.version
        if version == PROTOCOL_VERSION:
            self._add_rows.append((rc, req.ledger_id, req.entry_id))
            self._schedule_flush()
        elif version == v3.PROTOCOL_VERSION_V3:
            self.send(v3.encode_add_responses((req,), rc))
        else:
            self.send(encode_add_responses(((rc, req.ledger_id, req.entry_id),), version))

    def send_add_results(self, reqs: list, rc: int) -> None:
        """The answers to ADDs of one run (all v2 or all v3) sharing v2 status `rc`."""
        version = reqs[0].version
        if version == v3.PROTOCOL_VERSION_V3:
            self.send_add_frames(v3.encode_add_responses(reqs, rc))
        elif version == PROTOCOL_VERSION and all(req.version == PROTOCOL_VERSION for req in reqs):
            self.send_add_frames(encode_add_acks(reqs, rc))
        else:
            for req in reqs:
                self.send_add_result(rc, req)

    def send_add_frames(self, frames: bytes) -> None:
        """ADD response frames already encoded (a batch completion), after every
        response queued before them."""
        if self.closed:
            return
        if self._add_rows:  # keep responses in completion order
            self._out.append(encode_add_responses(self._add_rows))
            self._add_rows = []
        self._out.append(frames)
        self._out_bytes += len(frames)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.closed:
            return
        if self._add_rows:
            self._out.append(encode_add_responses(self._add_rows))
            self._add_rows = []
        if self._holding:
            # Answers to requests that came in the same read as START_TLS (a Java client sends its
            # first AUTH right behind it) go out encrypted once the handshake is done (upgraded()),
            # as BookKeeper's SslHandler holds them: in plain text they would break the handshake.
            return
        if self._out and not self._held_bytes:  # else _spans_read flushes once the thread is done
            out, self._out = self._out, []
            spans, self._spans = self._spans, 0
            # Written directly only when nothing waits in the transport's buffer: what that writes
            # goes first, and what the socket did not take goes to the transport, in order.
            if ((self._out_bytes >= DIRECT_WRITE_MIN_BYTES or spans) and self._fd >= 0
                    and not self.transport.get_write_buffer_size() and not self.transport.is_closing()):
                out = _write_direct(self._fd, out)
            out_bytes, self._out_bytes = self._out_bytes, 0
            if out and spans:
                out = _copy_buffer_spans(out)
            if out and spans and any(type(part) is FileSpan for part in out):
                # The transport takes bytes only: the spans the socket did not take are read by a
                # thread (they may still be on disk), and what is queued meanwhile waits behind.
                self._held_bytes = out_bytes or 1
                self._loop.run_in_executor(None, _read_spans, out).add_done_callback(self._spans_read)
            elif out:
                self.transport.writelines(out)  # a writev: big read responses are not copied into one buffer
            if self._reads_waiting and not self._writing_paused:
                self._start_reads()  # written at once (no pause_writing, so no resume_writing)

    def _spans_read(self, fut) -> None:
        self._held_bytes = 0
        if self.closed:
            return
        try:
            parts = fut.result()
        except StorageError as e:
            # Part of the answer may be on the wire already: nothing else can follow it. The
            # client sees the connection close and reads the entries from another replica.
            log.error("connection %s: an answer's entries could not be read: %s", self.peer, e)
            self.abort()
            return
        self.transport.writelines(parts)
        if self._out:
            self._flush()
        elif self._reads_waiting and not self._writing_paused:
            self._start_reads()

    def flush_now(self) -> None:
        """Hand every queued response to the transport now (START_TLS's plain-text answer)."""
        self._flush()

    # ------------------------------------------------------------ AUTH and START_TLS
    def auth_request_v2(self, req) -> None:
        self.session.auth_v2(req)

    def auth_request_v3(self, req) -> None:
        self.session.auth_v3(req)

    def start_tls_v3(self, req) -> None:
        tls.start_tls(self, req, getattr(self.server, "tls", None))

    def upgraded(self, transport, session: dict) -> None:
        """The TLS transport replaces the plain one (bk.server.tls): the answers held while
        HANDSHAKING leave encrypted."""
        self.transport = transport
        self._fd = -1  # the socket carries TLS records now: only the transport writes
        transport.set_write_buffer_limits(high=self.max_response_bytes)
        if self._reading_paused:  # start_tls resumes reading; backpressure still applies
            transport.pause_reading()
        self.tls = session
        self.phase_event(Event.HANDSHAKE_DONE)
        self._schedule_flush()

    def close(self) -> None:
        """Close after the answers owed so far (they are handed to the transport first)."""
        self._flush()
        if self.transport is not None and not self.closed:
            self.phase_event(Event.CLOSE)
            self.transport.close()

    def abort(self) -> None:
        """Drop the connection now, answers unsent (malformed bytes, a failed TLS handshake, an
        answer whose entries could not be read)."""
        if not self.closed:
            self.phase_event(Event.CLOSE)
        self.transport.abort()
