"""The composition root: wires config -> journals -> queues -> context -> front ends, and runs
them until stopped: the one lifecycle of ``tercel serve`` and ``tercel beanstalkd``. Imported by
nothing but the command lines (and ``bench/``).

The journal and the core meet through :mod:`tercel.storage` only: each queue gets its journal
from ``storage.open_log``, and the data dir's one lock is ``storage.DataDirLock``. The front
ends come from :data:`FRONT_ENDS`, one row per front end (``server/frontend.py``): the
``[server]`` key of its port and the loader of its start hook (docs/architecture.md, "How to
add a front end"). :class:`Server` starts each row that listens through its hook and stops it
in its one stop sequence; ``tercel beanstalkd`` runs the same server on its own row, without
the data dir's queues (``queues=False``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import stat
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, cast

from tercel import storage
from tercel.clock import Clock, SystemClock
from tercel.config import QueueConfig, ServerConfig
from tercel.core.collection import QueueCollection
from tercel.core.log import QueueLog
from tercel.errors import ConfigError, TooManyOpenFiles
from tercel.server.admin_rules import check_admin_settings
from tercel.server.commit import Committer
from tercel.server.context import ServerContext
from tercel.server.frontend import FrontEnd, Running, StartHook, stateless
from tercel.server.status import Status

if TYPE_CHECKING:
    import ssl
    from concurrent.futures import Future, ThreadPoolExecutor

    from tercel.server.admin import AdminServer
    from tercel.server.tls import ServerTLS

log = logging.getLogger(__name__)


def _memcache() -> StartHook:
    """Imported here like the others (a server without a memcache port, ``tercel
    beanstalkd``'s, does not load it)."""
    from tercel.server.memcache.connection import MemcacheConnection

    return stateless(MemcacheConnection)


def _text() -> StartHook:
    from tercel.server.text.connection import TextConnection

    return stateless(TextConnection)


def _thrift() -> StartHook:
    """thriftpy2 and the IDL it parses cost ~60 ms of start-up that servers without a Thrift
    port should not pay, so this runs only when the Thrift port is configured."""
    from tercel.server.thrift.connection import ThriftConnection

    return stateless(ThriftConnection)


def _beanstalk() -> StartHook:
    """The beanstalkd front end keeps its own job store and job log (its start hook makes
    them and replays the log; its stop writes and closes it)."""
    from tercel.server.beanstalk.frontend import start

    return start


FRONT_ENDS: tuple[FrontEnd, ...] = (
    FrontEnd("memcache", "memcache_port", _memcache),
    FrontEnd("text", "text_port", _text),
    FrontEnd("thrift", "thrift_port", _thrift),
    FrontEnd("beanstalk", "beanstalk_port", _beanstalk),
)
"""Every front end ``tercel serve`` has; a listener is started for each whose port is
configured."""


def listener_table(
    config: ServerConfig,
    front_ends: Sequence[FrontEnd] = FRONT_ENDS,
    bound: Iterable[str] = (),
) -> list[tuple[FrontEnd, int]]:
    """The rows of ``front_ends`` to start under ``config``, with their configured ports (0:
    any free one): those whose ``[server]`` setting gives a port, and those whose socket was
    bound for them (``bound``: their names; the socket is used, the port is not). Raises
    ConfigError for a port given to a front end that is not built."""
    given = set(bound)
    table: list[tuple[FrontEnd, int]] = []
    for fe in front_ends:
        port: int | None = None if fe.setting is None else getattr(config.server, fe.setting)
        if port is None and fe.name in given:
            port = 0
        if port is None:
            continue
        if fe.load is None:
            raise ConfigError(f"server.{fe.setting}: the {fe.name} front end is not built yet")
        table.append((fe, port))
    return table


def _load(fe: FrontEnd) -> StartHook:
    assert fe.load is not None  # listener_table() lists built front ends only
    return fe.load()


def _import_admin() -> ModuleType:
    from tercel.server import admin

    return admin


ADMIN_AFTER_REPLAY_S = 1.0
"""The admin listener's import (and the build's log line) waits for the background replay
to end, at most this long: the import thread takes the GIL each time the replay reads (and
they share one CPU when the server is pinned), which made the first item ~20 % later at a
restart (docs/benchmarks.md)."""
REPLAY_LOG_EVERY_S = 2.0
"""Start-up replay logs its progress at most this often (and any queue that took longer)."""
REPLAY_SLICE_S = 0.005
"""The background replay yields to the loop once this long has passed since the last yield,
after the queue or the step (about a MiB of one journal) that ends then: small queues replay
many per loop pass (a pass per queue cost about a third more CPU at 100,000 queues), and a
command on a queue replayed (or new) waits at most this plus one step."""


def _no_queues(name: str, cfg: QueueConfig) -> QueueLog:
    raise ConfigError(f"queue {name}: this server serves no queues")


class Server:
    """A running tercel server (create, ``await start()``, ``await serve()``, ``await stop()``).

    ``front_ends``: the listener table's rows (``tercel serve``'s :data:`FRONT_ENDS` by
    default). ``queues``: serve the Kestrel queues of the config's data dir (lock it, read its
    status file, replay its journals, sweep expired items); False for a server whose front ends
    keep their own state (``tercel beanstalkd``): nothing is then read or written there, and
    the collection stays empty. Handlers never see this object: they get its :attr:`ctx`.
    """

    def __init__(
        self,
        config: ServerConfig,
        clock: Clock | None = None,
        sockets: dict[str, socket.socket] | None = None,
        *,
        front_ends: Sequence[FrontEnd] = FRONT_ENDS,
        queues: bool = True,
    ) -> None:
        self._sockets = dict(sockets or {})
        """Listening sockets bound early by the command line, by front-end name."""
        self.front_ends = tuple(front_ends)
        self.queues = queues
        self.running: dict[str, Running] = {}
        """The started front ends by name, in start order (their hooks' results)."""
        self.clock: Clock = clock or SystemClock()
        self.loop = asyncio.get_running_loop()
        self._compactor: ThreadPoolExecutor | None = None
        """The thread of :meth:`_background` (made at its first use: not before serving)."""
        # The collection opens no journal before start(), so the committer can come second.
        # Without queues it stays empty: it refuses to open one (nothing locks the data dir).
        open_log = self._open_log if queues else _no_queues
        self.collection = QueueCollection(config, open_log, self.clock)
        self.files = storage.DataDir(config.server.data_dir)
        """The data dir's one listing and descriptor pool (bounded by :meth:`start`)."""
        self.committer = Committer(self.loop, self.collection.sync_mode)
        # Every journal gets these same two bound methods (one pair per queue: 14 MB at
        # 100,000 queues).
        self._journal_dirty: Callable[[storage.FileJournal], None] = self.committer.journal_dirty
        self._in_background: storage.Background = self._background
        self.ctx = ServerContext(config, self.collection, self.committer, self.clock, self.loop)
        """What every front end's handlers use (``server/context.py``)."""
        self.admin: AdminServer | None = None
        self.tls: ServerTLS | None = None
        """The TLS listeners' contexts (``[tls]``; made by :meth:`start`), or None."""
        self._listeners: list[asyncio.Server] = []
        self._timers: list[asyncio.TimerHandle] = []
        self._lock: storage.DataDirLock | None = None
        self._replayer: asyncio.Task[None] | None = None
        self.failure: BaseException | None = None
        """What stopped the background replay (re-raised by :func:`run_server`)."""

    # ---- wiring ---------------------------------------------------------------------------

    @property
    def config(self) -> ServerConfig:
        return self.ctx.config

    @property
    def data_dir(self) -> str:
        return self.config.server.data_dir

    @property
    def ports(self) -> dict[str, int]:
        return self.ctx.ports

    def _open_log(self, name: str, cfg: QueueConfig) -> QueueLog:
        return storage.open_log(
            self.data_dir,
            name,
            cfg,
            on_dirty=self._journal_dirty,
            background=self._in_background,
            directory=self.files,
        )

    def _background(
        self, work: Callable[[], None], done: Callable[[BaseException | None], None]
    ) -> None:
        """Run journal work (snapshot writing) on a worker thread; ``done`` on the loop.

        Before the loop runs the work is done inline (start-up replays with the loop running).
        """
        if not self.loop.is_running():
            storage.run_inline(work, done)
            return

        def finished(fut: Future[None]) -> None:
            self.loop.call_soon_threadsafe(done, fut.exception())

        if self._compactor is None:
            from concurrent.futures import ThreadPoolExecutor

            # One thread: compactions run one at a time, never beside each other's writes.
            self._compactor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tercel-compact")
        self._compactor.submit(work).add_done_callback(finished)

    # ---- start and stop -------------------------------------------------------------------

    async def start(self) -> None:
        """Lock the data dir, list its queues, start the front ends (their hooks) and their
        listeners, then the admin listener and the background replay.

        Everything that may fail at start-up is done before the first listener serves (a
        journal found corrupt by the background replay stops the server, see
        :meth:`_replay_in_background`). The queues on disk are not replayed before serving:
        each replays at its first reference or in the background, one after another
        (:meth:`QueueCollection.defer`), so a command waits only for its own queue's replay.
        """
        srv = self.config.server
        table = listener_table(self.config, self.front_ends, self._sockets)
        if self.queues:
            os.makedirs(self.data_dir, exist_ok=True)
            self._lock_data_dir()
        if srv.admin_port is not None:
            check_admin_settings(srv)  # a ConfigError now, not once the others serve
        # The configured front ends' modules (thriftpy2 and its IDL for Thrift). Not on a
        # thread: nothing else runs meanwhile (the journals replay after serving), and a thread
        # and its pool's imports cost the memcache-only start ~2 ms.
        hooks = [_load(fe) for fe, _ in table]
        ctx = self.ctx
        self._start_tls(table)
        if self.queues:
            ctx.status.load()
            ctx.status_changed()
            if ctx.status.current is not Status.UP:
                log.warning("status is %s (from %s)", ctx.status.current.name, ctx.status.path)
            self._list_queues()
        for (fe, _), hook in zip(table, hooks, strict=True):
            self._start_front_end(fe, hook)
        for fe, port in table:
            listener = await self._listen(fe, port, self.running[fe.name])
            self._listeners.append(listener)
            ctx.ports[fe.name] = self._listening(fe, listener, self._ssl(fe.name) is not None)
        await self._listen_tls_ports(table)
        # Serving from here on. What follows is not needed by the first command.
        self._schedule_sweeps()
        if self.queues:
            self._replayer = self.loop.create_task(self._replay_in_background())
            # The rest waits for the background replay to end (or ADMIN_AFTER_REPLAY_S): the
            # first commands wait for their queues' replay, not for this.
            await asyncio.wait({self._replayer}, timeout=ADMIN_AFTER_REPLAY_S)
            self._log_build()
        if srv.admin_port is not None:
            # aiohttp and prometheus-client take longer to import than everything else
            # together: on a thread, while the other listeners already serve.
            admin = await self.loop.run_in_executor(None, _import_admin)
            self.admin = admin.AdminServer(ctx)
            sock = self._sockets.pop("admin", None)
            tls = self._ssl("admin")
            ctx.ports["admin"] = await self.admin.start(
                srv.host, srv.admin_port, sock=sock, ssl_context=tls
            )
            log.info(
                "admin HTTP%s listening on %s:%d", "S" if tls else "", srv.host, ctx.ports["admin"]
            )

    # ---- TLS ------------------------------------------------------------------------------

    def _start_tls(self, table: Sequence[tuple[FrontEnd, int]]) -> None:
        """Make the TLS contexts (``[tls]``: a ConfigError before anything listens), have
        ``reload`` read the certificates again, and warn of plaintext beyond loopback."""
        tls = self.config.tls
        if tls is not None:
            from tercel.server.tls import ServerTLS

            self.tls = ServerTLS(tls)
            self.ctx.reload_hooks.append(self.tls.reload)
            running = {fe.name for fe, _ in table}
            for name in tls.ports:
                if name not in running:
                    raise ConfigError(f"tls.ports.{name}: the {name} front end is not running")
        names = [fe.name for fe, _ in table]
        if self.config.server.admin_port is not None:
            names.append("admin")
        warn_exposed(self.config, [n for n in names if self._ssl(n) is None])

    def _ssl(self, name: str) -> ssl.SSLContext | None:
        """The context of listener ``name``, or None when it is plaintext."""
        if self.tls is None or not self.tls.listens(name):
            return None
        return self.tls.base

    async def _listen_tls_ports(self, table: Sequence[tuple[FrontEnd, int]]) -> None:
        """The second, TLS-only listeners of ``[tls] ports`` (``<name>_tls`` in the ports)."""
        if self.tls is None:
            return
        for fe, _ in table:
            port = self.tls.settings.ports.get(fe.name)
            if port is None:
                continue
            listener = await self._create(fe, self.running[fe.name], None, port, self.tls.base)
            self._listeners.append(listener)
            self.ctx.ports[f"{fe.name}_tls"] = self._listening(fe, listener, True)

    def _log_build(self) -> None:
        """Log which modules run compiled, and warn of stale ones. (Not in ``tercel
        beanstalkd``, which never did: importing pathlib and importlib and walking the package
        holds the loop for tens of ms at a cold start, and client test suites send their first
        request right after starting the binary.)"""
        from tercel import native  # (pathlib and importlib, and a walk of the package)

        compiled, stale = native.compiled_modules(), native.stale_modules()
        log.info("%s", native.build_summary(compiled))
        if stale:
            log.warning("compiled modules older than their sources (run make): %s", stale)

    def _start_front_end(self, fe: FrontEnd, hook: StartHook) -> None:
        """Run ``fe``'s start hook (it may raise: nothing listens yet) and register its
        figures under its name."""
        running = hook(self.ctx)
        self.running[fe.name] = running
        if running.counters is not None:
            self.ctx.add_counters(fe.name, running.counters)
        if running.labelled is not None:
            self.ctx.add_labelled(fe.name, *running.labelled)

    def _listening(self, fe: FrontEnd, listener: asyncio.Server, tls: bool = False) -> int:
        """Log where ``fe`` listens (and whether over TLS); its TCP port (0 on a Unix
        socket)."""
        addr = listener.sockets[0].getsockname()
        if isinstance(addr, str):  # a Unix socket's path
            log.info("%s listening on %s", fe.name, addr)
            return 0
        over = " (TLS)" if tls else ""
        log.info("%s%s listening on %s:%d", fe.name, over, addr[0], addr[1])
        return int(addr[1])

    def _list_queues(self) -> None:
        """Size the descriptor pool, list the data dir once and note its queues as pending
        (:meth:`QueueCollection.defer`)."""
        soft, _ = storage.raise_open_files_limit()
        pool = self.config.server.max_open_journals or storage.auto_max_open(soft)
        self.files = storage.DataDir(self.data_dir, max_open=pool)
        self.ctx.journal_files = self.files.stats
        self.ctx.connection_cap = storage.auto_max_connections(soft, pool)
        log.info(
            "open-file limit %d; at most %d journal files open at once, %s client connections",
            soft,
            pool,
            self.ctx.connection_cap or "unlimited",
        )
        names = self.files.queue_names()  # the one listing of the data dir
        if orphans := self.files.remove_orphans():
            log.info("removed %d file(s) of deleted queues left by a crash", orphans)
        self.collection.defer(names)
        if names:
            log.info("replaying %d queue(s) from %s in the background", len(names), self.data_dir)

    async def _replay_in_background(self) -> None:
        """Replay the pending queues one after another, yielding to the loop once
        :data:`REPLAY_SLICE_S` passed since the last yield, in the middle of a queue's replay
        if need be (:meth:`QueueCollection.replay_slice`): commands on other queues, and
        ``stats``, ``version``..., are answered in between however long one queue's journal
        is. While it runs, a command (of any front end) that reaches a pending queue waits
        for it, and it does that queue next (``KestrelConnection.wait_for_replay``,
        :meth:`QueueCollection.wait_for`); only what no connection asked for (an expiry
        sweep's move to a pending ``expire_to_queue``) replays a pending queue itself.

        A journal that cannot be replayed (corrupt, unreadable) stops the server: the error
        is kept in :attr:`failure` and re-raised by :func:`run_server` after the stop, so
        the command line exits as it did when replay came before listening.
        """
        coll = self.collection
        total = coll.pending
        if not total:
            return
        coll.replaying_in_background = True  # commands on pending queues wait for it
        try:
            await self._replay_all(total)
        finally:
            coll.stop_background()

    async def _replay_all(self, total: int) -> None:
        """The loop of :meth:`_replay_in_background` (``total`` queues pending)."""
        coll = self.collection
        clock = time.monotonic
        t0 = last = yielded = started = clock()
        while not self.ctx.stopping:
            try:
                name = coll.replay_slice(clock, yielded + REPLAY_SLICE_S)
            except TooManyOpenFiles:
                # Not the journal's fault: the rest replay at their first reference.
                log.warning(
                    "background replay stopped, no file descriptor left: %d queue(s) will "
                    "replay at their first use",
                    coll.pending,
                )
                return
            except Exception as exc:  # any failure stops the start
                log.error("replay failed: %s", exc)
                self.failure = exc
                self.request_stop()
                return
            if name is None:
                break
            now = clock()
            if name:
                if now - started >= REPLAY_LOG_EVERY_S:  # one long journal: say what it was
                    q = coll.queue(name)
                    items = 0 if q is None else len(q)
                    log.info("replayed queue %s: %d items in %.1fs", name, items, now - started)
                started = now
            if now - last >= REPLAY_LOG_EVERY_S and coll.pending:
                last = now
                log.info(
                    "replaying: %d/%d queues left, %d items so far, %.1fs",
                    coll.pending,
                    total,
                    coll.total_length,
                    now - t0,
                )
            if now - yielded >= REPLAY_SLICE_S:  # small queues: many per loop pass
                await asyncio.sleep(0)
                yielded = clock()
                if not coll.half_built():
                    started = yielded
        if not self.ctx.stopping:
            log.info(
                "replayed %d queue(s), %d items in %.2fs",
                total,
                coll.total_length,
                time.monotonic() - t0,
            )

    async def _listen(self, fe: FrontEnd, port: int, running: Running) -> asyncio.Server:
        """Create the (not yet serving) listener of one front end."""

        def protocol() -> asyncio.BaseProtocol:
            # A duck-typed protocol (see server/connection.py): the loop only calls its methods.
            return cast(asyncio.BaseProtocol, running.connection())

        sock = self._sockets.pop(fe.name, None)
        if sock is not None and sock.family == socket.AF_UNIX:  # tercel beanstalkd -l unix:
            return await self.loop.create_unix_server(protocol, sock=sock, backlog=1024)
        return await self._create(fe, running, sock, port, self._ssl(fe.name))

    async def _create(
        self,
        fe: FrontEnd,
        running: Running,
        sock: socket.socket | None,
        port: int,
        tls: ssl.SSLContext | None,
    ) -> asyncio.Server:
        """A TCP listener of ``fe`` on ``sock`` (bound early by the command line) or on the
        configured host and ``port``; speaking TLS with ``tls`` (the handshake is the loop's,
        bounded by ``[tls] handshake_timeout``)."""

        def protocol() -> asyncio.BaseProtocol:
            return cast(asyncio.BaseProtocol, running.connection())

        timeout = None if tls is None or self.tls is None else self.tls.handshake_timeout
        if sock is not None:
            return await self.loop.create_server(
                protocol, sock=sock, backlog=1024, ssl=tls, ssl_handshake_timeout=timeout
            )
        host = self.config.server.host
        return await self.loop.create_server(
            protocol, host, port, backlog=1024, ssl=tls, ssl_handshake_timeout=timeout
        )

    def _lock_data_dir(self) -> None:
        self._lock = storage.DataDirLock.exclusive(self.data_dir)

    def write_ports_file(self, path: str) -> None:
        """Write ``{"memcache": N, ...}``: atomically (tmp file, then rename) for a regular
        file, directly for a FIFO (which lets a supervisor wait for it without polling)."""
        import json  # (only here: not before the listeners serve)

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
        self.ctx.request_stop()

    async def serve(self) -> None:
        """Run until :meth:`request_stop`."""
        await self.ctx.stop_requested()

    async def stop(self) -> None:
        """Stop accepting, stop the front ends (last started first), end every session
        (open reads go back), write, fsync, close. Also after a start that failed halfway."""
        ctx = self.ctx
        ctx.stopping = True
        ctx.status_changed()
        if self._replayer is not None:
            self._replayer.cancel()  # a queue half replayed is dropped as it is on disk
        for listener in self._listeners:
            listener.close()
        for handle in self._timers:
            handle.cancel()
        ctx.reservations.close()
        if self.admin is not None:
            await self.admin.stop()
        for running in reversed(list(self.running.values())):
            await running.stop()
        for conn in list(ctx.connections):
            conn.end_session()
        self.committer.flush_now()
        for conn in list(ctx.connections):
            conn.close()
        # Let a running compaction finish writing (off the loop), then switch over.
        if self._compactor is not None:
            await self.loop.run_in_executor(None, self._compactor.shutdown)
        await asyncio.sleep(0)
        self.collection.close()
        self.committer.close()
        for listener in self._listeners:
            await listener.wait_closed()
        for sock in self._sockets.values():
            sock.close()
        self.files.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # ---- background work ------------------------------------------------------------------

    def _schedule_sweeps(self) -> None:
        period = self.config.server.expiration_timer_frequency / 1000
        if period > 0 and self.queues:
            self._timers.append(self.loop.call_later(period, self._sweep))
        timeout = self.config.server.client_timeout
        if timeout:
            self._timers.append(self.loop.call_later(min(timeout / 2000, 1.0), self._reap_idle))

    def _sweep(self) -> None:
        self._timers = [
            t for t in self._timers if not t.cancelled() and t.when() > self.loop.time()
        ]
        try:
            self.ctx.reservations.table.retry_returns()  # put off for want of a descriptor
            self.collection.flush_all_expired()
            self.collection.expire_keyed(self.ctx.clock.now_ms())  # keyed leases that ran out
            for name in self.collection.delete_expired_queues():
                log.info("deleted queue %s: empty and older than its max_queue_age", name)
        except Exception:
            log.exception("expiry sweep failed")
        if not self.ctx.stopping:
            period = self.config.server.expiration_timer_frequency / 1000
            self._timers.append(self.loop.call_later(period, self._sweep))

    def _reap_idle(self) -> None:
        timeout = self.config.server.client_timeout
        if not timeout or self.ctx.stopping:
            return
        cutoff = self.loop.time() - timeout / 1000
        for conn in list(self.ctx.connections):
            if conn.is_idle(cutoff):
                conn.close()
        self._timers.append(self.loop.call_later(min(timeout / 2000, 1.0), self._reap_idle))


async def run_server(
    config: ServerConfig,
    ports_file: str | None = None,
    reload_signal: bool = True,
    sockets: dict[str, socket.socket] | None = None,
    early_signals: Iterable[int] = (),
    *,
    front_ends: Sequence[FrontEnd] = FRONT_ENDS,
    queues: bool = True,
    signals: Mapping[int, Callable[[Server], None]] | None = None,
    on_ready: Callable[[dict[str, int]], None] | None = None,
) -> None:
    """Install the signal handlers, start a server, serve until told to stop, stop cleanly:
    ``tercel serve``'s and ``tercel beanstalkd``'s one lifecycle (``front_ends`` and
    ``queues``: as :class:`Server`'s). ``on_ready`` gets the bound ports (``{"memcache": N,
    ...}``) once every listener serves.

    SIGTERM and SIGINT stop, SIGHUP reloads the config (unless ``reload_signal`` is False);
    ``signals`` adds handlers of the caller's, each called with the server (which may not be
    started yet). The handlers go in before anything listens, and ``early_signals`` (caught by
    the command line before the loop ran) are acted on as if they came now: a SIGTERM or SIGHUP
    in the first moments of a start is a clean stop or a reload, never a kill by the signal.
    Raises what stopped the start (or the background replay) once the server is stopped.
    """
    server = Server(config, sockets=sockets, front_ends=front_ends, queues=queues)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.request_stop)
    if reload_signal:
        loop.add_signal_handler(signal.SIGHUP, _reload_logged, server.ctx)
    extra = dict(signals or {})
    for signum, handler in extra.items():
        loop.add_signal_handler(signum, handler, server)
    for signum in early_signals:
        if signum == signal.SIGHUP:
            loop.call_soon(_reload_logged, server.ctx)
        else:
            server.request_stop()
    try:
        await server.start()
        if on_ready is not None:  # first: whoever waits for the ports file finds it said
            on_ready(server.ports)
        if ports_file:
            try:
                server.write_ports_file(ports_file)
            except OSError as exc:
                log.error("cannot write the ports file %s: %s", ports_file, exc)
        await server.serve()
    finally:
        log.info("shutting down")
        await server.stop()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, *extra):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signum)
    if server.failure is not None:
        raise server.failure


LOOPBACK = ("127.0.0.1", "::1", "localhost")


def warn_exposed(config: ServerConfig, plaintext: Sequence[str]) -> None:
    """Warn at start-up when listeners without TLS listen beyond loopback: anyone who can
    reach them reads the traffic."""
    host = config.server.host
    if plaintext and host not in LOOPBACK and not host.startswith("127."):
        log.warning(
            "listening on %s without TLS on %s: traffic there is readable by anyone on the "
            'network (docs/operations.md, "Running on a network")',
            host,
            ", ".join(plaintext),
        )


def _reload_logged(ctx: ServerContext) -> None:
    try:
        ctx.reload()
    except ConfigError as exc:
        log.error("reload refused, keeping the old config: %s", exc)
    except Exception:
        log.exception("reload failed, keeping the old config")
