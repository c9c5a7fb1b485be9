"""A Spark driver for the kill -9 test: streams a queue into Parquet with the hidden option
``testPauseAfterStage``, so its source stops between the fsync of the first staged round and
the ack, writes the marker file, and waits there to be killed.

Usage: python crash_driver.py '<json: servers, queue, stage, checkpoint, out, marker>'
"""

from __future__ import annotations

import json
import os
import sys

os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
os.environ["PYSPARK_PYTHON"] = sys.executable

from tercel.spark import local_session


def main() -> None:
    args = json.loads(sys.argv[1])
    spark = local_session("tercel-crash-driver")
    df = (
        spark.readStream.format("tercel")
        .option("servers", args["servers"])
        .option("queue", args["queue"])
        .option("stagingLocation", args["stage"])
        .option("leaseMs", "2000")
        .option("leaseBatch", "100")
        .option("testPauseAfterStage", args["marker"])
        .load()
    )
    query = (
        df.writeStream.format("parquet")
        .option("path", args["out"])
        .option("checkpointLocation", args["checkpoint"])
        .start()
    )
    query.awaitTermination(600)


if __name__ == "__main__":
    main()
