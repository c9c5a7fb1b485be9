"""Read-behind: a queue's items read back from its log into memory (Kestrel's "read-behind").

While the payload bytes in memory are at ``max_memory_size``, new items are only written to
the log and counted (``disk_items``, ``disk_bytes``); memory keeps the head of the queue, and
removals read the next items back from the log, in batches, through an
:class:`~tercel.core.log.ItemReader` opened at the first disk item's record (``_cursor``).
Items on disk have no Python object at all.

Functions on a :class:`~tercel.core.queue_state.QueueState`, called by the queue when it
takes an item (:func:`low`, :func:`refill`) and by replay and the whole-queue changes
(:func:`drop_disk_items`). Same threading contract as :mod:`tercel.core.queue`.
"""

from __future__ import annotations

from typing import Final

from tercel.core.items import QItem
from tercel.core.log import Position
from tercel.core.queue_state import QueueState, cap
from tercel.errors import JournalError

REFILL_FIRST: Final = 1 << 20
"""The smallest read-behind refill. A refill reads at most as many payload bytes as memory
holds already (at least this, at most an eighth of ``max_memory_size``, the refill of a window
in steady state): after a restart the window grows 1, 2, 4 ... MB over the first removes
instead of one remove waiting for all of it."""


def refill(q: QueueState) -> None:
    """Read the next items back from the log into memory, until memory is full, or this
    call read ``max(REFILL_FIRST, min(mem_bytes, max_memory_size / 8))`` payload bytes
    (see :data:`REFILL_FIRST`; ``mem_bytes`` as the call starts), and always the head when
    memory has none. Raises :class:`~tercel.errors.JournalError` when the log holds fewer
    items than ``disk_items``.

    Never asks for more than ``disk_bytes``: during replay the log goes on past the record
    being applied, and the ADDs there are not disk items yet. A reader stops once the
    payloads reach the budget, so it cannot reach them (a budget of 0, when only empty
    items are left on disk, reads exactly one).
    """
    config = q.config
    limit = config.max_memory_size
    items = q._items
    step = max(REFILL_FIRST, min(q.mem_bytes, limit >> 3))
    read = 0
    while q.disk_items and (q.mem_bytes < limit or not items) and read < step:
        reader = q._reader
        if reader is None:
            assert q._cursor is not None
            reader = q._reader = q.log.reader(q._cursor)
        budget = min(limit - q.mem_bytes, q.disk_bytes, step - read)
        batch = reader.next_adds(budget)
        if not batch:
            raise JournalError(f"queue {q.name}: {q.disk_items} items missing from the log", "", 0)
        size = 0
        for got in batch:
            item = QItem(*got)
            if config.max_age is not None:
                cap(item, config.max_age)
            items.append(item)
            size += len(got[3])
        q.mem_bytes += size
        q.disk_items -= len(batch)
        q.disk_bytes -= size
        read += size
    if not q.disk_items:
        drop_disk_items(q)


def low(q: QueueState) -> bool:
    """True when memory has room for a worthwhile refill: an eighth of the window (so
    reads from the log come in batches, not one item per removal), or nothing at all."""
    limit = q.config.max_memory_size
    return not q._items or q.mem_bytes <= limit - (limit >> 3)


def drop_disk_items(q: QueueState) -> None:
    """Forget the items on disk (flushed, erased, or all read back) and close the reader."""
    q.disk_items = q.disk_bytes = 0
    q._cursor = None
    if q._reader is not None:
        q._reader.close()
        q._reader = None


def read_position(q: QueueState) -> Position | None:
    """Where the first disk item's record starts: the reader's position once one is open,
    else the cursor (None without disk items)."""
    return q._reader.position if q._reader is not None else q._cursor
