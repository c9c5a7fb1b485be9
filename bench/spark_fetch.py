"""The Spark source's driver-side fetch alone: ``Fetcher.fetch`` of ``--items`` JSON events
from two servers into a staging directory (lease, parse, stage + fsync, ack: what
``latestOffset`` and the prefetch run), no Spark. Uses only the ``Fetcher`` API, so the same
command measures older versions of the source too.

    .venv/bin/python bench/spark_fetch.py [--items 200000] [--size 200] [--rounds 2]

Prints one JSON object: per round the items per second and the CPU seconds per item of this
process (the driver) and of the two servers.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from procstat import tree_and_kernel_seconds
from spark_bench import fill_queues
from tercel.spark._fetch import Fetcher
from tercel.spark._options import SourceOptions
from tercel.spark._staging import StagingLog
from tercel.testing import ServerProcess


def one_round(work: Path, n: int, size: int) -> dict[str, float]:
    with ServerProcess(work / "s1") as a, ServerProcess(work / "s2") as b:
        assert a.proc is not None and b.proc is not None
        fill_queues([a, b], "events", n, size)
        opts = SourceOptions.parse(
            {
                "servers": f"{a.address},{b.address}",
                "queue": "events",
                "stagingLocation": str(work / "stage"),
                "maxFetchDurationMs": "600000",
            }
        )
        log = StagingLog(opts.staging)
        log.ensure()
        fetcher = Fetcher(opts, log)
        pids = (a.proc.pid, b.proc.pid)
        servers = sum(tree_and_kernel_seconds(p)[0] for p in pids)
        started, cpu = time.perf_counter(), time.process_time()
        end = 0
        while end < n:
            end, _ = fetcher.fetch(end, n - end, False)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        servers = sum(tree_and_kernel_seconds(p)[0] for p in pids) - servers
        fetcher.close()
    return {
        "seconds": round(elapsed, 2),
        "items_per_s": round(n / elapsed),
        "driver_cpu_us_per_item": round(cpu / n * 1e6, 2),
        "servers_cpu_us_per_item": round(servers / n * 1e6, 2),
        "load": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tercel-spark-fetch-"))
    runs = [one_round(work / f"r{r}", args.items, args.size) for r in range(args.rounds)]
    print(json.dumps({"items": args.items, "size": args.size, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
