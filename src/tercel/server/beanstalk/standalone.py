"""The event loop of ``tercel beanstalkd``.

It builds the same :class:`~tercel.server.context.ServerContext` as ``tercel serve``, with no
queues (an empty collection whose journals would be null), so the connections run on the
shared layer: group commit, connection accounting, parking, back-pressure. The flags and the
early bind are in :mod:`tercel.beanstalkd_cli`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
from typing import TYPE_CHECKING

from tercel.clock import SystemClock
from tercel.config import QueueConfig, ServerConfig
from tercel.core.collection import QueueCollection
from tercel.core.log import QueueLog
from tercel.errors import JournalCorrupt
from tercel.journal.memory import NullJournal
from tercel.server.beanstalk.service import BeanstalkService
from tercel.server.commit import Committer
from tercel.server.context import ServerContext
from tercel.server.loop import new_loop

if TYPE_CHECKING:
    from tercel.beanstalkd_cli import Options

log = logging.getLogger("tercel.beanstalk")

EXIT_LOCKED = 10
"""beanstalkd's exit code when another instance holds the ``-b`` directory."""
EXIT_CORRUPT = 3


def _no_journal(name: str, config: QueueConfig) -> QueueLog:
    return NullJournal()


def standalone_context(loop: asyncio.AbstractEventLoop) -> ServerContext:
    """A server context without queues: what the beanstalkd connections of ``tercel
    beanstalkd`` share (the job log registers its sync mode with the committer)."""
    config = ServerConfig()
    clock = SystemClock()
    collection = QueueCollection(config, _no_journal, clock)
    committer = Committer(loop, collection.sync_mode)
    return ServerContext(config, collection, committer, clock, loop)


async def _serve(opts: Options, sock: socket.socket) -> int:
    loop = asyncio.get_running_loop()
    ctx = standalone_context(loop)
    try:
        svc = BeanstalkService(
            ctx,
            opts.log_dir,
            sync=opts.sync,
            max_job_size=opts.max_job_size,
            max_file_size=opts.max_file_size,
        )
    except BlockingIOError:
        log.error("%s is in use by another server", opts.log_dir)
        return EXIT_LOCKED
    restored = svc.replay()
    if restored:
        log.info("restored %d job(s) from %s", restored, opts.log_dir)
    where = await svc.listen(sock)
    log.info("beanstalkd protocol on %s", where)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, _drain, svc)
    if opts.ports_file:
        with open(opts.ports_file, "w") as fh:
            fh.write(json.dumps({"beanstalk": svc.port()}))
    try:
        await stop.wait()
    finally:
        await svc.stop()
        ctx.reservations.close()
        ctx.committer.close()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
    return 0


def _drain(svc: BeanstalkService) -> None:
    svc.draining = True
    log.warning("drain mode on: every put answers DRAINING")


def run(opts: Options, sock: socket.socket) -> int:
    """Serve until SIGTERM/SIGINT; the exit code."""
    logging.basicConfig(
        level=logging.DEBUG if opts.verbose > 1 else logging.INFO if opts.verbose else 30,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        with asyncio.Runner(loop_factory=new_loop) as runner:
            return runner.run(_serve(opts, sock))
    except JournalCorrupt as exc:
        log.error("job log is corrupt, refusing to start: %s", exc)
        return EXIT_CORRUPT
