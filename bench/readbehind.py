"""Read-behind under load: fill a queue far past its memory window, drain it, watch RSS.

Starts ``tercel serve`` (pinned to CPU 1 when there are two CPUs) with
``max_memory_size`` set small (16 MB by default), enqueues ``--gigabytes`` of ``--size``-byte
items over one pipelined connection, then drains them with pipelined plain gets, sampling the
server's RSS (``VmRSS``) every 100 ms throughout. Every item carries its sequence number; the
drain checks that each comes out exactly once, in order. For comparison it then measures the
drain rate of an in-memory queue (a backlog that fits the window) on a fresh server.

Prints one JSON line per phase and, with ``--markdown``, a table for docs/benchmarks.md.
Usage: ``.venv/bin/python bench/readbehind.py --gigabytes 2`` (about 2 minutes here).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import procstat
from tercel.testing import ServerProcess

REPO = Path(__file__).resolve().parent.parent
DEPTH = 64


def _rss_mb(pid: int) -> float:
    try:
        return procstat.rss_kb(pid) / 1024
    except OSError:
        return 0.0


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its threads so far (0.0 if gone)."""
    try:
        return sum(procstat.user_system_seconds(pid))
    except OSError:
        return 0.0


class Sampler(threading.Thread):
    """Samples a process's RSS every 100 ms until stopped; keeps the peak."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0.0
        self.samples: list[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.1):
            rss = _rss_mb(self.pid)
            self.samples.append(rss)
            self.peak = max(self.peak, rss)


def start_server(data: Path, memory: str) -> ServerProcess:
    """``tercel serve`` with ``max_memory_size = memory``, pinned to CPU 1 when there are two."""
    launcher: tuple[str, ...] = (sys.executable, "-m", "tercel")
    if (os.cpu_count() or 1) > 1 and shutil.which("taskset"):
        launcher = ("taskset", "-c", "1", *launcher)
    config = f'[queues]\nmax_memory_size = "{memory}"\n'
    return ServerProcess(data, config, launcher=launcher).start(timeout=60)


def _read_until(sock: socket.socket, buf: bytearray, count: int, token: bytes) -> None:
    while buf.count(token) < count:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise RuntimeError("server closed the connection")
        buf += chunk


def fill(port: int, n: int, size: int) -> float:
    """Enqueue n items (pipelined); the elapsed seconds."""
    sock = socket.create_connection(("127.0.0.1", port))
    pad = b"x" * (size - 12)
    t0 = time.monotonic()
    buf = bytearray()
    for start in range(0, n, DEPTH):
        k = min(DEPTH, n - start)
        batch = b"".join(
            b"set q 0 0 %d\r\n%012d%s\r\n" % (size, i, pad) for i in range(start, start + k)
        )
        sock.sendall(batch)
        _read_until(sock, buf, k, b"STORED\r\n")
        del buf[: k * 8]
    sock.close()
    return time.monotonic() - t0


def drain(port: int, n: int, size: int) -> float:
    """Dequeue n items (pipelined plain gets), checking order; the elapsed seconds."""
    sock = socket.create_connection(("127.0.0.1", port))
    head = b"VALUE q 0 %d\r\n" % size
    rec = len(head) + size + 7
    t0 = time.monotonic()
    buf = bytearray()
    expect = 0
    while expect < n:
        k = min(DEPTH, n - expect)
        sock.sendall(b"get q\r\n" * k)
        while len(buf) < k * rec:
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise RuntimeError("server closed the connection")
            buf += chunk
        for j in range(k):
            off = j * rec
            if buf[off : off + len(head)] != head:
                raise RuntimeError(
                    f"item {expect}: unexpected reply {bytes(buf[off : off + 40])!r}"
                )
            seq = int(buf[off + len(head) : off + len(head) + 12])
            if seq != expect:
                raise RuntimeError(f"expected item {expect}, got {seq}")
            expect += 1
        del buf[: k * rec]
    sock.sendall(b"get q\r\n")
    if sock.recv(16) != b"END\r\n":
        raise RuntimeError("queue not empty after the drain")
    sock.close()
    return time.monotonic() - t0


def run(n: int, size: int, memory: str, label: str) -> dict[str, object]:
    results = REPO / "bench/results"  # ignored by git
    results.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="tercel-rb-", dir=str(results)))
    srv = start_server(tmp / "data", memory)
    assert srv.proc is not None
    pid, port = srv.proc.pid, srv.port
    sampler = Sampler(pid)
    sampler.start()
    try:
        t_fill = fill(port, n, size)
        peak_fill = sampler.peak
        on_disk = sum(p.stat().st_size for p in (tmp / "data").iterdir() if p.is_file())
        cpu0 = _cpu_s(pid)
        t_drain = drain(port, n, size)
        cpu_drain = _cpu_s(pid) - cpu0
        sampler.done.set()
        sampler.join()
        left = sum(p.stat().st_size for p in (tmp / "data").iterdir() if p.is_file())
    finally:
        srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "label": label,
        "items": n,
        "size": size,
        "max_memory_size": memory,
        "fill_items_per_s": round(n / t_fill),
        "drain_items_per_s": round(n / t_drain),
        "drain_server_cpu_us_per_item": round(cpu_drain / n * 1e6, 2),
        "peak_rss_mb_fill": round(peak_fill, 1),
        "peak_rss_mb": round(sampler.peak, 1),
        "journal_mb_full": round(on_disk / 2**20, 1),
        "journal_mb_after_drain": round(left / 2**20, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gigabytes", type=float, default=2.0)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--memory", default="16MB")
    ap.add_argument("--baseline-items", type=int, default=200_000)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    n = int(args.gigabytes * 2**30 / args.size)
    results = [
        run(n, args.size, args.memory, "read-behind"),
        run(args.baseline_items, args.size, "1GB", "in-memory"),
    ]
    for r in results:
        print(json.dumps(r), flush=True)
    if args.markdown:
        rb, mem = results
        print(
            "| backlog | items | max_memory_size | fill items/s | drain items/s "
            "| peak RSS (MB) | journal full → drained (MB) |"
        )
        print("|---|---|---|---|---|---|---|")
        for r in results:
            print(
                f"| {r['label']} | {r['items']:,} | {r['max_memory_size']} "
                f"| {r['fill_items_per_s']:,} | {r['drain_items_per_s']:,} | {r['peak_rss_mb']} "
                f"| {r['journal_mb_full']} → {r['journal_mb_after_drain']} |"
            )
        rate = "drain_items_per_s"
        ratio = float(str(rb[rate])) / float(str(mem[rate]))
        print(f"\nread-behind drain rate / in-memory drain rate: {ratio:.2f}")
        # Server CPU per drained item is steadier than wall-clock rates on a noisy machine.
        cpu = "drain_server_cpu_us_per_item"
        print(f"server CPU per drained item (us): read-behind {rb[cpu]}, in-memory {mem[cpu]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
