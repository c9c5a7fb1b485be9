"""Many queues: create N queues of a few items each, then restart; time and memory.

Issue 21's goal: under ``ulimit -n 1024``, 100,000 queues of a few items each are created in
under 20 s, restart in under 10 s, and hold under 300 MB RSS. Each queue is one file in the
data dir; before the single directory listing, each queue's replay listed the whole directory
(restart time grew with the square of the queue count) and each queue held its journal file
open (about the 1,007th queue failed with EMFILE).

    python bench/manyqueues.py [--queues 100000] [--items 3] [--open-files 1024] [--repeat 1]

What is timed:
- *create*: one client, pipelined ``set`` of ``--items`` 16-byte items to each of
  ``--queues`` distinct queues (batches of 1,000 commands), from the first byte sent to the
  last ``STORED`` read;
- *restart*: SIGKILL, ``sync`` (the writeback of the 100,000 new files is not the restart's),
  then ``tercel serve`` again on the same data dir: from the exec to the ports file
  (*listening*: the server lists the data dir and serves, and replays the queues in the
  background), and to its log line ``replayed N queue(s)`` (*replayed*: every queue in
  memory; the log is polled every 50 ms, not ``stats``, whose per-queue lines for 100,000
  queues would load the server); then one ``get`` per hundredth queue checks the items are
  there;
- *RSS*: the server's resident set (``/proc/<pid>/status`` VmRSS) after creating, and once
  every queue is replayed after the restart;
- *server CPU*: user + system time of the server process over each phase (``/proc/<pid>/stat``),
  the fairer figure on a shared host, where wall time includes waiting for a CPU.

The server runs under ``ulimit -n`` of ``--open-files`` (soft and hard limit, so it cannot
raise it) through :class:`tercel.testing.ServerProcess`. Prints one line per phase and a JSON
summary.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

import procstat
from tercel.testing import ServerProcess

BATCH = 1000


def rss_mb(pid: int) -> float:
    """Resident set of ``pid`` in MB (VmRSS)."""
    return procstat.rss_kb(pid) / 1024


def cpu_s(pid: int) -> float:
    """CPU time (user + system) ``pid`` has used so far, in seconds."""
    return sum(procstat.user_system_seconds(pid))


def read_replies(sock: socket.socket, count: int, buf: bytes) -> bytes:
    """Read until ``count`` ``STORED`` lines arrived; the bytes after them."""
    while buf.count(b"\r\n") < count:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise SystemExit("the server closed the connection")
        buf += chunk
    lines = buf.split(b"\r\n")
    bad = [x for x in lines[:count] if x != b"STORED"]
    if bad:
        raise SystemExit(f"unexpected reply {bad[0]!r}")
    return b"\r\n".join(lines[count:])


def create(sock: socket.socket, queues: int, items: int) -> float:
    """Pipelined sets to every queue; the seconds taken."""
    t0 = time.perf_counter()
    rest = b""
    names = [b"mq%06d" % i for i in range(queues)]
    for start in range(0, queues, BATCH):
        chunk = names[start : start + BATCH]
        data = b"".join(
            b"set %s 0 0 16\r\n%s%s\r\n" % (n, n, b"%08d" % k) for k in range(items) for n in chunk
        )
        sock.sendall(data)
        rest = read_replies(sock, len(chunk) * items, rest)
    return time.perf_counter() - t0


REPLAYED = re.compile(r"replayed (\d+) queue\(s\), \d+ items in ([\d.]+)s")
"""The server's log line once every queue on disk is replayed."""


def wait_replayed(srv: ServerProcess) -> float:
    """Wait for the server's log to say every queue is replayed (polled every 50 ms: the
    server now serves first and replays in the background; before, the line came before it
    listened); the replay time it logs."""
    while True:
        found = REPLAYED.search(srv.log())
        if found:
            return float(found.group(2))
        if not srv.running:
            raise SystemExit("the server stopped during the replay")
        time.sleep(0.05)


def check(sock: socket.socket, queues: int, items: int) -> None:
    """One ``get`` per thousandth queue returns its first item."""
    for i in range(0, queues, max(1, queues // 100)):
        name = b"mq%06d" % i
        sock.sendall(b"get %s\r\n" % name)
        want = b"VALUE %s 0 16\r\n%s%08d\r\nEND\r\n" % (name, name, 0)
        got = b""
        while len(got) < len(want):
            got += sock.recv(4096)
        if got != want:
            raise SystemExit(f"queue {name!r}: {got!r}")


def run(queues: int, items: int, open_files: int) -> dict[str, float]:
    data = Path(tempfile.mkdtemp(prefix="tercel-manyqueues-"))
    try:
        with ServerProcess(data, open_files=open_files, log_level="info") as srv:
            assert srv.proc is not None
            sock = srv.connect(timeout=600)
            cpu0 = cpu_s(srv.proc.pid)
            created = create(sock, queues, items)
            sock.close()
            cpu_created = cpu_s(srv.proc.pid) - cpu0
            rss_created = rss_mb(srv.proc.pid)
            print(
                f"create  {queues} queues x {items} items: {created:.2f} s",
                f"(server CPU {cpu_created:.2f} s), RSS {rss_created:.0f} MB",
            )
            srv.kill()
            os.sync()  # the killed server's files reach the disk first: not timed as restart
            t0 = time.perf_counter()
            srv.start(timeout=600)
            listening = time.perf_counter() - t0
            replay_logged = wait_replayed(srv)
            restarted = time.perf_counter() - t0
            cpu_restarted = cpu_s(srv.proc.pid)  # from exec to every queue replayed
            rss_restarted = rss_mb(srv.proc.pid)
            print(
                f"restart {queues} queues: listening {listening:.2f} s, replayed",
                f"{restarted:.2f} s (server CPU {cpu_restarted:.2f} s; its log: replay",
                f"{replay_logged:.2f} s), RSS {rss_restarted:.0f} MB",
            )
            sock = srv.connect(timeout=60)
            check(sock, queues, items)
            sock.close()
        return {
            "create_s": round(created, 2),
            "create_cpu_s": round(cpu_created, 2),
            "listening_s": round(listening, 2),
            "restart_s": round(restarted, 2),
            "replay_logged_s": replay_logged,
            "restart_cpu_s": round(cpu_restarted, 2),
            "rss_created_mb": round(rss_created),
            "rss_restarted_mb": round(rss_restarted),
        }
    finally:
        shutil.rmtree(data, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queues", type=int, default=100_000)
    parser.add_argument("--items", type=int, default=3)
    parser.add_argument("--open-files", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)
    results = [run(args.queues, args.items, args.open_files) for _ in range(args.repeat)]
    print(json.dumps({"queues": args.queues, "items": args.items, "runs": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
