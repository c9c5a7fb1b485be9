"""The crash matrix: real Spark drivers (``crash_driver.py``, local[2]) streaming the tercel
source into the tercel sink and into Parquet, killed at every fail point of
:mod:`tercel.spark.failpoints` twice in a row, then a server killed (SIGKILL) during a batch
and started again on its data directory; after a clean run, every produced (acknowledged)
item is counted in every lane's output: 0 missing, 0 duplicated, source and sink.

A kill: the driver runs with ``TERCEL_SPARK_FAILPOINT=<point>:<hit>``, so the process that
reaches the point (the source's runner, the sink's commit runner, or an executor's Python
worker for ``source.read``/``sink.write``) ends there with ``os._exit(137)`` and the query
fails. The driver starts the query again on its checkpoint (a new source runner and new
workers, armed again): it is killed at the same point a second time; then the driver exits at
once and the test SIGKILLs its process group (its JVM and workers): what kill -9 of the
driver leaves. One driver per point, two lanes each (tercel -> tercel sink, tercel ->
Parquet, on the same two servers); the last driver is not armed and runs every lane to the
end, while a third server is SIGKILLed during a batch and started again on its data
directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tercel.client import Client
from tercel.spark import failpoints
from tercel.testing import ServerProcess

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1200)]

DRIVER = Path(__file__).with_name("crash_driver.py")

PER_SERVER = 150
"""Items each lane's queue gets on each of the two servers."""

SOURCE_OPTIONS = {"maxItemsPerTrigger": "100"}
"""Small batches, so a lane runs several and a kill lands mid-stream."""

KILLS = {
    "source.planned": 2,
    "source.partitions": 2,
    "source.read": 1,
    "source.commit.before": 1,
    "source.commit.after": 1,
    "sink.write": 1,
    "sink.commit": 2,
}
"""The hit each point is armed at: the 2nd for the driver-side steps, so the first batch has
run and the kill falls in the middle of the stream."""


@dataclass
class Lane:
    """One stream: its input queue on two servers, its sink, its checkpoint."""

    name: str
    sink: str  # "tercel" | "parquet"
    servers: list[ServerProcess]
    work: Path
    produced: list[str] = field(default_factory=list)

    @property
    def addresses(self) -> str:
        return ",".join(s.address for s in self.servers)

    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "name": self.name,
            "servers": self.addresses,
            "queue": self.name,
            "checkpoint": str(self.work / "ck"),
            "source_options": SOURCE_OPTIONS,
            "sink": self.sink,
        }
        if self.sink == "tercel":
            spec.update(out_servers=self.addresses, out_queue=f"{self.name}-out")
        else:
            spec.update(out=str(self.work / "out"))
        return spec

    def produce(self) -> None:
        for k, server in enumerate(self.servers):
            items = [f"{self.name}/{k}/{i}" for i in range(PER_SERVER)]
            with Client(server.address) as c:
                c.put_many(self.name, [v.encode() for v in items])
            self.produced += items

    def output(self, report: dict[str, list[str]]) -> list[str]:
        if self.sink == "parquet":
            return report.get(self.name, [])
        got: list[str] = []
        for server in self.servers:
            with Client(server.address) as c:
                while (value := c.get(f"{self.name}-out")) is not None:
                    got.append(value.decode())
        return got


class Driver:
    """One ``crash_driver.py`` process in its own process group."""

    def __init__(self, lanes: list[Lane], work: Path, point: str | None = None, **plan: Any):
        self.report = work / f"report-{time.monotonic_ns()}.json"
        spec = {"lanes": [lane.spec() for lane in lanes], "report": str(self.report), **plan}
        env = dict(os.environ)
        env.pop(failpoints.ENV, None)
        if point is not None:
            env[failpoints.ENV] = point
        self.proc = subprocess.Popen(
            [sys.executable, str(DRIVER), json.dumps(spec)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []

    def wait(self, timeout: float = 400.0) -> int:
        """The driver's exit code; then its JVM and workers are SIGKILLed."""
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_group()
            out, _ = self.proc.communicate()
            raise AssertionError(f"driver timed out:\n{out[-4000:]}") from None
        finally:
            self.kill_group()
        self.lines = out.splitlines()
        return self.proc.returncode

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def tail(self) -> str:
        return "\n".join(self.lines[-30:])

    def results(self) -> dict[str, list[str]]:
        return json.loads(self.report.read_text())


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """A directory in memory when the machine has one (servers' fsyncs and checkpoints)."""
    if not os.path.isdir("/dev/shm"):
        yield tmp_path
        return
    root = Path(tempfile.mkdtemp(prefix="tercel-crash-", dir="/dev/shm"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def restart_on_same_port(server: ServerProcess) -> None:
    """SIGKILL, then start again on the same data directory and port."""
    port = server.port
    server.kill()
    server.extra_args = ("--memcache-port", str(port))
    server.start()


def check(lanes: list[Lane], report: dict[str, list[str]]) -> list[str]:
    """One line per lane that lost or duplicated items."""
    failures = []
    for lane in lanes:
        got = lane.output(report)
        missing = set(lane.produced) - set(got)
        dups = len(got) - len(set(got))
        extra = set(got) - set(lane.produced)
        if missing or dups or extra:
            failures.append(
                f"{lane.name} ({lane.sink}): {len(missing)} missing, {dups} duplicated, "
                f"{len(extra)} unknown of {len(lane.produced)}"
            )
    return failures


def lane_name(point: str, sink: str) -> str:
    return f"{point.replace('.', '-')}-{sink[0]}"


def test_kill_twice_at_every_fail_point_then_a_server_loses_and_duplicates_nothing(
    scratch: Path,
) -> None:
    with (
        ServerProcess(scratch / "a") as a,
        ServerProcess(scratch / "b") as b,
        ServerProcess(scratch / "c") as c,
        ServerProcess(scratch / "d") as d,
    ):
        by_point: dict[str, list[Lane]] = {}
        for point in KILLS:
            by_point[point] = [
                Lane(lane_name(point, sink), sink, [a, b], scratch / lane_name(point, sink))
                for sink in ("tercel", "parquet")
            ]
        victims = [
            Lane(f"server-kill-{s[0]}", s, [c, d], scratch / f"sk-{s}")
            for s in ("tercel", "parquet")
        ]
        lanes = [lane for group in by_point.values() for lane in group] + victims
        for lane in lanes:
            lane.produce()

        for point, hit in KILLS.items():
            driver = Driver(by_point[point], scratch, f"{point}:{hit}", restarts=1)
            rc = driver.wait()
            died = [x.split(":")[0].split()[-1] for x in driver.lines if x.startswith("FAILED")]
            again = [x.split(":")[0].split()[-1] for x in driver.lines if x.startswith("RESTART")]
            assert rc == 3 and died and died[0] in again, (
                f"{point}: not killed twice (exit {rc}):\n{driver.tail()}"
            )

        # The last run: no fail point; the victims' lanes first, a server killed mid-stream.
        final = Driver(
            victims + lanes[: -len(victims)], scratch, None, restarts=10, retry_wait=1.0, parallel=4
        )
        deadline = time.monotonic() + 300
        while True:
            with Client(c.address) as cc:
                out = int(
                    cc.queue_stats()
                    .get(c.address, {})
                    .get("server-kill-t-out", {})
                    .get("items", "0")
                )
            if out > 0:
                break
            assert final.proc.poll() is None, "the last driver ended before the server kill"
            assert time.monotonic() < deadline, "no output on the victim lane in 300 s"
            time.sleep(0.2)
        restart_on_same_port(c)
        rc = final.wait(600)
        assert rc == 0, f"the last driver failed (exit {rc}):\n{final.tail()}"
        failures = check(lanes, final.results())
    assert not failures, "\n".join(failures)
