"""Apache BookKeeper's own bookie and client beside bk's in bench.compare (issues 33 and 34).

The Java side is ../shared/java-bookkeeper beside the repository (BookKeeper built from its
source at release-4.17.4 and release-4.15.5 against Debian's jars; its README). This module:

- `JavaBookies`: N Java bookies (`run-bookie.sh`, `org.apache.bookkeeper.server.Main`,
  SortedLedgerStorage) on a root of its own on the run's ZooKeeper, formatted by bk
  (`bk shell initnewcluster`: BookKeeper's layout, so Java bookies register in it), each with
  DIR/journal and DIR/ledgers under the bench directory (the same disk and the same layout as a
  LocalCluster's bookie-i/journal and bookie-i/ledgers). The JVM runs with the flags
  BookKeeper's bin/common.sh gives a bookie on JDK 9+: `-Xms1g -Xmx1g
  -XX:MaxDirectMemorySize=2g`, `-XX:+UseG1GC -XX:MaxGCPauseMillis=10
  -XX:+ParallelRefProcEnabled -XX:+DisableExplicitGC`, netty's leak detection off and its
  recycler at 1000/1024, `-Djava.net.preferIPv4Stack=true` (run-bookie.sh sets all but the
  recycler pair, which goes in through JDK_JAVA_OPTIONS). The bookie's settings are
  BookKeeper's defaults except loopback allowed, HTTP and stats off (run-bookie.sh).
- `java_driver(...)`: one run of the Java client's driver (`run-client.sh bench`): its JSON.
- `JavaMissing`: what is missing (folder, script, JRE, jars), said plainly; bench.compare
  fails the Java systems with it, and tests/interop/test_bench_java_bookie.py fails (never skips) on it.
"""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
import shutil
import signal
import subprocess
import time

from . import REPO_DIR, child_env, scratch_dir

# BK_JAVA_BOOKKEEPER: the folder elsewhere (a worktree of the repository outside /work, say)
JAVA_BK = pathlib.Path(os.environ.get("BK_JAVA_BOOKKEEPER")
                       or pathlib.Path(REPO_DIR).parent / "shared" / "java-bookkeeper")
RELEASES = ("4.17.4", "4.15.5")
DEFAULT_RELEASE = RELEASES[0]
# bin/common.sh (JDK 9+): BOOKIE_MEM_OPTS, DEFAULT_BOOKIE_GC_OPTS (run-bookie.sh's fixed flags), netty opts
BOOKIE_HEAP = "1g"
BOOKIE_DIRECT = "2g"
NETTY_RECYCLER_OPTS = "-Dio.netty.recycler.maxCapacity.default=1000 -Dio.netty.recycler.linkCapacity=1024"
REGISTER_TIMEOUT_S = 120.0
DRIVER_TIMEOUT_S = 600.0


class JavaMissing(RuntimeError):
    """A part the Java side needs is not here (the message says which and how to get it)."""


def release_dir(release: str) -> str:
    if release not in RELEASES:
        raise ValueError(f"unknown Java release {release!r}; choose from {', '.join(RELEASES)}")
    return f"release-{release}"


def require_java(release: str = DEFAULT_RELEASE) -> pathlib.Path:
    """The Java BookKeeper folder, checked; JavaMissing naming what is missing."""
    if not JAVA_BK.is_dir():
        raise JavaMissing(f"{JAVA_BK} is missing: the Java bookie comes from Apache BookKeeper's build in "
                          "../shared/java-bookkeeper beside the repository")
    for script in ("run-bookie.sh", "run-client.sh", "classpath.sh"):
        if not (JAVA_BK / script).is_file():
            raise JavaMissing(f"{JAVA_BK / script} is missing")
    if shutil.which("java") is None:
        raise JavaMissing("no `java` on PATH (scripts/setup installs default-jre-headless)")
    out = subprocess.run(["bash", str(JAVA_BK / "classpath.sh")],
                         env={**os.environ, "BK_RELEASE": release_dir(release)}, capture_output=True, text=True)
    if out.returncode != 0:
        raise JavaMissing(f"the Java build of {release} cannot run here (scripts/setup installs its Debian jars):"
                          f" {out.stderr.strip() or out.stdout.strip()}")
    return JAVA_BK


def _die_with_parent() -> None:  # in the child, before exec
    """The JVM gets SIGTERM when the bench process dies, however it dies (PR_SET_PDEATHSIG)."""
    import ctypes
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except OSError:
        pass


def format_root(metadata_uri: str) -> None:
    from bk.testing.cluster import run_shell
    out = run_shell(metadata_uri, "initnewcluster", "--if-needed")
    if out.returncode != 0:
        raise RuntimeError(f"initnewcluster on {metadata_uri} failed: {out.stderr or out.stdout}")


class JavaBookies:
    """`count` Java bookies of `release` on `zk_connect` (a chroot of their own); a context manager.

    Attributes as bench.load's LocalCluster for what bench.compare uses: `metadata_uri`,
    `data_dir`, `pids()`; `bookie_ids`; `log_tail()` for a failure's message."""

    def __init__(self, zk_connect: str, count: int = 1, *, release: str = DEFAULT_RELEASE,
                 prefix: str = "java", heap: str = BOOKIE_HEAP, direct: str = BOOKIE_DIRECT,
                 conf: dict | None = None):
        self.zk_connect = zk_connect
        self.count = count
        self.release = release
        self.prefix = prefix
        self.heap, self.direct = heap, direct
        self.conf = dict(conf or {})
        self.metadata_uri = f"zk://{zk_connect}/ledgers"
        self.data_dir: str | None = None
        self.procs: list[subprocess.Popen] = []
        self.bookie_ids: list[str] = []
        self._logs: list[str] = []

    def start(self) -> "JavaBookies":
        from bk.testing.ports import free_port
        require_java(self.release)
        self.data_dir = scratch_dir(self.prefix)
        try:
            format_root(self.metadata_uri)
            env = {**os.environ, "BK_RELEASE": release_dir(self.release),
                   "JDK_JAVA_OPTIONS": (os.environ.get("JDK_JAVA_OPTIONS", "") + " " + NETTY_RECYCLER_OPTS).strip()}
            for i in range(self.count):
                port = free_port()
                d = os.path.join(self.data_dir, f"bookie-{i}")
                log_path = os.path.join(self.data_dir, f"bookie-{i}.log")
                argv = ["bash", str(JAVA_BK / "run-bookie.sh"), "--metadata-uri", self.metadata_uri,
                        "--port", str(port), "--dir", d, "--heap", self.heap, "--direct", self.direct,
                        "--log-level", "warn"]
                for k, v in self.conf.items():
                    argv += ["--conf", f"{k}={v}"]
                with open(log_path, "ab") as log:
                    self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                                       start_new_session=True, preexec_fn=_die_with_parent))
                self._logs.append(log_path)
                self.bookie_ids.append(f"127.0.0.1:{port}")
            self._wait_registered()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_registered(self) -> None:
        from bk.client import BookKeeper
        from bk.eventloop import loop_factory

        async def poll() -> None:
            async with BookKeeper(self.metadata_uri) as bkc:
                deadline = time.monotonic() + REGISTER_TIMEOUT_S
                while True:
                    if set(self.bookie_ids) <= set(await bkc.registration.writable_bookies()):
                        return
                    dead = [i for i, p in enumerate(self.procs) if p.poll() is not None]
                    if dead:
                        raise RuntimeError(f"Java bookie {self.bookie_ids[dead[0]]} ({self.release}) exited with "
                                           f"{self.procs[dead[0]].returncode}: {self.log_tail(dead[0])}")
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"Java bookies not registered after {REGISTER_TIMEOUT_S:.0f}s: "
                                           f"{self.log_tail(0)}")
                    await asyncio.sleep(0.2)

        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(poll())

    def pids(self) -> dict:
        return {f"java-bookie-{i}": p.pid for i, p in enumerate(self.procs) if p.poll() is None}

    def log_tail(self, i: int = 0, nbytes: int = 2000) -> str:
        try:
            return pathlib.Path(self._logs[i]).read_bytes()[-nbytes:].decode(errors="replace")
        except (OSError, IndexError) as e:
            return f"(no log: {e})"

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs.clear()
        if self.data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None

    def __enter__(self) -> "JavaBookies":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def java_driver(metadata_uri: str, *, ensemble: int, write_quorum: int, ack_quorum: int, entries: int,
                size: int, in_flight: int, release: str = DEFAULT_RELEASE, v2: bool = False,
                read_batch: int = 100, read_in_flight: int = 8, timeout_s: float = DRIVER_TIMEOUT_S) -> dict:
    """One `run-client.sh bench` (the Java client: create, `entries` adds of `size` bytes with
    `in_flight` outstanding, read back through the writer's handle in `read_batch`-entry
    readEntries calls, `read_in_flight` of them outstanding (one READ per entry on the wire),
    close, recovery open from a second client, read again, delete). Its JSON answer; raises
    RuntimeError with the answer and the client's log when it fails."""
    require_java(release)
    env = {**child_env(), "BK_RELEASE": release_dir(release), "BK_CLIENT_HEAP": "512m"}
    argv = ["bash", str(JAVA_BK / "run-client.sh"), "bench", "--metadata-uri", metadata_uri,
            "-e", str(ensemble), "-w", str(write_quorum), "-a", str(ack_quorum), "-n", str(entries),
            "-s", str(size), "-k", str(in_flight), "--read-batch", str(read_batch),
            "--read-inflight", str(read_in_flight), "--delete"] + (["--v2"] if v2 else [])
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s,
                         preexec_fn=_die_with_parent)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    answer = json.loads(lines[-1]) if lines else {}
    if out.returncode != 0 or not answer.get("ok"):
        raise RuntimeError(f"Java client bench ({release}) failed (exit {out.returncode}): "
                           f"{json.dumps(answer)[-1500:]} stderr: {out.stderr[-1500:]}")
    return answer


# ---------------------------------------------------------------- bench.compare's paired clusters
# Java system -> (label, bookies, E, WQ, AQ, the bk system it is compared with)
JAVA_SYSTEMS = {
    "java-bookie": ("Java bookie (--java-release), 1 bookie, journal on", 1, 1, 1, 1, "bk-1"),
    "java-bookie-3": ("Java bookies (--java-release), 3 bookies E3 WQ2 AQ2, journal on", 3, 3, 2, 2, "bk-3"),
}


class Fleet:
    """One long-lived cluster per system, all started before the first measurement and up until
    the last (bk's and Java's side by side, the JVMs warm): each measurement takes a new ledger."""

    def __init__(self, zk_connect: str, systems, release: str, bk_settings: dict):
        self.zk_connect = zk_connect
        self.systems = list(systems)
        self.release = release
        self.bk_settings = bk_settings  # bk system -> (bookies, settings)
        self.clusters: dict = {}
        self._stack = None

    def start(self, log) -> "Fleet":
        import contextlib
        from .load import local_cluster
        self._stack = contextlib.ExitStack()
        try:
            for system in self.systems:
                t = time.monotonic()
                if system in JAVA_SYSTEMS:
                    c = self._stack.enter_context(JavaBookies(f"{self.zk_connect}/fleet-{system}",
                                                              JAVA_SYSTEMS[system][1], release=self.release,
                                                              prefix=f"cmp-{system}"))
                else:
                    bookies, settings = self.bk_settings[system]
                    c = self._stack.enter_context(local_cluster(bookies, zk_connect=f"{self.zk_connect}/fleet-{system}",
                                                                prefix=f"cmp-{system}", **settings))
                self.clusters[system] = c
                log(f"fleet: {system} up in {time.monotonic() - t:.1f} s ({c.metadata_uri})")
        except BaseException:
            self.stop()
            raise
        return self

    def pids(self, system: str) -> dict:
        c = self.clusters[system]
        if system in JAVA_SYSTEMS:
            return c.pids()
        from .load import bookie_pids
        return bookie_pids(c)

    def stop(self) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None


def run_java_client_phase(fleet: Fleet, sizes, runs: int, entries: int, in_flight: int, release: str,
                          log) -> tuple[list[dict], list[dict]]:
    """The Java client's driver against each pair's bk cluster and Java cluster, alternated, `runs` times
    per size: (measurements, failures)."""
    from .compare_reads import PAIRS
    out, failures = [], []
    pairs = [(b, j, n) for b, j, n in PAIRS if b in fleet.clusters and j in fleet.clusters]
    for run in range(runs):
        for size in sizes:
            for bk_sys, java_sys, _ in pairs:
                order = [bk_sys, java_sys] if run % 2 == 0 else [java_sys, bk_sys]
                for system in order:
                    _, _, e, wq, aq, _ = JAVA_SYSTEMS[java_sys]
                    try:
                        a = java_driver(fleet.clusters[system].metadata_uri, ensemble=e, write_quorum=wq,
                                        ack_quorum=aq, entries=entries, size=size, in_flight=in_flight,
                                        release=release)
                    except Exception as ex:  # noqa: BLE001 - recorded; the other runs go on
                        failures.append({"system": system, "entry_size": size, "run": run, "phase": "java-client",
                                         "error": f"{type(ex).__name__}: {ex}"})
                        log(f"java-client run {run + 1} {system} {size} B FAILED: {ex}")
                        continue
                    lat = a.get("add_latency") or {}
                    m = {"system": system, "entry_size": size, "run": run, "adds_per_s": a.get("adds_per_s"),
                         "add_p50_ms": lat.get("p50_ms"), "add_p99_ms": lat.get("p99_ms"),
                         "reads_per_s": (a.get("read_back") or {}).get("reads_per_s"),
                         "reads_after_recovery_per_s": (a.get("read_after_recovery") or {}).get("reads_per_s"),
                         "loadavg_1m": os.getloadavg()[0], "answer": a}
                    out.append(m)
                    log(f"java-client run {run + 1} {size:>5} B {system:13} adds {m['adds_per_s'] or 0:>9,.0f}/s"
                        f" p99 {m['add_p99_ms']} ms, reads {m['reads_per_s'] or 0:>9,.0f}/s,"
                        f" after recovery {m['reads_after_recovery_per_s'] or 0:>9,.0f}/s")
    return out, failures


def summarize_java_client(measurements: list[dict]) -> list[dict]:
    from .compare_reads import PAIRS
    from .stats import median_or_none, ratio
    rows = []
    for size in sorted({m["entry_size"] for m in measurements}):
        for bk_sys, java_sys, bookies in PAIRS:
            sides = {}
            for side, system in (("bk", bk_sys), ("java", java_sys)):
                ms = [m for m in measurements if m["system"] == system and m["entry_size"] == size]
                if ms:
                    sides[side] = {k: median_or_none(m[k] for m in ms) for k in
                                   ("adds_per_s", "add_p99_ms", "reads_per_s", "reads_after_recovery_per_s")}
            if sides:
                b, j = sides.get("bk", {}), sides.get("java", {})
                rows.append({"bookies": bookies, "entry_size": size, "bk": b, "java": j,
                             "adds_bk_over_java": ratio(b.get("adds_per_s"), j.get("adds_per_s")),
                             "reads_bk_over_java": ratio(b.get("reads_per_s"), j.get("reads_per_s"))})
    return rows


def render_java_client(rows: list[dict]) -> str:
    from .stats import fmt_num, human_size, render_table
    x = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    headers = ["bookies", "size", "Java bookie adds/s", "p99 ms", "bk bookie adds/s", "p99 ms", "adds bk÷Java",
               "Java bookie reads/s", "bk bookie reads/s", "reads bk÷Java"]
    body = [[str(r["bookies"]), human_size(r["entry_size"]), fmt_num(r["java"].get("adds_per_s")),
             fmt_num(r["java"].get("add_p99_ms"), 1), fmt_num(r["bk"].get("adds_per_s")),
             fmt_num(r["bk"].get("add_p99_ms"), 1), x(r["adds_bk_over_java"]), fmt_num(r["java"].get("reads_per_s")),
             fmt_num(r["bk"].get("reads_per_s")), x(r["reads_bk_over_java"])] for r in rows]
    return render_table(headers, body)
