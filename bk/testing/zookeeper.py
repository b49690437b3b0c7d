"""A local ZooKeeper server for tests, `bk standalone` and benchmarks.

`LocalZooKeeper(data_dir)` writes a `zoo.cfg` into `data_dir`, starts Debian's
ZooKeeper (`ZooKeeperServerMain <zoo.cfg>`) bound to 127.0.0.1 on a free port,
and returns once the server answers the `ruok` four-letter word. The server's
log goes to `<data_dir>/zookeeper.log`; its snapshots and transaction logs to
`<data_dir>/data`. `stop()` terminates the JVM and waits for it.

The classpath comes from `ZOOKEEPER_CLASSPATH` when set; otherwise it is
`/usr/share/java/zookeeper.jar` (whose manifest `Class-Path` pulls in jute,
netty, slf4j-api, ... from /usr/share/java), plus the slf4j->log4j binding and
log4j when installed (without them ZooKeeper logs nothing), plus
`/etc/zookeeper/conf` for `log4j.properties`.

Tick time defaults to 500 ms so sessions can be as short as 1 s (2 ticks) and
session-expiry tests stay fast; the maximum session timeout is 20 ticks (10 s).
"""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

from bk.errors import BKError

from .ports import free_port

ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
ZOOKEEPER_CONF_DIR = "/etc/zookeeper/conf"
# Optional: without a binding slf4j falls back to NOP and the log file stays empty.
LOG_JARS = ("/usr/share/java/slf4j-log4j12.jar", "/usr/share/java/log4j-1.2.jar")
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"

JAVA_MISSING = "Java not found: apt-get install default-jre-headless"
ZOOKEEPER_MISSING = "ZooKeeper not found: apt-get install zookeeper"

_RUNNING: "set[LocalZooKeeper]" = set()


class ZooKeeperLaunchError(BKError):
    """The local ZooKeeper could not be started (Java or ZooKeeper missing, no answer)."""


def find_java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = os.path.join(java_home, "bin", "java")
        if os.access(candidate, os.X_OK):
            return candidate
    java = shutil.which("java")
    if not java:
        raise ZooKeeperLaunchError(JAVA_MISSING)
    return java


def default_classpath() -> str:
    """ZOOKEEPER_CLASSPATH, or the Debian package's jar + logging jars + conf dir."""
    override = os.environ.get("ZOOKEEPER_CLASSPATH")
    if override:
        return override
    if not os.path.isfile(ZOOKEEPER_JAR):
        raise ZooKeeperLaunchError(ZOOKEEPER_MISSING)
    parts = [ZOOKEEPER_JAR]
    if all(os.path.isfile(j) for j in LOG_JARS):
        parts.extend(LOG_JARS)
    if os.path.isdir(ZOOKEEPER_CONF_DIR):
        parts.append(ZOOKEEPER_CONF_DIR)
    return os.pathsep.join(parts)




def four_letter_word(host: str, port: int, word: str, timeout_s: float = 2.0) -> bytes:
    """Send a ZooKeeper four-letter command and return the whole answer."""
    with socket.create_connection((host, port), timeout=timeout_s) as s:
        s.sendall(word.encode("ascii"))
        chunks = []
        while True:
            chunk = s.recv(4096)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    # Linux: the JVM gets SIGTERM if the Python process dies (even by kill -9),
    # so crashed test runs leave no orphan servers holding ports.
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class LocalZooKeeper:
    """One standalone ZooKeeper server on 127.0.0.1, owned by this process."""

    host = "127.0.0.1"

    def __init__(
        self,
        data_dir: str,
        port: int | None = None,
        *,
        tick_time_ms: int = 500,
        force_sync: bool = False,
        start_timeout_s: float = 60.0,
        heap_mb: int = 256,
    ):
        self.data_dir = os.path.abspath(data_dir)
        self._requested_port = port
        self.port: int | None = port
        self.tick_time_ms = tick_time_ms
        self.force_sync = force_sync
        self.start_timeout_s = start_timeout_s
        self.heap_mb = heap_mb
        self.config_path = os.path.join(self.data_dir, "zoo.cfg")
        self.log_path = os.path.join(self.data_dir, "zookeeper.log")
        self._proc: subprocess.Popen | None = None
        self._log_file = None

    # ------------------------------------------------------------------ info
    @property
    def connect_string(self) -> str:
        if self.port is None:
            raise ZooKeeperLaunchError("ZooKeeper is not started: no port yet")
        return f"{self.host}:{self.port}"

    def metadata_uri(self, root: str = "/ledgers") -> str:
        """The metadata service URI of this server for ledgers under `root`."""
        return f"zk://{self.connect_string}{root}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "LocalZooKeeper":
        if self.is_running():
            return self
        java = find_java()
        classpath = default_classpath()
        os.makedirs(os.path.join(self.data_dir, "data"), exist_ok=True)
        # A port picked by us can be taken by someone else between the probe and
        # the JVM's bind: then try a fresh one. A port given by the caller is kept.
        attempts = 1 if self._requested_port is not None else 3
        last_error: ZooKeeperLaunchError | None = None
        for _ in range(attempts):
            self.port = self._requested_port or free_port(self.host)
            self._write_config()
            self._spawn(java, classpath)
            try:
                self._wait_ready()
            except ZooKeeperLaunchError as e:
                last_error = e
                self._terminate()
                if "Address already in use" not in str(e):
                    raise
                continue
            _RUNNING.add(self)
            return self
        assert last_error is not None
        raise last_error

    def stop(self, timeout_s: float = 15.0) -> None:
        self._terminate(timeout_s)
        _RUNNING.discard(self)

    def __enter__(self) -> "LocalZooKeeper":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ internals
    def _write_config(self) -> None:
        lines = [
            f"dataDir={os.path.join(self.data_dir, 'data')}",
            f"clientPort={self.port}",
            f"clientPortAddress={self.host}",
            f"tickTime={self.tick_time_ms}",
            "maxClientCnxns=0",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,stat,srvr,mntr,cons,conf",
            f"forceSync={'yes' if self.force_sync else 'no'}",
            "preAllocSize=4096",
            "autopurge.snapRetainCount=3",
            "autopurge.purgeInterval=0",
        ]
        with open(self.config_path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")

    def _spawn(self, java: str, classpath: str) -> None:
        if self._log_file is None or self._log_file.closed:
            self._log_file = open(self.log_path, "ab")
        self._log_start = self._log_file.tell()
        cmd = [
            java,
            f"-Xmx{self.heap_mb}m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",  # faster JVM start; ZooKeeper's load here is tiny
            "-Djava.net.preferIPv4Stack=true",
            "-Dzookeeper.root.logger=INFO,CONSOLE",
            "-Dzookeeper.console.threshold=INFO",
            "-cp",
            classpath,
            MAIN_CLASS,
            self.config_path,
        ]
        try:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        except FileNotFoundError:
            raise ZooKeeperLaunchError(JAVA_MISSING) from None

    def _log_tail(self, max_bytes: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(self._log_start, os.path.getsize(self.log_path) - max_bytes))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        delay_s = 0.05
        while True:
            assert self._proc is not None
            code = self._proc.poll()
            if code is not None:
                tail = self._log_tail()
                if "NoClassDefFoundError" in tail or "ClassNotFoundException" in tail:
                    raise ZooKeeperLaunchError(
                        f"{ZOOKEEPER_MISSING} (classpath incomplete; set ZOOKEEPER_CLASSPATH); log:\n{tail}"
                    )
                raise ZooKeeperLaunchError(
                    f"ZooKeeper exited with code {code} during start; log {self.log_path}:\n{tail}"
                )
            try:
                if self._answering_server_is_ours():
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ZooKeeperLaunchError(
                    f"ZooKeeper did not answer on {self.host}:{self.port} within "
                    f"{self.start_timeout_s:.0f} s; log {self.log_path}:\n{self._log_tail()}"
                )
            time.sleep(delay_s)
            delay_s = min(delay_s * 2, 0.5)

    def _answering_server_is_ours(self) -> bool:
        # Another server already listening on the port would answer `ruok` too:
        # check that the one answering uses our data directory.
        if four_letter_word(self.host, self.port, "ruok", timeout_s=1.0) != b"imok":
            return False
        conf = four_letter_word(self.host, self.port, "conf", timeout_s=1.0).decode("utf-8", "replace")
        ours = os.path.join(self.data_dir, "data")
        return any(
            line.startswith("dataDir=") and os.path.dirname(line[len("dataDir=") :].strip()) == ours
            for line in conf.splitlines()
        )

    def _terminate(self, timeout_s: float = 15.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


@atexit.register
def _stop_all() -> None:
    for zk in list(_RUNNING):
        zk.stop(timeout_s=5.0)


def main(argv: list[str] | None = None) -> int:
    """`python -m bk.testing.zookeeper DATA_DIR [PORT]`: run a server until Ctrl-C."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m bk.testing.zookeeper DATA_DIR [PORT]", file=sys.stderr)
        return 2
    zk = LocalZooKeeper(args[0], int(args[1]) if len(args) > 1 else None)
    with zk:
        print(f"ZooKeeper at {zk.connect_string} (log {zk.log_path})", flush=True)
        try:
            while zk.is_running():
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
