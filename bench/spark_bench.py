"""Spark connector throughput: items/s from two tercel servers into a Parquet sink with
local[2], the sink's rows/s into the queues, and the driver-side fetch alone (no Spark).

    .venv/bin/python bench/spark_bench.py [--items 200000] [--size 100] [--per-trigger 50000]

Prints one JSON object. Each phase starts from full queues on fresh servers; the source runs
with Trigger.AvailableNow, so the time covers planning, leasing, staging (fsync), acking,
reading the staging log on executors and committing Parquet, but not the JVM start.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from tercel.client import Client
from tercel.spark import local_session
from tercel.spark._fetch import Fetcher
from tercel.spark._options import SourceOptions
from tercel.spark._staging import StagingLog
from tercel.testing import ServerProcess


def fill(servers: list[ServerProcess], queue: str, n: int, size: int) -> None:
    for k, srv in enumerate(servers):
        with Client(srv.address) as c:
            share = n // len(servers) + (k < n % len(servers))
            for start in range(0, share, 5000):
                count = min(5000, share - start)
                c.put_many(queue, [b"%08d" % (start + i) + b"x" * (size - 8) for i in range(count)])


def session() -> Any:
    return local_session("tercel-bench")


def bench_source(spark: Any, work: Path, n: int, size: int, per_trigger: int) -> dict[str, Any]:
    with ServerProcess(work / "s1") as a, ServerProcess(work / "s2") as b:
        fill([a, b], "bench", n, size)
        df = (
            spark.readStream.format("tercel")
            .option("servers", f"{a.address},{b.address}")
            .option("queue", "bench")
            .option("stagingLocation", str(work / "stage"))
            .option("maxItemsPerTrigger", str(per_trigger))
            .load()
        )
        started = time.perf_counter()
        query = (
            df.writeStream.format("parquet")
            .option("path", str(work / "out"))
            .option("checkpointLocation", str(work / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        elapsed = time.perf_counter() - started
        progress = [p for p in query.recentProgress if p["numInputRows"]]
        rows = sum(p["numInputRows"] for p in progress)
        assert rows == n, (rows, n)
        assert spark.read.parquet(str(work / "out")).count() == n
        return {
            "items": n,
            "seconds": round(elapsed, 2),
            "items_per_s": round(n / elapsed),
            "batches": len(progress),
            "latest_offset_ms": [p["durationMs"].get("latestOffset") for p in progress],
            "add_batch_ms": [p["durationMs"].get("addBatch") for p in progress],
        }


def bench_writer(spark: Any, work: Path, n: int, size: int) -> dict[str, Any]:
    with ServerProcess(work / "w1") as a, ServerProcess(work / "w2") as b:
        servers = f"{a.address},{b.address}"
        df = spark.range(n).selectExpr(
            f"cast(concat(lpad(cast(id as string), 8, '0'), repeat('x', {size - 8})) as binary)"
            " as value"
        )
        df = df.repartition(2).cache()
        df.count()  # materialise the input, so the timing is the writer's
        df.limit(1000).write.format("tercel").option("servers", servers).option(
            "queue", "warm"
        ).mode("append").save()
        started = time.perf_counter()
        df.write.format("tercel").option("servers", servers).option("queue", "out").mode(
            "append"
        ).save()
        elapsed = time.perf_counter() - started
        with Client([a.address, b.address]) as c:
            stored = sum(int(s["out"]["items"]) for s in c.queue_stats().values())
        assert stored == n, (stored, n)
        return {"rows": n, "seconds": round(elapsed, 2), "rows_per_s": round(n / elapsed)}


def bench_fetch(work: Path, n: int, size: int) -> dict[str, Any]:
    """The driver's lease -> stage (fsync) -> ack loop alone, as latestOffset runs it."""
    with ServerProcess(work / "f1") as a, ServerProcess(work / "f2") as b:
        fill([a, b], "bench", n, size)
        opts = SourceOptions.parse(
            {
                "servers": f"{a.address},{b.address}",
                "queue": "bench",
                "stagingLocation": str(work / "fstage"),
            }
        )
        log = StagingLog(opts.staging)
        log.ensure()
        fetcher = Fetcher(opts, log)
        started = time.perf_counter()
        pos = 0
        while pos < n:
            pos, _ = fetcher.fetch(pos, 50_000, wait_first=False)
        elapsed = time.perf_counter() - started
        fetcher.close()
        return {"items": pos, "seconds": round(elapsed, 2), "items_per_s": round(pos / elapsed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100, help="payload bytes (>= 8)")
    parser.add_argument("--per-trigger", type=int, default=50_000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tercel-spark-bench-"))
    result: dict[str, Any] = {"items": args.items, "size": args.size, "cores": os.cpu_count()}
    result["fetch_only"] = bench_fetch(work, args.items, args.size)
    spark = session()
    bench_source(spark, work / "warm", 5000, args.size, 5000)  # JIT, workers, first job
    result["source_to_parquet"] = bench_source(
        spark, work / "run", args.items, args.size, args.per_trigger
    )
    result["writer"] = bench_writer(spark, work, args.items, args.size)
    spark.stop()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
