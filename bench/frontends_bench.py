"""Front ends compared at batches of 100: Thrift, memcache pipelined at depth 100, leases.

Standalone: starts its own server (``tercel.testing.ServerProcess``, a temporary data dir,
``--thrift-port 0 --text-port 0``) and, over one connection each, moves the same items through

- ``thrift put``: ``put`` calls of 100 items (thriftpy2 client from the shipped IDL);
- ``memcache set d=100``: 100 pipelined ``set`` requests per round trip;
- ``text put``: ``put q:`` batches of 100 lines;
- ``thrift get``: ``get(max_items=100)``, taken for good;
- ``thrift get+confirm``: ``get(max_items=100, auto_abort_msec=60000)`` then ``confirm``;
- ``memcache get d=100``: 100 pipelined plain ``get`` requests per round trip;
- ``lease+ack``: ``lease q 100 0 60000`` then ``ack`` of the 100 ids.

Each scenario runs ``--rounds`` times, in turn with the others (so noise spreads over all), and
reports items/s and the server's CPU per item (utime + stime of the server process over the
scenario, from /proc; 10 ms resolution, hence the item counts). The host is shared: compare
ratios within one run, not absolute numbers across runs.

    .venv/bin/python bench/frontends_bench.py [--items 20000] [--size 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import thriftpy2
from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.transport import TFramedTransportFactory

from tercel.protocol.commands import Ack, Get, Lease, Set
from tercel.protocol.memcache import NEED_DATA
from tercel.protocol.memcache_client import LeaseBatch, MemcacheClientCodec, Reply
from tercel.protocol.thrift import IDL_PATH
from tercel.testing import ServerProcess

IDL = thriftpy2.load(IDL_PATH, module_name="bench_kestrel_thrift")
_BINARY: Any = TBinaryProtocolFactory  # untyped in thriftpy2
BATCH = 100
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


class Memcache:
    """A bare socket + the client codec: the cheapest memcache client."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.codec = MemcacheClientCodec()

    def call(self, cmds: list[Any]) -> list[Reply]:
        self.sock.sendall(b"".join(self.codec.send(c) for c in cmds))
        out: list[Reply] = []
        while self.codec.pending:
            r = self.codec.next_reply()
            if r is NEED_DATA:
                self.codec.receive_data(self.sock.recv(1 << 18))
            else:
                out.append(r)
        return out

    def close(self) -> None:
        self.sock.close()


class Text:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def put(self, queue: str, items: list[bytes]) -> int:
        self.sock.sendall(b"put %b:\n%b\n\n" % (queue.encode(), b"\n".join(items)))
        reply = b""
        while not reply.endswith(b"\n"):
            reply += self.sock.recv(100)
        return int(reply[1:])

    def close(self) -> None:
        self.sock.close()


def thrift(port: int) -> Any:
    return make_client(
        IDL.Kestrel,
        "127.0.0.1",
        port,
        trans_factory=TFramedTransportFactory(),
        proto_factory=_BINARY(),
        timeout=60_000,
    )


Scenario = Callable[[dict[str, int], str, int, bytes], int]


def thrift_put(ports: dict[str, int], q: str, n: int, item: bytes) -> int:
    c = thrift(ports["thrift"])
    done = sum(int(c.put(q, [item] * BATCH, 0)) for _ in range(n // BATCH))
    c.close()
    return done


def memcache_set(ports: dict[str, int], q: str, n: int, item: bytes) -> int:
    c = Memcache(ports["memcache"])
    done = 0
    for _ in range(n // BATCH):
        done += len(c.call([Set(q, 0, 0, item)] * BATCH))
    c.close()
    return done


def text_put(ports: dict[str, int], q: str, n: int, item: bytes) -> int:
    c = Text(ports["text"])
    done = sum(c.put(q, [item] * BATCH) for _ in range(n // BATCH))
    c.close()
    return done


def thrift_get(ports: dict[str, int], q: str, n: int, item: bytes) -> int:
    c = thrift(ports["thrift"])
    done = 0
    while got := c.get(q, BATCH, 0, 0):
        done += len(got)
    c.close()
    return done


def thrift_get_confirm(ports: dict[str, int], q: str, n: int, item: bytes) -> int:
    c = thrift(ports["thrift"])
    done = 0
    while got := c.get(q, BATCH, 0, 60_000):
        done += c.confirm(q, {i.id for i in got})
    c.close()
    return done


def memcache_get(ports: dict[str, int], q: str, n: int, item: bytes) -> int:
    c = Memcache(ports["memcache"])
    done = 0
    get = Get(q.encode(), q)
    while True:
        replies = c.call([get] * BATCH)
        got = sum(1 for r in replies if getattr(r, "data", None) is not None)
        done += got
        if got < BATCH:
            break
    c.close()
    return done


def lease_ack(ports: dict[str, int], q: str, n: int, item: bytes) -> int:
    c = Memcache(ports["memcache"])
    done = 0
    while True:
        (batch,) = c.call([Lease(q, BATCH, 0, 60_000)])
        assert isinstance(batch, LeaseBatch)
        if not batch.items:
            break
        c.call([Ack(q, tuple(i.lease_id for i in batch.items))])
        done += len(batch.items)
    c.close()
    return done


PUTS: dict[str, Scenario] = {
    "thrift put (100/call)": thrift_put,
    "memcache set d=100": memcache_set,
    "text put (100/batch)": text_put,
}
GETS: dict[str, Scenario] = {
    "thrift get max 100": thrift_get,
    "thrift get+confirm": thrift_get_confirm,
    "memcache get d=100": memcache_get,
    "lease 100 + ack": lease_ack,
}


def measure(srv: ServerProcess, fn: Scenario, q: str, n: int, item: bytes) -> tuple[float, float]:
    """(items/s, server CPU us/item) of one run of ``fn``."""
    assert srv.proc is not None
    cpu0, t0 = cpu_seconds(srv.proc.pid), time.perf_counter()
    done = fn(srv.ports, q, n, item)
    elapsed, cpu = time.perf_counter() - t0, cpu_seconds(srv.proc.pid) - cpu0
    assert done == n, (fn.__name__, done, n)
    return n / elapsed, cpu / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    n = args.items // BATCH * BATCH
    item = b"x" * args.size
    results: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        extra = ("--thrift-port", "0", "--text-port", "0")
        with ServerProcess(tmp, extra_args=extra, admin_port=None) as srv:
            for r in range(args.rounds):
                for i, (name, put) in enumerate(PUTS.items()):
                    results.setdefault(name, []).append(measure(srv, put, f"p{r}_{i}", n, item))
                fill = Memcache(srv.ports["memcache"])
                for i in range(len(GETS)):
                    for _ in range(n // BATCH):
                        fill.call([Set(f"g{r}_{i}", 0, 0, item)] * BATCH)
                fill.close()
                for i, (name, get) in enumerate(GETS.items()):
                    results.setdefault(name, []).append(measure(srv, get, f"g{r}_{i}", n, item))
    print(f"{n} items of {args.size} bytes per run, {args.rounds} rounds, 1 connection each")
    print(f"{'scenario':<24} {'items/s (median, range)':>34} {'server CPU us/item':>24}")
    for name, runs in results.items():
        rates = sorted(r for r, _ in runs)
        cpus = sorted(c for _, c in runs)
        print(
            f"{name:<24} {statistics.median(rates):>12,.0f} ({rates[0]:,.0f}-{rates[-1]:,.0f})"
            f" {statistics.median(cpus):>12.2f} ({cpus[0]:.2f}-{cpus[-1]:.2f})"
        )


if __name__ == "__main__":
    main()
