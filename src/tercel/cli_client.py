"""``tercel put|get|peek|stats|tail|queues|flush|delete|status``: poke a running server from a
shell, through :class:`tercel.client.Client`.

Servers come from ``--server host:port`` (repeatable), else ``$TERCEL_SERVERS``
(comma-separated), else ``127.0.0.1:22133``; TLS from ``--tls-*`` or ``$TERCEL_TLS_*``
(file paths: a key is never given on the command line). Items are written to stdout one per
line (``-0``: each followed by a NUL byte; ``--raw``: their bytes exactly, nothing between or
after). Queue names are checked here with the server's own rule (:mod:`tercel.names`) before
anything is sent.
Exit codes (:mod:`tercel.exit_codes`): 0 done, 1 a client error (printed on stderr), 2 bad
arguments (a bad queue name included), 4 found nothing (``get``/``peek``: no item at all;
``flush``/``delete``: a queue that exists on no server, said on stderr), 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from tercel import exit_codes
from tercel.errors import ClientError
from tercel.names import key_problem, name_problem

if TYPE_CHECKING:  # imported when a verb runs: `tercel serve` starts without the client
    from tercel.client import Client, TLSOptions

COMMANDS = ("put", "get", "peek", "stats", "tail", "queues", "flush", "delete", "status")
STATUSES = ("UP", "WRITEAVOID", "READONLY", "QUIESCENT")
QUEUE_COLUMNS = (
    ("items", "items"),
    ("bytes", "bytes"),
    ("open", "open_transactions"),
    ("waiters", "waiters"),
    ("total", "total_items"),
    ("expired", "expired_items"),
    ("last_taken_age_ms", "age"),
)
GLOBAL_LINES = ("version", "uptime", "curr_items", "total_items", "bytes", "curr_connections")


def queue_name(text: str) -> str:
    """argparse's ``type`` for a queue argument: the name, or a usage error (exit 2) that
    states the rule (:func:`tercel.names.name_problem`)."""
    problem = name_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def dedup_key(text: str) -> str:
    """argparse's ``type`` for ``--key``: the key, or a usage error (exit 2) stating the rule
    (:func:`tercel.names.key_problem`)."""
    problem = key_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def _output_options(parser: argparse.ArgumentParser) -> None:
    how = parser.add_mutually_exclusive_group()
    how.add_argument(
        "--raw",
        action="store_true",
        help="write each item's bytes exactly, with nothing after it (binary items)",
    )
    how.add_argument(
        "-0", "--null", action="store_true", help="end each item with a NUL byte, not a newline"
    )


def add_parsers(sub: Any) -> None:
    """Register the client verbs on the ``tercel`` command's subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--server",
        action="append",
        help="host:port (repeatable; default $TERCEL_SERVERS or 127.0.0.1:22133)",
    )
    common.add_argument("--timeout", type=float, default=5.0, help="seconds per reply")
    tls = common.add_argument_group("TLS (default: $TERCEL_TLS_CA, _CERT, _KEY, ...)")
    tls.add_argument("--tls", action="store_true", help="speak TLS (the system's CAs)")
    tls.add_argument("--tls-ca", metavar="FILE", help="CA bundle for the server certificates")
    tls.add_argument("--tls-cert", metavar="FILE", help="client certificate (mutual TLS)")
    tls.add_argument("--tls-key", metavar="FILE", help="its private key file")
    tls.add_argument("--tls-server-name", metavar="NAME", help="name in the server certificate")
    tls.add_argument(
        "--tls-no-verify", action="store_true", help="check no certificate (testing only)"
    )
    common.add_argument(
        "--user",
        help="log in as this user (default $TERCEL_USER; the password comes from "
        "--password-file, $TERCEL_PASSWORD or $TERCEL_PASSWORD_FILE, never the command line)",
    )
    common.add_argument(
        "--password-file", metavar="F", help="the password: the first line of file F"
    )
    put = sub.add_parser("put", parents=[common], help="add items to a queue")
    put.add_argument("queue", type=queue_name)
    put.add_argument("items", nargs="*", help="items (default: one per line of stdin)")
    put.add_argument("--expiry", type=float, help="seconds until the items expire")
    put.add_argument(
        "--file",
        action="append",
        default=[],
        metavar="F",
        help="put the whole content of file F as one item (repeatable; - is stdin)",
    )
    put.add_argument(
        "-0",
        "--null",
        action="store_true",
        help="stdin holds items separated by NUL bytes, not lines (find -print0 style)",
    )
    put.add_argument(
        "--key",
        action="append",
        type=dedup_key,
        metavar="K",
        help="a dedup key, one per item in order (repeatable): a put sent again with the same"
        " key within the queue's dedup window stores nothing; prints '<item_id>' or"
        " '<item_id> duplicate' per item",
    )
    get = sub.add_parser("get", parents=[common], help="take items from a queue")
    get.add_argument("queue", type=queue_name)
    get.add_argument(
        "-n", "--count", type=int, default=1, help="at most this many items (default 1)"
    )
    get.add_argument("--wait", type=float, help="seconds to wait for each item")
    _output_options(get)
    peek = sub.add_parser("peek", parents=[common], help="show the head item")
    peek.add_argument("queue", type=queue_name)
    _output_options(peek)
    stats = sub.add_parser("stats", parents=[common], help="print server and queue stats")
    stats.add_argument("queues", nargs="*", help="only these queues")
    tail = sub.add_parser("tail", parents=[common], help="print and consume a queue's items")
    tail.add_argument("queue", type=queue_name)
    tail.add_argument("-f", "--follow", action="store_true", help="keep waiting for items")
    tail.add_argument("--batch", type=int, default=100, help="items per lease (default 100)")
    tail.add_argument("--lease-time", type=float, default=30.0, help="seconds per lease")
    _output_options(tail)
    queues = sub.add_parser(
        "queues", parents=[common], help="list queues: items, bytes, ages, rates in and out"
    )
    queues.add_argument("--json", action="store_true", help="one JSON document on stdout")
    queues.add_argument(
        "--interval",
        type=float,
        default=1.0,
        help="seconds between the two samples the rates come from (default 1; 0: no rates)",
    )
    flush = sub.add_parser("flush", parents=[common], help="drop every item of queues")
    flush.add_argument("queues", nargs="+", metavar="queue", type=queue_name)
    delete = sub.add_parser(
        "delete", parents=[common], help="delete queues, their items and journal files"
    )
    delete.add_argument("queues", nargs="+", metavar="queue", type=queue_name)
    status = sub.add_parser(
        "status", parents=[common], help="print the server status, or set it on every server"
    )
    status.add_argument("status", nargs="?", type=str.upper, choices=STATUSES)


def _servers(args: argparse.Namespace) -> list[str]:
    if args.server:
        return list(args.server)
    env = os.environ.get("TERCEL_SERVERS", "")
    return [s.strip() for s in env.split(",") if s.strip()] or ["127.0.0.1:22133"]


def _tls(args: argparse.Namespace) -> TLSOptions | None:
    """TLS options from the flags, each defaulting to its ``$TERCEL_TLS_*`` variable (file
    paths only: the key stays in its file, never on the command line); None: plaintext."""
    from tercel.client import TLSOptions

    env = TLSOptions.from_env()
    given = (args.tls_ca, args.tls_cert, args.tls_key, args.tls_server_name)
    if env is None and not args.tls and not args.tls_no_verify and not any(given):
        return None
    env = env or TLSOptions()
    return TLSOptions(
        ca_file=args.tls_ca or env.ca_file,
        cert_file=args.tls_cert or env.cert_file,
        key_file=args.tls_key or env.key_file,
        server_name=args.tls_server_name or env.server_name,
        verify=env.verify and not args.tls_no_verify,
    )


def _write(data: bytes, args: argparse.Namespace) -> None:
    """One item on stdout: then a newline, a NUL (``-0``) or nothing (``--raw``)."""
    end = b"" if args.raw else b"\0" if args.null else b"\n"
    sys.stdout.buffer.write(data + end)
    sys.stdout.buffer.flush()


def run(args: argparse.Namespace) -> int:
    """Run one client verb; the exit code."""
    from tercel.client import Client
    from tercel.client._base import parse_server

    servers = _servers(args)
    try:
        for address in servers:
            parse_server(address)
    except ValueError as exc:  # a usage error, not a traceback
        print(f"tercel {args.command}: {exc}", file=sys.stderr)
        return exit_codes.USAGE
    try:
        client = Client(
            servers,
            timeout=args.timeout,
            tls=_tls(args),
            user=args.user,
            password_file=args.password_file,
            password=os.environ.get("TERCEL_PASSWORD")
            if args.user and not args.password_file
            else None,
        )
    except (OSError, ValueError) as exc:  # credentials or TLS files missing or unreadable
        print(f"tercel {args.command}: {exc}", file=sys.stderr)
        return exit_codes.USAGE
    try:
        with client:
            code: int = VERBS[args.command](client, args)
            return code
    except ClientError as exc:
        print(f"tercel {args.command}: {exc}", file=sys.stderr)
        return exit_codes.FAILED
    except OSError as exc:  # a --file or a TLS file that cannot be read
        print(f"tercel {args.command}: {exc}", file=sys.stderr)
        return exit_codes.FAILED
    except KeyboardInterrupt:
        return exit_codes.INTERRUPTED


def _read_file(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    with open(path, "rb") as f:
        return f.read()


def put_items(args: argparse.Namespace) -> list[bytes]:
    """What ``put`` sends: the arguments, then each ``--file``'s content as one item; stdin
    (lines, or NUL-separated with ``-0``; a final separator ends the last item) when neither
    is given."""
    items = [i.encode() for i in args.items] + [_read_file(f) for f in args.file]
    if items:
        return items
    data = sys.stdin.buffer.read()
    if args.null:
        parts = data.split(b"\0")
        return parts[:-1] if parts[-1] == b"" else parts
    return [line.rstrip(b"\r\n") for line in data.splitlines(keepends=True)]


def _put(client: Client, args: argparse.Namespace) -> int:
    items = put_items(args)
    if not args.key:
        client.put_many(args.queue, items, args.expiry)
        return exit_codes.OK
    if len(args.key) != len(items):
        print(
            f"tercel put: {len(args.key)} --key for {len(items)} item(s): one key per item",
            file=sys.stderr,
        )
        return exit_codes.USAGE
    for key, data in zip(args.key, items, strict=True):
        stored = client.put(args.queue, data, args.expiry, key=key)
        assert stored is not None
        print(f"{stored.item_id} duplicate" if stored.duplicate else stored.item_id, flush=True)
    return exit_codes.OK


def _get(client: Client, args: argparse.Namespace) -> int:
    """Up to ``--count`` items; EMPTY only when there was not even one."""
    for n in range(args.count):
        data = client.get(args.queue, args.wait)
        if data is None:
            return exit_codes.OK if n else exit_codes.EMPTY
        _write(data, args)
    return exit_codes.OK


def _peek(client: Client, args: argparse.Namespace) -> int:
    data = client.peek(args.queue)
    if data is None:
        return exit_codes.EMPTY
    _write(data, args)
    return exit_codes.OK


def _tail(client: Client, args: argparse.Namespace) -> int:
    """Lease a batch, print it, ack it; with --follow wait for more (1 s slices) forever."""
    while True:
        batch = client.lease(args.queue, args.batch, 1.0 if args.follow else None, args.lease_time)
        if not batch:
            if args.follow:
                continue
            return exit_codes.OK
        for item in batch:
            _write(item.data, args)
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
    return exit_codes.OK


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One queue on one server, as ``tercel queues`` shows it (``--json``: these keys).
    ``last_taken_age_ms`` is Kestrel's ``age`` stat: how long ago the last item taken (by a get
    or an open read) was added, 0 when the queue holds no bytes; the dashboard's "head age" is
    another figure, the age of the item now at the head."""

    server: str
    queue: str
    items: int
    bytes: int
    mem_bytes: int
    last_taken_age_ms: int
    open: int
    waiters: int
    in_per_s: float | None
    out_per_s: float | None


def _int(stats: dict[str, str], key: str) -> int:
    try:
        return int(stats.get(key, "0"))
    except ValueError:
        return 0


def queue_rows(
    before: dict[str, dict[str, dict[str, str]]] | None,
    after: dict[str, dict[str, dict[str, str]]],
    seconds: float,
) -> list[QueueRow]:
    """Rows from ``dump_stats`` of every server (``after``) and, for the rates, an earlier
    sample ``seconds`` before it: in = items added per second (``total_items``), out = items
    that left per second (taken, opened, expired or flushed: added minus the growth of
    ``items``). A queue new since ``before`` counts from zero; a queue deleted and recreated
    in between never shows a negative rate."""
    rows = []
    for server, queues in sorted(after.items()):
        for name, st in sorted(queues.items()):
            rate_in = rate_out = None
            if before is not None and seconds > 0:
                old = before.get(server, {}).get(name, {})
                added = max(0, _int(st, "total_items") - _int(old, "total_items"))
                grown = _int(st, "items") - _int(old, "items")
                rate_in = added / seconds
                rate_out = max(0, added - grown) / seconds
            open_ = _int(st, "open_transactions") + _int(st, "open_leases")
            rows.append(
                QueueRow(
                    server,
                    name,
                    _int(st, "items"),
                    _int(st, "bytes"),
                    _int(st, "mem_bytes"),
                    _int(st, "age"),
                    open_,
                    _int(st, "waiters"),
                    rate_in,
                    rate_out,
                )
            )
    return rows


def human_bytes(n: int) -> str:
    """``n`` bytes in B, KiB, MiB, GiB or TiB, three significant digits."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{n} B" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} TiB"


def human_ms(ms: int) -> str:
    """A duration in ms as ``850ms``, ``12.5s``, ``3.2m``, ``4.1h`` or ``2.0d``."""
    if ms < 1000:
        return f"{ms}ms"
    s = ms / 1000
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s / size:.1f}{unit}"
    return f"{s:.1f}s"


def format_queues(rows: list[QueueRow]) -> Iterator[str]:
    """The ``tercel queues`` table (a server column only for more than one server)."""
    servers = len({r.server for r in rows}) > 1
    head = ["queue", "items", "bytes", "in memory", "last-taken age", "open", "waiters"]
    head += ["in/s", "out/s"]
    table = [(["server"] if servers else []) + head]
    for r in rows:
        rates = ["-" if v is None else f"{v:.1f}" for v in (r.in_per_s, r.out_per_s)]
        cells = [
            r.queue,
            str(r.items),
            human_bytes(r.bytes),
            human_bytes(r.mem_bytes),
            human_ms(r.last_taken_age_ms),
            str(r.open),
            str(r.waiters),
            *rates,
        ]
        table.append(([r.server] if servers else []) + cells)
    left = 2 if servers else 1  # text columns, left-aligned; numbers right-aligned
    widths = [max(len(row[c]) for row in table) for c in range(len(table[0]))]
    for row in table:
        yield "  ".join(
            v.ljust(w) if c < left else v.rjust(w)
            for c, (v, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()


def _queues(client: Client, args: argparse.Namespace) -> int:
    before, t0 = None, time.monotonic()
    if args.interval > 0:
        before = client.queue_stats()
        t0 = time.monotonic()
        time.sleep(args.interval)
    after = client.queue_stats()
    seconds = time.monotonic() - t0
    rows = queue_rows(before, after, seconds)
    if args.json:
        print(json.dumps({"servers": sorted(after), "queues": [asdict(r) for r in rows]}))
    elif not rows:
        print("(no queues)")
    else:
        for line in format_queues(rows):
            print(line)
    return exit_codes.OK


def _missing(client: Client, args: argparse.Namespace) -> set[str]:
    """The queues of ``args.queues`` that exist on no server (one ``dump_stats`` each)."""
    known = {name for queues in client.queue_stats().values() for name in queues}
    return set(args.queues) - known


def _each_queue(
    client: Client, args: argparse.Namespace, act: Callable[[str], None], done: str
) -> int:
    """``act(queue)`` on every server for each queue named; a queue found on no server is
    said on stderr and makes the exit code EMPTY (the others are still acted on)."""
    missing = _missing(client, args)
    for queue in args.queues:
        if queue in missing:
            print(f"tercel {args.command}: no queue {queue!r} on any server", file=sys.stderr)
        else:
            act(queue)
            print(f"{done} {queue}", file=sys.stderr)
    return exit_codes.EMPTY if missing else exit_codes.OK


def _flush(client: Client, args: argparse.Namespace) -> int:
    return _each_queue(client, args, client.flush, "flushed")


def _delete(client: Client, args: argparse.Namespace) -> int:
    return _each_queue(client, args, client.delete, "deleted")


def _status(client: Client, args: argparse.Namespace) -> int:
    if args.status is not None:
        client.set_status(args.status)
        return exit_codes.OK
    statuses = client.status()  # raises when no server answers
    for server, status in sorted(statuses.items()):
        print(status if len(statuses) == 1 else f"{server} {status}")
    return exit_codes.OK


VERBS = {
    "put": _put,
    "get": _get,
    "peek": _peek,
    "stats": _stats,
    "tail": _tail,
    "queues": _queues,
    "flush": _flush,
    "delete": _delete,
    "status": _status,
}
