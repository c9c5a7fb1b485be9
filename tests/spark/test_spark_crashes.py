"""Crash matrix of the streaming source: a simulated kill -9 at every fail point of the fetch
→ stage → ack → commit → recover cycle, twice in a row, then a clean run; every produced
(acknowledged) item must reach the sink exactly once.

No JVM: :class:`MiniSpark` drives :class:`TercelStreamReader` the way Spark's micro-batch
engine does (offset log written before a batch runs, ``commit`` one batch late, a logged but
uncommitted batch replayed with the same offsets, an idempotent sink keyed by batch id), and
executors are pickled copies of the reader. A crash is an exception that no code of the
source catches (``BaseException``), raised by the fail-point hook: nothing after it runs, no
``finally`` finishes a segment, the objects of the dead "process" are dropped. The staging log
fsyncs before every fail point that follows a write, so what is on disk is what a killed
process leaves. Leases are lost (as when they run out) by a kill -9 and restart of the server.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import pickle
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows

from tercel.client import Client
from tercel.spark import failpoints
from tercel.spark.options import SourceOptions
from tercel.spark.source import TercelStreamReader
from tercel.testing import ServerProcess

ITEMS = 11
"""Items per scenario: with ``leaseBatch`` 3 and 4 per trigger, batches span several rounds
and segments, and the last round is short."""

SPARK_POINTS = ("spark.offsets", "spark.sink")
"""MiniSpark's own crash windows: after the offset log, after the sink wrote the batch."""

POINTS = failpoints.POINTS + SPARK_POINTS


class Crash(BaseException):
    """A simulated kill -9 (nothing of the source catches a BaseException)."""


@dataclass
class Plan:
    """Crash at the ``hit``-th time ``point`` is reached (once)."""

    point: str
    hit: int = 1
    seen: dict[str, int] = field(default_factory=dict)
    fired: bool = False

    def __call__(self, name: str) -> None:
        self.seen[name] = self.seen.get(name, 0) + 1
        if not self.fired and name == self.point and self.seen[name] == self.hit:
            self.fired = True
            raise Crash(name)


def failpoint(name: str) -> None:
    failpoints.failpoint(name)


def _write_json(path: Path, value: object) -> None:
    tmp = path.with_suffix(".new")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


class MiniSpark:
    """The calls and logs of Spark's micro-batch engine that decide delivery (see the module
    docstring), in directory ``root``; ``run`` drives one query run until no new data."""

    def __init__(self, root: Path, opts: SourceOptions) -> None:
        self.root = root
        self.opts = opts
        for sub in ("offsets", "commits", "sink"):
            (root / sub).mkdir(parents=True, exist_ok=True)

    def _log(self, name: str) -> dict[int, dict[str, int]]:
        d = self.root / name
        return {int(p.name): json.loads(p.read_text()) for p in d.iterdir() if p.suffix == ""}

    def run(self) -> None:
        reader = TercelStreamReader(self.opts)
        offsets, commits = self._log("offsets"), self._log("commits")
        last = max(offsets, default=-1)
        if last >= 0 and last not in commits:  # replay with the same offsets
            self._batch(reader, last, offsets[last])
        while True:
            start = offsets[last]["end"] if last >= 0 else reader.initialOffset()["seq"]
            end = reader.latestOffset({"seq": start}, ReadMaxRows(4))["seq"]
            if end == start:
                reader.stop()
                return
            last += 1
            offsets[last] = {"start": start, "end": end}
            _write_json(self.root / "offsets" / str(last), offsets[last])
            failpoint("spark.offsets")
            if last > 0:
                reader.commit({"seq": start})
            self._batch(reader, last, offsets[last])

    def _batch(self, reader: TercelStreamReader, n: int, span: dict[str, int]) -> None:
        executor = pickle.loads(pickle.dumps(reader))
        rows: list[str] = []
        for part in reader.partitions({"seq": span["start"]}, {"seq": span["end"]}):
            for batch in executor.read(pickle.loads(pickle.dumps(part))):
                rows += [v.decode() for v in batch.column("value").to_pylist()]
        _write_json(self.root / "sink" / str(n), rows)  # idempotent: replaces batch n
        failpoint("spark.sink")
        _write_json(self.root / "commits" / str(n), span)

    def sunk(self) -> list[str]:
        return [r for _, rows in sorted(self._log("sink").items()) for r in rows]


@dataclass
class Lane:
    """One scenario: its own queue, staging directory and MiniSpark on one server."""

    server: ServerProcess
    name: str
    work: Path
    plans: tuple[Plan, Plan]
    produced: list[str] = field(default_factory=list)

    def spark(self) -> MiniSpark:
        opts = SourceOptions.parse(
            {
                "servers": self.server.address,
                "queue": self.name,
                "stagingLocation": str(self.work / "stage"),
                "leaseBatch": "3",
                "fetchWaitMs": "0",
                "leaseMs": "600000",
            }
        )
        return MiniSpark(self.work / "spark", opts)

    def run(self, plan: Plan | None) -> None:
        failpoints.set_hook(plan)
        try:
            self.spark().run()
        except Crash:
            pass  # the dead run's objects go with its frames: sockets and files close unflushed
        finally:
            failpoints.set_hook(None)


def restart(server: ServerProcess) -> None:
    """kill -9 and start again on the same port: every open lease is handed back."""
    port = server.port
    server.kill()
    server.extra_args = ("--memcache-port", str(port))
    server.start()


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """A directory in memory when the machine has one: a simulated crash does not depend on
    fsync reaching a disk, and hundreds of lanes of fsyncs on a shared disk take minutes."""
    if not os.path.isdir("/dev/shm"):
        yield tmp_path
        return
    root = Path(tempfile.mkdtemp(prefix="tercel-crash-", dir="/dev/shm"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def two_servers(scratch: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    with ServerProcess(scratch / "a") as a, ServerProcess(scratch / "b") as b:
        yield a, b


FIRST = [(p, hit) for p in (*failpoints.POINTS[:5], "gc.deleted", *SPARK_POINTS) for hit in (1, 3)]
"""The first crash: every point a clean first run reaches, early (1st hit) and mid-stream."""


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_two_crashes_at_every_pair_of_fail_points_lose_and_duplicate_nothing(
    scratch: Path, two_servers: tuple[ServerProcess, ServerProcess]
) -> None:
    """Lanes on server ``a`` keep their leases over the first crash (a quick restart);
    lanes on ``b`` lose them (a restart after the leases ran out). Both servers restart
    before the clean run, which so finds every item that was leased and never acked."""
    keep, lose = two_servers
    lanes: list[Lane] = []
    for n, ((p1, h1), p2, server) in enumerate(itertools.product(FIRST, POINTS, two_servers)):
        lane = Lane(server, f"c{n}", scratch / f"lane{n}", (Plan(p1, h1), Plan(p2)))
        lane.produced = [f"{lane.name}/{i}" for i in range(ITEMS)]
        lanes.append(lane)
    with Client(keep.address) as ca, Client(lose.address) as cb:
        for lane in lanes:
            (ca if lane.server is keep else cb).put_many(
                lane.name, [p.encode() for p in lane.produced]
            )
    for lane in lanes:
        lane.run(lane.plans[0])
    restart(lose)
    for lane in lanes:
        lane.run(lane.plans[1])
    restart(keep)
    restart(lose)
    for lane in lanes:
        lane.run(None)

    gc.collect()  # the dead runs' sockets close here, inside this test's warning filters
    fired = {(lane.plans[0].point, lane.plans[1].point) for lane in lanes if lane.plans[1].fired}
    assert all(lane.plans[0].fired for lane in lanes)
    assert {p2 for _, p2 in fired} == set(POINTS)  # every point was crashed at, second
    failures = []
    for lane in lanes:
        got = lane.spark().sunk()
        missing = set(lane.produced) - set(got)
        dups = len(got) - len(set(got))
        if missing or dups or len(got) != len(lane.produced):
            failures.append(
                f"{lane.plans[0].point}#{lane.plans[0].hit} then {lane.plans[1].point}"
                f" ({'kept' if lane.server is keep else 'lost'} leases): "
                f"{len(missing)} missing, {dups} duplicated"
            )
    assert not failures, "\n".join(failures)
