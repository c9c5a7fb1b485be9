"""``make fuzz`` (server part): random and mutated requests against a real server, for minutes.

Starts ``tercel serve`` on 127.0.0.1:0 (tiny memory/journal limits, so read-behind, rotation and
compaction run too) and drives it from several connections at once. Each connection sends a
batch made of valid requests of every kind (gets with every option, sets, leases, acks with
random ids, monitor, confirm, flush, delete, stats, ...), mutated (bytes flipped, inserted,
deleted, repeated; numbers swapped for extreme ones), in random pieces, half-closes and reads
until the server has answered and closed (or 2 s), or one time in ten resets the connection at
once. ``shutdown`` and
``status`` are never sent (they would end or freeze the run, not find a bug).

It fails (exit 1) on: a traceback or ``bug while`` in the server log, the server dying, a
``version`` probe that gets no answer, a restart on the same data directory that fails, or
``tercel journal check`` reporting damage. The JSON summary counts requests, bytes,
connections and what the log said. Bounded by ``--seconds`` (default 120).
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from serverlog import compiled_modules, tracebacks
from tercel.testing import ServerProcess

DRAIN_S = 2.0
"""How long a connection waits for the server to answer its batch and close."""
PROBE_S = 10.0
"""The longest a ``version`` request on a new connection may wait for its answer."""
CONFIG = """[queues]
max_memory_size = "4KB"
max_journal_size = "16KB"
max_open_leases = 50

[queues.fz1]
sync_journal = true

[queues.fz2]
sync_journal = "20ms"

[aliases]
fzalias = ["fz1", "fz3"]
"""

NAMES = (b"fz1", b"fz2", b"fz3", b"fz1+child", b"fzalias", b"a" * 200, b"a" * 201)
EXTREME = (
    b"0",
    b"-1",
    b"1",
    b"4294967296",
    b"9223372036854775807",
    b"9223372036854776",
    b"-999999999999999999",
    b"99999999999999999999999",
    b"",
    b"\x00",
    b"\xff",
    b"\r\n",
    b"\n",
    b"\r",
    b" ",
    b"/open",
    b"/close",
    b"/abort",
    b"/peek",
    b"/t=",
    b"noreply",
)


def request(rng: random.Random) -> bytes:
    """One well-formed request (the mutator breaks some of them)."""
    q = rng.choice(NAMES)
    n = rng.choice((0, 1, 3, 100, 5000))
    kind = rng.randrange(16)
    if kind < 4:
        opts = rng.sample([b"open", b"close", b"abort", b"peek", b"t=%d" % rng.choice((0, 5))], 2)
        return b"%s %s/%s\r\n" % (rng.choice((b"get", b"gets")), q, b"/".join(opts))
    if kind < 8:
        data = rng.randbytes(n)
        exp = rng.choice((b"0", b"0", b"1", b"-1", b"99999999999", rng.choice(EXTREME)))
        tail = rng.choice((b"", b" noreply"))
        return b"set %s 0 %s %d%s\r\n%s\r\n" % (q, exp, n, tail, data)
    if kind == 8:
        return b"lease %s %d %d %d\r\n" % (q, rng.randrange(5), rng.choice((0, 5)), 1000)
    if kind == 9:
        verb = rng.choice((b"ack", b"release"))
        ids = b" ".join(b"%x-%d" % (rng.getrandbits(32), rng.randrange(9)) for _ in range(3))
        return b"%s %s %s\r\n" % (verb, q, ids)
    if kind == 10:
        return b"renew %s %d %x-1\r\n" % (q, rng.choice((0, 100)), rng.getrandbits(32))
    if kind == 11:
        return b"monitor %s 0 %d\r\nconfirm %s %d\r\n" % (q, rng.randrange(3), q, rng.randrange(3))
    if kind == 12:
        return rng.choice((b"flush ", b"delete ", b"flush_expired ")) + q + b"\r\n"
    if kind == 13:
        return rng.choice((b"stats", b"dump_stats fz1 fz2", b"version", b"features")) + b"\r\n"
    if kind == 14:
        return rng.choice((b"flush_all", b"flush_all_expired", b"reload", b"dump_config")) + b"\r\n"
    return rng.choice((b"add", b"cas", b"incr", b"xyzzy", b"")) + b" %s 0 0 1\r\nx\r\n" % q


def mutate(rng: random.Random, stream: bytes) -> bytes:
    buf = bytearray(stream)
    for _ in range(rng.choice((0, 0, 1, 2, 5))):
        at = rng.randrange(len(buf) + 1)
        kind = rng.randrange(5)
        if kind == 0 and at < len(buf):
            buf[at] ^= 1 << rng.randrange(8)
        elif kind == 1:
            buf[at:at] = rng.randbytes(rng.randrange(1, 9))
        elif kind == 2:
            buf[at:at] = rng.choice(EXTREME)
        elif kind == 3:
            del buf[at : at + rng.randrange(1, 9)]
        else:
            buf[at:at] = buf[at : at + rng.randrange(1, 41)]
    return bytes(buf)


class Fuzzer:
    def __init__(self, data_dir: Path, seconds: float, seed: int, connections: int) -> None:
        self.server = ServerProcess(data_dir, CONFIG, log_level="info")
        self.seconds = seconds
        self.seed = seed
        self.connections = connections
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.counts = dict.fromkeys(("requests", "bytes", "connections", "resets", "slow"), 0)
        self.counts["refused"] = 0
        self.failures: list[str] = []
        self.probe_max_s = 0.0

    def _count(self, **add: int) -> None:
        with self.lock:
            for k, v in add.items():
                self.counts[k] += v

    def worker(self, wid: int) -> None:
        rng = random.Random(self.seed * 1000 + wid)
        while not self.stop.is_set():
            reqs = [request(rng) for _ in range(rng.randrange(1, 30))]
            stream = mutate(rng, b"".join(reqs))
            try:
                sock = socket.create_connection(("127.0.0.1", self.server.port), timeout=2)
            except OSError:
                self._count(refused=1)
                time.sleep(0.05)
                continue
            self._count(connections=1, requests=len(reqs), bytes=len(stream))
            try:
                pos = 0
                while pos < len(stream):
                    step = rng.choice((1, 7, 64, 4096, len(stream)))
                    sock.sendall(stream[pos : pos + step])
                    pos += step
                if rng.random() < 0.1:  # a reset, maybe in the middle of a reply
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self._count(resets=1)
                else:
                    self._drain(sock)
            except OSError:
                pass
            finally:
                sock.close()

    def _drain(self, sock: socket.socket) -> None:
        """Half-close and read until the server has answered everything and closed (closed
        loop: a client that sends and leaves at once outruns any server, and the probe then
        waits behind a full accept queue of abandoned batches the server still executes).
        A blocking request (a long ``/t=``, a lease's wait, a monitor) may hold the answer:
        after ``DRAIN_S`` the connection is closed anyway and counted as ``slow``."""
        sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + DRAIN_S
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                if not sock.recv(65536):
                    return
            except TimeoutError:
                break
        self._count(slow=1)

    def _probe(self) -> None:
        """The server is alive and answers ``version`` within ``PROBE_S``; else a failure.
        A slow answer is waited for (up to a minute) so that a stall is told from a hang."""
        if not self.server.running:
            self.failures.append("the server died")
            raise SystemExit
        began = time.monotonic()
        try:
            with socket.create_connection(("127.0.0.1", self.server.port), timeout=60) as s:
                s.sendall(b"version\r\n")
                answer = s.recv(100)
        except OSError as exc:
            answer = str(exc).encode()
        took = time.monotonic() - began
        self.probe_max_s = max(self.probe_max_s, took)
        if not answer.startswith(b"VERSION ") or took > PROBE_S:
            self.failures.append(f"version probe: {answer[:60]!r} after {took:.1f} s")

    def run(self) -> dict[str, object]:
        self.server.start()
        workers = [threading.Thread(target=self.worker, args=(i,)) for i in range(self.connections)]
        for w in workers:
            w.start()
        deadline = time.monotonic() + self.seconds
        try:
            while time.monotonic() < deadline and not self.failures:
                time.sleep(1.0)
                self._probe()
        except SystemExit:
            pass
        finally:
            self.stop.set()
            for w in workers:
                w.join()
        code = self.server.stop() if self.server.running else -1
        if code != 0:
            self.failures.append(f"stop: exit {code}")
        try:
            self.server.start()  # replay what the fuzz left
            self._probe()
            self.server.stop()
        except Exception as exc:  # reported, not raised
            self.failures.append(f"restart: {exc}")
        log = self.server.log()
        check = subprocess.run(
            [sys.executable, "-m", "tercel", "journal", "check", str(self.server.data_dir)],
            capture_output=True,
            text=True,
            check=False,
        )
        if check.returncode != 0:
            self.failures.append(f"journal check: {check.stdout[-1000:]}")
        lines = log.splitlines()
        bugs = tracebacks(log)
        if bugs:
            total = sum(bugs.values())
            self.failures.append(f"{total} tracebacks in the server log, {len(bugs)} distinct")
        warnings = [ln for ln in lines if " WARNING " in ln or " ERROR " in ln]
        return {
            "ok": not self.failures,
            "seconds": self.seconds,
            "seed": self.seed,
            "compiled_modules": compiled_modules(log),
            **self.counts,
            "failures": self.failures,
            "probe_max_s": round(self.probe_max_s, 3),
            "log_lines": len(lines),
            "log_warnings_and_errors": len(warnings),
            "log_warning_samples": sorted({w.split(" ", 3)[-1][:120] for w in warnings})[:10],
            "distinct_tracebacks": [{"count": n, "where": k} for k, n in bugs.most_common()],
        }


def main() -> int:
    ap = argparse.ArgumentParser(description="tercel server fuzz: random and mutated requests")
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--connections", type=int, default=4, help="concurrent connections")
    ap.add_argument("--data-dir", help="default: a new temporary directory")
    ap.add_argument("--out", help="also write the JSON summary here")
    args = ap.parse_args()
    data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="tercel-fuzz-"))
    print(f"fuzz: {args.seconds:.0f} s, seed {args.seed}, data in {data_dir}", file=sys.stderr)
    summary = Fuzzer(data_dir, args.seconds, args.seed, args.connections).run()
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print("fuzz: ok" if summary["ok"] else "fuzz: FAILED", file=sys.stderr)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
