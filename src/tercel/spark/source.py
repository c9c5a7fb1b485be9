"""The ``tercel`` format: a streaming source (``readStream``) and a sink (``write`` and
``writeStream``, in :mod:`tercel.spark.sink`).

Where each piece runs (pyspark >= 4.2's Python Data Source API):

- :class:`TercelDataSource` and its ``schema``/``streamReader``/``writer`` run in driver-side
  Python workers; the reader and writer objects they return are pickled to executors.
- :class:`TercelStreamReader`'s ``initialOffset``, ``latestOffset``, ``partitions``,
  ``commit`` and ``prepareForTriggerAvailableNow`` run in one long-lived driver-side Python
  process per query run: it only plans, taking each batch's keyed leases without payloads,
  and acks them once Spark has committed the batch (:class:`.fetch.Planner`).
- ``read`` runs on executors, on a pickled copy: it reads its slice of one keyed lease from
  that server directly (:func:`.fetch.read_slice`).

Delivery (docs/spark.md §2): exactly once into a replayable, idempotent sink. An offset names
a batch's keyed leases (:mod:`.offsets`); the servers hand out the same items for them until
they are acked, so a batch replays identically after any crash.
"""

from __future__ import annotations

import logging
import os
import time
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

from tercel.spark.failpoints import failpoint
from tercel.spark.fetch import Planner, Slice, read_slice, slices
from tercel.spark.offsets import Offset
from tercel.spark.options import SinkOptions, SourceOptions

log = logging.getLogger(__name__)

SOURCE_SCHEMA = (
    "value binary, queue string, server string, seq bigint, item_id bigint, deliveries int, "
    "enqueued_at timestamp, fetched_at timestamp, expiry timestamp"
)
"""The source's columns (fixed): Kafka-style ``value``; ``queue`` and ``server`` the item came
from; ``seq`` the batch number << 32 plus the row's position in its batch (unique and
increasing per query, the same on a replay, like Kafka's ``offset``); ``item_id`` the
server's per-queue id, stable across redeliveries and restarts; ``deliveries`` how often the
server handed it out (> 1: redelivered); ``enqueued_at`` the server's add time;
``fetched_at`` when the driver planned the batch; ``expiry`` the item's own expiry (null:
none)."""

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

REMEMBERED_ACKS = 64
"""Batches whose acks this process remembers (so ``commit`` does not ack them again)."""


class TercelStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming source (see the module docstring for where each method runs)."""

    def __init__(self, opts: SourceOptions, parallelism: int = 2) -> None:
        self.opts = opts
        self.parallelism = max(1, parallelism)
        """Slices per batch when ``itemsPerPartition`` is not set (Spark's default
        parallelism, given by :func:`tercel.spark.register`)."""
        self._planner: Planner | None = None
        self._initial: Offset | None = None
        self._budget: int | None = None
        """Trigger.AvailableNow: items still to take (the queue depth when it started)."""
        self._available_now = False
        self._first_plan = False
        """Set by prepareForTriggerAvailableNow: the next batch may be one planned before a
        restart, whose items the queue depth did not count (they are leased), so it is not
        taken from the budget."""
        self._planned: dict[int, Offset] = {}
        """Batches this process planned (``partitions`` renews the others' leases first)."""
        self._acked: list[int] = []
        self._unacked: dict[int, Offset] = {}
        """Committed batches whose ack failed (a server down): retried at every call."""
        self._idle = False
        """The last plan found nothing: the next one may wait ``fetchWaitMs`` for items."""
        self.metrics = {"batches": 0, "items": 0, "plan_ms": 0.0, "ack_ms": 0.0}

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "parallelism": self.parallelism}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["opts"], state["parallelism"])  # type: ignore[misc]

    def _driver(self) -> Planner:
        if self._planner is None:
            self._planner = Planner(self.opts)
        return self._planner

    def _parse(self, raw: dict[str, Any]) -> Offset:
        return Offset.parse(raw, self.opts.single_queue)

    def initialOffset(self) -> dict[str, Any]:
        """A new query's start: a fresh id, batch 0, nothing leased. Spark calls it twice, so
        the id is drawn once per process."""
        if self._initial is None:
            self._initial = Offset.initial()
        return self._initial.to_json(self.opts.single_queue)

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxItemsPerTrigger`` when set; else everything available (the backlog, up to
        ``maxItemsPerFetch`` per batch)."""
        if self.opts.max_items_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.opts.max_items_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: take what the queues hold now (``items`` over the servers),
        then stop, even if producers keep adding; or stop when a batch finds the queues
        drained. The batches' sizes are not cut to that count (a restarted driver must ask
        each key for what it asked before), so later items may fill the last batch or two."""
        self._available_now = True
        self._first_plan = True
        depth = self._driver().depth()
        if depth:  # else no server answered: go on until a batch finds the queues drained
            self._budget = sum(n for per_server in depth.values() for n in per_server.values())

    def _want(self, limit: ReadLimit) -> int:
        if isinstance(limit, ReadMaxRows):
            return int(limit.max_rows)
        return self.opts.max_items_per_fetch

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """Ack ``start``'s batch (Spark calls this only once the batch ending at ``start`` is
        in its commit log; it calls ``commit`` one batch late and never for a run's last
        batch), then take batch N = start.seq + 1's keyed leases without payloads, the limit
        split over the servers. Nothing taken: ``start`` (no batch), unless a key was left out
        (:meth:`.fetch.Planner.take`): then an empty batch moves the query past that key."""
        begin = self._parse(start)
        planner = self._driver()
        self._ack(begin)
        if self._budget == 0 and not self._first_plan:  # (a batch planned before a restart
            return start  # holds items the queue depth did not count: it is planned again)
        started = time.monotonic()
        plan = planner.take(begin.id, begin.seq + 1, self._want(limit), wait=self._idle)
        self.metrics["plan_ms"] += (time.monotonic() - started) * 1000
        end = Offset(begin.id, begin.seq + 1, plan.leases)
        if self._available_now:
            if plan.drained:
                self._budget = 0
            elif self._budget is not None and not self._first_plan:
                self._budget = max(0, self._budget - end.total)
            self._first_plan = False
        self._idle = not end.total
        if not end.total and not plan.skipped:
            return start
        self._planned[end.seq] = end
        self.metrics["batches"] += 1
        self.metrics["items"] += end.total
        failpoint("source.planned")
        return end.to_json(self.opts.single_queue)

    def _ack(self, offset: Offset) -> None:
        """Ack ``offset``'s batch, unless this process already did; retry failed acks."""
        todo = dict(self._unacked)
        if offset.leases and offset.seq not in self._acked:
            todo[offset.seq] = offset
        if not todo:
            return
        started = time.monotonic()
        planner = self._driver()
        for seq, batch in sorted(todo.items()):
            if planner.ack(batch):
                self._unacked.pop(seq, None)
                self._acked = [*self._acked[-REMEMBERED_ACKS + 1 :], seq]
                self._planned.pop(seq, None)
            else:
                self._unacked[seq] = batch
        self.metrics["ack_ms"] += (time.monotonic() - started) * 1000

    def reportLatestOffset(self) -> dict[str, Any]:
        """Shown as the source's ``latestOffset`` in the query progress: the lag (items still
        queued, per server and queue, and in all) and this process's counters."""
        depth = self._driver().depth()
        return {
            "lag": sum(n for per_server in depth.values() for n in per_server.values()),
            "queued": depth,
            "metrics": {
                **{k: round(v, 1) for k, v in self.metrics.items()},
                "unacked": len(self._unacked),
            },
        }

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """Slices of the batch's keyed leases: ``itemsPerPartition`` items each, or by default
        as many slices as Spark's default parallelism (of at least 1000 items). A batch this
        process did not plan (Spark replays a logged batch after a restart) has its leases
        renewed first: one that ended fails the query with :class:`.fetch.LeaseEnded`."""
        failpoint("source.partitions")
        self._parse(start)
        batch = self._parse(end)
        if batch.seq not in self._planned:
            self._driver().renew(batch)
        rows = self.opts.items_per_partition
        if rows is None:
            rows = max(1000, -(-batch.total // self.parallelism))
        return slices(batch, rows, round(time.time() * 1_000_000), self.opts.single_queue)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Executors: the slice's items, from its server, as Arrow record batches."""
        assert isinstance(partition, Slice)
        yield from read_slice(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark has committed everything up to ``end``: ack its keys (usually done already
        by the ``latestOffset`` that planned the next batch)."""
        batch = self._parse(end)
        failpoint("source.commit.before")
        self._ack(batch)
        failpoint("source.commit.after")

    def stop(self) -> None:
        if self._planner is not None:
            self._planner.close()
            self._planner = None


class TercelDataSource(DataSource):
    """``format("tercel")``: stream items out of tercel queues, or write DataFrames into them.

    Source options: ``servers`` (``h1:p,h2:p``) and one of ``queue``/``queues``/``queuePattern``
    are required; docs/spark.md lists the
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
