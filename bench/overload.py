"""Overload: one real `bk bookie` process under abusive clients (docs/OVERLOAD.md).

    python -m bench.overload                          # every scenario, full sizes, own ZooKeeper
    python -m bench.overload --json overload.json     # the figures as JSON too
    python -m bench.overload --only idle,storm --idle-connections 2000

Scenarios, each against a fresh bookie (LocalCluster, one bookie) while a
well-behaved client (bk's BookKeeper client, E=WQ=AQ=1) writes and reads back
a ledger on it:

- idle: `--idle-connections` TCP connections that never send a byte;
  memory per idle connection = (RssAnon with them - RssAnon before) / count.
- slow-reader: `--slow-readers` connections each send `--slow-reads` reads of
  `--big-entry-bytes` entries and never read an answer (a tiny receive buffer).
- storm: `--storm-threads` threads open connections as fast as they can for
  `--storm-s` seconds: closed at once, reset (RST), left half a frame in, or
  kept open in groups of STORM_KEEP then dropped together.
- flood-journal / flood-no-journal: `--flood-connections` connections send
  adds of `--flood-entry-bytes` as fast as the bookie reads them, beyond its
  write cache, for `--flood-s` seconds; then AFTER_FLOOD_ADDS paced adds on a
  fresh connection, which must all succeed, and every acknowledged entry is
  read back byte for byte. The budget is the bookie-wide one (issue 27,
  `flood_budget_bytes`) once that is below the per-connection limits' sum.
- long-polls (bench/overload_long_polls.py): `--long-polls` v3 long polls
  parked over `--long-poll-connections` connections while the bookie's CPU
  seconds are measured over `--long-poll-idle-s`, against the same interval with
  none parked; then one add moves the LAC and every one must be answered.

Every scenario reports the bookie's memory before and at its peak (/proc/<pid>/status,
sampled every 50 ms) against a bound, its open descriptors and sockets before and
after (/proc/<pid>/fd), and whether the bookie is still up. The bound is on the
anonymous resident memory (RssAnon; see Measured for why not the mapped index
file's pages, which VmRSS adds and which are reported): RssAnon before the
scenario + the bookie's caches (write + read) + what the scenario's clients may
hold by the per-connection limits (`clients_budget_mib`) + MARGIN_BYTES. The
integration tests (tests/integration/test_overload.py) run the same
scenarios at smaller sizes and assert the bound, the descriptors and the data.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import shutil
import socket
import struct
import threading
import time

from bk.client import BookKeeper
from bk.proto import AddRequest, FrameDecoder, ReadRequest, StatusCode, encode_request, master_key
from bk.testing.cluster import LocalCluster

from . import child_env, scratch_dir
from .procmem import RssSampler, read_status_kib
from .stats import MiB

KiB = 1024
MARGIN_BYTES = 64 * MiB  # allocator slack (freed malloc arenas of the bookie's threads), LMDB's write txn
IDLE_CONNECTION_BUDGET_BYTES = 16 * KiB  # stated per idle connection (measured: docs/OVERLOAD.md)
READ_WAIT_BUDGET_BYTES = 1 * KiB  # one read waiting for a read slot: its request and a deque cell
ADD_REQUEST_BUDGET_BYTES = 1 * KiB  # one add in progress apart from its body: decoded request, journal slot
AFTER_FLOOD_ADDS = 1000  # paced adds once the flood stopped: every one must succeed
STORM_KEEP = 200  # the storm's kept-open connections are dropped in groups of this many
KEY = master_key(b"overload")
PASSWORD = b"pw"
_ENTRY_HEADER = struct.Struct(">qqq")  # ledger id, entry id, LAC: the part of an entry the bookie checks

# the bookie under test: small caches, and adds wait only briefly for write-cache room so
# that refusals show up in a short flood
BOOKIE_SETTINGS = dict(write_cache_max_size_bytes="16MiB", read_cache_max_size_bytes="16MiB",
                       write_cache_full_wait_ms=50, max_response_bytes_per_connection=4 * MiB,
                       max_pending_bytes_per_connection=8 * MiB, flush_interval_ms=500,
                       http_server_enabled=False, zk_timeout_ms=10_000)


def settings_bytes(settings: dict, key: str) -> int:
    from bk.config import load_config
    # 0 for a setting this bk does not have (an older tree run for a before/after figure): unlimited
    return getattr(load_config(overrides={key: settings[key]} if key in settings else {}, env={}), key, 0)


# ------------------------------------------------------------------ the bookie, seen from /proc
def rss_bytes(pid: int) -> int:
    return read_status_kib(pid, ("VmRSS",)).get("VmRSS", 0) * KiB


def anon_bytes(pid: int) -> int:
    return read_status_kib(pid, ("RssAnon",)).get("RssAnon", 0) * KiB


def fd_count(pid: int, sockets_only: bool = False) -> int:
    """The bookie's open descriptors (/proc/<pid>/fd), or only its sockets: entry logs
    and journals open and close as they roll, client connections are sockets."""
    if not sockets_only:
        return len(os.listdir(f"/proc/{pid}/fd"))
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return n


async def wait_fds(pid: int, at_most: int, timeout_s: float = 30.0, sockets_only: bool = False) -> int:
    """The descriptor count once it is at most `at_most` (or after the timeout); waits
    on the loop, so the client's own closing sockets get closed meanwhile."""
    deadline = time.monotonic() + timeout_s
    n = fd_count(pid, sockets_only)
    while n > at_most and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        n = fd_count(pid, sockets_only)
    return n


def raise_nofile() -> int:
    """This process's soft open-files limit up to the hard one (idle connections need one each)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class Target:
    """The bookie under test: its process, port and metadata URI."""

    def __init__(self, cluster: LocalCluster):
        self.cluster = cluster
        self.proc = cluster.bookies[0]
        self.pid = self.proc.proc.pid
        self.port = int(self.proc.bookie_id.rpartition(":")[2])
        self.uri = cluster.metadata_uri
        self.settings = {**BOOKIE_SETTINGS, **cluster.overrides}

    @property
    def alive(self) -> bool:
        return self.proc.alive

    def caches_bytes(self) -> int:
        return sum(settings_bytes(self.settings, k) for k in ("write_cache_max_size_bytes",
                                                              "read_cache_max_size_bytes"))


@contextlib.contextmanager
def bookie(data_dir: str, zk_connect: str | None, **settings):
    cluster = LocalCluster(data_dir, bookies=1, zk_connect=zk_connect, env=child_env(),
                           **{**BOOKIE_SETTINGS, **settings})
    cluster.start()
    try:
        yield Target(cluster)
    finally:
        cluster.stop()


# ------------------------------------------------------------------ the well-behaved client
async def good_client(uri: str, entries: int = 200, entry_bytes: int = 1024, seed: int = 0) -> dict:
    """Create a ledger on the bookie, add, close, read back; raises on any wrong byte."""
    rng = random.Random(seed)
    data = [rng.randbytes(entry_bytes) for _ in range(entries)]
    async with BookKeeper(uri) as bkc:
        lh = await bkc.create_ledger(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1,
                                     digest_type="CRC32C", password=PASSWORD)
        ids = await asyncio.gather(*(lh.add_entry(d) for d in data))
        await lh.close()
        rh = await bkc.open_ledger(lh.ledger_id, password=PASSWORD)
        got = await rh.read_entries(0, entries - 1)
    if list(ids) != list(range(entries)) or [bytes(x.data) for x in got] != data:
        raise AssertionError(f"the well-behaved client read back wrong data from ledger {lh.ledger_id}")
    return {"ledger_id": lh.ledger_id, "entries": entries}


async def good_client_rounds(uri: str, stop: asyncio.Event, seed: int = 0, **kw) -> dict:
    """good_client over and over until `stop` (at least once); counts the rounds."""
    rounds = 0
    while True:
        await good_client(uri, seed=seed * 1000 + rounds, **kw)
        rounds += 1
        if stop.is_set():
            return {"good_rounds": rounds}


class Measured:
    """Memory peaks and descriptors around one scenario.

    The bound applies to the anonymous resident memory (RssAnon: the heap, the caches,
    buffers, every thread's malloc arenas). VmRSS adds RssFile, the resident pages of
    mapped files: the index is an LMDB file mapped into the bookie, so its pages grow
    with the entries stored, not with the load, and the kernel reclaims them (reported,
    not bounded)."""

    def __init__(self, target: Target):
        """Use `await Measured.start(target)`."""
        self.target = target
        self.anon_before = anon_bytes(target.pid)
        self.rss_before = rss_bytes(target.pid)
        self.fds_before = fd_count(target.pid)
        self.sockets_before = fd_count(target.pid, sockets_only=True)
        self.samplers = {field: RssSampler({"bookie": target.pid}, interval_s=0.05, use_hwm=False,
                                           field=field).start() for field in ("VmRSS", "RssAnon")}

    @classmethod
    async def start(cls, target: Target) -> "Measured":
        """Once the bookie's descriptors are steady (the warm-up client's sockets closed)."""
        last, steady = fd_count(target.pid), 0
        for _ in range(50):
            await asyncio.sleep(0.1)
            n = fd_count(target.pid)
            steady = steady + 1 if n == last else 0
            last = n
            if steady >= 3:
                break
        return cls(target)

    async def result(self, budget_bytes: int, **figures) -> dict:
        t = self.target
        peak = {field: int(sampler.stop()["bookie"] * MiB) for field, sampler in self.samplers.items()}
        sockets_after = await wait_fds(t.pid, self.sockets_before, sockets_only=True)
        fds_after = await wait_fds(t.pid, self.fds_before, timeout_s=1.0)
        bound = self.anon_before + t.caches_bytes() + budget_bytes + MARGIN_BYTES
        mib = lambda n: round(n / MiB, 1)  # noqa: E731
        return {"alive": t.alive, "anon_before_mib": mib(self.anon_before), "anon_peak_mib": mib(peak["RssAnon"]),
                "anon_bound_mib": mib(bound), "within_bound": peak["RssAnon"] <= bound,
                "rss_before_mib": mib(self.rss_before), "rss_peak_mib": mib(peak["VmRSS"]),
                "rss_after_mib": mib(rss_bytes(t.pid)), "clients_budget_mib": round(budget_bytes / MiB, 2),
                "fds_before": self.fds_before, "fds_after": fds_after, "sockets_before": self.sockets_before,
                "sockets_after": sockets_after, **figures}


# ------------------------------------------------------------------ 1. idle connections
async def idle_connections(target: Target, count: int) -> dict:
    raise_nofile()
    await good_client(target.uri, seed=1)  # warm: client paths, ledger files, index
    m = await Measured.start(target)
    socks, failed = [], 0
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(s, ("127.0.0.1", target.port))
        except OSError:
            failed += 1
            s.close()
            continue
        socks.append(s)
    accepted = fd_count(target.pid)
    deadline = time.monotonic() + 60
    while accepted < m.fds_before + len(socks) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        accepted = fd_count(target.pid)
    await asyncio.sleep(0.5)
    rss_with, anon_with = rss_bytes(target.pid), anon_bytes(target.pid)
    good = await good_client(target.uri, seed=2)
    for s in socks:
        s.close()
    per_conn = (anon_with - m.anon_before) / max(1, len(socks))
    return await m.result(count * IDLE_CONNECTION_BUDGET_BYTES, connections=len(socks), connect_failures=failed,
                    bookie_fds_with_connections=accepted, rss_with_connections_mib=round(rss_with / MiB, 1),
                    anon_with_connections_mib=round(anon_with / MiB, 1),
                    bytes_per_idle_connection=int(per_conn), good_client=good)


# ------------------------------------------------------------------ 2. a reader that never reads
async def write_big_ledger(uri: str, entries: int, entry_bytes: int) -> int:
    async with BookKeeper(uri) as bkc:
        lh = await bkc.create_ledger(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1,
                                     digest_type="CRC32C", password=PASSWORD)
        block = random.Random(7).randbytes(entry_bytes)
        await asyncio.gather(*(lh.add_entry(block) for _ in range(entries)))
        await lh.close()
        return lh.ledger_id


def _send_reads(port: int, ledger_id: int, entries: int, reads: int) -> tuple[socket.socket, int]:
    """A connection with a tiny receive buffer that sends `reads` reads and never reads."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    frames = b"".join(encode_request(ReadRequest(0, ledger_id, i % entries)) for i in range(reads))
    s.settimeout(5.0)
    try:
        s.sendall(frames)
        sent = reads
    except socket.timeout:  # the bookie stopped reading requests: backpressure
        sent = -1
    return s, sent


def slow_reader_budget_bytes(target: Target, reads: int, entry_bytes: int) -> int:
    """What one non-reading connection may hold: the response limit, one answer per read
    slot and the one that crossed the limit, and its waiting reads (at most twice the
    request limit are taken in; beyond that they are refused)."""
    s = target.settings
    taken = min(reads, 2 * s.get("max_pending_requests_per_connection", 10_000))
    slots = s.get("num_read_worker_threads", 2) + 1
    return (settings_bytes(s, "max_response_bytes_per_connection") + slots * (entry_bytes + 64)
            + taken * READ_WAIT_BUDGET_BYTES)


async def slow_reader(target: Target, readers: int, reads: int, entries: int, entry_bytes: int,
                      hold_s: float) -> dict:
    ledger_id = await write_big_ledger(target.uri, entries, entry_bytes)
    await good_client(target.uri, seed=3)
    m = await Measured.start(target)
    loop = asyncio.get_running_loop()
    conns = await asyncio.gather(*(loop.run_in_executor(None, _send_reads, target.port, ledger_id, entries, reads)
                                   for _ in range(readers)))
    stop = asyncio.Event()
    good = asyncio.ensure_future(good_client_rounds(target.uri, stop, seed=4))
    await asyncio.sleep(hold_s)
    stop.set()
    good_result = await good
    for s, _sent in conns:
        s.close()
    budget = readers * slow_reader_budget_bytes(target, reads, entry_bytes)
    return await m.result(budget, readers=readers, reads_per_reader=reads, entry_bytes=entry_bytes,
                    unbounded_answer_mib=round(readers * reads * entry_bytes / MiB), good_client=good_result,
                    senders_blocked=sum(1 for _s, sent in conns if sent < 0))


# ------------------------------------------------------------------ 3. a connection storm
def _storm_thread(port: int, until: float, seed: int, counts: dict, lock: threading.Lock) -> None:
    rng = random.Random(seed)
    kept: list[socket.socket] = []
    made = failed = 0
    half_frame = struct.pack(">i", 1000) + b"\0" * 10  # a length announcing more than ever comes
    while time.monotonic() < until:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            failed += 1
            continue
        made += 1
        kind = rng.randrange(4)
        if kind == 0:
            s.close()
        elif kind == 1:  # reset: SO_LINGER 0 makes close send RST
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        elif kind == 2:
            with contextlib.suppress(OSError):
                s.sendall(half_frame)
            s.close()
        else:
            kept.append(s)
            if len(kept) >= STORM_KEEP:
                for k in kept:
                    k.close()
                kept.clear()
    for k in kept:
        k.close()
    with lock:
        counts["connections"] += made
        counts["connect_failures"] += failed


async def storm(target: Target, threads: int, seconds: float) -> dict:
    raise_nofile()
    await good_client(target.uri, seed=5)
    m = await Measured.start(target)
    counts = {"connections": 0, "connect_failures": 0}
    lock = threading.Lock()
    until = time.monotonic() + seconds
    workers = [threading.Thread(target=_storm_thread, args=(target.port, until, i, counts, lock), daemon=True)
               for i in range(threads)]
    for w in workers:
        w.start()
    stop = asyncio.Event()
    good = asyncio.ensure_future(good_client_rounds(target.uri, stop, seed=6))
    while any(w.is_alive() for w in workers):
        await asyncio.sleep(0.1)
    stop.set()
    good_result = await good
    after = await good_client(target.uri, seed=7)
    budget = threads * STORM_KEEP * IDLE_CONNECTION_BUDGET_BYTES
    return await m.result(budget, storm_s=seconds, threads=threads, good_client=good_result, good_after=after, **counts)


# ------------------------------------------------------------------ 4. an add flood
def entry_body(ledger_id: int, entry_id: int, block: bytes) -> bytes:
    return _ENTRY_HEADER.pack(ledger_id, entry_id, -1) + struct.pack(">q", ledger_id * 1_000_003 + entry_id) + block


async def _flood_one(port: int, ledger_id: int, block: bytes, until: float, acked: list, counts: dict) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    decoder = FrameDecoder()
    sent = answered = 0

    async def read_answers():
        nonlocal answered
        while True:
            chunk = await reader.read(1 << 16)
            if not chunk:
                break
            for r in decoder.feed_responses(chunk):
                answered += 1
                if r.rc == StatusCode.EOK:
                    acked.append((ledger_id, r.entry_id))
                elif r.rc == StatusCode.ETOOMANYREQUESTS:
                    counts["too_many_requests"] += 1
                else:
                    counts["other_errors"] += 1

    task = asyncio.ensure_future(read_answers())
    try:
        while time.monotonic() < until:
            writer.write(encode_request(AddRequest(0, KEY, ledger_id, sent, entry_body(ledger_id, sent, block))))
            sent += 1
            await writer.drain()  # the bookie's backpressure reaches the flooder here
        counts["adds_sent"] += sent
        deadline = time.monotonic() + 60
        while answered < sent and not task.done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{sent - answered} adds of ledger {ledger_id} never answered")
            await asyncio.sleep(0.02)
        if answered < sent:
            raise ConnectionError(f"the bookie closed a flood connection with {sent - answered} adds unanswered")
    finally:
        task.cancel()
        writer.close()


async def _paced_adds(port: int, ledger_id: int, block: bytes, count: int, window: int = 32) -> list:
    """After the flood: adds `window` at a time, each window answered before the next;
    every one must succeed (the bookie drained). Returns them as (ledger, entry)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    decoder = FrameDecoder()
    done: list = []
    try:
        for first in range(0, count, window):
            ids = range(first, min(count, first + window))
            writer.write(b"".join(encode_request(AddRequest(0, KEY, ledger_id, e, entry_body(ledger_id, e, block)))
                                  for e in ids))
            got: list = []
            while len(got) < len(ids):
                chunk = await asyncio.wait_for(reader.read(1 << 16), 30)
                if not chunk:
                    raise ConnectionError("the bookie closed the connection of the adds after the flood")
                got += decoder.feed_responses(chunk)
            bad = [(r.entry_id, r.rc) for r in got if r.rc != StatusCode.EOK]
            if bad:
                raise AssertionError(f"adds after the flood refused: {bad[:5]}")
            done += [(ledger_id, r.entry_id) for r in got]
    finally:
        writer.close()
    return done


async def _read_back(port: int, acked: list, block: bytes) -> int:
    """Read every acknowledged entry back over one connection; returns the number checked."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    decoder = FrameDecoder()
    checked = 0
    try:
        for i in range(0, len(acked), 256):
            part = acked[i:i + 256]
            writer.write(b"".join(encode_request(ReadRequest(0, lid, eid)) for lid, eid in part))
            got = []
            while len(got) < len(part):
                chunk = await asyncio.wait_for(reader.read(1 << 20), 30)
                if not chunk:
                    raise ConnectionError("the bookie closed the read-back connection")
                got += decoder.feed_responses(chunk)
            for r in got:
                if r.rc != StatusCode.EOK or bytes(r.body) != entry_body(r.ledger_id, r.entry_id, block):
                    raise AssertionError(f"acknowledged entry {r.ledger_id}/{r.entry_id} read back as rc {r.rc}")
                checked += 1
    finally:
        writer.close()
    return checked


async def flood(target: Target, connections: int, entry_bytes: int, seconds: float) -> dict:
    await good_client(target.uri, seed=8)
    old_ledger = await write_big_ledger(target.uri, 20, 4 * KiB)  # read during the flood
    m = await Measured.start(target)
    block = random.Random(9).randbytes(entry_bytes)
    acked: list = []
    counts = {"adds_sent": 0, "too_many_requests": 0, "other_errors": 0}
    until = time.monotonic() + seconds
    base = 1_000_000 + random.Random().randrange(1_000_000) * 1000
    flooders = [asyncio.ensure_future(_flood_one(target.port, base + i, block, until, acked, counts))
                for i in range(connections)]
    reads_during = 0
    async with BookKeeper(target.uri) as bkc:
        rh = await bkc.open_ledger(old_ledger, password=PASSWORD, recovery=False)
        while time.monotonic() < until:
            reads_during += len(await rh.read_entries(0, 19))
    await asyncio.gather(*flooders)
    flood_acked = len(acked)
    after = await _paced_adds(target.port, base + connections, block, AFTER_FLOOD_ADDS)
    good = await good_client(target.uri, seed=10)
    checked = await _read_back(target.port, acked + after, block)
    budget = flood_budget_bytes(target, connections, entry_bytes)
    return await m.result(budget, connections=connections, entry_bytes=entry_bytes, flood_s=seconds,
                    adds_acked=flood_acked, flood_mib=round(flood_acked * entry_bytes / MiB), **counts,
                    reads_during_flood=reads_during, adds_after=len(after), acked_read_back=checked,
                    good_after=good)


def flood_budget_bytes(target: Target, connections: int, entry_bytes: int) -> int:
    """What flooding connections may make the bookie hold beyond its caches: their add bodies
    in progress, bounded per connection (max_pending_bytes_per_connection each) and for the
    whole bookie (twice max_add_bytes_in_progress_limit plus one add: bk.server.limits), the
    adds' other bytes (at most twice max_adds_in_progress_limit of them), and per connection
    its fixed cost and one frame still arriving (the decoder's partial frame)."""
    s = target.settings
    per_connection = connections * settings_bytes(s, "max_pending_bytes_per_connection")
    bookie_wide = 2 * settings_bytes(s, "max_add_bytes_in_progress_limit") + entry_bytes
    if bookie_wide <= 0:  # 0 = unlimited
        bookie_wide = per_connection
    adds = 2 * settings_bytes(s, "max_adds_in_progress_limit") or connections * 2 * 10_000
    entries_in_flight = min(adds, connections * 2 * settings_bytes(s, "max_pending_requests_per_connection"))
    return (min(per_connection, bookie_wide) + entries_in_flight * ADD_REQUEST_BUDGET_BYTES
            + connections * (IDLE_CONNECTION_BUDGET_BYTES + entry_bytes + 64))


# ------------------------------------------------------------------ the tool
SCENARIOS = ("idle", "slow-reader", "storm", "flood-journal", "flood-no-journal", "long-polls")


async def run_scenario(name: str, target: Target, args) -> dict:
    if name == "idle":
        return await idle_connections(target, args.idle_connections)
    if name == "slow-reader":
        return await slow_reader(target, args.slow_readers, args.slow_reads, args.big_entries,
                                 args.big_entry_bytes, args.slow_hold_s)
    if name == "storm":
        return await storm(target, args.storm_threads, args.storm_s)
    if name == "long-polls":
        from .overload_long_polls import long_polls
        return await long_polls(target, args.long_polls, args.long_poll_connections, args.long_poll_idle_s)
    return await flood(target, args.flood_connections, args.flood_entry_bytes, args.flood_s)


def main(argv=None) -> int:
    from bk import eventloop
    from bk.testing.zookeeper import LocalZooKeeper

    p = argparse.ArgumentParser(prog="python -m bench.overload", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios: " + ", ".join(SCENARIOS))
    p.add_argument("--idle-connections", type=int, default=10_000)
    p.add_argument("--slow-readers", type=int, default=4)
    p.add_argument("--slow-reads", type=int, default=5000)
    p.add_argument("--big-entries", type=int, default=32)
    p.add_argument("--big-entry-bytes", type=int, default=1 * MiB)
    p.add_argument("--slow-hold-s", type=float, default=10.0)
    p.add_argument("--storm-threads", type=int, default=4)
    p.add_argument("--storm-s", type=float, default=15.0)
    p.add_argument("--flood-connections", type=int, default=4)
    p.add_argument("--flood-entry-bytes", type=int, default=64 * KiB)
    p.add_argument("--flood-s", type=float, default=15.0)
    p.add_argument("--long-polls", type=int, default=10_000)
    p.add_argument("--long-poll-connections", type=int, default=100)
    p.add_argument("--long-poll-idle-s", type=float, default=10.0)
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON here")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        p.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    raise_nofile()
    base = scratch_dir("overload")
    zk = LocalZooKeeper(os.path.join(base, "zookeeper")).start()
    results = {"open_files_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0], "bookie_settings": BOOKIE_SETTINGS,
               "margin_mib": MARGIN_BYTES // MiB, "scenarios": {}}
    try:
        for name in names:
            extra = {"journal_write_data": False} if name == "flood-no-journal" else {}
            with bookie(os.path.join(base, name), f"{zk.connect_string}/{name}", **extra) as target:
                started = time.monotonic()
                r = eventloop.run(run_scenario(name, target, args))
                r["wall_s"] = round(time.monotonic() - started, 1)
                results["scenarios"][name] = r
                print(f"{name}: " + ", ".join(f"{k}={v}" for k, v in r.items()), flush=True)
    finally:
        zk.stop()
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    ok = all(r["alive"] and r["within_bound"] and r["sockets_after"] <= r["sockets_before"]
             for r in results["scenarios"].values())
    print("all scenarios: bookie up, RSS within bound, no descriptor leak" if ok else "SOME SCENARIO FAILED")
    return 0 if ok else 1



if __name__ == "__main__":
    raise SystemExit(main())
