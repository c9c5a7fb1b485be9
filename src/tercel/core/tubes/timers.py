"""The job store's timers: delayed jobs, wait timeouts, DEADLINE_SOON wake-ups and pauses,
on one heap, and the returns of reservations whose TTR passed.

Nothing here sleeps: the server asks :meth:`JobTimers.next_deadline`, arms one loop timer,
and calls :meth:`JobTimers.tick` when it fires. A pass runs in beanstalkd's order (its
``prottick``): delayed jobs are promoted and tubes unpaused first, the TTRs due are returned,
ready jobs go to the waiting workers, and only then do the waits still open time out or get
DEADLINE_SOON, so a job that becomes ready in the same pass as a wait's timeout goes to the
waiter. TTR deadlines are the reservation table's, on its own timer (:meth:`tick` expires
those due too, so the core runs on one call in tests).
"""

from __future__ import annotations

from heapq import heappop

from tercel.core.source import RETURN_EXPIRED
from tercel.core.tubes.model import (
    DELAYED,
    RESERVED,
    WAKE_DEADLINE_SOON,
    WAKE_TIMED_OUT,
    Job,
    Tube,
    Worker,
)
from tercel.core.tubes.state import TIMER_DELAYED, TIMER_WAIT, JobState


class JobTimers(JobState):
    """The store's timers (see the module docstring) and its side of the reservation table."""

    def next_deadline(self) -> int | None:
        """The monotonic time (ms) at which :meth:`tick` has work, or None (TTR deadlines are
        on the reservation table's timer)."""
        timers = self._timers
        while timers:
            when, _, kind, gen, target = timers[0]
            if self._live(kind, gen, target):
                return when
            heappop(timers)
        return None

    @staticmethod
    def _live(kind: int, gen: int, target: object) -> bool:
        if kind == TIMER_DELAYED:
            assert isinstance(target, Job)
            return target.gen == gen and target.state == DELAYED
        if kind == TIMER_WAIT:
            assert isinstance(target, Worker)
            return target.gen == gen and target.waiting
        assert isinstance(target, Tube)
        return target.pause > 0

    def tick(self) -> None:
        """Run every timer that is due, in beanstalkd's order (see the module docstring)."""
        now = self.clock.monotonic_ms()
        timers = self._timers
        waits: list[tuple[Worker, int]] = []
        while timers and timers[0][0] <= now:
            _, _, kind, gen, target = heappop(timers)
            if not self._live(kind, gen, target):
                continue
            if kind == TIMER_DELAYED:
                assert isinstance(target, Job)
                self._undelay(target)
                self._make_ready(target)
            elif kind == TIMER_WAIT:
                assert isinstance(target, Worker)
                waits.append((target, gen))
            else:
                assert isinstance(target, Tube)
                if target.unpause_at <= now:
                    target.pause = 0
                    target.unpause_at = 0
        self.reservations.expire()
        self._dispatch(now)
        for worker, gen in waits:
            if worker.gen == gen:  # still the wait the timer was set for: not served above
                self._wake_waiting(worker, now)

    def _wake_waiting(self, worker: Worker, now: int) -> None:
        if self.deadline_soon(worker, now):
            self._end_wait(worker)
            worker.wake(None, WAKE_DEADLINE_SOON)
        elif 0 <= worker.wait_until <= now:
            self._end_wait(worker)
            worker.wake(None, WAKE_TIMED_OUT)

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
            self._dispatch(self.clock.monotonic_ms())
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
