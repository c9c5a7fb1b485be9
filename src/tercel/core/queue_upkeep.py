"""A queue's log upkeep and its whole-queue changes.

The queue decides *when* its log rotates, compacts or keeps a checkpoint (:func:`maintain_log`,
by the rules of docs/journal_format.md); the log carries it out. The whole-queue changes are
here too: :func:`flush`, :func:`reconfigure`, :func:`close` and :func:`erase`.

Functions on a :class:`~tercel.core.queue_state.QueueState`, called through the methods of
the same names on :class:`~tercel.core.queue.PersistentQueue` (and :func:`maintain_log` every
:data:`~tercel.core.queue.MAINTAIN_EVERY` + 1 adds and removals). Same threading contract as
:mod:`tercel.core.queue`.
"""

from __future__ import annotations

import logging
from typing import Final

from tercel.config import QueueConfig
from tercel.core import keyed
from tercel.core.items import QItem
from tercel.core.log import Position
from tercel.core.queue_paging import drop_disk_items, read_position
from tercel.core.queue_state import QueueState, cap
from tercel.errors import JournalError

_log = logging.getLogger("tercel.core.queue")  # (q.log is the queue's journal)

READ_BEHIND_COMPACT_WINDOWS: Final = 8
"""In read-behind, the consumed files are compacted once they weigh this many memory windows:
the snapshot rewrites the window, so its extra writes are 1/8 of what drains. At 2 the rewrite
took 29 % of the server's CPU samples in a 2 GB drain (``git show 1f1f505:docs/benchmarks.md``);
8 is also Kestrel's default proportion (a pack of the 128 MB window each time the journal passes
1 GB). ``max_journal_size_absolute`` bounds the disk that consumed files may hold meanwhile."""


def maintain_log(q: QueueState) -> None:
    """Rotate or compact the log when the rules say so (docs/journal_format.md), and keep a
    checkpoint when one is due (:func:`checkpoint`).

    1. empty queue (open reads aside), log over ``max_journal_size``: compact;
    2. queue under ``max_journal_size`` but log over ``max_journal_overflow`` times it:
       compact;
    3. log over ``max_journal_size_absolute``: compact what can be;
    in read-behind: rotate files at ``max_journal_size``, and compact the files wholly
    before the read position once they outweigh both ``max_journal_size`` and
    :data:`READ_BEHIND_COMPACT_WINDOWS` memory windows. Sizes count every file of the log, not
    only the current one.
    """
    log = q.log
    cfg = q.config
    if log.checkpoint_due():
        checkpoint(q)
    size = log.size
    if size <= cfg.max_journal_size or log.compacting or not log.pages:
        return
    if q.disk_items:
        if log.current_size > cfg.max_journal_size:
            log.rotate()
        cursor = read_position(q)
        assert cursor is not None
        consumed = log.size_before(cursor[0])
        windows = READ_BEHIND_COMPACT_WINDOWS * q.mem_bytes
        if consumed > max(cfg.max_journal_size, windows) or (
            size > cfg.max_journal_size_absolute and consumed
        ):
            compact_at(q, cursor)
        return
    if size <= q._compact_floor:
        return
    live = q.mem_bytes
    if (
        not q._items
        or (live < cfg.max_journal_size and size > cfg.max_journal_overflow * cfg.max_journal_size)
        or size > cfg.max_journal_size_absolute
    ):
        compact_at(q, None)


def checkpoint(q: QueueState) -> bool:
    """Let the log keep a checkpoint (replay may start there) when the queue is one run
    of the log's ADD records: no open reads, no item handed out before (no delivery
    count to keep), and item ids that follow one another from the head to the newest.
    Anything else (an aborted read back at the head, say, or dedup keys held) is left to a
    full replay.
    True when the log kept one. Costs a pass over the items in memory."""
    log = q.log
    if q._open or not log.pages or q._keyed is not None:
        return False  # (replay from a checkpoint would skip the keyed leases' records)
    if q._dedup is not None:  # a checkpoint's replay skips the records before it: their keys
        q._dedup.expire(q.clock.now_ms())
        if len(q._dedup):
            return False
    items = q._items
    count = len(items) + q.disk_items
    head_id = q._next_id - count
    expect = head_id
    for item in items:
        if item.id != expect or item.deliveries:
            return False
        expect += 1
    hint = read_position(q) if not items and q.disk_items else None
    return log.checkpoint(
        head_id=head_id,
        items=count,
        size=q.mem_bytes + q.disk_bytes,
        next_id=q._next_id,
        xid=q._xid,
        total=q.total_items,
        removed_add_time=q._last_removed_add_time,
        hint=hint,
    )


def compact(q: QueueState) -> bool:
    """Compact the log now, whatever the rules say (offline tools); True if started."""
    return compact_at(q, read_position(q) if q.disk_items else None)


def compact_at(q: QueueState, cursor: Position | None) -> bool:
    """Start a compaction that keeps the open reads, the items in memory and, in read-behind,
    the log from ``cursor`` on; True if started."""
    # The snapshot is written off the loop: it gets the items as they are now, not the
    # live objects (their delivery counts and expiries change meanwhile).
    open_items = [(xid, _frozen(item)) for xid, item in q._open.items()]
    items = [_frozen(item) for item in q._items]
    keys = q._dedup.live() if q._dedup is not None else []
    ks = q._keyed
    compactions = q.log.compactions
    if ks is None:
        if not q.log.compact(q._next_id, q._xid, open_items, items, cursor, dedup_keys=keys):
            return False
    elif not q.log.compact(
        q._next_id, q._xid, open_items, items, cursor, dedup_keys=keys, keyed=ks.snapshot()
    ):
        return False
    else:
        keyed.compaction_started(q, compactions)
    if cursor is None:
        # Do not compact again until the log has grown by another max_journal_size
        # beyond what this one kept (Kestrel issue #114: rewrite storms when many reads
        # stay open). Read-behind compactions keep only the window, which drains: no floor.
        kept = q.mem_bytes + sum(len(i.data) for _, i in open_items)
        q._compact_floor = kept + q.config.max_journal_size
    return True


def _frozen(item: QItem) -> QItem:
    """A copy of ``item`` as it is now."""
    copy = QItem(item.id, item.add_time, item.expiry, item.data)
    copy.deliveries = item.deliveries
    return copy


# ---- whole-queue changes ------------------------------------------------------------------


def flush(q: QueueState) -> None:
    """Drop every item that is not open (the log's FLUSH record first); when there is none,
    nothing is written or counted."""
    if not q._items and not q.disk_items:
        return
    q.log.flush_items()
    q._items.clear()
    q.mem_bytes = 0
    drop_disk_items(q)
    q.total_flushes += 1


def reconfigure(q: QueueState, config: QueueConfig) -> None:
    """Take new settings (``reload``). A ``max_age`` caps the expiry of items already
    queued too, measured from their add time, as Kestrel re-applies it: items in memory
    and items held by open reads (and leases) now, items on disk as they are read back."""
    q.config = config
    if config.max_age is not None:
        for item in q._items:
            cap(item, config.max_age)
        for item in q._open.values():
            cap(item, config.max_age)


def close(q: QueueState) -> None:
    """Stop accepting work, leave a checkpoint when the queue allows one (a quick next
    start), and close the log (waiters are left to time out)."""
    if not q.closed:
        try:
            checkpoint(q)
        except (JournalError, OSError) as exc:
            _log.warning("queue %s: no checkpoint at shutdown: %s", q.name, exc)
    q.closed = True
    if q._reader is not None:
        q._reader.close()
        q._reader = None
    q.log.close()
    keyed.closed(q)


def erase(q: QueueState) -> None:
    """Close and delete the log and every item (``delete``)."""
    q.closed = True
    q._items.clear()
    q._open.clear()
    q.mem_bytes = 0
    drop_disk_items(q)
    keyed.erase(q)
    q.log.erase()
