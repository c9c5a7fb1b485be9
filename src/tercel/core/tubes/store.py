"""The job store's commands: what a beanstalkd request does to the jobs, on the moves of
:mod:`.state` and the timers of :mod:`.timers` (the contract is :mod:`tercel.core.tubes`'s).

Every command reads the clock at most once (its monotonic milliseconds; a put also the wall
clock, for the log) and hands that ``now`` down.
"""

from __future__ import annotations

from collections.abc import Callable

from tercel.core.tubes.model import (
    BURIED,
    DEFAULT_TUBE,
    DELAYED,
    READY,
    RESERVED,
    WAKE_DEADLINE_SOON,
    WAKE_JOB,
    WAKE_TIMED_OUT,
    Job,
    Tube,
    Worker,
    before,
)
from tercel.core.tubes.state import JOB_OVERHEAD, SAFETY_MARGIN_MS, TIMER_PAUSE, TIMER_WAIT
from tercel.core.tubes.timers import JobTimers
from tercel.errors import JournalWriteError


class JobStore(JobTimers):
    """Every tube and job of one server (see :mod:`tercel.core.tubes`). ``clock``: the
    server's; ``reservations``: the server's table, on that clock's monotonic milliseconds
    (None: a table of its own)."""

    # ------------------------------------------------------------------------ tubes, workers

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
        now = self.clock.monotonic_ms()
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

    # ----------------------------------------------------------------------------- commands

    def put(self, worker: Worker, pri: int, delay: int, ttr: int, body: bytes) -> Job:
        """A new job in the worker's used tube (ttr 0 is raised to 1 s, as beanstalkd)."""
        now = self.clock.monotonic_ms()
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
        return self._entered(job, now)

    def _entered(self, job: Job, now: int) -> Job:
        """A job :meth:`put` or :meth:`put_keyed` just logged joins the store and its tube
        (ready, or delayed until ``now`` (monotonic ms) + its delay)."""
        tube = job.tube
        self.next_id += 1
        self.jobs[job.id] = job
        self.live_bytes += len(job.body) + len(tube.name) + JOB_OVERHEAD
        self._logged()
        tube.total_jobs += 1
        self.stats.total_jobs += 1
        if job.delay > 0:
            self._make_delayed(job, now + job.delay * 1000)
        else:
            self._make_ready(job)
            self._dispatch(now)
        return job

    def put_keyed(  # noqa: PLR0917 (as put, and the key)
        self, worker: Worker, key: str, pri: int, delay: int, ttr: int, body: bytes
    ) -> tuple[Job | None, int]:
        """``put-key``: a new job as :meth:`put`, logged with its dedup key in one record;
        ``(job, its id)``, or ``(None, the id)`` of the job a ``put-key`` with ``key`` made
        within the window (nothing put, nothing logged). ``key`` must be valid (the caller
        checks :func:`tercel.names.key_problem`). Raises :class:`~tercel.errors.TooManyKeys`
        when ``max_dedup_keys`` keys younger than the window are held, and
        :class:`~tercel.errors.JournalWriteError` for a duplicate once the log failed."""
        keys = self.dedup
        wall = self.clock.now_ms()
        found = keys.find(key, wall)
        if found >= 0:
            if self.log.failed:  # the original's record may never have reached the file
                raise JournalWriteError("job log write failed", "beanstalk", 0)
            keys.duplicates += 1
            return None, found
        keys.check_room("the beanstalkd job store")
        now = self.clock.monotonic_ms()
        tube = worker.use
        assert tube is not None
        job = Job(self.next_id, tube, pri, delay, max(ttr, 1), body=body, now=now)
        job.file = self.log.put_keyed(
            job.id,
            DELAYED if delay > 0 else READY,
            pri,
            delay,
            wall + delay * 1000 if delay > 0 else 0,
            tube.name,
            job.ttr,
            wall,
            body,
            key,
        )
        keys.remember(key, job.id, wall)
        return self._entered(job, now), job.id

    def restore_keys(self, keys: dict[str, tuple[int, int]]) -> None:
        """Replay: the dedup keys the log held (key -> (job id, put wall ms)), those younger
        than the window kept."""
        now = self.clock.now_ms()
        for key, (job_id, put_ms) in sorted(keys.items(), key=lambda kv: kv[1][1]):
            self.dedup.restore(key, job_id, put_ms, now)

    def _ready_for(self, worker: Worker, now: int) -> Job | None:
        best: Job | None = None
        for tube in worker.watch.values():
            if tube.pause and tube.unpause_at > now:
                continue
            job = tube.ready_head()
            if job is not None and (best is None or before(job, best)):
                best = job
        return best

    def reserve(self, worker: Worker, timeout: int) -> tuple[Job | None, int]:
        """Reserve now if possible: ``(job, WAKE_JOB)``, ``(None, WAKE_DEADLINE_SOON)``,
        ``(None, WAKE_TIMED_OUT)`` (timeout 0 and nothing ready), or ``(None, -1)``: the
        worker now waits (``timeout`` seconds; < 0: without limit) and ``wake`` will be
        called."""
        now = self.clock.monotonic_ms()
        job = self._ready_for(worker, now)
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
        worker.wait_until = now + timeout * 1000 if timeout > 0 else -1
        for tube in worker.watch.values():
            tube.waiting[worker] = None
        self.stats.waiting += 1
        if timeout > 0:
            self._timer(worker.wait_until, TIMER_WAIT, worker.gen, worker)
        soonest = min((self._ttr_deadline(j) for j in worker.reserved.values()), default=-1)
        if soonest >= 0:
            self._timer(soonest - SAFETY_MARGIN_MS, TIMER_WAIT, worker.gen, worker)
        return None, -1

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
        now = self.clock.monotonic_ms()
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

    def _held(self, worker: Worker, job_id: int) -> Job | None:
        job = worker.reserved.get(job_id)
        return job if job is not None and job.state == RESERVED else None

    def release(self, worker: Worker, job_id: int, pri: int, delay: int) -> bool:
        job = self._held(worker, job_id)
        if job is None:
            return False
        now = self.clock.monotonic_ms()
        changed = pri != job.pri or delay > 0
        self._unreserve(job)
        job.pri = pri
        job.delay = delay
        job.releases += 1
        if delay > 0:
            self._make_delayed(job, now + delay * 1000)
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
        now = self.clock.monotonic_ms()
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

    def _kick(self, job: Job, now: int) -> None:
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
        now = self.clock.monotonic_ms()
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
        now = self.clock.monotonic_ms()
        self._kick(job, now)
        self._dispatch(now)
        return True

    def pause(self, name: str, delay: int) -> bool:
        """Pause reservations from tube ``name`` for ``delay`` s. 0 unpauses it at once:
        beanstalkd pauses for 1 ns, so the next reserve and the waiting workers get its jobs."""
        tube = self.tubes.get(name)
        if tube is None:
            return False
        tube.cmd_pause += 1
        now = self.clock.monotonic_ms()
        if delay <= 0:
            tube.pause = 0
            tube.unpause_at = 0
            self._dispatch(now)
            return True
        tube.pause = delay
        tube.unpause_at = now + delay * 1000
        self._timer(tube.unpause_at, TIMER_PAUSE, 0, tube)
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
        return max(0, deadline - self.clock.monotonic_ms()) // 1000

    def age(self, job: Job) -> int:
        """Whole seconds since the job was put."""
        return max(0, self.clock.monotonic_ms() - job.created) // 1000

    def pause_left(self, tube: Tube) -> int:
        """Whole seconds until the tube's pause ends (0: not paused)."""
        if not tube.pause:
            return 0
        return max(0, tube.unpause_at - self.clock.monotonic_ms()) // 1000
