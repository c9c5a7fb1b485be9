"""Session: open reads per queue, limits, blocked reads, and what ending a session undoes."""

from __future__ import annotations

import pytest

from tercel.clock import ManualClock
from tercel.config import parse_config
from tercel.core.collection import QueueCollection
from tercel.core.queue import PersistentQueue, QItem
from tercel.errors import BadQueueName, OpenReadError
from tercel.journal import MemoryJournal
from tercel.session import READ_GET, READ_OPEN, READ_PEEK, Session

T0 = 1_700_000_000_000


class World:
    def __init__(self, max_open_reads: int = 10) -> None:
        self.clock = ManualClock(T0)
        config = parse_config({"aliases": {"al": ["a"]}})
        self.qc = QueueCollection(config, lambda name, cfg: MemoryJournal(), self.clock)
        self.max_open_reads = max_open_reads
        self.s = self.session()

    def session(self) -> Session:
        return Session(self.qc, self.max_open_reads)

    def fill(self, name: str, *datas: bytes) -> PersistentQueue:
        for data in datas:
            self.qc.add(name, data, None, T0)
        return self.qc.get_or_create(name)

    def open(self, name: str, s: Session | None = None) -> tuple[int, bytes]:
        got = (s or self.s).fetch(name, READ_OPEN, self.clock.now_ms())
        assert got is not None
        return got[0], got[1].data


def items(q: PersistentQueue) -> list[bytes]:
    return [i.data for i in q.items_in_memory()]


@pytest.fixture
def w() -> World:
    return World()


# ---- reads ---------------------------------------------------------------------------------


def test_plain_get_peek_and_empty(w: World) -> None:
    q = w.fill("a", b"1", b"2")
    assert w.s.fetch("a", READ_PEEK, T0) == (0, q.peek(T0))
    got = w.s.fetch("a", READ_GET, T0)
    assert got is not None and got[0] == 0 and got[1].data == b"1"
    assert items(q) == [b"2"]
    w.s.fetch("a", READ_GET, T0)
    assert w.s.fetch("a", READ_GET, T0) is None
    assert w.s.fetch("a", READ_PEEK, T0) is None
    assert (w.qc.stats.cmd_get, w.qc.stats.cmd_peek) == (3, 2)


def test_get_creates_the_queue(w: World) -> None:
    assert w.s.fetch("new", READ_GET, T0) is None
    assert w.qc.queue("new") is not None


def test_bad_name(w: World) -> None:
    with pytest.raises(BadQueueName):
        w.s.fetch("../x", READ_GET, T0)


def test_alias_reads_are_empty(w: World) -> None:
    w.qc.add("al", b"x", None, T0)
    assert w.s.fetch("al", READ_GET, T0) is None
    assert w.s.fetch("al", READ_OPEN, T0) is None
    assert w.s.wait("al", READ_GET, lambda xid, item: None) is None
    assert items(w.qc.get_or_create("a")) == [b"x"]


def test_reads_count_hits_and_callers_count_misses(w: World) -> None:
    w.qc.add("a", b"x", None, T0)
    w.qc.add("a", b"y", None, T0)
    assert w.s.take("a", T0) is not None
    assert w.s.fetch("a", READ_PEEK, T0) is not None
    assert w.s.fetch("a", READ_GET, T0) is not None
    assert w.s.take("a", T0) is None  # a miss is the caller's to count (it may block)
    w.s.count_miss()
    assert (w.qc.stats.get_hits, w.qc.stats.get_misses) == (3, 1)
    assert (w.qc.stats.cmd_get, w.qc.stats.cmd_peek) == (3, 1)


# ---- open reads ----------------------------------------------------------------------------


def test_open_reads_are_fifo_per_queue(w: World) -> None:
    a = w.fill("a", b"a1", b"a2", b"a3")
    b = w.fill("b", b"b1")
    assert w.open("a")[1] == b"a1"
    assert w.open("b")[1] == b"b1"
    assert w.open("a")[1] == b"a2"
    assert (w.s.open_count("a"), w.s.open_count("b"), w.s.open_count("c")) == (2, 1, 0)
    assert w.s.confirm_oldest("a")  # a1 is gone for good
    assert w.s.abort_oldest("a")  # a2 goes back to the head
    assert items(a) == [b"a2", b"a3"]
    assert (a.open_reads, w.s.open_count("a")) == (0, 0)
    assert not w.s.confirm_oldest("a")
    assert not w.s.abort_oldest("a")
    assert w.s.abort_oldest("b")
    assert items(b) == [b"b1"]


def test_confirm_all(w: World) -> None:
    a = w.fill("a", b"1", b"2", b"3")
    w.open("a")
    w.open("a")
    assert w.s.confirm_all("a") == 2
    assert w.s.confirm_all("a") == 0
    assert (items(a), a.open_reads) == ([b"3"], 0)


def test_max_open_reads_per_queue() -> None:
    w = World(max_open_reads=2)
    w.fill("a", b"1", b"2", b"3")
    w.fill("b", b"x")
    w.open("a")
    w.open("a")
    with pytest.raises(OpenReadError):
        w.s.fetch("a", READ_OPEN, T0)
    w.open("b")  # the limit is per queue
    w.s.confirm_oldest("a")
    w.open("a")


def test_plain_get_while_open_is_refused(w: World) -> None:
    a = w.fill("a", b"1", b"2")
    w.fill("b", b"x")
    w.open("a")
    with pytest.raises(OpenReadError):
        w.s.fetch("a", READ_GET, T0)
    assert items(a) == [b"2"]
    assert w.s.fetch("a", READ_PEEK, T0) is not None  # peeking is allowed
    assert w.s.fetch("b", READ_GET, T0) is not None  # so is another queue
    assert w.open("a")[1] == b"2"  # and another open read


def test_open_reads_belong_to_their_session(w: World) -> None:
    a = w.fill("a", b"1", b"2")
    other = w.session()
    w.open("a")
    assert other.fetch("a", READ_GET, T0) is not None  # only this session is restricted
    assert not other.confirm_oldest("a")
    other.close()
    assert a.open_reads == 1


def test_close_aborts_everything_in_original_order(w: World) -> None:
    a = w.fill("a", b"a1", b"a2", b"a3", b"a4")
    b = w.fill("b", b"b1", b"b2")
    w.open("a")
    w.open("b")
    w.open("a")
    w.open("a")
    w.s.confirm_oldest("a")  # a1 is done
    w.s.close()
    assert items(a) == [b"a2", b"a3", b"a4"]
    assert items(b) == [b"b1", b"b2"]
    assert (a.open_reads, b.open_reads) == (0, 0)
    assert w.s.open_count("a") == 0
    w.s.close()  # twice is harmless


def test_a_deleted_queue_open_read_is_gone(w: World) -> None:
    w.fill("a", b"old")
    w.open("a")
    assert w.qc.delete("a")
    fresh = w.fill("a", b"new")
    assert not w.s.abort_oldest("a")  # the old read cannot touch the new queue
    assert items(fresh) == [b"new"]
    w.s.close()
    assert (items(fresh), fresh.open_reads) == ([b"new"], 0)


def test_a_deleted_queue_open_read_does_not_block_reads(w: World) -> None:
    w.fill("a", b"old")
    w.open("a")
    w.qc.delete("a")
    fresh = w.fill("a", b"new1", b"new2")
    assert w.s.open_count("a") == 0
    got = w.s.fetch("a", READ_GET, T0)  # no open read is held on the new queue
    assert got is not None and got[1].data == b"new1"
    assert w.open("a")[1] == b"new2"
    w.s.close()
    assert items(fresh) == [b"new2"]


# ---- blocked reads -------------------------------------------------------------------------


class Calls:
    def __init__(self) -> None:
        self.got: list[tuple[int, bytes | None]] = []

    def __call__(self, xid: int, item: QItem | None) -> None:
        self.got.append((xid, None if item is None else item.data))


def test_blocked_open_read_is_delivered_and_recorded(w: World) -> None:
    calls = Calls()
    pending = w.s.wait("a", READ_OPEN, calls)
    assert pending is not None and w.s.pending is pending
    a = w.qc.get_or_create("a")
    assert a.waiters == 1
    w.qc.add("a", b"1", None, T0)
    assert calls.got == [(1, b"1")]
    assert w.s.pending is None
    assert w.s.open_count("a") == 1
    assert w.qc.stats.get_hits == 1
    assert w.s.confirm_oldest("a")


def test_blocked_get_and_peek(w: World) -> None:
    getter, peeker = Calls(), Calls()
    other = w.session()
    other.wait("a", READ_PEEK, peeker)
    w.s.wait("a", READ_GET, getter)
    w.qc.add("a", b"1", None, T0)
    assert peeker.got == [(0, b"1")]
    assert getter.got == [(0, b"1")]
    assert w.s.open_count("a") == 0


def test_blocked_read_timeout(w: World) -> None:
    calls = Calls()
    pending = w.s.wait("a", READ_GET, calls)
    assert pending is not None
    pending.timeout()
    assert calls.got == [(0, None)]
    assert w.s.pending is None
    assert w.qc.stats.get_misses == 1
    w.qc.add("a", b"1", None, T0)
    assert calls.got == [(0, None)]
    assert items(w.qc.get_or_create("a")) == [b"1"]


def test_close_cancels_a_blocked_read(w: World) -> None:
    calls = Calls()
    w.s.wait("a", READ_OPEN, calls)
    w.s.close()
    assert w.s.pending is None
    w.qc.add("a", b"1", None, T0)
    assert calls.got == []
    assert items(w.qc.get_or_create("a")) == [b"1"]


def test_open_on_an_empty_queue_records_nothing(w: World) -> None:
    assert w.s.fetch("a", READ_OPEN, T0) is None
    assert w.s.open_count("a") == 0
    w.fill("a", b"1")
    assert w.s.fetch("a", READ_GET, T0) is not None  # no open read is held


def test_cancel_after_a_new_wait_leaves_the_new_one(w: World) -> None:
    first = w.s.wait("a", READ_GET, Calls())
    assert first is not None
    first.cancel()
    second = w.s.wait("a", READ_GET, Calls())
    first.cancel()  # a stale handle must not forget the session's current wait
    assert w.s.pending is second
    assert w.qc.get_or_create("a").waiters == 1


@pytest.mark.parametrize("limit", [None, 2])
def test_dead_lettering_into_the_queue_s_own_parent_moves_the_item_once(
    limit: int | None,
) -> None:
    """``a+b`` dead-letters into ``a``, its fanout parent: the copy fans back into ``a+b``
    while blocked readers wait there (a review found the item stored twice, or, with
    ``max_items``, an IndexError that closed the connection)."""
    clock = ManualClock(T0)
    child: dict[str, object] = {"max_deliveries": 1, "dead_letter_queue": "a"}
    if limit is not None:
        child["max_items"] = limit
    config = parse_config({"queues": {"a+b": child}})
    qc = QueueCollection(config, lambda name, cfg: MemoryJournal(), clock)
    qc.get_or_create("a+b")  # the child exists, so adds to a fan out to it
    qc.add("a+b", b"X", None, T0)
    reader = Session(qc, 10)
    got = reader.fetch("a+b", READ_OPEN, T0)
    assert got is not None
    delivered: list[bytes] = []
    waiters = [Session(qc, 10) for _ in range(2)]
    for s in waiters:
        assert s.wait("a+b", READ_OPEN, lambda xid, item: delivered.append(item.data)) is not None
    assert reader.abort_oldest("a+b")  # X is back at the head, past max_deliveries
    assert items(qc.get_or_create("a")) == [b"X"]  # dead-lettered once
    assert len(delivered) <= 1
