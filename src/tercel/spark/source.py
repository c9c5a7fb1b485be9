"""The ``tercel`` format: a streaming source (``readStream``) and a sink (``write`` and
``writeStream``, in :mod:`tercel.spark.sink`).

Where each piece runs (pyspark >= 4.2's Python Data Source API):

- :class:`TercelDataSource` and its ``schema``/``streamReader``/``writer`` run in driver-side
  Python workers; the reader and writer objects they return are pickled to executors.
- :class:`TercelStreamReader`'s ``initialOffset``, ``latestOffset``, ``partitions``,
  ``commit`` and ``prepareForTriggerAvailableNow`` run in one long-lived driver-side Python
  process per query run: it leases from the servers, stages and acks (:mod:`.fetch`).
- ``read`` runs on executors, on a pickled copy without any connection: it only reads the
  staging log slice named by its partition (:mod:`.staging`).

Delivery (docs/spark.md): effectively-once into a replayable sink; Spark offsets
``{"seq": n}`` are positions in the staging log, and ``commit`` only deletes staged segments.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tercel.spark.fetch import Fetcher
from tercel.spark.options import SinkOptions, SourceOptions
from tercel.spark.staging import Piece, StagingLog, read_slice

log = logging.getLogger(__name__)

SOURCE_SCHEMA = (
    "value binary, queue string, server string, seq bigint, item_id bigint, deliveries int, "
    "enqueued_at timestamp, fetched_at timestamp, expiry timestamp"
)
"""The source's columns (fixed): Kafka-style ``value``; ``queue`` and ``server`` the item came
from; ``seq`` its staging-log position (unique and increasing per query, like Kafka's
``offset``); ``item_id`` the server's per-queue id, stable across redeliveries and restarts;
``deliveries`` how often the server handed it out (> 1: redelivered); ``enqueued_at`` the
server's add time; ``fetched_at`` when the driver leased it; ``expiry`` the item's own expiry
(null: none)."""

SOURCE_STRUCT = StructType(
    [
        StructField("value", BinaryType()),
        StructField("queue", StringType()),
        StructField("server", StringType()),
        StructField("seq", LongType()),
        StructField("item_id", LongType()),
        StructField("deliveries", IntegerType()),
        StructField("enqueued_at", TimestampType()),
        StructField("fetched_at", TimestampType()),
        StructField("expiry", TimestampType()),
    ]
)
"""SOURCE_SCHEMA as a StructType (``StructType.fromDDL`` needs a JVM, which the Python
worker that plans the source does not have)."""


class StagedSlice(InputPartition):
    """One task's share of a micro-batch: pieces of staged segment files (picklable)."""

    def __init__(self, pieces: list[Piece]) -> None:
        super().__init__([(p.path, p.lo, p.hi) for p in pieces])
        self.pieces = pieces


class Prefetch:
    """The next batch's fetch, run in a thread of the driver-side source process while Spark
    runs the current batch (that process is otherwise idle then). Its items are staged and
    acked exactly like a fetch in ``latestOffset``; a crash during it is recovered the same
    way; ``latestOffset`` joins it before it looks at the staging log."""

    def __init__(self, fetcher: Fetcher, pos: int, want: int, budget: int | None) -> None:
        self.result: tuple[int, bool] = (0, False)
        self.error: BaseException | None = None
        self.thread = threading.Thread(
            target=self._run, args=(fetcher, pos, want, budget), name="tercel-prefetch"
        )
        self.thread.daemon = True
        self.thread.start()

    def _run(self, fetcher: Fetcher, pos: int, want: int, budget: int | None) -> None:
        try:
            end, drained = fetcher.fetch(pos, want, False, budget)
            self.result = (end - pos, drained)
        except BaseException as exc:  # re-raised by join, on the query's thread
            self.error = exc

    def join(self) -> tuple[int, bool]:
        """(items fetched, whether the queues were drained); raises the fetch's error."""
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.result


class TercelStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming source (see the module docstring for where each method runs)."""

    def __init__(self, opts: SourceOptions, parallelism: int = 2) -> None:
        self.opts = opts
        self.parallelism = max(1, parallelism)
        """Slices per batch when ``itemsPerPartition`` is not set (Spark's default
        parallelism, given by :func:`tercel.spark.register`)."""
        self.staging = StagingLog(opts.staging)
        self._fetcher: Fetcher | None = None
        self._budget: int | None = None
        """Trigger.AvailableNow: items still to fetch (the queue depth when it started)."""
        self._prefetch: Prefetch | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {
            "opts": self.opts,
            "parallelism": self.parallelism,
            "staging": self.staging,
            "_fetcher": None,
            "_budget": None,
            "_prefetch": None,
        }

    def _driver(self) -> Fetcher:
        """The fetcher, created on first use in this process (recovering a crashed run)."""
        if self._fetcher is None:
            self.staging.ensure()
            self.staging.bind(self.opts.identity(), self.opts.checkpoint)
            fetcher = Fetcher(self.opts, self.staging)
            recovered = fetcher.recover()
            if recovered:
                log.warning(
                    "tercel source: recovered %d staged item(s) of a crashed run in %s "
                    "(re-acked; %d suspect(s) will be dropped if redelivered)",
                    recovered,
                    self.staging.root,
                    len(fetcher.suspects),
                )
            self._fetcher = fetcher
        return self._fetcher

    def initialOffset(self) -> dict[str, int]:
        """Where a new query starts: the oldest staged position (so leftovers of an abandoned
        run are not lost), else 0. Pure, because Spark calls it twice."""
        return {"seq": self.staging.lowest_start()}

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxItemsPerTrigger`` when set; else everything available (the backlog, up to
        ``maxItemsPerFetch`` per batch)."""
        if self.opts.max_items_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.opts.max_items_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: fetch at most what the queue holds now, then stop."""
        self._join_prefetch()
        depth = self._driver().queue_depth()
        self._budget = sum(n for per_server in depth.values() for n in per_server.values())

    def _want(self, limit: ReadLimit) -> int:
        if isinstance(limit, ReadMaxRows):
            return int(limit.max_rows)
        if isinstance(limit, ReadAllAvailable) or self.opts.max_items_per_trigger is None:
            return self.opts.max_items_per_fetch
        return self.opts.max_items_per_trigger

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        """Plan the next batch: reuse what is staged beyond ``start`` (a prefetch, or an
        attempt Spark never logged), lease and stage more up to the limit, then start
        prefetching the next batch. ``start`` is durably committed by Spark, so older
        segments go."""
        first = int(start["seq"])
        fetcher = self._driver()
        self._join_prefetch()
        self.staging.gc(first)
        want = self._want(limit)
        end = self.staging.end_from(first)
        missing = want - (end - first)
        drained = False
        if missing > 0 and self._budget != 0:
            new_end, drained = fetcher.fetch(end, missing, end == first, self._budget)
            self._spend(new_end - end, drained)
            end = new_end
        batch_end = first + min(end - first, want)
        if self.opts.prefetch and not drained and self._budget != 0 and batch_end > first:
            staged_ahead = end - batch_end
            if staged_ahead < want:
                self._prefetch = Prefetch(fetcher, end, want - staged_ahead, self._budget)
        return {"seq": batch_end}

    def _spend(self, fetched: int, drained: bool) -> None:
        if self._budget is not None:
            self._budget = 0 if drained else max(0, self._budget - fetched)

    def _join_prefetch(self) -> None:
        """Wait for the prefetch in flight (re-raising its error) and account for it."""
        if self._prefetch is not None:
            prefetch, self._prefetch = self._prefetch, None
            fetched, drained = prefetch.join()
            self._spend(fetched, drained)

    def reportLatestOffset(self) -> dict[str, Any]:
        """Shown as the source's ``latestOffset`` in the query progress: the lag (items still
        queued, per server and queue, and in all) and the connector's own counters."""
        fetcher = self._driver()
        depth = fetcher.queue_depth()
        return {
            "lag": sum(n for per_server in depth.values() for n in per_server.values()),
            "queued": depth,
            "staged_end": self.staging.end_from(self.staging.lowest_start()),
            "metrics": fetcher.metrics.report(len(fetcher.suspects)),
        }

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        """Slices of the staged range: ``itemsPerPartition`` rows each, or by default as many
        slices as Spark's default parallelism (of at least 1000 rows)."""
        self._driver()
        lo, hi = int(start["seq"]), int(end["seq"])
        rows = self.opts.items_per_partition
        if rows is None:
            rows = max(1000, -(-(hi - lo) // self.parallelism))
        slices = self.staging.slices(lo, hi, rows, self.opts.fail_on_data_loss)
        return [StagedSlice(pieces) for pieces in slices]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Executors: the staged rows of one slice as Arrow record batches."""
        assert isinstance(partition, StagedSlice)
        yield from read_slice(partition.pieces, self.opts.fail_on_data_loss)

    def commit(self, end: dict[str, int]) -> None:
        """Spark has committed everything before ``end``: delete those segments. Never acks
        (acks happen right after staging; Spark does not commit the last batch of a run)."""
        self.staging.gc(int(end["seq"]))

    def stop(self) -> None:
        if self._prefetch is not None:
            self._prefetch.thread.join()
            self._prefetch = None
        if self._fetcher is not None:
            self._fetcher.close()
            self._fetcher = None


class TercelDataSource(DataSource):
    """``format("tercel")``: stream items out of tercel queues, or write DataFrames into them.

    Source options: ``servers`` (``h1:p,h2:p``), one of ``queue``/``queues``/``queuePattern``,
    and ``stagingLocation`` (or ``checkpointLocation``) are required; docs/spark.md lists the
    others; an unknown option is an error naming the closest valid one. Sink options:
    ``servers``, ``queue``.
    """

    @classmethod
    def name(cls) -> str:
        return "tercel"

    def schema(self) -> StructType:
        return SOURCE_STRUCT

    def reader(self, schema: StructType) -> DataSourceReader:
        raise ValueError(
            "tercel: a batch read would consume the queue and Spark may re-run tasks; use "
            "spark.readStream.format('tercel')...writeStream.trigger(availableNow=True) with a "
            "checkpoint to drain a queue into a table"
        )

    default_parallelism: int | None = None
    """Spark's default parallelism, set by :func:`tercel.spark.register` on a subclass made
    for its session (None: this machine's CPU count)."""

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if [(f.name, f.dataType) for f in schema.fields] != [
            (f.name, f.dataType) for f in SOURCE_STRUCT.fields
        ]:
            raise ValueError(f"tercel source: the schema is fixed ({SOURCE_SCHEMA})")
        parallelism = self.default_parallelism or os.cpu_count() or 2
        return TercelStreamReader(SourceOptions.parse(self.options), parallelism)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from tercel.spark.sink import TercelWriter

        return TercelWriter(SinkOptions.parse(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from tercel.spark.sink import TercelStreamWriter

        return TercelStreamWriter(SinkOptions.parse(self.options), schema, overwrite)
