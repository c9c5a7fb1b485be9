"""The beanstalkd job model (core/tubes/) on a manual clock: no sockets, no sleeps."""

from __future__ import annotations

import pytest

from tercel.clock import ManualClock
from tercel.core.reservations import ReservationTable
from tercel.core.tubes import (
    BURIED,
    DELAYED,
    READY,
    RESERVED,
    WAKE_DEADLINE_SOON,
    WAKE_JOB,
    WAKE_TIMED_OUT,
    Job,
    JobRecord,
    JobStore,
    Worker,
)


class Log:
    """Records what the store logs, as tuples."""

    current_file = 0

    def __init__(self) -> None:
        self.records: list[tuple[object, ...]] = []

    def put(  # noqa: PLR0917 (JobLog.put's signature)
        self,
        job_id: int,
        state: int,
        pri: int,
        delay: int,
        deadline_ms: int,
        tube: str,
        ttr: int,
        created_ms: int,
        body: bytes,
    ) -> int:
        self.records.append(("put", job_id, tube, pri, delay, state, deadline_ms))
        return 0

    def change(self, record: JobRecord) -> None:
        r = record
        self.records.append(("change", r.job_id, r.state, r.pri, r.deadline_ms))

    def delete(self, job_id: int) -> None:
        self.records.append(("delete", job_id))


class Client:
    def __init__(self, store: JobStore) -> None:
        self.woken: list[tuple[int | None, int]] = []
        self.worker: Worker = store.connect(self.wake)

    def wake(self, job: Job | None, why: int) -> None:
        self.woken.append((None if job is None else job.id, why))


T0 = 1_700_000_000_000
"""The manual clock's start, wall and monotonic (ms)."""


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def log() -> Log:
    return Log()


@pytest.fixture
def store(clock: ManualClock, log: Log) -> JobStore:
    return JobStore(clock, log)


def _put(store: JobStore, c: Client, pri: int = 100, delay: int = 0, ttr: int = 60) -> int:
    return store.put(c.worker, pri, delay, ttr, b"x").id


def _reserve(store: JobStore, c: Client, timeout: int = 0) -> int | None:
    job, _ = store.reserve(c.worker, timeout)
    return None if job is None else job.id


def test_ids_start_at_one_and_order_is_pri_then_id(store: JobStore) -> None:
    c = Client(store)
    ids = [_put(store, c, pri) for pri in (5, 1, 5, 1)]
    assert ids == [1, 2, 3, 4]
    assert [_reserve(store, c) for _ in range(4)] == [2, 4, 1, 3]
    assert _reserve(store, c) is None


def test_released_job_goes_back_to_its_original_place(store: JobStore) -> None:
    c = Client(store)
    for _ in range(3):
        _put(store, c)
    a, b, d = (_reserve(store, c) for _ in range(3))
    assert (a, b, d) == (1, 2, 3)
    for job_id in (3, 1, 2):  # released as c, a, b
        assert store.release(c.worker, job_id, 100, 0)
    assert [_reserve(store, c) for _ in range(3)] == [1, 2, 3]


def test_order_across_watched_tubes_and_pause(store: JobStore, clock: ManualClock) -> None:
    p, w = Client(store), Client(store)
    store.use(p.worker, "a")
    _put(store, p, pri=10)
    store.use(p.worker, "b")
    _put(store, p, pri=5)
    assert _reserve(store, w) is None  # watches default only
    assert store.watch(w.worker, "a") == 2
    assert store.watch(w.worker, "b") == 3
    assert store.pause("b", 1)
    assert _reserve(store, w) == 1
    assert _reserve(store, w) is None
    clock.advance(1000)
    store.tick()
    assert _reserve(store, w) == 2


def test_delayed_then_ready_with_absolute_deadline(
    store: JobStore, clock: ManualClock, log: Log
) -> None:
    c = Client(store)
    job_id = _put(store, c, delay=10)
    assert store.jobs[job_id].state == DELAYED
    assert log.records[-1][-1] == clock.now_ms() + 10_000
    assert store.time_left(store.jobs[job_id]) == 10
    assert store.peek_delayed(c.worker) is store.jobs[job_id]
    assert store.next_deadline() == clock.monotonic_ms() + 10_000
    clock.advance(9500)
    store.tick()
    assert _reserve(store, c) is None
    clock.advance(500)
    store.tick()
    assert store.jobs[job_id].state == READY
    assert _reserve(store, c) == job_id


def test_bury_fifo_and_kick_buried_first(store: JobStore, clock: ManualClock) -> None:
    c = Client(store)
    for _ in range(3):
        _put(store, c)
    delayed = _put(store, c, delay=100)
    got = [_reserve(store, c) for _ in range(3)]
    for job_id in (2, 1, 3):
        assert store.bury(c.worker, job_id, 7)
    assert got == [1, 2, 3]
    assert store.peek_buried(c.worker) is store.jobs[2]
    assert store.kick(c.worker, 2) == 2  # buried only, oldest first: 2, 1
    assert store.jobs[2].state == READY and store.jobs[1].state == READY
    assert store.jobs[3].state == BURIED
    assert store.kick(c.worker, 10) == 1
    assert store.jobs[delayed].state == DELAYED
    assert store.kick(c.worker, 10) == 1  # now the delayed one
    assert store.jobs[delayed].state == READY and store.jobs[delayed].kicks == 1
    assert store.jobs[2].pri == 7


def test_kick_job_and_reserve_job(store: JobStore) -> None:
    c = Client(store)
    a = _put(store, c, delay=50)
    b = _put(store, c)
    assert not store.kick_job(b)  # ready: not kickable
    assert store.kick_job(a)
    assert store.reserve_job(c.worker, a) is store.jobs[a]
    assert store.reserve_job(c.worker, a) is None  # already reserved
    other = Client(store)
    assert store.reserve_job(other.worker, 99) is None
    assert store.jobs[a].state == RESERVED


def test_ttr_expiry_and_touch(store: JobStore, clock: ManualClock) -> None:
    c = Client(store)
    job_id = _put(store, c, ttr=5)
    assert _reserve(store, c) == job_id
    clock.advance(3000)
    assert store.touch(c.worker, job_id)
    clock.advance(4000)
    store.tick()
    assert store.jobs[job_id].state == RESERVED  # touched: deadline moved to 8 s
    clock.advance(1000)
    store.tick()
    job = store.jobs[job_id]
    assert job.state == READY and job.timeouts == 1 and store.stats.job_timeouts == 1
    assert not store.touch(c.worker, job_id)


def test_a_reserved_job_is_a_reservation_of_the_shared_table(clock: ManualClock, log: Log) -> None:
    table = ReservationTable(deadline_clock=clock.monotonic_ms)
    store = JobStore(clock, log, table)
    c = Client(store)
    job_id = _put(store, c, ttr=5)
    assert _reserve(store, c) == job_id
    (res,) = table.of_owner(c.worker)  # owned by the worker, due at the TTR
    assert (res.xid, res.deadline, table.next_deadline()) == (job_id, T0 + 5000, T0 + 5000)
    assert store.next_deadline() is None  # the store's own timer has nothing: the table's has
    clock.jump(3_600_000)  # the system clock set an hour ahead moves no TTR
    assert table.expire() == 0 and store.jobs[job_id].state == RESERVED
    clock.advance(2000)
    assert store.touch(c.worker, job_id) and res.deadline == T0 + 7000  # touch: 5 s from now
    clock.advance(4000)
    assert table.expire() == 0
    clock.advance(1000)
    assert table.expire() == 1  # the table's timer, not tick(): a timeout all the same
    job = store.jobs[job_id]
    assert job.state == READY and job.timeouts == 1 and store.stats.job_timeouts == 1
    assert _reserve(store, c) == job_id
    assert store.release(c.worker, job_id, 1, 0) and len(table) == 0  # ended by the store
    assert _reserve(store, c) == job_id
    assert table.abort(table.of_owner(c.worker)) == 1  # returned on request: no timeout
    assert job.state == READY and job.reserver is None
    assert _reserve(store, c) == job_id
    store.disconnect(c.worker)  # the table's release_owner: ready, no timeout counted
    assert len(table) == 0 and job.state == READY and job.timeouts == 1
    d = Client(store)
    assert _reserve(store, d) == job_id
    assert table.confirm(table.of_owner(d.worker)) == 1  # confirmed: the job is done
    assert job_id not in store.jobs and store.stats.reserved == 0


def test_ttr_zero_is_one_second(store: JobStore) -> None:
    c = Client(store)
    assert store.put(c.worker, 0, 0, 0, b"x").ttr == 1


def test_deadline_soon_at_once_and_while_waiting(store: JobStore, clock: ManualClock) -> None:
    c = Client(store)
    job_id = _put(store, c, ttr=1)
    assert _reserve(store, c) == job_id
    assert store.reserve(c.worker, -1) == (None, WAKE_DEADLINE_SOON)
    other = _put(store, c)
    assert _reserve(store, c) == other  # a ready job is reserved despite the margin
    store.delete(c.worker, job_id)
    store.delete(c.worker, other)
    job_id = _put(store, c, ttr=3)
    assert _reserve(store, c) == job_id
    assert store.reserve(c.worker, -1) == (None, -1)  # waits
    clock.advance(1500)
    store.tick()
    assert c.woken == []
    clock.advance(500)  # 1 s before the deadline
    store.tick()
    assert c.woken == [(None, WAKE_DEADLINE_SOON)]


def test_reserve_with_timeout(store: JobStore, clock: ManualClock) -> None:
    c = Client(store)
    assert store.reserve(c.worker, 0) == (None, WAKE_TIMED_OUT)
    assert store.reserve(c.worker, 2) == (None, -1)
    assert store.stats.waiting == 1
    clock.advance(2000)
    store.tick()
    assert c.woken == [(None, WAKE_TIMED_OUT)]
    assert store.stats.waiting == 0


def test_waiters_are_served_oldest_first(store: JobStore) -> None:
    p = Client(store)
    waiters = [Client(store) for _ in range(3)]
    for w in waiters:
        assert store.reserve(w.worker, -1) == (None, -1)
    assert store.tubes["default"].waiting.keys() == {w.worker for w in waiters}
    for _ in range(3):
        _put(store, p)
    assert [w.woken for w in waiters] == [[(1, WAKE_JOB)], [(2, WAKE_JOB)], [(3, WAKE_JOB)]]


def test_disconnect_returns_reserved_jobs_at_once(store: JobStore) -> None:
    a, b = Client(store), Client(store)
    job_id = _put(store, a)
    assert _reserve(store, a) == job_id
    assert store.reserve(b.worker, -1) == (None, -1)
    assert not store.delete(b.worker, job_id)  # reserved by another
    store.disconnect(a.worker)
    assert b.woken == [(job_id, WAKE_JOB)]
    job = store.jobs[job_id]
    assert job.timeouts == 0 and job.reserves == 2 and job.reserver is b.worker


def test_disconnect_drops_the_wait(store: JobStore) -> None:
    a, p = Client(store), Client(store)
    assert store.reserve(a.worker, -1) == (None, -1)
    store.disconnect(a.worker)
    job_id = _put(store, p)
    assert a.woken == [] and store.jobs[job_id].state == READY


def test_tube_lifetime(store: JobStore) -> None:
    c = Client(store)
    store.use(c.worker, "t")
    job_id = _put(store, c)
    store.use(c.worker, "default")
    assert "t" in store.tubes
    assert store.delete(c.worker, job_id)
    assert "t" not in store.tubes
    assert store.watch(c.worker, "w") == 2
    assert store.ignore(c.worker, "w") == 1
    assert "w" not in store.tubes
    assert store.ignore(c.worker, "default") == -1
    assert store.ignore(c.worker, "nope") == 1
    assert not store.pause("nope", 1)
    store.disconnect(c.worker)
    assert list(store.tubes) == ["default"]


def test_what_is_logged(store: JobStore, log: Log, clock: ManualClock) -> None:
    c = Client(store)
    a = _put(store, c)
    assert _reserve(store, c) == a
    assert store.release(c.worker, a, 100, 0)  # same pri, no delay: not logged
    assert _reserve(store, c) == a
    assert store.bury(c.worker, a, 3)
    assert store.kick(c.worker, 1) == 1
    assert store.delete(c.worker, a)
    assert log.records == [
        ("put", 1, "default", 100, 0, READY, 0),
        ("change", 1, BURIED, 3, 0),
        ("change", 1, READY, 3, 0),
        ("delete", 1),
    ]


def test_restore_keeps_deadlines_ids_and_bury_order(clock: ManualClock) -> None:
    store = JobStore(clock)
    wall = clock.now_ms()
    store.restore(
        JobRecord(7, DELAYED, 1, 30, wall + 25_000, (0, 0, 0, 0, 0), "t", 60, wall - 5000, b"d")
    )
    store.restore(JobRecord(3, BURIED, 1, 0, 0, (1, 0, 0, 1, 0), "t", 60, wall, b"b3"))
    store.restore(JobRecord(2, BURIED, 1, 0, 0, (1, 0, 0, 1, 0), "t", 60, wall, b"b2"))
    store.restore(JobRecord(5, READY, 2, 0, 0, (0, 0, 0, 0, 0), "default", 60, wall, b"r"))
    c = Client(store)
    assert store.put(c.worker, 0, 0, 1, b"new").id == 8
    assert store.time_left(store.jobs[7]) == 25
    assert store.age(store.jobs[7]) == 5
    store.use(c.worker, "t")
    peeked = store.peek_buried(c.worker)
    assert peeked is not None and peeked.id == 3
    assert [j.id for j in store.snapshot()] == [7, 5, 8, 3, 2]


def test_pause_zero_unpauses_at_once(store: JobStore, clock: ManualClock) -> None:
    """``pause-tube <tube> 0`` ends a pause now (beanstalkd pauses for 1 ns): the next reserve
    gets the tube's jobs, and so does a worker already waiting on it."""
    p, w = Client(store), Client(store)
    _put(store, p)
    assert store.pause("default", 10)
    assert _reserve(store, w) is None
    assert store.pause("default", 0)
    assert _reserve(store, w, timeout=1) == 1
    assert (store.tubes["default"].pause, store.pause_left(store.tubes["default"])) == (0, 0)
    assert store.tubes["default"].cmd_pause == 2
    assert store.pause("default", 10)
    _put(store, p)
    assert store.reserve(w.worker, 5) == (None, -1)
    assert store.pause("default", 0)
    assert w.woken == [(2, WAKE_JOB)]


def test_a_delay_ending_with_a_wait_timeout_hands_the_job_over(
    store: JobStore, clock: ManualClock
) -> None:
    """A delayed job whose delay ends in the same timer pass as a waiting reserve's timeout
    goes to the waiter, as in beanstalkd (the pass promotes delayed jobs and unpauses tubes
    before it times out waits): release with delay 2, ``reserve-with-timeout 1`` twice."""
    c = Client(store)
    job_id = _put(store, c)
    assert _reserve(store, c) == job_id
    assert store.release(c.worker, job_id, 100, 2)
    assert store.reserve(c.worker, 1) == (None, -1)
    clock.advance(1000)
    store.tick()
    assert c.woken == [(None, WAKE_TIMED_OUT)]
    assert store.reserve(c.worker, 1) == (None, -1)
    clock.advance(1000)  # the delay and the wait end at the same millisecond
    store.tick()
    assert c.woken[1:] == [(job_id, WAKE_JOB)]
    clock.advance(1000)
    store.tick()
    assert store.jobs[job_id].reserver is c.worker and store.stats.waiting == 0


def test_an_unpause_with_a_wait_timeout_hands_the_job_over(
    store: JobStore, clock: ManualClock
) -> None:
    """The same for a pause that ends in the pass where the wait times out."""
    c = Client(store)
    _put(store, c)
    assert store.pause("default", 1)
    assert store.reserve(c.worker, 1) == (None, -1)
    clock.advance(1000)
    store.tick()
    assert c.woken == [(1, WAKE_JOB)]


def test_the_table_must_share_the_store_clock(clock: ManualClock) -> None:
    """TTR deadlines are written by the store and enforced by the table: one clock."""
    with pytest.raises(ValueError, match="clock"):
        JobStore(clock, None, ReservationTable(deadline_clock=ManualClock(T0).monotonic_ms))
