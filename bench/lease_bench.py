"""Drain rate: ``lease`` batches + ``ack`` versus Kestrel's ``get q/close/open`` round trips.

Standalone: starts its own server (``tercel.testing.ServerProcess``, a temporary data dir),
fills a queue, then drains it one way and the other over one connection, timing only the drain.

    .venv/bin/python bench/lease_bench.py [--items 20000] [--size 100] [--batch 100] [--sync]

``--sync`` sets ``sync_journal = true`` (an fsync before every acknowledging reply).
"""

from __future__ import annotations

import argparse
import socket
import tempfile
import time
from collections.abc import Callable

from tercel.client import Client
from tercel.protocol.commands import Ack, Get, Lease
from tercel.protocol.memcache import NEED_DATA
from tercel.protocol.memcache_client import LeaseBatch, MemcacheClientCodec, Reply, Value


class Conn:
    """A bare socket + the client codec (no pool, no retries: the cheapest client)."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.codec = MemcacheClientCodec()

    def call(self, *cmds: object) -> list[Reply]:
        self.sock.sendall(b"".join(self.codec.send(c) for c in cmds))  # type: ignore[arg-type]
        out: list[Reply] = []
        while self.codec.pending:
            r = self.codec.next_reply()
            if r is NEED_DATA:
                self.codec.receive_data(self.sock.recv(1 << 18))
            else:
                out.append(r)
        return out


def fill(address: str, queue: str, items: int, size: int) -> None:
    with Client(address, timeout=60) as c:
        c.put_many(queue, [b"x" * size] * items)


def drain_leases(conn: Conn, queue: str, batch: int) -> int:
    n = 0
    while True:
        (reply,) = conn.call(Lease(queue, batch, 0, 60_000))
        assert isinstance(reply, LeaseBatch)
        if not reply.items:
            return n
        conn.call(Ack(queue, tuple(i.lease_id for i in reply.items)))
        n += len(reply.items)


def drain_close_open(conn: Conn, queue: str) -> int:
    n = 0
    key = f"{queue}/close/open".encode()
    while True:
        (reply,) = conn.call(Get(key, queue, close=True, open=True))
        if not isinstance(reply, Value):
            conn.call(Get(f"{queue}/close".encode(), queue, close=True))
            return n
        n += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--sync", action="store_true", help="sync_journal = true")
    args = ap.parse_args()
    from tercel.testing import ServerProcess

    config = "[queues]\nsync_journal = true\n" if args.sync else None
    with tempfile.TemporaryDirectory() as tmp, ServerProcess(tmp, config) as srv:
        results = {}
        drains: list[tuple[str, Callable[[Conn], int]]] = [
            (f"lease batch={args.batch} + ack", lambda c: drain_leases(c, "lb", args.batch)),
            ("get /close/open round trips", lambda c: drain_close_open(c, "co")),
        ]
        for name, drain in drains:
            queue = "lb" if name.startswith("lease") else "co"
            fill(srv.address, queue, args.items, args.size)
            conn = Conn(srv.address)
            t0 = time.perf_counter()
            n = drain(conn)
            elapsed = time.perf_counter() - t0
            conn.sock.close()
            assert n == args.items, (name, n)
            results[name] = n / elapsed
            print(f"{name:<32} {n} items in {elapsed:6.2f}s  {n / elapsed:10,.0f} items/s")
        lease_rate, co_rate = results.values()
        sync = "sync_journal=true" if args.sync else "sync_journal=false"
        print(f"ratio {lease_rate / co_rate:.1f}x ({args.size}-byte items, {sync}, 1 connection)")


if __name__ == "__main__":
    main()
