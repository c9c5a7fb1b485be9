"""How long one queue's replay holds the event loop, and what replaying in steps costs (issue 24).

Builds (once, in ``--dir``) a queue of ``--items`` items of ``--size`` bytes with no checkpoint
(a data dir from before checkpoints: every record is replayed), then replays it in a fresh
process per run, alternating two ways:

- ``whole``: ``QueueCollection.load`` — the queue's whole replay in one call, as a command's
  first reference does (and as the background replay did before session 12);
- ``slices``: ``QueueCollection.replay_slice`` with the server's 5 ms slice, as the background
  replay runs now; between two slices the loop would serve other commands.

Each run prints one JSON line: wall seconds, CPU seconds, the number of calls, the longest call
(the longest the loop is held: for ``whole`` the whole replay) in wall and in CPU time (on a
busy host the wall time of a call includes the time the process waited for a CPU), and the
process's peak RSS.
``--only whole`` runs just that way, e.g. with ``PYTHONPATH`` pointing at an older tree for a
before/after comparison (``load`` exists in both).

Usage: ``.venv/bin/python bench/replay_steps.py [--items 1000000] [--size 64] [--runs 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

SLICE_S = 0.005


def build(data_dir: Path, items: int, size: int) -> None:
    """Fill queue ``q`` and remove its checkpoint."""
    from tercel.clock import SystemClock
    from tercel.config import ServerConfig
    from tercel.storage import open_queue

    data_dir.mkdir(parents=True, exist_ok=True)
    q = open_queue(str(data_dir), "q", ServerConfig().queue_config("q"), SystemClock())
    q.replay()
    payload = b"x" * size
    for _ in range(items):
        q.add(payload)
    q.close()
    (data_dir / "q.checkpoint").unlink(missing_ok=True)


def replay(data_dir: Path, how: str) -> dict[str, object]:
    """Replay ``data_dir``'s queues one way (in this process); the figures."""
    from tercel.clock import SystemClock
    from tercel.config import ServerConfig
    from tercel.core.collection import QueueCollection
    from tercel.storage import DataDir, open_log

    config = ServerConfig()
    files = DataDir(str(data_dir))
    coll = QueueCollection(
        config, lambda n, c: open_log(str(data_dir), n, c, directory=files), SystemClock()
    )
    names = files.queue_names()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    calls = 0
    longest = longest_cpu = 0.0
    if how == "whole":
        coll.load(names)
        calls = 1
        longest = time.perf_counter() - t0
        longest_cpu = time.process_time() - cpu0
    else:
        coll.defer(names)
        clock = time.monotonic
        while True:
            c0, p0 = time.perf_counter(), time.process_time()
            done = coll.replay_slice(clock, clock() + SLICE_S)
            longest = max(longest, time.perf_counter() - c0)
            longest_cpu = max(longest_cpu, time.process_time() - p0)
            calls += 1
            if done is None:
                break
    wall = time.perf_counter() - t0
    q = coll.queue("q")
    assert q is not None
    return {
        "how": how,
        "items": len(q),
        "wall_s": round(wall, 3),
        "cpu_s": round(time.process_time() - cpu0, 3),
        "calls": calls,
        "longest_ms": round(longest * 1000, 1),
        "longest_cpu_ms": round(longest_cpu * 1000, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path("replay-steps-data"))
    ap.add_argument("--only", choices=("whole", "slices"), default=None)
    ap.add_argument("--child", choices=("whole", "slices"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(replay(a.dir, a.child)), flush=True)
        return
    if not (a.dir / "q").exists():
        build(a.dir, a.items, a.size)
    ways = [a.only] if a.only else ["whole", "slices"]
    for run in range(a.runs):
        for how in ways if run % 2 == 0 else ways[::-1]:
            argv = [sys.executable, __file__, "--dir", str(a.dir), "--child", how]
            subprocess.run(argv, check=True, env=dict(os.environ))


if __name__ == "__main__":
    main()
