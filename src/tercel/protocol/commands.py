"""The commands of Kestrel's memcache protocol, as typed values.

Plain slotted dataclasses, validated by the codec when built; nothing mutates them. The two
on every request's path, :class:`Get` and :class:`Set`, are named tuples instead: the codec
builds them with ``tuple.__new__`` (one C call, no ``__init__`` frame) and handlers unpack them
in one step, which measured ~40 fewer bytecodes per request than a dataclass (docs/benchmarks.md).
Queue names are ``str`` (ASCII, already checked by :mod:`tercel.names`); payloads are ``bytes``.
Times on the wire are kept in the wire's units: ``Get.timeout`` in ms, ``Set.exptime`` raw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, NamedTuple


class Get(NamedTuple):
    """``get <queue>[/t=<ms>][/open][/close][/abort][/peek]`` (also ``gets``)."""

    key: bytes
    """The key exactly as the client sent it; VALUE replies echo it."""
    queue: str
    timeout: int | None = None
    """Milliseconds to wait for an item; None (or <= 0 on the wire) means do not wait."""
    open: bool = False
    close: bool = False
    abort: bool = False
    peek: bool = False
    cas: bool = False
    """True for ``gets``: the reply carries the item id as the cas field."""


class Set(NamedTuple):
    """``set <queue> <flags> <exptime> <bytes> [noreply]`` and its payload."""

    queue: str
    flags: int
    exptime: int
    data: bytes
    noreply: bool = False


GET_CLASS: Final = Get
SET_CLASS: Final = Set
"""The two named-tuple classes again, for compiled code: a named tuple is not a native class, so
compiled code finds ``Get`` or ``Set`` in its module's namespace (a dict lookup, ~130
instructions) at every use, and a ``Final`` alias is a C static instead."""


@dataclass(slots=True)
class Delete:
    """``delete <queue> [noreply]``: drop the queue and its journal."""

    queue: str
    noreply: bool = False


@dataclass(slots=True)
class Flush:
    """``flush <queue> [noreply]``: drop every item that is not open."""

    queue: str
    noreply: bool = False


@dataclass(slots=True)
class FlushAll:
    """``flush_all [delay] [noreply]``: flush every queue."""

    noreply: bool = False


@dataclass(slots=True)
class FlushExpired:
    """``flush_expired <queue>``: drop expired items now; reply the count."""

    queue: str


@dataclass(slots=True)
class Simple:
    """A command without arguments: ``version``, ``shutdown``, ``reload``, ``dump_config``,
    ``stats``, ``flush_all_expired``, ``quit``. ``name`` is the lower-cased command."""

    name: str


@dataclass(slots=True)
class DumpStats:
    """``dump_stats [queue...]``."""

    queues: tuple[str, ...]


@dataclass(slots=True)
class Status:
    """``status`` (answer the current status) or ``status <new>`` (set it; any case)."""

    value: str | None = None


@dataclass(slots=True)
class Unknown:
    """A command the server does not know (answered with bare ``ERROR``)."""

    name: bytes


# ---- extensions: leases (docs/protocol.md, "Leases and extensions") and Kestrel 2.x ----------


@dataclass(slots=True)
class Lease:
    """``lease <queue> <max_items> <wait_ms> <lease_ms>``: take up to max_items into leases."""

    queue: str
    max_items: int
    wait_ms: int
    lease_ms: int
    """0: the lease never expires (it ends by ack, release or a restart)."""
    columns: bool = False
    """``lease ... binary``: the reply is one ``LEASEDB`` block (a column table and one
    payload buffer, docs/protocol.md section 11) instead of a ``LEASED`` line per item; the
    client codec parses it (or an old server's text reply) into one ``LeaseColumns``."""


@dataclass(slots=True)
class Ack:
    """``ack <queue> <lease_id>...``: confirm leased items for good."""

    queue: str
    ids: tuple[str, ...]


@dataclass(slots=True)
class Release:
    """``release <queue> <lease_id>...``: return leased items to their places in the queue."""

    queue: str
    ids: tuple[str, ...]


@dataclass(slots=True)
class Renew:
    """``renew <queue> <lease_ms> <lease_id>...``: push the leases' expiry to now + lease_ms."""

    queue: str
    lease_ms: int
    ids: tuple[str, ...]


@dataclass(slots=True)
class Monitor:
    """``monitor <queue> <seconds> [max_items]`` (Kestrel 2.x): stream open reads."""

    queue: str
    seconds: int
    max_items: int | None = None


@dataclass(slots=True)
class Confirm:
    """``confirm <queue> <count>`` (Kestrel 2.x): confirm the oldest ``count`` open reads."""

    queue: str
    count: int


# ---- extension: dedup keys (docs/protocol.md, "Dedup keys") ---------------------------------


class KeyedSet:
    """``set <queue> <flags> <exptime> <bytes> key=<K> [noreply]`` and its payload: a put
    with a dedup key, answered ``STORED <item_id>`` or ``STORED <item_id> duplicate``.

    A plain class, not a dataclass like the others: compiled, a dataclass is built through its
    generated ``__init__`` (an interpreted call, ~2,400 instructions), and every keyed put
    builds one."""

    __slots__ = ("data", "exptime", "flags", "key", "noreply", "queue")

    def __init__(  # noqa: PLR0917 (the fields in order, as the dataclasses beside it take them)
        self, queue: str, flags: int, exptime: int, data: bytes, key: str, noreply: bool = False
    ) -> None:
        self.queue = queue
        self.flags = flags
        self.exptime = exptime
        self.data = data
        self.key = key
        self.noreply = noreply

    def _fields(self) -> tuple[str, int, int, bytes, str, bool]:
        return (self.queue, self.flags, self.exptime, self.data, self.key, self.noreply)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KeyedSet) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        queue, flags, exptime, data, key, noreply = self._fields()
        return f"KeyedSet({queue!r}, {flags}, {exptime}, {data!r}, {key!r}, {noreply})"


# ---- keyed leases (docs/protocol.md section 11, "Keyed leases") -------------------------------


@dataclass(slots=True)
class LeaseKey:
    """``lease <queue> <max_items> <wait_ms> <lease_ms> [binary] key=<key> [nodata]``: take up
    to ``max_items`` under ``key``, or (the key taken before) get the same items again."""

    queue: str
    key: str
    max_items: int
    wait_ms: int
    lease_ms: int
    """0: the queue's ``key_lease_ms``."""
    columns: bool = False
    """``binary``: the items as one ``LEASEDB`` block."""
    nodata: bool = False
    """``nodata``: one ``KEYED <count> <bytes> <expires_ms>`` line, no item and no payload."""


@dataclass(slots=True)
class LeaseSlice:
    """``lease <queue> slice <start> <stop> [binary] key=<key>``: items ``start..stop-1`` of
    the keyed lease ``key`` (never takes anything)."""

    queue: str
    key: str
    start: int
    stop: int
    columns: bool = False


@dataclass(slots=True)
class AckKey:
    """``ack <queue> key=<key>``: confirm every item of the keyed lease for good."""

    queue: str
    key: str


@dataclass(slots=True)
class ReleaseKey:
    """``release <queue> key=<key>``: return every item of the keyed lease to its place."""

    queue: str
    key: str


@dataclass(slots=True)
class RenewKey:
    """``renew <queue> <lease_ms> key=<key>``: the keyed lease expires ``lease_ms`` from now
    (0: the queue's ``key_lease_ms``)."""

    queue: str
    lease_ms: int
    key: str


Command = (
    Get
    | Set
    | KeyedSet
    | Delete
    | Flush
    | FlushAll
    | FlushExpired
    | Simple
    | DumpStats
    | Status
    | Unknown
    | Lease
    | Ack
    | Release
    | Renew
    | Monitor
    | Confirm
    | LeaseKey
    | LeaseSlice
    | AckKey
    | ReleaseKey
    | RenewKey
)
