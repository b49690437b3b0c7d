"""The SparkSession the analytics use, and progress while Spark works.

Local mode by default (`local[*]`, UI off, small driver memory); `master=` any Spark
master URL (spark://, yarn, k8s://) for a real cluster, or nothing at all under
spark-submit, which has already chosen one.

Python on the executors. In local mode they run on this machine: `PYSPARK_PYTHON`
defaults to this interpreter (it has pyarrow and bk). On a cluster the executors'
Python is the cluster's business: PYSPARK_PYTHON / spark.pyspark.python as the
operator set them (Spark's default `python3` otherwise), never this driver's path,
which need not exist there. What they need of bk is shipped with the job
(`ship_code`): a zip of the installed `bk` and `spark` packages' Python files (and
google_crc32c's pure-Python twin), added with SparkContext.addPyFile, so an executor
needs pyspark and pyarrow and nothing else of bk; no compiled kernel is shipped (the
analytics use none; a CRC32C without the C extension is google_crc32c's pure twin).
"""
from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
import zipfile

DEFAULT_MASTER = "local[*]"


def get_session(master: str | None = None, app_name: str = "bk-analytics", driver_memory: str = "1g",
                shuffle_partitions: int | None = None):
    """The process's SparkSession (created once, then reused), with bk's data sources registered."""
    logging.getLogger("py4j").setLevel(logging.WARNING)  # its INFO lines would interleave with progress
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    # spark-submit starts the JVM first and hands the driver its gateway: its --master stands
    is_local = (master or DEFAULT_MASTER).startswith("local") and not under_submit
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if is_local:  # executors on this machine: this interpreter (a cluster's Python is its operator's)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        session = active
    else:
        builder = SparkSession.builder.appName(app_name)
        if master or not under_submit:
            builder = builder.master(master or DEFAULT_MASTER)
        builder = (builder.config("spark.ui.enabled", "false")
                   .config("spark.ui.showConsoleProgress", "false")
                   .config("spark.sql.session.timeZone", "UTC")
                   .config("spark.sql.execution.arrow.pyspark.enabled", "true"))
        if is_local:  # a cluster's operator sizes their own driver, shuffle and Python
            builder = (builder.config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
                       .config("spark.driver.memory", driver_memory)
                       .config("spark.sql.shuffle.partitions", str(shuffle_partitions or 8)))
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
    sc = session.sparkContext
    if not sc.master.startswith("local"):
        ship_code(sc)
        # the analytics' shuffles are small (per log, per bookie): as many partitions as the
        # cluster has task slots, not Spark's 200 (unless the operator chose a number)
        if not sc.getConf().contains("spark.sql.shuffle.partitions"):
            session.conf.set("spark.sql.shuffle.partitions", str(sc.defaultParallelism))
    from .sources import register

    register(session)
    return session


# ---------------------------------------------------------------- code for the executors
_SHIPPED_PACKAGES = ("bk", "spark", "google_crc32c")
_shipped: dict[int, str] = {}  # id(SparkContext) -> the zip added to it


def code_zip(path: str) -> str:
    """Write a zip of the installed bk, spark and google_crc32c packages' .py files (no
    compiled module: executors may run another platform) to `path`; returns it."""
    import importlib

    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in _SHIPPED_PACKAGES:
            pkg_dir = os.path.dirname(importlib.import_module(name).__file__)
            root = os.path.dirname(pkg_dir)
            for dirpath, dirnames, filenames in os.walk(pkg_dir):
                dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
                for f in sorted(filenames):
                    if f.endswith(".py"):
                        full = os.path.join(dirpath, f)
                        zf.write(full, os.path.relpath(full, root))
    return path


def ship_code(sc) -> str:
    """Add the code zip to a cluster SparkContext once (executors put it on sys.path)."""
    if id(sc) not in _shipped:
        path = code_zip(os.path.join(tempfile.mkdtemp(prefix="bk-analytics-"), "bk_analytics.zip"))
        sc.addPyFile(path)
        _shipped[id(sc)] = path
    return _shipped[id(sc)]


class StageProgress:
    """Polls Spark's status tracker and shows stages done / total and the running
    stage's tasks on `bar` (a bk.cli.progress.ProgressBar or anything with
    update_to(done, total, postfix) and note(line))."""

    def __init__(self, session, bar, interval_s: float = 0.25):
        self.tracker = session.sparkContext.statusTracker()
        self.bar = bar
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bk-spark-progress", daemon=True)
        self.stages_seen: set[int] = set()
        self.stages_done: set[int] = set()
        self.step = ""

    def __enter__(self) -> "StageProgress":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._poll()

    def set_step(self, step: str) -> None:
        self.step = step
        self.bar.note(f"analytics: {step}")

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._poll()
            except Exception:  # noqa: BLE001 - a progress display never fails the job
                pass

    def _poll(self) -> None:
        active = set(self.tracker.getActiveStageIds())
        self.stages_done |= self.stages_seen - active
        self.stages_seen |= active
        tasks_done = tasks_total = 0
        for sid in active:
            info = self.tracker.getStageInfo(sid)
            if info is not None:
                tasks_done += info.numCompletedTasks
                tasks_total += info.numTasks
        postfix = f"{self.step}: stage tasks {tasks_done}/{tasks_total}" if active else self.step
        self.bar.update_to(len(self.stages_done), len(self.stages_seen), postfix=postfix)
