"""A streaming pipeline on tercel and Spark: JSON events in a queue -> parse -> running totals
per kind -> the totals into another queue and into Parquet.

Run it with ``make example`` (or ``python examples/pipeline.py [--events N] [--work DIR]``).
It starts two tercel servers on free loopback ports, produces the events into queue
``events`` on both, runs the query with ``Trigger.AvailableNow`` (drain what is there, then
stop), and prints what reached the ``event_totals`` queue and the Parquet table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tercel.client import Client
from tercel.spark import local_session
from tercel.testing import ServerProcess

KINDS = ("click", "view", "buy", "share")
EVENT_SCHEMA = "user string, kind string, amount double, ts timestamp"


def produce(addresses: list[str], n: int) -> None:
    """``n`` JSON events, spread over the servers (as any tercel producer would)."""
    rng = random.Random(7)
    with Client(addresses) as client:
        for start in range(0, n, 1000):
            batch = [
                json.dumps(
                    {
                        "user": f"u{rng.randrange(100)}",
                        "kind": rng.choice(KINDS),
                        "amount": round(rng.uniform(0, 50), 2),
                        "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    }
                ).encode()
                for _ in range(min(1000, n - start))
            ]
            client.put_many("events", batch)


def build(spark: SparkSession, servers: str, work: Path) -> DataFrame:
    """events queue -> parsed JSON -> running totals per kind (a stateful aggregation)."""
    events = (
        spark.readStream.format("tercel")
        .option("servers", servers)
        .option("queue", "events")
        .option("maxItemsPerTrigger", "5000")
        .load()
    )
    parsed = events.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"))
    return parsed.groupBy("e.kind").agg(
        F.count("*").alias("events"),
        F.round(F.sum("e.amount"), 2).alias("amount"),
        F.approx_count_distinct("e.user").alias("users"),
    )


def sink(servers: str, work: Path) -> Any:
    """Each micro-batch's updated totals go to the ``event_totals`` queue and to Parquet."""

    def write(batch: DataFrame, batch_id: int) -> None:
        batch = batch.withColumn("batch_id", F.lit(batch_id)).cache()
        batch.select(F.to_json(F.struct("*")).alias("value")).write.format("tercel").option(
            "servers", servers
        ).option("queue", "event_totals").mode("append").save()
        batch.write.mode("append").parquet(str(work / "totals.parquet"))
        batch.unpersist()

    return write


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--work", type=Path, default=None, help="scratch dir (default: a temp dir)")
    args = parser.parse_args()
    work: Path = args.work or Path(tempfile.mkdtemp(prefix="tercel-example-"))

    with ServerProcess(work / "server1") as s1, ServerProcess(work / "server2") as s2:
        servers = f"{s1.address},{s2.address}"
        produce([s1.address, s2.address], args.events)
        print(f"produced {args.events} events into 'events' on {servers}")

        spark = local_session("tercel-pipeline")  # local[2], formats registered

        started = time.monotonic()
        query = (
            build(spark, servers, work)
            .writeStream.outputMode("update")
            .foreachBatch(sink(servers, work))
            .option("checkpointLocation", str(work / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        rows = sum(p["numInputRows"] for p in query.recentProgress)
        print(f"streamed {rows} events in {time.monotonic() - started:.1f}s")

        with Client([s1.address, s2.address]) as client:
            messages = []
            while (item := client.get("event_totals")) is not None:
                messages.append(json.loads(item))
        print(f"{len(messages)} update(s) in queue 'event_totals', e.g. {messages[-1]}")
        latest = spark.read.parquet(str(work / "totals.parquet"))
        print("latest totals in Parquet:")
        latest.groupBy("kind").agg(
            F.max_by(F.struct("events", "amount", "users"), "batch_id").alias("t")
        ).select("kind", "t.*").orderBy("kind").show()
        spark.stop()
    print(f"work directory: {work}")


if __name__ == "__main__":
    main()
