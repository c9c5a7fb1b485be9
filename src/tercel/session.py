"""A client's state, whatever protocol it speaks: open reads, a blocked read, statistics.

Kestrel's ``KestrelHandler`` under another name; the operation layer every front end's handlers
call. Open reads are reservations (:mod:`tercel.core.reservations`) owned by the session, kept
per queue, oldest first;
``close`` confirms and ``abort`` returns the oldest; ending the session returns every open read
to the head of its queue in its original order. A session holds the queue *objects* it
opened reads on, so a read on a queue deleted meanwhile is simply gone, never confused with a
new queue of the same name. Synchronous; the caller owns timers and sockets.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from tercel.core.collection import QueueCollection
from tercel.core.queue import READ_GET, READ_OPEN, READ_PEEK, PersistentQueue, QItem
from tercel.core.reservations import Reservation, ReservationTable
from tercel.errors import OpenReadError

__all__ = ["READ_GET", "READ_OPEN", "READ_PEEK", "Delivery", "PendingRead", "Session"]

Delivery = Callable[[int, QItem | None], None]
"""Called once with ``(xid, item)`` when a blocked read is served, or ``(0, None)`` on timeout."""


class PendingRead:
    """A blocked read registered with a queue (see :class:`tercel.core.queue.Waiter`);
    ``mode`` is one of the read modes :data:`READ_GET`, :data:`READ_OPEN`, :data:`READ_PEEK`."""

    __slots__ = ("callback", "mode", "queue", "session")

    def __init__(
        self, session: Session, queue: PersistentQueue, mode: int, callback: Delivery
    ) -> None:
        self.session = session
        self.queue = queue
        self.mode = mode
        self.callback = callback

    def deliver(self, xid: int, item: QItem) -> None:
        s = self.session
        s.pending = None
        if xid:
            s._record(self.queue, xid, item)
        s.collection.stats.get_hits += 1
        self.callback(xid, item)

    def timeout(self) -> None:
        """The deadline passed: forget the wait and report a miss."""
        self.cancel()
        self.session.collection.stats.get_misses += 1
        self.callback(0, None)

    def cancel(self) -> None:
        """Forget the wait without reporting anything."""
        self.queue.cancel_wait(self)
        if self.session.pending is self:
            self.session.pending = None


class Session:
    """One client's transactional state (see the module docstring)."""

    __slots__ = ("_open", "collection", "max_open_reads", "pending", "reservations")

    def __init__(
        self,
        collection: QueueCollection,
        max_open_reads: int,
        reservations: ReservationTable | None = None,
    ) -> None:
        self.collection = collection
        self.max_open_reads = max_open_reads
        self.reservations = reservations if reservations is not None else ReservationTable()
        """The server's one table: this session's open reads are its reservations, owned by
        the session (so they return when it closes)."""
        self._open: dict[str, tuple[PersistentQueue, deque[Reservation]]] = {}
        self.pending: PendingRead | None = None

    def open_count(self, name: str) -> int:
        """Open reads this session holds on ``name``."""
        entry = self._entry(name)
        return len(entry[1]) if entry else 0

    def _entry(self, name: str) -> tuple[PersistentQueue, deque[Reservation]] | None:
        """The open reads on ``name``; those on a queue deleted since are dropped here."""
        entry = self._open.get(name)
        if entry is not None and self.collection.queue(name) is not entry[0]:
            del self._open[name]
            self.reservations.forget(entry[1])
            return None
        return entry

    def _record(self, queue: PersistentQueue, xid: int, item: QItem) -> Reservation:
        res = self.reservations.adopt(queue, xid, item, owner=self)
        entry = self._open.get(queue.name)
        if entry is None or entry[0] is not queue:
            entry = self._open[queue.name] = (queue, deque())
        entry[1].append(res)
        return res

    def _pop_oldest(self, name: str) -> Reservation | None:
        entry = self._entry(name)
        if entry is None:
            return None
        reads = entry[1]
        res = reads.popleft()
        if not reads:
            del self._open[name]
        return res

    def confirm_oldest(self, name: str) -> bool:
        """Confirm the oldest open read on ``name``; False when none is open."""
        res = self._pop_oldest(name)
        return res is not None and self.reservations.confirm([res]) == 1

    def abort_oldest(self, name: str) -> bool:
        """Return the oldest open read on ``name`` to the head; False when none is open."""
        res = self._pop_oldest(name)
        return res is not None and self.reservations.abort([res]) == 1

    def confirm_all(self, name: str) -> int:
        """Confirm every open read on ``name``; the count."""
        n = 0
        while self.confirm_oldest(name):
            n += 1
        return n

    def take(self, name: str, now: int) -> QItem | None:
        """A plain get of ``name`` now: the head item, removed for good, or None when empty.

        Counts the get and, when there is an item, the hit. Raises :class:`OpenReadError`
        while this session holds an open read on the queue; ``BadQueueName`` for a bad name.
        """
        stats = self.collection.stats
        stats.cmd_get += 1
        if name in self._open and self._entry(name) is not None:
            raise OpenReadError("a plain get while an open read is held on this queue")
        queue = self.collection.for_reading(name)
        item = None if queue is None else queue.remove(now)
        if item is not None:
            stats.get_hits += 1
        return item

    def fetch(self, name: str, mode: int, now: int) -> tuple[int, QItem] | None:
        """Try to read ``name`` now in read mode ``mode``.

        Returns ``(xid, item)`` (xid 0 unless open) or None when empty, and counts the read
        and, when there is an item, the hit. Raises :class:`OpenReadError` for a plain get
        while this session holds an open read on the queue, or an open beyond
        ``max_open_reads``; ``BadQueueName`` for a bad name.
        """
        if mode == READ_GET:
            item = self.take(name, now)
            return None if item is None else (0, item)
        stats = self.collection.stats
        if mode == READ_PEEK:
            stats.cmd_peek += 1
        else:
            stats.cmd_get += 1
            entry = self._entry(name) if name in self._open else None
            if entry is not None and len(entry[1]) >= self.max_open_reads:
                raise OpenReadError("too many open reads")
        queue = self.collection.for_reading(name, create=mode != READ_PEEK)  # a peek never creates
        if queue is None:
            return None
        got: tuple[int, QItem] | None
        if mode == READ_OPEN:
            got = queue.remove_open(now)
            if got is not None:
                self._record(queue, got[0], got[1])
        else:
            head = queue.peek(now)
            got = None if head is None else (0, head)
        if got is not None:
            stats.get_hits += 1
        return got

    def count_miss(self) -> None:
        """Count a read that found nothing and did not wait."""
        self.collection.stats.get_misses += 1

    def wait(self, name: str, mode: int, callback: Delivery) -> PendingRead | None:
        """Block a read on ``name`` (after :meth:`fetch` found it empty). None for an alias."""
        if self.collection.is_alias(name):
            return None
        queue = self.collection.get_or_create(name)
        pending = PendingRead(self, queue, mode, callback)
        queue.wait(pending)
        self.pending = pending
        return pending

    def close(self) -> None:
        """End the session: cancel a blocked read and return every open read, keeping order
        (every reservation the session owns, whatever took it)."""
        if self.pending is not None:
            self.pending.cancel()
        for name in list(self._open):
            self._entry(name)  # reads on a queue deleted since are forgotten, not returned
        self._open = {}
        self.reservations.release_owner(self)
