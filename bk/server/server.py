"""BookieServer: one bookie process = metadata session + cookies + storage
engine + uvloop listener + registration + disk monitor.

Start order matters: cookies are checked before the engine touches any
directory (a new bookie needs empty directories); the engine replays its journal
before the listener accepts; the bookie registers in ZooKeeper only once it can
serve, so clients never pick a bookie that is not listening.

Stop order (SIGTERM / Ctrl-C): stop accepting, let in-flight requests finish
(bounded), close connections, checkpoint and clear the unclean-shutdown flag
(Bookie.stop), deregister, close the metadata session. AutoRecovery (when
enabled) starts last, once the bookie is registered, and stops first.
"""
from __future__ import annotations

import asyncio
import logging
import os

from bk.bookie import Bookie
from bk.config import BookieConfig
from bk.errors import BKError
from bk.meta import open_store
from bk.meta.cluster import is_initialized
from bk.meta.cookie import verify_cookies
from bk.meta.registration import RegistrationManager

from .admin import AdminServer, gc_ops
from .connection import BookieConnection
from .gc_policy import ScanAndCompareGarbageCollector
from .processor import RequestProcessor

log = logging.getLogger(__name__)

STOP_GRACE_S = 10.0


class ClusterNotInitializedError(BKError):
    pass


class BookieServer:
    def __init__(self, config: BookieConfig, *, store=None):
        self.config = config
        self.bookie_id = config.bookie_id
        self.bookie = Bookie(config)
        self.processor = RequestProcessor(self.bookie, config)
        self.connections: set[BookieConnection] = set()
        self.store = store
        self._own_store = store is None
        self.registration: RegistrationManager | None = None
        self._listener: asyncio.AbstractServer | None = None
        self._monitor: asyncio.Task | None = None
        self._registered_readonly: bool | None = None
        self._forced_read_only = config.force_read_only
        self.gc_policy: ScanAndCompareGarbageCollector | None = None
        self.admin: AdminServer | None = None  # the admin socket (bk.server.admin, docs/GC.md)
        self.autorecovery = None  # bk.replication.AutoRecovery when autorecovery_enabled
        self.port: int | None = None
        self.started = False

    async def start(self) -> None:
        cfg = self.config
        if self.store is None:
            self.store = await open_store(cfg.metadata_service_uri)
        try:
            if not await is_initialized(self.store):
                raise ClusterNotInitializedError(
                    f"the cluster at {cfg.metadata_service_uri} is not initialised: "
                    f"run `bk shell --metadata-uri {cfg.metadata_service_uri} initnewcluster` first")
            index_dir = cfg.index_dir or None
            await verify_cookies(self.store, self.bookie_id, cfg.journal_dirs, cfg.ledger_dirs, index_dir)
            await self.bookie.start()
            await self._start_gc()
            self._listener = await asyncio.get_running_loop().create_server(
                lambda: BookieConnection(self), host=cfg.bind_address or cfg.advertised_address,
                port=cfg.bookie_port, reuse_address=True, backlog=1024)
            self.port = self._listener.sockets[0].getsockname()[1]
            self.registration = RegistrationManager(self.store)
            self._check_disks()
            await self._register()
            self._monitor = asyncio.ensure_future(self._disk_monitor())
            self.started = True
            if cfg.autorecovery_enabled:
                from bk.replication import AutoRecovery
                self.autorecovery = await AutoRecovery(cfg).start()
            log.info("bookie %s serving on port %d (journal %s, %d ledgers)", self.bookie_id, self.port,
                     "on" if cfg.journal_write_data else "OFF (BP-46)", len(self.bookie.storage.ledger_ids()))
        except BaseException:
            await self._teardown()
            raise

    async def stop(self) -> None:
        """Graceful stop; safe to call more than once."""
        await self._stop_autorecovery()
        if self._listener is not None:
            self._listener.close()
        if self._monitor is not None:
            self._monitor.cancel()
        if self.connections:  # let in-flight work finish, bounded
            waits = [c.idle.wait() for c in list(self.connections)]
            try:
                await asyncio.wait_for(asyncio.gather(*waits), STOP_GRACE_S)
            except asyncio.TimeoutError:
                log.warning("stopping with requests still in flight after %.0fs", STOP_GRACE_S)
        await self._teardown()
        log.info("bookie %s stopped", self.bookie_id)

    async def _stop_autorecovery(self) -> None:
        autorecovery, self.autorecovery = self.autorecovery, None
        if autorecovery is not None:
            await autorecovery.stop()

    async def _start_gc(self) -> None:
        """Scan-and-compare needs the metadata store: the policy is server/'s."""
        cfg = self.config
        self.gc_policy = ScanAndCompareGarbageCollector(self.store, cfg, self.bookie_id)
        self.bookie.gc.policy = self.gc_policy
        if cfg.admin_socket_enabled:
            admin = AdminServer(cfg.resolved_admin_socket_path, gc_ops(self.bookie.gc))
            if await admin.start():
                self.admin = admin

    async def _teardown(self) -> None:
        await self._stop_autorecovery()
        if self.admin is not None:
            await self.admin.stop()
            self.admin = None
        for conn in list(self.connections):
            conn.close()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        await self.processor.drain()
        if self.bookie._running:
            await self.bookie.stop()
        if self.registration is not None and self._registered_readonly is not None:
            try:
                await self.registration.unregister(self.bookie_id)
            except BKError as e:
                log.warning("could not deregister %s: %s", self.bookie_id, e)
            self._registered_readonly = None
        if self.registration is not None:
            await self.registration.close()
            self.registration = None
        if self.gc_policy is not None:
            await self.gc_policy.close()
            self.gc_policy = None
        if self._own_store and self.store is not None:
            await self.store.close()
            self.store = None
        self.started = False

    # ------------------------------------------------------------ registration and disks
    async def _register(self) -> None:
        readonly = self.bookie.read_only
        if readonly != self._registered_readonly:
            await self.registration.register(self.bookie_id, readonly=readonly)
            self._registered_readonly = readonly

    def _check_disks(self) -> None:
        """Read-only above disk_usage_threshold; writable again below the low-water mark."""
        cfg = self.config
        if self._forced_read_only:
            self.bookie.set_read_only(True)
            return
        worst = 0.0
        for d in {*cfg.ledger_dirs, *cfg.journal_dirs}:
            try:
                st = os.statvfs(d)
            except OSError:
                worst = 1.0
                continue
            if st.f_blocks:
                worst = max(worst, 1.0 - st.f_bavail / st.f_blocks)
        if worst >= cfg.disk_usage_threshold:
            self.bookie.set_read_only(True)
        elif worst < cfg.disk_usage_lwm_threshold:
            self.bookie.set_read_only(False)

    async def _disk_monitor(self) -> None:
        interval_s = self.config.disk_check_interval_ms / 1000.0
        while True:
            await asyncio.sleep(interval_s)
            try:
                self._check_disks()
                await self._register()
            except BKError as e:
                log.warning("disk check / registration failed: %s", e)

    async def set_read_only(self, read_only: bool) -> None:
        """Operator switch (and tests): change mode and re-register; wins over the disk check."""
        self._forced_read_only = read_only or self.config.force_read_only
        self.bookie.set_read_only(self._forced_read_only)
        await self._register()
