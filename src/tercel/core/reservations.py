"""Reservations: items taken out of their source until confirmed or returned
(docs/architecture.md, "One reservation model").

A reservation is an item taken from a :class:`~tercel.core.source.ReservationSource` — a
queue's open read (:meth:`PersistentQueue.remove_open`) or a beanstalkd job — with two
optional properties, and every way of reading "reliably", in all four front ends, is one
combination of them:

=========================== ======================= ========================= ==============
case                        owner                   deadline                  addressed by
=========================== ======================= ========================= ==============
Kestrel ``/open`` read      the session             none                      oldest first
memcache ``lease``          none                    ``lease_ms`` (renewable)  lease id
Thrift ``get`` auto-abort   none (detached)         ``auto_abort_msec``       id, any conn
beanstalkd ``reserve``      the worker (connection) TTR (``touch`` renews)    job id
=========================== ======================= ========================= ==============

An owned reservation returns to its source when its owner ends (:meth:`release_owner`); one
with a deadline returns when the deadline passes (:meth:`expire`). Either way, and on
:meth:`abort`, the table hands it back with the reason (``RETURN_*``): a queue puts the item
back at its head in its original order with its delivery count; the job store makes the job
ready, counting a ``timeout`` only for an expired TTR. A queue journals them all the same way
— OPEN, CONFIRM and ABORT records — and the job store does not journal reservations at all,
so a restart returns every reserved item, whatever kind it was; nothing here is journaled
itself. A source that ends a reservation itself (beanstalkd ``delete``, ``release``,
``bury``) drops it with :meth:`ReservationTable.drop`.

Ids: ``Reservation.id`` is an int unique to this server's run: a random 31-bit base drawn at
start-up, shifted, plus a counter, so an id from before a restart, or from another server,
never matches (Thrift's ids are i64; memcache's lease ids print it as ``<prefix>-<n>``, see
:meth:`ReservationTable.lease_id`). The base always has its top bit (bit 62 of the id) set:
compiled, an int below 2**62 is held unboxed and boxed anew each time it is used as a dict
key (an allocation per lookup), one above is held as the one int object. So every id is of
the second kind, and the cost of a reservation does not depend on the random draw (it did:
1.7k instructions per beanstalkd reserve+delete, callgrind, from one start to the next).

Clocks: the caller passes ``now`` (wall-clock epoch ms), which only the queue sees (an
item's expiry is absolute). Deadlines are durations from "now" and are never persisted (a
restart returns every reservation), so they run on the table's ``deadline_clock``, monotonic
milliseconds (:meth:`tercel.clock.Clock.monotonic_ms`): setting the system clock moves no
lease, auto-abort or TTR. ``Reservation.deadline``, :meth:`ReservationTable.next_deadline` and
:meth:`ReservationTable.expire` are in that clock; where a client is shown a wall-clock
expiry, compute it as ``now + (deadline - deadline_clock())``.

Same contract as the rest of the core: synchronous, one thread, no timers. The caller calls
:meth:`ReservationTable.expire` at :meth:`ReservationTable.next_deadline`.
"""

from __future__ import annotations

import heapq
import logging
import os
from collections.abc import Callable, Iterable
from typing import Final

from tercel.clock import SystemClock
from tercel.core.queue import PersistentQueue, QItem
from tercel.core.source import (
    RETURN_ABORT,
    RETURN_EXPIRED,
    RETURN_OWNER_GONE,
    ReservationSource,
)
from tercel.errors import JournalError, JournalOutOfDescriptors, TooManyLeases

log = logging.getLogger(__name__)

ID_SHIFT = 32
"""The counter's bits below the random base of every id."""
ID_TOP: Final = 0x40000000
"""Set in every base: ids are 2**62 or more (see the module docstring)."""

NO_ITEM: Final = QItem(0, 0, 0, b"")
"""The ``item`` of a reservation whose source keeps its own items (beanstalkd's job store:
the ``xid`` is the job id)."""


class Reservation:
    """One reserved item: its source (a queue) and the source's id for it (a queue's open
    read), the item, owner (None: detached) and deadline (the table's monotonic ms; 0: none)."""

    __slots__ = ("deadline", "id", "item", "owner", "source", "xid")

    def __init__(
        self, rid: int, source: ReservationSource, xid: int, item: QItem, owner: object | None
    ) -> None:
        self.id = rid
        self.source = source
        self.xid = xid
        self.item = item
        self.owner = owner
        self.deadline = 0


class ReservationTable:
    """Every open reservation of a server (see the module docstring)."""

    def __init__(
        self, prefix: str | None = None, deadline_clock: Callable[[], int] | None = None
    ) -> None:
        self.deadline_clock: Callable[[], int] = (
            deadline_clock if deadline_clock is not None else SystemClock().monotonic_ms
        )
        """Monotonic milliseconds: the clock of every deadline (see the module docstring)."""
        # os.urandom, not the secrets module: ~5 ms of imports at start-up.
        self.prefix = prefix if prefix is not None else os.urandom(4).hex()
        """Printed before a lease id (``3fa9c2d1-1f``)."""
        self.prefix_bytes = self.prefix.encode("ascii")
        self._base = ((int(self.prefix, 16) & 0x7FFFFFFF) | ID_TOP) << ID_SHIFT
        self._seq = 0
        self._open: dict[int, Reservation] = {}
        self._detached: dict[ReservationSource, int] = {}  # leases open per source
        self._owned: dict[object, dict[int, Reservation]] = {}
        # Deadlines, two ways (ids of reservations that ended or moved are skipped lazily, each
        # looked at once). Most are set in time order (one TTR or lease time, a monotonic
        # clock): those go to the end of a FIFO, parallel lists from ``_head`` on, an append
        # each. One earlier than the FIFO's last goes to a heap of distinct deadlines with the
        # ids due at each, in the order they were set (a lease batch shares one entry).
        self._fifo_at: list[int] = []
        self._fifo_rid: list[int] = []
        self._head = 0
        self._fifo_last = 0  # the deadline last appended (0: nothing live in the FIFO)
        self._deadlines: list[int] = []
        self._due: dict[int, list[int]] = {}
        self.expired = 0
        self._unreturned: list[tuple[ReservationSource, list[int], int]] = []
        """Returns put off because their source could not journal them for want of a
        descriptor (:class:`JournalOutOfDescriptors`): ``(source, xids, reason)``, tried again
        by :meth:`retry_returns`. The items are still taken: nothing is lost meanwhile."""

    def __len__(self) -> int:
        return len(self._open)

    def get(self, rid: int) -> Reservation | None:
        """The open reservation ``rid``, or None."""
        return self._open.get(rid)

    def open_count(self, queue: ReservationSource) -> int:
        """Detached reservations (leases) open on ``queue``."""
        return self._detached.get(queue, 0)

    def room(self, queue: PersistentQueue) -> int:
        """How many more leases ``queue`` may hand out (its ``max_open_leases``)."""
        return max(0, queue.config.max_open_leases - self.open_count(queue))

    def of_owner(self, owner: object) -> list[Reservation]:
        """``owner``'s open reservations, oldest first."""
        return list(self._owned.get(owner, {}).values())

    # ---- ids ----------------------------------------------------------------------------------

    def lease_number(self, res: Reservation) -> int:
        """The counter part of ``res.id`` (a lease id prints it in hex after the prefix)."""
        return res.id - self._base

    def lease_id(self, res: Reservation) -> str:
        """The memcache form of ``res.id``: ``<prefix>-<counter in hex>``."""
        return f"{self.prefix}-{self.lease_number(res):x}"

    def parse_lease_id(self, text: str) -> int:
        """The id a :meth:`lease_id` string stands for; -1 for one not of this table."""
        prefix, _, n = text.partition("-")
        if prefix != self.prefix or not n:
            return -1
        try:
            return self._base + int(n, 16)
        except ValueError:
            return -1

    # ---- opening ------------------------------------------------------------------------------

    def take(
        self, queue: PersistentQueue, now: int, *, owner: object | None = None, ttl_ms: int = 0
    ) -> Reservation | None:
        """Reserve the head item of ``queue`` (None when there is none ready). Raises the log's
        error when it cannot write the OPEN record."""
        got = queue.remove_open(now)
        if got is None:
            return None
        deadline = self.deadline_clock() + ttl_ms if ttl_ms else 0
        return self.adopt_until(queue, got[0], got[1], owner, deadline)

    def take_leases(
        self,
        queue: PersistentQueue,
        max_items: int,
        lease_ms: int,
        now: int,
        max_bytes: int | None = None,
    ) -> list[Reservation]:
        """Lease up to ``max_items`` items from the head of ``queue`` (fewer when it runs dry,
        or, ``max_bytes`` given, before the item whose payload would bring the batch's past
        ``max_bytes``: that item and the rest stay queued, not opened, their deliveries not
        counted).

        Raises :class:`TooManyLeases` when ``queue`` has no room for even one lease, and the
        log's error when it cannot write (leases already taken stay valid).
        """
        if max_items <= 0:
            return []
        n = min(max_items, self.room(queue))
        if n == 0:
            raise TooManyLeases()
        out: list[Reservation] = []
        deadline = self.deadline_clock() + lease_ms if lease_ms else 0  # one for the batch
        for _ in range(n):
            got = queue.remove_open(now, max_bytes)
            if got is None:
                break
            if max_bytes is not None:
                max_bytes -= len(got[1].data)
            out.append(self.adopt_until(queue, got[0], got[1], None, deadline))
        return out

    def adopt(
        self,
        queue: ReservationSource,
        xid: int,
        item: QItem,
        *,
        owner: object | None = None,
        ttl_ms: int = 0,
    ) -> Reservation:
        """Make open read ``xid`` of ``queue`` a reservation (a blocked read, whose item the
        queue opened on its behalf, becomes one this way), due ``ttl_ms`` from now (0: no
        deadline)."""
        deadline = self.deadline_clock() + ttl_ms if ttl_ms else 0
        return self.adopt_until(queue, xid, item, owner, deadline)

    def adopt_until(
        self, queue: ReservationSource, xid: int, item: QItem, owner: object | None, deadline: int
    ) -> Reservation:
        """:meth:`adopt` with its deadline given (``deadline_clock`` ms; 0: none), for a caller
        that has just read that clock (the job store: a reserve reads no clock twice)."""
        self._seq += 1
        res = Reservation(self._base + self._seq, queue, xid, item, owner)
        self._open[res.id] = res
        if owner is None:
            self._detached[queue] = self._detached.get(queue, 0) + 1
        else:
            mine = self._owned.get(owner)
            if mine is None:
                mine = self._owned[owner] = {}
            mine[res.id] = res
        if deadline:
            self._set_deadline(res, deadline)
        return res

    # ---- ending -------------------------------------------------------------------------------

    def find(self, queue: ReservationSource | None, ids: Iterable[int]) -> list[Reservation]:
        """The open reservations among ``ids`` (of ``queue`` unless it is None), each once."""
        found: dict[int, Reservation] = {}
        for rid in ids:
            res = self._open.get(rid)
            if res is not None and (queue is None or res.source is queue):
                found[rid] = res
        return list(found.values())

    def _drop(self, res: Reservation) -> None:
        del self._open[res.id]
        if res.owner is None:
            left = self._detached[res.source] - 1
            if left:
                self._detached[res.source] = left
            else:
                del self._detached[res.source]
        else:
            # An owner's dict stays while it lives, empty or not (a worker that reserves and
            # deletes one job at a time would build a new one each time); release_owner,
            # which every owner calls at its end, removes it.
            mine = self._owned.get(res.owner)
            if mine is not None:
                del mine[res.id]

    def confirm(self, reservations: Iterable[Reservation]) -> int:
        """Remove the reserved items for good; how many were still open."""
        n = 0
        for res in reservations:
            if self._open.get(res.id) is not res:
                continue
            self._drop(res)
            if res.source.confirm_reserved(res.xid):
                n += 1
        return n

    def abort(self, reservations: Iterable[Reservation]) -> int:
        """Return the reserved items to the head of their queues, in their original order;
        how many were still open."""
        return self._return([r for r in reservations if self._open.get(r.id) is r], RETURN_ABORT)

    def drop(self, res: Reservation) -> bool:
        """:meth:`forget` one reservation; whether it was open."""
        if self._open.get(res.id) is not res:
            return False
        self._drop(res)
        return True

    def forget(self, reservations: Iterable[Reservation]) -> None:
        """Drop reservations without telling their source: their queue is gone (deleted), or
        the source ended them itself (beanstalkd's ``delete``, ``release``, ``bury``)."""
        for res in reservations:
            if self._open.get(res.id) is res:
                self._drop(res)

    def release_owner(self, owner: object) -> int:
        """``owner`` ended: return every reservation it held (its connection closed). Every
        owner must end this way (it keeps the owner's entry until then)."""
        mine = self._owned.pop(owner, None)
        return 0 if not mine else self._return(list(mine.values()), RETURN_OWNER_GONE)

    def _return(self, reservations: list[Reservation], reason: int) -> int:
        # The items returned together keep their original queue order, and a blocked reader
        # is served only once they are all back (it gets the oldest).
        by_source: dict[ReservationSource, list[Reservation]] = {}
        for res in sorted(reservations, key=lambda r: r.id):
            by_source.setdefault(res.source, []).append(res)
        n = 0
        for source, group in by_source.items():
            for res in group:
                self._drop(res)
            n += self._give_back(source, [res.xid for res in group], reason)
        return n

    def _give_back(self, source: ReservationSource, xids: list[int], reason: int) -> int:
        """``source.return_reserved``; a source that cannot journal it now for want of a
        descriptor keeps the items taken and the return waits for :meth:`retry_returns`;
        any other failure is logged (the items return at the next start). How many went
        back."""
        try:
            return source.return_reserved(xids, reason)
        except JournalOutOfDescriptors as exc:  # (returning the same xids again is harmless)
            self._unreturned.append((source, xids, reason))
            name = source.source_name()
            log.warning("reads of %s not returned yet (tried again by the sweep): %s", name, exc)
        except JournalError as exc:  # that source's journal failed; the others go on
            name = source.source_name()
            log.error("reads of %s not returned (they return at restart): %s", name, exc)
        except Exception:  # a bug in one source must not strand the others' reservations
            log.exception("reads of %s not returned", source.source_name())
        return 0

    def retry_returns(self) -> int:
        """Try again the returns put off for want of a descriptor (:meth:`_give_back`); how
        many items went back. The server's expiry sweep calls it."""
        if not self._unreturned:
            return 0
        todo, self._unreturned = self._unreturned, []
        return sum(self._give_back(source, xids, reason) for source, xids, reason in todo)

    def extend(self, reservations: Iterable[Reservation], ttl_ms: int) -> int:
        """Move the deadlines to ``ttl_ms`` from now (0: none): renew, touch. How many."""
        n = 0
        deadline = self.deadline_clock() + ttl_ms if ttl_ms else 0
        for res in reservations:
            if self._open.get(res.id) is not res:
                continue
            n += 1
            if deadline:
                self._set_deadline(res, deadline)
            else:
                res.deadline = 0
        return n

    # ---- deadlines ----------------------------------------------------------------------------

    def _set_deadline(self, res: Reservation, deadline: int) -> None:
        res.deadline = deadline
        if deadline >= self._fifo_last:  # the common case: in time order
            self._fifo_last = deadline
            self._fifo_at.append(deadline)
            self._fifo_rid.append(res.id)
            return
        ids = self._due.get(deadline)
        if ids is None:
            self._due[deadline] = [res.id]
            heapq.heappush(self._deadlines, deadline)
        else:
            ids.append(res.id)

    def _live(self, rid: int, deadline: int) -> Reservation | None:
        """Reservation ``rid`` if it is open and still due at ``deadline``."""
        res = self._open.get(rid)
        return res if res is not None and res.deadline == deadline else None

    def _fifo_next(self, start: int) -> int:
        """Skip the FIFO's ended or moved entries from index ``start`` on; the deadline of
        the first live one (0: none left, and the next deadline may be any). What was skipped
        is cut once it is 1024 entries and half of the lists."""
        at, rids = self._fifo_at, self._fifo_rid
        opened = self._open
        n = len(at)
        i = start
        while i < n:
            res = opened.get(rids[i])
            if res is not None and res.deadline == at[i]:
                break
            i += 1
        if i >= 1024 and 2 * i >= n:
            del at[:i]
            del rids[:i]
            n -= i
            i = 0
        self._head = i
        if i == n:
            self._fifo_last = 0  # nothing live from the head on: any deadline may follow
            return 0
        return at[i]

    def _heap_next(self) -> int:
        """The earliest deadline of the heap that an open reservation is still due at
        (0: none); pops the entries no reservation is due at any more."""
        heap = self._deadlines
        while heap:
            deadline = heap[0]
            ids = self._due[deadline]
            stale = 0
            while stale < len(ids) and self._live(ids[stale], deadline) is None:
                stale += 1
            if stale < len(ids):
                if stale:
                    del ids[:stale]  # each stale id is looked at once
                return deadline
            heapq.heappop(heap)
            del self._due[deadline]
        return 0

    def next_deadline(self) -> int | None:
        """The earliest deadline of an open reservation (``deadline_clock`` ms), or None."""
        first = self._fifo_next(self._head) if self._head < len(self._fifo_at) else 0
        other = self._heap_next() if self._deadlines else 0
        if first and (not other or first <= other):
            return first
        return other or None

    def expire(self, now: int | None = None) -> int:
        """Return every reservation due by ``now`` (``deadline_clock`` ms; None: read it) to
        its queue; the count."""
        if now is None:
            now = self.deadline_clock()
        due: dict[int, Reservation] = {}
        at, rids = self._fifo_at, self._fifo_rid
        i = self._head
        while i < len(at) and at[i] <= now:
            res = self._live(rids[i], at[i])
            if res is not None:
                due[res.id] = res
            i += 1
        self._fifo_next(i)
        heap = self._deadlines
        while heap and heap[0] <= now:
            deadline = heapq.heappop(heap)
            for rid in self._due.pop(deadline):
                res = self._live(rid, deadline)
                if res is not None:
                    due[rid] = res
        n = self._return(list(due.values()), RETURN_EXPIRED)
        self.expired += n
        return n
