"""PySpark connector for tercel (pyspark >= 4.2, Python Data Source API; ``pip install
tercel[spark]``)::

    from tercel.spark import register
    register(spark)
    items = (spark.readStream.format("tercel").option("servers", "h1:22133,h2:22133")
             .option("queue", "events").option("stagingLocation", "/data/stage/events").load())
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

__all__ = ["TercelDataSource", "TercelJournalDataSource", "TercelStreamReader", "register"]


def register(spark: Any) -> None:
    """Register ``tercel`` and ``tercel-journal`` with a SparkSession (driver)."""
    spark.dataSource.register(TercelDataSource)
    spark.dataSource.register(TercelJournalDataSource)
