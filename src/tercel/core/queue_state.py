"""A queue's state: :class:`QueueState`, every field of a
:class:`~tercel.core.queue.PersistentQueue` in one compiled struct, its limits, and the
read-only views that stats and tools read.

The queue is split by concern over four modules, each below the next (no import circle):

- here: the fields, the settings and the limits :meth:`~tercel.core.queue.PersistentQueue.add`
  compares, the views (``mem_items``, ``open_reads``, ``age``...);
- :mod:`tercel.core.queue_paging`: read-behind, items read back from the log into memory;
- :mod:`tercel.core.queue_upkeep`: the log's upkeep (rotate, compact, checkpoint) and the
  whole-queue changes (flush, reconfigure, close, erase);
- :mod:`tercel.core.queue_replay`: the replay sink that rebuilds a queue from its log;
- :mod:`tercel.core.queue`: :class:`~tercel.core.queue.PersistentQueue`, what runs on every
  command, and the queue's whole interface.

The cold modules are functions that take the queue as a :class:`QueueState`: compiled, a field
read there is the same struct load as in the queue's own methods. The underscore fields are
private to these five modules. Same threading contract as :mod:`tercel.core.queue`.
"""

from __future__ import annotations

from typing import Final, Protocol

from tercel.clock import MAX_TIME_MS, Clock
from tercel.config import QueueConfig
from tercel.core.dedup import DedupKeys
from tercel.core.items import Items, QItem
from tercel.core.keyed_state import KeyedState
from tercel.core.log import ItemReader, Position, QueueLog

XID_LIMIT: Final = 2**32
"""Xids count from 1 up to below this, then wrap (skipping the xids still open)."""

NO_LIMIT: Final = 2**62 - 1
"""An unset size or count limit as :meth:`PersistentQueue.add` compares it. The config's
``UNLIMITED`` (2**63 - 1, Kestrel's Long.MaxValue) does not fit mypyc's unboxed ints (below
2**62), and every add compares three limits: boxed, those comparisons measured ~800
instructions per add (callgrind). 2**62 - 1 bytes or items is no limit in practice either."""

READ_GET: Final = 0
"""Read mode: take the head item for good."""
READ_OPEN: Final = 1
"""Read mode: reserve the head item (an open read) until confirmed or aborted."""
READ_PEEK: Final = 2
"""Read mode: look at the head item, leave it."""


class Waiter(Protocol):
    """A blocked reader. ``mode`` is one of :data:`READ_GET`, :data:`READ_OPEN`,
    :data:`READ_PEEK`."""

    mode: int

    def deliver(self, xid: int, item: QItem) -> None:
        """Called with the item (already removed unless peeking); ``xid`` is 0 unless open."""
        ...


NO_OPEN_READS: Final[dict[int, QItem]] = {}
"""The open reads of every queue that has had none: one empty dict shared, never added to
(:func:`own_open_reads` gives a queue its own), instead of 64 bytes per queue."""

NO_WAITERS: Final[dict[Waiter, None]] = {}
"""The blocked readers of every queue that has had none: shared like :data:`NO_OPEN_READS`
(:meth:`PersistentQueue.wait` gives a queue its own)."""


class QueueState:
    """The fields of a queue and the views on them; no behaviour (that is
    :class:`~tercel.core.queue.PersistentQueue`, its only subclass)."""

    def __init__(self, name: str, config: QueueConfig, log: QueueLog, clock: Clock) -> None:
        # Every field is set here, before anything can see ``self`` (compiled, a field known
        # to be set needs no check when read). The config setter below does the same.
        self.name = name
        self._config = config
        self._max_items = min(config.max_items, NO_LIMIT)
        self._max_size = min(config.max_size, NO_LIMIT)
        self._max_item_size = min(config.max_item_size, NO_LIMIT)
        self.log = log
        self.clock = clock
        self._items = Items()
        self._open = NO_OPEN_READS  # a dict of its own from the first open read on
        self._waiters = NO_WAITERS  # a dict of its own from the first blocked reader on
        self.mem_bytes = 0
        """Payload bytes of the items in memory."""
        self.disk_items = 0
        """Items only in the log (read-behind), after every item in memory."""
        self.disk_bytes = 0
        self._cursor: Position | None = None  # where the first disk item's record starts
        self._reader: ItemReader | None = None
        self._compact_floor = 0
        self._keyed: KeyedState | None = None  # keyed leases (core/keyed.py), from the first
        self.key_owners: dict[str, str] | None = None
        """The server's lease keys -> the queue that holds each (the collection's, shared:
        a key is unique per server); None for a queue on its own."""
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
        self._dedup: DedupKeys | None = None  # from the first keyed put (or replayed key) on

    # ---- settings -------------------------------------------------------------------------

    @property
    def config(self) -> QueueConfig:
        """This queue's settings; assigning them also updates the limits ``add`` reads (use
        :meth:`~tercel.core.queue.PersistentQueue.reconfigure` to apply ``max_age`` to the
        items already queued)."""
        return self._config

    @config.setter
    def config(self, config: QueueConfig) -> None:
        self._config = config
        self._max_items = min(config.max_items, NO_LIMIT)
        self._max_size = min(config.max_size, NO_LIMIT)
        self._max_item_size = min(config.max_item_size, NO_LIMIT)
        if self._dedup is not None:
            self._dedup.reconfigure(config.dedup_window_ms, config.max_dedup_keys)

    # ---- views ----------------------------------------------------------------------------

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

    @property
    def dedup_keys(self) -> int:
        """Dedup keys held (some may be past the window until the next keyed put)."""
        return len(self._dedup) if self._dedup is not None else 0

    @property
    def dedup_duplicates(self) -> int:
        """Keyed puts answered with an earlier put's item id since start."""
        return self._dedup.duplicates if self._dedup is not None else 0

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


def cap(item: QItem, max_age: int) -> None:
    """Cap ``item``'s expiry at ``max_age`` ms after its add time (``max_age``, as Kestrel
    re-applies it to items already queued)."""
    limit = min(item.add_time + max_age, MAX_TIME_MS)
    if not item.expiry or item.expiry > limit:
        item.expiry = limit


def own_open_reads(q: QueueState) -> dict[int, QItem]:
    """The open reads of ``q``, as a dict that may be added to (the queue's own, made now if
    it had none)."""
    opened = q._open
    if opened is NO_OPEN_READS:
        opened = q._open = {}
    return opened


def own_dedup(q: QueueState) -> DedupKeys:
    """The dedup keys of ``q`` (made now, from its settings, if it had none)."""
    keys = q._dedup
    if keys is None:
        cfg = q.config
        keys = q._dedup = DedupKeys(cfg.dedup_window_ms, cfg.max_dedup_keys)
    return keys
