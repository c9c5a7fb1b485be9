"""Spark connector throughput with default options, against the connector of an older commit
and the JSON file source, alternated in one run: the same JSON events (``--size`` bytes each)
either written as JSON-lines files and read with ``readStream.format("json")``, or queued on
two tercel servers and read with ``readStream.format("tercel")`` (parsed with ``from_json``);
all into Parquet with ``Trigger.AvailableNow`` on ``local[2]``. Each round runs files, this
tree's connector, then the old one, after a warm-up of each.

    .venv/bin/python bench/spark_bench.py [--items 400000] [--size 200] [--rounds 2]
        [--old-commit 1f1f505 | --no-old] [--skip-writer] [--skip-source]
        [--servers-src DIR]

Two driver processes, each with its own SparkSession, take commands from this script: one
runs this tree's ``src`` (and the file source), the other the old commit's ``src`` (``git
archive <commit> src``, first on ``PYTHONPATH`` for the driver and, through Spark, for its
workers). The tercel servers are this tree's, started by this script (fresh data directories
per run), so they are not in a driver's process tree: the CPU per item reported is the Spark
side's only -- the driver, its JVM, the source runner and the Python workers -- read from
/proc. Timings exclude JVM starts and the time to fill queues or write files.

Also the sink (``df.write.format("tercel")``, default options: dedup keys) against
``dedup=false``, alternated: rows/s of each. Prints one JSON object; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from procstat import tree_and_kernel_seconds
from tercel.client import Client
from tercel.testing import ServerProcess

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent

EVENT_SCHEMA = "id bigint, user string, kind string, ts bigint, amount double, note string"


def events(start: int, n: int, size: int) -> list[bytes]:
    """``n`` JSON events of about ``size`` bytes (the note pads them)."""
    out = []
    for i in range(start, start + n):
        head = (
            f'{{"id":{i},"user":"u{i % 9973:05d}","kind":"{("click", "view", "buy")[i % 3]}",'
            f'"ts":{1_717_000_000_000 + i},"amount":{(i % 1000) / 10},"note":"'
        )
        out.append((head + "x" * max(0, size - len(head) - 2) + '"}').encode())
    return out


def fill_queues(servers: list[ServerProcess], queue: str, n: int, size: int) -> None:
    for k, srv in enumerate(servers):
        lo, hi = k * n // len(servers), (k + 1) * n // len(servers)
        with Client(srv.address) as c:
            for start in range(lo, hi, 5000):
                c.put_many(queue, events(start, min(5000, hi - start), size))


def write_files(directory: Path, n: int, size: int, files: int) -> None:
    directory.mkdir(parents=True)
    per = -(-n // files)
    for f in range(files):
        lo, hi = f * per, min(n, (f + 1) * per)
        with open(directory / f"events-{f:03d}.json", "wb") as out:
            for lo2 in range(lo, hi, 10_000):
                out.write(b"\n".join(events(lo2, min(10_000, hi - lo2), size)) + b"\n")


def note(what: str, value: object) -> None:
    """Progress on stderr (the JSON result goes to stdout at the end)."""
    print(f"[{time.strftime('%H:%M:%S')}] {what}: {json.dumps(value)}", file=sys.stderr)


# --- the driver side (``--driver``): one SparkSession, commands on stdin --------------------


ROLES = (
    ("source runner", "python_streaming_source_runner"),
    ("sink commit runner", "python_streaming_sink_runner"),
    ("python workers", "pyspark.daemon"),
    ("python workers", "pyspark.worker"),
)
"""Python processes in a driver's tree, by a word of the command line (first match); the
``java`` executable is the JVM, any other process ``other``."""


def _tree(root: int) -> dict[int, tuple[str, int]]:
    """Every live process of ``root``'s tree: pid -> (role, own CPU ticks so far)."""
    procs: dict[int, tuple[int, int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    raw = f.read()
            except OSError:
                continue
            fields = raw[raw.rindex(b")") + 2 :].split()
            procs[int(name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[int, tuple[str, int]] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, ()))
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if pid == root:
            role = "driver"
        elif os.path.basename(argv[0]) == "java":
            role = "jvm"
        else:
            role = next((r for r, word in ROLES if word in " ".join(argv)), "other")
        out[pid] = (role, procs[pid][1])
    return out


class RoleSampler:
    """CPU of a driver's process tree by role (:data:`ROLES`) over a run: the tree is read
    every 100 ms from a thread, so a Python worker or runner that ends during the run still
    counts for its role (up to its last sample; the rest is ``unattributed``)."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.first = _tree(root)
        self.last = dict(self.first)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        for pid, (role, ticks) in _tree(self.root).items():
            seen = self.last.get(pid)  # a process keeps the role it was first seen with
            self.last[pid] = (seen[0] if seen else role, ticks)  # (an exited one has no argv)

    def _run(self) -> None:
        while not self.done.wait(0.1):
            self._sample()

    def stop(self, total_ticks: float) -> dict[str, float]:
        """Seconds by role; ``total_ticks``: the tree's whole CPU over the run, in seconds."""
        self.done.set()
        self.thread.join()
        self._sample()
        tick = os.sysconf("SC_CLK_TCK")
        out: dict[str, float] = {}
        for pid, (role, ticks) in self.last.items():
            before = self.first.get(pid, (role, 0))[1]
            out[role] = out.get(role, 0.0) + (ticks - before) / tick
        out["unattributed"] = total_ticks - sum(out.values())
        return out


def _now() -> tuple[float, float]:
    """(wall clock, CPU seconds so far of this driver's process tree: its JVM, the source
    runner, the Python workers; the servers are not in it)."""
    return time.perf_counter(), tree_and_kernel_seconds(os.getpid())[0]


def _into_parquet(df: Any, work: Path, n: int, spark: Any) -> dict[str, Any]:
    sampler = RoleSampler(os.getpid())
    started = _now()
    query = (
        df.writeStream.format("parquet")
        .option("path", str(work / "out"))
        .option("checkpointLocation", str(work / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    now = _now()
    elapsed, cpu = now[0] - started[0], now[1] - started[1]
    roles = sampler.stop(cpu)
    assert query.exception() is None, query.exception()
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in progress)
    assert rows == n, (rows, n)
    assert spark.read.parquet(str(work / "out")).select("id").distinct().count() == n
    return {
        "seconds": round(elapsed, 2),
        "items_per_s": round(n / elapsed),
        "cpu_us_per_item": round(cpu / n * 1e6, 2),
        "cpu_us_per_item_by_role": {k: round(v / n * 1e6, 2) for k, v in sorted(roles.items())},
        "batches": len(progress),
        "load": round(os.getloadavg()[0], 2),
    }


def _files(spark: Any, cmd: dict[str, Any]) -> dict[str, Any]:
    work = Path(cmd["work"])
    write_files(work / "json", cmd["n"], cmd["size"], files=8)
    df = spark.readStream.schema(EVENT_SCHEMA).format("json").load(str(work / "json"))
    return _into_parquet(df, work, cmd["n"], spark)


def _tercel(spark: Any, cmd: dict[str, Any]) -> dict[str, Any]:
    work = Path(cmd["work"])
    reader = spark.readStream.format("tercel").option("servers", cmd["addresses"])
    for key, value in {"queue": "events", **cmd.get("options", {})}.items():
        reader = reader.option(key, value.replace("{work}", str(work)))
    df = (
        reader.load()
        .selectExpr(f"from_json(cast(value as string), '{EVENT_SCHEMA}') as e")
        .select("e.*")
    )
    return _into_parquet(df, work, cmd["n"], spark)


_frames: dict[tuple[int, int], Any] = {}


def _sink(spark: Any, cmd: dict[str, Any]) -> dict[str, Any]:
    n, size = cmd["n"], cmd["size"]
    if (n, size) not in _frames:
        df = spark.range(n).selectExpr(
            f"cast(concat(lpad(cast(id as string), 8, '0'), repeat('x', {size - 8})) "
            "as binary) as value"
        )
        _frames[n, size] = df.repartition(2).cache()
        _frames[n, size].count()
    writer = _frames[n, size].write.format("tercel").option("servers", cmd["addresses"])
    if not cmd["dedup"]:
        writer = writer.option("dedup", "false")
    started = _now()
    writer.option("queue", "out").mode("append").save()
    now = _now()
    return {
        "rows_per_s": round(n / (now[0] - started[0])),
        "cpu_us_per_row": round((now[1] - started[1]) / n * 1e6, 2),
    }


def serve_driver() -> None:
    """``--driver``: a SparkSession; one JSON command per stdin line, one ``RESULT <json>``
    line per command on stdout."""
    from tercel.spark import local_session

    spark = local_session("tercel-bench", {"spark.driver.memory": "2g"})
    ops = {"files": _files, "tercel": _tercel, "sink": _sink}
    print("RESULT " + json.dumps({"parallelism": spark.sparkContext.defaultParallelism}))
    sys.stdout.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        print("RESULT " + json.dumps(ops[cmd["op"]](spark, cmd)), flush=True)
    spark.stop()


class Driver:
    """A ``--driver`` process with ``src`` first on its ``PYTHONPATH``."""

    def __init__(self, name: str, src: Path) -> None:
        self.name = name
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(src), str(BENCH)])
        self.proc = subprocess.Popen(
            [sys.executable, str(BENCH / "spark_bench.py"), "--driver"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.ready = self._result()

    def _result(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("RESULT "):
                result: dict[str, Any] = json.loads(line[7:])
                return result
        raise RuntimeError(f"driver {self.name} ended (exit {self.proc.wait()})")

    def run(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._result()

    def close(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write('{"op": "quit"}\n')
            self.proc.stdin.close()
        except BrokenPipeError:  # it ended already (its error is on stderr)
            pass
        self.proc.wait(120)


# --- this script: servers, drivers, rounds ---------------------------------------------------


def old_source(work: Path, commit: str) -> Path:
    """``src`` of ``commit`` unpacked under ``work``."""
    dest = work / f"src-{commit}"
    dest.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit, "src"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest / "src"


SERVER_ENV: dict[str, str] = {}
"""The servers' environment (``--servers-src``: their ``PYTHONPATH``)."""


def servers_cpu(servers: list[ServerProcess]) -> float:
    """CPU seconds so far of the servers (not part of any driver's tree)."""
    return sum(tree_and_kernel_seconds(s.proc.pid)[0] for s in servers if s.proc is not None)


def run_tercel(driver: Driver, work: Path, n: int, size: int, options: dict[str, str]) -> Any:
    with (
        ServerProcess(work / "s1", env=SERVER_ENV) as a,
        ServerProcess(work / "s2", env=SERVER_ENV) as b,
    ):
        fill_queues([a, b], "events", n, size)
        addresses = f"{a.address},{b.address}"
        before = servers_cpu([a, b])
        got = driver.run(op="tercel", addresses=addresses, work=str(work), n=n, options=options)
        got["servers_cpu_us_per_item"] = round((servers_cpu([a, b]) - before) / n * 1e6, 2)
        return got


def run_sink(driver: Driver, work: Path, n: int, size: int, dedup: bool) -> dict[str, Any]:
    with (
        ServerProcess(work / "w1", env=SERVER_ENV) as a,
        ServerProcess(work / "w2", env=SERVER_ENV) as b,
    ):
        before = servers_cpu([a, b])
        got = driver.run(
            op="sink", addresses=f"{a.address},{b.address}", n=n, size=size, dedup=dedup
        )
        got["servers_cpu_us_per_row"] = round((servers_cpu([a, b]) - before) / n * 1e6, 2)
        with Client([a.address, b.address]) as c:
            stats = c.queue_stats().values()  # a small run may leave one server without "out"
            stored = sum(int(s["out"]["items"]) for s in stats if "out" in s)
        assert stored == n, (stored, n)
        return got


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


OLD_OPTIONS = {"stagingLocation": "{work}/stage"}
"""The old connector stages items on a shared file system (required then)."""


def source_rounds(
    drivers: dict[str, Driver], work: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """Warm-up, then ``--rounds`` of files, tercel (this tree), tercel (old commit)."""
    new = drivers["tercel"]
    new.run(op="files", work=str(work / "warm-files"), n=5000, size=args.size)
    for name, driver in drivers.items():
        run_tercel(driver, work / f"warm-{name}", 5000, args.size, _options(name))
    runs: dict[str, list[dict[str, Any]]] = {"files": [], **{name: [] for name in drivers}}
    for r in range(args.rounds):
        got = new.run(op="files", work=str(work / f"files{r}"), n=args.items, size=args.size)
        runs["files"].append(got)
        note("files", got)
        for name, driver in drivers.items():
            got = run_tercel(driver, work / f"{name}{r}", args.items, args.size, _options(name))
            runs[name].append(got)
            note(name, got)
    result: dict[str, Any] = {"runs": runs}
    for name, values in runs.items():
        result[f"{name}_items_per_s"] = _summary([v["items_per_s"] for v in values])
        result[f"{name}_cpu_us_per_item"] = [v["cpu_us_per_item"] for v in values]
    if "tercel_old" in runs:
        result["tercel_over_old"] = [
            round(t["items_per_s"] / o["items_per_s"], 2)
            for t, o in zip(runs["tercel"], runs["tercel_old"], strict=True)
        ]
    result["tercel_cpu_over_files"] = [
        round(t["cpu_us_per_item"] / f["cpu_us_per_item"], 2)
        for t, f in zip(runs["tercel"], runs["files"], strict=True)
    ]
    return result


def _options(name: str) -> dict[str, str]:
    return OLD_OPTIONS if name == "tercel_old" else {}


def sink_rounds(driver: Driver, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The sink, keys (default) against ``dedup=false``, alternated after a warm-up."""
    n = args.items // 2
    run_sink(driver, work / "wwarm", 5000, args.size, True)
    rates: dict[str, list[dict[str, Any]]] = {"keys": [], "no_keys": []}
    for r in range(args.rounds):
        rates["no_keys"].append(run_sink(driver, work / f"wn{r}", n, args.size, False))
        rates["keys"].append(run_sink(driver, work / f"wk{r}", n, args.size, True))
        note("sink", {k: v[-1] for k, v in rates.items()})
    keys = [v["rows_per_s"] for v in rates["keys"]]
    plain = [v["rows_per_s"] for v in rates["no_keys"]]
    return {
        "rows": n,
        "runs": rates,
        "keys_rows_per_s": _summary(keys),
        "no_keys_rows_per_s": _summary(plain),
        "keys_cost": [round(1 - k / p, 3) for k, p in zip(keys, plain, strict=True)],
    }


def main() -> None:
    if sys.argv[1:] == ["--driver"]:
        serve_driver()
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=400_000)
    parser.add_argument("--size", type=int, default=200, help="event bytes (about)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--old-commit", default="1f1f505", help="the connector to compare")
    parser.add_argument("--no-old", action="store_true", help="skip the old connector")
    parser.add_argument("--skip-writer", action="store_true")
    parser.add_argument("--skip-source", action="store_true")
    parser.add_argument(
        "--servers-src",
        metavar="DIR",
        help="run the servers from this src (e.g. a compiled copy); default: this tree's",
    )
    args = parser.parse_args()
    if args.servers_src:
        SERVER_ENV["PYTHONPATH"] = str(Path(args.servers_src).resolve())
    work = Path(tempfile.mkdtemp(prefix="tercel-spark-bench-"))
    result: dict[str, Any] = {
        "servers_src": args.servers_src or str(REPO / "src"),
        "items": args.items,
        "size": len(events(0, 1, args.size)[0]),
        "cores": os.cpu_count(),
        "load_before": os.getloadavg()[0],
    }
    drivers = {"tercel": Driver("tercel", REPO / "src")}
    if not args.no_old and not args.skip_source:
        result["old_commit"] = args.old_commit
        drivers["tercel_old"] = Driver("tercel_old", old_source(work, args.old_commit))
    result["spark_default_parallelism"] = drivers["tercel"].ready["parallelism"]
    try:
        if not args.skip_source:
            result["source"] = source_rounds(drivers, work, args)
        if not args.skip_writer:
            result["sink"] = sink_rounds(drivers["tercel"], work, args)
    finally:
        for driver in drivers.values():
            driver.close()
        shutil.rmtree(work, ignore_errors=True)
    result["load_after"] = os.getloadavg()[0]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
