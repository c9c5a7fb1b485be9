"""The connector against a real local[2] SparkSession and real tercel servers.

All Spark tests live in this one module so they share one session (conftest.py). Every
exactly-once check reads the Parquet file sink, which only shows committed batches.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tercel.client import Client
from tercel.testing import ServerProcess

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

DRIVER = Path(__file__).with_name("crash_driver.py")


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    """Two servers shared by the tests that do not kill one (queues are named per test)."""
    with (
        ServerProcess(tmp_path_factory.mktemp("s1")) as a,
        ServerProcess(tmp_path_factory.mktemp("s2")) as b,
    ):
        yield [a, b]


def produce(server: ServerProcess, queue: str, n: int) -> list[bytes]:
    items = [f"{queue}/{server.port}/{i}".encode() for i in range(n)]
    with Client(server.address) as c:
        c.put_many(queue, items)
    return items


def source(spark: Any, addresses: list[str], queue: str, stage: Path, **opts: object) -> Any:
    reader = (
        spark.readStream.format("tercel")
        .option("servers", ",".join(addresses))
        .option("queue", queue)
        .option("stagingLocation", str(stage))
    )
    for key, value in opts.items():
        reader = reader.option(key, str(value))
    return reader.load()


def to_parquet(df: Any, work: Path, available_now: bool = False) -> Any:
    writer = (
        df.writeStream.format("parquet")
        .option("path", str(work / "out"))
        .option("checkpointLocation", str(work / "ck"))
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="0 seconds")
    return writer.start()


def sunk(spark: Any, work: Path) -> list[bytes]:
    """Every value committed to the Parquet sink (duplicates kept)."""
    if not (work / "out").exists():
        return []
    return [bytes(r.value) for r in spark.read.parquet(str(work / "out")).select("value").collect()]


def rows_seen(query: Any) -> int:
    return sum(p["numInputRows"] for p in query.recentProgress)


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def open_leases(servers: list[ServerProcess], queue: str) -> int:
    """Leases still out on ``queue``, over all ``servers``."""
    total = 0
    for server in servers:
        with Client(server.address) as c:
            stats = c.queue_stats().get(server.address, {})
        total += int(stats.get(queue, {}).get("open_leases", "0"))
    return total


def assert_exactly_once(got: list[bytes], produced: list[bytes]) -> None:
    assert len(got) == len(set(got)), f"{len(got) - len(set(got))} duplicate(s)"
    missing = set(produced) - set(got)
    assert not missing, f"{len(missing)} item(s) lost, e.g. {sorted(missing)[:3]}"
    assert len(got) == len(produced)


def test_stop_and_restart_mid_stream_sees_every_item_exactly_once(
    spark: Any, servers: list[ServerProcess], work: Path, qname: str
) -> None:
    produced = produce(servers[0], qname, 1500) + produce(servers[1], qname, 1500)
    addresses = [s.address for s in servers]
    df = source(
        spark,
        addresses,
        qname,
        work / "stage",
        maxItemsPerTrigger=200,
        leaseBatch=100,
        leaseMs=2000,
    )
    query = to_parquet(df, work)
    wait_for(lambda: rows_seen(query) >= 400, "two batches")
    query.stop()
    first = query.recentProgress
    assert max(p["numInputRows"] for p in first) <= 200  # maxItemsPerTrigger
    assert 0 < len(sunk(spark, work)) < len(produced)  # stopped mid-stream
    # A stop that lands between a lease and its fsync leaves that round leased, unstaged
    # (docs/spark.md: it comes back when the lease runs out); AvailableNow counts only what
    # is queued when it starts, so wait for those items to be queued again.
    wait_for(lambda: open_leases(servers, qname) == 0, "unstaged leases to run out", 30)

    df = source(spark, addresses, qname, work / "stage", maxItemsPerTrigger=1000)
    query = to_parquet(df, work, available_now=True)
    query.awaitTermination(300)
    assert query.exception() is None
    assert_exactly_once(sunk(spark, work), produced)
    assert os.listdir(work / "stage") == ["query.json"]  # everything committed was collected


def test_available_now_drains_in_batches_of_max_items_per_trigger(
    spark: Any, servers: list[ServerProcess], work: Path, qname: str
) -> None:
    produced = produce(servers[0], qname, 250)
    df = source(spark, [s.address for s in servers], qname, work / "stage", maxItemsPerTrigger=100)
    query = to_parquet(df, work, available_now=True)
    assert query.awaitTermination(300)
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert batches == [100, 100, 50]
    assert_exactly_once(sunk(spark, work), produced)
    rows = spark.read.parquet(str(work / "out")).orderBy("seq").collect()
    assert [r.seq for r in rows] == list(range(250))
    assert {r.server for r in rows} == {servers[0].address}
    assert [r.item_id for r in rows] == list(range(1, 251))
    assert all(r.deliveries == 1 and r.queue == qname for r in rows)
    assert all(r.enqueued_at is not None and r.fetched_at >= r.enqueued_at for r in rows)


def test_kill_9_of_the_driver_between_fetch_and_ack_loses_nothing(
    spark: Any, servers: list[ServerProcess], work: Path, qname: str
) -> None:
    produced = produce(servers[0], qname, 300) + produce(servers[1], qname, 300)
    addresses = ",".join(s.address for s in servers)
    marker = work / "staged"
    args = {
        "servers": addresses,
        "queue": qname,
        "stage": str(work / "stage"),
        "checkpoint": str(work / "ck"),
        "out": str(work / "out"),
        "marker": str(marker),
    }
    with open(work / "driver.log", "wb") as log:
        driver = subprocess.Popen(
            [sys.executable, str(DRIVER), json.dumps(args)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the JVM and Python workers too
        )
    try:
        wait_for(lambda: marker.exists() or driver.poll() is not None, "the staged round", 300)
        assert driver.poll() is None, (work / "driver.log").read_text()[-3000:]
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    runner = int(marker.read_text())
    wait_for(lambda: not os.path.exists(f"/proc/{runner}"), "the source process to die", 30)
    staged = [n for n in os.listdir(work / "stage") if n.endswith(".tmp")]
    assert staged, "the driver died outside the window between fsync and ack"
    time.sleep(2.5)  # the 2 s leases run out: the staged items are redelivered

    df = source(spark, [s.address for s in servers], qname, work / "stage")
    query = to_parquet(df, work, available_now=True)
    query.awaitTermination(300)
    assert query.exception() is None
    assert_exactly_once(sunk(spark, work), produced)


def test_a_server_killed_mid_stream(spark: Any, work: Path, qname: str) -> None:
    with ServerProcess(work / "a") as a, ServerProcess(work / "b") as b:
        from_a = produce(a, qname, 600)
        from_b = produce(b, qname, 600)
        df = source(
            spark,
            [a.address, b.address],
            qname,
            work / "stage",
            maxItemsPerTrigger=100,
            leaseBatch=50,
            serverRetryMs=200,
        )
        query = to_parquet(df, work)
        try:
            wait_for(lambda: rows_seen(query) >= 200, "two batches")
            port = b.port
            b.kill()
            # the query goes on with a alone and drains it
            wait_for(lambda: set(from_a) <= set(sunk(spark, work)), "a's items", 300)
            assert query.isActive
            got = sunk(spark, work)
            assert len(got) == len(set(got)) and len(got) < 1200
            b.extra_args = ("--memcache-port", str(port))  # the same address again
            b.start()
            wait_for(lambda: len(sunk(spark, work)) >= 1200, "b's items after its restart", 300)
            query.processAllAvailable()
        finally:
            query.stop()
        assert query.exception() is None
        assert_exactly_once(sunk(spark, work), from_a + from_b)


def test_writer_round_trip_dataframe_to_queue_to_stream(
    spark: Any, servers: list[ServerProcess], work: Path, qname: str
) -> None:
    addresses = ",".join(s.address for s in servers)
    qa, qb = f"{qname}_a", f"{qname}_b"
    rows = [(f"row-{i}", qa if i % 3 else qb) for i in range(3000)]
    df = spark.createDataFrame(rows, "value string, queue string").repartition(2)
    df.write.format("tercel").option("servers", addresses).mode("append").save()
    # the queue option overrides the column; binary values go as they are
    binary = spark.createDataFrame([(b"\x00\xffbin",)], "value binary")
    binary.write.format("tercel").option("servers", addresses).option("queue", qb).mode(
        "append"
    ).save()
    with pytest.raises(Exception, match="use mode\\('append'\\)"):
        df.write.format("tercel").option("servers", addresses).mode("overwrite").save()
    # overwrite with flushOnOverwrite: the queue is emptied first, then written
    flushed = f"{qname}_flushed"
    with Client(addresses.split(",")) as c:
        c.put_many(flushed, [b"old"] * 3)
    spark.createDataFrame([("new",)], "value string").write.format("tercel").option(
        "servers", addresses
    ).option("queue", flushed).option("flushOnOverwrite", "true").mode("overwrite").save()
    with Client(addresses.split(",")) as c:
        assert [c.get(flushed) for _ in range(2)] == [b"new", None]
    with pytest.raises(Exception, match="unexpected column"):
        df.selectExpr("value", "queue", "1 as n").write.format("tercel").option(
            "servers", addresses
        ).mode("append").save()

    out = work / qa
    stream = source(spark, addresses.split(","), qa, out / "stage")
    query = to_parquet(stream, out, available_now=True)
    query.awaitTermination(300)
    assert query.exception() is None
    assert_exactly_once(sunk(spark, out), [v.encode() for v, q in rows if q == qa])
    with Client(addresses.split(",")) as c:
        got = [c.get(qb) for _ in range(1002)]
    expected = [v.encode() for v, q in rows if q == qb] + [b"\x00\xffbin"]
    assert sorted(g for g in got if g is not None) == sorted(expected)


def test_stream_writer_into_a_queue(
    spark: Any, servers: list[ServerProcess], work: Path, qname: str
) -> None:
    produced = produce(servers[0], qname, 100)
    out_queue = f"{qname}_out"
    df = source(spark, [servers[0].address], qname, work / "stage")
    query = (
        df.selectExpr("upper(cast(value as string)) as value")
        .writeStream.format("tercel")
        .option("servers", servers[1].address)
        .option("queue", out_queue)
        .option("checkpointLocation", str(work / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None
    with Client(servers[1].address) as c:
        got = [c.get(out_queue) for _ in range(101)]
    assert sorted(g for g in got if g is not None) == sorted(p.upper() for p in produced)


def test_journal_reader_on_a_journal_with_known_contents(spark: Any, work: Path) -> None:
    data = work / "data"
    with ServerProcess(data) as srv, Client(srv.address) as c:
        c.put_many("jq", [b"a", b"bb", b"ccc"])
        c.put("other", b"zz")
        assert c.get("jq") == b"a"  # REMOVE
        r = c.reserve("jq")  # OPEN 1
        assert r is not None and r.data == b"bb"
        r.confirm()  # CONFIRM 1
        r = c.reserve("jq")  # OPEN 2
        assert r is not None
        r.abort()  # RETURN 2 (journal version 3; ABORT in versions 1-2)
        srv.stop()
    with open(data / "jq", "ab") as f:
        f.write(b"\x30\x00\x00\x00torn")  # a torn tail: ignored by default

    df = spark.read.format("tercel-journal").option("queues", "jq").load(str(data))
    rows = df.orderBy("offset").collect()
    assert [(r.op, r.item_id, r.xid, r.payload) for r in rows] == [
        ("ADD", 1, None, b"a"),
        ("ADD", 2, None, b"bb"),
        ("ADD", 3, None, b"ccc"),
        ("REMOVE", None, None, None),
        ("OPEN", None, 1, None),
        ("CONFIRM", None, 1, None),
        ("OPEN", None, 2, None),
        ("RETURN", None, 2, None),
    ]
    assert {(r.queue, r.file, r.file_seq) for r in rows} == {("jq", "jq", 1)}
    assert rows[0].offset == 8 and rows[1].offset == rows[0].offset + rows[0].size
    assert rows[0].size == 33 + 1 and rows[0].expiry is None and rows[0].add_time is not None

    everything = spark.read.format("tercel-journal").load(str(data))
    counts = {
        (r.queue, r.op): r["count"] for r in everything.groupBy("queue", "op").count().collect()
    }
    assert counts[("other", "ADD")] == 1 and counts[("jq", "ADD")] == 3
    strict = spark.read.format("tercel-journal").option("ignoreCorruptTail", "false")
    with pytest.raises(Exception, match="jq"):
        strict.load(str(data)).collect()
    (work / "empty").mkdir()
    assert spark.read.format("tercel-journal").load(str(work / "empty")).count() == 0
    none = spark.read.format("tercel-journal").option("queues", "no_such_queue")
    assert none.load(str(data)).collect() == []


def test_journal_reader_on_a_killed_servers_fsynced_journal(spark: Any, work: Path) -> None:
    data = work / "killed"
    with ServerProcess(data, "[queues]\nsync_journal = true\n") as srv:
        with Client(srv.address) as c:
            for item in (b"a", b"bb", b"ccc"):
                c.put("sq", item)
        srv.kill()  # the file still ends in the zeros written ahead of its records
        assert (data / "sq").stat().st_size > 64 << 10
        strict = spark.read.format("tercel-journal").option("ignoreCorruptTail", "false")
        rows = strict.load(str(data)).orderBy("offset").collect()
    assert [(r.op, r.payload) for r in rows] == [("ADD", b"a"), ("ADD", b"bb"), ("ADD", b"ccc")]


def test_a_failed_batch_replays_with_its_real_row_count_and_lag_is_reported(
    spark: Any, servers: list[ServerProcess], work: Path, qname: str
) -> None:
    """The sink fails batch 1 after the offsets were logged; the restarted query replays it
    from staging (same rows, real numInputRows). Progress carries the lag and the metrics."""
    produced = produce(servers[0], qname, 50)
    out = work / "out"

    def write(fail_batch: int | None) -> Callable[[Any, int], None]:
        def sink(df: Any, batch_id: int) -> None:  # idempotent by batch id, like a file sink
            df.write.mode("overwrite").parquet(str(out / f"batch={batch_id}"))
            if batch_id == fail_batch:
                raise RuntimeError("sink failure")

        return sink

    def run(fail_batch: int | None) -> Any:
        df = source(spark, [servers[0].address], qname, work / "stage", maxItemsPerTrigger=20)
        writer = df.writeStream.foreachBatch(write(fail_batch)).option(
            "checkpointLocation", str(work / "ck")
        )
        if fail_batch is None:
            return writer.trigger(availableNow=True).start()
        return writer.trigger(processingTime="0 seconds").start()

    query = run(fail_batch=1)
    with pytest.raises(Exception, match="sink failure"):
        query.awaitTermination(300)
    query = run(fail_batch=None)
    query.awaitTermination(300)
    assert query.exception() is None
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    assert [(p["batchId"], p["numInputRows"]) for p in progress] == [(1, 20), (2, 10)]
    got = [bytes(r.value) for r in spark.read.parquet(str(out)).select("value").collect()]
    assert_exactly_once(got, produced)
    reported = json.loads(progress[-1]["sources"][0]["latestOffset"])
    assert reported["lag"] == 0 and reported["queued"] == {servers[0].address: {qname: 0}}
    metrics = reported["metrics"]  # this run's fetcher: the first run may have staged all
    assert metrics["staged"] == metrics["acked"] and metrics["suspects"] == 0
