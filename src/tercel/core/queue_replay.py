"""Replay: a queue rebuilt from its log at start-up.

:func:`replay_steps` drives the log's replay (:meth:`~tercel.core.log.QueueLog.replay_steps`)
into a :class:`Replayer`, the queue's :class:`~tercel.core.log.ReplaySink` and
:class:`~tercel.core.log.ReplayPager`: it applies each record to the queue's state without
writing anything back, keeps the first :data:`REPLAY_WINDOW` payload bytes in memory and only
counts the items after them (read-behind, :mod:`tercel.core.queue_paging`), then returns every
open read to its place. Same threading contract as :mod:`tercel.core.queue`.
"""

from __future__ import annotations

from typing import Final

from tercel.core import keyed
from tercel.core.items import QItem
from tercel.core.keyed_state import Lease
from tercel.core.log import Position
from tercel.core.queue_paging import drop_disk_items, refill
from tercel.core.queue_state import QueueState, cap, own_dedup, own_open_reads
from tercel.steps import Steps

REPLAY_WINDOW: Final = 1 << 20
"""Payload bytes of items replay puts in memory (at most ``max_memory_size``): every later item
of the log stays on disk, counted in bulk (:class:`Replayer`), and the window is read back
after start-up, a refill at a time (:data:`~tercel.core.queue_paging.REFILL_FIRST`). Loading
the whole 128 MB window during replay made start-up wait for 128 k item objects
(``git show 1f1f505:docs/benchmarks.md``, "Where restart time goes"). Items of a snapshot file
stay in memory whatever this says."""


def replay_steps(q: QueueState) -> Steps[object]:
    """Rebuild ``q`` from its log, then return every open read to its place by item id, in
    steps (:mod:`tercel.steps`), about a MiB of the log each; the log's replay report. The
    queue must not be used by anything else until the last step (it is half built)."""
    replayer = Replayer(q)
    report = yield from q.log.replay_steps(replayer, replayer)
    for xid in sorted(q._open, reverse=True):
        q.log.abort(xid)
        item = q._open.pop(xid)
        q._items.put_back(item)
        q.mem_bytes += len(item.data)
    keyed.replay_done(q)
    if not q._items:  # the head in memory; the rest of the window comes with removes
        refill(q)
    return report


class Replayer:
    """Applies journal records to a queue without writing anything back; items past the
    first :data:`REPLAY_WINDOW` bytes stay on disk (the log may count them in bulk)."""

    __slots__ = ("q", "snapshot_seq", "window")

    def __init__(self, q: QueueState) -> None:
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
            max_age = q.config.max_age
            if max_age is not None:
                cap(item, max_age)
            q._items.append(item)
            q.mem_bytes += len(data)
        q.total_items += 1
        if item_id >= q._next_id:
            q._next_id = item_id + 1

    def _pop(self) -> QItem | None:
        q = self.q
        if not q._items and q.disk_items:
            refill(q)
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
            own_open_reads(q)[xid] = item
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
        drop_disk_items(q)

    def on_delivered(self, count: int) -> None:
        q = self.q
        if q._items and not q.disk_items:  # the item just added (in memory)
            q._items.last().deliveries = count

    def on_snapshot(self, next_id: int, xid: int) -> None:
        q = self.q
        q._items.clear()
        q._open.clear()
        q.mem_bytes = 0
        drop_disk_items(q)
        q._next_id = max(q._next_id, next_id)
        q._xid = xid
        self.snapshot_seq = q.log.replay_position[0]
        if q._dedup is not None:  # the snapshot's DEDUP_KEY records follow: every key held
            q._dedup.clear()
        keyed.replay_snapshot(q)

    def on_dedup_key(self, key: str, item_id: int, put_time: int) -> None:
        """A key put at ``put_time``: kept unless the window has passed (measured now)."""
        q = self.q
        if q.config.dedup_window_ms > 0:
            own_dedup(q).restore(key, item_id, put_time, q.clock.now_ms())

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
    ) -> None:
        """KEY_TAKE (``from_head``: its items leave the head) or KEY_LIVE (a snapshot's)."""
        keyed.replay_take(
            self.q,
            key,
            Lease(key, n=n, max_items=max_items, created_at=created_at, expires_at=expires_at),
            count=count,
            size=size,
            pop=self._pop if from_head else None,
        )

    def on_key_end(self, key: str, how: int) -> None:
        in_snapshot = self.q.log.replay_position[0] == self.snapshot_seq
        keyed.replay_end(self.q, key, how, in_snapshot)

    def on_key_renew(self, key: str, expires_at: int) -> None:
        keyed.replay_renew(self.q, key, expires_at)
