"""Every benchmark tool in bench/ still runs: a few-second run of each against tercel alone.

The benchmarks themselves (``make bench``, docs/benchmarks.md) are never part of pass/fail;
this only checks that the tools (the suite's load generator, server control and report, and
the standalone scripts) work end to end, so they do not rot between runs. No figure is
asserted, only that every run finished cleanly and printed what docs/benchmarks.md quotes. A
busy host's runs are run again (``--rerun-noisy``); forcing every run to count as noisy checks
which attempt is kept.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_quick_suite_runs_cleanly_against_tercel(tmp_path: Path) -> None:
    out = tmp_path / "quick.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "suite.py"),
            "--quick",
            "--servers",
            "tercel-nosync,tercel-sync",
            "--scenarios",
            "enqueue,mixed,dequeue",
            "--rerun-noisy=-1",  # every run counts as noisy: each is run exactly twice
            "--max-reruns=1",
            "--out",
            str(out),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["scenario"] for r in records} == {"enqueue", "mixed", "dequeue"}
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        runs.setdefault((r["cell"], r["server"]), []).append(r)
    for attempts in runs.values():  # the quieter attempt counts, and is written last
        assert [r["status"] for r in attempts] == ["noisy", "ok"], attempts
        noise = [r["other_cpu_s"] / r["elapsed_s"] for r in attempts]
        assert noise[1] <= noise[0]
    for r in records:
        assert r["errors"] == 0, r  # misses are allowed: a quick dequeue may drain its fill
        assert r["ops"] > 0 and r["server_cpu_s"] >= 0 and r["client_cpu_s"] >= 0, r
        assert r["p50_us"] <= r["p99_us"] <= r["p999_us"], r
    # CPU is read in clock ticks (10 ms): one short run on a busy host can read 0, the whole
    # quick suite cannot.
    assert sum(r["server_cpu_s"] for r in records) > 0
    assert sum(r["client_cpu_s"] for r in records) > 0
    header = (
        "| server | class | ops/s | p50 | p99 | p99.9 | server CPU µs/op | client CPU µs/op "
        "| peak RSS | errors | noise |"
    )
    assert header in proc.stdout
    report = out.with_suffix(".md").read_text()
    assert "## Goals in this run" in report and header in report
    assert "Command:" in report and "- tercel commit: " in report


def bench(*args: str, timeout: float = 300) -> str:
    """Runs ``bench/<args>`` with this interpreter; its stdout (fails on a non-zero exit)."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / args[0]), *args[1:]],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def test_readbehind_drains_a_backlog_past_the_memory_window_in_order() -> None:
    out = bench(
        "readbehind.py",
        "--gigabytes",
        "0.003",
        "--memory",
        "1MB",
        "--markdown",
        "--baseline-items",
        "1000",
    )
    phases = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [p["label"] for p in phases] == ["read-behind", "in-memory"]
    assert phases[0]["items"] == 3145 and phases[0]["drain_items_per_s"] > 0
    assert "read-behind drain rate / in-memory drain rate" in out


def test_manyqueues_creates_restarts_and_checks_every_queue() -> None:
    out = bench("manyqueues.py", "--queues", "300", "--open-files", "64")
    (run,) = json.loads(out.splitlines()[-1])["runs"]
    assert run["create_s"] > 0 and run["restart_s"] > 0 and run["rss_restarted_mb"] > 0


def test_instr_per_cmd_harness_drives_the_server_in_process() -> None:
    # The counted part without valgrind: what callgrind would run, a few passes of each.
    for op in ("set", "get"):
        bench("instr_per_cmd.py", "--child", op, "3", "--per-read", "16")
    bench("instr_per_cmd.py", "--child", "set", "3", "--per-read", "2", "--vary")


def test_spark_bench_starts_and_fills_its_queues(tmp_path: Path) -> None:
    # A Spark session takes minutes on a loaded 2-core machine: the whole script is run by
    # hand (docs/spark.md §5); this checks that it imports and that its fill (client, server
    # and event helpers) still works.
    pytest.importorskip("pyspark")
    assert "--skip-writer" in bench("spark_bench.py", "--help")
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import spark_bench as b;"
        "from tercel.client import Client;"
        "s = b.ServerProcess(sys.argv[2]).start();"
        "b.fill_queues([s], 'ev', 7, 100);"
        "c = Client(s.address); q = c.queue_stats().values();"
        "print(sum(int(x['ev']['items']) for x in q), len(b.events(0, 1, 100)[0]));"
        "c.close(); s.stop()"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(BENCH), str(tmp_path / "data")],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert out.split() == ["7", "100"]
