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
removal reads the next items back from the log (Kestrel's "read-behind"). Items on disk have no
Python object at all. The queue also decides when the log should rotate or compact
(:meth:`maintain_log`); the log carries it out.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Callable
from typing import Final, Protocol

from tercel.clock import MAX_TIME_MS, Clock
from tercel.config import QueueConfig
from tercel.core.items import Items, QItem
from tercel.core.log import ItemReader, Position, QueueLog
from tercel.core.source import ReservationSource
from tercel.errors import ItemTooLarge, JournalError
from tercel.steps import Steps, finish

__all__ = ["READ_GET", "READ_OPEN", "READ_PEEK", "XID_LIMIT", "PersistentQueue", "QItem", "Waiter"]
"""QItem lives in :mod:`tercel.core.items`; the rest of tercel imports it from here."""

_log = logging.getLogger(__name__)  # (self.log is the queue's journal)

XID_LIMIT: Final = 2**32

MAINTAIN_EVERY: Final = 15
"""The journal rules are checked every 16 adds and removals (and whenever the queue runs
empty), not on every one: a check costs a call and a size sum, and 16 records more or less
never matter against limits counted in megabytes."""

READ_BEHIND_COMPACT_WINDOWS: Final = 8
"""In read-behind, the consumed files are compacted once they weigh this many memory windows:
the snapshot rewrites the window, so its extra writes are 1/8 of what drains. At 2 the rewrite
took 29 % of the server's CPU samples in a 2 GB drain (``git show 1f1f505:docs/benchmarks.md``);
8 is also Kestrel's default proportion (a pack of the 128 MB window each time the journal passes
1 GB). ``max_journal_size_absolute`` bounds the disk that consumed files may hold meanwhile."""

REPLAY_WINDOW: Final = 1 << 20
"""Payload bytes of items replay puts in memory (at most ``max_memory_size``): every later item
of the log stays on disk, counted in bulk (:class:`_Replayer`), and the window is read back
after start-up, a refill at a time (:data:`REFILL_FIRST`). Loading the whole 128 MB window
during replay made start-up wait for 128 k item objects (``git show 1f1f505:docs/benchmarks.md``,
"Where restart time goes"). Items of a snapshot file stay in memory whatever this says."""

REFILL_FIRST: Final = 1 << 20
"""The smallest read-behind refill. A refill reads at most as many payload bytes as memory
holds already (at least this, at most an eighth of ``max_memory_size``, the refill of a window
in steady state): after a restart the window grows 1, 2, 4 ... MB over the first removes
instead of one remove waiting for all of it."""

NO_LIMIT: Final = 2**62 - 1
"""An unset size or count limit as :meth:`PersistentQueue.add` compares it. The config's
``UNLIMITED`` (2**63 - 1, Kestrel's Long.MaxValue) does not fit mypyc's unboxed ints (below
2**62), and every add compares three limits: boxed, those comparisons measured ~800
instructions per add (callgrind). 2**62 - 1 bytes or items is no limit in practice either."""


def _frozen(item: QItem) -> QItem:
    """A copy of ``item`` as it is now."""
    copy = QItem(item.id, item.add_time, item.expiry, item.data)
    copy.deliveries = item.deliveries
    return copy


READ_GET: Final = 0
"""Read mode: take the head item for good."""
READ_OPEN: Final = 1
"""Read mode: reserve the head item (an open read) until confirmed or aborted."""
READ_PEEK: Final = 2
"""Read mode: look at the head item, leave it."""


_NO_OPEN_READS: Final[dict[int, QItem]] = {}
"""The open reads of every queue that has had none: one empty dict shared, never added to
(:meth:`PersistentQueue._open_reads` gives a queue its own), instead of 64 bytes per queue."""


class Waiter(Protocol):
    """A blocked reader. ``mode`` is one of :data:`READ_GET`, :data:`READ_OPEN`,
    :data:`READ_PEEK`."""

    mode: int

    def deliver(self, xid: int, item: QItem) -> None:
        """Called with the item (already removed unless peeking); ``xid`` is 0 unless open."""
        ...


_NO_WAITERS: Final[dict[Waiter, None]] = {}
"""The blocked readers of every queue that has had none: shared like :data:`_NO_OPEN_READS`
(:meth:`PersistentQueue.wait` gives a queue its own)."""


class PersistentQueue(ReservationSource):
    """A queue (see the module docstring for the threading contract). As a
    :class:`ReservationSource`, its reservations are its open reads."""

    def __init__(
        self,
        name: str,
        config: QueueConfig,
        log: QueueLog,
        clock: Clock,
        on_expired: Callable[[PersistentQueue, QItem], None] | None = None,
    ) -> None:
        self.name = name
        self.config = config  # the setter below also sets the limits add() compares
        self.log = log
        self.clock = clock
        self.on_expired = on_expired
        self.on_dead_letter: Callable[[PersistentQueue, QItem], bool] | None = None
        """Called with an item handed out ``max_deliveries`` times, before it is removed;
        False when the item could not be moved (then it stays and is handed out again)."""
        self._items = Items()
        self._open = _NO_OPEN_READS  # a dict of its own from the first open read on
        self._waiters = _NO_WAITERS  # a dict of its own from the first blocked reader on
        self.mem_bytes = 0
        """Payload bytes of the items in memory."""
        self.disk_items = 0
        """Items only in the log (read-behind), after every item in memory."""
        self.disk_bytes = 0
        self._cursor: Position | None = None  # where the first disk item's record starts
        self._reader: ItemReader | None = None
        self._compact_floor = 0
        self._ops = 0  # adds and removals, for MAINTAIN_EVERY
        self._xid = 0
        self._next_id = 1
        self._last_removed_add_time = 0
        self.create_time = clock.now_ms()
        self.closed = False
        # Kestrel's per-queue counters.
        self.total_items = 0
        self.expired_items = 0
        self.discarded = 0
        self.transactions = 0
        self.canceled_transactions = 0
        self.total_flushes = 0
        self.dead_lettered = 0
        self.dead_letter_refusals = 0
        """Items the dead-letter queue refused (each stayed and was handed out again)."""

    # ---- state ----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._items) + self.disk_items

    @property
    def bytes(self) -> int:
        """Payload bytes of every item, in memory and on disk (open reads excluded)."""
        return self.mem_bytes + self.disk_bytes

    @property
    def mem_items(self) -> int:
        """Items held in memory."""
        return len(self._items)

    @property
    def open_reads(self) -> int:
        """Items handed out by open reads and not yet confirmed or aborted."""
        return len(self._open)

    def items_in_memory(self) -> list[QItem]:
        """The items held in memory, head first (a copy: a read-only view for inspection)."""
        return list(self._items)

    def open_items(self) -> dict[int, QItem]:
        """The items of the open reads by xid, oldest first (a copy, as above)."""
        return dict(self._open)

    @property
    def last_xid(self) -> int:
        """The xid handed out last (the next open read gets the next free one after it)."""
        return self._xid

    @property
    def waiters(self) -> int:
        """Blocked readers."""
        return len(self._waiters)

    @property
    def journal_rewrites(self) -> int:
        """Compactions of this queue's log since start."""
        return self.log.compactions

    @property
    def journal_rotations(self) -> int:
        """Rotations of this queue's log since start."""
        return self.log.rotations

    def age(self, now: int) -> int:
        """Kestrel's ``age``: ms since the add time of the last item removed; 0 when empty."""
        if not self.bytes or not self._last_removed_add_time:
            return 0
        return max(0, now - self._last_removed_add_time)

    def head_age(self, now: int) -> int:
        """ms since the head item was added; 0 when the queue is empty or its head is only on
        disk (read-behind keeps the head in memory, so only a zero memory window does that)."""
        items = self._items
        return max(0, now - items.first().add_time) if items else 0

    def reconfigure(self, config: QueueConfig) -> None:
        """Take new settings (``reload``). A ``max_age`` caps the expiry of items already
        queued too, measured from their add time, as Kestrel re-applies it: items in memory
        and items held by open reads (and leases) now, items on disk as they are read back."""
        self.config = config
        if config.max_age is not None:
            for item in self._items:
                self._cap(item)
            for item in self._open.values():
                self._cap(item)

    @property
    def config(self) -> QueueConfig:
        """This queue's settings; assigning them also updates the limits :meth:`add` reads."""
        return self._config

    @config.setter
    def config(self, config: QueueConfig) -> None:
        self._config = config
        self._max_items = min(config.max_items, NO_LIMIT)
        self._max_size = min(config.max_size, NO_LIMIT)
        self._max_item_size = min(config.max_item_size, NO_LIMIT)

    def _cap(self, item: QItem) -> None:
        cap = min(item.add_time + self.config.max_age, MAX_TIME_MS)  # type: ignore[operator]
        if not item.expiry or item.expiry > cap:
            item.expiry = cap

    # ---- replay ---------------------------------------------------------------------------

    def replay(self) -> object:
        """Rebuild state from the log, then return every open read to the head, in order.

        Returns the log's replay report.
        """
        return finish(self.replay_steps())

    def replay_steps(self) -> Steps[object]:
        """:meth:`replay` in steps (:mod:`tercel.steps`), about a MiB of the log each: the
        queue must not be used by anything else until the last step (it is half built)."""
        replayer = _Replayer(self)
        report = yield from self.log.replay_steps(replayer, replayer)
        for xid in sorted(self._open, reverse=True):
            self.log.abort(xid)
            item = self._open.pop(xid)
            self._items.put_back(item)
            self.mem_bytes += len(item.data)
        if not self._items:  # the head in memory; the rest of the window comes with removes
            self._refill()
        return report

    # ---- writes ---------------------------------------------------------------------------

    def add(
        self,
        data: builtins.bytes,
        expiry: int | None = None,
        now: int | None = None,
        maintain: bool = True,
    ) -> bool:
        """Append an item; False when the queue is full (and may not discard) or closed.

        ``expiry`` is absolute epoch ms (None or 0: none), capped by ``max_age``, and clamped
        to 1 (already expired) .. :data:`~tercel.clock.MAX_TIME_MS` (never, in practice). Raises
        :class:`ItemTooLarge` above ``max_item_size``, and the log's error when it cannot write.
        ``maintain`` False skips the log's maintenance (:meth:`maintain_log`, which may rotate
        and so write the records buffered so far): the items of one batch put then reach the
        journal in the one write of the pass, all or none (the next add or removal, or the
        sweep, maintains).
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
                    self._refill()
                self._pop_head()
                self.discarded += 1
        if cfg.max_age is not None:
            cap = now + cfg.max_age
            expiry = cap if not expiry or expiry > cap else expiry
        if expiry and not 0 < expiry <= MAX_TIME_MS:  # any number a protocol parsed fits
            expiry = MAX_TIME_MS if expiry > 0 else 1  # negative: already expired (epoch 1 ms)
        item_id = self._next_id
        if self.disk_items or (self.mem_bytes >= cfg.max_memory_size and self.log.pages):
            if not self.disk_items:
                self._cursor = self.log.position()
            self.log.add(item_id, now, expiry or 0, data)
            self.disk_items += 1
            self.disk_bytes += len(data)
        else:
            self.log.add(item_id, now, expiry or 0, data)
            items.append(QItem(item_id, now, expiry or 0, data))
            self.mem_bytes += len(data)
        self._next_id = item_id + 1
        self.total_items += 1
        if self._waiters:
            self._serve_waiters(now)
        self._ops += 1
        if not self._ops & MAINTAIN_EVERY and maintain:
            self.maintain_log()
        return True

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
        self._open_reads()[xid] = item
        self.transactions += 1
        self._taken(item)
        return xid, item

    def _head(self, now: int) -> bool:
        """Bring the head into memory and drop expired heads; True when there is a head."""
        items = self._items
        if not items and self.disk_items:
            self._refill()
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
            waiters, self._waiters = self._waiters, _NO_WAITERS
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
        if self.disk_items and self._low():
            try:
                self._refill()
            except JournalError as exc:  # the item is taken all the same; the next read
                _log.error("queue %s: reading items back failed: %s", self.name, exc)  # raises
        self._ops += 1
        if not self._ops & MAINTAIN_EVERY or not self._items:
            self.maintain_log()

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
        waiters, self._waiters = self._waiters, _NO_WAITERS
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

    def flush(self) -> None:
        """Drop every item that is not open."""
        if not len(self):
            return
        self.log.flush_items()
        self._items.clear()
        self.mem_bytes = 0
        self._drop_disk_items()
        self.total_flushes += 1

    def flush_expired(self, now: int | None = None) -> int:
        """Drop expired items from the head (at most ``max_expire_sweep``); the count."""
        return self._discard_expired(
            self.clock.now_ms() if now is None else now, self.config.max_expire_sweep
        )

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
        if self.disk_items and self._low():
            self._refill()
        return item

    def _open_reads(self) -> dict[int, QItem]:
        """The open reads, as a dict that may be added to (the queue's own, made now if it
        had none)."""
        opened = self._open
        if opened is _NO_OPEN_READS:
            opened = self._open = {}
        return opened

    def _new_xid(self) -> int:
        xid = self._xid
        while True:
            xid = xid + 1 if xid + 1 < XID_LIMIT else 1
            if xid not in self._open:
                self._xid = xid
                return xid

    # ---- read-behind and log upkeep -------------------------------------------------------

    def _refill(self) -> None:
        """Read the next items back from the log into memory, until memory is full, or this
        call read ``max(REFILL_FIRST, min(mem_bytes, max_memory_size / 8))`` payload bytes
        (see :data:`REFILL_FIRST`; ``mem_bytes`` as the call starts), and always the head when
        memory has none.

        Never asks for more than ``disk_bytes``: during replay the log goes on past the record
        being applied, and the ADDs there are not disk items yet. A reader stops once the
        payloads reach the budget, so it cannot reach them (a budget of 0, when only empty
        items are left on disk, reads exactly one).
        """
        limit = self.config.max_memory_size
        items = self._items
        step = max(REFILL_FIRST, min(self.mem_bytes, limit >> 3))
        read = 0
        while self.disk_items and (self.mem_bytes < limit or not items) and read < step:
            if self._reader is None:
                assert self._cursor is not None
                self._reader = self.log.reader(self._cursor)
            budget = min(limit - self.mem_bytes, self.disk_bytes, step - read)
            batch = self._reader.next_adds(budget)
            if not batch:
                raise JournalError(
                    f"queue {self.name}: {self.disk_items} items missing from the log", "", 0
                )
            size = 0
            for got in batch:
                item = QItem(*got)
                if self.config.max_age is not None:
                    self._cap(item)
                items.append(item)
                size += len(got[3])
            self.mem_bytes += size
            self.disk_items -= len(batch)
            self.disk_bytes -= size
            read += size
        if not self.disk_items:
            self._drop_disk_items()

    def _low(self) -> bool:
        """True when memory has room for a worthwhile refill: an eighth of the window (so
        reads from the log come in batches, not one item per removal), or nothing at all."""
        limit = self.config.max_memory_size
        return not self._items or self.mem_bytes <= limit - (limit >> 3)

    def _drop_disk_items(self) -> None:
        self.disk_items = self.disk_bytes = 0
        self._cursor = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def maintain_log(self) -> None:
        """Rotate or compact the log when the rules say so (docs/journal_format.md).

        1. empty queue (open reads aside), log over ``max_journal_size``: compact;
        2. queue under ``max_journal_size`` but log over ``max_journal_overflow`` times it:
           compact;
        3. log over ``max_journal_size_absolute``: compact what can be;
        in read-behind: rotate files at ``max_journal_size``, and compact the files wholly
        before the read position once they outweigh both ``max_journal_size`` and
        ``READ_BEHIND_COMPACT_WINDOWS`` memory windows. Sizes count every file of the log, not
        only the current one.
        """
        log = self.log
        cfg = self.config
        if log.checkpoint_due():
            self.checkpoint()
        size = log.size
        if size <= cfg.max_journal_size or log.compacting or not log.pages:
            return
        if self.disk_items:
            if log.current_size > cfg.max_journal_size:
                log.rotate()
            cursor = self._reader.position if self._reader is not None else self._cursor
            assert cursor is not None
            consumed = log.size_before(cursor[0])
            windows = READ_BEHIND_COMPACT_WINDOWS * self.mem_bytes
            if consumed > max(cfg.max_journal_size, windows) or (
                size > cfg.max_journal_size_absolute and consumed
            ):
                self._compact(cursor)
            return
        if size <= self._compact_floor:
            return
        live = self.mem_bytes
        if (
            not self._items
            or (
                live < cfg.max_journal_size
                and size > cfg.max_journal_overflow * cfg.max_journal_size
            )
            or size > cfg.max_journal_size_absolute
        ):
            self._compact(None)

    def checkpoint(self) -> bool:
        """Let the log keep a checkpoint (replay may start there) when the queue is one run
        of the log's ADD records: no open reads, no item handed out before (no delivery
        count to keep), and item ids that follow one another from the head to the newest.
        Anything else (an aborted read back at the head, say) is left to a full replay.
        True when the log kept one. Costs a pass over the items in memory."""
        log = self.log
        if self._open or not log.pages:
            return False
        items = self._items
        count = len(items) + self.disk_items
        head_id = self._next_id - count
        expect = head_id
        for item in items:
            if item.id != expect or item.deliveries:
                return False
            expect += 1
        hint = None
        if not items and self.disk_items:
            hint = self._reader.position if self._reader is not None else self._cursor
        return log.checkpoint(
            head_id=head_id,
            items=count,
            size=self.mem_bytes + self.disk_bytes,
            next_id=self._next_id,
            xid=self._xid,
            total=self.total_items,
            removed_add_time=self._last_removed_add_time,
            hint=hint,
        )

    def compact(self) -> bool:
        """Compact the log now, whatever the rules say (offline tools); True if started."""
        cursor = None
        if self.disk_items:
            cursor = self._reader.position if self._reader is not None else self._cursor
        return self._compact(cursor)

    def _compact(self, cursor: Position | None) -> bool:
        # The snapshot is written off the loop: it gets the items as they are now, not the
        # live objects (their delivery counts and expiries change meanwhile).
        open_items = [(xid, _frozen(item)) for xid, item in self._open.items()]
        items = [_frozen(item) for item in self._items]
        if not self.log.compact(self._next_id, self._xid, open_items, items, cursor):
            return False
        if cursor is None:
            # Do not compact again until the log has grown by another max_journal_size
            # beyond what this one kept (Kestrel issue #114: rewrite storms when many reads
            # stay open). Read-behind compactions keep only the window, which drains: no floor.
            kept = self.mem_bytes + sum(len(i.data) for _, i in open_items)
            self._compact_floor = kept + self.config.max_journal_size
        return True

    # ---- blocked readers ------------------------------------------------------------------

    def wait(self, waiter: Waiter) -> None:
        """Register a blocked reader (served first come, first served)."""
        waiters = self._waiters
        if waiters is _NO_WAITERS:
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

    # ---- life cycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Stop accepting work, leave a checkpoint when the queue allows one (a quick next
        start), and close the log (waiters are left to time out)."""
        if not self.closed:
            try:
                self.checkpoint()
            except (JournalError, OSError) as exc:
                _log.warning("queue %s: no checkpoint at shutdown: %s", self.name, exc)
        self.closed = True
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self.log.close()

    def erase(self) -> None:
        """Close and delete the log and every item (``delete``)."""
        self.closed = True
        self._items.clear()
        self._open.clear()
        self.mem_bytes = 0
        self._drop_disk_items()
        self.log.erase()


class _Replayer:
    """Applies journal records to a queue without writing anything back; items past the
    first :data:`REPLAY_WINDOW` bytes stay on disk (the log may count them in bulk)."""

    __slots__ = ("q", "snapshot_seq", "window")

    def __init__(self, q: PersistentQueue) -> None:
        self.q = q
        self.window = min(REPLAY_WINDOW, q.config.max_memory_size)
        self.snapshot_seq = -1
        """The file of the last SNAPSHOT: its items were the live window, and stay in memory
        (a DELIVERED record can only reach an item in memory)."""

    def pages_from(self, seq: int) -> bool:
        q = self.q
        return bool(q.disk_items) or (
            q.mem_bytes >= self.window and q.log.pages and seq != self.snapshot_seq
        )

    def on_adds_on_disk(self, position: Position, count: int, size: int, last_id: int) -> None:
        q = self.q
        if not q.disk_items:
            q._cursor = position
        q.disk_items += count
        q.disk_bytes += size
        q.total_items += count
        if last_id >= q._next_id:
            q._next_id = last_id + 1

    def on_checkpoint(
        self,
        head: Position,
        *,
        items: int,
        size: int,
        next_id: int,
        xid: int,
        total: int,
        removed_add_time: int,
    ) -> None:
        q = self.q
        self.on_flush()
        q._open.clear()
        if items:
            q._cursor = head
            q.disk_items = items
            q.disk_bytes = size
        q._next_id = next_id
        q._xid = xid
        q.total_items = total
        q._last_removed_add_time = removed_add_time

    def on_add(self, item_id: int, add_time: int, expiry: int, data: bytes) -> None:
        q = self.q
        if self.pages_from(q.log.replay_position[0]):
            if not q.disk_items:
                q._cursor = q.log.replay_position
            q.disk_items += 1
            q.disk_bytes += len(data)
        else:
            item = QItem(item_id, add_time, expiry, data)
            if q.config.max_age is not None:
                q._cap(item)
            q._items.append(item)
            q.mem_bytes += len(data)
        q.total_items += 1
        if item_id >= q._next_id:
            q._next_id = item_id + 1

    def _pop(self) -> QItem | None:
        q = self.q
        if not q._items and q.disk_items:
            q._refill()
        if not q._items:
            return None
        item = q._items.popleft()
        q.mem_bytes -= len(item.data)
        return item

    def on_remove(self) -> None:
        item = self._pop()
        if item is not None:
            self.q._last_removed_add_time = item.add_time

    def on_open(self, xid: int) -> None:
        q = self.q
        item = self._pop()
        if item is not None:
            item.deliveries += 1
            q._open_reads()[xid] = item
        # A snapshot's OPENs are older reads: its SNAPSHOT record already set the counter.
        if q.log.replay_position[0] != self.snapshot_seq:
            q._xid = xid

    def on_confirm(self, xid: int) -> None:
        self.q._open.pop(xid, None)

    def on_abort(self, xid: int) -> None:
        """ABORT (format versions 1 and 2): the item went back to the head."""
        q = self.q
        item = q._open.pop(xid, None)
        if item is not None:
            q._items.appendleft(item)
            q.mem_bytes += len(item.data)

    def on_return(self, xid: int) -> None:
        """RETURN (version 3): the item went back to its place by item id."""
        q = self.q
        item = q._open.pop(xid, None)
        if item is not None:
            q._items.put_back(item)
            q.mem_bytes += len(item.data)

    def on_flush(self) -> None:
        q = self.q
        q._items.clear()
        q.mem_bytes = 0
        q._drop_disk_items()

    def on_delivered(self, count: int) -> None:
        q = self.q
        if q._items and not q.disk_items:  # the item just added (in memory)
            q._items.last().deliveries = count

    def on_snapshot(self, next_id: int, xid: int) -> None:
        q = self.q
        q._items.clear()
        q._open.clear()
        q.mem_bytes = 0
        q._drop_disk_items()
        q._next_id = max(q._next_id, next_id)
        q._xid = xid
        self.snapshot_seq = q.log.replay_position[0]
