"""How long the server's event loop stalls on journal file work (issue 21), end to end.

A real server (``python -m tercel serve``) gets three kinds of file work at once:

- ``bulk`` (``sync_journal = false``, read-behind): pipelined sets of ``--size`` bytes that
  nobody reads, so its file is rotated every ``max_journal_size`` (8 MB) with all of it
  unsynced: the rotation's ``fdatasync`` writes the whole file;
- ``churn``: sets and gets that leave it empty, so its journal is compacted again and again
  (a snapshot written on a worker, then the switch-over: a rename, two directory fsyncs, the
  unlinks);
- ``doomed<n>``: a queue filled with 8 MB, then deleted (its files unlinked).

A probe connection sends ``get probe`` (an empty queue: ``END``) every millisecond and times
each reply: a reply late by more than the probe's own noise is a loop stall. The script runs
the server from each ``--src`` tree in turn (``PYTHONPATH``), ``--rounds`` times alternating,
and prints one JSON line per run: the loader's rounds (how much work the server did), probe
replies, p50/p99/p99.9/max milliseconds, and how many took over 5 and 20 ms. Compare trees
within one invocation: the host is shared.

``--calls`` measures the same three things in-process instead, per tree (a child process with
that tree on ``PYTHONPATH``): the time the owner's thread spends in ``rotate()`` of a journal
holding ``--mb`` MB unsynced (every call until it rotates), in ``erase()`` of a journal of three
such files, and in ``compact()`` of three such files, each with the ``done`` callbacks of its
background work (which runs on a worker thread, as in the server; not counted). Prints one
JSON line per tree and round, milliseconds.

Usage: ``PYTHONPATH=src python bench/loop_stall.py --src /path/to/main/src --src src [--rounds 3]
[--seconds 8] [--size 65536]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tercel.testing import ServerProcess

CONFIG = """[queues]
max_memory_size = "1MB"
max_journal_size = "8MB"
[queues.bulk]
sync_journal = false
"""


def _set(queue: str, data: bytes) -> bytes:
    return b"set %s 0 0 %d\r\n%s\r\n" % (queue.encode(), len(data), data)


def _read_until(sock: socket.socket, buf: bytearray, end: bytes, count: int = 1) -> None:
    while buf.count(end) < count:
        chunk = sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("server closed the connection")
        buf += chunk


def _load(port: int, size: int, stop: threading.Event, rounds: list[int]) -> None:
    """Sets to bulk, set+get pairs on churn, and a queue filled and deleted every 8th round
    (``rounds[0]``: the rounds done)."""
    payload = b"x" * size
    sock = socket.create_connection(("127.0.0.1", port))
    buf = bytearray()
    n = 0
    while not stop.is_set():
        sock.sendall(_set("bulk", payload) * 16)
        _read_until(sock, buf, b"STORED\r\n", 16)
        buf.clear()
        sock.sendall((_set("churn", payload) + b"get churn\r\n") * 8)
        _read_until(sock, buf, b"END\r\n", 8)
        buf.clear()
        n += 1
        rounds[0] = n
        if n % 8 == 0:
            doomed = f"doomed{n}"
            sock.sendall(_set(doomed, payload) * 128)
            _read_until(sock, buf, b"STORED\r\n", 128)
            buf.clear()
            sock.sendall(b"delete %s\r\n" % doomed.encode())
            _read_until(sock, buf, b"\r\n")
            buf.clear()
    sock.close()


def _probe(port: int, seconds: float) -> list[float]:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out: list[float] = []
    buf = bytearray()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        sock.sendall(b"get probe\r\n")
        _read_until(sock, buf, b"END\r\n")
        buf.clear()
        out.append((time.perf_counter() - t0) * 1000)
        time.sleep(0.001)
    sock.close()
    return out


def run(src: str, seconds: float, size: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="loop-stall-") as data_dir:
        srv = ServerProcess(Path(data_dir), CONFIG, env={"PYTHONPATH": src})
        srv.start()
        try:
            stop = threading.Event()
            rounds = [0]
            loader = threading.Thread(target=_load, args=(srv.port, size, stop, rounds))
            loader.start()
            time.sleep(0.5)
            lat = sorted(_probe(srv.port, seconds))
            stop.set()
            loader.join()
        finally:
            srv.stop()

    def pct(p: float) -> float:
        return round(lat[min(len(lat) - 1, int(p * len(lat)))], 2)

    return {
        "src": src,
        "load_rounds": rounds[0],
        "probes": len(lat),
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
        "p999_ms": pct(0.999),
        "max_ms": round(lat[-1], 2),
        "over_5ms": sum(1 for x in lat if x > 5),
        "over_20ms": sum(1 for x in lat if x > 20),
    }


def _calls(mb: int) -> dict[str, float]:
    """The owner's-thread milliseconds of rotate, erase and a compaction's done callback."""
    from concurrent.futures import Future, ThreadPoolExecutor
    from typing import Any

    from tercel.journal import FileJournal

    pool = ThreadPoolExecutor(max_workers=1)
    pending: list[tuple[Future[None], Any]] = []

    def background(work: Any, done: Any) -> None:  # as server/app.py runs it
        pending.append((pool.submit(work), done))

    def settle() -> float:
        """Wait for the worker; run the done callbacks as the loop would: their time."""
        spent = 0.0
        while pending:
            fut, done = pending.pop(0)
            error = fut.exception()
            t0 = time.perf_counter()
            done(error)
            spent += (time.perf_counter() - t0) * 1000
        return spent

    payload = b"x" * 65536
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="loop-stall-") as data_dir:
        j: Any = FileJournal(data_dir, "q", on_dirty=lambda _: None, background=background)
        j.replay(_Sink())

        def fill() -> None:
            for i in range(mb * 16):
                j.add(i + 1, 1, 0, payload)
            j.write_out()

        def rotate() -> float:
            spent = 0.0
            while True:
                t0 = time.perf_counter()
                ok = j.rotate()
                spent += (time.perf_counter() - t0) * 1000
                spent += settle()
                if ok:
                    return spent

        fill()
        out["rotate_ms"] = round(rotate(), 2)
        for _ in range(2):
            fill()
            rotate()
        t0 = time.perf_counter()
        assert j.compact(1, 0, [], [], None)  # (it rotates first: nothing unsynced)
        spent = (time.perf_counter() - t0) * 1000
        out["compaction_ms"] = round(spent + settle(), 2)
        for _ in range(3):
            fill()
            rotate()
        t0 = time.perf_counter()
        j.erase()
        out["erase_ms"] = round((time.perf_counter() - t0) * 1000 + settle(), 2)
        pool.shutdown(wait=True)
    return out


class _Sink:
    def __getattr__(self, name: str) -> object:
        return lambda *args, **kw: None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", action="append", required=True, help="a tree's src directory")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--size", type=int, default=65536)
    ap.add_argument("--calls", action="store_true", help="in-process: time the calls")
    ap.add_argument("--mb", type=int, default=8, help="--calls: MB per file")
    args = ap.parse_args()
    for _ in range(args.rounds):
        for tree in args.src:
            src = os.path.abspath(tree)
            if args.calls:
                code = f"import json, loop_stall; print(json.dumps(loop_stall._calls({args.mb})))"
                env = dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{Path(__file__).parent}")
                got = subprocess.run(
                    [sys.executable, "-c", code], env=env, check=True, capture_output=True
                )
                print(json.dumps({"src": src, **json.loads(got.stdout)}), flush=True)
            else:
                print(json.dumps(run(src, args.seconds, args.size)), flush=True)


if __name__ == "__main__":
    main()
