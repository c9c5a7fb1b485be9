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
from collections.abc import Iterable, Iterator, Sequence
from typing import Final, NamedTuple

from tercel import __version__
from tercel.core.tubes import JobRecord, JobStore, NativeJobLog, Tube
from tercel.journal.joblog import DEFAULT_MAX_FILE_SIZE, SERVE_DIR, JobJournal
from tercel.protocol.beanstalk import COUNTED, DEFAULT_MAX_JOB_SIZE, OPS, random_id
from tercel.server import figures
from tercel.server.context import ServerContext
from tercel.server.figures import ADMIN, COUNTER, GAUGE, LABEL, WIRE, Figure, Kind, Reading

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

    def put_keyed(  # noqa: PLR0917 (as JobLog.put_keyed)
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
        key: str,
    ) -> int:
        return self.journal.put_keyed(
            job_id, state, pri, delay, deadline_ms, tube, ttr, created_ms, body, key
        )

    def change(self, record: JobRecord) -> None:
        self.journal.change(record)

    def delete(self, job_id: int) -> None:
        self.journal.delete(job_id)

    @property
    def failed(self) -> bool:
        return self.journal.failed

    @property
    def size(self) -> int:
        return self.journal.size

    @property
    def compact_floor(self) -> int:
        return self.journal.compact_floor

    @property
    def current_file(self) -> int:
        return self.journal.current_file

    def compact(
        self, next_id: int, jobs: Iterable[JobRecord], keys: Sequence[tuple[str, int, int]] = ()
    ) -> int | None:
        return self.journal.compact(next_id, jobs, keys)


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
        defaults = ctx.config.defaults  # put-key's dedup keys: the queue defaults' window
        self.store.dedup.reconfigure(defaults.dedup_window_ms, defaults.max_dedup_keys)
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
        if found.keys:
            self.store.restore_keys(found.keys)
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

    # ---- stats (the figures: SERVER_FIGURES, TUBE_FIGURES below) --------------------------

    def stats(self) -> list[tuple[str, int | str | bool | float]]:
        """``stats``' body, in beanstalkd 1.12's key order."""
        return figures.keyed(figures.read(_WIRE, self), WIRE)

    def tube_stats(self, tube: Tube) -> list[tuple[str, int | str | bool | float]]:
        """``stats-tube``'s body, in beanstalkd 1.12's key order."""
        return figures.keyed(figures.read(_TUBE_WIRE, TubeSource(self.store, tube)), WIRE)

    def counters(self) -> list[Reading]:
        """The figures ``tercel serve`` adds to its stats under ``beanstalk`` (the connection
        counts are the shared layer's: ``curr_connections``, ``total_connections``)."""
        return figures.read(_ADMIN, self)

    def tube_counters(self) -> Iterator[tuple[str, list[Reading]]]:
        """Per tube, the ``stats-tube`` figures the admin server exports (label ``tube``),
        read as they are asked for (a tube freed meanwhile: as it was)."""
        store = self.store
        for name, t in list(store.tubes.items()):
            yield name, figures.read(_TUBE_ADMIN, TubeSource(store, t))


# ---- beanstalkd's figures ------------------------------------------------------------------


def _cmd(name: str, code: int) -> Figure[BeanstalkService]:
    return Figure(
        f"cmd-{name}",
        COUNTER,
        f"beanstalkd {name} commands received.",
        lambda s: s.cmd_counts[code],
        f"cmd_{name.replace('-', '_')}",
    )


def _journal(name: str, attr: str, help_text: str) -> Figure[BeanstalkService]:
    return Figure(
        name,
        GAUGE,
        help_text,
        lambda s: 0 if s.journal is None else getattr(s.journal, attr),
        None,
    )


SERVER_FIGURES: Final[tuple[Figure[BeanstalkService], ...]] = (
    Figure(
        "current-jobs-urgent",
        GAUGE,
        "beanstalkd jobs ready of priority below 1024.",
        lambda s: s.store.stats.urgent,
        None,
    ),
    Figure(
        "current-jobs-ready",
        GAUGE,
        "beanstalkd jobs ready.",
        lambda s: s.store.stats.ready,
        "curr_jobs_ready",
    ),
    Figure(
        "current-jobs-reserved",
        GAUGE,
        "beanstalkd jobs reserved now.",
        lambda s: s.store.stats.reserved,
        "curr_jobs_reserved",
    ),
    Figure(
        "current-jobs-delayed",
        GAUGE,
        "beanstalkd jobs waiting for their delay.",
        lambda s: s.store.stats.delayed,
        "curr_jobs_delayed",
    ),
    Figure(
        "current-jobs-buried",
        GAUGE,
        "beanstalkd jobs buried.",
        lambda s: s.store.stats.buried,
        "curr_jobs_buried",
    ),
    *(_cmd(name, code) for code, name in enumerate(CMD_COUNTERS)),
    Figure(
        "job-timeouts",
        COUNTER,
        "beanstalkd reservations ended by their TTR.",
        lambda s: s.store.stats.job_timeouts,
        "job_timeouts",
    ),
    Figure(
        "total-jobs",
        COUNTER,
        "beanstalkd jobs put.",
        lambda s: s.store.stats.total_jobs,
        "total_jobs",
    ),
    Figure("max-job-size", GAUGE, "Largest job body accepted.", lambda s: s.max_job_size, None),
    Figure(
        "current-tubes",
        GAUGE,
        "beanstalkd tubes that exist.",
        lambda s: len(s.store.tubes),
        "curr_tubes",
    ),
    Figure(
        "current-connections",
        GAUGE,
        "beanstalkd connections open now.",
        lambda s: s.ctx.connection_counts(FRONT_END)[0],
        None,
    ),
    Figure(
        "current-producers",
        GAUGE,
        "beanstalkd connections open now that have sent a put.",
        lambda s: s.producers,
        "curr_producers",
    ),
    Figure(
        "current-workers",
        GAUGE,
        "beanstalkd connections open now that have sent a reserve.",
        lambda s: s.workers,
        "curr_workers",
    ),
    Figure(
        "current-waiting",
        GAUGE,
        "beanstalkd reserves waiting for a job.",
        lambda s: s.store.stats.waiting,
        "curr_waiting",
    ),
    Figure(
        "total-connections",
        COUNTER,
        "beanstalkd connections accepted.",
        lambda s: s.ctx.connection_counts(FRONT_END)[1],
        None,
    ),
    Figure("pid", LABEL, "The server's process id.", lambda s: os.getpid(), None),
    Figure(
        "version",
        LABEL,
        "The beanstalkd protocol version served (clients gate features on it).",
        lambda s: PROTOCOL_VERSION,
        None,
    ),
    Figure(
        "rusage-utime",
        COUNTER,
        "User CPU seconds of the process.",
        lambda s: resource.getrusage(resource.RUSAGE_SELF).ru_utime,
        None,
    ),
    Figure(
        "rusage-stime",
        COUNTER,
        "System CPU seconds of the process.",
        lambda s: resource.getrusage(resource.RUSAGE_SELF).ru_stime,
        None,
    ),
    Figure(
        "uptime",
        GAUGE,
        "Seconds since the beanstalkd front end started.",
        lambda s: (s.clock.monotonic_ms() - s.started) // 1000,
        None,
    ),
    _journal("binlog-oldest-index", "oldest_seq", "Number of the oldest job log file."),
    _journal("binlog-current-index", "seq", "Number of the job log file written now."),
    _journal("binlog-records-migrated", "records_migrated", "Job records moved by compaction."),
    _journal("binlog-records-written", "records_written", "Job records written."),
    Figure(
        "binlog-max-size",
        GAUGE,
        "Largest job log file, in bytes.",
        lambda s: s.max_file_size,
        None,
    ),
    Figure("draining", LABEL, "Whether puts are refused.", lambda s: s.draining, None),
    Figure("id", LABEL, "This process's random id.", lambda s: s.instance_id, None),
    Figure("hostname", LABEL, "The host's name.", lambda s: s.hostname, None),
    Figure("os", LABEL, "The kernel's version.", lambda s: os.uname().version, None),
    Figure("platform", LABEL, "The machine's architecture.", lambda s: platform.machine(), None),
    Figure("tercel-version", LABEL, "tercel's own version.", lambda s: __version__, None),
    Figure(
        "dedup-keys",
        GAUGE,
        "put-key's dedup keys held (remembered for the queue defaults' dedup_window_ms).",
        lambda s: len(s.store.dedup),
        "dedup_keys",
        omit_zero=True,  # stats stays beanstalkd's until a put-key
    ),
    Figure(
        "dedup-duplicates",
        COUNTER,
        "put-key commands answered with an earlier put-key's job id (nothing put).",
        lambda s: s.store.dedup.duplicates,
        "dedup_duplicates",
        omit_zero=True,  # stats stays beanstalkd's until a put-key
    ),
    Figure(
        "job-log-put-off",
        COUNTER,
        "Job log rotations and compactions put off for want of a descriptor.",
        lambda s: 0 if s.journal is None else s.journal.put_off,
        "job_log_put_off",
        wire=False,
    ),
)
"""The server-wide figures: ``stats``' keys in beanstalkd 1.12's order, and what ``tercel
serve`` shows under ``beanstalk`` (``admin``)."""


class TubeSource(NamedTuple):
    """What a tube's figures read."""

    store: JobStore
    tube: Tube


def _tube(
    name: str, kind: Kind, help_text: str, attr: str, admin: str | None
) -> Figure[TubeSource]:
    return Figure(name, kind, help_text, lambda s: getattr(s.tube, attr), admin)


TUBE_FIGURES: Final[tuple[Figure[TubeSource], ...]] = (
    _tube("name", LABEL, "The tube's name.", "name", None),
    _tube(
        "current-jobs-urgent",
        GAUGE,
        "Ready beanstalkd jobs of priority below 1024.",
        "urgent_count",
        "curr_jobs_urgent",
    ),
    _tube(
        "current-jobs-ready",
        GAUGE,
        "beanstalkd jobs ready in the tube.",
        "ready_count",
        "curr_jobs_ready",
    ),
    _tube(
        "current-jobs-reserved",
        GAUGE,
        "beanstalkd jobs of the tube reserved now.",
        "reserved_count",
        "curr_jobs_reserved",
    ),
    _tube(
        "current-jobs-delayed",
        GAUGE,
        "beanstalkd jobs of the tube waiting for their delay.",
        "delayed_count",
        "curr_jobs_delayed",
    ),
    _tube(
        "current-jobs-buried",
        GAUGE,
        "beanstalkd jobs of the tube buried.",
        "buried_count",
        "curr_jobs_buried",
    ),
    _tube("total-jobs", COUNTER, "beanstalkd jobs put into the tube.", "total_jobs", "total_jobs"),
    _tube("current-using", GAUGE, "Connections using the tube.", "using", None),
    _tube("current-watching", GAUGE, "Connections watching the tube.", "watching", None),
    Figure(
        "current-waiting",
        GAUGE,
        "Reserves waiting on the tube.",
        lambda s: len(s.tube.waiting),
        None,
    ),
    _tube(
        "cmd-delete",
        COUNTER,
        "beanstalkd delete commands on jobs of the tube.",
        "cmd_delete",
        "cmd_delete",
    ),
    _tube(
        "cmd-pause-tube",
        COUNTER,
        "beanstalkd pause-tube commands on the tube.",
        "cmd_pause",
        "cmd_pause_tube",
    ),
    _tube("pause", GAUGE, "Seconds of the tube's pause.", "pause", None),
    Figure(
        "pause-time-left",
        GAUGE,
        "Seconds left of the tube's pause.",
        lambda s: s.store.pause_left(s.tube),
        None,
    ),
)
"""A tube's figures: ``stats-tube``'s keys in beanstalkd 1.12's order, and what the admin port
exports per tube (label ``tube``)."""

_WIRE: Final = figures.shown(SERVER_FIGURES, WIRE)
_ADMIN: Final = figures.shown(SERVER_FIGURES, ADMIN)
_TUBE_WIRE: Final = figures.shown(TUBE_FIGURES, WIRE)
_TUBE_ADMIN: Final = figures.shown(TUBE_FIGURES, ADMIN)
