"""One named FIFO queue: items, open reads, limits, expiry, read-behind and blocked readers.

Contract (as darner states its own): every method is synchronous and is called from one
thread; nothing here waits. A blocked reader registers a :class:`Waiter`; when an item
arrives (``add``, ``abort``) the queue removes it on the waiter's behalf and calls
``waiter.deliver`` at once, so no other reader can take it in between. ``deliver`` must not
call back into this queue (schedule further work instead).

Every change is written to the queue's log *before* memory changes, so a log that refuses a
write leaves the queue as it was.

Read-behind: while the payload bytes in memory are at ``max_memory_size``, new items are only
written to the log and counted (``disk_items``); memory keeps the head of the queue, and each
removal reads the next items back from the log (Kestrel's "read-behind",
:mod:`tercel.core.queue_paging`). The queue also decides when the log should rotate or compact
(:meth:`PersistentQueue.maintain_log`); the log carries it out.

:class:`PersistentQueue` is the queue's whole interface. What runs on every command (add,
remove, open reads, confirm, abort, peek, blocked readers, expired heads) is defined here, on
the class itself; the cold code lives in its own modules, as functions on the queue's state
(:mod:`tercel.core.queue_state`, which lists them): read-behind paging, the log's upkeep and
the whole-queue changes, replay. Compiled, a method a Python-level caller reaches on a class
with subclasses checks ``self``'s type by a walk of the MRO, so no per-command method is
defined on the state class below this one.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Callable
from typing import Final

from tercel.clock import MAX_TIME_MS, Clock
from tercel.config import QueueConfig
from tercel.core import keyed
from tercel.core import queue_paging as paging
from tercel.core import queue_replay as replaying
from tercel.core import queue_upkeep as upkeep
from tercel.core.items import QItem
from tercel.core.log import QueueLog
from tercel.core.queue_state import (
    NO_WAITERS,
    READ_GET,
    READ_OPEN,
    READ_PEEK,
    XID_LIMIT,
    QueueState,
    Waiter,
    own_dedup,
    own_open_reads,
)
from tercel.core.source import ReservationSource
from tercel.errors import ItemTooLarge, JournalError, JournalWriteError
from tercel.steps import Steps, finish

KeyedLease = keyed.KeyedLease
KeyedSlice = keyed.KeyedSlice

__all__ = ["READ_GET", "READ_OPEN", "READ_PEEK", "XID_LIMIT", "PersistentQueue", "QItem", "Waiter"]
"""QItem lives in :mod:`tercel.core.items`, the rest in :mod:`tercel.core.queue_state`; the rest
of tercel imports them from here."""

_log = logging.getLogger(__name__)  # (self.log is the queue's journal)

MAINTAIN_EVERY: Final = 15
"""The journal rules are checked every 16 adds and removals (and whenever the queue runs
empty), not on every one: a check costs a call and a size sum, and 16 records more or less
never matter against limits counted in megabytes."""


class PersistentQueue(QueueState, ReservationSource):
    """A queue (see the module docstring for the threading contract). As a
    :class:`ReservationSource`, its reservations are its open reads. Its fields and read-only
    views (``mem_items``, ``open_reads``, ``age``...) are defined on :class:`QueueState`."""

    def __init__(
        self,
        name: str,
        config: QueueConfig,
        log: QueueLog,
        clock: Clock,
        on_expired: Callable[[PersistentQueue, QItem], None] | None = None,
    ) -> None:
        super().__init__(name, config, log, clock)
        self.on_expired = on_expired
        self.on_dead_letter: Callable[[PersistentQueue, QItem], bool] | None = None
        """Called with an item handed out ``max_deliveries`` times, before it is removed;
        False when the item could not be moved (then it stays and is handed out again)."""

    def __len__(self) -> int:
        return len(self._items) + self.disk_items

    # ---- writes and reads (every command) ---------------------------------------------------

    def add(
        self,
        data: builtins.bytes,
        expiry: int | None = None,
        now: int | None = None,
        maintain: bool = True,
        key: str = "",
    ) -> bool:
        """Append an item; False when the queue is full (and may not discard) or closed.

        ``expiry`` is absolute epoch ms (None or 0: none), capped by ``max_age``, and clamped
        to 1 (already expired) .. :data:`~tercel.clock.MAX_TIME_MS` (never, in practice). Raises
        :class:`ItemTooLarge` above ``max_item_size``, and the log's error when it cannot write.
        ``maintain`` False skips the log's maintenance (:meth:`maintain_log`, which may rotate
        and so write the records buffered so far): the items of one batch put then reach the
        journal in the one write of the pass, all or none (the next add or removal, or the
        sweep, maintains). ``key`` (:meth:`add_keyed`'s, already checked and not held) makes
        the record an ADD_KEYED; the caller remembers the key.
        """
        cfg = self.config
        if self.closed:
            return False
        if len(data) > self._max_item_size:
            raise ItemTooLarge()
        if now is None:
            now = self.clock.now_ms()
        items = self._items
        if items and items.first().expiry and items.first().expiry < now:
            self._discard_expired(now, cfg.max_expire_sweep)
        max_items = self._max_items
        max_size = self._max_size
        if (
            len(items) + self.disk_items >= max_items
            or self.mem_bytes + self.disk_bytes >= max_size
        ):
            if not cfg.discard_old_when_full:
                return False
            while len(self) and (len(self) >= max_items or self.bytes >= max_size):
                if not items:
                    paging.refill(self)
                self._pop_head()
                self.discarded += 1
        if cfg.max_age is not None:
            cap = now + cfg.max_age
            expiry = cap if not expiry or expiry > cap else expiry
        if expiry and not 0 < expiry <= MAX_TIME_MS:  # any number a protocol parsed fits
            expiry = MAX_TIME_MS if expiry > 0 else 1  # negative: already expired (epoch 1 ms)
        item_id = self._next_id
        on_disk = self.disk_items or (self.mem_bytes >= cfg.max_memory_size and self.log.pages)
        if on_disk and not self.disk_items:
            self._cursor = self.log.position()
        if key:  # add_keyed's: the item and its dedup key in one record
            self.log.add_keyed(item_id, now, expiry or 0, data, key)
        else:
            self.log.add(item_id, now, expiry or 0, data)
        if on_disk:
            self.disk_items += 1
            self.disk_bytes += len(data)
        else:
            items.append(QItem(item_id, now, expiry or 0, data))
            self.mem_bytes += len(data)
        self._next_id = item_id + 1
        self.total_items += 1
        if self._waiters:
            self._serve_waiters(now)
        self._ops += 1
        if not self._ops & MAINTAIN_EVERY and maintain:
            upkeep.maintain_log(self)
        return True

    def add_keyed(
        self,
        key: str,
        data: builtins.bytes,
        expiry: int | None = None,
        now: int | None = None,
        maintain: bool = True,
    ) -> int:
        """:meth:`add` with a dedup key (:mod:`tercel.core.dedup`): the id of the item stored,
        or, when a put with ``key`` stored one within the queue's ``dedup_window_ms``, that
        item's id as a negative number (``-id``: a duplicate, nothing stored, nothing
        written); 0 when the queue is full or closed (nothing stored).

        The item and its key are one ADD_KEYED record. ``key`` must be valid
        (:func:`tercel.names.key_problem`: the caller checks). Raises as :meth:`add`, and
        :class:`~tercel.errors.TooManyKeys` when ``max_dedup_keys`` keys younger than the
        window are held, and the log's error for a duplicate once the log failed (the
        original may not be on disk). ``maintain`` as for :meth:`add`. Not the hot path."""
        if self.closed:
            return 0
        if now is None:
            now = self.clock.now_ms()
        keys = own_dedup(self)
        found = keys.find(key, now)
        if found >= 0:
            if self.log.failed:  # the original's record may never have reached the file
                raise JournalWriteError("journal write failed", self.name, 0)
            keys.duplicates += 1
            return -found
        if len(data) > self._max_item_size:
            raise ItemTooLarge()
        keys.check_room(f"queue {self.name}")
        before = self._next_id
        if not self.add(data, expiry, now, maintain, key):
            return 0
        keys.remember(key, before, now)
        return before

    def remove(self, now: int | None = None) -> QItem | None:
        """Take the head item for good, or None when empty (expired heads are dropped)."""
        items = self._items
        if not items or items.first().expiry:  # the head is on disk or may have expired
            if now is None:
                now = self.clock.now_ms()
            if not self._head(now):
                return None
        self.log.remove()
        item = items.popleft()
        self._taken(item)
        return item

    def remove_open(
        self, now: int | None = None, max_size: int | None = None
    ) -> tuple[int, QItem] | None:
        """Take the head item into a new open read; ``(xid, item)``, or None when the queue is
        empty or (``max_size`` given) the head's payload is longer than ``max_size`` bytes:
        then nothing is opened, journaled or counted as a delivery."""
        if now is None:
            now = self.clock.now_ms()
        if not self._head(now):
            return None
        limit = self.config.max_deliveries
        while limit and self._items.first().deliveries >= limit:
            if not self._dead_letter(self._items.first()):
                break  # the dead-letter queue refused it: handed out again, never lost
            if not self._head(now):
                return None
        if max_size is not None and len(self._items.first().data) > max_size:
            return None
        xid = self._new_xid()
        self.log.open_read(xid)
        item = self._items.popleft()
        own_open_reads(self)[xid] = item
        self.transactions += 1
        self._taken(item)
        return xid, item

    def _head(self, now: int) -> bool:
        """Bring the head into memory and drop expired heads; True when there is a head."""
        items = self._items
        if not items and self.disk_items:
            paging.refill(self)
        if items and items.first().expiry and items.first().expiry < now:
            self._discard_expired(now, self.config.max_expire_sweep)
        return bool(items)

    def _dead_letter(self, item: QItem) -> bool:
        """Move the head ``item`` out (see :attr:`on_dead_letter`); False when it stays."""
        # The copy is added to the dead-letter queue before the REMOVE is written here, so a
        # crash in between duplicates the item rather than losing it. That add may lead back
        # into this queue (the dead-letter queue is its fanout parent, or an alias naming
        # it): blocked readers are not served until the head is popped, or a nested read
        # would dead-letter the same head again.
        if self.on_dead_letter is not None:
            waiters, self._waiters = self._waiters, NO_WAITERS
            try:
                moved = self.on_dead_letter(self, item)
            finally:
                self._waiters = waiters
            if not moved:
                self.dead_letter_refusals += 1
                return False
        self._pop_head()
        self.dead_lettered += 1
        return True

    def _taken(self, item: QItem) -> None:
        self.mem_bytes -= len(item.data)
        item.deliveries += 1
        self._last_removed_add_time = item.add_time
        if self.disk_items and paging.low(self):
            try:
                paging.refill(self)
            except JournalError as exc:  # the item is taken all the same; the next read
                _log.error("queue %s: reading items back failed: %s", self.name, exc)  # raises
        self._ops += 1
        if not self._ops & MAINTAIN_EVERY or not self._items:
            upkeep.maintain_log(self)

    def peek(self, now: int | None = None) -> QItem | None:
        """The head item without removing it, or None (expired heads are dropped)."""
        if now is None:
            now = self.clock.now_ms()
        return self._items.first() if self._head(now) else None

    def confirm(self, xid: int) -> bool:
        """Finish open read ``xid`` for good; False when no such read is open."""
        if xid not in self._open:
            return False
        self.log.confirm(xid)
        del self._open[xid]
        return True

    def abort(self, xid: int) -> bool:
        """Return open read ``xid``'s item to its original place in the queue (by item id,
        :func:`put_back`); False when no such read is open."""
        if xid not in self._open or self.closed:
            return False
        self.log.abort(xid)
        item = self._open.pop(xid)
        self._items.put_back(item)
        self.mem_bytes += len(item.data)
        self.canceled_transactions += 1
        if self._waiters:
            self._serve_waiters(self.clock.now_ms())
        return True

    def abort_many(self, xids: list[int]) -> int:
        """Return several open reads to their places (:meth:`abort`), and only then serve
        blocked readers; how many were open."""
        waiters, self._waiters = self._waiters, NO_WAITERS
        try:
            n = sum(self.abort(xid) for xid in reversed(xids))
        finally:
            self._waiters = waiters
        if n and waiters:
            self._serve_waiters(self.clock.now_ms())
        return n

    # ---- as a ReservationSource ----------------------------------------------------------------

    def confirm_reserved(self, xid: int) -> bool:
        return self.confirm(xid)

    def return_reserved(self, xids: list[int], reason: int) -> int:
        return self.abort_many(xids)

    def source_name(self) -> str:
        return self.name

    # ---- the head: expired items, taking it -------------------------------------------------

    def _discard_expired(self, now: int, limit: int) -> int:
        items = self._items
        n = 0
        while n < limit and items and items.first().expiry and items.first().expiry < now:
            item = self._pop_head()
            self.expired_items += 1
            n += 1
            if self.on_expired is not None:
                self.on_expired(self, item)
        return n

    def _pop_head(self) -> QItem:
        self.log.remove()
        item = self._items.popleft()
        self.mem_bytes -= len(item.data)
        if self.disk_items and paging.low(self):
            paging.refill(self)
        return item

    def _new_xid(self) -> int:
        xid = self._xid
        while True:
            xid = xid + 1 if xid + 1 < XID_LIMIT else 1
            if xid not in self._open:
                self._xid = xid
                return xid

    # ---- blocked readers ------------------------------------------------------------------

    def wait(self, waiter: Waiter) -> None:
        """Register a blocked reader (served first come, first served)."""
        waiters = self._waiters
        if waiters is NO_WAITERS:
            waiters = self._waiters = {}
        waiters[waiter] = None

    def cancel_wait(self, waiter: Waiter) -> None:
        """Forget a blocked reader (timeout, disconnect); harmless if already served."""
        self._waiters.pop(waiter, None)

    def _serve_waiters(self, now: int) -> None:
        waiters = self._waiters
        while waiters and len(self):
            waiter = next(iter(waiters))
            del waiters[waiter]
            if waiter.mode == READ_PEEK:
                head = self.peek(now)
                if head is None:
                    self._requeue_first(waiter)
                    return
                waiter.deliver(0, head)
            elif waiter.mode == READ_OPEN:
                taken = self.remove_open(now)
                if taken is None:
                    self._requeue_first(waiter)
                    return
                waiter.deliver(*taken)
            else:
                item = self.remove(now)
                if item is None:
                    self._requeue_first(waiter)
                    return
                waiter.deliver(0, item)

    def _requeue_first(self, waiter: Waiter) -> None:
        # Only expired items were left: the waiter keeps its place at the front of the line.
        self._waiters = {waiter: None, **self._waiters}

    # ---- keyed leases (cold: bodies in tercel.core.keyed) -------------------------------------

    def take_keyed(self, key: str, max_items: int, lease_ms: int, now: int) -> KeyedLease | None:
        """Take keyed lease ``key``: the first take moves up to ``max_items`` items from the
        head into it (deliveries counted, ``max_deliveries`` and dead letters as for leases,
        journaled before this returns); None when nothing was ready (no key made). A later
        take of the key returns the same lease and takes nothing. ``lease_ms`` 0: the queue's
        ``key_lease_ms``. Raises :class:`~tercel.errors.BadKey` (a bad key, another
        max_items, a key of another queue), :class:`~tercel.errors.LeaseKeyEnded`,
        :class:`~tercel.errors.TooManyKeys`, and the log's errors (nothing taken then, or
        what earlier chunks took stays under the key)."""
        return finish(self.take_keyed_steps(key, max_items, lease_ms, now))

    def take_keyed_steps(
        self, key: str, max_items: int, lease_ms: int, now: int
    ) -> Steps[KeyedLease | None]:
        """:meth:`take_keyed` in steps of :data:`~tercel.core.keyed_state.CHUNK` bytes
        (:mod:`tercel.steps`): the queue serves others between two; meanwhile the key is busy
        (calls on it raise :class:`~tercel.errors.UnavailableError`)."""
        return keyed.take_steps(
            self,
            key,
            max_items,
            lease_ms,
            now,
            expire_head=self.flush_expired,
            dead_letter=self._dead_letter,
        )

    def keyed(self, key: str) -> KeyedLease | None:
        """Live keyed lease ``key`` (a view), None for a key this queue does not know; raises
        :class:`~tercel.errors.LeaseKeyEnded` for one that ended."""
        return keyed.find(self, key)

    def keyed_slice(self, key: str, start: int, stop: int) -> KeyedSlice:
        """Items ``start .. stop - 1`` of live keyed lease ``key`` in lease order, read back
        from its lease file. Raises BadKey (``0 <= start <= stop <= count`` broken, unknown
        key), LeaseKeyEnded, the log's JournalError."""
        return keyed.read_slice(self, key, start, stop)

    def ack_keyed(self, key: str) -> int:
        """Confirm every item of keyed lease ``key``: how many; 0 if it was acked already.
        Raises LeaseKeyEnded (released, expired), BadKey (unknown)."""
        return keyed.ack(self, key)

    def release_keyed(self, key: str) -> int:
        """Put every item of keyed lease ``key`` back at its place with its delivery count:
        how many; 0 if it was released or expired already. Raises LeaseKeyEnded (acked),
        BadKey (unknown)."""
        return keyed.release(self, key, keyed.RELEASED, self._serve_now)

    def renew_keyed(self, key: str, lease_ms: int, now: int) -> int:
        """Keyed lease ``key`` runs out ``lease_ms`` (0: ``key_lease_ms``) after ``now``: the
        new ``expires_at`` (0: never)."""
        return keyed.renew(self, key, lease_ms, now)

    def expire_keyed(self, now: int) -> int:
        """Release the keyed leases whose ``expires_at`` has passed (the server's sweep):
        the items put back."""
        return keyed.expire(self, now, self._serve_now)

    def keyed_figures(self) -> tuple[int, int, int]:
        """(keyed leases open, items under them, the oldest one's created_at or 0)."""
        return keyed.figures(self)

    @property
    def has_keys(self) -> bool:
        """True when the queue holds keyed leases or remembers ended keys."""
        return self._keyed is not None

    def _serve_now(self) -> None:
        if self._waiters:
            self._serve_waiters(self.clock.now_ms())

    # ---- replay, log upkeep, whole-queue changes (cold: bodies in their own modules) ---------

    def replay(self) -> object:
        """Rebuild state from the log, then return every open read to the head, in order.

        Returns the log's replay report.
        """
        return finish(self.replay_steps())

    def replay_steps(self) -> Steps[object]:
        """:meth:`replay` in steps (:mod:`tercel.steps`), about a MiB of the log each: the
        queue must not be used by anything else until the last step (it is half built)."""
        return replaying.replay_steps(self)

    def reconfigure(self, config: QueueConfig) -> None:
        """Take new settings (``reload``); see :func:`~tercel.core.queue_upkeep.reconfigure`
        (a ``max_age`` caps the items already queued too)."""
        upkeep.reconfigure(self, config)

    def flush(self) -> None:
        """Drop every item that is not open."""
        upkeep.flush(self)

    def flush_expired(self, now: int | None = None) -> int:
        """Drop expired items from the head (at most ``max_expire_sweep``), and forget the
        dedup keys past their window; the count of items."""
        if now is None:
            now = self.clock.now_ms()
        if self._dedup is not None:
            self._dedup.expire(now)
        return self._discard_expired(now, self.config.max_expire_sweep)

    def maintain_log(self) -> None:
        """Rotate or compact the log, or keep a checkpoint, when the rules say so
        (:func:`~tercel.core.queue_upkeep.maintain_log`, docs/journal_format.md)."""
        upkeep.maintain_log(self)

    def checkpoint(self) -> bool:
        """Let the log keep a checkpoint when the queue is one run of the log's ADD records
        (:func:`~tercel.core.queue_upkeep.checkpoint`); True when the log kept one."""
        return upkeep.checkpoint(self)

    def compact(self) -> bool:
        """Compact the log now, whatever the rules say (offline tools); True if started."""
        return upkeep.compact(self)

    def close(self) -> None:
        """Stop accepting work, leave a checkpoint when the queue allows one (a quick next
        start), and close the log (waiters are left to time out)."""
        upkeep.close(self)

    def erase(self) -> None:
        """Close and delete the log and every item (``delete``)."""
        upkeep.erase(self)
