"""An in-process cluster of real bookie servers, for tests and embedding.

    async with InProcessCluster(tmp_path, bookies=3) as cluster:
        async with BookKeeper(cluster.metadata_uri) as bkc: ...

Each bookie is a real BookieServer (storage engine, uvloop listener on a free
loopback port, registration) in this process. The metadata store is the
in-memory one (`mem://<unique>/ledgers`) unless a ZooKeeper URI is given.
"""
from __future__ import annotations

import asyncio
import os
import uuid

from bk.config import load_config
from bk.meta import open_store
from bk.meta.cluster import init_new_cluster, is_initialized
from bk.server import BookieServer

from .cluster import ledger_dirs_of
from .ports import free_port
from .powerloss import halt_without_checkpoint




class InProcessCluster:
    def __init__(self, data_dir, bookies: int = 3, metadata_uri: str | None = None, prepare_bookie=None,
                 ledger_dirs_per_bookie: int = 1, **overrides):
        self.data_dir = str(data_dir)
        # called with every Bookie before its server starts it (tests only: bk.testing.breaks)
        self.prepare_bookie = prepare_bookie
        self.count = bookies
        self.ledger_dirs_per_bookie = ledger_dirs_per_bookie  # ledger_dirs: see ledger_dirs_of
        self.metadata_uri = metadata_uri or f"mem://cluster-{uuid.uuid4().hex[:12]}/ledgers"
        self.overrides = overrides
        self.servers: dict[int, BookieServer] = {}
        self.ports: dict[int, int] = {}
        self.store = None

    def config(self, i: int, **extra):
        d = os.path.join(self.data_dir, f"bookie-{i}")
        port = self.ports.setdefault(i, free_port())
        values = dict(metadata_service_uri=self.metadata_uri, bookie_port=port, advertised_address="127.0.0.1",
                      journal_dirs=[os.path.join(d, "journal")],
                      ledger_dirs=ledger_dirs_of(d, self.ledger_dirs_per_bookie), flush_interval_ms=200,
                      write_cache_max_size_bytes="16MiB", read_cache_max_size_bytes="16MiB",
                      disk_check_interval_ms=1000, http_server_port=0)
        values.update(self.overrides)
        values.update(extra)
        return load_config(overrides=values, env={})

    def bookie_id(self, i: int) -> str:
        return f"127.0.0.1:{self.ports[i]}"

    @property
    def bookie_ids(self) -> list[str]:
        return [self.bookie_id(i) for i in sorted(self.servers)]

    async def start(self) -> "InProcessCluster":
        self.store = await open_store(self.metadata_uri)
        if not await is_initialized(self.store):
            await init_new_cluster(self.store)
        for i in range(self.count):
            await self.start_bookie(i)
        return self

    async def start_bookie(self, i: int, **extra) -> BookieServer:
        server = BookieServer(self.config(i, **extra))
        if self.prepare_bookie is not None:
            self.prepare_bookie(server.bookie)
        await server.start()
        self.servers[i] = server
        return server

    async def stop_bookie(self, i: int) -> None:
        server = self.servers.pop(i)
        await server.stop()

    def bookie_dirs(self, i: int) -> list[str]:
        """Every directory bookie i writes (its journal and ledger dirs, its index under them)."""
        cfg = self.config(i)
        return sorted({os.path.abspath(d) for d in [*cfg.journal_dirs, *cfg.ledger_dirs, cfg.resolved_index_dir]})

    async def crash_bookie(self, i: int, on_frozen=None) -> None:
        """Crash bookie i as kill -9 does: abruptly (docs/CHAOS.md, "Crashes are abrupt").

        At the crash instant, before any await: a crash gate closes over the bookie's
        directories (bk.testing.diskfaults: every later write, fsync, rename, unlink or index
        commit of its files fails, and a thread blocked in a hung disk operation fails
        instead of going on), and every connection is aborted without a flush (answers not yet
        on the wire are never sent). Then, with nothing more able to reach its disk, the
        remains are taken apart: no drain of requests in flight, no final checkpoint (one in
        progress stops at its next write: its index commit never happens), no final fsync of
        the journals. What the bookie wrote before the instant stays (the page cache survives
        a kill -9); `on_frozen()`, if given, runs once every thread of the bookie has stopped
        and before the gate opens again (a power cut: bk.testing.powerloss rolls the files
        back there). Its registration goes with its metadata session."""
        await self.crash_bookies([i], on_frozen)

    async def crash_bookies(self, indices, on_frozen=None) -> None:
        """crash_bookie of several bookies at ONE instant (a power cut of a rack or of the whole
        cluster): every one is frozen (one crash gate step over all their directories, every
        connection aborted, no await in between) before any is taken apart, so no write or
        fsync reaches any of their disks after the instant; `on_frozen()` runs once all their
        threads have stopped, before any gate opens."""
        from bk.testing.diskfaults import DiskFaults
        from bk import fileio
        had_injector = fileio.faults is not None
        faults = DiskFaults.install()
        servers = [self.servers.pop(i) for i in indices]
        dirs = [d for i in indices for d in self.bookie_dirs(i)]
        faults.close_gate(*dirs)
        for server in servers:
            _cut_off(server)
        try:
            errors = []
            for server in servers:
                try:
                    await _take_apart(server)
                except Exception as e:  # noqa: BLE001 - the others must stop all the same
                    errors.append(e)
            if errors:
                raise errors[0]
            if on_frozen is not None:
                on_frozen()
        finally:
            for d in dirs:
                faults.open_gate(d)
            if not had_injector and not faults.rules() and not faults._gates:
                DiskFaults.uninstall()  # back to zero cost

    async def add_bookie(self, **extra) -> int:
        i = max(self.ports, default=-1) + 1
        await self.start_bookie(i, **extra)
        return i

    async def stop(self) -> None:
        for i in list(self.servers):
            await self.stop_bookie(i)
        if self.store is not None:
            await self.store.close()
            self.store = None

    async def __aenter__(self) -> "InProcessCluster":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()


def _cut_off(server) -> None:
    """The crash instant, without an await: connections aborted without a flush (answers not
    yet on the wire are never sent), the listener and the disk monitor gone."""
    for conn in list(server.connections):
        conn.closed = True  # nothing more is written to it, not even by a direct socket write
        conn._fd = -1
        if conn.transport is not None:
            conn.transport.abort()
    if server._listener is not None:
        server._listener.close()
    if server._monitor is not None:
        server._monitor.cancel()


async def _take_apart(server) -> None:
    """What is left of a crashed bookie (behind its closed crash gate), stopped without a
    drain, a final checkpoint or a final fsync."""
    for task in (server.repair, server.autorecovery):
        if task is not None:
            await task.stop()
    server.repair = server.autorecovery = None
    for side in (server.http, server.admin):  # their sockets die with a killed process
        if side is not None:
            await side.stop()
    server.http = server.admin = None
    # Off the loop thread: a checkpoint in progress on the storage thread may wait for the
    # loop (LedgerStorage._on_owner) before halt's join can return (chaos seed 25 hung here).
    await asyncio.to_thread(halt_without_checkpoint, server.bookie)
    if server.registration is not None:
        await server.registration.close()
    if server.gc_policy is not None:
        await server.gc_policy.close()
    await server.store.close()  # its ephemeral registration goes with the session
