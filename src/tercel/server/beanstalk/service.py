"""The beanstalkd front end's shared state: the job store, its log, the one timer and the
counters ``stats`` shows.

One :class:`BeanstalkService` per server, made by the front end's start hook
(:mod:`tercel.server.beanstalk.frontend`): inside ``tercel serve`` (``--beanstalk-port``,
journaled in ``<data_dir>/beanstalk.d``) or under ``tercel beanstalkd`` (``-b DIR`` or memory
only). Either way the connections are the shared layer's
(:class:`~tercel.server.connection.Connection`, counted under ``beanstalk``), the job log is
written by the context's group committer and the server's status applies. Connections
(:mod:`tercel.server.beanstalk.connection`, given this service when made) call the store and
then :meth:`BeanstalkService.rearm`, which keeps one loop timer set for the store's next
deadline (delayed job, wait timeout, DEADLINE_SOON, unpause) and arms the reservation table's
timer, which ends a TTR (a reserved job is a reservation of the server's one table).
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import resource
import socket
from collections.abc import Iterable
from typing import Final

from tercel import __version__
from tercel.core.tubes import JobRecord, JobStore, NativeJobLog
from tercel.journal.joblog import DEFAULT_MAX_FILE_SIZE, SERVE_DIR, JobJournal
from tercel.protocol.beanstalk import COUNTED, DEFAULT_MAX_JOB_SIZE, OPS, random_id
from tercel.server.context import ServerContext

log = logging.getLogger("tercel.beanstalk")

JOBLOG_DIR = SERVE_DIR
"""The job log's directory inside ``tercel serve``'s data dir (never a queue's file name)."""
JOBLOG_NAME = "beanstalk.d"
"""The job log's name for the group committer: no queue can be called so (``names.py``), so
its sync mode (:meth:`~tercel.server.commit.Committer.set_sync_mode`) is never a queue's."""
FRONT_END = "beanstalk"
"""The name the connections are counted under (the listener's name)."""

PROTOCOL_VERSION: Final = "1.12"
"""``stats``' ``version``: the beanstalkd release whose protocol tercel implements (its commands,
``reserve-job`` included, and replies), as clients read it to gate features (``kick-job`` needs
1.8). tercel's own version is the extra key ``tercel-version``, after beanstalkd's 51."""

CMD_COUNTERS: Final = OPS[:COUNTED]
"""The ``cmd-*`` counters of ``stats``, in beanstalkd's order (reserve-job and kick-job have
none in 1.12); ``BeanstalkService.cmd_counts[code]`` counts ``OPS[code]``."""


class JournalLog(NativeJobLog):
    """The job journal as the store's log. Both compiled and typed, so each of the store's
    calls (a put, a delete) is a native call with unboxed arguments; the store wraps any other
    log in :class:`~tercel.core.tubes.ProtocolLog`, whose calls go through Python (journal
    may not import the core, so the journal itself cannot be a ``NativeJobLog``)."""

    def __init__(self, journal: JobJournal) -> None:
        self.journal = journal

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
        return self.journal.put(job_id, state, pri, delay, deadline_ms, tube, ttr, created_ms, body)

    def change(self, record: JobRecord) -> None:
        self.journal.change(record)

    def delete(self, job_id: int) -> None:
        self.journal.delete(job_id)

    @property
    def size(self) -> int:
        return self.journal.size

    @property
    def compact_floor(self) -> int:
        return self.journal.compact_floor

    @property
    def current_file(self) -> int:
        return self.journal.current_file

    def compact(self, next_id: int, jobs: Iterable[JobRecord]) -> int | None:
        return self.journal.compact(next_id, jobs)


class BeanstalkService:
    """Everything the beanstalkd connections of one server share (see the module docstring).

    ``sync``: None (never fsync while running, ``-F``), 0 (fsync before every reply, grouped:
    ``-f0``) or a period in ms (``-f MS``). ``log_dir``: None keeps jobs in memory only.
    """

    def __init__(
        self,
        ctx: ServerContext,
        log_dir: str | None,
        *,
        sync: int | None = 50,
        max_job_size: int = DEFAULT_MAX_JOB_SIZE,
        max_file_size: int = DEFAULT_MAX_FILE_SIZE,
    ) -> None:
        self.ctx = ctx
        self.loop = ctx.loop
        self.max_job_size = max_job_size
        self.max_file_size = max_file_size
        self.journal: JobJournal | None = None
        if log_dir is not None:
            committer = ctx.committer
            self.journal = JobJournal(
                log_dir, max_file_size, on_dirty=committer.journal_dirty, name=JOBLOG_NAME
            )
            committer.set_sync_mode(JOBLOG_NAME, sync)
        # Reserved jobs are reservations of the server's one table (its timer ends a TTR),
        # on the server's one clock (the store refuses a table on another).
        self.clock = ctx.clock
        self.store = JobStore(
            ctx.clock,
            None if self.journal is None else JournalLog(self.journal),
            ctx.reservations.table,
        )
        self.cmd_counts = [0] * COUNTED
        """The ``cmd-*`` counters, by command code (:data:`CMD_COUNTERS`' order)."""
        self.producers = 0
        """Connections open now that have sent a ``put`` (``current-producers``)."""
        self.workers = 0
        """Connections open now that have sent a reserve (``current-workers``)."""
        self.draining = False
        self.started = ctx.clock.monotonic_ms()
        self.instance_id = random_id()
        self.hostname = socket.gethostname()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0

    # ---- start and stop -------------------------------------------------------------------

    def replay(self) -> int:
        """Read the job log back into the store; the number of jobs restored."""
        if self.journal is None:
            return 0
        found = self.journal.replay()
        for job in found.jobs:
            self.store.restore(
                JobRecord(
                    job.job_id,
                    job.state,
                    job.pri,
                    job.delay,
                    job.deadline_ms,
                    job.counters,
                    job.tube,
                    job.ttr,
                    job.created_ms,
                    job.body,
                    job.file,
                )
            )
        self.store.next_id = max(self.store.next_id, found.next_id)
        if found.torn_bytes:
            log.warning("job log: cut %d bytes of torn tail", found.torn_bytes)
        self.ctx.collection.stats.journal_torn_tails += found.torn_tails  # as a queue's cuts
        self.rearm()
        return len(found.jobs)

    def stop(self) -> None:
        """Stop the timer, close the connections (their jobs go back to ready), write and
        sync the log, close it. (The listener and the context's committer are the server's
        to close.)"""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for conn in list(self.ctx.connections):
            if conn.front_end == FRONT_END:
                conn.close()
        self.ctx.committer.flush_now()
        if self.journal is not None:
            self.journal.close()

    # ---- the timer ------------------------------------------------------------------------

    def rearm(self) -> None:
        """Keep one timer at the store's next deadline, and the reservation table's timer at
        its next (a TTR); call after anything that may add or remove one. The table's timer
        is re-armed only when the store gave a reservation a new deadline (a put or a delete
        leaves it as it is: re-arming cost ~1.4k instructions per request)."""
        store = self.store
        if store.new_deadlines:
            store.new_deadlines = False
            self.ctx.reservations.arm()
        when = store.next_deadline()
        if when is None:
            return
        if self._timer is not None:
            if self._timer_at <= when:
                return
            self._timer.cancel()
        self._timer_at = when
        delay = max(0, when - self.clock.monotonic_ms()) / 1000
        self._timer = self.loop.call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        try:
            self.store.tick()
        except Exception:
            log.exception("beanstalk timer failed")
        self.rearm()

    # ---- stats ----------------------------------------------------------------------------

    def stats(self) -> list[tuple[str, int | str | bool | float]]:
        """``stats``' body: beanstalkd 1.12's keys in its order, then ``tercel-version``."""
        s = self.store.stats
        connections, total_connections = self.ctx.connection_counts(FRONT_END)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        j = self.journal
        uname = os.uname()
        pairs: list[tuple[str, int | str | bool | float]] = [
            ("current-jobs-urgent", s.urgent),
            ("current-jobs-ready", s.ready),
            ("current-jobs-reserved", s.reserved),
            ("current-jobs-delayed", s.delayed),
            ("current-jobs-buried", s.buried),
        ]
        pairs.extend(
            (f"cmd-{name}", n) for name, n in zip(CMD_COUNTERS, self.cmd_counts, strict=True)
        )
        pairs += [
            ("job-timeouts", s.job_timeouts),
            ("total-jobs", s.total_jobs),
            ("max-job-size", self.max_job_size),
            ("current-tubes", len(self.store.tubes)),
            ("current-connections", connections),
            ("current-producers", self.producers),
            ("current-workers", self.workers),
            ("current-waiting", s.waiting),
            ("total-connections", total_connections),
            ("pid", os.getpid()),
            ("version", PROTOCOL_VERSION),
            ("rusage-utime", usage.ru_utime),
            ("rusage-stime", usage.ru_stime),
            ("uptime", (self.clock.monotonic_ms() - self.started) // 1000),
            ("binlog-oldest-index", j.oldest_seq if j is not None else 0),
            ("binlog-current-index", j.seq if j is not None else 0),
            ("binlog-records-migrated", j.records_migrated if j is not None else 0),
            ("binlog-records-written", j.records_written if j is not None else 0),
            ("binlog-max-size", self.max_file_size),
            ("draining", self.draining),
            ("id", self.instance_id),
            ("hostname", self.hostname),
            ("os", uname.version),
            ("platform", platform.machine()),
            ("tercel-version", __version__),
        ]
        return pairs

    def counters(self) -> dict[str, int]:
        """The counters ``tercel serve`` adds to its stats under ``beanstalk`` (``curr_*`` are
        levels: gauges on the admin server; the rest count). The connection counts are the
        shared layer's (``curr_connections``, ``total_connections`` per front end)."""
        s = self.store.stats
        out = {
            f"cmd_{name.replace('-', '_')}": n
            for name, n in zip(CMD_COUNTERS, self.cmd_counts, strict=True)
        }
        out.update(
            curr_producers=self.producers,
            curr_workers=self.workers,
            curr_jobs_ready=s.ready,
            curr_jobs_reserved=s.reserved,
            curr_jobs_delayed=s.delayed,
            curr_jobs_buried=s.buried,
            curr_waiting=s.waiting,
            curr_tubes=len(self.store.tubes),
            total_jobs=s.total_jobs,
            job_timeouts=s.job_timeouts,
            # rotations and compactions of the job log put off for want of a descriptor
            job_log_put_off=0 if self.journal is None else self.journal.put_off,
        )
        return out

    def tube_counters(self) -> dict[str, dict[str, int]]:
        """Per tube, what ``stats-tube`` counts (the admin server's per-tube metrics, label
        ``tube``: ``curr_*`` gauges, the rest counters)."""
        return {
            name: {
                "curr_jobs_urgent": t.urgent_count,
                "curr_jobs_ready": t.ready_count,
                "curr_jobs_reserved": t.reserved_count,
                "curr_jobs_delayed": t.delayed_count,
                "curr_jobs_buried": t.buried_count,
                "total_jobs": t.total_jobs,
                "cmd_delete": t.cmd_delete,
                "cmd_pause_tube": t.cmd_pause,
            }
            for name, t in self.store.tubes.items()
        }
