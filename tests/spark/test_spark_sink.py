"""The sink's dedup keys: a retried write or a re-run streaming batch stores each row once;
and the end-to-end stream, tercel -> Spark -> tercel and -> Parquet, on both cluster shapes.

Spark parts use the shared local[2] session (conftest.py) and real servers; the end-to-end
test runs crash_driver.py on each shape (conftest.py ``shape``), unarmed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tercel.client import Client
from tercel.spark.options import SinkOptions
from tercel.spark.sink import RowKeys
from tercel.testing import ServerProcess

DRIVER = Path(__file__).with_name("crash_driver.py")


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    with (
        ServerProcess(tmp_path_factory.mktemp("s1")) as a,
        ServerProcess(tmp_path_factory.mktemp("s2")) as b,
    ):
        yield [a, b]


def addresses(servers: list[ServerProcess]) -> str:
    return ",".join(s.address for s in servers)


def drain(servers: list[ServerProcess], queue: str) -> list[str]:
    """Every item of ``queue`` on every server, taken for good."""
    got: list[str] = []
    for server in servers:
        with Client(server.address) as c:
            while (value := c.get(queue)) is not None:
                got.append(value.decode())
    return got


def test_row_keys_name_the_write_the_batch_the_partition_and_the_row() -> None:
    keys = RowKeys("q1.7.3.")
    first = pa.record_batch({"value": [b"a", b"b", b"c"]})
    assert keys.take(first) == ["q1.7.3.0", "q1.7.3.1", "q1.7.3.2"]
    assert keys.take(pa.record_batch({"value": [b"d"]})) == ["q1.7.3.3"]  # rows of the task


def test_key_column_values_are_the_keys_and_are_checked() -> None:
    batch = pa.record_batch({"value": [b"a", b"b"], "k": ["order-1", "order-2"]})
    assert RowKeys("w.0.0.", "k").take(batch) == ["order-1", "order-2"]
    ints = pa.record_batch({"value": [b"a"], "k": pa.array([42], pa.int64())})
    assert RowKeys("w.0.0.", "k").take(ints) == ["42"]
    for bad in ("has space", "", None):
        with pytest.raises(ValueError, match=r"keyColumn 'k'.*key"):
            RowKeys("w.0.0.", "k").take(pa.record_batch({"value": [b"a"], "k": [bad]}))


def test_key_column_needs_dedup() -> None:
    base = {"servers": "127.0.0.1:1", "queue": "q"}
    assert SinkOptions.parse(base).dedup is True
    assert SinkOptions.parse({**base, "dedup": "false"}).dedup is False
    with pytest.raises(ValueError, match=r"keyColumn.*needs dedup"):
        SinkOptions.parse({**base, "keyColumn": "k", "dedup": "false"})


@pytest.mark.spark
def test_batch_write_keys_rows_apart_and_a_key_column_stores_once(
    spark: Any, servers: list[ServerProcess], qname: str
) -> None:
    """Default keys tell equal rows apart (each is stored); a ``keyColumn`` write done twice
    stores its rows once; ``dedup=false`` twice stores them twice."""
    rows = [(f"v{i % 50}", f"k{i}") for i in range(400)]  # values repeat, keys do not
    df = spark.createDataFrame(rows, "value string, k string").repartition(2)

    def write(queue: str, **options: str) -> None:
        writer = df.write.format("tercel").option("servers", addresses(servers))
        for key, value in options.items():
            writer = writer.option(key, value)
        writer.option("queue", queue).mode("append").save()

    write(f"{qname}_default", ignoreExtraColumns="true")
    assert sorted(drain(servers, f"{qname}_default")) == sorted(v for v, _ in rows)
    write(f"{qname}_keyed", keyColumn="k")
    write(f"{qname}_keyed", keyColumn="k")
    assert sorted(drain(servers, f"{qname}_keyed")) == sorted(v for v, _ in rows)
    write(f"{qname}_plain", dedup="false", ignoreExtraColumns="true")
    write(f"{qname}_plain", dedup="false", ignoreExtraColumns="true")
    assert len(drain(servers, f"{qname}_plain")) == 2 * len(rows)


def _stream_files_into_tercel(
    spark: Any, src: Path, work: Path, servers: list[ServerProcess], *, queue: str, dedup: bool
) -> None:
    df = spark.readStream.schema("value string").option("maxFilesPerTrigger", 1).json(str(src))
    query = (
        df.writeStream.format("tercel")
        .option("servers", addresses(servers))
        .option("queue", queue)
        .option("dedup", str(dedup).lower())
        .option("checkpointLocation", str(work))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None, query.exception()


@pytest.mark.spark
@pytest.mark.parametrize("dedup", [True, False])
def test_a_streaming_batch_run_again_after_a_crash_stores_nothing_twice(
    spark: Any, servers: list[ServerProcess], work: Path, qname: str, dedup: bool
) -> None:
    """A query writes two batches; its last commit-log entry is removed (what a driver killed
    after the sink wrote and before Spark committed leaves); the restarted query runs that
    batch again with the same query id: keyed, nothing new is stored; ``dedup=false`` stores
    the batch twice (the test can see a duplicate)."""
    src = work / "src"
    src.mkdir()
    produced = [f"{qname}/{i}" for i in range(300)]
    for f in range(2):
        lines = [json.dumps({"value": v}) for v in produced[f * 150 : (f + 1) * 150]]
        (src / f"part-{f}.json").write_text("\n".join(lines) + "\n")
    ck = work / "ck"
    _stream_files_into_tercel(spark, src, ck, servers, queue=qname, dedup=dedup)
    for name in ("1", ".1.crc"):  # the entry and Hadoop's checksum of it
        (ck / "commits" / name).unlink(missing_ok=True)
    _stream_files_into_tercel(spark, src, ck, servers, queue=qname, dedup=dedup)
    got = drain(servers, qname)
    if dedup:
        assert sorted(got) == sorted(produced)
    else:
        assert len(got) == len(produced) + 150


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_end_to_end_queue_to_spark_to_queue_and_parquet_exactly_once(
    shape: str, servers: list[ServerProcess], work: Path, qname: str
) -> None:
    """tercel -> tercel sink and tercel -> Parquet, two servers, ``Trigger.AvailableNow`` in
    several batches, on ``shape``; the checkpoint is the driver's own directory."""
    produced: dict[str, list[str]] = {}
    lanes = []
    for sink in ("tercel", "parquet"):
        name = f"{qname}-{sink}"
        produced[name] = []
        for k, server in enumerate(servers):
            items = [f"{name}/{k}/{i}" for i in range(250)]
            with Client(server.address) as c:
                c.put_many(name, [v.encode() for v in items])
            produced[name] += items
        lane: dict[str, Any] = {
            "name": name,
            "servers": addresses(servers),
            "queue": name,
            "checkpoint": str(work / name / "ck"),
            "source_options": {"maxItemsPerTrigger": "200"},
            "sink": sink,
        }
        if sink == "tercel":
            lane.update(out_servers=addresses(servers), out_queue=f"{name}-out")
        else:
            lane.update(out=str(work / name / "out"))
        lanes.append(lane)
    plan = {"master": shape, "lanes": lanes, "report": str(work / "report.json")}
    done = subprocess.run(
        [sys.executable, str(DRIVER), json.dumps(plan)],
        capture_output=True,
        check=False,
        text=True,
        timeout=540,
        start_new_session=True,
    )
    assert done.returncode == 0 and "DONE" in done.stdout, (done.stdout + done.stderr)[-4000:]
    report = json.loads((work / "report.json").read_text())
    for name, items in produced.items():
        got = report[name] if name.endswith("parquet") else drain(servers, f"{name}-out")
        assert sorted(got) == sorted(items), f"{name}: {len(got)} rows for {len(items)} items"
