"""Spark test fixtures: one local[2] SparkSession for the whole run, real tercel servers, and
the two cluster shapes that driver subprocesses (crash_driver.py) run on.

``make test`` installs pyspark and a Java runtime, so a missing one is a failure here, not a
skip. Spark's JVM and its Python workers inherit this process's environment: the workers must
run this interpreter (it has tercel and pyarrow), and Spark must bind to loopback.

The second shape, ``local-cluster[2,1,1024]``, is a standalone master and two workers inside
the driver's JVM, each worker starting its executor as a separate JVM (with its own Python
workers), as on a real cluster: nothing is shared with the driver but the network. It needs
only what the pip package of pyspark ships: ``SPARK_HOME`` set to the package directory (the
workers launch executors with its ``jars/``; crash_driver.py sets it). One process holds one
SparkContext, so this shape runs in driver subprocesses.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CLUSTER = "local-cluster[2,1,1024]"
"""Two executors in separate JVMs, one core and 1 GiB each."""

SHAPES = ("local[2]", CLUSTER)

os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

try:
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401  # (imported for the check)
except ImportError as exc:  # make test installs tercel[spark]: this is a broken install
    raise ImportError(
        f"the Spark tests need tercel[spark] (pip install -e '.[spark]'): {exc}"
    ) from exc


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "spark: needs a SparkSession (pyspark + Java)")


def spark_conf() -> dict[str, str]:
    """What the Spark tests add to :data:`tercel.spark.LOCAL_CONF`."""
    return {
        "spark.speculation": "false",
        "spark.sql.streaming.stopTimeout": "30s",
        "spark.driver.memory": "1g",
    }


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The one local[2] SparkSession, with ``tercel`` and ``tercel-journal`` registered."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("the Spark tests need Java (make installs openjdk-17-jre-headless)")
    from tercel.spark import local_session

    session = local_session("tercel-tests", spark_conf())
    yield session
    session.stop()


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A scratch directory for staging, checkpoints and sinks."""
    return tmp_path


@pytest.fixture(params=SHAPES)
def shape(request: pytest.FixtureRequest) -> str:
    """Each Spark master a test runs on: ``local[2]``, then ``local-cluster[2,1,1024]``."""
    return str(request.param)
