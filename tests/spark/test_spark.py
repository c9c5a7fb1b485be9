"""The connector against a real local[2] SparkSession and real tercel servers.

All Spark tests live in this one module so they share one session (conftest.py). Every
exactly-once check reads the Parquet file sink, which only shows committed batches.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tercel.client import Client
from tercel.testing import ServerProcess

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


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


def source(spark: Any, addresses: list[str], queue: str, **opts: object) -> Any:
    reader = (
        spark.readStream.format("tercel")
        .option("servers", ",".join(addresses))
        .option("queue", queue)
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


def assert_exactly_once(got: list[bytes], produced: list[bytes]) -> None:
    assert len(got) == len(set(got)), f"{len(got) - len(set(got))} duplicate(s)"
    missing = set(produced) - set(got)
    assert not missing, f"{len(missing)} item(s) lost, e.g. {sorted(missing)[:3]}"
    assert len(got) == len(produced)


def test_available_now_from_two_servers_exactly_once_then_nothing(
    spark: Any, servers: list[ServerProcess], work: Path, qname: str
) -> None:
    """Trigger.AvailableNow in batches of maxItemsPerTrigger (split over the servers); a
    second run on the same checkpoint finds nothing, and so does a new query."""
    a, b = servers
    produced = produce(a, qname, 150) + produce(b, qname, 100)
    df = source(spark, [a.address, b.address], qname, maxItemsPerTrigger=100)
    query = to_parquet(df, work, available_now=True)
    assert query.awaitTermination(300)
    assert query.exception() is None
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert batches == [100, 100, 50]
    assert_exactly_once(sunk(spark, work), produced)
    rows = spark.read.parquet(str(work / "out")).orderBy("seq").collect()
    assert len({r.seq for r in rows}) == 250
    assert {r.server for r in rows} == {a.address, b.address}
    assert sorted(r.item_id for r in rows if r.server == b.address) == list(range(1, 101))
    assert all(r.deliveries == 1 and r.queue == qname for r in rows)
    assert all(r.enqueued_at is not None and r.fetched_at >= r.enqueued_at for r in rows)
    for server in servers:  # the last batch was acked: nothing comes back
        with Client(server.address) as c:
            assert c.get(qname) is None

    query = to_parquet(source(spark, [a.address, b.address], qname), work, available_now=True)
    assert query.awaitTermination(300) and query.exception() is None
    assert sum(p["numInputRows"] for p in query.recentProgress) == 0
    assert_exactly_once(sunk(spark, work), produced)


def test_stop_after_a_batch_and_restart_on_the_checkpoint_exactly_once(
    spark: Any, servers: list[ServerProcess], work: Path, qname: str
) -> None:
    produced = produce(servers[0], qname, 1500) + produce(servers[1], qname, 1500)
    addresses = [s.address for s in servers]
    query = to_parquet(source(spark, addresses, qname, maxItemsPerTrigger=200), work)
    wait_for(lambda: rows_seen(query) >= 200, "a batch")
    query.stop()  # may stop after planning the next batch, before Spark logged it
    assert max(p["numInputRows"] for p in query.recentProgress) <= 200
    assert 0 < len(sunk(spark, work)) < len(produced)  # stopped mid-stream

    # the same options: a batch planned before the stop is planned again with the same keys
    df = source(spark, addresses, qname, maxItemsPerTrigger=200)
    query = to_parquet(df, work, available_now=True)
    query.awaitTermination(300)
    assert query.exception() is None
    assert_exactly_once(sunk(spark, work), produced)


def test_an_old_checkpoint_is_refused(
    spark: Any, servers: list[ServerProcess], work: Path, qname: str
) -> None:
    """A checkpoint whose offsets have the staging design's shape stops the query with the
    message saying what to do."""
    produce(servers[0], qname, 5)
    query = to_parquet(source(spark, [servers[0].address], qname), work, available_now=True)
    assert query.awaitTermination(300) and query.exception() is None
    log = work / "ck" / "offsets" / "0"
    lines = log.read_text().splitlines()
    lines[-1] = json.dumps({"seq": 5})  # the staging design's offset
    log.write_text("\n".join(lines))
    for stale in ("offsets/.0.crc", "commits/0", "commits/.0.crc"):  # Spark replays batch 0
        (work / "ck" / stale).unlink()
    produce(servers[0], qname, 1)
    query = to_parquet(source(spark, [servers[0].address], qname), work, available_now=True)
    with pytest.raises(Exception, match="staging connector"):
        query.awaitTermination(300)


def test_a_server_killed_mid_stream_and_restarted(spark: Any, work: Path, qname: str) -> None:
    """Reads of a batch wait for its server (up to maxUnavailableMs); plans leave it out
    while it is down; its keyed leases survive its restart."""
    with ServerProcess(work / "a") as a, ServerProcess(work / "b") as b:
        from_a = produce(a, qname, 600)
        from_b = produce(b, qname, 600)
        df = source(spark, [a.address, b.address], qname, maxItemsPerTrigger=100, serverRetryMs=200)
        query = to_parquet(df, work)
        try:
            wait_for(lambda: rows_seen(query) >= 200, "two batches")
            port = b.port
            b.kill()
            time.sleep(1)
            assert query.isActive
            b.extra_args = ("--memcache-port", str(port))  # the same address again
            b.start()
            wait_for(lambda: len(sunk(spark, work)) >= 1200, "every item", 300)
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
    stream = source(spark, addresses.split(","), qa)
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
    df = source(spark, [servers[0].address], qname)
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
    from the servers (same rows, real numInputRows). Progress carries the lag and the
    counters."""
    produced = produce(servers[0], qname, 50)
    out = work / "out"

    def write(fail_batch: int | None) -> Callable[[Any, int], None]:
        def sink(df: Any, batch_id: int) -> None:  # idempotent by batch id, like a file sink
            df.write.mode("overwrite").parquet(str(out / f"batch={batch_id}"))
            if batch_id == fail_batch:
                raise RuntimeError("sink failure")

        return sink

    def run(fail_batch: int | None) -> Any:
        df = source(spark, [servers[0].address], qname, maxItemsPerTrigger=20)
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
    assert reported["metrics"]["unacked"] == 0
