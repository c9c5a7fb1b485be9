"""PySpark connector for tercel (pyspark >= 4.2, Python Data Source API; ``pip install
tercel[spark]``)::

    from tercel.spark import register
    register(spark)
    items = (spark.readStream.format("tercel").option("servers", "h1:22133,h2:22133")
             .option("queue", "events").load())
    df.write.format("tercel").option("servers", "h1:22133").option("queue", "out").save()
    spark.read.format("tercel-journal").load("/var/lib/tercel")

Formats: ``tercel`` (:mod:`.source`: streaming source, and the sink of :mod:`.sink`) and
``tercel-journal`` (:mod:`.journal_source`: journal files as rows). Design, guarantees and
options: docs/spark.md. This package imports the client, the journal reader, pyspark and
pyarrow, never the server or the core.
"""

from __future__ import annotations

from typing import Any

from tercel.spark.journal_source import TercelJournalDataSource
from tercel.spark.source import TercelDataSource, TercelStreamReader

__all__ = [
    "LOCAL_CONF",
    "TercelDataSource",
    "TercelJournalDataSource",
    "TercelStreamReader",
    "local_session",
    "register",
]

LOCAL_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
}
"""The settings of :func:`local_session`: no UI or progress bars, two shuffle partitions (the
default 200 dominates small local jobs), UTC timestamps."""


def register(spark: Any) -> None:
    """Register ``tercel`` and ``tercel-journal`` with a SparkSession (driver).

    The ``tercel`` class registered is a subclass made here that carries the session's
    ``defaultParallelism`` (a Python source cannot ask Spark for it later): the source cuts
    each batch into that many slices by default. A class made in a function is pickled by
    value, attributes included."""
    try:
        parallelism = int(spark.sparkContext.defaultParallelism)
    except Exception:  # e.g. Spark Connect has no SparkContext: the CPU count is used
        parallelism = None
    source = type("TercelDataSource", (TercelDataSource,), {"default_parallelism": parallelism})
    spark.dataSource.register(source)
    spark.dataSource.register(TercelJournalDataSource)


def local_session(
    app_name: str = "tercel", conf: dict[str, str] | None = None, master: str = "local[2]"
) -> Any:
    """A SparkSession on this machine with :data:`LOCAL_CONF` (plus ``conf``), quiet logs and
    the tercel formats registered: what the example, the benchmark and the tests run on."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**LOCAL_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
