"""The job store's model: a job's states, :class:`Job`, :class:`Tube`, :class:`Worker`, the
counters, and :class:`JobRecord` (what the log keeps of a job).

Plain data with the few methods that read one object (a tube's ready and delayed heads); the
moves between states are the store's (:mod:`.state`). Times are the server clock's monotonic
milliseconds (:meth:`tercel.clock.Clock.monotonic_ms`), the reservation table's clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from heapq import heappop, heappush
from typing import Final

from mypy_extensions import mypyc_attr

from tercel.core.reservations import Reservation

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
URGENT: Final = 1024
"""Jobs with a priority below this count as urgent (``current-jobs-urgent``)."""
DEFAULT_TUBE: Final = "default"

WAKE_JOB: Final = 0
WAKE_TIMED_OUT: Final = 1
WAKE_DEADLINE_SOON: Final = 2

Counters = tuple[int, int, int, int, int]
"""reserves, timeouts, releases, buries, kicks."""


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


@mypyc_attr(acyclic=True)
class Job:
    """One job. ``deadline`` (monotonic ms) is the ready time of a delayed job; a reserved one
    has its reservation (``res``), whose deadline is the TTR's. ``created`` is monotonic ms too.
    ``gen`` changes whenever the job moves, so stale heap entries and timers are recognised and
    skipped. ``file``: the number of the log file holding its JOB record (``stats-job``'s
    ``file``; 0 when not journaled).

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
        self, job_id: int, tube: Tube, pri: int, delay: int, ttr: int, *, body: bytes, now: int
    ) -> None:
        self.id = job_id
        self.tube = tube
        self.pri = pri
        self.delay = delay
        self.ttr = ttr
        self.body = body
        self.created = now
        self.deadline = 0
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


ID_BITS: Final = (1 << 64) - 1
"""The id part of a :func:`ready_key`."""


def before(a: Job, b: Job) -> bool:
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
    ready, so it is still reserved once.)

    ``pause`` is the delay of the last ``pause-tube`` in seconds (0: not paused) and
    ``unpause_at`` when it ends (monotonic ms)."""

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
        self.delayed: list[tuple[int, int, int, Job]] = []  # (deadline, id, gen, job)
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
        self.unpause_at = 0

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
            job = jobs.get(key & ID_BITS if pri else key)
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
        self.wait_until = -1  # monotonic ms, -1 for no limit
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
