"""The interface a queue writes through: the core's view of a journal.

:class:`tercel.journal.FileJournal`, :class:`tercel.journal.MemoryJournal` and
:class:`tercel.journal.NullJournal` satisfy it structurally; the core never imports them. Every
write method appends one record; it raises (a :class:`~tercel.errors.JournalWriteError`)
*before* the queue changes anything when the journal can no longer be written.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, TypeAlias

from tercel.steps import Steps


class ReplaySink(Protocol):
    """What a log drives during replay: one call per record, in order."""

    def on_add(self, item_id: int, add_time: int, expiry: int, data: bytes) -> None: ...
    def on_remove(self) -> None: ...
    def on_open(self, xid: int) -> None: ...
    def on_confirm(self, xid: int) -> None: ...
    def on_abort(self, xid: int) -> None: ...
    def on_return(self, xid: int) -> None: ...
    def on_flush(self) -> None: ...
    def on_snapshot(self, next_id: int, xid: int) -> None: ...
    def on_delivered(self, count: int) -> None: ...
    def on_dedup_key(self, key: str, item_id: int, put_time: int) -> None:
        """A dedup key put at ``put_time`` stored item ``item_id`` (ADD_KEYED, after its
        ``on_add``; DEDUP_KEY, a snapshot's remembered key)."""
        ...

    def on_key_take(
        self,
        key: str,
        *,
        n: int,
        count: int,
        size: int,
        max_items: int,
        created_at: int,
        expires_at: int,
        from_head: bool,
    ) -> None: ...
    def on_key_end(self, key: str, how: int) -> None: ...
    def on_key_renew(self, key: str, expires_at: int) -> None: ...


Columns: TypeAlias = "tuple[array[int], array[int], array[int], array[int], bytearray, array[int]]"
"""A run of a keyed lease's items as columns: ``(item_ids, deliveries, add_ms, expiry_ms,
data, offsets)`` (``offsets``: where each payload starts in ``data``, and the last ends)."""

KeyState = tuple[str, int, int, int, int, int, int, int]
"""A keyed lease for a snapshot: ``(key, lease file n, count, size, max_items, created_at,
expires_at, how)``; ``how`` 0 for a live lease, else how a remembered key ended."""


Position = tuple[int, int]
"""A place in a log: the journal's ``(file seq, offset)``, compared for order; the first
field names a file (replay tells a snapshot file's records by it)."""


class ReplayPager(Protocol):
    """Replay's optional fast path for items that stay in the log (read-behind): the log
    counts runs of ADD records in bulk instead of calling ``on_add`` for each."""

    def pages_from(self, seq: int) -> bool:
        """True when the ADD records that follow, in file ``seq``, would only be counted."""
        ...

    def on_adds_on_disk(self, position: Position, count: int, size: int, last_id: int) -> None:
        """``count`` ADDs from ``position`` on (``size`` payload bytes, the last numbered
        ``last_id``) stay in the log: the effect of ``count`` calls of ``on_add``."""
        ...

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
        """Replay starts at a checkpoint the log kept (:meth:`QueueLog.checkpoint`): the queue
        is the ``items`` items recorded from ``head`` on (``size`` payload bytes), with these
        counters; the records after the checkpoint follow as usual."""
        ...


class ItemReader(Protocol):
    """Reads back, in order, the items a queue left in its log (read-behind)."""

    @property
    def position(self) -> Position:
        """Where the next read starts."""
        ...

    def next_add(self) -> tuple[int, int, int, bytes] | None:
        """``(item_id, add_time, expiry, data)`` of the next item, or None."""
        ...

    def next_adds(self, budget: int) -> list[tuple[int, int, int, bytes]]:
        """The next items until their payloads reach ``budget`` bytes (at least one if any)."""
        ...

    def close(self) -> None: ...


class QueueLog(Protocol):
    """An append-only record of one queue's changes."""

    def replay(self, sink: ReplaySink, pager: ReplayPager | None = None) -> object:
        """Apply every record to ``sink`` in order (runs of ADDs that stay in the log may go
        to ``pager`` in bulk instead); returns a report for logging."""
        ...

    def replay_steps(self, sink: ReplaySink, pager: ReplayPager | None = None) -> Steps[object]:
        """:meth:`replay` in steps (:mod:`tercel.steps`) of about a MiB read each: the
        caller may do other work between two, but must not use this log until the end."""
        ...

    def add(self, item_id: int, add_time: int, expiry: int, data: bytes) -> None: ...
    def add_keyed(self, item_id: int, add_time: int, expiry: int, data: bytes, key: str) -> None:
        """:meth:`add` with the put's dedup key, in one record (a torn write keeps neither)."""
        ...

    def remove(self) -> None: ...
    def flush_items(self) -> None: ...
    def open_read(self, xid: int) -> None: ...
    def confirm(self, xid: int) -> None: ...
    def abort(self, xid: int) -> None: ...

    @property
    def size(self) -> int:
        """Bytes of every file of this log."""
        ...

    @property
    def current_size(self) -> int:
        """Bytes of the file being appended to."""
        ...

    pages: bool
    """True when items may be left in the log and read back later (read-behind)."""

    @property
    def failed(self) -> bool:
        """True once a write failed: every later append raises (a keyed put's duplicate is
        not answered then either: its original may not be on disk)."""
        ...

    compacting: bool
    """True while a compaction runs; the queue starts no other."""
    replay_position: Position
    """During replay: where the record being applied starts."""
    rotations: int
    compactions: int

    def position(self) -> Position:
        """Where the next appended record will start."""
        ...

    def reader(self, position: Position) -> ItemReader:
        """Read the items recorded from ``position`` on."""
        ...

    def size_before(self, seq: int) -> int:
        """Bytes of the log's files older than file ``seq``."""
        ...

    def rotate(self) -> bool:
        """Start a new file; False when it cannot now."""
        ...

    def compact(
        self,
        next_id: int,
        xid: int,
        open_items: Sequence[tuple[int, Any]],
        items: Iterable[Any],
        cursor: Position | None,
        *,
        dedup_keys: Sequence[tuple[str, int, int]] = (),
        keyed: Sequence[KeyState] = (),
    ) -> bool:
        """Replace history by a snapshot of this state; True when started (see the journal).
        ``dedup_keys``: ``(key, item_id, put time)`` of the dedup keys held, oldest first."""
        ...

    def checkpoint_due(self) -> bool:
        """True when the log would like a checkpoint now (it says how often)."""
        ...

    def checkpoint(
        self,
        *,
        head_id: int,
        items: int,
        size: int,
        next_id: int,
        xid: int,
        total: int,
        removed_add_time: int,
        hint: Position | None = None,
    ) -> bool:
        """Keep a checkpoint: the queue is the ``items`` items recorded from the one numbered
        ``head_id`` on (``hint``: where that one may be), with these counters, so replay can
        start here. False when the log cannot (or keeps none)."""
        ...

    def close(self) -> None: ...
    def erase(self) -> None: ...

    # ---- keyed leases (docs/journal_format.md §18) ------------------------------------------

    def key_take(
        self,
        key: str,
        *,
        n: int,
        count: int,
        size: int,
        max_items: int,
        created_at: int,
        expires_at: int,
    ) -> None:
        """Record ``count`` head items moving into lease file ``n`` of ``key``."""
        ...

    def key_end(self, key: str, how: int) -> None: ...
    def key_renew(self, key: str, expires_at: int) -> None: ...

    def lease_write(self, n: int, at: int, items: Sequence[Any], sync: bool) -> list[int]:
        """Write items into lease file ``n`` from offset ``at`` (0: new); where each ends."""
        ...

    def lease_index(self, n: int, count: int) -> array[int]:
        """Where each of the first ``count`` items of lease file ``n`` starts, and the end."""
        ...

    def lease_columns(self, n: int, start: int, stop: int) -> Columns:
        """The items of lease file ``n`` between offsets ``start`` and ``stop``."""
        ...

    def lease_remove(self, n: int) -> None: ...
    def lease_files(self) -> list[int]: ...

    def durable(self, position: Position, synced: bool) -> bool:
        """True when every record before ``position`` was written (and fsynced)."""
        ...
