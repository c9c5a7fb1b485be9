"""Kestrel's operations, once for its three front ends (memcache, text, Thrift).

Each operation is protocol-neutral: it takes the connection (or the server context), does the
work on the queues, counts it in the global stats and raises the tree's errors; the caller
formats the result as its protocol's reply. The status checks are declared per operation in
each front end's table (:class:`~tercel.server.connection.Operation`) and made by the pump;
only memcache's ``get``/``set`` test the flags inline (their fast path, in
``server/memcache/connection.py``, with the hot read itself in :mod:`tercel.session`).

Errors: :func:`error_kind` sorts the tree's errors into the few kinds Kestrel's protocols
answer differently; each front end words each kind its own way (``CLIENT_ERROR``, ``-...``,
a ``TApplicationException``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Final

from tercel.core.queue import READ_OPEN, PersistentQueue, QItem
from tercel.core.reservations import Reservation
from tercel.errors import (
    BadKey,
    ConfigError,
    ItemTooLarge,
    JournalError,
    NoSpaceLeft,
    OpenReadError,
    ProtocolError,
    QueueError,
    TercelError,
    UnavailableError,
)
from tercel.server.context import ServerContext
from tercel.server.kestrel.connection import KestrelConnection
from tercel.server.status import Status, parse_status
from tercel.session import Delivery, PendingRead

log = logging.getLogger(__name__)

# ---- errors -------------------------------------------------------------------------------

BAD_REQUEST: Final = 0
"""A request the codec or the queues refuse (``ProtocolError``, ``QueueError``): its reason."""
OPEN_READS: Final = 1
"""A Kestrel open-read violation (``OpenReadError``)."""
UNAVAILABLE: Final = 2
"""The status or shutdown refuses the operation, or a limit is reached (``UnavailableError``)."""
JOURNAL: Final = 3
"""A journal write failed (``JournalError``)."""
CONFIG: Final = 4
"""``reload`` refused a bad config file (``ConfigError``)."""
NO_SPACE: Final = 5
"""The file system has no room for the journal file of a queue the request would create
(``NoSpaceLeft``): every front end names the disk."""
OTHER: Final = 6


def error_kind(exc: TercelError) -> int:
    """The kind of ``exc``, one of the constants above (an error that is both unavailable and
    a journal error, ``JournalOutOfDescriptors``, is ``UNAVAILABLE``)."""
    if isinstance(exc, OpenReadError):
        return OPEN_READS
    if isinstance(exc, ProtocolError | QueueError):
        return BAD_REQUEST
    if isinstance(exc, UnavailableError):
        return NO_SPACE if isinstance(exc, NoSpaceLeft) else UNAVAILABLE
    if isinstance(exc, JournalError):
        return JOURNAL
    if isinstance(exc, ConfigError):
        return CONFIG
    return OTHER


def error_reason(exc: TercelError) -> str:
    """The error's ``reason`` (what the client is told), or its text."""
    reason: str | None = getattr(exc, "reason", None)
    return reason or str(exc)


# ---- status ---------------------------------------------------------------------------------


def status(ctx: ServerContext) -> Status:
    """The server's status now."""
    return ctx.status.current


def set_status(ctx: ServerContext, new: Status) -> None:
    """Persist and apply ``new``; UnavailableError when the status file cannot be written."""
    try:
        ctx.set_status(new)
    except OSError as exc:
        raise UnavailableError(f"cannot write the status file: {exc.strerror or exc}") from None


def set_status_word(ctx: ServerContext, word: str) -> None:
    """:func:`set_status` from a client's word (any case); QueueError for an unknown one."""
    try:
        new = parse_status(word)
    except ValueError as exc:
        raise QueueError(str(exc)) from None
    set_status(ctx, new)


# ---- writes ---------------------------------------------------------------------------------


def put_items(
    ctx: ServerContext, queue: str, items: Sequence[bytes], expiry_ms: int, stop_at_refusal: bool
) -> int:
    """Add ``items`` to ``queue`` in order, each expiring ``expiry_ms`` from now (0 or less:
    never); the number added. An item refused (queue full, larger than ``max_item_size``) is
    not counted; with ``stop_at_refusal`` the items after it are not tried (Thrift's ``put``),
    without it they are (the text ``put``). The reply must go through the connection's pump,
    which holds it until every record is journaled. No log maintenance runs inside the batch
    (a rotation would write the items added so far): each queue's journal gets the batch in
    the pass's one write, so a write failure keeps none of it (docs/protocol.md). Counts
    ``cmd_set`` per item. (Memcache's one-item ``set`` is its own fast path.)

    The caller's table declares ``WRITES``. Raises BadQueueName or a journal error.
    """
    coll = ctx.collection
    now = ctx.now
    expiry = now + expiry_ms if expiry_ms > 0 else None
    coll.stats.cmd_set += len(items)
    n = 0
    for data in items:
        try:
            stored = coll.add(queue, data, expiry, now, maintain=False)
        except ItemTooLarge:
            stored = False
        if stored:
            n += 1
        elif stop_at_refusal:
            break
    return n


def put_keyed(
    ctx: ServerContext,
    queue: str,
    key: str,
    data: bytes,
    expiry: int | None,
    *,
    maintain: bool = True,
) -> int:
    """Add one item with a dedup key (docs/protocol.md, "Dedup keys"), ``expiry`` in
    absolute epoch ms (None: never): the new item's id, ``-id`` when a put with ``key``
    stored item ``id`` within the queue's window (a duplicate: nothing stored), 0 when the
    queue refused it (full). Counts ``cmd_set``. The caller's table declares ``WRITES``; the
    reply goes through the pump (held until the ADD_KEYED record is written).

    Raises BadKey, BadQueueName, ItemTooLarge, TooManyKeys or a journal error."""
    coll = ctx.collection
    coll.stats.cmd_set += 1
    return coll.add_keyed(queue, key, data, expiry, ctx.now, maintain=maintain)


def flush(ctx: ServerContext, queue: str) -> None:
    """Drop every item of ``queue`` that is not open (``WRITES``)."""
    ctx.collection.flush(queue)


def flush_all(ctx: ServerContext) -> None:
    """:func:`flush` every queue (``WRITES``)."""
    ctx.collection.flush_all()


def delete(ctx: ServerContext, queue: str) -> None:
    """Drop ``queue`` and its journal (``WRITES``)."""
    ctx.collection.delete(queue)


# ---- open reads -----------------------------------------------------------------------------


def confirm(conn: KestrelConnection, queue: str, count: int) -> bool:
    """Confirm the oldest ``count`` open reads ``conn`` holds on ``queue``; False (nothing
    confirmed) when fewer are open. Allowed whatever the status (``ANY``), as in Kestrel:
    reads opened before QUIESCENT can end."""
    session = conn.session
    if count > session.open_count(queue):
        return False
    for _ in range(count):
        session.confirm_oldest(queue)
    return True


def head(ctx: ServerContext, queue: str, now: int) -> QItem | None:
    """The head item of ``queue`` now, not taken; None when empty or missing (not created)."""
    q = ctx.collection.for_reading(queue, create=False)
    return None if q is None else q.peek(now)


class Monitor:
    """A ``monitor`` in progress (memcache's Kestrel 2.x one, and the text protocol's): open
    reads on ``queue`` streamed as they come until ``left`` are sent, the connection holds
    ``max_open_reads`` on the queue, or ``deadline`` (epoch ms) passes; then :meth:`end`.
    A front end subclasses it with its formatting (:meth:`emit`, :meth:`end`) and may
    override :meth:`take` (the text protocol checks the head first).

    ``wait_mode`` is how it waits for an item: ``READ_OPEN`` (the queue opens the item for it
    and the delivery streams it) or ``READ_PEEK`` (woken by an item, it reads again, and may
    lose it to another reader). ``counts_miss``: a stream that ends without waiting counts a
    miss (the text protocol's, as its ``get``)."""

    def __init__(  # noqa: PLR0917 - a base built by two subclasses only
        self,
        conn: KestrelConnection,
        queue: str,
        left: int,
        deadline: int,
        wait_mode: int = READ_OPEN,
        counts_miss: bool = False,
    ) -> None:
        self.conn = conn
        self.queue = queue
        self.left = left
        self.deadline = deadline
        self.wait_mode = wait_mode
        self.counts_miss = counts_miss
        self.stop: bytes | None = None
        """A reply that ends the stream at once instead of :meth:`end` (set by :meth:`take`)."""

    # ---- what a front end fills in ------------------------------------------------------

    def emit(self, item: QItem) -> None:
        """Append one streamed item to the connection's ``out``."""
        raise NotImplementedError

    def end(self) -> bytes:
        """The reply that ends the stream (also the one of a timeout)."""
        raise NotImplementedError

    def take(self, now: int) -> QItem | None:
        """Open the next read, or None (none there, or :attr:`stop` set)."""
        got = self.conn.session.fetch(self.queue, READ_OPEN, now)
        return None if got is None else got[1]

    def failed(self, exc: TercelError) -> bool:
        """A tree error after the stream began: True when handled here, else it is the
        connection's error reply."""
        return False

    # ---- the operation -------------------------------------------------------------------

    def run(self) -> bool:
        """Stream what is there; park for more while time is left. True when parked."""
        conn = self.conn
        session = conn.session
        limit = session.max_open_reads
        now = conn.ctx.clock.now_ms()
        while self.left > 0 and session.open_count(self.queue) < limit:
            item = self.take(now)
            if item is None:
                break
            self.emit(item)
            self.left -= 1
        if self.stop is not None:
            conn.out.append(self.stop)
            return False
        if self.left > 0 and session.open_count(self.queue) < limit and self.deadline > now:
            pending = session.wait(self.queue, self.wait_mode, self._delivered)
            if pending is not None:
                conn.park(self, pending, self.deadline - now, self.end())
                return True
        if self.counts_miss and self.left > 0 and session.open_count(self.queue) < limit:
            session.count_miss()
        conn.out.append(self.end())
        return False

    def _delivered(self, xid: int, item: QItem | None) -> None:
        if not self.conn.settle_parked(item):
            return
        if self.wait_mode == READ_OPEN:
            assert item is not None
            self.emit(item)
            self.left -= 1
        self.conn.continue_soon(self._more)

    def _more(self) -> bool:
        try:
            return self.run()
        except TercelError as exc:
            if not self.failed(exc):
                raise
            return False


# ---- leases and reservations by id ----------------------------------------------------------


def source(ctx: ServerContext, name: str) -> PersistentQueue | None:
    """The queue a lease or a Thrift ``get``/``peek`` of ``name`` reads, created if missing
    (as Kestrel did); None for an alias (nothing to read: an empty answer)."""
    coll = ctx.collection
    return None if coll.is_alias(name) else coll.get_or_create(name)


def lease(
    ctx: ServerContext,
    queue: PersistentQueue,
    max_items: int,
    lease_ms: int,
    now: int,
    *,
    max_bytes: int | None = None,
) -> list[Reservation]:
    """Lease up to ``max_items`` items from the head of ``queue`` for ``lease_ms`` (detached
    reservations: no connection owns them, any may end them by id, the deadline returns them;
    :meth:`ReservationTable.take_leases`, ``max_bytes`` included) and keep the expiry timer
    armed. Raises TooManyLeases when the queue's ``max_open_leases`` are all out."""
    service = ctx.reservations
    try:
        return service.table.take_leases(queue, max_items, lease_ms, now, max_bytes)
    finally:
        service.arm()


class LeaseWaiter(PendingRead):
    """A blocked lease: the queue opens the first item for it; that read is detached from the
    session at once (a lease belongs to no connection)."""

    __slots__ = ()

    def deliver(self, xid: int, item: QItem) -> None:
        self.session.pending = None
        self.session.collection.stats.get_hits += 1
        self.callback(xid, item)


def wait_lease(conn: KestrelConnection, queue: PersistentQueue, delivered: Delivery) -> LeaseWaiter:
    """Block a lease on the empty ``queue``: ``delivered(xid, item)`` gets the first item the
    queue opens for it (adopt it with ``table.adopt``), or ``(0, None)`` at the deadline the
    caller parks with."""
    waiter = LeaseWaiter(conn.session, queue, READ_OPEN, delivered)
    queue.wait(waiter)
    conn.session.pending = waiter
    return waiter


def reserved(
    ctx: ServerContext, queue: str, ids: Sequence[int], detached_only: bool
) -> list[Reservation]:
    """The open reservations of ``queue`` among ``ids`` (unknown ones left out); with
    ``detached_only`` not those a connection holds for itself (its session's open reads)."""
    q = ctx.collection.queue(queue)
    if q is None:
        return []
    found = ctx.reservations.table.find(q, list(ids))
    return [r for r in found if r.owner is None] if detached_only else found


def confirm_reserved(ctx: ServerContext, found: list[Reservation]) -> int:
    """End ``found`` for good (memcache ``ack``, Thrift ``confirm``); the count ended."""
    return ctx.reservations.table.confirm(found)


def abort_reserved(ctx: ServerContext, found: list[Reservation]) -> int:
    """Return ``found`` to their places, in queue order (``release``, Thrift ``abort``)."""
    return ctx.reservations.table.abort(found)


def renew(ctx: ServerContext, found: list[Reservation], lease_ms: int) -> int:
    """Push ``found``'s deadlines to ``lease_ms`` from now; the count renewed."""
    service = ctx.reservations
    n = service.table.extend(found, lease_ms)
    service.arm()
    return n


def queue_info(ctx: ServerContext, name: str) -> tuple[bytes | None, int, int, int, int, int, int]:
    """Thrift's ``peek``: the head item (not taken), items, bytes, journal size, age (ms),
    waiters and open reads of ``name``, created if missing as in Kestrel (an alias: nothing)."""
    q = source(ctx, name)
    if q is None:
        return (None, 0, 0, 0, 0, 0, 0)
    now = ctx.clock.now_ms()
    first = q.peek(now)
    return (
        None if first is None else first.data,
        len(q),
        q.bytes,
        q.log.current_size,
        q.age(now),
        q.waiters,
        q.open_reads,
    )


# ---- keyed leases (docs/protocol.md section 11, "Keyed leases") ---------------------------------
# The core keeps them (``PersistentQueue.take_keyed``...); these add the server's rules: a key
# belongs to one queue of the server, and an operation on a key names a queue that has it.

KEYED_ID_PREFIX: Final = "key-"
"""How the lease id of a keyed lease's item begins (``key-<place in hex>``)."""


def _owner_check(ctx: ServerContext, name: str, key: str) -> None:
    """BadKey when ``key`` (live or remembered) belongs to another queue than ``name``."""
    owner = ctx.collection.lease_key_queue(key)
    if owner is not None and owner != name:
        raise BadKey(f"lease key {key} belongs to queue {owner}")


def keyed_source(ctx: ServerContext, name: str, key: str) -> PersistentQueue | None:
    """The queue a keyed take of ``key`` on ``name`` reads, created if missing as for a
    lease; None for an alias (nothing to take). Raises BadKey for a key of another queue."""
    _owner_check(ctx, name, key)
    return source(ctx, name)


def keyed_queue(ctx: ServerContext, name: str, key: str) -> PersistentQueue:
    """The queue that holds ``key`` for a slice, ack, release or renew. Raises BadKey for a
    key of another queue, or a queue that does not exist (it holds no key)."""
    _owner_check(ctx, name, key)
    q = None if ctx.collection.is_alias(name) else ctx.collection.queue(name)
    if q is None:
        raise BadKey(f"no lease key {key} in queue {name}")
    return q


def refuse_keyed_ids(ids: Sequence[str]) -> None:
    """BadKey when one of ``ids`` (lease ids no lease of this server has) is an item of a
    keyed lease: a keyed lease ends whole, by its key, never one item at a time."""
    for text in ids:
        if text.startswith(KEYED_ID_PREFIX):
            raise BadKey(
                f"lease id {text} is an item of a keyed lease: a keyed lease ends whole,"
                " by its key (ack|release|renew <queue> ... key=<key>)"
            )
