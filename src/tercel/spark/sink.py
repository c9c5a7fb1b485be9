"""The ``tercel`` sink: ``df.write.format("tercel")`` and ``df.writeStream.format("tercel")``.

Columns: ``value`` (binary or string, UTF-8) is required; ``queue`` (string) routes each row
unless the ``queue`` option is set, which overrides it (as Kafka's ``topic`` option does);
``expiry`` is optional: a timestamp (absolute) or an integer number of seconds from now (null
or <= 0: no expiry). Rows whose absolute expiry has already passed are not written (counted as
``expired``). Any other column is an error unless ``ignoreExtraColumns=true``.

The writer objects are built on the driver and pickled; ``write`` runs on executors, once per
task, with its own :class:`~tercel.client.Client` (sets are pipelined ``batchSize`` at a time,
each batch to a random healthy server, failing over to another). ``commit`` and ``abort`` run
on the driver and only log: enqueued items cannot be taken back. Save modes: ``append``;
``overwrite`` only with ``flushOnOverwrite=true`` (the ``queue`` option's queue is flushed on
every server when the writer is built on the driver, then the rows are written).

Delivery is at-least-once: a retried task, a re-run streaming batch or a connection lost in
mid-pipeline can enqueue items twice. Consumers must be idempotent (Kestrel's own rule).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

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

from tercel.client import Client
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
    extra = sorted(set(types) - {"value", "queue", "expiry"})
    if extra and not opts.ignore_extra_columns:
        raise ValueError(
            f"tercel sink: unexpected column(s) {extra}; select value[, queue, expiry] or set "
            "ignoreExtraColumns=true"
        )


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


def send_batch(client: Client, opts: SinkOptions, batch: pa.RecordBatch, out: WriteCounts) -> None:
    """Enqueue one Arrow batch: consecutive rows with the same queue and expiry go together,
    so each queue keeps the DataFrame's row order."""
    names = batch.schema.names
    values = batch.column(names.index("value"))
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        values = values.cast(pa.binary())
    data: list[bytes | None] = values.to_pylist()
    if opts.queue is not None:
        queues: list[str | None] = [opts.queue] * batch.num_rows
    else:
        queues = batch.column(names.index("queue")).to_pylist()
    expiries = _expiries(batch, time.time())
    run: list[bytes] = []
    key: tuple[str, float | None] | None = None
    for value, queue, expiry in zip(data, queues, expiries, strict=True):
        if value is None or queue is None:
            raise ValueError("tercel sink: 'value' and 'queue' must not be null")
        if expiry is not None and expiry <= 0:
            out.expired += 1
            continue
        # Expiries are grouped by the second they round up to, as the wire carries seconds.
        row_key = (queue, None if expiry is None else float(int(expiry + 0.999999)))
        if row_key != key or len(run) >= opts.batch_size:
            _flush(client, key, run, out)
            key, run = row_key, []
        run.append(value)
    _flush(client, key, run, out)


def _flush(
    client: Client, key: tuple[str, float | None] | None, run: list[bytes], out: WriteCounts
) -> None:
    if key is None or not run:
        return
    queue, expiry = key
    client.put_many(queue, run, expiry)
    out.items[queue] = out.items.get(queue, 0) + len(run)
    out.bytes += sum(len(v) for v in run)


def write_task(opts: SinkOptions, batches: Iterator[pa.RecordBatch]) -> WriteCounts:
    """One task's writes (executors)."""
    out = WriteCounts()
    client = Client(
        list(opts.servers),
        timeout=opts.socket_timeout_ms / 1000,
        connect_timeout=opts.connect_timeout_ms / 1000,
        tls=opts.tls,
        **login_kwargs(opts.user, opts.password),
    )
    try:
        for batch in batches:
            send_batch(client, opts, batch, out)
    finally:
        client.close()
    return out


def _total(messages: list[WriterCommitMessage | None]) -> tuple[int, int]:
    done = [m for m in messages if isinstance(m, WriteCounts)]
    return sum(sum(m.items.values()) for m in done), len(messages) - len(done)


class TercelWriter(DataSourceArrowWriter):
    """``df.write.format("tercel")`` (at-least-once; see the module docstring)."""

    def __init__(self, opts: SinkOptions, schema: StructType, overwrite: bool) -> None:
        check_schema(opts, schema, overwrite)
        self.opts = opts
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
        return write_task(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
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
    """``df.writeStream.format("tercel")`` (at-least-once: a re-run batch enqueues again)."""

    def __init__(self, opts: SinkOptions, schema: StructType, overwrite: bool) -> None:
        check_schema(opts, schema, False)
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCounts:
        return write_task(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        items, _ = _total(messages)
        log.info("tercel sink: batch %d wrote %d item(s)", batchId, items)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        items, _ = _total(messages)
        log.warning("tercel sink: batch %d aborted after %d item(s) were enqueued", batchId, items)
