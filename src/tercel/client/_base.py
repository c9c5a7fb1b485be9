"""What :class:`~tercel.client.Client` and :class:`~tercel.client.AsyncClient` share, without
I/O: the server list and its health, the commands each method sends, and what each reply
means.

A method is an :class:`Op`: the commands to pipeline on one connection and a ``finish`` that
turns their replies into the result (or raises). The two clients differ only in how they move
the bytes. Cluster policy (Kestrel's clients did the same): every operation goes to a randomly
chosen healthy server; a server whose connection fails is set aside for ``retry_after``
seconds, doubling per consecutive failure up to ``max_retry_after``, then tried again; reads
that may wait rotate across the servers in slices of ``rotate_interval`` seconds. An operation
whose connection fails is tried on the next healthy server, but one that timed out after it was
sent is not (the server may have carried it out: a ``put`` sent again would store its items
twice), and the timeout is raised; a connect that times out is tried elsewhere. A pooled
connection the server closed while idle (its ``client_timeout``, a restart) is dropped before
use, not counted as the server failing.
"""

from __future__ import annotations

import math
import os
import random
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

from tercel.client.tls import Secured, TLSOptions
from tercel.errors import BadReply, NoServerAvailable, NotStored, ServerReplyError
from tercel.protocol.commands import (
    Ack,
    Command,
    Delete,
    DumpStats,
    Flush,
    Get,
    KeyedSet,
    Lease,
    Release,
    Renew,
    Set,
    Simple,
    Status,
)
from tercel.protocol.memcache_client import (
    Blocks,
    ErrorReply,
    LeaseBatch,
    LeaseColumns,
    Line,
    Listing,
    Reply,
    Value,
    get_key,
)

if TYPE_CHECKING:
    import ssl

T = TypeVar("T")

DEFAULT_PORT = 22133
EXPIRY_RELATIVE_LIMIT = 1_000_000
"""Kestrel reads a set's exptime below this as relative seconds, above as epoch seconds."""
IDS_PER_LINE = 2000
"""Lease ids per ack/release/renew line: ~40 KB, far below the server's 1 MiB line limit."""
PUT_BATCH = 500
"""Sets per pipelined write in put_many, so the replies never fill the socket buffers."""


def parse_server(address: str) -> tuple[str, int]:
    """``"host:port"`` (or ``"host"``, port 22133; ``"[::1]:22133"`` for IPv6) -> (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or "]" in port:
        return address.strip("[]"), DEFAULT_PORT
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        raise ValueError(f"bad server address {address!r} (expected host:port)") from None


def ms(seconds: float) -> int:
    """Seconds -> whole milliseconds, rounded up so a short wait never becomes no wait."""
    return max(0, math.ceil(seconds * 1000))


def exptime(expiry: float | None, now: float) -> int:
    """A set's exptime for an expiry in seconds from now (None: never)."""
    if expiry is None:
        return 0
    if expiry <= 0:
        raise ValueError("expiry must be positive (or None for no expiry)")
    if expiry < EXPIRY_RELATIVE_LIMIT:
        return math.ceil(expiry)
    return math.ceil(now + expiry)


# ---- results --------------------------------------------------------------------------------


@dataclass(slots=True)
class Leased:
    """An item held under a lease: ack, release or renew it through the client that leased it.

    ``expiry`` is the item's own expiry, epoch seconds (None: it never expires);
    ``add_time`` the epoch time the item was added; ``deliveries`` how often it has been
    handed out, this time included.
    """

    queue: str
    server: str
    lease_id: str
    id: int
    deliveries: int
    add_time: float
    expiry: float | None
    data: bytes


# ---- credentials ----------------------------------------------------------------------------

ENV_USER = "TERCEL_USER"
ENV_PASSWORD = "TERCEL_PASSWORD"
ENV_PASSWORD_FILE = "TERCEL_PASSWORD_FILE"
LOGIN_KEY = "auth"
"""The key of the login ``set`` (memcached's ASCII authentication ignores it). On a server
without users the set stores its item there, expiring after a second: give a client
credentials only for a server with users."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """A user and its password (never shown by ``repr``)."""

    user: str
    password: str = field(repr=False)

    @classmethod
    def resolve(
        cls,
        user: str | None = None,
        password: str | None = None,
        password_file: str | None = None,
        environ: Mapping[str, str] = os.environ,
    ) -> Credentials | None:
        """The credentials given, else those of the environment: ``TERCEL_USER`` with
        ``TERCEL_PASSWORD`` or ``TERCEL_PASSWORD_FILE`` (a file whose first line is the
        password); None when there is no user. ValueError for a user without a password."""
        if user is None:
            user = environ.get(ENV_USER) or None
            if user is None:
                return None
            if password is None and password_file is None:
                password = environ.get(ENV_PASSWORD)
                password_file = environ.get(ENV_PASSWORD_FILE) or None
        if password is None and password_file is not None:
            with open(password_file, encoding="utf-8") as fh:
                password = fh.readline().rstrip("\r\n")
        if not password:
            raise ValueError(
                f"user {user!r} has no password (give password=, password_file=, "
                f"or set {ENV_PASSWORD} or {ENV_PASSWORD_FILE})"
            )
        if not user or any(c.isspace() for c in user):
            raise ValueError("a user name holds no white space")
        return cls(user, password)


def login_op(credentials: Credentials) -> Op[None]:
    """memcached's ASCII login: a ``set`` whose data is ``<user> <password>``, answered
    ``STORED`` (a failure raises ServerReplyError: ``authentication failure``)."""
    data = f"{credentials.user} {credentials.password}".encode()
    return Op([Set(LOGIN_KEY, 0, 1, data)], _expect("STORED"))


# ---- the server list ------------------------------------------------------------------------


class ServerState:
    """One server of the list and its health."""

    __slots__ = ("address", "aside_until", "failures", "host", "port")

    def __init__(self, address: str) -> None:
        self.address = address
        self.host, self.port = parse_server(address)
        self.failures = 0
        self.aside_until = 0.0


class Cluster:
    """The servers, which are set aside, and random choice among the others."""

    def __init__(
        self,
        servers: str | Sequence[str],
        retry_after: float,
        max_retry_after: float,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        names = [servers] if isinstance(servers, str) else list(servers)
        if not names:
            raise ValueError("no servers given")
        self.servers = [ServerState(s) for s in names]
        self.by_address = {s.address: s for s in self.servers}
        self.retry_after = retry_after
        self.max_retry_after = max_retry_after
        self.rng = rng or random.Random()
        self.clock = clock

    def healthy(self) -> list[ServerState]:
        """The servers not set aside, in random order. Raises NoServerAvailable if none."""
        now = self.clock()
        up = [s for s in self.servers if s.aside_until <= now]
        if not up:
            soonest = min(s.aside_until for s in self.servers) - now
            raise NoServerAvailable(f"every server failed recently; next retry in {soonest:.1f}s")
        self.rng.shuffle(up)
        return up

    def server(self, address: str) -> ServerState:
        """The state of ``address`` (which must be in the list)."""
        try:
            return self.by_address[address]
        except KeyError:
            raise ValueError(f"{address} is not one of this client's servers") from None

    def is_aside(self, server: ServerState) -> bool:
        """True while ``server`` is set aside after a failure."""
        return server.aside_until > self.clock()

    def failed(self, server: ServerState) -> None:
        """Set ``server`` aside: retry_after, doubled per consecutive failure, capped."""
        server.failures += 1
        delay = min(self.max_retry_after, self.retry_after * 2 ** (server.failures - 1))
        server.aside_until = self.clock() + delay

    def ok(self, server: ServerState) -> None:
        """A request to ``server`` succeeded: forget its failures."""
        server.failures = 0
        server.aside_until = 0.0


# ---- operations -----------------------------------------------------------------------------


C = TypeVar("C")


class ClientBase(Generic[C]):
    """What :class:`~tercel.client.Client` and :class:`~tercel.client.AsyncClient` share
    before any I/O: the cluster, the time limits and one pool of connections per server."""

    def __init__(
        self,
        servers: str | Sequence[str],
        *,
        timeout: float = 5.0,
        connect_timeout: float = 2.0,
        retry_after: float = 1.0,
        max_retry_after: float = 30.0,
        rotate_interval: float = 0.5,
        pool_size: int = 8,
        tls: TLSOptions | ssl.SSLContext | None = None,
        user: str | None = None,
        password: str | None = None,
        password_file: str | None = None,
    ) -> None:
        self.credentials = Credentials.resolve(user, password, password_file)
        """Sent on every new connection (:func:`login_op`): ``user`` with ``password`` or
        ``password_file``, else ``TERCEL_USER`` and ``TERCEL_PASSWORD``/
        ``TERCEL_PASSWORD_FILE`` from the environment; None: no login."""
        self.cluster = Cluster(servers, retry_after, max_retry_after)
        self.tls = Secured(tls)
        """TLS to every server (``tls``: :class:`~tercel.client.tls.TLSOptions` or a context
        of the caller's), or plaintext."""
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.rotate_interval = rotate_interval
        self.pool_size = pool_size
        self._pools: dict[str, list[C]] = {s.address: [] for s in self.cluster.servers}
        self._lock = threading.Lock()
        """Guards the pools across the blocking client's threads (uncontended on one loop)."""


@dataclass(slots=True)
class Op(Generic[T]):
    """Commands to pipeline on one connection, and what their replies mean."""

    commands: list[Command]
    finish: Callable[[list[Reply], str], T]
    wait: float = 0.0
    """Seconds the server may legitimately hold the reply (a blocking read)."""


def check(reply: Reply, server: str) -> Reply:
    """``reply`` unless it is an error reply, which is raised as ServerReplyError."""
    if isinstance(reply, ErrorReply):
        raise ServerReplyError(reply.kind, reply.reason, server)
    return reply


def _line(reply: Reply, server: str) -> str:
    reply = check(reply, server)
    if not isinstance(reply, Line):
        raise BadReply(f"expected a status line, got {reply!r}", server)
    return reply.text


def _expect(word: str) -> Callable[[list[Reply], str], None]:
    def finish(replies: list[Reply], server: str) -> None:
        for r in replies:
            text = _line(r, server)
            if text != word:
                raise BadReply(f"expected {word}, got {text!r}", server)

    return finish


def _stored(replies: list[Reply], server: str) -> int:
    texts = [_line(r, server) for r in replies]
    stored = texts.count("STORED")
    if stored != len(texts):
        bad = next(t for t in texts if t != "STORED")
        if bad != "NOT_STORED":
            raise BadReply(f"unexpected reply to set: {bad!r}", server)
        raise NotStored(
            f"{len(texts) - stored} of {len(texts)} item(s) not stored (queue full or item "
            "too large)",
            server,
            stored,
        )
    return stored


def put_op(queue: str, items: Iterable[bytes], expiry: float | None) -> Op[int]:
    """``set`` each item (pipelined); finish raises NotStored unless all were stored."""
    exp = exptime(expiry, time.time())
    return Op([Set(queue, 0, exp, bytes(data)) for data in items], _stored)


# ---- keyed puts (dedup keys, docs/protocol.md "Dedup keys") ------------------------------------


@dataclass(frozen=True)
class Stored:
    """What a put with a dedup key got: the item's id on ``server``; ``duplicate`` True when
    an earlier put with the key, within the queue's dedup window, stored it (this one stored
    nothing, and ``item_id`` is the original's)."""

    item_id: int
    duplicate: bool
    server: str


def server_index(key: str, servers: int) -> int:
    """The server a dedup key's puts go to: ``zlib.crc32(key) % servers``, so that a retry
    lands where the first try did (its key is remembered there)."""
    return zlib.crc32(key.encode("utf-8")) % servers


def keyed_put_op(
    queue: str, items: Sequence[tuple[str, bytes]], expiry: float | None
) -> Op[list[Stored]]:
    """``set ... key=<K>`` of each ``(key, data)`` (pipelined); finish raises NotStored when
    one was refused (``stored`` counts the ones acknowledged before it), BadReply when the
    server answers a plain ``STORED`` (it keeps no dedup keys: the put was not deduplicated)."""
    exp = exptime(expiry, time.time())
    cmds: list[Command] = [KeyedSet(queue, 0, exp, bytes(data), key) for key, data in items]
    return Op(cmds, _stored_ids)


def keyed_put_count_op(
    queue: str, items: Sequence[tuple[str, bytes]], expiry: float | None
) -> Op[int]:
    """:func:`keyed_put_op` for ``put_many``: the count acknowledged (stored and duplicates),
    each reply checked as there, no :class:`Stored` made per item."""
    exp = exptime(expiry, time.time())
    cmds: list[Command] = [KeyedSet(queue, 0, exp, bytes(data), key) for key, data in items]
    return Op(cmds, _stored_count)


def _stored_count(replies: list[Reply], server: str) -> int:
    n = 0
    for r in replies:
        text = _line(r, server)
        rest = text[7:]
        if text[:7] == "STORED " and (rest.isdigit() or rest.removesuffix(" duplicate").isdigit()):
            n += 1
            continue
        if text == "NOT_STORED":
            raise NotStored(_not_stored(len(replies), n), server, n)
        raise BadReply(_unexpected(text), server)
    return n


def _not_stored(total: int, stored: int) -> str:
    return (
        f"{total - stored} of {total} item(s) not stored from the first refused on (queue full"
        " or item too large)"
    )


def _unexpected(text: str) -> str:
    return (
        f"unexpected reply to a keyed set: {text[:80]!r} (a server without dedup keys answers"
        " a plain STORED)"
    )


def _stored_ids(replies: list[Reply], server: str) -> list[Stored]:
    out: list[Stored] = []
    for r in replies:
        text = _line(r, server)
        if text[:7] == "STORED " and text[7:].isdigit():  # the common reply: one split saved
            out.append(Stored(int(text[7:]), False, server))
            continue
        words = text.split()
        if words == ["NOT_STORED"]:
            raise NotStored(_not_stored(len(replies), len(out)), server, len(out))
        if (
            len(words) not in (2, 3)
            or words[0] != "STORED"
            or not words[1].isdigit()
            or (len(words) == 3 and words[2] != "duplicate")
        ):
            raise BadReply(_unexpected(text), server)
        out.append(Stored(int(words[1]), len(words) == 3, server))
    return out


def by_server(
    cluster: Cluster, items: Sequence[bytes], keys: Sequence[str]
) -> dict[str, list[tuple[str, bytes]]]:
    """``(key, data)`` of each item grouped by the server its key picks (:func:`server_index`),
    in order; ValueError unless there is one key per item."""
    if len(keys) != len(items):
        raise ValueError(f"{len(keys)} keys for {len(items)} items: one key per item")
    servers = cluster.servers
    if len(servers) == 1:
        return {servers[0].address: list(zip(keys, items, strict=True))}
    out: dict[str, list[tuple[str, bytes]]] = {}
    for key, data in zip(keys, items, strict=True):
        address = servers[server_index(key, len(servers))].address
        out.setdefault(address, []).append((key, data))
    return out


def get_op(queue: str, wait: float, *, peek: bool = False) -> Op[bytes | None]:
    """A plain get (or peek) waiting up to ``wait`` seconds for an item."""
    key = get_key(queue, timeout_ms=ms(wait) or None, peek=peek)
    return Op([Get(key, queue, ms(wait) or None, peek=peek)], _value_data, wait)


def _value_data(replies: list[Reply], server: str) -> bytes | None:
    reply = _value(replies[0], server)
    return None if reply is None else reply.data


def _value(reply: Reply, server: str) -> Value | None:
    reply = check(reply, server)
    if isinstance(reply, Value):
        return reply
    if isinstance(reply, Line) and reply.text == "END":
        return None
    raise BadReply(f"unexpected reply to get: {reply!r}", server)


def open_op(queue: str, wait: float) -> Op[Value | None]:
    """``gets queue[/t=ms]/open``: an open read whose reply carries the item id as cas."""
    key = get_key(queue, timeout_ms=ms(wait) or None, open=True)
    get = Get(key, queue, ms(wait) or None, open=True, cas=True)
    return Op([get], lambda replies, server: _value(replies[0], server), wait)


def close_op(queue: str, *, abort: bool) -> Op[None]:
    """``get queue/close`` (confirm) or ``get queue/abort``: both answer END."""
    key = get_key(queue, close=not abort, abort=abort)
    return Op([Get(key, queue, close=not abort, abort=abort)], _expect("END"))


def _lease_command(
    queue: str, max_items: int, wait: float, lease_time: float | None, columns: bool
) -> Lease:
    if max_items < 0:
        raise ValueError("max_items must not be negative")
    lease_ms = 0 if lease_time is None else max(1, ms(lease_time))
    return Lease(queue, max_items, ms(wait), lease_ms, columns)


def lease_op(queue: str, max_items: int, wait: float, lease_time: float | None) -> Op[list[Leased]]:
    """``lease``: up to ``max_items``, waiting up to ``wait`` s while empty; lease_time None:
    the lease never expires."""
    cmd = _lease_command(queue, max_items, wait, lease_time, False)

    def finish(replies: list[Reply], server: str) -> list[Leased]:
        reply = check(replies[0], server)
        if not isinstance(reply, LeaseBatch):
            raise BadReply(f"unexpected reply to lease: {reply!r}", server)
        return [
            Leased(
                queue,
                server,
                i.lease_id,
                i.item_id,
                i.deliveries,
                i.add_ms / 1000,
                i.expiry_ms / 1000 if i.expiry_ms else None,
                i.data,
            )
            for i in reply.items
        ]

    return Op([cmd], finish, wait)


def lease_columns_op(
    queue: str, max_items: int, wait: float, lease_time: float | None
) -> Op[LeaseColumns]:
    """``lease`` as :func:`lease_op`, the reply as flat columns (no object per item)."""
    cmd = _lease_command(queue, max_items, wait, lease_time, True)

    def finish(replies: list[Reply], server: str) -> LeaseColumns:
        reply = check(replies[0], server)
        if not isinstance(reply, LeaseColumns):
            raise BadReply(f"unexpected reply to lease: {reply!r}", server)
        return reply

    return Op([cmd], finish, wait)


def _counted(word: str) -> Callable[[list[Reply], str], int]:
    def finish(replies: list[Reply], server: str) -> int:
        n = 0
        for r in replies:
            text = _line(r, server)
            head, _, count = text.partition(" ")
            if head != word or not count.isdigit():
                raise BadReply(f"expected {word} <n>, got {text!r}", server)
            n += int(count)
        return n

    return finish


def lease_end_op(verb: str, queue: str, ids: list[str], lease_time: float | None = None) -> Op[int]:
    """``ack``, ``release`` or ``renew`` for ``ids`` (split into lines of IDS_PER_LINE)."""
    chunks = [tuple(ids[i : i + IDS_PER_LINE]) for i in range(0, len(ids), IDS_PER_LINE)]
    cmds: list[Command]
    if verb == "ack":
        cmds, word = [Ack(queue, c) for c in chunks], "ACKED"
    elif verb == "release":
        cmds, word = [Release(queue, c) for c in chunks], "RELEASED"
    else:
        lease_ms = 0 if lease_time is None else max(1, ms(lease_time))
        cmds, word = [Renew(queue, lease_ms, c) for c in chunks], "RENEWED"
    return Op(cmds, _counted(word))


def group_leases(items: Iterable[Leased]) -> dict[tuple[str, str], list[str]]:
    """Lease ids by (server, queue): each group goes to the server that leased it."""
    groups: dict[tuple[str, str], list[str]] = {}
    for item in items:
        groups.setdefault((item.server, item.queue), []).append(item.lease_id)
    return groups


def delete_op(queue: str) -> Op[None]:
    return Op([Delete(queue)], _expect("DELETED"))


def flush_op(queue: str) -> Op[None]:
    return Op([Flush(queue)], _expect("END"))


def status_op(value: str | None = None) -> Op[str]:
    """``status`` (the server's status name) or ``status <value>`` (set it; ``END``)."""

    def finish(replies: list[Reply], server: str) -> str:
        text = _line(replies[0], server)
        if value is not None and text != "END":
            raise BadReply(f"unexpected reply to status: {text!r}", server)
        return text if value is None else value.upper()

    return Op([Status(value)], finish)


def stats_op() -> Op[dict[str, str]]:
    def finish(replies: list[Reply], server: str) -> dict[str, str]:
        reply = check(replies[0], server)
        if not isinstance(reply, Listing):
            raise BadReply(f"unexpected reply to stats: {reply!r}", server)
        return dict(reply.pairs)

    return Op([Simple("stats")], finish)


def dump_stats_op() -> Op[dict[str, dict[str, str]]]:
    def finish(replies: list[Reply], server: str) -> dict[str, dict[str, str]]:
        reply = check(replies[0], server)
        if not isinstance(reply, Blocks):
            raise BadReply(f"unexpected reply to dump_stats: {reply!r}", server)
        return reply.blocks

    return Op([DumpStats(())], finish)


def version_op() -> Op[str]:
    def finish(replies: list[Reply], server: str) -> str:
        text = _line(replies[0], server)
        if not text.startswith("VERSION "):
            raise BadReply(f"unexpected reply to version: {text!r}", server)
        return text[len("VERSION ") :]

    return Op([Simple("version")], finish)


def slices(total: float | None, interval: float, servers: int) -> Iterable[float]:
    """How long each attempt of a rotating read may wait on one server.

    ``total`` None: one pass over the servers without waiting. Otherwise slices of at most
    ``interval`` (the whole wait when there is a single server) until ``total`` is used up,
    and at least one attempt per server (those past the deadline do not wait), so a short
    timeout still asks every server; the caller stops early when it gets an item. Uses the
    monotonic clock.
    """
    if total is None:
        yield from [0.0] * servers
        return
    deadline = time.monotonic() + total
    step = total if servers == 1 else interval
    attempts = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0 and attempts >= max(servers, 1):
            return
        attempts += 1
        yield max(0.0, min(step, left))
