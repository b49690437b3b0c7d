"""The SparkSession the analytics use, and progress while Spark works.

Local mode by default (`local[*]`, UI off, small driver memory); `master=` any Spark
master URL (spark://, yarn, k8s://) for a real cluster, or nothing at all under
spark-submit, which has already chosen one. Spark's Python workers start
`PYSPARK_PYTHON` (default: `python3` on PATH, which may lack pyarrow and bk): it is set
to this interpreter unless the operator set it.
"""
from __future__ import annotations

import logging
import os
import sys
import threading

DEFAULT_MASTER = "local[*]"


def get_session(master: str | None = None, app_name: str = "bk-analytics", driver_memory: str = "1g",
                shuffle_partitions: int | None = None):
    """The process's SparkSession (created once, then reused), with bk's data sources registered."""
    logging.getLogger("py4j").setLevel(logging.WARNING)  # its INFO lines would interleave with progress
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        session = active
    else:
        builder = SparkSession.builder.appName(app_name)
        # spark-submit starts the JVM first and hands the driver its gateway: its --master stands
        under_submit = "PYSPARK_GATEWAY_PORT" in os.environ
        if master or not under_submit:
            builder = builder.master(master or DEFAULT_MASTER)
        is_local = (master or DEFAULT_MASTER).startswith("local") and not under_submit
        builder = (builder.config("spark.ui.enabled", "false")
                   .config("spark.ui.showConsoleProgress", "false")
                   .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
                   .config("spark.sql.session.timeZone", "UTC")
                   .config("spark.sql.execution.arrow.pyspark.enabled", "true"))
        if is_local:  # a cluster's operator sizes their own driver and shuffle
            builder = (builder.config("spark.driver.memory", driver_memory)
                       .config("spark.sql.shuffle.partitions", str(shuffle_partitions or 8)))
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
    from .sources import register

    register(session)
    return session


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
