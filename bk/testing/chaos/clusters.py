"""The two clusters a chaos run can drive, behind one small async interface.

- InProcessChaosCluster: real BookieServers in this process (bk.testing.inprocess)
  on the in-memory metadata store, each behind a bk.testing.proxy.Proxy in the same
  event loop (the bookie binds 127.0.0.2:P, the proxy listens on 127.0.0.1:P, the
  bookie id is 127.0.0.1:P). Cheap: a run costs well under a second.
- ProcessChaosCluster: real `bk bookie` processes (bk.testing.cluster.LocalCluster,
  proxied) on a ZooKeeper the caller provides: SIGKILL, SIGSTOP, power loss of a
  process that really died.

Both offer: crash(i) (kill -9), power_loss(i, tear, rng) (crash, then every write
not fsynced before the crash dropped, sometimes a torn last page), power_cut(indices, tear,
rng) (the power of several bookies, a rack or the whole cluster, cut at ONE instant: every
one stops before any file of any is cut, so nothing lands on a later bookie in between), restart(i),
pause(i)/resume(i) (SIGSTOP/SIGCONT; in-process: the proxy holds every frame in both
directions and delivers them late, as a resumed process would), proxy(i) (the same
rule API for both), expire_session(i) (in-process), data_dir_of(i), alive(i), heal_network(), and
disk_faults (bk.testing.diskfaults: DiskFaults in-process, a DiskFaultControl file the
bookie processes read): fail(op, errno, path_prefix, count), full_disk(path), heal(rule).
A bookie's files all lie under data_dir_of(i), its ledger dirs (one, or two: the storage draw's
`ledger_dirs_per_bookie`, bk.testing.cluster.ledger_dirs_of) under its `ledgers`, so a power cut
of data_dir_of(i), a disk fault on `ledgers` and the crash gate (the config's dirs) cover them all.

Power loss in-process. The crash is abrupt (crash_bookie's crash gate: from the instant of
the cut no write, fsync, rename, unlink or index commit of the bookie reaches its disk), so
the fsync log read once its threads stopped is the one at the cut, and every file (journal,
entry logs, ledgers maps, cookies, directory entries, the index: bk.testing.powerloss) goes
back to what was durable then.
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import shutil
import signal
import time

from bk.testing import breaks
from bk.testing.cluster import ledger_dirs_of
from bk.testing.inprocess import InProcessCluster, free_port
from bk.testing.powerloss import install_index_model, simulate_power_loss
from bk.testing.proxy import Proxy
from .excuse import WATCH_ENV, watch_files
from .storage import SeparateDisks

log = logging.getLogger(__name__)
TRACK_ENV = "BK_FSYNC_TRACK_FILE"


class BookieStartError(Exception):
    """A bookie did not come back (the message says why: a detected corruption, ...)."""


class InProcessChaosCluster:
    mode = "inprocess"

    def __init__(self, data_dir: str, bookies: int, test_break: str = "", **overrides):
        self.data_dir = data_dir
        self.track_file = os.path.join(data_dir, "fsync.track")
        self._old_track = os.environ.get(TRACK_ENV)
        os.environ[TRACK_ENV] = self.track_file  # bk.fileio reads it at every fsync (restored by stop())
        install_index_model()  # index_sync = false: a cut rolls the index back to its last sync
        self.inner = InProcessCluster(data_dir, bookies=bookies, bind_address="127.0.0.2",
                                      prepare_bookie=lambda bookie: breaks.apply(bookie, test_break), **overrides)
        self.count = bookies
        self.proxies: dict[int, Proxy] = {}
        self.paused: set[int] = set()
        self.started: list = []  # every Bookie this cluster started, a restart's too (storage.reached)
        self._disk_faults = None
        self._separate_disks = overrides.get("ledger_dirs_per_bookie", 1) > 1
        if self._separate_disks:  # new entry logs alternate between the dirs (storage.SeparateDisks)
            SeparateDisks.install()
        # crash and restart of one bookie never overlap (a crash halts its storage in a thread)
        self._locks = {i: asyncio.Lock() for i in range(bookies)}

    @property
    def metadata_uri(self) -> str:
        return self.inner.metadata_uri

    @property
    def servers(self):
        return self.inner.servers

    async def start(self) -> "InProcessChaosCluster":
        # free_port() only finds a port free a moment ago: another worker (or another test on a
        # shared machine) may take it first. Such a collision is the harness's, so: new ports.
        for attempt in range(5):
            try:
                # ascending ports: bookie ids sort in index order, so a seeded placement picks
                # the same bookies (by index) in every replay
                for i, port in enumerate(sorted(free_port() for _ in range(self.count))):
                    self.inner.ports.setdefault(i, port)
                for i in range(self.count):
                    if i not in self.proxies:
                        port = self.inner.ports[i]
                        self.proxies[i] = await Proxy("127.0.0.2", port, "127.0.0.1", port).start()
                await self.inner.start()
                self.started += [server.bookie for server in self.inner.servers.values()]
                return self
            except OSError as e:
                if e.errno != errno.EADDRINUSE or attempt == 4:
                    raise
                for i in list(self.inner.servers):
                    await self.inner.stop_bookie(i)
                for p in self.proxies.values():
                    await p.stop()
                self.proxies.clear()
                self.inner.ports.clear()
                for i in range(self.count):  # their cookies name the old ports: start afresh
                    shutil.rmtree(self.data_dir_of(i), ignore_errors=True)
        return self

    def bookie_id(self, i: int) -> str:
        return self.inner.bookie_id(i)

    @property
    def bookie_ids(self) -> list[str]:
        return [self.bookie_id(i) for i in range(self.count)]

    def index_of(self, bookie_id: str) -> int:
        return self.bookie_ids.index(bookie_id)

    def alive(self, i: int) -> bool:
        return i in self.inner.servers

    def data_dir_of(self, i: int) -> str:
        return os.path.join(self.data_dir, f"bookie-{i}")

    def proxy(self, i: int) -> Proxy:
        return self.proxies[i]

    async def crash(self, i: int) -> float | None:
        """kill -9 bookie i; returns the instant it stopped (time.monotonic()), None if it was
        down already. The crash gate closes before crash_bookie's first await: no add reaches
        the bookie after that instant."""
        async with self._locks[i]:
            if not self.alive(i):
                return None
            stopped_at = time.monotonic()
            await self.inner.crash_bookie(i)
            return stopped_at

    async def power_loss(self, i: int, tear: bool, rng) -> str:
        async with self._locks[i]:
            if not self.alive(i):
                return "already down"
            return await self._power_cut([i], [i], tear, rng, None)

    async def power_cut(self, indices, tear: bool, rng, on_instant=None) -> tuple[list[int], str]:
        """One power cut of the bookies `indices` (a rack, the whole cluster) at one instant:
        every one still running is frozen (proxies dark, one crash-gate step over all their
        directories, connections aborted; `on_instant(stopped)` is called right then, no await
        in between), all are taken apart, and only then is every byte not durable discarded from
        every file of every one of them, in one cut (a bookie already down loses its page cache
        too). Returns (the bookies it stopped, the cut's report)."""
        cut = sorted(set(indices))
        async with contextlib.AsyncExitStack() as stack:
            for i in cut:  # in index order, as every other holder takes one lock: no deadlock
                await stack.enter_async_context(self._locks[i])
            running = [i for i in cut if self.alive(i)]
            return running, await self._power_cut(running, cut, tear, rng, on_instant)

    async def _power_cut(self, running: list[int], cut: list[int], tear: bool, rng, on_instant) -> str:
        # The instant of the power cut: the proxies go dark and drop every connection (with the
        # answers queued in them), and crash_bookies closes the crash gates over the bookies'
        # files before its first await. Once every thread of every one of them has stopped
        # (nothing more can reach their disks, so the fsync log is final), the files are rolled back.
        was_dark = {i: self.proxies[i]._blackhole for i in running}
        for i in running:
            self.proxies[i].set_blackhole(True)
            self.proxies[i].close_connections(reset=True)
        if on_instant is not None:
            on_instant(running)
        report = []

        def cut_files() -> None:
            report.append(simulate_power_loss(self.track_file, [self.data_dir_of(i) for i in cut], tear=tear,
                                              rng=rng))

        try:
            await self.inner.crash_bookies(running, on_frozen=cut_files)
        finally:
            for i, dark in was_dark.items():
                self.proxies[i].set_blackhole(dark)
        return str(report[0]) if report else "power loss: not applied"

    async def restart(self, i: int) -> None:
        async with self._locks[i]:
            if not self.alive(i):
                await self._restart(i)

    async def _restart(self, i: int) -> None:
        for attempt in range(20):
            try:
                self.started.append((await self.inner.start_bookie(i)).bookie)
                return
            except OSError as e:  # its port (its identity) taken meanwhile by someone else: wait
                if e.errno != errno.EADDRINUSE or attempt == 19:
                    raise BookieStartError(f"bookie {i} did not start: {type(e).__name__}: {e}") from e
                await asyncio.sleep(0.1)
            except Exception as e:  # noqa: BLE001 - the caller decides whether this bookie may refuse
                raise BookieStartError(f"bookie {i} did not start: {type(e).__name__}: {e}") from e

    async def pause(self, i: int) -> None:
        from bk.testing.proxy import Rule
        self.paused.add(i)
        self.proxies[i].add_rule(Rule("both", None, "hold"))

    async def resume(self, i: int) -> None:
        if i in self.paused:
            self.paused.discard(i)
            p = self.proxies[i]
            p.rules[:] = [r for r in p.rules if not (r.action == "hold" and r.match is None)]
            p.release_held()

    @property
    def disk_faults(self):
        """bk.testing.diskfaults' injector for this process (installed on first use, removed by stop())."""
        from bk.testing.diskfaults import DiskFaults
        self._disk_faults = DiskFaults.install()
        return self._disk_faults

    async def expire_session(self, i: int) -> bool:
        server = self.inner.servers.get(i)
        if server is None or server.store is None:
            return False
        await server.store.expire_session()
        return True

    async def heal_network(self) -> None:
        for i, p in self.proxies.items():
            await self.resume(i)
            p.clear_rules()
            p.release_held()
            p.set_blackhole(False)

    async def stop(self) -> None:
        await self.heal_network()
        for i in list(self.inner.servers):
            try:
                await self.inner.stop_bookie(i)
            except Exception:  # noqa: BLE001 - tearing down after chaos: keep going
                log.exception("stopping bookie %d", i)
        if self.inner.store is not None:
            await self.inner.store.close()
            self.inner.store = None
        for p in self.proxies.values():
            await p.stop()
        if self._disk_faults is not None:
            from bk.testing.diskfaults import DiskFaults
            DiskFaults.uninstall()  # back to zero cost for the next run
            self._disk_faults = None
        if self._separate_disks:
            SeparateDisks.uninstall()
        if self._old_track is None:
            os.environ.pop(TRACK_ENV, None)
        else:
            os.environ[TRACK_ENV] = self._old_track
        from bk.meta.memory import InMemoryStore
        InMemoryStore.drop_shared(self.metadata_uri.split("//", 1)[1].split("/", 1)[0])


class ProcessChaosCluster:
    """Real `bk bookie` processes (proxied) on the ZooKeeper at `zk_connect`."""

    mode = "process"

    def __init__(self, data_dir: str, bookies: int, zk_connect: str, test_break: str = "", **overrides):
        from bk.testing.cluster import LocalCluster
        self.data_dir = data_dir
        self.track_file = os.path.join(data_dir, "fsync.track")
        from bk.testing.diskfaults import DiskFaultControl
        os.makedirs(data_dir, exist_ok=True)
        self.disk_faults = DiskFaultControl(os.path.join(data_dir, "disk-faults.json"))  # no rules yet
        # each process watches its own stores and checkpoints (excuse.watch_from_env)
        self.watch_dir = os.path.join(data_dir, "watches")
        os.makedirs(self.watch_dir, exist_ok=True)
        env = dict(os.environ, **{TRACK_ENV: self.track_file, WATCH_ENV: self.watch_dir}, **self.disk_faults.env())
        env.pop(breaks.ENV, None)
        if test_break:  # each `bk bookie` breaks itself (bk.testing.breaks.apply_from_env)
            env[breaks.ENV] = test_break
        self.inner = LocalCluster(data_dir, bookies=bookies, zk_connect=zk_connect, env=env, proxied=True,
                                  **overrides)
        self.count = bookies
        self.paused: set[int] = set()
        self.servers: dict = {}  # in-process servers: none here
        self.started: list = []  # Bookie objects: none in this process (storage.reached)
        self._locks = {i: asyncio.Lock() for i in range(bookies)}  # a kill never races a restart

    @property
    def metadata_uri(self) -> str:
        return self.inner.metadata_uri

    async def start(self) -> "ProcessChaosCluster":
        await asyncio.to_thread(self.inner.start)
        return self

    def bookie_id(self, i: int) -> str:
        return self.inner.bookies[i].bookie_id

    @property
    def bookie_ids(self) -> list[str]:
        return [self.bookie_id(i) for i in range(self.count)]

    def index_of(self, bookie_id: str) -> int:
        return self.inner.index_of(bookie_id)

    def alive(self, i: int) -> bool:
        return self.inner.bookies[i].alive

    def data_dir_of(self, i: int) -> str:
        return os.path.join(self.inner.data_dir, f"bookie-{i}")

    def proxy(self, i: int):
        return self.inner.proxies[i]

    def watch_files(self, i: int) -> list[str]:
        """Bookie i's watch files, one per storage instance it opened, oldest first."""
        return watch_files(self.watch_dir, self.bookie_id(i))

    async def crash(self, i: int) -> float | None:
        """SIGKILL bookie i; returns the instant the signal was sent (time.monotonic(), from the
        thread that sent it), None if it was down already."""
        async with self._locks[i]:
            self.paused.discard(i)
            if not self.alive(i):
                return None
            return await asyncio.to_thread(self._kill_now, i)

    def _kill_now(self, i: int) -> float:
        self.inner.bookies[i].signal(signal.SIGKILL)
        stopped_at = time.monotonic()
        self.inner.kill(i)  # reaps it
        return stopped_at

    async def power_loss(self, i: int, tear: bool, rng) -> str:
        if not self.alive(i):
            return "already down"
        return (await self.power_cut([i], tear, rng))[1]

    async def power_cut(self, indices, tear: bool, rng, on_instant=None) -> tuple[list[int], str]:
        """InProcessChaosCluster.power_cut for processes: every running one gets its SIGKILL
        (`on_instant(stopped)` right after) before any is waited for, and the files of all of
        them are cut once every one is gone (their fsync logs are final then)."""
        cut = sorted(set(indices))
        async with contextlib.AsyncExitStack() as stack:
            for i in cut:
                await stack.enter_async_context(self._locks[i])
            running = [i for i in cut if self.alive(i)]
            await asyncio.to_thread(self._kill_together, running)  # gone: their fsync logs are final
            if on_instant is not None:
                on_instant(running)
            self.paused.difference_update(running)
            report = simulate_power_loss(self.track_file, [self.data_dir_of(i) for i in cut], tear=tear, rng=rng)
            return running, str(report)

    def _kill_together(self, indices: list[int]) -> None:
        for i in indices:  # every one dies at this instant ...
            self.inner.bookies[i].signal(signal.SIGKILL)
        for i in indices:  # ... then each is reaped (SIGKILL again to one not yet reaped is harmless)
            self.inner.kill(i)

    async def restart(self, i: int) -> None:
        async with self._locks[i]:
            if not self.alive(i):
                await self._restart(i)

    async def _restart(self, i: int) -> None:
        try:
            await asyncio.to_thread(self.inner.start_bookie, i, False)
            await asyncio.to_thread(self.inner.bookies[i].wait_serving, 60.0)
        except Exception as e:  # noqa: BLE001
            raise BookieStartError(f"bookie {i} did not start: {type(e).__name__}: {e}") from e

    async def pause(self, i: int) -> None:
        if self.alive(i):
            self.paused.add(i)
            self.inner.bookies[i].signal(signal.SIGSTOP)

    async def resume(self, i: int) -> None:
        self.paused.discard(i)
        self.inner.bookies[i].signal(signal.SIGCONT)

    async def expire_session(self, i: int) -> bool:
        """The bookie process asks the ZooKeeper server to expire its own session (its admin
        socket's expire_metadata_session: the session's password never leaves the process)."""
        from bk.server.admin import AdminError, admin_call
        async with self._locks[i]:
            if not self.alive(i) or i in self.paused:
                return False
            sock = os.path.join(ledger_dirs_of(self.data_dir_of(i), self.inner.ledger_dirs_per_bookie)[0],
                                "admin.sock")
            try:
                await asyncio.to_thread(admin_call, sock, "expire_metadata_session", 30.0)
            except AdminError:
                return False  # not serving yet (restarting) or exited meanwhile
            return True

    async def heal_network(self) -> None:
        for i, p in self.inner.proxies.items():
            await self.resume(i)
            p.clear_rules()
            p.release_held()
            p.set_blackhole(False)

    async def stop(self) -> None:
        await asyncio.to_thread(self.inner.stop)


__all__ = ["BookieStartError", "InProcessChaosCluster", "ProcessChaosCluster", "TRACK_ENV"]
