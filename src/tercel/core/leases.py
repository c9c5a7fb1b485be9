"""Leases: detached open reads, addressed by id from any connection (docs/protocol.md).

A lease is an open read (:meth:`PersistentQueue.remove_open`) that belongs to no session: it
ends by ack (``confirm``), release (``abort``) or expiry (``abort``), never by a disconnect.
The journal already records OPEN, CONFIRM and ABORT, so a restart returns every leased item to
its queue, in order, with its delivery count; nothing here is journaled. A lease id is a random
prefix drawn at start-up and a counter (``3fa9c2d1-1f``), so an id from before a restart, or
from another server, never matches a lease of this one.

Same contract as the rest of the core: synchronous, one thread, no timers. The caller passes
``now`` (epoch ms) and calls :meth:`LeaseTable.expire` at :meth:`LeaseTable.next_deadline`.
"""

from __future__ import annotations

import heapq
import logging
import secrets
from collections.abc import Iterable

from tercel.core.queue import PersistentQueue, QItem
from tercel.errors import JournalError, TooManyLeases

log = logging.getLogger(__name__)


class Lease:
    """One leased item: which queue and open read it is, and when it expires (0: never)."""

    __slots__ = ("deadline", "id", "item", "queue", "seq", "xid")

    def __init__(self, seq: int, queue: PersistentQueue, xid: int, item: QItem) -> None:
        self.id = ""
        self.seq = seq
        self.queue = queue
        self.xid = xid
        self.item = item
        self.deadline = 0


class LeaseTable:
    """Every open lease of a server (see the module docstring)."""

    def __init__(self, prefix: str | None = None) -> None:
        self.prefix = prefix if prefix is not None else secrets.token_hex(4)
        self._seq = 0
        self._leases: dict[str, Lease] = {}
        self._per_queue: dict[PersistentQueue, int] = {}
        # (deadline, seq, id); entries of leases that ended or were renewed are skipped lazily.
        self._deadlines: list[tuple[int, int, str]] = []
        self.expired = 0

    def __len__(self) -> int:
        return len(self._leases)

    def open_count(self, queue: PersistentQueue) -> int:
        """Leases open on ``queue``."""
        return self._per_queue.get(queue, 0)

    def room(self, queue: PersistentQueue) -> int:
        """How many more leases ``queue`` may hand out (its ``max_open_leases``)."""
        return max(0, queue.config.max_open_leases - self.open_count(queue))

    # ---- opening ------------------------------------------------------------------------------

    def take(self, queue: PersistentQueue, max_items: int, lease_ms: int, now: int) -> list[Lease]:
        """Lease up to ``max_items`` items from the head of ``queue`` (fewer when it runs dry).

        Raises :class:`TooManyLeases` when ``queue`` has no room for even one lease, and the
        log's error when it cannot write (leases already taken stay valid).
        """
        if max_items <= 0:
            return []
        n = min(max_items, self.room(queue))
        if n == 0:
            raise TooManyLeases()
        out: list[Lease] = []
        for _ in range(n):
            got = queue.remove_open(now)
            if got is None:
                break
            out.append(self.adopt(queue, got[0], got[1], lease_ms, now))
        return out

    def adopt(
        self, queue: PersistentQueue, xid: int, item: QItem, lease_ms: int, now: int
    ) -> Lease:
        """Turn open read ``xid`` of ``queue`` into a lease (used by blocked lease requests,
        whose first item the queue opens on their behalf)."""
        self._seq += 1
        seq = self._seq
        lease = Lease(seq, queue, xid, item)
        lease.id = f"{self.prefix}-{seq:x}"
        lease.deadline = now + lease_ms if lease_ms else 0
        self._leases[lease.id] = lease
        self._per_queue[queue] = self._per_queue.get(queue, 0) + 1
        if lease.deadline:
            heapq.heappush(self._deadlines, (lease.deadline, seq, lease.id))
        return lease

    # ---- ending -------------------------------------------------------------------------------

    def _find(self, queue: PersistentQueue | None, ids: Iterable[str]) -> list[Lease]:
        """The open leases among ``ids`` that belong to ``queue``, each once."""
        if queue is None:
            return []
        found: dict[str, Lease] = {}
        for lease_id in ids:
            lease = self._leases.get(lease_id)
            if lease is not None and lease.queue is queue:
                found[lease_id] = lease
        return list(found.values())

    def _drop(self, lease: Lease) -> None:
        del self._leases[lease.id]
        left = self._per_queue[lease.queue] - 1
        if left:
            self._per_queue[lease.queue] = left
        else:
            del self._per_queue[lease.queue]

    def ack(self, queue: PersistentQueue | None, ids: Iterable[str]) -> int:
        """Confirm the leases ``ids`` of ``queue`` for good; how many were open. Unknown ids,
        and ids of another queue, are ignored."""
        n = 0
        for lease in self._find(queue, ids):
            if lease.queue.confirm(lease.xid):
                n += 1
            self._drop(lease)
        return n

    def release(self, queue: PersistentQueue | None, ids: Iterable[str]) -> int:
        """Return the leased items to the head of ``queue``; how many were open."""
        return self._return(self._find(queue, ids))

    def _return(self, leases: list[Lease]) -> int:
        # The items returned together keep their original queue order, and a blocked reader
        # is served only once they are all back (it gets the oldest).
        by_queue: dict[PersistentQueue, list[Lease]] = {}
        for lease in sorted(leases, key=lambda lease: lease.seq):
            by_queue.setdefault(lease.queue, []).append(lease)
        n = 0
        for queue, group in by_queue.items():
            for lease in group:
                self._drop(lease)
            try:
                n += queue.abort_many([lease.xid for lease in group])
            except JournalError as exc:  # that queue's journal failed; the others go on
                log.error("leases of %s not returned (they return at restart): %s", queue.name, exc)
            except Exception:  # a bug in one queue must not strand the others' leases
                log.exception("leases of %s not returned", queue.name)
        return n

    def renew(
        self, queue: PersistentQueue | None, ids: Iterable[str], lease_ms: int, now: int
    ) -> int:
        """Set the leases' expiry to ``now + lease_ms`` (0: never); how many were open."""
        leases = self._find(queue, ids)
        for lease in leases:
            lease.deadline = now + lease_ms if lease_ms else 0
            if lease.deadline:
                heapq.heappush(self._deadlines, (lease.deadline, lease.seq, lease.id))
        return len(leases)

    # ---- expiry -------------------------------------------------------------------------------

    def _live_top(self) -> tuple[int, int, str] | None:
        heap = self._deadlines
        while heap:
            deadline, _, lease_id = heap[0]
            lease = self._leases.get(lease_id)
            if lease is not None and lease.deadline == deadline:
                return heap[0]
            heapq.heappop(heap)
        return None

    def next_deadline(self) -> int | None:
        """The earliest expiry of an open lease (epoch ms), or None."""
        top = self._live_top()
        return None if top is None else top[0]

    def expire(self, now: int) -> int:
        """Return every lease due by ``now`` to its queue; the count."""
        due: dict[str, Lease] = {}
        while (top := self._live_top()) is not None and top[0] <= now:
            heapq.heappop(self._deadlines)
            due[top[2]] = self._leases[top[2]]
        n = self._return(list(due.values()))
        self.expired += n
        return n
