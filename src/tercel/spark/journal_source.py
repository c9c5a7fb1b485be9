"""The ``tercel-journal`` format: a batch reader of journal files, one row per record, so
operators can audit what went through a queue with Spark SQL::

    spark.read.format("tercel-journal").load("/var/lib/tercel")     # every queue
    spark.read.format("tercel-journal").option("queues", "jobs").load(data_dir)

It reads files (a copy, or a live data directory), never a server. One partition per file, in
replay order (``file_seq``: older files by number, then the current file, which gets the next
number). Record layout: docs/journal_format.md. ``ignoreCorruptTail`` (default true) stops a
file at its first bad record, as replay does with a torn tail; false raises instead.
``includePayload=false`` leaves ``payload`` null (much less data to move).

``schema``/``reader``/``partitions`` run on the driver; ``read`` runs on executors and only
opens the file its partition names. Uses :mod:`tercel.journal` (files and records), nothing
of the server.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from tercel.journal import list_queue_names
from tercel.journal import records as rec
from tercel.journal.journal import journal_files
from tercel.journal.reader import ChunkReader
from tercel.spark.options import JournalOptions

JOURNAL_SCHEMA = (
    "queue string, file string, file_seq bigint, offset bigint, op string, xid bigint, "
    "item_id bigint, size int, add_time timestamp, expiry timestamp, payload binary"
)
"""One row per record: ``offset`` is the record's byte offset in ``file``; ``size`` its bytes
on disk (header included); ``xid`` is set for OPEN/CONFIRM/ABORT/RETURN (and SNAPSHOT: the
last xid); ``item_id`` for ADD (SNAPSHOT: the next item id); ``add_time``, ``expiry`` and
``payload`` for ADD only (``expiry`` null when the item never expires)."""

TS = pa.timestamp("us", tz="UTC")
ARROW_SCHEMA = pa.schema(
    [
        ("queue", pa.string()),
        ("file", pa.string()),
        ("file_seq", pa.int64()),
        ("offset", pa.int64()),
        ("op", pa.string()),
        ("xid", pa.int64()),
        ("item_id", pa.int64()),
        ("size", pa.int32()),
        ("add_time", TS),
        ("expiry", TS),
        ("payload", pa.binary()),
    ]
)
ROWS_PER_BATCH = 10_000


class JournalFile(InputPartition):
    """One journal file of one queue (picklable)."""

    def __init__(self, queue: str, path: str, seq: int) -> None:
        super().__init__(path)
        self.queue = queue
        self.path = path
        self.seq = seq


def _file_seq(queue: str, path: str, newest: int) -> int:
    suffix = os.path.basename(path)[len(queue) :]
    return int(suffix[1:]) if suffix.startswith(".") else newest + 1


def plan_files(opts: JournalOptions) -> list[JournalFile]:
    """Every journal file of the selected queues, in replay order per queue (driver)."""
    if not os.path.isdir(opts.path):
        raise ValueError(f"tercel-journal: {opts.path} is not a directory")
    names = opts.queues or tuple(list_queue_names(opts.path))
    parts = []
    for name in names:
        paths = journal_files(opts.path, name)
        seqs = [_file_seq(name, p, 0) for p in paths if os.path.basename(p) != name]
        newest = max(seqs, default=0)
        parts += [JournalFile(name, p, _file_seq(name, p, newest)) for p in paths]
    return parts


def read_records(part: JournalFile, opts: JournalOptions) -> Iterator[pa.RecordBatch]:
    """The records of one file as Arrow batches of ARROW_SCHEMA (executors)."""
    cols: dict[str, list[object]] = {n: [] for n in ARROW_SCHEMA.names}
    with open(part.path, "rb") as f:
        head = f.read(rec.HEADER_SIZE)
    if len(head) < rec.HEADER_SIZE:
        return  # empty or torn header: no records
    if rec.header_version(head) is None:
        raise ValueError(f"tercel-journal: {part.path} is not a tercel journal (bad header)")
    reader = ChunkReader(part.path, rec.HEADER_SIZE)
    try:
        while True:
            try:
                span = reader.next()
                if span is None:
                    reader.check_end()
            except rec.BadRecord as bad:
                if opts.ignore_corrupt_tail:
                    break
                raise ValueError(f"tercel-journal: {part.path} at {bad.offset}: {bad}") from None
            if span is None:
                break
            start, stop = span
            _append(
                cols,
                part,
                reader.file_offset(start),
                rec.describe_record(reader.buffer, start, stop),
                opts.include_payload,
            )
            if len(cols["op"]) >= ROWS_PER_BATCH:
                yield pa.RecordBatch.from_pydict(cols, schema=ARROW_SCHEMA)
                cols = {n: [] for n in ARROW_SCHEMA.names}
    finally:
        reader.close()
    if cols["op"]:
        yield pa.RecordBatch.from_pydict(cols, schema=ARROW_SCHEMA)


def _append(
    cols: dict[str, list[object]],
    part: JournalFile,
    offset: int,
    info: dict[str, object],
    payload: bool,
) -> None:
    op = str(info["op"])
    cols["queue"].append(part.queue)
    cols["file"].append(os.path.basename(part.path))
    cols["file_seq"].append(part.seq)
    cols["offset"].append(offset)
    cols["op"].append(op)
    cols["xid"].append(info.get("xid"))
    cols["item_id"].append(info.get("item_id", info.get("next_id")))
    cols["size"].append(info["size"])
    add_time = info.get("add_time")
    expiry = info.get("expiry")
    # Journal times are epoch ms; the Arrow column is microseconds. Expiry 0 means never.
    cols["add_time"].append(add_time * 1000 if isinstance(add_time, int) else None)
    cols["expiry"].append(expiry * 1000 if isinstance(expiry, int) and expiry else None)
    cols["payload"].append(info.get("data") if payload else None)


class JournalReader(DataSourceReader):
    """Plans one partition per file (driver); reads one file per task (executors)."""

    def __init__(self, opts: JournalOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        """One per journal file; none when there is no file (Spark then runs one task with
        its default partition, which :meth:`read` answers with no rows)."""
        return plan_files(self.opts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, JournalFile):
            yield from read_records(partition, self.opts)


class TercelJournalDataSource(DataSource):
    """``format("tercel-journal")``: journal records as rows (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return "tercel-journal"

    def schema(self) -> str:
        return JOURNAL_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return JournalReader(JournalOptions.parse(self.options))
