"""One local SparkSession for every Spark test (starting Spark costs ~10 s).

`local[2]`, UI off, 512m driver. Without pyspark or Java the tests skip, unless
BK_REQUIRE_ZK=1 (scripts/test, CI) or CI is set: then a missing install step is a
failure, never a silent skip.
"""
from __future__ import annotations

import os
import shutil

import pytest


def _required() -> bool:
    return os.environ.get("BK_REQUIRE_ZK") == "1" or bool(os.environ.get("CI"))


@pytest.fixture(scope="session")
def spark():
    problem = None
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as e:
        problem = f"pyspark/pyarrow not installed: {e}"
    if problem is None and shutil.which("java") is None:
        problem = "no java on PATH"
    if problem is not None:
        if _required():
            pytest.fail(f"Spark tests need Spark: {problem} (run ./scripts/setup)")
        pytest.skip(problem)
    from spark.session import get_session
    session = get_session("local[2]", app_name="bk-tests", driver_memory="512m", shuffle_partitions=2)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def chromium():
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if _required():
            pytest.fail("no chromium: ./scripts/setup installs Debian's chromium for the report check")
        pytest.skip("no chromium")
    return path
