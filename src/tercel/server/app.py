"""The server: wires config -> journals -> queues -> listeners, and runs them until stopped.

This is the only place where the journal and the core meet: each queue gets a
:class:`~tercel.journal.FileJournal` (or a null journal) through ``open_log``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import importlib
import json
import logging
import os
import signal
import socket
import stat
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, cast

from tercel import __version__, native
from tercel.clock import Clock, SystemClock
from tercel.config import QueueConfig, ServerConfig, load_config
from tercel.core.collection import QueueCollection
from tercel.core.log import QueueLog
from tercel.errors import ConfigError, UnavailableError
from tercel.journal import FileJournal, NullJournal, list_queue_names
from tercel.journal.journal import run_inline
from tercel.server import stats
from tercel.server.commit import Committer
from tercel.server.leases import LeaseService
from tercel.server.memcache import Hub, MemcacheConnection
from tercel.server.metrics import Metrics
from tercel.server.status import Status, StatusKeeper

if TYPE_CHECKING:
    from tercel.server.admin import AdminServer

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
ADMIN = "tercel.server.admin"


class Server:
    """A running tercel server (create, ``await start()``, ``await serve()``, ``await stop()``)."""

    def __init__(
        self,
        config: ServerConfig,
        clock: Clock | None = None,
        memcache_socket: socket.socket | None = None,
    ) -> None:
        self.config = config
        self._memcache_socket = memcache_socket
        self.clock: Clock = clock or SystemClock()
        self.version = __version__
        self.loop = asyncio.get_running_loop()
        # One thread: compactions run one at a time, never beside each other's disk writes.
        self._compactor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tercel-compact")
        # The collection opens no journal before start(), so the committer can come second.
        self.collection = QueueCollection(config, self._open_log, self.clock)
        self.committer = Committer(self.loop, self.collection.sync_mode)
        self.leases = LeaseService(self)
        self.connections: set[MemcacheConnection] = set()
        self.total_connections = 0
        self.started_at = self.clock.now_ms()
        self.ports: dict[str, int] = {}
        self.status = StatusKeeper(config.server.data_dir)
        self.metrics = Metrics()
        self.hub = Hub(
            self.collection,
            self.committer,
            self.clock,
            self.metrics,
            self.loop,
            sample_every=config.server.latency_sample_every,
            tracks_idle=bool(config.server.client_timeout),
        )
        """Per-command state of the memcache handlers (flags, counters, the parts they use)."""
        self.admin: AdminServer | None = None
        self.stopping = False
        self._stop = asyncio.Event()
        self._listeners: list[asyncio.Server] = []
        self._timers: list[asyncio.TimerHandle] = []
        self._lock_fd = -1

    # ---- wiring ---------------------------------------------------------------------------

    @property
    def data_dir(self) -> str:
        return self.config.server.data_dir

    def _open_log(self, name: str, cfg: QueueConfig) -> QueueLog:
        if not cfg.journal:
            return NullJournal()
        return FileJournal(
            self.data_dir,
            name,
            on_dirty=self.committer.journal_dirty,
            background=self._background,
        )

    def _background(
        self, work: Callable[[], None], done: Callable[[BaseException | None], None]
    ) -> None:
        """Run journal work (snapshot writing) on a worker thread; ``done`` on the loop.

        Before the loop runs (replay at start-up) the work is done inline.
        """
        if not self.loop.is_running():
            run_inline(work, done)
            return

        def finished(fut: Future[None]) -> None:
            self.loop.call_soon_threadsafe(done, fut.exception())

        self._compactor.submit(work).add_done_callback(finished)

    # ---- start and stop -------------------------------------------------------------------

    async def start(self) -> None:
        """Lock the data dir, replay every journal, then bind the listeners."""
        os.makedirs(self.data_dir, exist_ok=True)
        self._lock_data_dir()
        self.status.load()
        self._status_changed()
        if self.status.current is not Status.UP:
            log.warning("status is %s (from %s)", self.status.current.name, self.status.path)
        compiled, stale = native.compiled_modules(), native.stale_modules()
        log.info("%d compiled module(s) (make native); pure Python otherwise", len(compiled))
        if stale:
            log.warning("compiled modules older than their sources (run make): %s", stale)
        t0 = time.monotonic()
        names = list_queue_names(self.data_dir)
        if names:
            log.info("replaying %d queue(s) from %s", len(names), self.data_dir)
        for i, name in enumerate(names, 1):
            self.collection.load([name])
            if time.monotonic() - t0 > 1:
                log.info("replayed %d/%d queues (%s)", i, len(names), name)
        self.committer.flush_now()
        if names:
            log.info(
                "replayed %d queue(s), %d items in %.2fs",
                len(names),
                self.collection.total_length,
                time.monotonic() - t0,
            )
        srv = self.config.server
        if srv.memcache_port is not None:
            if self._memcache_socket is not None:  # bound early by the command line
                listener = await self.loop.create_server(
                    self._memcache_protocol, sock=self._memcache_socket, backlog=1024
                )
            else:
                listener = await self.loop.create_server(
                    self._memcache_protocol, srv.host, srv.memcache_port, backlog=1024
                )
            self._listeners.append(listener)
            sock = listener.sockets[0].getsockname()
            self.ports["memcache"] = sock[1]
            log.info("memcache listening on %s:%d", sock[0], sock[1])
        if srv.admin_port is not None:
            # aiohttp and prometheus-client take longer to import than everything else
            # together: import them on a thread, so the loop serves memcache meanwhile.
            admin = await self.loop.run_in_executor(None, importlib.import_module, ADMIN)
            self.admin = admin.AdminServer(self)
            self.ports["admin"] = await self.admin.start(srv.host, srv.admin_port)
            log.info("admin HTTP listening on %s:%d", srv.host, self.ports["admin"])
        self._schedule_sweeps()

    def _lock_data_dir(self) -> None:
        fd = os.open(os.path.join(self.data_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ConfigError(f"data dir {self.data_dir} is in use by another tercel") from None
        self._lock_fd = fd

    def write_ports_file(self, path: str) -> None:
        """Write ``{"memcache": N, ...}``: atomically (tmp file, then rename) for a regular
        file, directly for a FIFO (which lets a supervisor wait for it without polling)."""
        text = json.dumps(self.ports)
        if os.path.exists(path) and stat.S_ISFIFO(os.stat(path).st_mode):
            with open(path, "w") as fh:
                fh.write(text)
            return
        tmp = f"{path}.tmp"
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)

    def request_stop(self) -> None:
        """Ask :meth:`serve` to return (signal handlers, ``shutdown``)."""
        self._stop.set()

    async def serve(self) -> None:
        """Run until :meth:`request_stop`."""
        await self._stop.wait()

    async def stop(self) -> None:
        """Stop accepting, end every session (open reads go back), write, fsync, close."""
        self.stopping = True
        self._status_changed()
        for listener in self._listeners:
            listener.close()
        for handle in self._timers:
            handle.cancel()
        self.leases.close()
        if self.admin is not None:
            await self.admin.stop()
        for conn in list(self.connections):
            conn.session.close()
        self.committer.flush_now()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        # Let a running compaction finish writing (off the loop), then switch over.
        await self.loop.run_in_executor(None, self._compactor.shutdown)
        await asyncio.sleep(0)
        self.collection.close()
        self.committer.close()
        for listener in self._listeners:
            await listener.wait_closed()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    # ---- connections ----------------------------------------------------------------------

    def _memcache_protocol(self) -> asyncio.BaseProtocol:
        # A duck-typed protocol (see MemcacheConnection): the loop only calls its methods.
        return cast(asyncio.BaseProtocol, MemcacheConnection(self))

    def connection_opened(self, conn: MemcacheConnection) -> bool:
        """Count a new connection; False when ``max_connections`` refuses it."""
        limit = self.config.server.max_connections
        if self.stopping or (limit is not None and len(self.connections) >= limit):
            return False
        self.connections.add(conn)
        self.total_connections += 1
        return True

    def connection_closed(self, conn: MemcacheConnection) -> None:
        self.connections.discard(conn)

    def _status_changed(self) -> None:
        # Handlers test these two flags on every command instead of asking the status.
        self.hub.writable = not self.stopping and self.status.current.writable
        self.hub.readable = not self.stopping and self.status.current.readable

    def check_writable(self) -> None:
        """Raise UnavailableError when writes are refused (shutdown, READONLY, QUIESCENT)."""
        if self.stopping:
            raise UnavailableError("server is shutting down")
        self.status.check_writable()

    def check_readable(self) -> None:
        """Raise UnavailableError when reads are refused (shutdown, QUIESCENT)."""
        if self.stopping:
            raise UnavailableError("server is shutting down")
        self.status.check_readable()

    def set_status(self, status: Status) -> None:
        """Persist and apply a new status. Raises OSError (status unchanged) when the status
        file cannot be written."""
        self.status.set(status)
        self._status_changed()

    # ---- background work ------------------------------------------------------------------

    def _schedule_sweeps(self) -> None:
        period = self.config.server.expiration_timer_frequency / 1000
        if period > 0:
            self._timers.append(self.loop.call_later(period, self._sweep))
        timeout = self.config.server.client_timeout
        if timeout:
            self._timers.append(self.loop.call_later(min(timeout / 2000, 1.0), self._reap_idle))

    def _sweep(self) -> None:
        self._timers = [
            t for t in self._timers if not t.cancelled() and t.when() > self.loop.time()
        ]
        try:
            self.collection.flush_all_expired()
            for name in self.collection.delete_expired_queues():
                log.info("deleted queue %s: empty and older than its max_queue_age", name)
        except Exception:
            log.exception("expiry sweep failed")
        if not self.stopping:
            period = self.config.server.expiration_timer_frequency / 1000
            self._timers.append(self.loop.call_later(period, self._sweep))

    def _reap_idle(self) -> None:
        timeout = self.config.server.client_timeout
        if not timeout or self.stopping:
            return
        cutoff = self.loop.time() - timeout / 1000
        for conn in list(self.connections):
            if conn.blocked is None and conn.last_active < cutoff and conn.transport is not None:
                conn.transport.close()
        self._timers.append(self.loop.call_later(min(timeout / 2000, 1.0), self._reap_idle))

    # ---- operations -----------------------------------------------------------------------

    def reload(self) -> None:
        """Re-read the config file and apply its queue settings and aliases to live queues.

        Raises ConfigError (the old config stays) when the file is bad. ``[server]`` settings
        need a restart and are kept as they are.
        """
        source = self.config.source
        if source is None:
            return
        fresh = load_config(source)
        self.config = ServerConfig(
            self.config.server, fresh.defaults, fresh.overrides, fresh.aliases, source
        )
        self.collection.reload(self.config)
        log.info("reloaded config from %s", source)

    def stats_lines(self) -> list[tuple[str, object]]:
        return stats.stats_lines(self)

    def dump_stats(self, names: tuple[str, ...]) -> list[tuple[str, list[tuple[str, object]]]]:
        return stats.dump_stats(self, names)

    def dump_config(self) -> list[tuple[str, list[tuple[str, object]]]]:
        """One block per existing queue with its resolved settings, then one per alias."""
        blocks: list[tuple[str, list[tuple[str, object]]]] = []
        for q in sorted(self.collection, key=lambda q: q.name):
            blocks.append((q.name, list(q.config.describe())))
        for name, dests in sorted(self.config.aliases.items()):
            blocks.append((name, [("alias_of", ",".join(dests))]))
        return blocks


async def run_server(
    config: ServerConfig,
    ports_file: str | None = None,
    reload_signal: bool = True,
    memcache_socket: socket.socket | None = None,
) -> None:
    """Start a server, install signal handlers, serve until told to stop, stop cleanly."""
    server = Server(config, memcache_socket=memcache_socket)
    await server.start()
    if ports_file:
        server.write_ports_file(ports_file)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.request_stop)
    if reload_signal:
        loop.add_signal_handler(signal.SIGHUP, _reload_logged, server)
    try:
        await server.serve()
    finally:
        log.info("shutting down")
        await server.stop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)


def _reload_logged(server: Server) -> None:
    try:
        server.reload()
    except ConfigError as exc:
        log.error("reload refused, keeping the old config: %s", exc)
