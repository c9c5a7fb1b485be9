"""``make soak`` and ``make fuzz`` still run: a few-second run of each (docs/reliability.md).

The long runs are separate commands; this only keeps their tools from rotting. The soak's
accounting is asserted (a lost acknowledged item is a failure however short the run); the
server fuzz is asserted to have run and written its summary, since what it finds is reported
by ``make fuzz`` itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def run(script: str, tmp_path: Path, *args: str) -> tuple[int, dict[str, object]]:
    out = tmp_path / "summary.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / script),
            "--data-dir",
            str(tmp_path / "data"),
            "--out",
            str(out),
            "--seed",
            "7",
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert out.exists(), proc.stderr[-3000:]
    return proc.returncode, json.loads(out.read_text())


def test_a_short_soak_accounts_for_every_item(tmp_path: Path) -> None:
    code, summary = run("soak.py", tmp_path, "--seconds", "4")
    assert code == 0 and summary["ok"], summary
    assert summary["kills"] >= 1 and summary["startup_failures"] == 0
    queues = summary["queues"]
    assert isinstance(queues, dict)
    for stats in queues.values():
        assert stats["acknowledged"] > 0 and stats["unexplained_lost"] == 0
        assert stats["duplicate_completed"] == 0 and stats["phantom"] == 0


def test_a_short_soak_with_injected_faults_accounts_for_every_item(tmp_path: Path) -> None:
    code, summary = run("soak.py", tmp_path, "--seconds", "5", "--faults")
    assert code == 0 and summary["ok"], summary
    faults = summary["faults"]
    assert isinstance(faults, dict) and sum(faults.values()) >= 2
    assert summary["unexpected_exits"] == [] and summary["startup_failures"] == 0


def test_a_short_soak_out_of_descriptors_accounts_for_every_item(tmp_path: Path) -> None:
    code, summary = run("soak.py", tmp_path, "--seconds", "5", "--emfile")
    assert code == 0 and summary["ok"], summary
    journal = summary["journal"]
    assert isinstance(journal, dict) and journal["journal_files_evictions"] > 0
    queues = summary["queues"]
    assert isinstance(queues, dict) and queues["soak_many"]["unexplained_lost"] == 0


def test_a_short_server_fuzz_runs(tmp_path: Path) -> None:
    _, summary = run("fuzz.py", tmp_path, "--seconds", "2", "--connections", "2")
    assert isinstance(summary["requests"], int) and summary["requests"] > 0
    assert isinstance(summary["connections"], int) and summary["connections"] > 0
    assert "distinct_tracebacks" in summary
