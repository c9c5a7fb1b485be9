"""PersistentQueue: one suite, run on the RAM twin and on the file journal.

Every test gets a ``store`` that makes the queue's log and can "restart" it: close the log,
build a fresh queue object on the same storage and replay. Time comes from a ManualClock.
"""

from __future__ import annotations

import dataclasses
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tercel.clock import ManualClock
from tercel.config import QueueConfig
from tercel.core.queue import READ_GET, READ_OPEN, READ_PEEK, XID_LIMIT, PersistentQueue, QItem
from tercel.errors import ItemTooLarge, JournalWriteError
from tercel.journal import FileJournal, MemoryJournal
from tercel.journal import records as rec
from tercel.journal.faults import FaultyFiles
from tercel.journal.files import DataDir

T0 = 1_700_000_000_000

ItemState = tuple[int, int, int, bytes]


class Store:
    """Where a queue's log lives; ``kind`` is ``"memory"`` or ``"file"``."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind = kind
        self.path = path
        self.memory = MemoryJournal()
        self.logs: list[FileJournal] = []

    def open_log(self) -> MemoryJournal | FileJournal:
        if self.kind == "memory":
            return self.memory
        log = FileJournal(str(self.path), "q")
        self.logs.append(log)
        return log

    def close(self) -> None:
        for log in self.logs:
            log.close()


class Harness:
    """A queue on a store, with a manual clock and the items it expired."""

    def __init__(self, store: Store, **config: Any) -> None:
        self.store = store
        self.clock = ManualClock(T0)
        self.config = QueueConfig(**config)
        self.expired: list[bytes] = []
        self.q = self.build()

    def build(self) -> PersistentQueue:
        q = PersistentQueue("q", self.config, self.store.open_log(), self.clock, self._on_expired)
        q.replay()
        return q

    def _on_expired(self, q: PersistentQueue, item: QItem) -> None:
        self.expired.append(item.data)

    def restart(self) -> PersistentQueue:
        """Close the queue and replay its log into a new queue object."""
        self.q.close()
        self.q = self.build()
        return self.q

    def reconfigure(self, **changes: Any) -> None:
        self.config = dataclasses.replace(self.config, **changes)
        self.q.config = self.config


def state(q: PersistentQueue) -> tuple[list[ItemState], int, int]:
    """Items (id, add time, expiry, data) head first, bytes, open reads."""
    items = [(i.id, i.add_time, i.expiry, i.data) for i in q.items_in_memory()]
    return items, q.bytes, q.open_reads


def datas(q: PersistentQueue) -> list[bytes]:
    return [i.data for i in q.items_in_memory()]


@pytest.fixture(params=["memory", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = Store(request.param, tmp_path)
    yield s
    s.close()


@pytest.fixture
def h(store: Store) -> Harness:
    return Harness(store)


def after_restart(q: PersistentQueue) -> tuple[list[ItemState], int, int]:
    """The state a restart must produce: open reads back in their places (item-id order)."""
    items, size, _ = state(q)
    reopened = [(i.id, i.add_time, i.expiry, i.data) for i in q.open_items().values()]
    merged = sorted(reopened + items, key=lambda i: i[0])
    return merged, size + sum(len(i[3]) for i in reopened), 0


def assert_replays_the_same(h: Harness) -> None:
    """A fresh queue on the same log has the same items, order and bytes (open reads are
    returned to their places, as after any restart)."""
    expected = after_restart(h.q)
    h.restart()
    assert state(h.q) == expected


# ---- FIFO and open reads -------------------------------------------------------------------


def test_fifo(h: Harness) -> None:
    q = h.q
    for data in (b"a", b"bb", b"ccc"):
        assert q.add(data)
    assert (len(q), q.bytes) == (3, 6)
    assert [q.remove().data for _ in range(3)] == [b"a", b"bb", b"ccc"]  # type: ignore[union-attr]
    assert q.remove() is None
    assert (len(q), q.bytes) == (0, 0)
    assert q.total_items == 3


def test_items_get_ids_and_add_times(h: Harness) -> None:
    q = h.q
    q.add(b"a")
    h.clock.advance(5)
    q.add(b"b", now=T0 + 7)
    assert state(q)[0] == [(1, T0, 0, b"a"), (2, T0 + 7, 0, b"b")]


def test_peek_does_not_remove(h: Harness) -> None:
    q = h.q
    assert q.peek() is None
    q.add(b"a")
    q.add(b"b")
    head = q.peek()
    assert head is not None and head.data == b"a"
    assert datas(q) == [b"a", b"b"]


def test_open_confirm(h: Harness) -> None:
    q = h.q
    q.add(b"a")
    q.add(b"b")
    got = q.remove_open()
    assert got is not None
    xid, item = got
    assert (xid, item.data, item.deliveries) == (1, b"a", 1)
    assert (len(q), q.bytes, q.open_reads, q.transactions) == (1, 1, 1, 1)
    assert q.confirm(xid)
    assert not q.confirm(xid)
    assert q.open_reads == 0
    assert datas(q) == [b"b"]
    assert_replays_the_same(h)


def test_abort_returns_the_item_to_its_place(h: Harness) -> None:
    q = h.q
    for data in (b"a", b"b", b"c"):
        q.add(data)
    x1, _ = q.remove_open()  # type: ignore[misc]
    x2, _ = q.remove_open()  # type: ignore[misc]
    assert (x1, x2) == (1, 2)
    assert q.abort(x1)
    assert datas(q) == [b"a", b"c"]
    assert q.abort(x2)
    assert datas(q) == [b"a", b"b", b"c"]  # by item id, not in the order of the aborts
    assert not q.abort(x2)
    assert q.canceled_transactions == 2
    assert q.bytes == 3
    x3, item = q.remove_open()  # type: ignore[misc]
    assert (x3, item.data, item.deliveries) == (3, b"a", 2)
    assert_replays_the_same(h)


def test_remove_open_on_empty(h: Harness) -> None:
    assert h.q.remove_open() is None
    assert h.q.open_reads == 0


def test_unknown_xids(h: Harness) -> None:
    assert not h.q.confirm(1)
    assert not h.q.abort(1)


def test_xids_wrap_past_zero() -> None:
    """The xid counter wraps below :data:`XID_LIMIT` and never hands out 0. (A log brings the
    counter near its limit: replay keeps the last xid it read.)"""
    log = MemoryJournal()
    for item_id, data in ((1, b"a"), (2, b"b"), (3, b"c")):
        rec.encode_add(log.data, item_id, T0, 0, data)
    rec.encode_xid(log.data, rec.OP_OPEN, XID_LIMIT - 2)  # a
    rec.encode_xid(log.data, rec.OP_CONFIRM, XID_LIMIT - 2)
    q = PersistentQueue("q", QueueConfig(), log, ManualClock(T0))
    q.replay()
    assert q.last_xid == XID_LIMIT - 2
    x2, _ = q.remove_open()  # type: ignore[misc]
    x3, _ = q.remove_open()  # type: ignore[misc]
    assert (x2, x3) == (XID_LIMIT - 1, 1)


def test_xids_continue_after_restart(h: Harness) -> None:
    q = h.q
    for data in (b"a", b"b"):
        q.add(data)
    x1, _ = q.remove_open()  # type: ignore[misc]
    q.confirm(x1)
    q = h.restart()
    x2, _ = q.remove_open()  # type: ignore[misc]
    assert x2 == x1 + 1
    q.add(b"c")
    assert state(q)[0][-1][0] == 3  # item ids continue too


# ---- limits --------------------------------------------------------------------------------


def test_max_items(store: Store) -> None:
    h = Harness(store, max_items=2)
    q = h.q
    assert q.add(b"a") and q.add(b"b")
    assert not q.add(b"c")
    assert datas(q) == [b"a", b"b"]
    assert q.total_items == 2
    q.remove_open()  # open reads do not count
    assert q.add(b"c")
    assert not q.add(b"d")
    assert_replays_the_same(h)


def test_max_size_is_checked_before_the_add(store: Store) -> None:
    h = Harness(store, max_size=10)
    q = h.q
    assert q.add(b"x" * 8)
    assert q.add(b"y" * 8)  # 8 < 10 before the add: overshoots to 16
    assert q.bytes == 16
    assert not q.add(b"z")
    q.remove()
    assert q.bytes == 8
    assert q.add(b"z" * 100)


def test_discard_old_when_full_by_items(store: Store) -> None:
    h = Harness(store, max_items=2, discard_old_when_full=True)
    q = h.q
    for data in (b"a", b"b", b"c", b"d"):
        assert q.add(data)
    assert datas(q) == [b"c", b"d"]
    assert q.discarded == 2
    assert h.expired == []
    assert_replays_the_same(h)


def test_discard_old_when_full_by_size(store: Store) -> None:
    h = Harness(store, max_size=10, discard_old_when_full=True)
    q = h.q
    for data in (b"a" * 4, b"b" * 4, b"c" * 4):
        assert q.add(data)
    assert datas(q) == [b"a" * 4, b"b" * 4, b"c" * 4]  # 8 < 10 before the third add
    assert q.add(b"d")
    assert datas(q) == [b"b" * 4, b"c" * 4, b"d"]  # 12 -> drop a -> 8 fits
    assert q.discarded == 1
    assert_replays_the_same(h)


def test_max_item_size_is_inclusive(store: Store) -> None:
    h = Harness(store, max_item_size=3)
    q = h.q
    size = q.log.size
    with pytest.raises(ItemTooLarge):
        q.add(b"abcd")
    assert (len(q), q.total_items, q.log.size) == (0, 0, size)
    assert q.add(b"abc")


def test_closed_queue_refuses(h: Harness) -> None:
    q = h.q
    q.add(b"a")
    got = q.remove_open()
    assert got is not None
    q.close()
    assert not q.add(b"b")
    assert not q.abort(got[0])


# ---- expiry --------------------------------------------------------------------------------


def test_expiry_is_strictly_after(h: Harness) -> None:
    q = h.q
    q.add(b"a", expiry=T0 + 100)
    h.clock.advance(100)
    assert q.peek() is not None  # expiry == now: still alive
    h.clock.advance(1)
    assert q.remove() is None
    assert (q.expired_items, h.expired) == (1, [b"a"])
    assert_replays_the_same(h)


def test_expiry_only_looks_at_the_head(h: Harness) -> None:
    q = h.q
    q.add(b"live", expiry=T0 + 1000)
    q.add(b"dead", expiry=T0 + 10)
    q.add(b"never")
    h.clock.advance(500)
    assert q.flush_expired() == 0
    assert len(q) == 3
    assert q.remove().data == b"live"  # type: ignore[union-attr]
    assert len(q) == 2  # the expired item is found only when it reaches the head
    assert q.peek().data == b"never"  # type: ignore[union-attr]
    assert h.expired == [b"dead"]


@pytest.mark.parametrize("op", ["add", "remove", "remove_open", "peek"])
def test_expired_head_is_dropped_by(h: Harness, op: str) -> None:
    q = h.q
    q.add(b"a", expiry=T0 + 1)
    q.add(b"b", expiry=T0 + 2)
    q.add(b"c")
    h.clock.advance(10)
    getattr(q, op)(*([b"d"] if op == "add" else []))
    assert h.expired == [b"a", b"b"]
    assert q.expired_items == 2
    assert_replays_the_same(h)


def test_expiry_uses_the_given_now(h: Harness) -> None:
    q = h.q
    q.add(b"a", expiry=T0 + 1)
    assert q.peek(now=T0 + 1) is not None
    assert q.peek(now=T0 + 2) is None


def test_expire_sweep_limit(store: Store) -> None:
    h = Harness(store, max_expire_sweep=2)
    q = h.q
    for i in range(5):
        q.add(b"%d" % i, expiry=T0 + 1)
    h.clock.advance(2)
    assert q.flush_expired() == 2
    assert q.flush_expired() == 2
    assert q.remove() is None  # the last one is swept on the way
    assert q.expired_items == 5


def test_flush_expired_counts(h: Harness) -> None:
    q = h.q
    q.add(b"a", expiry=T0 + 1)
    q.add(b"b", expiry=T0 + 1)
    q.add(b"c", expiry=T0 + 50)
    assert q.flush_expired() == 0
    h.clock.advance(10)
    assert q.flush_expired() == 2
    assert q.flush_expired(now=T0 + 51) == 1
    assert len(q) == 0


def test_max_age_caps_expiry(store: Store) -> None:
    h = Harness(store, max_age=50)
    q = h.q
    q.add(b"none")
    q.add(b"later", expiry=T0 + 1000)
    q.add(b"sooner", expiry=T0 + 10)
    assert [e for _, _, e, _ in state(q)[0]] == [T0 + 50, T0 + 50, T0 + 10]
    assert_replays_the_same(h)


def test_replay_does_not_expire(h: Harness) -> None:
    q = h.q
    q.add(b"a", expiry=T0 + 1)
    h.clock.advance(10)
    q = h.restart()
    assert len(q) == 1  # replay never sweeps
    assert q.remove() is None
    assert h.expired == [b"a"]


# ---- flush and erase -----------------------------------------------------------------------


def test_flush_keeps_open_reads(h: Harness) -> None:
    q = h.q
    for data in (b"a", b"b", b"c"):
        q.add(data)
    x1, _ = q.remove_open()  # type: ignore[misc]
    x2, _ = q.remove_open()  # type: ignore[misc]
    q.flush()
    assert (len(q), q.bytes, q.open_reads, q.total_flushes) == (0, 0, 2, 1)
    q.flush()  # empty: nothing written, nothing counted
    assert q.total_flushes == 1
    assert q.confirm(x1)
    assert q.abort(x2)
    assert datas(q) == [b"b"]
    assert_replays_the_same(h)


def test_erase(h: Harness) -> None:
    q = h.q
    q.add(b"a")
    q.add(b"b")
    q.remove_open()
    q.erase()
    assert (len(q), q.bytes, q.open_reads, q.closed) == (0, 0, 0, True)
    if h.store.kind == "file":
        assert os.listdir(h.store.path) == []
    q = h.build()
    assert state(q) == ([], 0, 0)


# ---- replay --------------------------------------------------------------------------------


def test_open_reads_return_to_the_head_in_order_after_restart(h: Harness) -> None:
    q = h.q
    for data in (b"a", b"b", b"c", b"d"):
        q.add(data)
    q.remove_open()
    q.remove_open()
    q.remove_open()
    q.confirm(2)
    q = h.restart()
    assert datas(q) == [b"a", b"c", b"d"]
    assert (q.open_reads, q.bytes) == (0, 3)
    q = h.restart()  # the aborts written at the first restart replay too
    assert datas(q) == [b"a", b"c", b"d"]


def test_replay_after_mixed_operations(store: Store) -> None:
    h = Harness(store, max_items=4, discard_old_when_full=True, max_age=1000)
    q = h.q
    for i in range(6):
        q.add(b"item%d" % i, expiry=T0 + 100 * i)
    x, _ = q.remove_open()  # type: ignore[misc]
    q.remove()
    q.abort(x)
    q.remove_open()
    h.clock.advance(250)
    q.add(b"late")
    q.peek()
    assert_replays_the_same(h)
    q = h.q
    assert q.remove_open() is not None
    q.flush()
    q.add(b"after flush")
    assert_replays_the_same(h)


def test_replay_counts_and_age(h: Harness) -> None:
    q = h.q
    assert q.age(T0) == 0
    q.add(b"a")
    q.add(b"b")
    h.clock.advance(30)
    q.remove()
    assert q.age(T0 + 40) == 40
    q = h.restart()
    assert q.total_items == 2  # replayed adds count, as in Kestrel
    assert q.age(T0 + 40) == 40


# ---- journal failures ----------------------------------------------------------------------


def test_a_refused_write_leaves_the_queue_unchanged(tmp_path: Path) -> None:
    faults = FaultyFiles()  # the file seam: every write refused once armed
    log = FileJournal(str(tmp_path), "q", directory=DataDir(str(tmp_path), ops=faults))
    q = PersistentQueue("q", QueueConfig(), log, ManualClock(T0))
    q.replay()
    q.add(b"a")
    q.add(b"b")
    x, _ = q.remove_open()  # type: ignore[misc]
    before = state(q)
    for op in ("pwrite", "pwritev"):
        faults.fail(op, errno.EBADF)
    for op in (
        lambda: q.add(b"c"),
        q.remove,
        q.remove_open,
        lambda: q.confirm(x),
        lambda: q.abort(x),
        q.flush,
    ):
        with pytest.raises(JournalWriteError):
            op()
        assert state(q) == before
    faults.clear()
    log.close()


# ---- waiters -------------------------------------------------------------------------------


MODES = {"get": READ_GET, "open": READ_OPEN, "peek": READ_PEEK}


class Reader:
    """A blocked reader that writes down what it was given."""

    def __init__(self, mode: str) -> None:
        self.mode = MODES[mode]
        self.got: list[tuple[int, bytes]] = []

    def deliver(self, xid: int, item: QItem) -> None:
        self.got.append((xid, item.data))


def test_waiters_are_served_first_come_first_served(h: Harness) -> None:
    q = h.q
    first, second, third = Reader("get"), Reader("get"), Reader("get")
    for r in (first, second, third):
        q.wait(r)
    assert q.waiters == 3
    q.add(b"a")
    assert (first.got, second.got, third.got) == ([(0, b"a")], [], [])
    q.add(b"b")
    assert second.got == [(0, b"b")]
    assert (len(q), q.waiters) == (0, 1)
    assert_replays_the_same(h)


def test_open_waiter_gets_an_xid(h: Harness) -> None:
    q = h.q
    r = Reader("open")
    q.wait(r)
    q.add(b"a")
    assert r.got == [(1, b"a")]
    assert q.open_reads == 1
    assert q.confirm(1)


def test_peek_waiters_see_the_item_and_leave_it(h: Harness) -> None:
    q = h.q
    peeker, getter, later = Reader("peek"), Reader("get"), Reader("peek")
    q.wait(peeker)
    q.wait(getter)
    q.wait(later)
    q.add(b"a")
    assert peeker.got == [(0, b"a")]
    assert getter.got == [(0, b"a")]
    assert later.got == []  # the getter took it
    assert (len(q), q.waiters) == (0, 1)


def test_peek_waiter_alone_leaves_the_item(h: Harness) -> None:
    q = h.q
    peeker = Reader("peek")
    q.wait(peeker)
    q.add(b"a")
    assert peeker.got == [(0, b"a")]
    assert datas(q) == [b"a"]
    assert q.waiters == 0


def test_cancelled_waiter_is_not_served(h: Harness) -> None:
    q = h.q
    gone, stays = Reader("get"), Reader("get")
    q.wait(gone)
    q.wait(stays)
    q.cancel_wait(gone)
    q.cancel_wait(gone)  # harmless twice
    q.add(b"a")
    assert (gone.got, stays.got) == ([], [(0, b"a")])


def test_abort_serves_a_waiter(h: Harness) -> None:
    q = h.q
    q.add(b"a")
    x, _ = q.remove_open()  # type: ignore[misc]
    r = Reader("get")
    q.wait(r)
    q.abort(x)
    assert r.got == [(0, b"a")]
    assert len(q) == 0


def test_waiter_is_not_handed_an_expired_item(h: Harness) -> None:
    q = h.q
    q.add(b"old", expiry=T0 + 1)
    h.clock.advance(5)
    x, _ = q.remove_open(now=T0)  # type: ignore[misc]  # taken before it expired
    r = Reader("get")
    q.wait(r)
    q.abort(x)  # back at the head, but expired now
    assert r.got == []
    assert h.expired == [b"old"]
    assert q.waiters == 1


# ---- configuration changes -----------------------------------------------------------------


def test_new_limits_apply_to_later_operations_only(store: Store) -> None:
    h = Harness(store)
    q = h.q
    for data in (b"a", b"b", b"c"):
        q.add(data)
    h.reconfigure(max_items=1, max_age=10)
    assert datas(q) == [b"a", b"b", b"c"]  # lowering max_items drops nothing
    h.clock.advance(1000)
    assert q.flush_expired() == 0  # a new max_age does not touch queued items
    assert not q.add(b"d")
    h.reconfigure(max_items=0, discard_old_when_full=False)
    q.flush()
    assert not q.add(b"e")  # 0 means always full


def test_discard_with_max_items_zero_keeps_the_newest(store: Store) -> None:
    h = Harness(store, max_items=0, discard_old_when_full=True)
    assert h.q.add(b"a")
    assert h.q.add(b"b")
    assert datas(h.q) == [b"b"]


@pytest.mark.parametrize("mode", ["get", "open", "peek"])
def test_waiter_keeps_its_place_when_only_expired_items_arrive(h: Harness, mode: str) -> None:
    q = h.q
    first, second = Reader(mode), Reader(mode)
    q.wait(first)
    q.wait(second)
    q.add(b"dead on arrival", expiry=T0 - 1)
    assert (first.got, second.got, q.waiters) == ([], [], 2)
    q.add(b"live")
    assert first.got[0][1] == b"live"
    if mode != "peek":
        assert second.got == []
