"""A real Spark driver for the crash matrix (tests/spark/test_spark_crashes.py).

Usage: python crash_driver.py '<json plan>' with the plan::

    {"master": "local[2]", "restarts": 0, "retry_wait": 1.0,
     "lanes": [{"name": ..., "servers": "h:p,h:p", "queue": ..., "checkpoint": ...,
                "source_options": {...}, "sink_options": {...},
                "sink": "tercel", "out_servers": "h:p,h:p", "out_queue": ...
                # or "sink": "parquet", "out": <dir>
               }, ...],
     "report": <json file: the Parquet lanes' committed values, written at the end>,
     "parallel": <lanes run at once (default all)>, "conf": {<Spark settings>}}

Each lane streams the ``tercel`` source into the ``tercel`` sink (``value`` only) or into
Parquet (every column), ``Trigger.AvailableNow``, on its own checkpoint; ``parallel`` lanes
run at once (one query each), in the order given. A query that fails (a fail point armed by
``TERCEL_SPARK_FAILPOINT`` ended the source runner, the sink's commit runner or an executor's
Python worker with exit code 137; a server was down) is started again on its checkpoint up
to ``restarts`` times, ``retry_wait`` seconds later; after that the driver prints
``FAILED <lane>: <error>`` and ends with ``os._exit(3)`` at once, leaving its JVM and workers
for the test to SIGKILL (its process group): what a kill -9 of the driver leaves. When every
lane finished, the values committed to each Parquet lane (read back by Spark, which reads
only committed files) are written to ``report``; the driver prints ``DONE`` and exits 0.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


def say(line: str) -> None:
    print(line, flush=True)


def start(spark: Any, lane: dict[str, Any]) -> Any:
    reader = (
        spark.readStream.format("tercel")
        .option("servers", lane["servers"])
        .option("queue", lane["queue"])
    )
    for key, value in lane.get("source_options", {}).items():
        reader = reader.option(key, str(value))
    df = reader.load()
    if lane["sink"] == "tercel":
        writer = (
            df.select("value")
            .writeStream.format("tercel")
            .option("servers", lane["out_servers"])
            .option("queue", lane["out_queue"])
        )
    else:
        writer = df.writeStream.format("parquet").option("path", lane["out"])
    for key, value in lane.get("sink_options", {}).items():
        writer = writer.option(key, str(value))
    return (
        writer.option("checkpointLocation", lane["checkpoint"]).trigger(availableNow=True).start()
    )


def run(spark: Any, plan: dict[str, Any]) -> None:
    lanes = {lane["name"]: lane for lane in plan["lanes"]}
    restarts = {name: int(plan.get("restarts", 0)) for name in lanes}
    waiting = list(lanes)
    parallel = int(plan.get("parallel", len(lanes)))
    running: dict[str, Any] = {}
    while running or waiting:
        while waiting and len(running) < parallel:
            name = waiting.pop(0)
            running[name] = start(spark, lanes[name])
            say(f"STARTED {name}")
        for name, query in list(running.items()):
            if query.isActive:
                continue
            error = query.exception()
            if error is None:
                say(f"FINISHED {name}")
                del running[name]
                continue
            text = " ".join(str(error).split())[:2000]
            if restarts[name] <= 0:
                say(f"FAILED {name}: {text}")
                sys.stdout.flush()
                os._exit(3)
            restarts[name] -= 1
            say(f"RESTART {name}: {text[:300]}")
            time.sleep(float(plan.get("retry_wait", 1.0)))
            running[name] = start(spark, lanes[name])
        time.sleep(0.1)
    report: dict[str, list[str]] = {}
    for name, lane in lanes.items():
        if lane["sink"] == "parquet":
            if os.path.isdir(os.path.join(lane["out"], "_spark_metadata")):
                rows = spark.read.parquet(lane["out"]).select("value").collect()
                report[name] = [bytes(r.value).decode() for r in rows]
            else:
                report[name] = []
    with open(plan["report"], "w") as f:
        json.dump(report, f)


def main() -> None:
    plan = json.loads(sys.argv[1])
    master = plan.get("master", "local[2]")
    if master.startswith("local-cluster"):  # its workers start executor JVMs from SPARK_HOME
        import pyspark

        os.environ["SPARK_HOME"] = os.path.dirname(pyspark.__file__)
    from tercel.spark import local_session

    spark = local_session(
        "tercel-crash-driver",
        {
            "spark.speculation": "false",
            "spark.driver.memory": "1g",
            "spark.sql.streaming.stopTimeout": "30s",
            **plan.get("conf", {}),
        },
        master=master,
    )
    run(spark, plan)
    say("DONE")
    sys.stdout.flush()
    os._exit(0)  # no orderly shutdown to wait for: the test ends the process group


if __name__ == "__main__":
    main()
