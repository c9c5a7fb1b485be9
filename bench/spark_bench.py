"""Spark connector throughput with its default options, against the JSON file source in the
same run: the same JSON events (``--size`` bytes each) either landed as JSON-lines files and
read with ``readStream.format("json")``, or queued on two tercel servers and read with
``readStream.format("tercel")`` (parsed with ``from_json``); both into Parquet with
``Trigger.AvailableNow`` on ``local[2]``. Runs alternate (file, tercel, file, tercel, ...)
after a warm-up of each, so both see the same machine load.

    .venv/bin/python bench/spark_bench.py [--items 400000] [--size 200] [--rounds 2]
        [--old] [--also maxItemsPerFetch=100000 ...] [--skip-writer] [--skip-source]
        [--spark-side]

Each run also reports the CPU seconds per item of the whole process tree (the Spark JVM, its
Python workers and the tercel servers are all children of the benchmark): on a host whose
cores are all busy, the ratio of those bounds the ratio of the throughputs. ``--spark-side``
adds batch jobs that read the same events into Parquet from the JSON files and from staging
segments written beforehand (no server, fetch or streaming engine): Spark's own cost of the
Python data source path against its JSON reader.

Also: the sink (``df.write.format("tercel")``) with its default ``batchSize`` against
``batchSize=500`` (the old default), alternated; and the time from ``start()`` to the first
committed batch of a query restarted on a checkpoint with a backlog. Prints one JSON object.
Timings exclude the JVM start and the time to fill queues or write files.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from procstat import tree_and_kernel_seconds
from tercel.client import Client
from tercel.spark import local_session
from tercel.testing import ServerProcess

EVENT_SCHEMA = "id bigint, user string, kind string, ts bigint, amount double, note string"


def events(start: int, n: int, size: int) -> list[bytes]:
    """``n`` JSON events of about ``size`` bytes (the note pads them)."""
    out = []
    for i in range(start, start + n):
        head = (
            f'{{"id":{i},"user":"u{i % 9973:05d}","kind":"{("click", "view", "buy")[i % 3]}",'
            f'"ts":{1_717_000_000_000 + i},"amount":{(i % 1000) / 10},"note":"'
        )
        out.append((head + "x" * max(0, size - len(head) - 2) + '"}').encode())
    return out


def fill_queues(servers: list[ServerProcess], queue: str, n: int, size: int) -> None:
    for k, srv in enumerate(servers):
        lo, hi = k * n // len(servers), (k + 1) * n // len(servers)
        with Client(srv.address) as c:
            for start in range(lo, hi, 5000):
                c.put_many(queue, events(start, min(5000, hi - start), size))


def write_files(directory: Path, n: int, size: int, files: int) -> None:
    directory.mkdir(parents=True)
    per = -(-n // files)
    for f in range(files):
        lo, hi = f * per, min(n, (f + 1) * per)
        with open(directory / f"events-{f:03d}.json", "wb") as out:
            for lo2 in range(lo, hi, 10_000):
                out.write(b"\n".join(events(lo2, min(10_000, hi - lo2), size)) + b"\n")


def _now() -> tuple[float, float]:
    """(wall clock, CPU seconds so far of this process's tree): the Spark JVM, its Python
    workers and the tercel servers are all children of the benchmark."""
    return time.perf_counter(), tree_and_kernel_seconds(os.getpid())[0]


def _finish(
    query: Any, started: tuple[float, float], n: int, spark: Any, out: Path
) -> dict[str, Any]:
    query.awaitTermination()
    now = _now()
    elapsed, cpu = now[0] - started[0], now[1] - started[1]
    assert query.exception() is None, query.exception()
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in progress)
    assert rows == n, (rows, n)
    assert spark.read.parquet(str(out)).select("id").distinct().count() == n
    return {
        "seconds": round(elapsed, 2),
        "items_per_s": round(n / elapsed),
        "cpu_us_per_item": round(cpu / n * 1e6, 1),
        "batches": len(progress),
        "rows": [p["numInputRows"] for p in progress],
        "latest_offset_ms": [p["durationMs"].get("latestOffset") for p in progress],
        "add_batch_ms": [p["durationMs"].get("addBatch") for p in progress],
        "load": round(os.getloadavg()[0], 2),
    }


def into_parquet(df: Any, work: Path) -> Any:
    """Start streaming ``df`` into Parquet under ``work/out`` (checkpoint ``work/ck``),
    ``Trigger.AvailableNow``; the query."""
    return (
        df.writeStream.format("parquet")
        .option("path", str(work / "out"))
        .option("checkpointLocation", str(work / "ck"))
        .trigger(availableNow=True)
        .start()
    )


def run_files(spark: Any, work: Path, n: int, size: int) -> dict[str, Any]:
    src = work / "json"
    write_files(src, n, size, files=8)
    df = spark.readStream.schema(EVENT_SCHEMA).format("json").load(str(src))
    started = _now()
    query = into_parquet(df, work)
    return _finish(query, started, n, spark, work / "out")


OLD_DEFAULTS = {
    "maxItemsPerTrigger": "10000",
    "leaseBatch": "1000",
    "itemsPerPartition": "10000",
    "prefetch": "false",
}
"""The source's defaults before issue 23 (``--old``: run them too, for comparison)."""


def tercel_stream(
    spark: Any, addresses: str, work: Path, options: dict[str, str] | None = None
) -> Any:
    """The tercel source (default options unless ``options``), parsed like the file source."""
    reader = (
        spark.readStream.format("tercel")
        .option("servers", addresses)
        .option("queue", "events")
        .option("stagingLocation", str(work / "stage"))
    )
    for key, value in (options or {}).items():
        reader = reader.option(key, value)
    return (
        reader.load()
        .selectExpr(f"from_json(cast(value as string), '{EVENT_SCHEMA}') as e")
        .select("e.*")
    )


def run_tercel(
    spark: Any, work: Path, n: int, size: int, options: dict[str, str] | None = None
) -> dict[str, Any]:
    with ServerProcess(work / "s1") as a, ServerProcess(work / "s2") as b:
        fill_queues([a, b], "events", n, size)
        df = tercel_stream(spark, f"{a.address},{b.address}", work, options)
        started = _now()
        query = into_parquet(df, work)
        return _finish(query, started, n, spark, work / "out")


def run_restart(spark: Any, work: Path, n: int, size: int) -> dict[str, Any]:
    """Time a query's first batch; stop it, queue ``n`` more items, and time a restart on the
    same checkpoint to its first batch."""
    with ServerProcess(work / "s1") as a, ServerProcess(work / "s2") as b:
        fill_queues([a, b], "events", n, size)
        addresses = f"{a.address},{b.address}"

        def start() -> Any:
            return (
                tercel_stream(spark, addresses, work)
                .writeStream.format("parquet")
                .option("path", str(work / "out"))
                .option("checkpointLocation", str(work / "ck"))
                .trigger(processingTime="0 seconds")
                .start()
            )

        def first_batch(query: Any) -> float:
            started = time.perf_counter()
            while not [p for p in query.recentProgress if p["numInputRows"]]:
                assert query.exception() is None, query.exception()
                assert time.perf_counter() - started < 600, "no batch in 600 s"
                time.sleep(0.05)
            return time.perf_counter() - started

        query = start()
        cold = first_batch(query)
        query.stop()
        fill_queues([a, b], "events", n, size)
        query = start()
        warm = first_batch(query)
        query.stop()
        return {"first_batch_s": round(cold, 2), "first_batch_after_restart_s": round(warm, 2)}


class StagedSource:
    """``format("tercel-staged")`` (``--spark-side``): a *batch* read of staging segments
    already written, cut into option ``parallelism`` slices as the tercel source cuts a batch
    (one partition per segment would use one core against the file source's two, since the
    fetch below stages all in one segment), each row as the tercel source
    yields it (``read_slice``). No server, no fetch, no streaming engine: what Spark pays for
    the Python data source path on its own. Defined in the script, so Spark pickles it by
    value."""

    @staticmethod
    def make() -> Any:
        from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

        from tercel.spark.source import SOURCE_STRUCT
        from tercel.spark.staging import Piece, StagingLog, read_slice

        class Reader(DataSourceReader):
            def __init__(self, root: str, parallelism: int) -> None:
                self.root = root
                self.parallelism = parallelism

            def partitions(self) -> list[InputPartition]:
                log = StagingLog(self.root)
                segments = log.segments()
                lo, hi = segments[0].start, segments[-1].end
                rows = max(1000, -(-(hi - lo) // self.parallelism))  # as source.partitions
                return [InputPartition(pieces) for pieces in log.slices(lo, hi, rows, True)]

            def read(self, partition: InputPartition) -> Any:
                pieces: list[Piece] = partition.value
                yield from read_slice(pieces)

        class Source(DataSource):
            @classmethod
            def name(cls) -> str:
                return "tercel-staged"

            def schema(self) -> Any:
                return SOURCE_STRUCT

            def reader(self, schema: Any) -> Any:
                return Reader(self.options["path"], int(self.options["parallelism"]))

        return Source


def stage_events(work: Path, n: int, size: int) -> tuple[str, str]:
    """Lease ``n`` events from two servers into ``work/stage`` with the source's own fetcher,
    then stop the servers; (the staging directory, the servers' addresses, now dead)."""
    from tercel.spark.fetch import Fetcher
    from tercel.spark.options import SourceOptions
    from tercel.spark.staging import StagingLog

    with ServerProcess(work / "s1") as a, ServerProcess(work / "s2") as b:
        fill_queues([a, b], "events", n, size)
        root = str(work / "stage")
        addresses = f"{a.address},{b.address}"
        opts = {"servers": addresses, "queue": "events", "stagingLocation": root}
        log = StagingLog(root)
        log.ensure()
        fetcher = Fetcher(SourceOptions.parse(opts), log)
        end = 0
        while end < n:
            end, _ = fetcher.fetch(end, n - end, False)
        fetcher.close()
    return root, addresses


def run_spark_side(spark: Any, work: Path, n: int, size: int) -> dict[str, Any]:
    """The same events read in one batch job into Parquet, from JSON files and from staged
    segments (``StagedSource``), alternated by the caller; wall time and CPU per item each."""
    write_files(work / "json", n, size, files=8)
    stage, _ = stage_events(work, n, size)
    out: dict[str, Any] = {}
    for name, reader in (
        ("files", spark.read.schema(EVENT_SCHEMA).format("json")),
        (
            "staged",
            spark.read.format("tercel-staged").option(
                "parallelism", str(spark.sparkContext.defaultParallelism)
            ),
        ),
    ):
        source = str(work / "json") if name == "files" else stage
        df = reader.load(source)
        if name == "staged":
            df = df.selectExpr(f"from_json(cast(value as string), '{EVENT_SCHEMA}') as e")
            df = df.select("e.*")
        started = _now()
        df.write.parquet(str(work / f"out-{name}"))
        now = _now()
        assert spark.read.parquet(str(work / f"out-{name}")).count() == n
        out[name] = {
            "partitions": df.rdd.getNumPartitions(),
            "seconds": round(now[0] - started[0], 2),
            "items_per_s": round(n / (now[0] - started[0])),
            "cpu_us_per_item": round((now[1] - started[1]) / n * 1e6, 1),
        }
    return out


def run_writer(spark: Any, df: Any, work: Path, n: int, batch_size: int | None) -> float:
    with ServerProcess(work / "w1") as a, ServerProcess(work / "w2") as b:
        writer = df.write.format("tercel").option("servers", f"{a.address},{b.address}")
        if batch_size is not None:
            writer = writer.option("batchSize", str(batch_size))
        started = time.perf_counter()
        writer.option("queue", "out").mode("append").save()
        elapsed = time.perf_counter() - started
        with Client([a.address, b.address]) as c:
            # A small run's rows may all go to one server: the other has no queue "out".
            stats = c.queue_stats().values()
            stored = sum(int(s["out"]["items"]) for s in stats if "out" in s)
        assert stored == n, (stored, n)
        return n / elapsed


def note(what: str, value: object) -> None:
    """Progress on stderr (the JSON result goes to stdout at the end)."""
    print(f"[{time.strftime('%H:%M:%S')}] {what}: {json.dumps(value)}", file=sys.stderr)


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values)),
        "min": round(min(values)),
        "max": round(max(values)),
    }


def source_runs(spark: Any, work: Path, args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Alternate file, tercel (defaults), and each variant: ``--old`` (tercel with the
    pre-issue-23 defaults) and every ``--also`` option set."""
    variants: dict[str, dict[str, str]] = {"tercel": {}}
    if args.old:
        variants["tercel_old"] = OLD_DEFAULTS
    for spec in args.also:
        variants[f"tercel {spec}"] = dict(kv.split("=", 1) for kv in spec.split(","))
    run_files(spark, work / "warm-files", 5000, args.size)
    run_tercel(spark, work / "warm-tercel", 5000, args.size)
    runs: dict[str, list[dict[str, Any]]] = {"files": [], **{name: [] for name in variants}}
    for r in range(args.rounds):
        runs["files"].append(run_files(spark, work / f"files{r}", args.items, args.size))
        note("files", runs["files"][-1])
        for k, (name, options) in enumerate(variants.items()):
            got = run_tercel(spark, work / f"tercel{r}-{k}", args.items, args.size, options)
            runs[name].append(got)
            note(name, got)
    result["runs"] = runs
    for name, values in runs.items():
        result[f"{name}_items_per_s"] = _summary([r["items_per_s"] for r in values])
        result[f"{name}_cpu_us_per_item"] = [r["cpu_us_per_item"] for r in values]
        result[f"{name}_over_files"] = [
            round(t["items_per_s"] / f["items_per_s"], 2)
            for f, t in zip(runs["files"], values, strict=True)
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=400_000)
    parser.add_argument("--size", type=int, default=200, help="event bytes (about)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="OPT=V[,OPT=V]",
        help="also run the tercel source with these options (repeatable)",
    )
    parser.add_argument("--skip-writer", action="store_true")
    parser.add_argument("--skip-source", action="store_true")
    parser.add_argument(
        "--spark-side",
        action="store_true",
        help="also: batch reads of JSON files and of already staged segments (no fetch)",
    )
    parser.add_argument("--old", action="store_true", help="also run the pre-issue-23 defaults")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tercel-spark-bench-"))
    result: dict[str, Any] = {
        "items": args.items,
        "size": len(events(0, 1, args.size)[0]),
        "cores": os.cpu_count(),
        "load_before": os.getloadavg()[0],
    }
    spark = local_session("tercel-bench")
    result["spark_default_parallelism"] = spark.sparkContext.defaultParallelism
    if not args.skip_source:
        source_runs(spark, work, args, result)
        result["restart"] = run_restart(
            spark, work / "restart", min(args.items, 100_000), args.size
        )
        note("restart", result["restart"])
    if args.spark_side:
        spark.dataSource.register(StagedSource.make())
        run_spark_side(spark, work / "side-warm", 5000, args.size)
        side = []
        for k in range(args.rounds):
            side.append(run_spark_side(spark, work / f"side{k}", args.items, args.size))
            note("spark side", side[-1])
        result["spark_side"] = side
    if not args.skip_writer:
        n = args.items // 2
        df = spark.range(n).selectExpr(
            f"cast(concat(lpad(cast(id as string), 8, '0'), repeat('x', {args.size - 8})) "
            "as binary) as value"
        )
        df = df.repartition(2).cache()
        df.count()
        rates: dict[str, list[float]] = {"default": [], "batchSize=500": []}
        for r in range(args.rounds):
            rates["batchSize=500"].append(run_writer(spark, df, work / f"w500-{r}", n, 500))
            rates["default"].append(run_writer(spark, df, work / f"wdef-{r}", n, None))
            note("writer", {k: round(v[-1]) for k, v in rates.items()})
        result["writer_rows_per_s"] = {k: _summary(v) for k, v in rates.items()}
    result["load_after"] = os.getloadavg()[0]
    spark.stop()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
