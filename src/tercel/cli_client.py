"""``tercel put|get|peek|stats|tail``: poke a running server from a shell, through
:class:`tercel.client.Client`.

Servers come from ``--server host:port`` (repeatable), else ``$TERCEL_SERVERS``
(comma-separated), else ``127.0.0.1:22133``. Items are written to stdout one per line, raw.
Exit codes: 0 done, 1 a client error (printed on stderr), 3 ``get``/``peek`` found nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from tercel.errors import ClientError

if TYPE_CHECKING:  # imported when a verb runs: `tercel serve` starts without the client
    from tercel.client import Client

COMMANDS = ("put", "get", "peek", "stats", "tail")
QUEUE_COLUMNS = (
    ("items", "items"),
    ("bytes", "bytes"),
    ("open", "open_transactions"),
    ("waiters", "waiters"),
    ("total", "total_items"),
    ("expired", "expired_items"),
    ("age_ms", "age"),
)
GLOBAL_LINES = ("version", "uptime", "curr_items", "total_items", "bytes", "curr_connections")


def add_parsers(sub: Any) -> None:
    """Register the client verbs on the ``tercel`` command's subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--server",
        action="append",
        help="host:port (repeatable; default $TERCEL_SERVERS or 127.0.0.1:22133)",
    )
    common.add_argument("--timeout", type=float, default=5.0, help="seconds per reply")
    put = sub.add_parser("put", parents=[common], help="add items to a queue")
    put.add_argument("queue")
    put.add_argument("items", nargs="*", help="items (default: one per line of stdin)")
    put.add_argument("--expiry", type=float, help="seconds until the items expire")
    get = sub.add_parser("get", parents=[common], help="take items from a queue")
    get.add_argument("queue")
    get.add_argument("-n", "--count", type=int, default=1, help="how many items (default 1)")
    get.add_argument("--wait", type=float, help="seconds to wait for each item")
    peek = sub.add_parser("peek", parents=[common], help="show the head item")
    peek.add_argument("queue")
    stats = sub.add_parser("stats", parents=[common], help="print server and queue stats")
    stats.add_argument("queues", nargs="*", help="only these queues")
    tail = sub.add_parser("tail", parents=[common], help="print and consume a queue's items")
    tail.add_argument("queue")
    tail.add_argument("-f", "--follow", action="store_true", help="keep waiting for items")
    tail.add_argument("--batch", type=int, default=100, help="items per lease (default 100)")
    tail.add_argument("--lease-time", type=float, default=30.0, help="seconds per lease")


def _servers(args: argparse.Namespace) -> list[str]:
    if args.server:
        return list(args.server)
    env = os.environ.get("TERCEL_SERVERS", "")
    return [s.strip() for s in env.split(",") if s.strip()] or ["127.0.0.1:22133"]


def _write(data: bytes) -> None:
    sys.stdout.buffer.write(data + b"\n")
    sys.stdout.buffer.flush()


def run(args: argparse.Namespace) -> int:
    """Run one client verb; the exit code."""
    try:
        from tercel.client import Client

        with Client(_servers(args), timeout=args.timeout) as client:
            code: int = VERBS[args.command](client, args)
            return code
    except ClientError as exc:
        print(f"tercel {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _put(client: Client, args: argparse.Namespace) -> int:
    items = [i.encode() for i in args.items] or [line.rstrip(b"\r\n") for line in sys.stdin.buffer]
    client.put_many(args.queue, items, args.expiry)
    return 0


def _get(client: Client, args: argparse.Namespace) -> int:
    for _ in range(args.count):
        data = client.get(args.queue, args.wait)
        if data is None:
            return 3
        _write(data)
    return 0


def _peek(client: Client, args: argparse.Namespace) -> int:
    data = client.peek(args.queue)
    if data is None:
        return 3
    _write(data)
    return 0


def _tail(client: Client, args: argparse.Namespace) -> int:
    """Lease a batch, print it, ack it; with --follow wait for more (1 s slices) forever."""
    while True:
        batch = client.lease(args.queue, args.batch, 1.0 if args.follow else None, args.lease_time)
        if not batch:
            if args.follow:
                continue
            return 0
        for item in batch:
            _write(item.data)
        client.ack(batch)


def format_stats(
    server: str, stats: dict[str, str], queues: dict[str, dict[str, str]], only: list[str]
) -> Iterator[str]:
    """A server's stats as text: a few global lines, then one table row per queue."""
    yield f"server {server}"
    for key in GLOBAL_LINES:
        if key in stats:
            yield f"  {key:<18} {stats[key]}"
    queues = {n: s for n, s in queues.items() if not only or n in only}
    if not queues:
        yield "  (no queues)"
        return
    rows = [["queue", *(title for title, _ in QUEUE_COLUMNS)]]
    rows += [[n, *(s.get(k, "-") for _, k in QUEUE_COLUMNS)] for n, s in sorted(queues.items())]
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [
            v.rjust(w) for v, w in zip(row[1:], widths[1:], strict=True)
        ]
        yield "  " + "  ".join(cells)


def _stats(client: Client, args: argparse.Namespace) -> int:
    per_queue = client.queue_stats()
    for i, (server, stats) in enumerate(client.stats().items()):
        if i:
            print()
        for line in format_stats(server, stats, per_queue.get(server, {}), args.queues):
            print(line)
    return 0


VERBS = {"put": _put, "get": _get, "peek": _peek, "stats": _stats, "tail": _tail}
