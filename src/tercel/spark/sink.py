"""The ``tercel`` sink: ``df.write.format("tercel")`` and ``df.writeStream.format("tercel")``.

Columns: ``value`` (binary or string, UTF-8) is required; ``queue`` (string) routes each row
unless the ``queue`` option is set, which overrides it (as Kafka's ``topic`` option does);
``expiry`` is optional: a timestamp (absolute) or an integer number of seconds from now (null
or <= 0: no expiry). Rows whose absolute expiry has already passed are not written (counted as
``expired``). The ``keyColumn`` option's column (string or integer) gives each row's dedup
key. Any other column is an error unless ``ignoreExtraColumns=true``.

The writer objects are built on the driver and pickled; ``write`` runs on executors, once per
task, with its own :class:`~tercel.client.Client`. ``commit`` and ``abort`` run on the driver
and only log: enqueued items cannot be taken back. Save modes: ``append``; ``overwrite`` only
with ``flushOnOverwrite=true`` (the ``queue`` option's queue is flushed on every server when
the writer is built on the driver, then the rows are written).

Delivery is **effectively once** by default: every row is put with a dedup key
(``Client.put_many(keys=...)``), ``<write id>.<batch>.<partition>.<row>`` -- the streaming
query's id and batch id (Spark's task-local properties ``sql.streaming.queryId`` and
``streaming.sql.batchId``: the query id is kept in the checkpoint, so a restarted query makes
the same keys), or for a batch write an id the driver draws once per write -- or the
``keyColumn`` column's value. A retried task or a re-run streaming batch puts the same keys
again and the servers store each row once, as long as the re-run comes within the queues'
dedup window and computes the same rows in the same partitions in the same order (true for
a deterministic plan; otherwise use ``keyColumn``). Each key picks its server
(``Client.server_for_key``), and a task sends each server its share of a run at once (an
:class:`~tercel.client.AsyncClient` on the task's own event loop): no failover, a dead server
fails the task (Spark retries it or the query restarts). ``dedup=false`` puts without keys
(at-least-once: a retry enqueues again), pipelined ``batchSize`` at a time to a random
healthy server, failing over to another.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from tercel.client import AsyncClient, Client
from tercel.names import key_problem
from tercel.spark import failpoints
from tercel.spark.options import SinkOptions, login_kwargs

log = logging.getLogger(__name__)


@dataclass
class WriteCounts(WriterCommitMessage):
    """What one task wrote: items per queue, bytes, and rows dropped as already expired."""

    items: dict[str, int] = field(default_factory=dict)
    bytes: int = 0
    expired: int = 0


def check_schema(opts: SinkOptions, schema: StructType, overwrite: bool) -> None:
    """Validate the DataFrame's columns on the driver (see the module docstring)."""
    if overwrite and not opts.flush_on_overwrite:
        raise ValueError(
            "tercel sink: mode('overwrite') would empty the queue first: use mode('append'), "
            "or set flushOnOverwrite=true to flush the 'queue' option's queue, then write"
        )
    if overwrite and opts.queue is None:
        raise ValueError("tercel sink: mode('overwrite') needs the 'queue' option (to flush)")
    types = {f.name: f.dataType for f in schema.fields}
    if "value" not in types:
        raise ValueError("tercel sink: a 'value' column (binary or string) is required")
    if not isinstance(types["value"], BinaryType | StringType):
        raise ValueError(f"tercel sink: 'value' must be binary or string, not {types['value']}")
    if opts.queue is None and "queue" not in types:
        raise ValueError("tercel sink: set the 'queue' option or give a 'queue' column")
    if "queue" in types and not isinstance(types["queue"], StringType):
        raise ValueError("tercel sink: the 'queue' column must be a string")
    if "expiry" in types and not isinstance(
        types["expiry"], TimestampType | TimestampNTZType | IntegerType | LongType
    ):
        raise ValueError("tercel sink: 'expiry' must be a timestamp or seconds (int/bigint)")
    known = {"value", "queue", "expiry"}
    if opts.key_column is not None:
        if opts.key_column not in types:
            raise ValueError(f"tercel sink: no column {opts.key_column!r} (option keyColumn)")
        if not isinstance(types[opts.key_column], StringType | IntegerType | LongType):
            raise ValueError(
                f"tercel sink: the keyColumn {opts.key_column!r} must be a string or an integer"
            )
        known.add(opts.key_column)
    extra = sorted(set(types) - known)
    if extra and not opts.ignore_extra_columns:
        raise ValueError(
            f"tercel sink: unexpected column(s) {extra}; select value[, queue, expiry] or set "
            "ignoreExtraColumns=true"
        )


QUERY_ID = "sql.streaming.queryId"
BATCH_ID = "streaming.sql.batchId"
"""Spark's task-local properties naming a streaming task's query (its persistent id, kept in
the checkpoint) and micro-batch (``StreamExecution.QUERY_ID_KEY``,
``MicroBatchExecution.BATCH_ID_KEY``)."""


class RowKeys:
    """The dedup keys of one task's rows, in the order the rows come: ``<prefix><row>`` with
    ``prefix = "<write id>.<batch>.<partition>."`` and ``row`` counting every row of the task
    (expired ones too), or the ``keyColumn`` values (checked against the key rule)."""

    def __init__(self, prefix: str, column: str | None = None) -> None:
        self.prefix = prefix
        self.column = column
        self.row = 0

    def take(self, batch: pa.RecordBatch) -> list[str]:
        """The keys of ``batch``'s rows (the next ``batch.num_rows`` of the task)."""
        first, self.row = self.row, self.row + batch.num_rows
        if self.column is None:
            prefix = self.prefix
            return [f"{prefix}{i}" for i in range(first, self.row)]
        col = batch.column(batch.schema.names.index(self.column))
        keys: list[str | int | None] = col.to_pylist()
        out = []
        for i, key in enumerate(keys):
            text = "" if key is None else str(key)
            problem = key_problem(text)
            if problem is not None:
                raise ValueError(
                    f"tercel sink: row {first + i} of partition {self.prefix!r}: keyColumn "
                    f"{self.column!r}: {problem}"
                )
            out.append(text)
        return out


def task_keys(opts: SinkOptions, write_id: str | None) -> RowKeys | None:
    """This task's :class:`RowKeys` (executors; None with ``dedup=false``). ``write_id``: a
    batch write's id (its batch is 0); None in a streaming write, whose query and batch ids
    come from the task's local properties."""
    if not opts.dedup:
        return None
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("tercel sink: write() outside a Spark task (no TaskContext)")
    if write_id is None:
        query, batch = ctx.getLocalProperty(QUERY_ID), ctx.getLocalProperty(BATCH_ID)
        if (not query or batch is None) and opts.key_column is None:
            raise RuntimeError(
                f"tercel sink: this streaming task has no {QUERY_ID}/{BATCH_ID} property to "
                "make dedup keys from: set keyColumn, or dedup=false (at-least-once)"
            )
        return RowKeys(f"{query}.{batch}.{ctx.partitionId()}.", opts.key_column)
    return RowKeys(f"{write_id}.0.{ctx.partitionId()}.", opts.key_column)


def _expiries(batch: pa.RecordBatch, now: float) -> list[float | None]:
    """Per row: seconds from now (None: no expiry; <= 0: already expired)."""
    names = batch.schema.names
    if "expiry" not in names:
        return [None] * batch.num_rows
    col = batch.column(names.index("expiry"))
    if pa.types.is_timestamp(col.type):
        micros = col.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_pylist()
        return [None if m is None else m / 1e6 - now for m in micros]
    return [None if s is None or s <= 0 else float(s) for s in col.to_pylist()]


@dataclass
class _Run:
    """Consecutive rows with one queue and expiry (and their keys when keyed)."""

    queue: str
    expiry: float | None
    values: list[bytes] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)


class Puts:
    """How one task enqueues: :meth:`put` one run of rows (with their keys, or none)."""

    def __init__(self, opts: SinkOptions, keyed: bool) -> None:
        kwargs: dict[str, Any] = {
            "timeout": opts.socket_timeout_ms / 1000,
            "connect_timeout": opts.connect_timeout_ms / 1000,
            "tls": opts.tls,
            **login_kwargs(opts.user, opts.password),
        }
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sync: Client | None = None
        self._async: AsyncClient | None = None
        if keyed:
            # Keyed rows are spread over the servers by their keys: an AsyncClient on this
            # task's own loop sends each server its share at once, not one after the other.
            self._loop = asyncio.new_event_loop()
            self._async = AsyncClient(list(opts.servers), **kwargs)
        else:  # plain puts: a run to one healthy server, failing over to another
            self._sync = Client(list(opts.servers), **kwargs)

    def put(self, queue: str, values: list[bytes], expiry: float | None, keys: list[str]) -> None:
        if self._async is not None and self._loop is not None:
            self._loop.run_until_complete(self._async.put_many(queue, values, expiry, keys=keys))
        elif self._sync is not None:
            self._sync.put_many(queue, values, expiry)

    def close(self) -> None:
        if self._sync is not None:
            self._sync.close()
        if self._async is not None and self._loop is not None:
            try:
                self._loop.run_until_complete(self._async.close())
            finally:
                self._loop.close()


def send_batch(
    client: Puts,
    opts: SinkOptions,
    batch: pa.RecordBatch,
    out: WriteCounts,
    keys: RowKeys | None = None,
) -> None:
    """Enqueue one Arrow batch: consecutive rows with the same queue and expiry go together,
    so each queue keeps the DataFrame's row order (per server, when keyed)."""
    names = batch.schema.names
    values = batch.column(names.index("value"))
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        values = values.cast(pa.binary())
    data: list[bytes | None] = values.to_pylist()
    n = batch.num_rows
    queues: list[str | None]
    queues = (
        [opts.queue] * n
        if opts.queue is not None
        else batch.column(names.index("queue")).to_pylist()
    )
    expiries = _expiries(batch, time.time())
    row_keys: list[str] | None = None if keys is None else keys.take(batch)
    run: _Run | None = None
    for i in range(n):
        value, queue, expiry = data[i], queues[i], expiries[i]
        if value is None or queue is None:
            raise ValueError("tercel sink: 'value' and 'queue' must not be null")
        if expiry is not None and expiry <= 0:
            out.expired += 1
            continue
        # Expiries are grouped by the second they round up to, as the wire carries seconds.
        seconds = None if expiry is None else float(int(expiry + 0.999999))
        if (
            run is None
            or run.queue != queue
            or run.expiry != seconds
            or len(run.values) >= opts.batch_size
        ):
            _flush(client, run, out)
            run = _Run(queue, seconds)
        run.values.append(value)
        if row_keys is not None:
            run.keys.append(row_keys[i])
    _flush(client, run, out)


def _flush(client: Puts, run: _Run | None, out: WriteCounts) -> None:
    if run is None or not run.values:
        return
    client.put(run.queue, run.values, run.expiry, run.keys)
    out.items[run.queue] = out.items.get(run.queue, 0) + len(run.values)
    out.bytes += sum(len(v) for v in run.values)
    failpoints.failpoint("sink.write")


def write_task(
    opts: SinkOptions, batches: Iterator[pa.RecordBatch], write_id: str | None = None
) -> WriteCounts:
    """One task's writes (executors); ``write_id`` as :func:`task_keys` takes it."""
    out = WriteCounts()
    keys = task_keys(opts, write_id)
    client = Puts(opts, keys is not None)
    try:
        for batch in batches:
            send_batch(client, opts, batch, out, keys)
    finally:
        client.close()
    return out


def _total(messages: list[WriterCommitMessage | None]) -> tuple[int, int]:
    done = [m for m in messages if isinstance(m, WriteCounts)]
    return sum(sum(m.items.values()) for m in done), len(messages) - len(done)


class TercelWriter(DataSourceArrowWriter):
    """``df.write.format("tercel")`` (see the module docstring). The write id of its keys is
    drawn here, on the driver, once per write: a retried task makes the same keys."""

    def __init__(self, opts: SinkOptions, schema: StructType, overwrite: bool) -> None:
        check_schema(opts, schema, overwrite)
        self.opts = opts
        self.write_id = uuid.uuid4().hex
        if overwrite and opts.queue is not None:  # flushOnOverwrite (check_schema): driver
            with Client(
                list(opts.servers),
                timeout=opts.socket_timeout_ms / 1000,
                tls=opts.tls,
                **login_kwargs(opts.user, opts.password),
            ) as client:
                client.flush(opts.queue)
            log.warning("tercel sink: flushed %r on every server (mode overwrite)", opts.queue)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCounts:
        return write_task(self.opts, iterator, self.write_id)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        failpoints.failpoint("sink.commit")
        items, failed = _total(messages)
        log.info("tercel sink: %d item(s) written by %d task(s)", items, len(messages) - failed)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        items, failed = _total(messages)
        log.warning(
            "tercel sink: job aborted after %d item(s) were enqueued (they stay; %d task(s) "
            "failed)",
            items,
            failed,
        )


class TercelStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("tercel")``: keys from the query and batch ids (see the module
    docstring), so a batch Spark runs again after a crash stores nothing twice."""

    def __init__(self, opts: SinkOptions, schema: StructType, overwrite: bool) -> None:
        check_schema(opts, schema, False)
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCounts:
        return write_task(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        failpoints.failpoint("sink.commit")
        items, _ = _total(messages)
        log.info("tercel sink: batch %d wrote %d item(s)", batchId, items)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        items, _ = _total(messages)
        log.warning("tercel sink: batch %d aborted after %d item(s) were enqueued", batchId, items)
