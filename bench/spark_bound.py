"""What bounds the Spark source against the JSON file source: the same JSON events into
Parquet by five streaming queries (``Trigger.AvailableNow``, ``local[2]``), run in turn each
round after a warm-up of each, so that all see the same machine:

- ``files``: JSON-lines files, ``readStream.format("json")`` (the goal's baseline);
- ``value_parquet``: the same events already in Spark as the ``value`` (binary) column of
  Parquet files, ``from_json(cast(value as string))``: the JSON parse and Parquet write that
  the tercel path does too, without any source cost: the floor;
- ``python_value``: a minimal Python data source (defined here) yielding only ``value`` from
  staging segments written beforehand, then ``from_json``: the least any design through the
  Python Data Source API can pay (Arrow from a Python worker into the JVM, one column);
- ``staged``: the ``tercel`` source itself on staging segments written beforehand, its servers
  stopped (nothing to lease: its own read of the nine columns, its offsets and slices, no
  fetch), then ``from_json``;
- ``tercel``: the ``tercel`` source with default options on two servers holding the events
  (``bench/spark_bench.py``'s run).

    .venv/bin/python bench/spark_bound.py [--items 400000] [--size 200] [--rounds 3]
        [--kinds files,value_parquet,python_value,staged,tercel] [--also OPT=V[,OPT=V] ...]

For each run: items/s, and the CPU seconds per item of the whole process tree (exact), split
by role (the Spark JVM, the Python workers of the executors, the source's driver-side Python
process, the tercel servers, this process) by polling /proc (``cpu_split.py``), and the cores
it kept busy (CPU seconds / wall seconds). With ``c`` cores a query cannot run faster than
``c / CPU per item``; so tercel / files is at most ``c * files CPU per item / (tercel CPU per
item * files' cores busy)``, printed as ``bound_over_files``. Prints one JSON object and a
markdown table on stderr. Timings exclude the JVM start and the time to prepare the data.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from cpu_split import CpuSplit
from procstat import tree_and_kernel_seconds
from spark_bench import (
    EVENT_SCHEMA,
    add_common_args,
    events,
    fill_queues,
    into_parquet,
    note,
    stage_events,
    tercel_stream,
    write_files,
)
from tercel.spark import local_session
from tercel.spark._staging import StagingLog
from tercel.testing import ServerProcess

PARSE = f"from_json(cast(value as string), '{EVENT_SCHEMA}') as e"


def role(pid: int, cmdline: list[str]) -> str:
    """The role of a process of the benchmark's tree, from its command line."""
    line = " ".join(cmdline)
    if cmdline and cmdline[0].endswith("java"):
        return "jvm"
    if "tercel serve" in line:
        return "servers"
    if "python_streaming_source_runner" in line:
        return "source_driver"
    if "pyspark" in line:
        return "python_workers"
    return "other"


def timed(
    spark: Any, df: Any, work: Path, n: int, split_roles: Callable[[int, list[str]], str] = role
) -> dict[str, Any]:
    """Run ``df`` into Parquet (AvailableNow) and measure: wall, CPU of the tree (exact) and
    by role, rows checked against ``n``."""
    split = CpuSplit(os.getpid(), split_roles)
    wall, cpu = time.perf_counter(), tree_and_kernel_seconds(os.getpid())[0]
    query = into_parquet(df, work)
    query.awaitTermination()
    wall = time.perf_counter() - wall
    cpu = tree_and_kernel_seconds(os.getpid())[0] - cpu
    by_role = split.stop()
    assert query.exception() is None, query.exception()
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    assert sum(p["numInputRows"] for p in progress) == n
    assert spark.read.parquet(str(work / "out")).select("id").distinct().count() == n
    us = {k: round(v / n * 1e6, 2) for k, v in sorted(by_role.items())}
    us["unattributed"] = round((cpu - sum(by_role.values())) / n * 1e6, 2)
    return {
        "seconds": round(wall, 2),
        "items_per_s": round(n / wall),
        "cpu_us_per_item": round(cpu / n * 1e6, 2),
        "cores_busy": round(cpu / wall, 2),
        "cpu_us_per_item_by_role": us,
        "batches": len(progress),
        "load": round(os.getloadavg()[0], 2),
    }


class ValueSource:
    """``format("bench-staged-value")``: a streaming Python data source over staging segments
    written beforehand, yielding only their ``value`` column, in as many slices per batch as
    the tercel source cuts (Spark's default parallelism); with option ``parse`` the events
    parsed by pyarrow's JSON reader in the Python worker instead (EVENT_SCHEMA's columns), so
    that Spark only writes them. Defined in the script, so Spark pickles it by value."""

    @staticmethod
    def make(parallelism: int) -> Any:
        from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
        from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
        from pyspark.sql.types import (
            BinaryType,
            DoubleType,
            LongType,
            StringType,
            StructField,
            StructType,
        )

        from tercel.spark._staging import read_slice

        value_schema = StructType([StructField("value", BinaryType())])
        columns = [  # EVENT_SCHEMA
            ("id", LongType(), pa.int64()),
            ("user", StringType(), pa.string()),
            ("kind", StringType(), pa.string()),
            ("ts", LongType(), pa.int64()),
            ("amount", DoubleType(), pa.float64()),
            ("note", StringType(), pa.string()),
        ]
        event_schema = StructType([StructField(name, typ) for name, typ, _ in columns])
        event_arrow = pa.schema([(name, typ) for name, _, typ in columns])

        def parsed(values: pa.Array) -> Any:
            """``values`` (one JSON object each) as record batches of EVENT_SCHEMA."""
            import pyarrow.compute as pc
            import pyarrow.json as pj

            lines = pc.binary_join_element_wise(values, b"", b"\n")  # each value + newline
            data = lines.buffers()[2].slice(0, pc.sum(pc.binary_length(lines)).as_py())
            options = pj.ParseOptions(explicit_schema=event_arrow)
            return pj.read_json(pa.BufferReader(data), parse_options=options).to_batches()

        class Reader(DataSourceStreamReader, SupportsTriggerAvailableNow):
            def __init__(self, root: str, parse: bool) -> None:
                self.root = root
                self.parse = parse

            def initialOffset(self) -> dict[str, int]:
                return {"seq": StagingLog(self.root).lowest_start()}

            def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
                log = StagingLog(self.root)
                return {"seq": log.end_from(log.lowest_start())}

            def prepareForTriggerAvailableNow(self) -> None:
                pass

            def partitions(self, start: dict[str, int], end: dict[str, int]) -> Any:
                lo, hi = start["seq"], end["seq"]
                rows = max(1000, -(-(hi - lo) // parallelism))
                return [InputPartition(p) for p in StagingLog(self.root).slices(lo, hi, rows, True)]

            def read(self, partition: InputPartition) -> Any:
                for batch in read_slice(partition.value):
                    if self.parse:
                        yield from parsed(batch.column("value"))
                    else:
                        yield pa.RecordBatch.from_arrays([batch.column("value")], names=["value"])

            def commit(self, end: dict[str, int]) -> None:
                pass

        class Source(DataSource):
            @classmethod
            def name(cls) -> str:
                return "bench-staged-value"

            def schema(self) -> Any:
                return event_schema if self.options.get("parse") else value_schema

            def streamReader(self, schema: Any) -> Any:
                return Reader(self.options["path"], bool(self.options.get("parse")))

        return Source


def run(
    spark: Any, kind: str, work: Path, n: int, size: int, *, options: dict[str, str] | None = None
) -> dict[str, Any]:
    """Prepare the data for ``kind`` (untimed), then :func:`timed` its query; ``options``
    are given to the tercel source (kinds ``staged`` and ``tercel``)."""
    work.mkdir(parents=True)
    options = options or {}
    if kind == "files":
        write_files(work / "json", n, size, files=8)
        df = spark.readStream.schema(EVENT_SCHEMA).format("json").load(str(work / "json"))
        return timed(spark, df, work, n)
    if kind == "value_parquet":
        (work / "pq").mkdir()
        per = -(-n // 8)
        for f in range(8):
            lo = f * per
            values = pa.array(events(lo, min(per, n - lo), size), pa.binary())
            pq.write_table(pa.table({"value": values}), work / "pq" / f"part-{f}.parquet")
        df = spark.readStream.schema("value binary").parquet(str(work / "pq"))
        return timed(spark, df.selectExpr(PARSE).select("e.*"), work, n)
    if kind == "python_value":
        root, _ = stage_events(work, n, size)
        df = spark.readStream.format("bench-staged-value").load(root)
        return timed(spark, df.selectExpr(PARSE).select("e.*"), work, n)
    if kind == "python_parsed":
        root, _ = stage_events(work, n, size)
        df = spark.readStream.format("bench-staged-value").option("parse", "true").load(root)
        return timed(spark, df, work, n)
    if kind == "staged":
        root, addresses = stage_events(work, n, size)
        df = (
            spark.readStream.format("tercel")
            .option("servers", addresses)
            .option("queue", "events")
            .option("stagingLocation", root)
            .option("connectTimeoutMs", "200")
            .options(**options)
            .load()
        )
        return timed(spark, df.selectExpr(PARSE).select("e.*"), work, n)
    assert kind == "tercel"
    with ServerProcess(work / "s1") as a, ServerProcess(work / "s2") as b:
        fill_queues([a, b], "events", n, size)
        df = tercel_stream(spark, f"{a.address},{b.address}", work, options)
        return timed(spark, df, work, n)


KINDS = ("files", "value_parquet", "python_value", "python_parsed", "staged", "tercel")


def table(runs: dict[str, list[dict[str, Any]]]) -> str:
    """The runs as a markdown table, one row per kind and round."""
    roles = ("jvm", "python_workers", "source_driver", "servers", "root", "unattributed")
    head = "| round | query | items/s | / files | CPU µs/item | cores busy | " + " | ".join(roles)
    lines = [head + " | batches | load |", "|" + "---|" * (len(roles) + 8)]
    for r, files in enumerate(runs["files"]):
        for kind in runs:
            got = runs[kind][r]
            by = got["cpu_us_per_item_by_role"]
            cells = [
                str(r + 1),
                kind,
                f"{got['items_per_s']:,}",
                f"{got['items_per_s'] / files['items_per_s']:.2f}",
                f"{got['cpu_us_per_item']:.1f}",
                f"{got['cores_busy']:.2f}",
                *(f"{by.get(k, 0.0):.2f}" for k in roles),
                str(got["batches"]),
                f"{got['load']:.2f}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(
        parser, 3, "also run kinds staged and tercel with these source options (repeatable)"
    )
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help="the queries to run (files always runs)"
    )
    args = parser.parse_args()
    variants: dict[str, tuple[str, dict[str, str]]] = {"files": ("files", {})}
    for kind in args.kinds.split(","):
        assert kind in KINDS, f"unknown kind {kind}"
        variants[kind] = (kind, {})
    for spec in args.also:
        for kind in ("staged", "tercel"):
            if kind in variants:
                variants[f"{kind} {spec}"] = (
                    kind,
                    dict(kv.split("=", 1) for kv in spec.split(",")),
                )
    work = Path(tempfile.mkdtemp(prefix="tercel-spark-bound-"))
    spark = local_session("tercel-bound")
    parallelism = spark.sparkContext.defaultParallelism
    spark.dataSource.register(ValueSource.make(parallelism))
    result: dict[str, Any] = {
        "items": args.items,
        "size": len(events(0, 1, args.size)[0]),
        "cores": os.cpu_count(),
        "spark_default_parallelism": parallelism,
        "load_before": os.getloadavg()[0],
    }
    for k, (kind, options) in enumerate(variants.values()):
        run(spark, kind, work / f"warm-{k}", 5000, args.size, options=options)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    for r in range(args.rounds):
        for k, (name, (kind, options)) in enumerate(variants.items()):
            runs[name].append(
                run(spark, kind, work / f"{r}-{k}", args.items, args.size, options=options)
            )
            note(name, runs[name][-1])
    cores = os.cpu_count() or 1
    result["runs"] = runs
    for kind, got in runs.items():
        result[f"{kind}_over_files"] = [
            round(t["items_per_s"] / f["items_per_s"], 2)
            for f, t in zip(runs["files"], got, strict=True)
        ]
        result[f"{kind}_bound_over_files"] = [
            round(cores * f["cpu_us_per_item"] / (t["cpu_us_per_item"] * f["cores_busy"]), 2)
            for f, t in zip(runs["files"], got, strict=True)
        ]
        result[f"{kind}_cpu_us_per_item_median"] = statistics.median(
            t["cpu_us_per_item"] for t in got
        )
    result["load_after"] = os.getloadavg()[0]
    spark.stop()
    shutil.rmtree(work)  # GBs of events, staging and Parquet
    print(table(runs), file=sys.stderr)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
