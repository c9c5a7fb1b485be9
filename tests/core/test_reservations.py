"""The reservation model: one table for open reads, leases, auto-abort reads and TTR reservations.

Each case is a combination of owner (returned when it ends) and deadline (returned when it
passes); all are journaled as OPEN/CONFIRM/ABORT, so a restart returns every one of them.
"""

from __future__ import annotations

import pytest

from tercel.clock import ManualClock
from tercel.config import QueueConfig, parse_config
from tercel.core.collection import QueueCollection
from tercel.core.queue import PersistentQueue
from tercel.core.reservations import ReservationTable
from tercel.errors import TooManyLeases
from tercel.journal import MemoryJournal
from tercel.session import READ_OPEN, Session

T0 = 1_700_000_000_000


class World:
    """A collection on RAM journals that survive a "restart" (a new collection, replayed)."""

    def __init__(self, doc: dict[str, object] | None = None) -> None:
        self.doc = doc or {}
        self.journals: dict[str, MemoryJournal] = {}
        self.clock = ManualClock(T0)
        self.start()

    def _log(self, name: str, config: QueueConfig) -> MemoryJournal:
        return self.journals.setdefault(name, MemoryJournal())

    def start(self) -> None:
        self.qc = QueueCollection(parse_config(self.doc), self._log, self.clock)
        self.qc.load(sorted(self.journals))
        self.table = ReservationTable(deadline_clock=self.clock.monotonic_ms)

    def restart(self) -> None:
        """A crash: the old objects are dropped without closing anything."""
        self.start()

    def fill(self, name: str, *datas: bytes) -> PersistentQueue:
        for data in datas:
            self.qc.add(name, data, None, T0)
        return self.qc.get_or_create(name)

    def drain(self, name: str) -> list[bytes]:
        q = self.qc.get_or_create(name)
        out = []
        while (item := q.remove(T0)) is not None:
            out.append(item.data)
        return out


@pytest.fixture
def w() -> World:
    return World()


def test_an_owned_reservation_returns_when_its_owner_ends(w: World) -> None:
    q = w.fill("a", b"1", b"2", b"3")
    conn, other = object(), object()
    r1 = w.table.take(q, T0, owner=conn)
    r2 = w.table.take(q, T0, owner=other)
    r3 = w.table.take(q, T0, owner=conn)
    assert r1 and r2 and r3
    assert [r.item.data for r in w.table.of_owner(conn)] == [b"1", b"3"]
    assert w.table.release_owner(conn) == 2
    assert w.table.of_owner(conn) == []
    assert w.table.get(r2.id) is r2
    assert w.drain("a") == [b"1", b"3"]  # back at the head, in their order
    assert w.table.confirm([r2]) == 1
    assert (q.open_reads, len(w.table)) == (0, 0)


def test_a_deadline_returns_the_item_when_it_passes_and_extend_moves_it(w: World) -> None:
    q = w.fill("a", b"1", b"2")
    conn = object()
    r1 = w.table.take(q, T0, owner=conn, ttl_ms=100)  # beanstalkd: owned, with a TTR
    r2 = w.table.take(q, T0, ttl_ms=200)  # a lease: no owner
    assert r1 and r2
    assert w.table.next_deadline() == T0 + 100
    w.clock.advance(50)
    assert w.table.extend([r1], 500) == 1  # touch
    assert w.table.next_deadline() == T0 + 200
    assert w.table.expire(T0 + 200) == 1
    assert w.table.get(r2.id) is None and w.table.get(r1.id) is r1
    assert w.table.expire(T0 + 550) == 1
    assert w.table.expired == 2
    assert w.table.release_owner(conn) == 0  # already returned
    assert w.drain("a") == [b"1", b"2"]


def test_a_lease_batch_shares_one_deadline_until_its_leases_end_or_move(w: World) -> None:
    q = w.fill("a", *(b"%d" % i for i in range(6)))
    batch = w.table.take_leases(q, 4, 100, T0)
    later = w.table.take_leases(q, 2, 300, T0)
    assert w.table.next_deadline() == T0 + 100
    assert w.table.confirm(batch[:3]) == 3
    assert w.table.next_deadline() == T0 + 100  # one lease of the batch is still open
    assert w.table.extend(batch[3:], 500) == 1  # moved: its old entry is stale now
    assert w.table.next_deadline() == T0 + 300
    assert w.table.expire(T0 + 299) == 0
    assert w.table.expire(T0 + 300) == 2
    assert [r.id for r in later if w.table.get(r.id)] == []
    assert w.table.next_deadline() == T0 + 500
    assert w.table.confirm(batch[3:]) == 1
    assert w.table.next_deadline() is None
    assert w.table.expire(T0 + 10_000) == 0
    assert w.drain("a") == [b"4", b"5"]  # the expired ones, back at the head in order


def test_deadlines_out_of_time_order_expire_in_deadline_order(w: World) -> None:
    """Deadlines set in time order (one TTR) take the table's FIFO; an earlier one set after a
    later one (a shorter TTR) its heap: the two together still give the earliest deadline, and
    expire returns exactly the reservations due."""
    q = w.fill("a", *(b"%d" % i for i in range(5)))
    conn = object()
    ttls = [300, 100, 400, 200, 100]  # 100 after 300: out of order
    res = [w.table.take(q, T0, owner=conn, ttl_ms=t) for t in ttls]
    assert all(res)
    assert w.table.next_deadline() == T0 + 100
    assert w.table.expire(T0 + 100) == 2
    assert w.table.next_deadline() == T0 + 200
    assert w.table.forget([r for r in res if r and r.deadline == T0 + 200]) is None
    assert w.table.next_deadline() == T0 + 300
    assert w.table.expire(T0 + 399) == 1
    assert w.table.next_deadline() == T0 + 400
    assert w.table.expire(T0 + 400) == 1
    assert w.table.next_deadline() is None
    assert w.drain("a") == [b"0", b"1", b"2", b"4"]
    w.fill("a", b"5", b"6")
    late = w.table.take(q, T0, owner=conn, ttl_ms=1000)
    early = w.table.take(q, T0, owner=conn, ttl_ms=600)
    assert late and early and w.table.next_deadline() == T0 + 600
    assert w.table.expire(T0 + 600) == 1 and w.table.next_deadline() == T0 + 1000


def test_reserve_and_end_one_at_a_time_keeps_the_next_deadline_exact(w: World) -> None:
    """A worker that reserves and deletes one job at a time under one TTR leaves nothing
    behind in the deadline structures once the timer looks (``next_deadline``)."""
    q = w.fill("a", *(b"%d" % i for i in range(3000)))
    conn = object()
    for _ in range(3000):
        r = w.table.take(q, T0, owner=conn, ttl_ms=1000)
        assert r is not None and w.table.next_deadline() == w.clock.monotonic_ms() + 1000
        assert w.table.confirm([r]) == 1
        w.clock.advance(1)
    assert w.table.next_deadline() is None
    assert w.table.expire(w.clock.monotonic_ms() + 10_000) == 0


def test_ids_address_reservations_from_anywhere_and_only_of_the_named_queue(w: World) -> None:
    qa, qb = w.fill("a", b"x"), w.fill("b", b"y")
    ra = w.table.take(qa, T0, owner=object(), ttl_ms=1000)  # Thrift: owned, auto-abort
    rb = w.table.take(qb, T0)
    assert ra and rb
    assert w.table.find(qb, [ra.id, rb.id, 12345]) == [rb]
    assert w.table.find(None, [ra.id, ra.id]) == [ra]  # by id alone, each once
    assert w.table.confirm(w.table.find(None, [ra.id])) == 1  # confirmed by anyone
    assert w.table.confirm([ra]) == 0  # not twice
    assert w.table.next_deadline() is None


def test_ids_are_unique_to_the_table_and_lease_ids_round_trip() -> None:
    one, two = ReservationTable("0000abcd"), ReservationTable("0000abce")
    w = World()
    q = w.fill("a", b"1", b"2")
    r1 = one.take(q, T0)
    r2 = two.take(q, T0)
    assert r1 and r2 and r1.id != r2.id
    text = one.lease_id(r1)
    assert text == "0000abcd-1"
    assert one.parse_lease_id(text) == r1.id
    assert two.parse_lease_id(text) == -1
    assert one.parse_lease_id("0000abcd-zz") == -1


def test_leases_are_bounded_per_queue_owned_reservations_are_not() -> None:
    w = World({"queues": {"max_open_leases": 2}})
    q = w.fill("a", *(b"%d" % i for i in range(5)))
    assert len(w.table.take_leases(q, 5, 1000, T0)) == 2
    with pytest.raises(TooManyLeases):
        w.table.take_leases(q, 1, 1000, T0)
    assert w.table.take(q, T0, owner=object()) is not None  # an open read is not a lease
    assert w.table.room(q) == 0 and w.table.open_count(q) == 2


def test_a_restart_returns_every_kind_of_reservation(w: World) -> None:
    q = w.fill("a", b"1", b"2", b"3", b"4", b"5")
    session = Session(w.qc, 10, w.table)
    got = session.fetch("a", READ_OPEN, T0)  # a Kestrel open read
    assert got is not None
    assert w.table.take(q, T0, ttl_ms=1000)  # a lease
    assert w.table.take(q, T0, owner=object(), ttl_ms=1000)  # a TTR reservation
    assert w.table.take(q, T0, owner=object())  # an owned read
    confirmed = w.table.take(q, T0)
    assert confirmed is not None and w.table.confirm([confirmed]) == 1
    w.restart()
    assert w.drain("a") == [b"1", b"2", b"3", b"4"]


def test_a_session_holds_its_open_reads_in_the_table(w: World) -> None:
    w.fill("a", b"1", b"2")
    session = Session(w.qc, 10, w.table)
    assert session.fetch("a", READ_OPEN, T0) is not None
    assert session.fetch("a", READ_OPEN, T0) is not None
    assert [r.item.data for r in w.table.of_owner(session)] == [b"1", b"2"]
    assert session.confirm_oldest("a")
    assert [r.item.data for r in w.table.of_owner(session)] == [b"2"]
    session.close()
    assert len(w.table) == 0
    assert w.drain("a") == [b"2"]


def test_reads_on_a_deleted_queue_are_forgotten_not_returned(w: World) -> None:
    w.fill("a", b"1")
    session = Session(w.qc, 10, w.table)
    assert session.fetch("a", READ_OPEN, T0) is not None
    w.qc.delete("a")
    assert session.open_count("a") == 0
    session.close()
    assert len(w.table) == 0


def test_deadlines_run_on_the_monotonic_clock_a_wall_clock_jump_moves_none(w: World) -> None:
    q = w.fill("a", b"1", b"2", b"3")
    lease = w.table.take_leases(q, 1, 1000, T0)[0]
    ttr = w.table.take(q, T0, owner=object(), ttl_ms=2000)
    assert ttr is not None
    w.clock.jump(3_600_000)  # the system clock set an hour ahead
    assert w.table.expire() == 0  # nothing is due: no time passed
    w.clock.jump(-7_200_000)  # and then an hour behind where it was
    w.clock.advance(1000)
    assert w.table.expire() == 1  # the lease's 1000 ms passed, whatever the wall clock says
    assert w.table.get(lease.id) is None and w.table.get(ttr.id) is ttr
    assert w.table.next_deadline() == w.clock.monotonic_ms() + 1000
    w.clock.advance(1000)
    assert w.table.expire() == 1
    assert w.drain("a") == [b"1", b"2", b"3"]
