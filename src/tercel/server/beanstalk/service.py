"""The beanstalkd front end's shared state: the job store, its log, group commit, the one
timer, the counters ``stats`` shows, and the listeners.

One :class:`BeanstalkService` runs inside ``tercel serve`` (``--beanstalk-port``, journaled in
``<data_dir>/beanstalk.d``, sharing the server's status) or alone under ``tercel beanstalkd``
(``-b DIR`` or memory only). Connections (:mod:`tercel.server.beanstalk.connection`) call the
store and then :meth:`BeanstalkService.rearm`, which keeps one loop timer set for the store's
next deadline (delayed job, TTR, wait timeout, DEADLINE_SOON, unpause).
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import resource
import socket
import time
from typing import TYPE_CHECKING, Any, Protocol, cast

from tercel import __version__
from tercel.core.tubes import JobRecord, JobStore
from tercel.journal.joblog import DEFAULT_MAX_FILE_SIZE, JobJournal
from tercel.protocol.beanstalk import DEFAULT_MAX_JOB_SIZE, random_id
from tercel.server.commit import Committer

if TYPE_CHECKING:
    from tercel.config import QueueConfig
    from tercel.server.beanstalk.connection import BeanstalkConnection
    from tercel.server.context import ServerContext

log = logging.getLogger("tercel.beanstalk")

JOBLOG_DIR = "beanstalk.d"
"""The job log's directory inside ``tercel serve``'s data dir (never a queue's file name)."""

CMD_COUNTERS = (
    "put",
    "peek",
    "peek-ready",
    "peek-delayed",
    "peek-buried",
    "reserve",
    "reserve-with-timeout",
    "delete",
    "release",
    "use",
    "watch",
    "ignore",
    "bury",
    "kick",
    "touch",
    "stats",
    "stats-job",
    "stats-tube",
    "list-tubes",
    "list-tube-used",
    "list-tubes-watched",
    "pause-tube",
)
"""The ``cmd-*`` counters of ``stats``, in beanstalkd's order (reserve-job and kick-job have
none in 1.12)."""


class Gate(Protocol):
    """The server's status flags (``ServerContext`` has them)."""

    writable: bool
    readable: bool


class SystemTubeClock:
    """The store's clocks: ``time.monotonic`` and the wall clock in epoch ms."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class BeanstalkService:
    """Everything the beanstalkd connections share (see the module docstring).

    ``sync``: None (never fsync while running, ``-F``), 0 (fsync before every reply, grouped:
    ``-f0``) or a period in ms (``-f MS``). ``log_dir``: None keeps jobs in memory only.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        log_dir: str | None,
        *,
        sync: int | None = 50,
        max_job_size: int = DEFAULT_MAX_JOB_SIZE,
        max_file_size: int = DEFAULT_MAX_FILE_SIZE,
        gate: Gate | None = None,
    ) -> None:
        self.loop = loop
        self.gate = gate
        """Under ``tercel serve``: the server's status (READONLY and QUIESCENT refuse puts
        with DRAINING; QUIESCENT also answers a reserve TIMED_OUT at once)."""
        self.max_job_size = max_job_size
        self.max_file_size = max_file_size
        self._sync = sync
        self.committer = Committer(loop, self._policy)
        self.journal: JobJournal | None = None
        if log_dir is not None:
            self.journal = JobJournal(log_dir, max_file_size, on_dirty=self._dirty)
        self.store = JobStore(SystemTubeClock(), self.journal)
        self.cmd = dict.fromkeys(CMD_COUNTERS, 0)
        self.connections: set[BeanstalkConnection] = set()
        self.total_connections = 0
        self.draining = False
        self.started = time.monotonic()
        self.instance_id = random_id()
        self.hostname = socket.gethostname()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._listeners: list[asyncio.Server] = []
        self._port = 0

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
                )
            )
        self.store.next_id = max(self.store.next_id, found.next_id)
        if found.torn_bytes:
            log.warning("job log: cut %d bytes of torn tail", found.torn_bytes)
        self.rearm()
        return len(found.jobs)

    async def listen(self, sock: socket.socket) -> str:
        """Serve connections on a bound, listening socket; its address for the logs."""
        from tercel.server.beanstalk.connection import BeanstalkConnection

        def factory() -> asyncio.BaseProtocol:
            return cast(asyncio.BaseProtocol, BeanstalkConnection(self))

        if sock.family == socket.AF_UNIX:
            server = await self.loop.create_unix_server(factory, sock=sock, backlog=1024)
        else:
            server = await self.loop.create_server(factory, sock=sock, backlog=1024)
        self._listeners.append(server)
        name: Any = sock.getsockname()  # a str (Unix) or a tuple
        if isinstance(name, str):
            return name
        if not self._port:
            self._port = int(name[1])
        return f"{name[0]}:{name[1]}"

    def port(self) -> int:
        """The TCP port of the first TCP listener (0 if none). (Read from the socket given to
        :meth:`listen`: uvloop's ``Server.sockets`` is a list where typeshed says tuple, which
        compiled code refuses.)"""
        return self._port

    async def stop(self) -> None:
        """Stop listening, return every reservation, write and sync the log, close it."""
        for server in self._listeners:
            server.close()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for conn in list(self.connections):
            conn.abort()
        self.committer.flush_now()
        if self.journal is not None:
            self.journal.close()
        self.committer.close()
        for server in self._listeners:
            await server.wait_closed()

    # ---- group commit ---------------------------------------------------------------------

    def _policy(self, name: str) -> int | None:
        return self._sync

    def _dirty(self, journal: JobJournal) -> None:
        self.committer.journal_dirty(journal)

    # ---- the timer ------------------------------------------------------------------------

    def rearm(self) -> None:
        """Keep one timer at the store's next deadline (call after anything that may add
        or remove one)."""
        when = self.store.next_deadline()
        if when is None:
            return
        if self._timer is not None:
            if self._timer_at <= when:
                return
            self._timer.cancel()
        self._timer_at = when
        self._timer = self.loop.call_later(max(0.0, when - time.monotonic()), self._fire)

    def _fire(self) -> None:
        self._timer = None
        try:
            self.store.tick()
        except Exception:
            log.exception("beanstalk timer failed")
        self.rearm()

    # ---- stats ----------------------------------------------------------------------------

    def stats(self) -> list[tuple[str, int | str | bool | float]]:
        """``stats``' body, in beanstalkd 1.12's key order."""
        s = self.store.stats
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
        pairs.extend((f"cmd-{name}", self.cmd[name]) for name in CMD_COUNTERS)
        pairs += [
            ("job-timeouts", s.job_timeouts),
            ("total-jobs", s.total_jobs),
            ("max-job-size", self.max_job_size),
            ("current-tubes", len(self.store.tubes)),
            ("current-connections", len(self.connections)),
            ("current-producers", sum(1 for c in self.connections if c.producer)),
            ("current-workers", sum(1 for c in self.connections if c.consumer)),
            ("current-waiting", s.waiting),
            ("total-connections", self.total_connections),
            ("pid", os.getpid()),
            ("version", f"{__version__} (tercel)"),
            ("rusage-utime", usage.ru_utime),
            ("rusage-stime", usage.ru_stime),
            ("uptime", int(time.monotonic() - self.started)),
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
        ]
        return pairs

    @property
    def writable(self) -> bool:
        """False while the server's status refuses new items."""
        return self.gate is None or self.gate.writable

    @property
    def readable(self) -> bool:
        """False while the server's status refuses reads."""
        return self.gate is None or self.gate.readable

    def counters(self) -> dict[str, int]:
        """The counters ``tercel serve`` adds to its stats under ``beanstalk`` (``curr_*`` are
        levels: gauges on the admin server; the rest count)."""
        s = self.store.stats
        out = {f"cmd_{name.replace('-', '_')}": n for name, n in self.cmd.items()}
        out.update(
            curr_connections=len(self.connections),
            total_connections=self.total_connections,
            curr_jobs_ready=s.ready,
            curr_jobs_reserved=s.reserved,
            curr_jobs_delayed=s.delayed,
            curr_jobs_buried=s.buried,
            curr_waiting=s.waiting,
            curr_tubes=len(self.store.tubes),
            total_jobs=s.total_jobs,
            job_timeouts=s.job_timeouts,
        )
        return out


# ---- inside ``tercel serve`` ------------------------------------------------------------------

_IN_SERVER: dict[object, BeanstalkService] = {}
"""The service of each running server, by its context (one per process in practice)."""


def start_in_server(ctx: ServerContext, data_dir: str, defaults: QueueConfig) -> BeanstalkService:
    """Create and replay the service of ``tercel serve``: journaled in ``<data_dir>/beanstalk.d``
    with the default queue settings' ``journal`` and ``sync_journal``, the server's status."""
    svc = BeanstalkService(
        ctx.loop,
        os.path.join(data_dir, JOBLOG_DIR) if defaults.journal else None,
        sync=defaults.sync_journal,
        gate=ctx,
    )
    restored = svc.replay()
    if restored:
        log.info("restored %d beanstalk job(s)", restored)
    ctx.add_counters("beanstalk", svc.counters)
    _IN_SERVER[ctx] = svc
    return svc


def connection_for(ctx: ServerContext) -> BeanstalkConnection:
    """A new connection to the service of ``ctx``'s server."""
    from tercel.server.beanstalk.connection import BeanstalkConnection

    return BeanstalkConnection(_IN_SERVER[ctx])


async def stop_in_server(ctx: ServerContext) -> None:
    """Close the connections, write and sync the job log, close it."""
    svc = _IN_SERVER.pop(ctx, None)
    if svc is not None:
        await svc.stop()
