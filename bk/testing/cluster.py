"""A local cluster of real bookie processes on a local ZooKeeper.

Used by `bk standalone`, integration tests and benchmarks:

    with LocalCluster(data_dir, bookies=3) as cluster:
        cluster.metadata_uri          # zk://127.0.0.1:<port>/ledgers
        cluster.kill(1)               # SIGKILL one bookie
        cluster.start_bookie(1)       # start it again on the same directories

Each bookie is `python -m bk.cli.main bookie --conf <data_dir>/bookie-<i>.toml`
with its log in `<data_dir>/bookie-<i>.log`; readiness is the "ready" line the
bookie prints once it serves and is registered. After a SIGKILL the restarted
bookie serves at once but registers only once ZooKeeper expired the dead
process's session (up to the session timeout): `wait_serving()` waits for the
listener only.

`LocalCluster(..., proxied=True)` puts a fault-injecting proxy
(bk.testing.proxy.ThreadedProxy) in front of every bookie: the bookie binds
127.0.0.2:P, the proxy listens on 127.0.0.1:P, so every client reaching the
bookie id 127.0.0.1:P goes through `cluster.proxies[i]`. Proxies outlive
bookie restarts.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from .ports import free_port
from .zookeeper import LocalZooKeeper


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_toml(path: str, values: dict) -> None:
    with open(path, "w") as fh:
        for key, value in values.items():
            fh.write(f"{key} = {toml_value(value)}\n")


def run_shell(metadata_uri: str, *args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bk.cli.main", "--log-level", "WARNING", "shell",
                           "--metadata-uri", metadata_uri, *args],
                          capture_output=True, text=True, timeout=timeout_s)


class BookieProcess:
    def __init__(self, index: int, conf_path: str, log_path: str, bookie_id: str, env: dict | None = None,
                 bind_host: str | None = None, http_port: int | None = None):
        self.index = index
        self.conf_path = conf_path
        self.log_path = log_path
        self.bookie_id = bookie_id
        self.env = env
        self.bind_host = bind_host or bookie_id.rpartition(":")[0]  # where the bookie itself listens
        self.proc: subprocess.Popen | None = None
        self._log_offset = 0
        self.http_port = http_port  # the HTTP admin server's port (None: disabled)
        self.http_host = "127.0.0.1"  # its address: http_server_address, loopback when unset

    @property
    def http_url(self) -> str | None:
        return None if self.http_port is None else f"http://{self.http_host}:{self.http_port}"

    def start(self) -> None:
        self._log_offset = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "bk.cli.main", "bookie", "--conf", self.conf_path],
                                     stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        log.close()

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as fh:
                fh.seek(self._log_offset)
                text = fh.read().decode(errors="replace")
            if f"bookie {self.bookie_id} ready" in text:
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"bookie {self.bookie_id} exited with {self.proc.returncode}:\n{text[-3000:]}")
            time.sleep(0.05)
        raise TimeoutError(f"bookie {self.bookie_id} not ready after {timeout_s}s; see {self.log_path}")

    def wait_serving(self, timeout_s: float = 60.0) -> None:
        """Wait until the bookie accepts connections on its own address (it may not be registered yet)."""
        port = int(self.bookie_id.rpartition(":")[2])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise RuntimeError(f"bookie {self.bookie_id} is not running (exit code {code}); see {self.log_path}:\n"
                                   + self._log_tail())
            try:
                with socket.create_connection((self.bind_host, port), timeout=1.0):
                    return
            except OSError:
                time.sleep(0.05)
        raise TimeoutError(f"bookie {self.bookie_id} not serving after {timeout_s}s; see {self.log_path}")

    def _log_tail(self, nbytes: int = 3000) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self._log_offset)
                return fh.read().decode(errors="replace")[-nbytes:]
        except OSError as e:
            return f"(no log: {e})"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig) -> None:
        if self.alive:
            self.proc.send_signal(sig)

    def stop(self, timeout_s: float = 30.0, *, signalled: bool = False) -> int | None:
        """SIGTERM (unless `signalled`: a second one would make the bookie leave at once,
        without its final checkpoint) and wait; killed after `timeout_s`."""
        if not self.alive:
            return None if self.proc is None else self.proc.returncode
        if not signalled:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def kill(self) -> None:
        if self.alive:
            self.proc.kill()
            self.proc.wait()


def ledger_dirs_of(bookie_dir: str, count: int = 1) -> list[str]:
    """A test bookie's ledger dirs: `<bookie dir>/ledgers`, or with several, `ledgers/0`,
    `ledgers/1`, ...: every one under `ledgers`, so what covers that path (a disk fault on the
    ledger dirs, a power cut of the bookie's directory) covers them all."""
    base = os.path.join(bookie_dir, "ledgers")
    return [base] if count <= 1 else [os.path.join(base, str(k)) for k in range(count)]


class LocalCluster:
    def __init__(self, data_dir: str, bookies: int = 3, *, zk_connect: str | None = None,
                 zk_port: int | None = None, autorecovery: bool = False, env: dict | None = None,
                 proxied: bool = False, bookie_ports: dict | None = None, http_ports: dict | None = None,
                 ledger_dirs_per_bookie: int = 1, **overrides):
        self.data_dir = os.path.abspath(data_dir)
        self.count = bookies
        self.ledger_dirs_per_bookie = ledger_dirs_per_bookie
        self.zk: LocalZooKeeper | None = None
        self._zk_connect = zk_connect
        self._zk_port = zk_port
        self.autorecovery = autorecovery
        self.overrides = overrides
        self.env = env
        self.bookies: dict[int, BookieProcess] = {}
        self.proxied = proxied
        # ports to take for a bookie that has none saved yet (index -> port); else a free one
        self.bookie_ports = dict(bookie_ports or {})
        self.http_ports = dict(http_ports or {})
        if proxied:
            self.overrides.setdefault("bind_address", "127.0.0.2")
        self.proxies: dict = {}  # index -> ThreadedProxy (proxied clusters only)
        self.metadata_uri = ""

    def start(self) -> "LocalCluster":
        os.makedirs(self.data_dir, exist_ok=True)
        try:
            if self._zk_connect is None:
                # Ports are kept in the data dir: a restarted cluster keeps its
                # metadata URI and bookie ids (cookies name them).
                port = self._zk_port or self._saved_port("zookeeper.port")
                self.zk = LocalZooKeeper(os.path.join(self.data_dir, "zookeeper"), port=port)
                self.zk.start()
                with open(os.path.join(self.data_dir, "zookeeper.port"), "w") as fh:
                    fh.write(str(self.zk.port))
                connect = self.zk.connect_string
            else:
                connect = self._zk_connect
            self.metadata_uri = f"zk://{connect}/ledgers"
            out = run_shell(self.metadata_uri, "initnewcluster", "--if-needed")
            if out.returncode != 0:
                raise RuntimeError(f"initnewcluster failed: {out.stderr or out.stdout}")
            for i in range(self.count):
                self.add_bookie(i, wait=False)
            for b in self.bookies.values():
                b.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def bookie_config(self, i: int, port: int) -> dict:
        d = os.path.join(self.data_dir, f"bookie-{i}")
        values = dict(metadata_service_uri=self.metadata_uri, bookie_port=port, advertised_address="127.0.0.1",
                      journal_dirs=[os.path.join(d, "journal")],
                      ledger_dirs=ledger_dirs_of(d, self.ledger_dirs_per_bookie), flush_interval_ms=1000,
                      write_cache_max_size_bytes="32MiB", read_cache_max_size_bytes="32MiB",
                      autorecovery_enabled=self.autorecovery)
        values.update(self.overrides)
        return values

    def add_bookie(self, i: int | None = None, *, wait: bool = True, **extra) -> BookieProcess:
        if i is None:
            i = max(self.bookies, default=-1) + 1
        conf = os.path.join(self.data_dir, f"bookie-{i}.toml")
        port = self._saved_bookie_port(conf) or self.bookie_ports.get(i) or free_port()
        values = {**self.bookie_config(i, port), **extra}
        if values.get("http_server_enabled", True) and "http_server_port" not in values:
            values["http_server_port"] = (self._saved_bookie_port(conf, "http_server_port") or self.http_ports.get(i)
                                          or free_port())
        write_toml(conf, values)
        bind_host = values.get("bind_address") or values["advertised_address"]
        http_port = values["http_server_port"] if values.get("http_server_enabled", True) else None
        b = BookieProcess(i, conf, os.path.join(self.data_dir, f"bookie-{i}.log"), f"127.0.0.1:{port}", self.env,
                          bind_host=bind_host, http_port=http_port)
        b.http_host = values.get("http_server_address") or "127.0.0.1"
        if self.proxied and i not in self.proxies:
            from .proxy import ThreadedProxy
            self.proxies[i] = ThreadedProxy(bind_host, port, "127.0.0.1", port).start()
        self.bookies[i] = b
        b.start()
        if wait:
            b.wait_ready()
        return b

    def _saved_port(self, name: str) -> int | None:
        try:
            with open(os.path.join(self.data_dir, name)) as fh:
                return int(fh.read().strip())
        except (OSError, ValueError):
            return None

    @staticmethod
    def _saved_bookie_port(conf: str, key: str = "bookie_port") -> int | None:
        import tomllib
        try:
            with open(conf, "rb") as fh:
                return int(tomllib.load(fh)[key]) or None
        except (OSError, KeyError, ValueError, tomllib.TOMLDecodeError):
            return None

    def start_bookie(self, i: int, wait: bool = True) -> BookieProcess:
        """Start bookie i again with its old configuration and directories."""
        b = self.bookies[i]
        if not b.alive:
            b.start()
            if wait:
                b.wait_ready()
        return b

    def add_racked_bookies(self, racks: list[str], **extra) -> dict[str, str]:
        """One bookie per rack given (`bookie_rack`, published in its registration), started together;
        returns bookie id -> rack."""
        added = [self.add_bookie(wait=False, bookie_rack=rack, **extra) for rack in racks]
        for b in added:
            b.wait_ready()
        return {b.bookie_id: rack for b, rack in zip(added, racks)}

    def kill(self, i: int) -> None:
        self.bookies[i].kill()

    def stop_bookie(self, i: int) -> int | None:
        return self.bookies[i].stop()

    @property
    def bookie_ids(self) -> list[str]:
        return [b.bookie_id for b in self.bookies.values()]

    def index_of(self, bookie_id: str) -> int:
        for i, b in self.bookies.items():
            if b.bookie_id == bookie_id:
                return i
        raise KeyError(f"no bookie {bookie_id} in this cluster")

    def proxy_for(self, bookie_id: str):
        """The proxy in front of `bookie_id` (a proxied cluster)."""
        return self.proxies[self.index_of(bookie_id)]

    def stop(self) -> None:
        for b in self.bookies.values():
            b.signal(signal.SIGCONT)  # a paused (SIGSTOPped) bookie could not act on SIGTERM
            b.signal(signal.SIGTERM)
        for b in self.bookies.values():
            b.stop(signalled=True)
        for p in self.proxies.values():
            p.stop()
        self.proxies.clear()
        if self.zk is not None:
            self.zk.stop()
            self.zk = None

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
