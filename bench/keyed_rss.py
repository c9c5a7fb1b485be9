"""RSS of a tercel server on a queue of N items of 1 KiB, without and then with a keyed lease
of all N open (docs/journal_format.md §18, "Measured").

Fills queue ``q`` in DIR through the core, starts a server on DIR and reads its RSS once the
queue is replayed; then takes every item into keyed lease ``big`` through the core (printing
the taking process's RSS before and after) and starts a server on DIR again.

Usage: ``python bench/keyed_rss.py DIR N`` (DIR is created; it needs 2 x N KiB of disk).
"""

from __future__ import annotations

import os
import socket
import sys
import time

from tercel.clock import SystemClock
from tercel.config import QueueConfig
from tercel.storage import open_queue
from tercel.testing import ServerProcess


def rss_mib(pid: int) -> int:
    """The resident set of process ``pid``, MiB."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    return -1


def server_rss(data: str, label: str) -> None:
    """Start a server on ``data``, wait for queue ``q``'s replay, print its RSS."""
    srv = ServerProcess(data).start(timeout=600)
    try:
        with socket.create_connection(("127.0.0.1", srv.port)) as s:
            s.sendall(b"get q/peek\r\n")  # answered once q is replayed
            buf = b""
            while not buf.endswith(b"END\r\n"):
                buf += s.recv(65536)
        time.sleep(1)
        assert srv.proc is not None
        print(f"{label}: server RSS {rss_mib(srv.proc.pid)} MiB", flush=True)
    finally:
        srv.stop()


def main(data: str, n: int) -> None:
    os.makedirs(data, exist_ok=True)
    q = open_queue(data, "q", QueueConfig(), SystemClock())
    q.replay()
    payload = b"x" * 1024
    start = time.time()
    for i in range(n):
        q.add(payload, maintain=not i % 4096)
    print(f"filled {n} in {time.time() - start:.1f} s", flush=True)
    q.close()
    server_rss(data, "without a keyed lease")
    q = open_queue(data, "q", QueueConfig(), SystemClock())
    q.replay()
    before = rss_mib(os.getpid())
    start = time.time()
    lease = q.take_keyed("big", n, 0, int(time.time() * 1000))
    assert lease is not None and lease.count == n
    took = time.time() - start
    print(f"took {n} in {took:.1f} s; RSS {before} -> {rss_mib(os.getpid())} MiB", flush=True)
    q.close()
    server_rss(data, f"with a keyed lease of {n} items open")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
