"""What one checkpoint costs the event loop (issue 24), in-process.

A checkpoint (docs/journal_format.md §16) is written on the loop, once per 16 MB appended,
inside the queue's log maintenance: a pass over the items in memory (each must follow the one
before, never delivered), the records written out, an ``fdatasync`` when the journal's owner
syncs it (``sync_journal`` true or a period), the walk from the last mark to the head's ADD
record, a crc32 over the last 4 KiB, and a small file written and renamed.

This script fills a queue over its real file journal (write-through, as the tools use it; in
the server the group commit writes the same bytes) with ``--items`` items of ``--size``
bytes, then times ``--rounds`` checkpoints, each after another 16 MB appended, first as an
unsynced journal, then after a sync (each checkpoint then pays an ``fdatasync`` of what the
16 MB left unsynced). Prints one JSON line per mode: min, median and max milliseconds (wall:
what the loop is held), and the median CPU milliseconds (the rest is waiting: for the disk,
or for a CPU on a busy host).

Usage: ``.venv/bin/python bench/checkpoint_cost.py [--items 131072] [--size 1024]``.

``--load`` measures what checkpoints do to the latency clients see instead: enqueue of
``--size`` bytes at ``--conns`` connections, depth 1 (``bench/loadgen.py``), against the
server started as the suite starts it (``bench/servers.py``: ``--servers`` names its
configurations), with checkpoints as they are and with none (the server started through this
script, which sets ``CHECKPOINT_EVERY`` beyond reach before running ``tercel``), alternated
``--rounds`` times in one run. Prints one JSON line per cell (ops/s, p50/p99/p99.9 µs,
checkpoints written) and a summary line per configuration: the p99 and p99.9 ratios, with
checkpoints over without, median and range. ``TERCEL_CMD`` names the tercel to run, as for
the suite.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

from tercel.clock import SystemClock
from tercel.config import ServerConfig
from tercel.journal.journal import CHECKPOINT_EVERY, FileJournal
from tercel.storage import open_queue


def run(items: int, size: int, rounds: int, synced: bool, data_dir: str) -> dict[str, object]:
    cfg = ServerConfig().queue_config("q")
    q = open_queue(data_dir, "q", cfg, SystemClock())
    q.replay()
    log = q.log
    assert isinstance(log, FileJournal)
    payload = b"x" * size
    for _ in range(items):
        q.add(payload)
    per_round = max(1, CHECKPOINT_EVERY // size)
    times = []
    cpu = []
    for _ in range(rounds):
        for _ in range(per_round):  # 16 MB more: past the window, on disk (read-behind)
            q.add(payload)
        if synced:
            log.sync()
            for _ in range(per_round):  # what the next sync would have to write out
                q.add(payload)
        t0, c0 = time.perf_counter(), time.process_time()
        ok = q.checkpoint()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        assert ok, "no checkpoint written"
    q.close()
    ms = sorted(t * 1000 for t in times)
    return {
        "mode": "synced" if synced else "unsynced",
        "items_in_memory": len(q._items),
        "size": size,
        "rounds": rounds,
        "min_ms": round(ms[0], 2),
        "median_ms": round(statistics.median(ms), 2),
        "max_ms": round(ms[-1], 2),
        "cpu_median_ms": round(statistics.median(cpu) * 1000, 2),
    }


NO_CHECKPOINTS = "--serve-without-checkpoints"
"""This script's first argument when it runs ``tercel`` with checkpoints off (``--load``)."""


def serve_without_checkpoints(argv: list[str]) -> int:
    """Run ``tercel ARGV`` with no checkpoint ever due (only the one at a clean stop)."""
    from tercel.journal import journal

    journal.CHECKPOINT_EVERY = 1 << 62
    from tercel.cli import main as tercel_main

    return tercel_main(argv)


def load(a: argparse.Namespace) -> None:
    """The ``--load`` measurement (see the module docstring)."""
    import os
    import shlex
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import loadgen
    import servers

    base = servers.tercel_command()
    assert base, "no tercel to run: set TERCEL_CMD"
    python = base[0] if base[1:3] == ["-m", "tercel"] else sys.executable
    without = [python, str(Path(__file__).resolve()), NO_CHECKPOINTS]
    defs = servers.SERVERS
    work = Path(tempfile.mkdtemp(prefix="tercel-ckpt-load-", dir=".")).resolve()
    ratios: dict[str, dict[str, list[float]]] = {}
    for rnd in range(a.rounds):
        for name in a.servers.split(","):
            order = [True, False] if rnd % 2 == 0 else [False, True]
            cells = {}
            for with_ckpt in order:
                os.environ["TERCEL_CMD"] = shlex.join(base if with_ckpt else without)
                srv = servers.start(defs[name], work, a.server_cpu)
                try:
                    spec = loadgen.LoadSpec(
                        proto="mc",
                        port=srv.port,
                        op="enqueue",
                        size=a.size,
                        conns=a.conns,
                        depth=1,
                        duration=a.duration,
                        cpu=a.client_cpu,
                    )
                    res = loadgen.run_load(spec, srv.pid)
                    appended = sum(f.stat().st_size for f in srv.data_dir.glob("q*"))
                finally:
                    srv.cleanup()
                cell = {
                    "server": name,
                    "checkpoints": with_ckpt,
                    "round": rnd,
                    "ops_per_s": round(res.ops_per_s),
                    "p50_us": res.p50_us,
                    "p99_us": res.p99_us,
                    "p999_us": res.p999_us,
                    "errors": res.errors,
                    "checkpoints_due": appended // CHECKPOINT_EVERY if with_ckpt else 0,
                }
                cells[with_ckpt] = cell
                print(json.dumps(cell), flush=True)
            r = ratios.setdefault(name, {"p99": [], "p999": [], "ops": []})
            r["p99"].append(cells[True]["p99_us"] / cells[False]["p99_us"])
            r["p999"].append(cells[True]["p999_us"] / cells[False]["p999_us"])
            r["ops"].append(cells[True]["ops_per_s"] / cells[False]["ops_per_s"])
    for name, r in ratios.items():
        spread = {
            k: {
                "median": round(statistics.median(v), 2),
                "min": round(min(v), 2),
                "max": round(max(v), 2),
            }
            for k, v in r.items()
        }
        print(json.dumps({"server": name, "with_over_without": spread}), flush=True)


def main() -> None:
    import sys

    if sys.argv[1:2] == [NO_CHECKPOINTS]:
        raise SystemExit(serve_without_checkpoints(sys.argv[2:]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=131072, help="items before the first round")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--load", action="store_true", help="p99 of enqueue, with and without")
    ap.add_argument("--servers", default="tercel-nosync,tercel-50ms,tercel-sync")
    ap.add_argument("--conns", type=int, default=32)
    ap.add_argument("--duration", type=float, default=3.0, help="measured seconds per cell")
    ap.add_argument("--server-cpu", type=int, default=1)
    ap.add_argument("--client-cpu", type=int, default=0)
    a = ap.parse_args()
    if a.load:
        load(a)
        return
    for synced in (False, True):
        with tempfile.TemporaryDirectory(prefix="tercel-ckpt-", dir=".") as d:
            print(json.dumps(run(a.items, a.size, a.rounds, synced, d)), flush=True)


if __name__ == "__main__":
    main()
