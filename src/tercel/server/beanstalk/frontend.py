"""The beanstalkd front end's start hook: makes the :class:`~.service.BeanstalkService` of a
server, replays its job log, and makes each accepted socket's
:class:`~.connection.BeanstalkConnection` on that service.

``tercel serve --beanstalk-port`` starts it with :func:`start` (its settings from the server
config: the job log in ``<data_dir>/beanstalk.d``); ``tercel beanstalkd`` with
``functools.partial(start, settings=Settings(...))`` from beanstalkd's flags. The server's one
lifecycle (``server/app.py``) does the rest in both: listening, signals, the stop sequence.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from tercel.config import ServerConfig
from tercel.journal.joblog import DEFAULT_MAX_FILE_SIZE
from tercel.protocol.beanstalk import DEFAULT_MAX_JOB_SIZE
from tercel.server.beanstalk.connection import BeanstalkConnection
from tercel.server.beanstalk.service import JOBLOG_DIR, BeanstalkService
from tercel.server.connection import Connection
from tercel.server.context import ServerContext
from tercel.server.frontend import Running

log = logging.getLogger("tercel.beanstalk")


@dataclass(frozen=True)
class Settings:
    """The front end's own settings (beanstalkd's flags)."""

    log_dir: str | None
    """The job log's directory (``-b``); None: jobs in memory only, nothing written."""
    sync: int | None = 50
    """None: never fsync while running (``-F``); 0: before every reply, grouped (``-f0``);
    else at most every this many ms (``-f MS``)."""
    max_job_size: int = DEFAULT_MAX_JOB_SIZE
    max_file_size: int = DEFAULT_MAX_FILE_SIZE


def settings_in_server(config: ServerConfig) -> Settings:
    """``tercel serve``'s: journaled in ``<data_dir>/beanstalk.d`` with the default queue
    settings' ``journal`` and ``sync_journal``."""
    journal = config.defaults.journal
    log_dir = os.path.join(config.server.data_dir, JOBLOG_DIR) if journal else None
    return Settings(log_dir, sync=config.defaults.sync_journal)


class BeanstalkFrontEnd(Running):
    """The running beanstalkd front end of one server."""

    def __init__(self, ctx: ServerContext, settings: Settings) -> None:
        self.ctx = ctx
        self.service = BeanstalkService(
            ctx,
            settings.log_dir,
            sync=settings.sync,
            max_job_size=settings.max_job_size,
            max_file_size=settings.max_file_size,
        )
        self.counters = self.service.counters
        self.labelled = ("tube", self.service.tube_counters)

    def connection(self) -> Connection:
        return BeanstalkConnection(self.ctx, self.service)

    def drain(self) -> None:
        """Answer every later ``put`` with ``DRAINING`` (``tercel beanstalkd``'s SIGUSR1)."""
        self.service.draining = True
        log.warning("drain mode on: every put answers DRAINING")

    async def stop(self) -> None:
        self.service.stop()


def start(ctx: ServerContext, settings: Settings | None = None) -> BeanstalkFrontEnd:
    """Make the service and replay its job log (``settings`` None: ``tercel serve``'s, from
    ``ctx.config``). Raises JournalCorrupt for a job log that cannot be replayed, and
    BlockingIOError when another process holds its directory."""
    chosen = settings if settings is not None else settings_in_server(ctx.config)
    fe = BeanstalkFrontEnd(ctx, chosen)
    restored = fe.service.replay()
    if restored:
        log.info("restored %d beanstalk job(s) from %s", restored, chosen.log_dir)
    return fe
