"""Restart time of ``tercel serve`` on one data dir, two source trees alternated (issue 24).

Fills a data dir once (``--items`` items of ``--size`` bytes in queue ``q`` through a server
of the first tree, then SIGKILL), then for each of ``--rounds`` rounds and each tree (order
alternating per round): copies that data dir, drops the page cache (``--drop-caches``, root
only), starts ``python -m tercel serve`` on it the way bench/servers.py starts tercel-50ms
(``--admin-port 0``, ``sync_journal = "50ms"``, pinned to CPU 1 when there are two), and
measures from ``exec`` the seconds until the memcache port accepts and until the first
``get q`` returns an item, which must be item 0; then stops it with SIGTERM (a clean stop,
which writes a checkpoint), drops the page cache again, restarts it and times the first item
once more (not item 0, taken before), as bench/replay.py does; then SIGKILLs it. Prints
one line per start and the median [range] per tree, and the paired ratio per round, for the
restart after kill -9 and the one after SIGTERM.

Usage: ``.venv/bin/python bench/startup.py --tree new=src --tree old=/tmp/old/src
[--drop-caches] [--rounds 6]`` (a tree is a directory put first on PYTHONPATH; build it with
``make native`` / ``setup.py build_ext --inplace`` to measure the compiled server).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import loadgen
import servers

PORT_HOST = "127.0.0.1"


def _start(python: str, tree: str, data: Path, port: int, cfg: Path) -> subprocess.Popen[bytes]:
    pin = ["taskset", "-c", "1"] if (os.cpu_count() or 1) >= 2 and shutil.which("taskset") else []
    argv = [*pin, python, "-m", "tercel", "serve", "--data-dir", str(data), "--host", PORT_HOST]
    argv += ["--memcache-port", str(port), "--admin-port", "0", "--config", str(cfg)]
    env = dict(os.environ, PYTHONPATH=tree)
    return subprocess.Popen([*argv, "--log-level", "warning"], env=env)


def _drop_caches() -> None:
    subprocess.run(["sync"], check=False)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def _timed_start(
    python: str, tree: str, data: Path, port: int, cfg: Path, *, drop: bool
) -> tuple[subprocess.Popen[bytes], float, float, bytes]:
    """Start a server (after dropping the page cache when asked) and get its first item:
    (the server, seconds from exec to accepting, to the item, the item's head)."""
    if drop:
        _drop_caches()
    t0 = time.monotonic()
    proc = _start(python, tree, data, port, cfg)
    try:
        accepted, head = _first_item(port, t0 + 60)
    except BaseException:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        raise
    return proc, accepted - t0, time.monotonic() - t0, head


def _first_item(port: int, deadline: float) -> tuple[float, bytes]:
    """Connects (polling) and gets from q until an item comes: (accepted at, item head)."""
    while True:
        try:
            s = socket.create_connection((PORT_HOST, port))
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.001)
    accepted = time.monotonic()
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while time.monotonic() < deadline:
            s.sendall(b"get q\r\n")
            buf = b""
            while not buf.endswith(b"END\r\n"):
                more = s.recv(1 << 16)
                if not more:
                    raise RuntimeError("the server closed the connection")
                buf += more
            if buf.startswith(b"VALUE"):
                return accepted, buf[buf.index(b"\r\n") + 2 :][:12]
            time.sleep(0.001)
        raise TimeoutError("no item before the deadline")
    finally:
        s.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=DIR (twice or more)")
    ap.add_argument("--items", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--drop-caches", action="store_true")
    ap.add_argument("--port", type=int, default=0, help="0: a free one")
    a = ap.parse_args()
    trees = dict(t.split("=", 1) for t in a.tree)
    python = sys.executable
    work = Path(tempfile.mkdtemp(prefix="tercel-startup-"))
    port = a.port or servers.free_port()
    cfg = work / "tercel.toml"
    cfg.write_text('[queues]\nsync_journal = "50ms"\n')
    template = work / "template"
    proc = _start(python, next(iter(trees.values())), template, port, cfg)
    try:
        servers.wait_port(port, time.monotonic() + 30, proc)
        errors, _ = loadgen.fill("mc", port, a.items, a.size, vary=True)
        assert not errors, f"{errors} enqueue errors"
        time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    kinds = ("kill -9", "SIGTERM")
    times: dict[tuple[str, str], list[tuple[float, float]]] = {
        (kind, name): [] for kind in kinds for name in trees
    }
    try:
        for r in range(a.rounds):
            order = list(trees.items()) if r % 2 == 0 else list(trees.items())[::-1]
            for name, tree in order:
                data = work / "data"
                shutil.rmtree(data, ignore_errors=True)
                shutil.copytree(template, data)
                for kind in kinds:
                    proc, accepted, first, head = _timed_start(
                        python, tree, data, port, cfg, drop=a.drop_caches
                    )
                    if kind == "kill -9":  # then a clean stop, for the next start
                        proc.send_signal(signal.SIGTERM)
                        proc.wait()
                    else:
                        proc.send_signal(signal.SIGKILL)
                        proc.wait()
                    # After SIGTERM: not item 0, taken before (the fill's connections
                    # interleave, so which item is next is not known; bench/replay.py).
                    item0 = head == b"%012d" % 0
                    assert item0 == (kind == "kill -9"), f"after {kind}: first item {head!r}"
                    times[kind, name].append((accepted, first))
                    print(
                        f"round {r} {name}, after {kind}: accepting {accepted:.3f} s, "
                        f"first item {first:.3f} s",
                        flush=True,
                    )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    names = list(trees)
    for kind in kinds:
        print(f"after {kind}:")
        for name in names:
            ts = times[kind, name]
            firsts = sorted(t[1] for t in ts)
            acc = statistics.median(t[0] for t in ts)
            print(
                f"  {name}: first item {statistics.median(firsts):.3f} s "
                f"[{firsts[0]:.3f}-{firsts[-1]:.3f}], accepting {acc:.3f} s"
            )
        for other in names[1:]:
            ratios = sorted(
                times[kind, names[0]][i][1] / times[kind, other][i][1] for i in range(a.rounds)
            )
            print(
                f"  {names[0]} / {other}, paired per round: median "
                f"{statistics.median(ratios):.2f} [{ratios[0]:.2f}-{ratios[-1]:.2f}]"
            )


if __name__ == "__main__":
    main()
