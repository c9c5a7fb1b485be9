"""beanstalkd's job model: tubes, priorities, delays, TTR reservations, bury and kick.

Contract. :class:`JobStore` holds every job in memory (as beanstalkd does) and applies the
semantics of beanstalkd 1.12, independent of any wire format:

- Job ids are global, start at 1, are never reused and continue after a restart (replay
  raises the counter past every id it saw).
- A worker (:class:`Worker`, one per connection) reserves the ready job with the smallest
  ``(priority, id)`` across its watched, non-paused tubes. Ties go by id, so a released old
  job goes back to its original place, before newer jobs of the same priority.
- Delayed jobs carry an absolute deadline; buried jobs form a FIFO per tube; ``kick`` kicks
  buried jobs if there are any, else delayed ones; ``kick_job`` either.
- A reserved job is a reservation of the server's one
  :class:`~tercel.core.reservations.ReservationTable` (the store is its
  :class:`~tercel.core.source.ReservationSource`), owned by the worker, with the TTR as its
  deadline; when the deadline passes the table returns it and the job is ready again
  (``timeouts``). ``reserve`` answers DEADLINE_SOON when the worker holds a job within
  :data:`SAFETY_MARGIN` of its deadline and nothing is ready; a worker already waiting is woken
  with it. ``touch`` extends the reservation.
- Waiting workers are served oldest first. :meth:`JobStore.disconnect` returns every job the
  worker holds to ready at once (the table's ``release_owner``: no timeout counted) and drops
  its wait.
- A tube lives while a job, a user, a watcher or a waiter refers to it; ``default`` always.

Time: every method reads :class:`TubeClock` once. Timers run on the monotonic clock
(``monotonic()``, seconds); the deadlines given to the log are wall-clock epoch milliseconds,
converted on the way in and out, so a delayed job keeps its deadline across a restart. The
reservation table's ``deadline_clock`` must be the same monotonic clock, in milliseconds (TTR
deadlines are the table's). Nothing here sleeps: the server asks
:meth:`JobStore.next_deadline` (delays, waits, pauses), arms one timer, and calls
:meth:`JobStore.tick` when it fires; TTR deadlines are on the table's own timer (``tick``
returns those due too).

Durability: every change that must survive a restart is handed to the :class:`JobLog` before
the method returns (put, delete, bury, kick, a release with a delay or a new priority, the
promotion of a delayed job is not logged: replay uses its absolute deadline). Reservations
and touches are not logged: after a restart a reserved job is ready again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from heapq import heappop, heappush
from typing import Final, Protocol

from librt.time import time as wall_time
from mypy_extensions import mypyc_attr

from tercel.core.reservations import NO_ITEM, Reservation, ReservationTable
from tercel.core.source import RETURN_EXPIRED, ReservationSource

READY: Final = 1
DELAYED: Final = 2
BURIED: Final = 3
RESERVED: Final = 4
STATE_NAMES: Final[dict[int, str]] = {
    READY: "ready",
    DELAYED: "delayed",
    BURIED: "buried",
    RESERVED: "reserved",
}
COMPACT_EVERY: Final = 256
"""Log writes between two checks of whether the log should be compacted."""
COMPACT_RATIO: Final = 3
"""Compact when the log is this many times the live jobs' size (beanstalkd's ``walcompact``
keeps garbage below twice the live data, the same bound)."""
JOB_OVERHEAD: Final = 64
"""Bytes a job's record takes beyond its body and tube name (for the compaction policy)."""
SAFETY_MARGIN: Final = 1.0
"""Seconds before a TTR deadline in which ``reserve`` answers DEADLINE_SOON."""
URGENT: Final = 1024
"""Jobs with a priority below this count as urgent (``current-jobs-urgent``)."""
DEFAULT_TUBE: Final = "default"

WAKE_JOB: Final = 0
WAKE_TIMED_OUT: Final = 1
WAKE_DEADLINE_SOON: Final = 2

Counters = tuple[int, int, int, int, int]
"""reserves, timeouts, releases, buries, kicks."""


class TubeClock(Protocol):
    """The two clocks the store reads."""

    def monotonic(self) -> float:
        """Seconds on a clock that never jumps."""
        ...

    def now_ms(self) -> int:
        """Wall-clock epoch milliseconds (for deadlines that outlive the process)."""
        ...


_monotonic: Final = time.monotonic
"""Bound once (compiled, ``time.monotonic`` looks the attribute up on every call: ~0.5k)."""


@mypyc_attr(allow_interpreted_subclasses=True)
class NativeTubeClock:
    """The system's clocks as a compiled class: what the store calls (``time.monotonic``, and
    the wall clock through librt's native ``time()``). Its calls from the store are native;
    a :class:`TubeClock` that is not one (a test's fake clock) is wrapped in
    :class:`ProtocolClock`. (Holding ``time.monotonic`` and a function for the wall clock as
    attributes cost a Python call each, the wall clock's ~0.7k with its ``time_ns()``.)"""

    def monotonic(self) -> float:
        return _monotonic()

    def now_ms(self) -> int:
        return int(wall_time() * 1000.0)


class ProtocolClock(NativeTubeClock):
    """Any :class:`TubeClock`, called through the protocol."""

    def __init__(self, clock: TubeClock) -> None:
        self.clock = clock

    def monotonic(self) -> float:
        return self.clock.monotonic()

    def now_ms(self) -> int:
        return self.clock.now_ms()


@dataclass(slots=True, init=False)
class JobRecord:
    """A job as the log keeps it. ``deadline_ms`` is the wall-clock ready time of a delayed
    job (0 otherwise); ``state`` is READY, DELAYED or BURIED (a reserved job is written as
    READY). A *change* record leaves ``tube``, ``ttr``, ``created_ms`` and ``body`` unset."""

    job_id: int
    state: int
    pri: int
    delay: int
    deadline_ms: int
    counters: Counters
    tube: str
    ttr: int
    created_ms: int
    body: bytes
    file: int
    """Restored jobs: the number of the log file their JOB record was read from."""

    # Written out: a dataclass-made __init__ runs interpreted even in the compiled build.
    def __init__(  # noqa: PLR0917 (the dataclass's positional fields)
        self,
        job_id: int,
        state: int,
        pri: int,
        delay: int,
        deadline_ms: int,
        counters: Counters,
        tube: str = "",
        ttr: int = 0,
        created_ms: int = 0,
        body: bytes = b"",
        file: int = 0,
    ) -> None:
        self.job_id = job_id
        self.state = state
        self.pri = pri
        self.delay = delay
        self.deadline_ms = deadline_ms
        self.counters = counters
        self.tube = tube
        self.ttr = ttr
        self.created_ms = created_ms
        self.body = body
        self.file = file


class JobLog(Protocol):
    """Where the store records what must survive a restart (see the module docstring)."""

    def put(  # noqa: PLR0917 (called for every put: no record object, no keywords)
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
        """A new job (its counters are all 0); the number of the file its record lands in
        (:attr:`current_file`). Fields, not a :class:`JobRecord`: this runs for every put,
        and the record would be built only to be taken apart."""
        ...

    def change(self, record: JobRecord) -> None:
        """A job's new state, priority, delay or deadline (and counters)."""
        ...

    def delete(self, job_id: int) -> None: ...

    @property
    def current_file(self) -> int:
        """The number of the file a record logged now lands in (0: not journaled)."""
        ...

    @property
    def size(self) -> int:
        """Bytes the log occupies."""
        ...

    @property
    def compact_floor(self) -> int:
        """Below this size the log is never compacted."""
        ...

    def compact(self, next_id: int, jobs: Iterable[JobRecord]) -> int | None:
        """Replace the log's history by these jobs (the whole state now); the number of the
        file that holds their records now, or None when the log put the compaction off
        (nothing changed: out of descriptors) and is to be asked again later."""
        ...


@mypyc_attr(allow_interpreted_subclasses=True)
class NativeJobLog:
    """A :class:`JobLog` as a compiled class: what the store calls. This one logs nothing
    (``tercel beanstalkd`` without ``-b``); a subclass logs. A compiled subclass gets native
    calls from the store with unboxed arguments (the server's adapter of its job journal), where
    a call through the :class:`JobLog` protocol looks the method up and boxes every field
    (~1k instructions per put); any other :class:`JobLog` is wrapped in :class:`ProtocolLog`."""

    def put(  # noqa: PLR0917 (called for every put: no record object, no keywords)
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
        return 0

    def change(self, record: JobRecord) -> None:
        pass

    def delete(self, job_id: int) -> None:
        pass

    @property
    def size(self) -> int:
        return 0

    @property
    def compact_floor(self) -> int:
        return 0

    @property
    def current_file(self) -> int:
        return 0

    def compact(self, next_id: int, jobs: Iterable[JobRecord]) -> int | None:
        return 0


class ProtocolLog(NativeJobLog):
    """Any :class:`JobLog` (one not compiled: a test's recorder), called through the protocol."""

    def __init__(self, log: JobLog) -> None:
        self.log = log

    def put(  # noqa: PLR0917 (as JobLog.put)
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
        return self.log.put(job_id, state, pri, delay, deadline_ms, tube, ttr, created_ms, body)

    def change(self, record: JobRecord) -> None:
        self.log.change(record)

    def delete(self, job_id: int) -> None:
        self.log.delete(job_id)

    @property
    def size(self) -> int:
        return self.log.size

    @property
    def compact_floor(self) -> int:
        return self.log.compact_floor

    @property
    def current_file(self) -> int:
        return self.log.current_file

    def compact(self, next_id: int, jobs: Iterable[JobRecord]) -> int | None:
        return self.log.compact(next_id, jobs)


@mypyc_attr(acyclic=True)
class Job:
    """One job. ``deadline`` is monotonic: the ready time of a delayed job; a reserved one has
    its reservation (``res``), whose deadline is the TTR's. ``gen`` changes whenever the job
    moves, so stale heap entries and timers are recognised and skipped. ``file``: the number
    of the log file holding its JOB record (``stats-job``'s ``file``; 0 when not journaled).

    Compiled, jobs stay out of the cyclic garbage collector (``acyclic``, as the queues'
    ``QItem``): with a million jobs in memory every full collection would visit each one, and
    a job's cycles (through its tube's buried FIFO, its reserver's held jobs, its reservation)
    are always broken by the store itself when the job moves or goes."""

    __slots__ = (
        "body",
        "buries",
        "created",
        "deadline",
        "delay",
        "file",
        "gen",
        "id",
        "kicks",
        "pri",
        "releases",
        "res",
        "reserver",
        "reserves",
        "state",
        "timeouts",
        "ttr",
        "tube",
    )

    def __init__(
        self, job_id: int, tube: Tube, pri: int, delay: int, ttr: int, *, body: bytes, now: float
    ) -> None:
        self.id = job_id
        self.tube = tube
        self.pri = pri
        self.delay = delay
        self.ttr = ttr
        self.body = body
        self.created = now
        self.deadline = 0.0
        self.state = READY
        self.gen = 0
        self.file = 0
        self.reserver: Worker | None = None
        self.res: Reservation | None = None
        self.reserves = 0
        self.timeouts = 0
        self.releases = 0
        self.buries = 0
        self.kicks = 0

    @property
    def counters(self) -> Counters:
        return (self.reserves, self.timeouts, self.releases, self.buries, self.kicks)


def ready_key(pri: int, job_id: int) -> int:
    """A ready job's place in its tube's heap: ``(pri, id)`` as one integer, which the heap
    compares faster than a tuple and keeps without one (``pri`` is u32, ids u64). (Priority
    0 is the id itself: compiled, a shift by 64 leaves the fast integer path even for 0.)"""
    return pri << 64 | job_id if pri else job_id


_ID_BITS: Final = (1 << 64) - 1


def _before(a: Job, b: Job) -> bool:
    """``(a.pri, a.id) < (b.pri, b.id)``, without building the tuples."""
    return a.pri < b.pri or (a.pri == b.pri and a.id < b.id)


class Tube:
    """A named set of jobs: the ready jobs by ``(pri, id)``, a delayed heap by deadline, a
    buried FIFO, and the counts ``stats-tube`` shows.

    The ready jobs are :func:`ready_key` integers in two places: ``ready_run``, an ascending
    run read from ``ready_at`` on (a key larger than the run's last is appended: every put of
    a tube whose jobs share a priority, the usual case, costs an append and its reserve an
    index step), and ``ready``, a heap for every other key (a released, kicked or promoted job,
    a smaller priority). The smallest ready key is the smaller of the two heads. Both delete
    lazily: an entry stands for the job of its id while that job is ready with that priority;
    any other entry is stale and dropped when it reaches the head. (A job that leaves ready and
    comes back with the same priority may have two entries; both stand for it only while it is
    ready, so it is still reserved once.)"""

    __slots__ = (
        "all_jobs",
        "buried",
        "cmd_delete",
        "cmd_pause",
        "delayed",
        "delayed_count",
        "name",
        "pause",
        "ready",
        "ready_at",
        "ready_count",
        "ready_run",
        "reserved_count",
        "total_jobs",
        "unpause_at",
        "urgent_count",
        "using",
        "waiting",
        "watching",
    )

    def __init__(self, name: str, all_jobs: dict[int, Job]) -> None:
        self.name = name
        self.all_jobs = all_jobs
        """The store's jobs by id (where a ready entry's job is found)."""
        self.ready: list[int] = []  # heap of ready_key(pri, id), lazy deletion
        self.ready_run: list[int] = []  # ascending ready_key(pri, id), lazy deletion
        self.ready_at = 0  # the run's head
        self.delayed: list[tuple[float, int, int, Job]] = []  # (deadline, id, gen, job)
        self.buried: dict[int, Job] = {}  # insertion order is the FIFO
        self.ready_count = 0
        self.urgent_count = 0
        self.delayed_count = 0
        self.reserved_count = 0
        self.total_jobs = 0
        self.using = 0
        self.watching = 0
        self.waiting: dict[Worker, None] = {}  # oldest first
        self.cmd_delete = 0
        self.cmd_pause = 0
        self.pause = 0
        self.unpause_at = 0.0

    @property
    def buried_count(self) -> int:
        return len(self.buried)

    @property
    def jobs(self) -> int:
        return self.ready_count + self.delayed_count + self.reserved_count + len(self.buried)

    def push_ready(self, key: int) -> None:
        """Add a ready entry (:func:`ready_key`)."""
        run = self.ready_run
        if not run or key > run[-1]:
            run.append(key)
        else:
            heappush(self.ready, key)

    def ready_head(self) -> Job | None:
        """The ready job with the smallest ``(pri, id)``, dropping stale entries on the way."""
        jobs = self.all_jobs
        heap = self.ready
        while True:
            run = self.ready_run
            at = self.ready_at
            if at < len(run):
                key = run[at]
                in_heap = bool(heap) and heap[0] < key
                if in_heap:
                    key = heap[0]
            elif heap:
                key = heap[0]
                in_heap = True
            else:
                return None
            pri = key >> 64
            job = jobs.get(key & _ID_BITS if pri else key)
            if job is not None and job.state == READY and job.pri == pri:
                return job
            if in_heap:
                heappop(heap)
            elif at + 1 == len(run):
                self.ready_run = []
                self.ready_at = 0
            elif at >= 64 and 2 * at >= len(run):  # the stale half goes: O(1) per entry
                del run[: at + 1]
                self.ready_at = 0
            else:
                self.ready_at = at + 1

    def delayed_head(self) -> Job | None:
        """The delayed job with the soonest deadline."""
        heap = self.delayed
        while heap:
            _, _, gen, job = heap[0]
            if job.gen == gen and job.state == DELAYED:
                return job
            heappop(heap)
        return None


class Worker:
    """One client's view: the tube it uses, the tubes it watches (in order), the jobs it
    holds, and its wait. ``wake`` is called once when a wait ends: with the reserved job
    (``WAKE_JOB``) or ``None`` and ``WAKE_TIMED_OUT`` / ``WAKE_DEADLINE_SOON``."""

    __slots__ = ("gen", "reserved", "use", "wait_until", "waiting", "wake", "watch")

    def __init__(self, wake: Callable[[Job | None, int], None]) -> None:
        self.wake = wake
        self.use: Tube | None = None
        self.watch: dict[str, Tube] = {}
        self.reserved: dict[int, Job] = {}
        self.waiting = False
        self.wait_until = -1.0  # monotonic, -1 for no limit
        self.gen = 0  # bumped when a wait starts or ends


@dataclass(slots=True)
class StoreStats:
    """Server-wide job counters (``stats``)."""

    total_jobs: int = 0
    job_timeouts: int = 0
    ready: int = 0
    urgent: int = 0
    delayed: int = 0
    buried: int = 0
    reserved: int = 0
    waiting: int = 0


_TIMER_DELAYED: Final = 0
_TIMER_WAIT: Final = 2
_TIMER_PAUSE: Final = 3


class JobStore(ReservationSource):
    """Every tube and job of one server (see the module docstring). ``reservations``: the
    server's table (None: one of its own, on ``clock``'s monotonic clock)."""

    def __init__(
        self,
        clock: TubeClock | NativeTubeClock,
        log: JobLog | NativeJobLog | None = None,
        reservations: ReservationTable | None = None,
    ) -> None:
        self.clock: NativeTubeClock = (
            clock if isinstance(clock, NativeTubeClock) else ProtocolClock(clock)
        )
        if reservations is None:
            reservations = ReservationTable(deadline_clock=lambda: round(clock.monotonic() * 1000))
        self.reservations = reservations
        self.log: NativeJobLog = (
            NativeJobLog()  # logs nothing: jobs live in memory only (no ``-b``)
            if log is None
            else log
            if isinstance(log, NativeJobLog)
            else ProtocolLog(log)
        )
        self.tubes: dict[str, Tube] = {}
        self.jobs: dict[int, Job] = {}
        self.next_id = 1
        self.stats = StoreStats()
        # (when, seq, kind, gen, target): one heap for every timer; stale entries skipped.
        self._timers: list[tuple[float, int, int, int, object]] = []
        self._seq = 0
        self._tube(DEFAULT_TUBE)
        self.live_bytes = 0
        """The size of the live jobs' records (bodies, tube names, fixed fields)."""
        self._until_check = COMPACT_EVERY
        self.compactions = 0
        self.new_deadlines = False
        """Set when a reservation got a TTR deadline (a reserve, a touch) that the table's
        timer may not cover yet: whoever runs that timer re-arms it and clears this (a put, a
        delete, a release only drop deadlines, and a timer that fires early costs nothing)."""

    # ------------------------------------------------------------------------ tubes, workers

    def _tube(self, name: str) -> Tube:
        tube = self.tubes.get(name)
        if tube is None:
            tube = self.tubes[name] = Tube(name, self.jobs)
        return tube

    def _maybe_free(self, tube: Tube) -> None:
        if (
            tube.name != DEFAULT_TUBE
            and not tube.jobs
            and not tube.using
            and not tube.watching
            and not tube.waiting
        ):
            del self.tubes[tube.name]

    def connect(self, wake: Callable[[Job | None, int], None]) -> Worker:
        """A new client: it uses and watches ``default``."""
        worker = Worker(wake)
        tube = self._tube(DEFAULT_TUBE)
        worker.use = tube
        tube.using += 1
        worker.watch[DEFAULT_TUBE] = tube
        tube.watching += 1
        return worker

    def use(self, worker: Worker, name: str) -> None:
        old = worker.use
        tube = self._tube(name)
        tube.using += 1
        worker.use = tube
        if old is not None:
            old.using -= 1
            self._maybe_free(old)

    def watch(self, worker: Worker, name: str) -> int:
        """Add ``name`` to the watch list; the list's length."""
        if name not in worker.watch:
            tube = self._tube(name)
            tube.watching += 1
            worker.watch[name] = tube
        return len(worker.watch)

    def ignore(self, worker: Worker, name: str) -> int:
        """Drop ``name`` from the watch list; the list's length, or -1 (NOT_IGNORED) when it
        is the last tube watched."""
        tube = worker.watch.get(name)
        if tube is None:
            return len(worker.watch)
        if len(worker.watch) == 1:
            return -1
        del worker.watch[name]
        tube.watching -= 1
        self._maybe_free(tube)
        return len(worker.watch)

    def disconnect(self, worker: Worker) -> None:
        """The client is gone: its jobs go back to ready now, its wait and tubes are dropped."""
        self._end_wait(worker)
        now = self.clock.monotonic()
        self.reservations.release_owner(worker)  # -> return_reserved
        worker.reserved.clear()
        tubes = list(worker.watch.values())
        worker.watch.clear()
        for tube in tubes:
            tube.watching -= 1
        if worker.use is not None:
            worker.use.using -= 1
            tubes.append(worker.use)
            worker.use = None
        for tube in tubes:
            if tube.name in self.tubes:
                self._maybe_free(tube)
        self._dispatch(now)

    # --------------------------------------------------------------------------- job moves

    def _make_ready(self, job: Job) -> None:
        job.state = READY
        job.gen += 1
        tube = job.tube
        tube.push_ready(ready_key(job.pri, job.id))
        tube.ready_count += 1
        self.stats.ready += 1
        if job.pri < URGENT:
            tube.urgent_count += 1
            self.stats.urgent += 1

    def _unready(self, job: Job) -> None:
        tube = job.tube
        tube.ready_count -= 1
        self.stats.ready -= 1
        if job.pri < URGENT:
            tube.urgent_count -= 1
            self.stats.urgent -= 1
        job.gen += 1

    def _make_delayed(self, job: Job, now: float) -> None:
        job.state = DELAYED
        job.gen += 1
        job.deadline = now + job.delay
        heappush(job.tube.delayed, (job.deadline, job.id, job.gen, job))
        job.tube.delayed_count += 1
        self.stats.delayed += 1
        self._timer(job.deadline, _TIMER_DELAYED, job.gen, job)

    def _undelay(self, job: Job) -> None:
        job.tube.delayed_count -= 1
        self.stats.delayed -= 1
        job.gen += 1

    def _make_buried(self, job: Job) -> None:
        job.state = BURIED
        job.gen += 1
        job.tube.buried[job.id] = job
        self.stats.buried += 1

    def _unbury(self, job: Job) -> None:
        del job.tube.buried[job.id]
        self.stats.buried -= 1
        job.gen += 1

    def _take(self, job: Job) -> None:
        """Remove ``job`` from whatever non-reserved state it is in."""
        if job.state == READY:
            self._unready(job)
        elif job.state == DELAYED:
            self._undelay(job)
        elif job.state == BURIED:
            self._unbury(job)
        else:
            self._unreserve(job)

    def _reserve(self, worker: Worker, job: Job, now: float) -> None:
        job.state = RESERVED
        job.gen += 1
        job.reserver = worker
        job.reserves += 1
        # now is the table's deadline clock too (see the module docstring): no second read.
        deadline = int(now * 1000.0 + 0.5) + job.ttr * 1000  # round(), without a Python call
        job.res = self.reservations.adopt_until(self, job.id, NO_ITEM, worker, deadline)
        self.new_deadlines = True
        job.tube.reserved_count += 1
        self.stats.reserved += 1
        worker.reserved[job.id] = job
        if worker.waiting:  # a new deadline may come before its wait's DEADLINE_SOON timer
            self._timer(self._ttr_deadline(job) - SAFETY_MARGIN, _TIMER_WAIT, worker.gen, worker)

    @staticmethod
    def _ttr_deadline(job: Job) -> float:
        """A reserved job's TTR deadline, monotonic seconds (its reservation's, in ms)."""
        res = job.res
        return 0.0 if res is None else res.deadline / 1000

    def _unreserve(self, job: Job) -> None:
        worker = job.reserver
        if worker is not None:
            held = worker.reserved
            if job.id in held:  # (compiled, ``pop(key, None)`` is a Python method call)
                del held[job.id]
        res = job.res
        if res is not None:
            job.res = None
            self.reservations.drop(res)  # ended here: no-op when the table returned it
        job.reserver = None
        job.tube.reserved_count -= 1
        self.stats.reserved -= 1
        job.gen += 1

    def _deadline_ms(self, job: Job, now: float) -> int:
        if job.state != DELAYED:
            return 0
        return self.clock.now_ms() + round((job.deadline - now) * 1000)

    def _log_change(self, job: Job, now: float) -> None:
        self.log.change(self.record(job, now, full=False))
        self._logged()

    def _logged(self) -> None:
        self._until_check -= 1
        if self._until_check <= 0:
            self._until_check = COMPACT_EVERY
            self.maybe_compact()

    def maybe_compact(self) -> bool:
        """Compact the log if it has grown past :data:`COMPACT_RATIO` times the live data
        (and past its floor); whether it did."""
        size = self.log.size
        if size < self.log.compact_floor or size < COMPACT_RATIO * self.live_bytes:
            return False
        now = self.clock.monotonic()
        jobs = list(self.snapshot())
        file = self.log.compact(self.next_id, (self.record(j, now) for j in jobs))
        if file is None:  # put off: the next check tries again
            return False
        for job in jobs:
            job.file = file
        self.compactions += 1
        return True

    def record(self, job: Job, now: float, *, full: bool = True) -> JobRecord:
        """What the log keeps of ``job`` (a reserved job is written as ready)."""
        state = READY if job.state == RESERVED else job.state
        deadline = self._deadline_ms(job, now)
        if not full:
            return JobRecord(job.id, state, job.pri, job.delay, deadline, job.counters)
        created = self.clock.now_ms() - round((now - job.created) * 1000)
        return JobRecord(
            job.id,
            state,
            job.pri,
            job.delay,
            deadline,
            job.counters,
            job.tube.name,
            job.ttr,
            created,
            job.body,
        )

    # ----------------------------------------------------------------------------- commands

    def put(self, worker: Worker, pri: int, delay: int, ttr: int, body: bytes) -> Job:
        """A new job in the worker's used tube (ttr 0 is raised to 1 s, as beanstalkd)."""
        now = self.clock.monotonic()
        tube = worker.use
        assert tube is not None
        job = Job(self.next_id, tube, pri, delay, max(ttr, 1), body=body, now=now)
        wall = self.clock.now_ms()
        job.file = self.log.put(
            job.id,
            DELAYED if delay > 0 else READY,
            pri,
            delay,
            wall + delay * 1000 if delay > 0 else 0,
            tube.name,
            job.ttr,
            wall,
            body,
        )
        self.next_id += 1
        self.jobs[job.id] = job
        self.live_bytes += len(body) + len(tube.name) + JOB_OVERHEAD
        self._logged()
        tube.total_jobs += 1
        self.stats.total_jobs += 1
        if delay > 0:
            self._make_delayed(job, now)
        else:
            self._make_ready(job)
            self._dispatch(now)
        return job

    def _ready_for(self, worker: Worker) -> Job | None:
        best: Job | None = None
        now = -1.0
        for tube in worker.watch.values():
            if tube.pause:
                if now < 0:
                    now = self.clock.monotonic()
                if tube.unpause_at > now:
                    continue
            job = tube.ready_head()
            if job is not None and (best is None or _before(job, best)):
                best = job
        return best

    def deadline_soon(self, worker: Worker, now: float) -> bool:
        """True when one of the worker's jobs is within the safety margin of its deadline."""
        return any(self._ttr_deadline(j) - now <= SAFETY_MARGIN for j in worker.reserved.values())

    def reserve(self, worker: Worker, timeout: float) -> tuple[Job | None, int]:
        """Reserve now if possible: ``(job, WAKE_JOB)``, ``(None, WAKE_DEADLINE_SOON)``,
        ``(None, WAKE_TIMED_OUT)`` (timeout 0 and nothing ready), or ``(None, -1)``: the
        worker now waits (timeout < 0: without limit) and ``wake`` will be called."""
        now = self.clock.monotonic()
        job = self._ready_for(worker)
        if job is None and self.deadline_soon(worker, now):
            return None, WAKE_DEADLINE_SOON
        if job is not None:
            self._unready(job)
            self._reserve(worker, job, now)
            return job, WAKE_JOB
        if timeout == 0:
            return None, WAKE_TIMED_OUT
        worker.waiting = True
        worker.gen += 1
        worker.wait_until = now + timeout if timeout > 0 else -1.0
        for tube in worker.watch.values():
            tube.waiting[worker] = None
        self.stats.waiting += 1
        if timeout > 0:
            self._timer(worker.wait_until, _TIMER_WAIT, worker.gen, worker)
        soonest = min((self._ttr_deadline(j) for j in worker.reserved.values()), default=-1.0)
        if soonest >= 0:
            self._timer(soonest - SAFETY_MARGIN, _TIMER_WAIT, worker.gen, worker)
        return None, -1

    def _end_wait(self, worker: Worker) -> None:
        if not worker.waiting:
            return
        worker.waiting = False
        worker.gen += 1
        for tube in worker.watch.values():
            tube.waiting.pop(worker, None)
        self.stats.waiting -= 1

    def cancel_wait(self, worker: Worker) -> bool:
        """End the worker's wait without waking it (TIMED_OUT on a half-close); whether it
        was waiting."""
        was = worker.waiting
        self._end_wait(worker)
        return was

    def reserve_job(self, worker: Worker, job_id: int) -> Job | None:
        """Reserve a ready, delayed or buried job of any tube by id."""
        job = self.jobs.get(job_id)
        if job is None or job.state == RESERVED:
            return None
        now = self.clock.monotonic()
        self._take(job)
        self._reserve(worker, job, now)
        return job

    def _own_or_idle(self, worker: Worker, job_id: int) -> Job | None:
        job = self.jobs.get(job_id)
        if job is None or (job.state == RESERVED and job.reserver is not worker):
            return None
        return job

    def delete(self, worker: Worker, job_id: int) -> bool:
        """Delete a job the worker holds, or any ready, delayed or buried job."""
        job = self._own_or_idle(worker, job_id)
        if job is None:
            return False
        self._delete(job)
        return True

    def _delete(self, job: Job) -> None:
        self.log.delete(job.id)
        self._take(job)
        del self.jobs[job.id]
        self.live_bytes -= len(job.body) + len(job.tube.name) + JOB_OVERHEAD
        self._logged()
        job.tube.cmd_delete += 1
        self._maybe_free(job.tube)

    def _held(self, worker: Worker, job_id: int) -> Job | None:
        job = worker.reserved.get(job_id)
        return job if job is not None and job.state == RESERVED else None

    def release(self, worker: Worker, job_id: int, pri: int, delay: int) -> bool:
        job = self._held(worker, job_id)
        if job is None:
            return False
        now = self.clock.monotonic()
        changed = pri != job.pri or delay > 0
        self._unreserve(job)
        job.pri = pri
        job.delay = delay
        job.releases += 1
        if delay > 0:
            self._make_delayed(job, now)
        else:
            self._make_ready(job)
        if changed:
            self._log_change(job, now)
        self._dispatch(now)
        return True

    def bury(self, worker: Worker, job_id: int, pri: int) -> bool:
        job = self._held(worker, job_id)
        if job is None:
            return False
        now = self.clock.monotonic()
        self._unreserve(job)
        job.pri = pri
        job.buries += 1
        self._make_buried(job)
        self._log_change(job, now)
        return True

    def touch(self, worker: Worker, job_id: int) -> bool:
        job = self._held(worker, job_id)
        if job is None or job.res is None:
            return False
        self.reservations.extend((job.res,), job.ttr * 1000)
        self.new_deadlines = True
        return True

    def _kick(self, job: Job, now: float) -> None:
        if job.state == BURIED:
            self._unbury(job)
        else:
            self._undelay(job)
        job.kicks += 1
        self._make_ready(job)
        self._log_change(job, now)

    def kick(self, worker: Worker, bound: int) -> int:
        """Kick up to ``bound`` jobs of the used tube: buried ones if any, else delayed."""
        tube = worker.use
        assert tube is not None
        now = self.clock.monotonic()
        count = 0
        if tube.buried:
            while tube.buried and count < bound:
                self._kick(next(iter(tube.buried.values())), now)
                count += 1
        else:
            while count < bound:
                job = tube.delayed_head()
                if job is None:
                    break
                self._kick(job, now)
                count += 1
        if count:
            self._dispatch(now)
        return count

    def kick_job(self, job_id: int) -> bool:
        job = self.jobs.get(job_id)
        if job is None or job.state not in (BURIED, DELAYED):
            return False
        now = self.clock.monotonic()
        self._kick(job, now)
        self._dispatch(now)
        return True

    def pause(self, name: str, delay: int) -> bool:
        """Pause reservations from tube ``name`` for ``delay`` s (0 means 1 s)."""
        tube = self.tubes.get(name)
        if tube is None:
            return False
        delay = max(delay, 1)
        tube.pause = delay
        tube.unpause_at = self.clock.monotonic() + delay
        tube.cmd_pause += 1
        self._timer(tube.unpause_at, _TIMER_PAUSE, 0, tube)
        return True

    # ----------------------------------------------------------------------- peeks, stats

    def peek(self, job_id: int) -> Job | None:
        return self.jobs.get(job_id)

    def peek_ready(self, worker: Worker) -> Job | None:
        assert worker.use is not None
        return worker.use.ready_head()

    def peek_delayed(self, worker: Worker) -> Job | None:
        assert worker.use is not None
        return worker.use.delayed_head()

    def peek_buried(self, worker: Worker) -> Job | None:
        assert worker.use is not None
        return next(iter(worker.use.buried.values()), None)

    def time_left(self, job: Job) -> int:
        """Whole seconds to the job's TTR deadline (reserved) or ready time (delayed)."""
        if job.state == RESERVED:
            deadline = self._ttr_deadline(job)
        elif job.state == DELAYED:
            deadline = job.deadline
        else:
            return 0
        return max(0, int(deadline - self.clock.monotonic()))

    def age(self, job: Job) -> int:
        return int(self.clock.monotonic() - job.created)

    def pause_left(self, tube: Tube) -> int:
        if not tube.pause:
            return 0
        return max(0, int(tube.unpause_at - self.clock.monotonic()))

    # ------------------------------------------------------------------------------ timers

    def _timer(self, when: float, kind: int, gen: int, target: object) -> None:
        self._seq += 1
        heappush(self._timers, (when, self._seq, kind, gen, target))

    def next_deadline(self) -> float | None:
        """The monotonic time at which :meth:`tick` has work, or None (TTR deadlines are on
        the reservation table's timer)."""
        timers = self._timers
        while timers:
            when, _, kind, gen, target = timers[0]
            if self._live(kind, gen, target):
                return when
            heappop(timers)
        return None

    @staticmethod
    def _live(kind: int, gen: int, target: object) -> bool:
        if kind == _TIMER_DELAYED:
            assert isinstance(target, Job)
            return target.gen == gen and target.state == DELAYED
        if kind == _TIMER_WAIT:
            assert isinstance(target, Worker)
            return target.gen == gen and target.waiting
        assert isinstance(target, Tube)
        return target.pause > 0

    def tick(self) -> None:
        """Run every timer that is due: promote delayed jobs, end waits that time out or reach
        DEADLINE_SOON, unpause tubes; then return the reservations due (expired TTRs, as the
        table's own timer would) and serve waiting workers."""
        now = self.clock.monotonic()
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, kind, gen, target = heappop(timers)
            if not self._live(kind, gen, target):
                continue
            if kind == _TIMER_DELAYED:
                assert isinstance(target, Job)
                self._undelay(target)
                self._make_ready(target)
            elif kind == _TIMER_WAIT:
                assert isinstance(target, Worker)
                self._wake_waiting(target, now)
            else:
                assert isinstance(target, Tube)
                if target.unpause_at <= now:
                    target.pause = 0
                    target.unpause_at = 0.0
        self.reservations.expire()
        self._dispatch(now)

    # ----------------------------------------------------------- as a ReservationSource

    def return_reserved(self, xids: list[int], reason: int) -> int:
        """The table returns reserved jobs ``xids``: their TTR passed (``RETURN_EXPIRED``,
        counted as a timeout) or their worker left; ready again, and waiting workers served."""
        n = 0
        for xid in xids:
            job = self.jobs.get(xid)
            if job is None or job.state != RESERVED:
                continue
            self._unreserve(job)
            if reason == RETURN_EXPIRED:
                job.timeouts += 1
                self.stats.job_timeouts += 1
            self._make_ready(job)
            n += 1
        if n:
            self._dispatch(self.clock.monotonic())
        return n

    def confirm_reserved(self, xid: int) -> bool:
        """Delete reserved job ``xid`` (what confirming a job means)."""
        job = self.jobs.get(xid)
        if job is None or job.state != RESERVED:
            return False
        self._delete(job)
        return True

    def source_name(self) -> str:
        return "beanstalk jobs"

    def _wake_waiting(self, worker: Worker, now: float) -> None:
        if self.deadline_soon(worker, now):
            self._end_wait(worker)
            worker.wake(None, WAKE_DEADLINE_SOON)
        elif 0 <= worker.wait_until <= now:
            self._end_wait(worker)
            worker.wake(None, WAKE_TIMED_OUT)

    def _dispatch(self, now: float) -> None:
        """Hand ready jobs to waiting workers: the smallest ``(pri, id)`` among the tubes
        someone waits on goes to that tube's oldest waiter (beanstalkd's process_queue)."""
        while self.stats.waiting:
            best: Job | None = None
            for tube in self.tubes.values():
                if not tube.waiting or not tube.ready_count:
                    continue
                if tube.pause and tube.unpause_at > now:
                    continue
                job = tube.ready_head()
                if job is not None and (best is None or _before(job, best)):
                    best = job
            if best is None:
                return
            worker = next(iter(best.tube.waiting))
            self._end_wait(worker)
            self._unready(best)
            self._reserve(worker, best, now)
            worker.wake(best, WAKE_JOB)

    # ------------------------------------------------------------------------------ replay

    def restore(self, record: JobRecord) -> None:
        """Recreate a job read back from the log (state ready, delayed or buried; a job that
        was reserved is ready). Call before any client connects, buried jobs in the order
        they were buried."""
        now = self.clock.monotonic()
        wall = self.clock.now_ms()
        r = record
        job = Job(r.job_id, self._tube(r.tube), r.pri, r.delay, r.ttr, body=r.body, now=now)
        job.created = now - max(0, wall - r.created_ms) / 1000
        job.reserves, job.timeouts, job.releases, job.buries, job.kicks = r.counters
        job.file = r.file
        self.jobs[job.id] = job
        self.next_id = max(self.next_id, job.id + 1)
        self.live_bytes += len(job.body) + len(job.tube.name) + JOB_OVERHEAD
        job.tube.total_jobs += 1
        self.stats.total_jobs += 1
        if r.state == DELAYED:
            job.state = DELAYED
            job.gen += 1
            job.deadline = now + (r.deadline_ms - wall) / 1000
            heappush(job.tube.delayed, (job.deadline, job.id, job.gen, job))
            job.tube.delayed_count += 1
            self.stats.delayed += 1
            self._timer(job.deadline, _TIMER_DELAYED, job.gen, job)
        elif r.state == BURIED:
            self._make_buried(job)
        else:
            self._make_ready(job)

    def snapshot(self) -> Iterator[Job]:
        """Every job, for a compaction: each tube's buried jobs last, in FIFO order, so that
        restoring them in this order rebuilds the FIFOs."""
        buried = [j for t in self.tubes.values() for j in t.buried.values()]
        rest = [j for j in self.jobs.values() if j.state != BURIED]
        return iter(rest + buried)

    def deadline_ms(self, job: Job) -> int:
        """The wall-clock deadline of a delayed job (0 for any other state)."""
        return self._deadline_ms(job, self.clock.monotonic())
