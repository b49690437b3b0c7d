"""A Spark standalone cluster for tests: one master and one worker that cannot see the
bookies' directories nor import bk, as an executor on another host.

    cluster = StandaloneSpark(work_dir, hidden=[bookies_data_dir, ...])
    cluster.start()             # master + worker, returns once the worker registered
    cluster.master_url          # spark://127.0.0.1:<port>
    cluster.python              # the executors' Python: pyspark and pyarrow, no bk
    cluster.stop()

Both are the pip pyspark's own daemons (`spark-class org.apache.spark.deploy.master.Master`
and `...deploy.worker.Worker`). The worker is isolated one of two ways (`isolation`):

- "mount-namespace" (preferred; `unshare -rm`: a user and mount namespace, which needs
  no privilege where unprivileged user namespaces are allowed): every `hidden` dir is
  covered by an empty tmpfs inside the worker's namespace, so the worker and its
  executors see empty directories where the bookies keep their files (and where bk's
  and spark's source is: the executors can only run the code the job ships);
- "other-user" (where namespaces are refused and this process is root): the worker runs
  as `nobody` (setpriv) and every `hidden` dir is made mode 0700 (owned by root), so
  opening a file under it fails with EACCES. The executors' venv is made from the
  system's /usr/bin/pythonX.Y (`nobody` cannot run one under /root), the work dir's
  ancestors get o+x for the time of the run, and the drivers must write their output
  world-writable (`driver_conf`).
`BK_SPARK_WORKER_ISOLATION` (either name) forces one, to test the other on a machine
that offers both; CI (root in a container where `unshare -rm` works) gets the mount
namespace.

The executors' Python (`python`) is a venv made here from this interpreter's base
Python with no site-packages of its own but a .pth naming a directory of symlinks to
exactly pyspark, py4j and pyarrow (what `pip install pyspark[sql]` brings that the
job's code uses). `check_python()` proves `import bk` fails there; whatever of bk the
executors run must come with the job (spark.session.ship_code).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

from .ports import free_port

EXECUTOR_PACKAGES = ("pyspark", "py4j", "pyarrow")
START_TIMEOUT_S = 90.0


class SparkClusterError(RuntimeError):
    """The standalone cluster could not be started (no Java, no pyspark, no isolation)."""


def spark_home() -> str:
    try:
        import pyspark
    except ImportError as e:
        raise SparkClusterError(f"pyspark is not installed: {e}") from None
    home = os.path.dirname(pyspark.__file__)
    if not os.access(os.path.join(home, "bin", "spark-class"), os.X_OK):
        raise SparkClusterError(f"no bin/spark-class in {home}")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise SparkClusterError("no java on PATH (apt-get install openjdk-17-jre-headless)")
    return home


def isolation_available() -> str | None:
    """ "mount-namespace", "other-user" or None (neither works on this machine)."""
    if shutil.which("unshare"):
        probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs none /mnt 2>/dev/null || "
                                "mount -t tmpfs none /tmp"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return "mount-namespace"
    if os.geteuid() == 0 and shutil.which("setpriv"):
        return "other-user"
    return None


def make_executor_python(root: str, base: str | None = None) -> str:
    """A venv at root/env from `base` (default: this interpreter's base Python; it must be
    the same X.Y) whose only packages are EXECUTOR_PACKAGES (symlinked from this
    interpreter's site-packages); returns its python."""
    base = base or getattr(sys, "_base_executable", sys.executable)
    env = os.path.join(root, "env")
    subprocess.run([base, "-m", "venv", "--without-pip", env], check=True, capture_output=True, timeout=120)
    only = os.path.join(root, "executor-packages")
    os.makedirs(only, exist_ok=True)
    for name in EXECUTOR_PACKAGES:
        mod = __import__(name)
        os.symlink(os.path.dirname(mod.__file__), os.path.join(only, name))
    python = os.path.join(env, "bin", "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    with open(os.path.join(site, "executor-packages.pth"), "w") as fh:
        fh.write(only + "\n")
    return python


class StandaloneSpark:
    def __init__(self, work_dir: str, hidden: list[str] = (), isolation: str | None = None,
                 worker_cores: int = 2, worker_memory: str = "1g"):
        self.work_dir = os.path.abspath(work_dir)
        self.hidden = [os.path.abspath(d) for d in hidden]
        self.isolation = isolation or os.environ.get("BK_SPARK_WORKER_ISOLATION") or None
        self._opened: list[tuple[str, int]] = []  # (dir, old mode) given o+x for "other-user"
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        self.port = self.ui_port = 0
        self.python = ""
        self._procs: list[subprocess.Popen] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def env(self) -> dict:
        """Environment for the daemons and drivers: loopback only, no inherited PYTHONPATH."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))}
        env.pop("PYTHONPATH", None)
        env.update(SPARK_HOME=spark_home(), SPARK_LOCAL_IP="127.0.0.1", SPARK_LOCAL_HOSTNAME="localhost")
        return env

    def check_python(self) -> None:
        """The executors' Python has pyspark and pyarrow and cannot import bk (from any cwd)."""
        probe = subprocess.run([self.python, "-c", "import pyspark, pyarrow\ntry:\n import bk\nexcept ImportError:"
                                " print('no bk')\nelse: print('bk at', bk.__file__)"],
                               capture_output=True, text=True, cwd=self.work_dir, env=self.env(), timeout=60)
        if probe.stdout.strip() != "no bk":
            raise SparkClusterError(f"the executors' python is not bk-free: {probe.stdout}{probe.stderr}")

    def start(self) -> "StandaloneSpark":
        home = spark_home()
        self.isolation = self.isolation or isolation_available()
        if self.isolation is None:
            raise SparkClusterError("cannot isolate the worker: `unshare -rm` is refused and this is not root")
        os.makedirs(self.work_dir, exist_ok=True)
        base = None
        if self.isolation == "other-user":
            self._open_ancestors()  # `nobody` must be able to run it: not one under /root
            system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
            base = system if os.access(system, os.X_OK) else None
        self.python = make_executor_python(self.work_dir, base)
        self.check_python()
        self.port, self.ui_port, worker_ui = free_port(), free_port(), free_port()
        spark_class = os.path.join(home, "bin", "spark-class")
        self._spawn("master", [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(self.port), "--webui-port", str(self.ui_port)])
        worker_dir = os.path.join(self.work_dir, "worker")
        os.makedirs(worker_dir, exist_ok=True)
        worker = [spark_class, "org.apache.spark.deploy.worker.Worker", self.master_url, "--host", "127.0.0.1",
                  "--cores", str(self.worker_cores), "--memory", self.worker_memory, "--work-dir", worker_dir,
                  "--webui-port", str(worker_ui)]
        if self.isolation == "mount-namespace":  # bk's own source dirs too: executors run the shipped zip
            hide = self.hidden + [os.path.dirname(__import__(p).__file__) for p in ("bk", "spark")]
            mounts = "".join(f'mount -t tmpfs -o size=1m,mode=0755 bk-hidden "{d}" && ' for d in hide)
            cmd = ["unshare", "-rm", "sh", "-c", mounts + 'exec "$@"', "worker", *worker]
        else:
            for d in self.hidden:
                os.chmod(d, 0o700)
            shutil.chown(worker_dir, "nobody")
            cmd = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *worker]
        self._spawn("worker", cmd)
        self._wait_for_worker()
        return self

    def driver_conf(self) -> list[str]:
        """spark-submit --conf pairs a driver needs here: with the worker as another user,
        the output dirs the driver creates must be writable by it."""
        if self.isolation == "other-user":
            return ["--conf", "spark.hadoop.fs.permissions.umask-mode=000"]
        return []

    def _open_ancestors(self) -> None:
        d = self.work_dir
        while d != os.path.dirname(d):
            mode = os.stat(d).st_mode & 0o7777
            if not mode & 0o001:
                os.chmod(d, mode | 0o001)
                self._opened.append((d, mode))
            d = os.path.dirname(d)

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(os.path.join(self.work_dir, f"{name}.log"), "ab")
        self._procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env(),
                                            cwd=self.work_dir, start_new_session=True))
        log.close()

    def _wait_for_worker(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for p in self._procs:
                if p.poll() is not None:
                    raise SparkClusterError(f"a Spark daemon exited ({p.args[:3]}): see {self.work_dir}/*.log")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as resp:
                    state = json.loads(resp.read())
                if any(w.get("state") == "ALIVE" for w in state.get("workers", ())):
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.3)
        raise SparkClusterError(f"no worker registered within {START_TIMEOUT_S:.0f} s: see {self.work_dir}/*.log")

    def logs(self) -> str:
        out = []
        for name in ("master", "worker"):
            try:
                with open(os.path.join(self.work_dir, f"{name}.log"), errors="replace") as fh:
                    out.append(f"--- {name}.log (tail)\n" + fh.read()[-3000:])
            except OSError:
                pass
        return "\n".join(out)

    def stop(self) -> None:
        for p in reversed(self._procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self._procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._procs.clear()
        if self.isolation == "other-user":
            for d in self.hidden:
                if os.path.isdir(d):
                    os.chmod(d, 0o755)
            for d, mode in reversed(self._opened):
                os.chmod(d, mode)
            self._opened.clear()
