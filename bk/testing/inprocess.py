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

from .ports import free_port
from .powerloss import halt_without_checkpoint




class InProcessCluster:
    def __init__(self, data_dir, bookies: int = 3, metadata_uri: str | None = None, **overrides):
        self.data_dir = str(data_dir)
        self.count = bookies
        self.metadata_uri = metadata_uri or f"mem://cluster-{uuid.uuid4().hex[:12]}/ledgers"
        self.overrides = overrides
        self.servers: dict[int, BookieServer] = {}
        self.ports: dict[int, int] = {}
        self.store = None

    def config(self, i: int, **extra):
        d = os.path.join(self.data_dir, f"bookie-{i}")
        port = self.ports.setdefault(i, free_port())
        values = dict(metadata_service_uri=self.metadata_uri, bookie_port=port, advertised_address="127.0.0.1",
                      journal_dirs=[os.path.join(d, "journal")], ledger_dirs=[os.path.join(d, "ledgers")],
                      flush_interval_ms=200, write_cache_max_size_bytes="16MiB",
                      read_cache_max_size_bytes="16MiB", disk_check_interval_ms=1000,
                      http_server_port=0)
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
        await server.start()
        self.servers[i] = server
        return server

    async def stop_bookie(self, i: int) -> None:
        server = self.servers.pop(i)
        await server.stop()

    async def crash_bookie(self, i: int) -> None:
        """Stop bookie i as kill -9 would leave it: connections dropped, no final checkpoint
        (what only the write cache held is gone), the unclean-shutdown flag still set, and
        its registration gone with its metadata session."""
        server = self.servers.pop(i)
        for task in (server.repair, server.autorecovery):
            if task is not None:
                await task.stop()
        server.repair = server.autorecovery = None
        for side in (server.http, server.admin):  # their sockets die with a killed process
            if side is not None:
                await side.stop()
        server.http = server.admin = None
        if server._monitor is not None:
            server._monitor.cancel()
        if server._listener is not None:
            server._listener.close()
        for conn in list(server.connections):
            conn.close()
        await server.processor.drain()
        # Off the loop thread: a checkpoint in progress on the storage thread waits for the loop
        # (LedgerStorage._on_owner) before halt's join can return (chaos seed 25 hung here).
        await asyncio.to_thread(halt_without_checkpoint, server.bookie)
        if server.registration is not None:
            await server.registration.close()
        if server.gc_policy is not None:
            await server.gc_policy.close()
        await server.store.close()  # its ephemeral registration goes with the session

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
