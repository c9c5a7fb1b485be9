"""A client's state, whatever protocol it speaks: open reads, a blocked read, statistics.

Kestrel's ``KestrelHandler`` under another name. Open reads are kept per queue, oldest first;
``close`` confirms and ``abort`` returns the oldest; ending the session returns every open read
to the head of its queue in its original order. A session holds the queue *objects* it
opened reads on, so a read on a queue deleted meanwhile is simply gone, never confused with a
new queue of the same name. Synchronous; the caller owns timers and sockets.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from tercel.core.collection import QueueCollection
from tercel.core.queue import PersistentQueue, QItem
from tercel.errors import JournalError, OpenReadError

log = logging.getLogger(__name__)

Delivery = Callable[[int, QItem | None], None]
"""Called once with ``(xid, item)`` when a blocked read is served, or ``(0, None)`` on timeout."""


class PendingRead:
    """A blocked read registered with a queue (see :class:`tercel.core.queue.Waiter`)."""

    __slots__ = ("callback", "mode", "queue", "session")

    def __init__(
        self, session: Session, queue: PersistentQueue, mode: str, callback: Delivery
    ) -> None:
        self.session = session
        self.queue = queue
        self.mode = mode
        self.callback = callback

    def deliver(self, xid: int, item: QItem) -> None:
        s = self.session
        s.pending = None
        if xid:
            s._record(self.queue, xid)
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

    __slots__ = ("_open", "collection", "max_open_reads", "pending")

    def __init__(self, collection: QueueCollection, max_open_reads: int) -> None:
        self.collection = collection
        self.max_open_reads = max_open_reads
        self._open: dict[str, tuple[PersistentQueue, deque[int]]] = {}
        self.pending: PendingRead | None = None

    def open_count(self, name: str) -> int:
        """Open reads this session holds on ``name``."""
        entry = self._entry(name)
        return len(entry[1]) if entry else 0

    def _entry(self, name: str) -> tuple[PersistentQueue, deque[int]] | None:
        """The open reads on ``name``; those on a queue deleted since are dropped here."""
        entry = self._open.get(name)
        if entry is not None and self.collection.queue(name) is not entry[0]:
            del self._open[name]
            return None
        return entry

    def _record(self, queue: PersistentQueue, xid: int) -> None:
        entry = self._open.get(queue.name)
        if entry is None or entry[0] is not queue:
            entry = self._open[queue.name] = (queue, deque())
        entry[1].append(xid)

    def _pop_oldest(self, name: str) -> tuple[PersistentQueue, int] | None:
        entry = self._entry(name)
        if entry is None:
            return None
        queue, xids = entry
        xid = xids.popleft()
        if not xids:
            del self._open[name]
        return queue, xid

    def confirm_oldest(self, name: str) -> bool:
        """Confirm the oldest open read on ``name``; False when none is open."""
        popped = self._pop_oldest(name)
        return popped is not None and popped[0].confirm(popped[1])

    def abort_oldest(self, name: str) -> bool:
        """Return the oldest open read on ``name`` to the head; False when none is open."""
        popped = self._pop_oldest(name)
        return popped is not None and popped[0].abort(popped[1])

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

    def fetch(self, name: str, mode: str, now: int) -> tuple[int, QItem] | None:
        """Try to read ``name`` now. ``mode`` is ``"get"``, ``"open"`` or ``"peek"``.

        Returns ``(xid, item)`` (xid 0 unless open) or None when empty, and counts the read
        and, when there is an item, the hit. Raises :class:`OpenReadError` for a plain get
        while this session holds an open read on the queue, or an open beyond
        ``max_open_reads``; ``BadQueueName`` for a bad name.
        """
        if mode == "get":
            item = self.take(name, now)
            return None if item is None else (0, item)
        stats = self.collection.stats
        if mode == "peek":
            stats.cmd_peek += 1
        else:
            stats.cmd_get += 1
            entry = self._entry(name) if name in self._open else None
            if entry is not None and len(entry[1]) >= self.max_open_reads:
                raise OpenReadError("too many open reads")
        queue = self.collection.for_reading(name, create=mode != "peek")  # a peek never creates
        if queue is None:
            return None
        if mode == "open":
            got = queue.remove_open(now)
            if got is not None:
                self._record(queue, got[0])
        else:
            head = queue.peek(now)
            got = None if head is None else (0, head)
        if got is not None:
            stats.get_hits += 1
        return got

    def count_miss(self) -> None:
        """Count a read that found nothing and did not wait."""
        self.collection.stats.get_misses += 1

    def wait(self, name: str, mode: str, callback: Delivery) -> PendingRead | None:
        """Block a read on ``name`` (after :meth:`fetch` found it empty). None for an alias."""
        if self.collection.is_alias(name):
            return None
        queue = self.collection.get_or_create(name)
        pending = PendingRead(self, queue, mode, callback)
        queue.wait(pending)
        self.pending = pending
        return pending

    def close(self) -> None:
        """End the session: cancel a blocked read and abort every open read, keeping order."""
        if self.pending is not None:
            self.pending.cancel()
        entries, self._open = self._open, {}
        for queue, xids in entries.values():
            try:
                queue.abort_many(list(xids))
            except JournalError as exc:  # that queue's journal failed; the others go on
                log.error(
                    "open reads of %s not returned (they return at restart): %s", queue.name, exc
                )
