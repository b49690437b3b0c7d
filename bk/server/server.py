"""BookieServer: one bookie process = metadata session + cookies + storage
engine + uvloop listener + registration + disk monitor.

Start order matters: cookies are checked before the engine touches any
directory (a new bookie needs empty directories); the engine replays its journal
before the listener accepts; phase one (BP-46: with data-integrity checking on after
an unclean stop or lost cookies, and whatever the journal setting when the engine's
entry-log check found entries gone with their logs) puts the affected ledgers in limbo,
fencing the open ones whose last ensemble names this bookie, durably, and lost cookies
are stamped, before the listener accepts (bk.server.integrity); phase two (the
self-repair) starts once it listens, whenever the needs-integrity-check flag is set; the bookie registers in ZooKeeper only once
it can serve, so clients never pick a bookie that is not listening.

Stop order (SIGTERM / Ctrl-C), all of it within one deadline (shutdown_timeout_ms,
docs/OPERATIONS.md): stop accepting, stop the repair (it resumes at the next start) and
AutoRecovery, let in-flight requests finish (bounded), close connections (what is still in
flight fails with them), checkpoint and clear the unclean-shutdown flag (Bookie.stop: only
when the checkpoint made everything durable), deregister, close the metadata session. Every
wait on ZooKeeper or a peer is bounded by the time left; a step that runs out is abandoned
and named in `stop_abandoned`. AutoRecovery (when enabled) starts last, once the bookie is
registered, and stops first.
"""
from __future__ import annotations

import asyncio
import logging

from bk import metrics
from bk.bookie import Bookie
from bk.config import BookieConfig
from bk.errors import BKError
from bk.fileio import disk_space, on_space_thread
from bk.meta import open_store, store_options
from bk.meta.cluster import is_initialized
from bk.meta.cookie import cookie_directories, stamp_cookies, verify_cookies
from bk.meta.registration import BookieServiceInfo, Endpoint, RegistrationManager

from . import auth, integrity
from .tls import ServerTls

from .admin import AdminServer, gc_ops, metadata_ops
from .connection import BookieConnection
from .gc_policy import ScanAndCompareGarbageCollector
from .processor import RequestProcessor

log = logging.getLogger(__name__)

STOP_GRACE_S = 10.0  # in-flight requests get at most this, and at most a quarter of the stop's budget


def _measure_dirs(dirs) -> dict[str, float]:
    """Usage (0..1) of each dir's filesystem by bk.fileio.disk_space (where an injected full
    disk reports itself); a dir whose statvfs fails counts as full. Blocking: a worker thread."""
    out = {}
    for d in dirs:
        try:
            space = disk_space(d)
        except OSError:
            out[d] = 1.0
            continue
        if space.total_bytes:
            out[d] = space.usage
    return out


async def bounded_wait(aw, seconds: float, what: str, abandoned: list[str]) -> bool:
    """Wait at most `seconds` for `aw`; True when it finished well. An error it ends with is
    logged, not raised (a stop goes on), and `what` goes into `abandoned` with it. On
    time-out it is cancelled without waiting for the cancellation (a kazoo call or a hung
    thread may never answer it) and `what` goes into `abandoned`."""
    task = asyncio.ensure_future(aw)
    task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: no "never retrieved"
    if not task.done():
        done, _ = await asyncio.wait({task}, timeout=max(seconds, 0.0))
        if not done:
            task.cancel()
            abandoned.append(what)
            log.warning("stop: %s did not finish within %.1f s: abandoned", what, max(seconds, 0.0))
            return False
    if not task.cancelled() and task.exception() is not None:
        log.warning("stop: %s failed: %s", what, task.exception())
        abandoned.append(f"{what}: {task.exception()}")
        return False
    return True


# BP-46 repair progress fields published as `repair.<field>` registration properties
REPAIR_PROPERTIES = ("state", "ledgers_total", "ledgers_done", "ledgers_left", "ledgers_recovered",
                     "entries_lost", "entries_copied", "bytes_copied", "errors", "elapsed_s")


class ClusterNotInitializedError(BKError):
    pass


def _log_register_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("could not re-register after a read-only change: %s", task.exception())


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("could not publish the repair status: %s", task.exception())


class BookieServer:
    def __init__(self, config: BookieConfig, *, store=None):
        self.config = config
        self.bookie_id = config.bookie_id
        self.bookie = Bookie(config)
        self.processor = RequestProcessor(self.bookie, config)
        self.auth_provider = auth.provider_from_config(config)  # None: authentication off
        self.tls = ServerTls.from_config(config)  # None: START_TLS answered EBADREQ
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
        self._writable_dirs = 0
        self.autorecovery = None  # bk.replication.AutoRecovery when autorecovery_enabled
        self.repair = None  # bk.replication.integrity.DataIntegrityCheck while BP-46 phase two runs
        self.phase_one: integrity.PhaseOneResult | None = None
        self._properties: dict[str, str] = {  # published in the registration (BookieServiceInfo)
            k: v for k, v in (("rack", config.bookie_rack), ("group", config.bookie_isolation_group)) if v}
        self.port: int | None = None
        self.http = None  # bk.server.http_admin.HttpAdminServer when http_server_enabled
        self.started = False
        self.shutting_down = False
        self.stop_step = ""  # what the stop is doing now (named in the log if it is abandoned)
        self.stop_abandoned: list[str] = []  # what the last stop or teardown had to abandon
        self.stop_deadline: float | None = None  # loop time

    async def start(self) -> None:
        cfg = self.config
        if self.store is None:
            self.store = await open_store(cfg.metadata_service_uri, **store_options(cfg))
        try:
            if not await is_initialized(self.store):
                raise ClusterNotInitializedError(
                    f"the cluster at {cfg.metadata_service_uri} is not initialised: "
                    f"run `bk shell --metadata-uri {cfg.metadata_service_uri} initnewcluster` first")
            index_dir = cfg.index_dir or None
            checking = cfg.data_integrity_checking
            cookies = await verify_cookies(self.store, self.bookie_id, cfg.journal_dirs, cfg.ledger_dirs, index_dir,
                                           allow_repair=checking)
            if cookies.problems:
                integrity.refuse_cookie_problems(self.bookie_id, cookies, cfg.data_integrity_cookie_stamping_enabled)
            await self.bookie.start()
            await self._boot_check(cookies, checking)
            await self._start_gc()
            self._listener = await asyncio.get_running_loop().create_server(
                lambda: BookieConnection(self), host=cfg.bind_address or cfg.advertised_address,
                port=cfg.bookie_port, reuse_address=True, backlog=1024)
            self.port = self._listener.sockets[0].getsockname()[1]
            if self.bookie.needs_integrity_check:  # set by phase one: a crash, lost cookies or lost logs
                # phase two copies into this bookie through its own listener; it need not wait
                # for the registration (after a crash that waits for the old session to expire)
                await self._start_repair()
            self.registration = RegistrationManager(self.store)
            metrics.set_enabled(cfg.metrics_enabled)
            metrics.set_latency_shape(cfg.prometheus_latency_shape)
            self._export_gauges()
            if cfg.http_server_enabled:
                from .http_admin import HttpAdminServer
                from .http_routes import ROUTES
                self.http = await HttpAdminServer(self, cfg, ROUTES).start()
            await self._check_disks()
            await self._register()
            if self._properties:  # the repair's progress changed while the registration waited
                await self._register(force=True)
            self._monitor = asyncio.ensure_future(self._disk_monitor())
            self.bookie.on_state_change = self._read_only_changed
            self.started = True
            if cfg.autorecovery_enabled:
                from bk.replication import AutoRecovery
                self.autorecovery = await AutoRecovery(cfg).start()
            log.info("bookie %s serving on port %d (journal %s, %d ledgers)", self.bookie_id, self.port,
                     "on" if cfg.journal_write_data else "OFF (BP-46)", len(self.bookie.storage.ledger_ids()))
        except BaseException:
            await self._teardown()
            raise

    async def _boot_check(self, cookies, checking: bool) -> None:
        """BP-46 detection and phase one, before the bookie listens (bk.server.integrity)."""
        reasons, only = integrity.boot_reasons(self.bookie, cookies, checking)
        if reasons:
            self.phase_one = await integrity.run_phase_one(self.store, self.bookie, self.bookie_id,
                                                           "; ".join(reasons), only=only)
        if cookies.problems:  # stamping allowed (refuse_cookie_problems passed); phase one is durable
            await stamp_cookies(self.store, cookies.cookie, cookie_directories(cookies.cookie), cookies.zk_version)
            log.warning("stamped the cookie of %s into %s", self.bookie_id, ", ".join(cookies.missing_dirs))

    async def _start_repair(self) -> None:
        from bk.replication.integrity import DataIntegrityCheck

        self.repair = DataIntegrityCheck(self.config, self.bookie, on_progress=self._publish_repair)
        await self.repair.start()

    def _publish_repair(self, status) -> None:
        """Repair progress into the registration's properties (`bk shell repairstatus` reads them)."""
        d = status.as_dict()
        self._properties = {**self._properties, **{f"repair.{k}": str(d[k]) for k in REPAIR_PROPERTIES}}
        if self.registration is not None and self._registered_readonly is not None:
            task = asyncio.ensure_future(self._register(force=True))
            task.add_done_callback(_log_failure)

    async def _stop_repair(self) -> None:
        repair, self.repair = self.repair, None
        if repair is not None:
            await repair.stop()

    async def stop(self, deadline: float | None = None) -> list[str]:
        """Graceful stop by `deadline` (event-loop time; default shutdown_timeout_ms from now);
        safe to call more than once. Returns what had to be abandoned (empty: nothing).
        Whether everything was made durable is `self.bookie.stopped_clean`."""
        loop = asyncio.get_running_loop()
        if deadline is None:
            deadline = loop.time() + self.config.shutdown_timeout_ms / 1000.0
        self.stop_deadline = deadline
        budget = max(0.0, deadline - loop.time())
        self.shutting_down = True
        self.stop_step = "closing the listener"
        if self._listener is not None:  # no new connections from here on
            self._listener.close()
        if self._monitor is not None:
            self._monitor.cancel()
        # the repair and AutoRecovery talk to ZooKeeper and peers: a quarter of the budget each at most
        await self._bounded(self._stop_repair(), "stopping the BP-46 repair", budget / 4)
        await self._bounded(self._stop_autorecovery(), "stopping AutoRecovery", budget / 4)
        if self.connections:  # let in-flight work finish, bounded; what is left fails with its connection
            self.stop_step = "waiting for in-flight requests"
            self.processor.v3.wake_long_polls(self.connections)  # answered now, not at their timeOut
            grace = min(STOP_GRACE_S, budget / 4, self._time_left())
            waits = [c.idle.wait() for c in list(self.connections)]
            if not await bounded_wait(asyncio.gather(*waits), grace, "in-flight requests", []):
                log.warning("stopping with requests still in flight after %.1fs: their connections are closed",
                            grace)
        await self._teardown()
        self.stop_step = "stopped"
        log.info("bookie %s stopped (%s)%s", self.bookie_id,
                 "clean: everything durable, unclean-shutdown flag cleared" if self.bookie.stopped_clean
                 else "NOT clean: the unclean-shutdown flag stays set",
                 "; abandoned: " + "; ".join(self.stop_abandoned) if self.stop_abandoned else "")
        return list(self.stop_abandoned)

    def _time_left(self) -> float:
        if self.stop_deadline is None:  # a failed start tears down: the same budget as a stop
            self.stop_deadline = asyncio.get_running_loop().time() + self.config.shutdown_timeout_ms / 1000.0
        return max(0.0, self.stop_deadline - asyncio.get_running_loop().time())

    async def _bounded(self, aw, what: str, cap_s: float | None = None) -> bool:
        """One stop step, bounded by the time left (and `cap_s`)."""
        self.stop_step = what
        left = self._time_left()
        return await bounded_wait(aw, left if cap_s is None else min(left, cap_s), what, self.stop_abandoned)

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
            ops = {**gc_ops(self.bookie.gc), **metadata_ops(self.store, asyncio.get_running_loop())}
            admin = AdminServer(cfg.resolved_admin_socket_path, ops)
            if await admin.start():
                self.admin = admin

    async def _teardown(self) -> None:
        """Let go of everything, each wait bounded by the stop's deadline (_time_left). The
        final checkpoint (Bookie.stop) comes before anything that needs ZooKeeper and gets all
        the time left: when it is abandoned the unclean-shutdown flag stays set."""
        await self._bounded(self._stop_repair(), "stopping the BP-46 repair")
        await self._bounded(self._stop_autorecovery(), "stopping AutoRecovery")
        if self.http is not None:
            http, self.http = self.http, None
            await self._bounded(http.stop(), "stopping the HTTP admin server")
        if self.admin is not None:
            admin, self.admin = self.admin, None
            await self._bounded(admin.stop(), "stopping the admin socket")
        for conn in list(self.connections):
            conn.close()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        await self._bounded(self.processor.drain(), "answering the requests still in flight")
        if self.bookie._running:
            # all the time left but a little kept for deregistering (clients then stop picking
            # this bookie at once, not after the session timeout)
            keep_s = min(1.0, self.config.shutdown_timeout_ms / 10_000.0)
            await self._bounded(self.bookie.stop(),
                                "the final checkpoint (write cache and index to disk; the unclean-shutdown flag"
                                " stays set)", self._time_left() - keep_s)
        if self.registration is not None and self._registered_readonly is not None:
            # the znode is ephemeral: abandoned, it goes when the server ends the session
            await self._bounded(self.registration.unregister(self.bookie_id),
                                f"deregistering {self.bookie_id} (its znode goes with the session)")
            self._registered_readonly = None
        if self.registration is not None:
            await self._bounded(self.registration.close(), "closing the registration")
            self.registration = None
        if self.gc_policy is not None:
            gc_policy, self.gc_policy = self.gc_policy, None
            await self._bounded(gc_policy.close(), "closing the GC's metadata access")
        if self._own_store and self.store is not None:
            store, self.store = self.store, None
            await self._bounded(store.close(), "closing the metadata session")
        self.started = False

    # ------------------------------------------------------------ registration and disks
    async def _register(self, force: bool = False) -> None:
        readonly = self.bookie.read_only
        if force or readonly != self._registered_readonly:
            await self.registration.register(self.bookie_id, readonly=readonly, service_info=self._service_info())
            self._registered_readonly = readonly

    def _service_info(self) -> BookieServiceInfo:
        """BookKeeper's BookieServiceInfo: the bookie-rpc endpoint, and the HTTP admin one."""
        info = BookieServiceInfo.for_bookie(self.bookie_id, self._properties)
        if self.http is None:
            return info
        host = self.http.url.rpartition("//")[2].rpartition(":")[0]
        return BookieServiceInfo((*info.endpoints, Endpoint("http", host, self.http.port, self.http.scheme)), info.properties)

    def _export_gauges(self) -> None:
        """The gauges /metrics reads from this bookie's state at scrape time."""
        bookie = self.bookie
        storage = bookie.storage
        metrics.SERVER_STATUS.set_function(lambda: 0 if bookie.read_only else 1)
        metrics.WRITE_CACHE_SIZE.set_function(lambda: storage.stats()["write_cache_bytes"])
        metrics.READ_CACHE_SIZE.set_function(lambda: storage.read_cache.size_bytes)
        metrics.LEDGERS_COUNT.set_function(lambda: len(storage.ledger_ids()))
        metrics.JOURNAL_QUEUE_SIZE.set_function(lambda: sum(j.queued_records() for j in bookie.journals))
        metrics.LEDGER_WRITABLE_DIRS.set_function(lambda: self._writable_dirs)
        metrics.STORAGE_FAILED.set_function(lambda: 0 if bookie.storage_failure is None else 1)
        metrics.GC_DAMAGED_ENTRY_LOGS.set_function(lambda: len(bookie.gc.damaged_logs()) if bookie.gc else 0)

    async def _check_disks(self) -> None:
        """Read-only when every ledger dir is at or above disk_usage_threshold, as BookKeeper's
        LedgerDirsMonitor decides (a full dir only stops getting new entry logs, EntryLogger
        _pick_dir), or when a journal dir is (bk's own rule: the journal has nowhere else to
        go). Writable again once the journal dirs and at least one ledger dir are below the
        low-water mark. The statvfs calls run on the disk-space thread (a sick disk may hang
        them), the verdict on the loop."""
        cfg = self.config
        dirs = {*cfg.ledger_dirs, *cfg.journal_dirs}
        space = {} if self._forced_read_only else await on_space_thread(_measure_dirs, dirs)
        if self._forced_read_only:  # also when the operator switched during the measurement
            self.bookie.set_read_only(True, "set by the operator")
            return
        threshold, lwm = cfg.disk_usage_threshold, cfg.disk_usage_lwm_threshold
        ledger = [usage for d, usage in space.items() if d in cfg.ledger_dirs]
        journal = max((usage for d, usage in space.items() if d not in cfg.ledger_dirs), default=0.0)
        self._writable_dirs = sum(1 for usage in ledger if usage < threshold)
        least_full = min(ledger, default=0.0)
        if journal >= threshold:
            self.bookie.set_read_only(True, f"journal disk usage {journal:.0%} >= disk_usage_threshold")
        elif ledger and not self._writable_dirs:
            self.bookie.set_read_only(True, f"every ledger dir's disk usage >= disk_usage_threshold"
                                            f" (the least full: {least_full:.0%})")
        elif journal < lwm and least_full < lwm:
            self.bookie.set_read_only(False)  # also ends a full disk seen by a write (docs/DISK-FAULTS.md)

    def _read_only_changed(self) -> None:
        """A disk fault turned the bookie read-only (or the checker writable): tell ZooKeeper
        now, not at the next disk check, so clients stop picking it for new ensembles."""
        if self.registration is not None and self._registered_readonly is not None and not self.shutting_down:
            task = asyncio.ensure_future(self._register())
            task.add_done_callback(_log_register_failure)

    async def _disk_monitor(self) -> None:
        interval_s = self.config.disk_check_interval_ms / 1000.0
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self._check_disks()
                await self._register()
            except BKError as e:
                log.warning("disk check / registration failed: %s", e)

    async def set_read_only(self, read_only: bool) -> None:
        """Operator switch (and tests): change mode and re-register; wins over the disk check."""
        self._forced_read_only = read_only or self.config.force_read_only
        self.bookie.set_read_only(self._forced_read_only)
        await self._register()
