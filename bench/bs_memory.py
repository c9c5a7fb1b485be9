"""Memory per job: N ready jobs of S bytes in beanstalkd and in ``tercel beanstalkd``.

    .venv/bin/python bench/bs_memory.py [--jobs 1000000] [--size 100] [--servers A,B]

Each server starts fresh with ``-b`` (a job log in a temp dir), receives the jobs through
pipelined ``put``s (batches of 1000) on one connection, and the script reports its resident
set (VmRSS) before and after, and the difference per job. beanstalkd keeps every job in memory,
and so does tercel's beanstalk front end (no read-behind for tubes: a priority order needs every
job at hand); the per-job figure is the cost of that.
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
from pathlib import Path

import servers


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def fill(port: int, jobs: int, size: int) -> None:
    """Put ``jobs`` jobs of ``size`` bytes, 1000 per pipelined batch, and read every reply."""
    body = b"x" * size
    put = b"put 1024 0 60 %d\r\n%s\r\n" % (size, body)
    with socket.create_connection(("127.0.0.1", port)) as s:
        done = 0
        buf = b""
        while done < jobs:
            n = min(1000, jobs - done)
            s.sendall(put * n)
            got = 0
            while got < n:
                buf += s.recv(1 << 20)
                lines = buf.split(b"\r\n")
                buf = lines.pop()
                for line in lines:
                    if not line.startswith(b"INSERTED"):
                        raise RuntimeError(f"unexpected reply {line!r}")
                    got += 1
            done += n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--servers", default="beanstalkd,tercel-bs-50ms")
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bs-memory-"))
    print("| server | RSS before | RSS after | per job |")
    print("|---|---|---|---|")
    for name in a.servers.split(","):
        run = servers.start(servers.SERVERS[name], work, None)
        try:
            time.sleep(0.5)
            before = _rss_kb(run.pid)
            fill(run.port, a.jobs, a.size)
            time.sleep(0.5)
            after = _rss_kb(run.pid)
        finally:
            run.cleanup()
        per_job = (after - before) * 1024 / a.jobs
        print(f"| {name} | {before / 1024:.1f} MB | {after / 1024:.1f} MB | {per_job:.0f} B |")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
