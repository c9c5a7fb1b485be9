"""A server's CPU per operation split into user and kernel (system) time (issue 19).

The suite reports a server's whole CPU per operation; this says where it goes. For each
server named (``bench/servers.py``, e.g. ``beanstalkd,tercel-bs-50ms``) and each cell, it
starts the server fresh on CPU 1, runs ``bench/loadgen.py``'s load on CPU 0 with no warm-up
(so the CPU read from ``/proc/<pid>/stat`` before and after covers exactly the counted
operations), and prints the server's user and system µs per operation. ``--rounds`` repeats
the whole list, servers alternating. Linux only; timing, so run it on a quiet host.

Usage: ``.venv/bin/python bench/user_sys.py --servers beanstalkd,tercel-bs-50ms --rounds 2``
(tercel runs as ``TERCEL_CMD``, default the venv's ``python -m tercel``: build with ``make
native`` first to measure the compiled server).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import loadgen
import servers
from procstat import user_system_seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--servers", default="beanstalkd,tercel-bs-50ms,beanstalkd-f0,tercel-bs-sync")
    ap.add_argument("--cells", default="mixed:32,enqueue:1", help="OP:CONNS,... (protocol bs)")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    os.environ.setdefault("TERCEL_CMD", f"{sys.executable} -m tercel")
    cells = [(op, int(c)) for op, c in (x.split(":") for x in a.cells.split(","))]
    work = Path(tempfile.mkdtemp(prefix="tercel-usersys-"))
    print("| round | server | cell | ops/s | user µs/op | system µs/op | total |")
    print("|---|---|---|---|---|---|---|")
    try:
        for r in range(1, a.rounds + 1):
            for name in a.servers.split(","):
                for op, conns in cells:
                    row = _measure(name, op, conns, a, work)
                    print(f"| {r} | {name} | {op} c={conns} | {row} |", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _measure(name: str, op: str, conns: int, a: argparse.Namespace, work: Path) -> str:
    """One cell on a fresh server ``name``: ops/s and µs per op (user, system, total)."""
    run = servers.start(servers.SERVERS[name], work, 1)
    try:
        spec = loadgen.LoadSpec(
            proto="bs", port=run.port, op=op, size=a.size, conns=conns,
            warmup=0.0, duration=a.duration, cpu=0,
        )  # fmt: skip
        u0, s0 = user_system_seconds(run.pid)
        res = loadgen.run_load(spec)
        u1, s1 = user_system_seconds(run.pid)
    finally:
        run.cleanup()
    n = max(1, res.ops)
    user, system = 1e6 * (u1 - u0) / n, 1e6 * (s1 - s0) / n
    return f"{res.ops_per_s:,.0f} | {user:.2f} | {system:.2f} | {user + system:.2f}"


if __name__ == "__main__":
    main()
