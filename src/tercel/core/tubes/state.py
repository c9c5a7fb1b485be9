"""The job store's state and the moves every command is made of.

:class:`JobState` holds the tubes, the jobs, the counters, the timer heap and the log, and
moves one job between states (ready, delayed, buried, reserved), keeping every count and heap
right; it logs a change, decides when to compact the log, and rebuilds jobs read back from
it. The timers (:mod:`.timers`) and the commands (:mod:`.store`) are built on these moves.
Every time here is the clock's monotonic milliseconds, the reservation table's clock; only
what the log keeps is wall-clock (a delayed job's deadline, a job's creation).
"""

from __future__ import annotations

from collections.abc import Iterator
from heapq import heappush
from typing import Final

from tercel.clock import Clock
from tercel.core.dedup import DedupKeys
from tercel.core.reservations import NO_ITEM, ReservationTable
from tercel.core.source import ReservationSource
from tercel.core.tubes.log import JobLog, NativeJobLog, native_log
from tercel.core.tubes.model import (
    BURIED,
    DEFAULT_TUBE,
    DELAYED,
    READY,
    RESERVED,
    URGENT,
    WAKE_JOB,
    Job,
    JobRecord,
    StoreStats,
    Tube,
    Worker,
    before,
    ready_key,
)

COMPACT_EVERY: Final = 256
"""Log writes between two checks of whether the log should be compacted."""
COMPACT_RATIO: Final = 3
"""Compact when the log is this many times the live jobs' size (beanstalkd's ``walcompact``
keeps garbage below twice the live data, the same bound)."""
JOB_OVERHEAD: Final = 64
"""Bytes a job's record takes beyond its body and tube name (for the compaction policy)."""
SAFETY_MARGIN_MS: Final = 1000
"""Milliseconds before a TTR deadline in which ``reserve`` answers DEADLINE_SOON."""

DEDUP_WINDOW_MS: Final = 600_000
MAX_DEDUP_KEYS: Final = 1_000_000
"""``put-key``'s window and bound until the server sets its own (the queue defaults')."""

TIMER_DELAYED: Final = 0
TIMER_WAIT: Final = 2
TIMER_PAUSE: Final = 3


class JobState(ReservationSource):
    """Every tube and job of one server, and the moves between a job's states (see the
    module docstring). ``reservations``: the server's table, which must run on ``clock``'s
    monotonic milliseconds (None: a table of its own on them)."""

    def __init__(
        self,
        clock: Clock,
        log: JobLog | NativeJobLog | None = None,
        reservations: ReservationTable | None = None,
    ) -> None:
        self.clock = clock
        if reservations is None:
            reservations = ReservationTable(deadline_clock=clock.monotonic_ms)
        elif getattr(reservations.deadline_clock, "__self__", None) is not clock:
            # A TTR deadline is written here and read by the table: one clock, or none works.
            raise ValueError("the reservation table must run on the job store's clock")
        self.reservations = reservations
        self.log: NativeJobLog = native_log(log)
        self.tubes: dict[str, Tube] = {}
        self.jobs: dict[int, Job] = {}
        self.next_id = 1
        self.stats = StoreStats()
        # (when, seq, kind, gen, target): one heap for every timer; stale entries skipped.
        self._timers: list[tuple[int, int, int, int, object]] = []
        self._seq = 0
        self._tube(DEFAULT_TUBE)
        self.live_bytes = 0
        """The size of the live jobs' records (bodies, tube names, fixed fields)."""
        self._until_check = COMPACT_EVERY
        self.compactions = 0
        self.dedup = DedupKeys(DEDUP_WINDOW_MS, MAX_DEDUP_KEYS)
        """The dedup keys of ``put-key`` (the server sets the window and the bound from its
        queue defaults, ``dedup_window_ms`` and ``max_dedup_keys``)."""
        self.new_deadlines = False
        """Set when a reservation got a TTR deadline (a reserve, a touch) that the table's
        timer may not cover yet: whoever runs that timer re-arms it and clears this (a put, a
        delete, a release only drop deadlines, and a timer that fires early costs nothing)."""

    # ------------------------------------------------------------------------------- tubes

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

    def _make_delayed(self, job: Job, deadline: int) -> None:
        job.state = DELAYED
        job.gen += 1
        job.deadline = deadline
        heappush(job.tube.delayed, (deadline, job.id, job.gen, job))
        job.tube.delayed_count += 1
        self.stats.delayed += 1
        self._timer(deadline, TIMER_DELAYED, job.gen, job)

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
        """Remove ``job`` from whatever state it is in."""
        if job.state == READY:
            self._unready(job)
        elif job.state == DELAYED:
            self._undelay(job)
        elif job.state == BURIED:
            self._unbury(job)
        else:
            self._unreserve(job)

    def _reserve(self, worker: Worker, job: Job, now: int) -> None:
        job.state = RESERVED
        job.gen += 1
        job.reserver = worker
        job.reserves += 1
        # now is the table's clock too (the same Clock's monotonic ms): no second read.
        deadline = now + job.ttr * 1000
        job.res = self.reservations.adopt_until(self, job.id, NO_ITEM, worker, deadline)
        self.new_deadlines = True
        job.tube.reserved_count += 1
        self.stats.reserved += 1
        worker.reserved[job.id] = job
        if worker.waiting:  # a new deadline may come before its wait's DEADLINE_SOON timer
            self._timer(deadline - SAFETY_MARGIN_MS, TIMER_WAIT, worker.gen, worker)

    @staticmethod
    def _ttr_deadline(job: Job) -> int:
        """A reserved job's TTR deadline: its reservation's (monotonic ms)."""
        res = job.res
        return 0 if res is None else res.deadline

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

    def _delete(self, job: Job) -> None:
        self.log.delete(job.id)
        self._take(job)
        del self.jobs[job.id]
        self.live_bytes -= len(job.body) + len(job.tube.name) + JOB_OVERHEAD
        self._logged()
        job.tube.cmd_delete += 1
        self._maybe_free(job.tube)

    # -------------------------------------------------------------------- waits, dispatch

    def deadline_soon(self, worker: Worker, now: int) -> bool:
        """True when one of the worker's jobs is within the safety margin of its deadline."""
        return any(
            self._ttr_deadline(j) - now <= SAFETY_MARGIN_MS for j in worker.reserved.values()
        )

    def _end_wait(self, worker: Worker) -> None:
        if not worker.waiting:
            return
        worker.waiting = False
        worker.gen += 1
        for tube in worker.watch.values():
            tube.waiting.pop(worker, None)
        self.stats.waiting -= 1

    def _timer(self, when: int, kind: int, gen: int, target: object) -> None:
        self._seq += 1
        heappush(self._timers, (when, self._seq, kind, gen, target))

    def _dispatch(self, now: int) -> None:
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
                if job is not None and (best is None or before(job, best)):
                    best = job
            if best is None:
                return
            worker = next(iter(best.tube.waiting))
            self._end_wait(worker)
            self._unready(best)
            self._reserve(worker, best, now)
            worker.wake(best, WAKE_JOB)

    # --------------------------------------------------------------------------------- log

    def _deadline_ms(self, job: Job, now: int) -> int:
        if job.state != DELAYED:
            return 0
        return self.clock.now_ms() + (job.deadline - now)

    def _log_change(self, job: Job, now: int) -> None:
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
        now = self.clock.monotonic_ms()
        jobs = list(self.snapshot())
        keys = self.dedup.live() if len(self.dedup) else []
        file = self.log.compact(self.next_id, (self.record(j, now) for j in jobs), keys)
        if file is None:  # put off: the next check tries again
            return False
        for job in jobs:
            job.file = file
        self.compactions += 1
        return True

    def record(self, job: Job, now: int, *, full: bool = True) -> JobRecord:
        """What the log keeps of ``job`` at monotonic time ``now`` (a reserved job is written
        as ready)."""
        state = READY if job.state == RESERVED else job.state
        deadline = self._deadline_ms(job, now)
        if not full:
            return JobRecord(job.id, state, job.pri, job.delay, deadline, job.counters)
        created = self.clock.now_ms() - (now - job.created)
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

    def deadline_ms(self, job: Job) -> int:
        """The wall-clock deadline of a delayed job (0 for any other state)."""
        return self._deadline_ms(job, self.clock.monotonic_ms())

    # ------------------------------------------------------------------------------ replay

    def restore(self, record: JobRecord) -> None:
        """Recreate a job read back from the log (state ready, delayed or buried; a job that
        was reserved is ready). Call before any client connects, buried jobs in the order
        they were buried."""
        now = self.clock.monotonic_ms()
        wall = self.clock.now_ms()
        r = record
        created = now - max(0, wall - r.created_ms)
        job = Job(r.job_id, self._tube(r.tube), r.pri, r.delay, r.ttr, body=r.body, now=created)
        job.reserves, job.timeouts, job.releases, job.buries, job.kicks = r.counters
        job.file = r.file
        self.jobs[job.id] = job
        self.next_id = max(self.next_id, job.id + 1)
        self.live_bytes += len(job.body) + len(job.tube.name) + JOB_OVERHEAD
        job.tube.total_jobs += 1
        self.stats.total_jobs += 1
        if r.state == DELAYED:
            self._make_delayed(job, now + (r.deadline_ms - wall))
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
