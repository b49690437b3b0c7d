"""Interop tests' helpers: Apache BookKeeper's own Java bookie and client against bk (docs/INTEROP.md).

The Java side is ../shared/java-bookkeeper beside the repository (BookKeeper built from its
source against Debian's jars; scripts/setup installs those jars). Every piece is required:
a missing folder, script, jar or JRE FAILS these tests with the reason, never skips them.

Fixtures and helpers:
- `interop_zk`: one Debian ZooKeeper for the whole run (bk.testing's launcher); each cluster
  takes a root of its own on it (`fresh_root`), formatted by bk (`bk shell initnewcluster`),
  which writes the layout BookKeeper's own metaformat writes (bk/meta/cluster.py), so Java bookies
  and the Java client use a bk-formatted cluster as they find it.
- `JavaBookie`: one `run-bookie.sh` process (BK_RELEASE picks 4.17.4 or 4.15.5), killed with
  SIGKILL when asked; `wait_registered` waits until bk's client sees the bookies writable.
- `java_client(command, uri, ...)`: one `run-client.sh` run (a JVM), its JSON answer.
- `java_payload(i, size)`: the Driver's payload of entry i, so either client checks the other's.
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
import uuid

import pytest

from bk.eventloop import loop_factory
from bk.testing.cluster import run_shell
from bk.testing.ports import free_port

REPO = pathlib.Path(__file__).resolve().parents[2]
JAVA_BK = REPO.parent / "shared" / "java-bookkeeper"
RELEASES = ("release-4.17.4", "release-4.15.5")
DEFAULT_RELEASE = RELEASES[0]
PASSWORD = b"java-bk"  # the Driver's default ledger password
JVM_TIMEOUT_S = 180.0  # bound on one Java client run (never a timing assertion)


def require_java_bk(release: str = DEFAULT_RELEASE) -> pathlib.Path:
    """The Java BookKeeper folder, checked; pytest.fail naming what is missing."""
    if not JAVA_BK.is_dir():
        pytest.fail(f"interop: {JAVA_BK} is missing: tests/interop needs Apache BookKeeper's Java build in "
                    "../shared/java-bookkeeper beside the repository", pytrace=False)
    for script in ("run-bookie.sh", "run-client.sh", "classpath.sh"):
        if not (JAVA_BK / script).is_file():
            pytest.fail(f"interop: {JAVA_BK / script} is missing", pytrace=False)
    if shutil.which("java") is None:
        pytest.fail("interop: no `java` on PATH (scripts/setup installs default-jre-headless)", pytrace=False)
    out = subprocess.run(["bash", str(JAVA_BK / "classpath.sh")], env={**os.environ, "BK_RELEASE": release},
                         capture_output=True, text=True)
    if out.returncode != 0:
        pytest.fail(f"interop: the Java build of {release} cannot run here (scripts/setup installs its Debian "
                    f"jars): {out.stderr.strip() or out.stdout.strip()}", pytrace=False)
    return JAVA_BK


def die_with_parent() -> None:  # runs in the child, before exec
    """A JVM this run starts gets SIGTERM when the test process dies, however it dies (Linux
    PR_SET_PDEATHSIG, kept across exec): a killed CI run leaves no bookie eating the 2 cores."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except OSError:
        pass


def run_async(coro, timeout_s: float = 240.0):
    """Run one coroutine on a fresh event loop (the project's loop), bounded."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(asyncio.wait_for(coro, timeout_s))


def java_payload(i: int, size: int) -> bytes:
    """javabk.Driver.payload: byte j is (i*31 + j*7) mod 256, then the first 8 bytes are i (big-endian)."""
    b = bytearray((i * 31 + j * 7) & 0xFF for j in range(size))
    if size >= 8:
        b[:8] = i.to_bytes(8, "big", signed=True)
    return bytes(b)


def java_uri(metadata_uri: str) -> str:
    """The metadata URI a Java client or bookie is given (bk's own, unchanged: zk://host:port/root/ledgers)."""
    return metadata_uri


def java_client(command: str, metadata_uri: str, *args: str, release: str = DEFAULT_RELEASE,
                check: bool = True) -> dict:
    """One `run-client.sh COMMAND --metadata-uri URI ARGS` run: its JSON object (fails the test on a
    non-zero exit when `check`, with the answer and the client's log)."""
    require_java_bk(release)
    env = {**os.environ, "BK_RELEASE": release, "BK_CLIENT_HEAP": "256m"}
    out = subprocess.run(["bash", str(JAVA_BK / "run-client.sh"), command, "--metadata-uri", java_uri(metadata_uri),
                          *args], env=env, capture_output=True, text=True, timeout=JVM_TIMEOUT_S)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    answer = json.loads(lines[-1]) if lines else {}
    if check and (out.returncode != 0 or not answer.get("ok")):
        pytest.fail(f"Java client `{command} {' '.join(args)}` ({release}) failed (exit {out.returncode}):\n"
                    f"{json.dumps(answer, indent=1)[-4000:]}\n--- stderr ---\n{out.stderr[-4000:]}", pytrace=False)
    return answer


class JavaBookie:
    """One Apache BookKeeper bookie (run-bookie.sh) on 127.0.0.1:port, data under `directory`."""

    def __init__(self, metadata_uri: str, directory: pathlib.Path, release: str = DEFAULT_RELEASE,
                 port: int | None = None, conf: dict | None = None):
        self.metadata_uri = metadata_uri
        self.conf = dict(conf or {})  # ServerConfiguration properties (run-bookie.sh --conf key=value)
        self.directory = directory
        self.release = release
        self.port = port or free_port()
        self.bookie_id = f"127.0.0.1:{self.port}"
        self.log_path = directory.parent / f"{directory.name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "JavaBookie":
        require_java_bk(self.release)
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                ["bash", str(JAVA_BK / "run-bookie.sh"), "--metadata-uri", java_uri(self.metadata_uri),
                 "--port", str(self.port), "--dir", str(self.directory), "--heap", "256m", "--direct", "256m",
                 "--log-level", "warn", *(a for k, v in self.conf.items() for a in ("--conf", f"{k}={v}"))],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "BK_RELEASE": self.release},
                start_new_session=True, preexec_fn=die_with_parent)
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, nbytes: int = 3000) -> str:
        try:
            return self.log_path.read_bytes()[-nbytes:].decode(errors="replace")
        except OSError as e:
            return f"(no log: {e})"

    def kill(self) -> None:
        """SIGKILL (a crash); the bookie's whole process group (bash exec's java, so one process)."""
        if self.alive:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.alive:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


def wait_registered(metadata_uri: str, bookies: list, timeout_s: float = 90.0) -> None:
    """Until every bookie (JavaBookie or bk's BookieProcess) is registered writable; fails naming
    a bookie process that died, with its log."""
    from bk.client import BookKeeper

    want = {b.bookie_id for b in bookies}

    async def poll() -> set[str]:
        async with BookKeeper(metadata_uri) as bkc:
            deadline = time.monotonic() + timeout_s
            while True:
                seen = set(await bkc.registration.writable_bookies())
                if want <= seen:
                    return seen
                for b in bookies:
                    if isinstance(b, JavaBookie) and not b.alive:
                        pytest.fail(f"Java bookie {b.bookie_id} ({b.release}) exited with {b.proc.returncode}:\n"
                                    f"{b.log_tail()}", pytrace=False)
                if time.monotonic() > deadline:
                    logs = "\n".join(f"--- {b.bookie_id}\n{b.log_tail()}" for b in bookies if isinstance(b, JavaBookie))
                    pytest.fail(f"bookies {sorted(want - seen)} not registered after {timeout_s}s\n{logs}",
                                pytrace=False)
                await asyncio.sleep(0.2)

    run_async(poll(), timeout_s + 30)


def format_root(metadata_uri: str) -> None:
    """bk formats the cluster's metadata (BookKeeper's layout: LAYOUT, INSTANCEID, available/...)."""
    out = run_shell(metadata_uri, "initnewcluster", "--if-needed")
    if out.returncode != 0:
        pytest.fail(f"initnewcluster on {metadata_uri} failed: {out.stderr or out.stdout}", pytrace=False)


@pytest.fixture(scope="session")
def interop_zk(tmp_path_factory):
    """One ZooKeeper (Debian's, through bk.testing's launcher) for every interop cluster."""
    from bk.testing.zookeeper import LocalZooKeeper, ZooKeeperLaunchError

    require_java_bk()
    server = LocalZooKeeper(str(tmp_path_factory.mktemp("interop-zk")))
    try:
        server.start()
    except ZooKeeperLaunchError as e:
        pytest.fail(f"interop: cannot start ZooKeeper: {e}", pytrace=False)
    try:
        yield server.connect_string
    finally:
        server.stop()


def fresh_root(zk_connect: str, name: str) -> str:
    """A ZooKeeper connect string with a chroot of its own: one cluster's metadata lives under it."""
    return f"{zk_connect}/{name}-{uuid.uuid4().hex[:8]}"


def start_java_bookies(metadata_uri: str, base: pathlib.Path, count: int, release: str) -> list[JavaBookie]:
    bookies = [JavaBookie(metadata_uri, base / f"java-{release}-{i}", release).start() for i in range(count)]
    try:
        wait_registered(metadata_uri, bookies)
    except BaseException:
        for b in bookies:
            b.kill()
        raise
    return bookies
