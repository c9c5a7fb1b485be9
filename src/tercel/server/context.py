"""The server context: everything a front end's handlers use, in one compiled object.

Every connection of every front end holds the one :class:`ServerContext` of its server and
reaches the rest of the server through it: the queue collection, the group committer, the
clock (and the time of the batch being handled), latency metrics, the status flags and checks,
``reload``, the reservations and their deadlines, the connection registry and
``request_stop``. Nothing in a handler calls back into :mod:`tercel.server.app` (which nothing
below it imports).

It is compiled (``setup.py``), so each field read from a compiled handler is a struct load
rather than a dict lookup; the fields read on every command (``now``, ``writable``,
``readable``, ``ticks``, the byte counters) are plain attributes, kept current by the methods
that change them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Final, Protocol

from tercel import __version__
from tercel.clock import Clock
from tercel.config import UNLIMITED, ServerConfig, load_config
from tercel.core.collection import QueueCollection
from tercel.errors import UnavailableError
from tercel.server.auth import Authenticator
from tercel.server.commit import Committer
from tercel.server.deadlines import Reservations
from tercel.server.figures import (
    COUNTER,
    CURR_CONNECTIONS,
    GAUGE,
    TOTAL_CONNECTIONS,
    Figure,
    Reading,
    counts,
    read,
)
from tercel.server.metrics import Metrics
from tercel.server.status import Status, StatusKeeper

log = logging.getLogger(__name__)

ANY: Final = 0
"""Access of an operation allowed whatever the status (stats, version, ack, ...)."""
READS: Final = 1
"""Access of an operation refused while reads are (shutdown, QUIESCENT)."""
WRITES: Final = 2
"""Access of an operation refused while writes are (shutdown, READONLY, QUIESCENT)."""


class Closable(Protocol):
    """What the context needs of a connection of any front end (see ``server.connection``)."""

    front_end: str

    def end_session(self) -> None: ...

    def apply_auth(self) -> None: ...

    def close(self) -> None: ...

    def is_idle(self, cutoff: float) -> bool: ...


AUTH_FIGURES: tuple[Figure[dict[str, int]], ...] = (
    Figure("users", GAUGE, "Users configured.", lambda s: s["users"]),
    Figure("logins", COUNTER, "Successful logins.", lambda s: s["logins"]),
    Figure("login_failures", COUNTER, "Failed logins.", lambda s: s["login_failures"]),
    Figure(
        "login_rate_limited",
        COUNTER,
        "Logins refused while their address was rate-limited.",
        lambda s: s["login_rate_limited"],
    ),
    Figure(
        "unauthenticated",
        COUNTER,
        "Commands refused before a login.",
        lambda s: s["unauthenticated"],
    ),
    Figure(
        "permission_denied",
        COUNTER,
        "Commands refused for want of a permission.",
        lambda s: s["permission_denied"],
    ),
    Figure(
        "manage_denied",
        COUNTER,
        "Management commands refused for want of the manage permission.",
        lambda s: s["manage_denied"],
    ),
    Figure(
        "limit_refused",
        COUNTER,
        "Commands refused by a user's limits.",
        lambda s: s["limit_refused"],
    ),
)
"""The ``auth_*`` figures (registered under ``auth``: memcache ``stats``, ``/stats.json``,
``/metrics``, the dashboard), read from :meth:`Authenticator.stats`."""


class ServerContext:
    """One server's shared state and operations, as its front ends see them."""

    def __init__(
        self,
        config: ServerConfig,
        collection: QueueCollection,
        committer: Committer,
        clock: Clock,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        srv = config.server
        self.config = config
        self.collection = collection
        self.committer = committer
        self.clock = clock
        self.loop = loop
        self.metrics = Metrics()
        self.status = StatusKeeper(srv.data_dir)
        self.reservations = Reservations(loop, clock)
        """Every reservation (open reads, leases, ...) and its deadline timer."""
        self.version = __version__
        self.started_at = clock.now_ms()
        self.now = 0
        """The time of the batch of commands being handled (set by each connection's pump
        before its first command, so every handler sees the time of its batch)."""
        self.writable = True
        """False when writes are refused (shutdown, READONLY, QUIESCENT)."""
        self.readable = True
        """False when reads are refused (shutdown, QUIESCENT)."""
        self.stopping = False
        self.sample_every = srv.latency_sample_every
        self.ticks = 1
        """Commands until the next latency sample (counted down by :func:`sampled`)."""
        self.tracks_idle = bool(srv.client_timeout)
        """Connections note when they last read only when idle ones are to be closed."""
        self.max_open_reads = srv.max_open_reads
        self.bytes_read = 0
        self.bytes_written = 0
        self.partial_bytes = 0
        """Bytes of incomplete requests held by all connections (``Connection.track_partial``)."""
        self.max_partial_bytes = srv.max_partial_request_bytes or UNLIMITED
        """``max_partial_request_bytes``: the most :attr:`partial_bytes` may reach."""
        self.partial_refused = 0
        """Connections refused because :attr:`partial_bytes` would exceed the budget."""
        self.connections: set[Closable] = set()
        self.connection_cap: int | None = None
        """The most client connections the open-file limit leaves room for (set at start-up:
        ``storage.auto_max_connections``); ``max_connections`` never goes above it."""
        self.total_connections = 0
        self._per_front_end: dict[str, list[int]] = {}  # name -> [open now, ever opened]
        self._counters: dict[str, Callable[[], list[Reading]]] = {}
        self._labelled: dict[
            str, tuple[str, Callable[[], Iterable[tuple[str, list[Reading]]]]]
        ] = {}
        self._cmd_counts: dict[str, dict[str, int]] = {}
        self.journal_files: Callable[[], dict[str, int]] = dict
        """The data dir's descriptor pool figures (``DataDir.stats``; set at start-up)."""
        self.ports: dict[str, int] = {}
        """The bound port of each listener by name (``memcache``, ``admin``, ...)."""
        self.auth = Authenticator(config.users, loop, clock)
        """The ``[users]`` and their logins (:mod:`tercel.server.auth`); with none configured
        connections have no guard."""
        self.add_counters("auth", self._auth_readings)
        self._stop = asyncio.Event()
        self.reload_hooks: list[Callable[[], None]] = []
        """Called by :meth:`reload` before the queue settings change (the TLS certificates):
        each raises ConfigError to refuse the reload."""

    def _auth_readings(self) -> list[Reading]:
        """The ``auth_*`` figures; none on a server that never had users."""
        values = self.auth.stats()
        return read(AUTH_FIGURES, values) if values else []

    # ---- connections ----------------------------------------------------------------------

    def connection_opened(self, conn: Closable) -> bool:
        """Count a new connection; False when stopping or ``max_connections`` (at most
        :attr:`connection_cap`) refuses it."""
        limit = self.config.server.max_connections
        cap = self.connection_cap
        if cap is not None and (limit is None or limit > cap):
            limit = cap
        if self.stopping or (limit is not None and len(self.connections) >= limit):
            return False
        self.connections.add(conn)
        self.total_connections += 1
        counts = self._per_front_end.get(conn.front_end)
        if counts is None:
            counts = self._per_front_end[conn.front_end] = [0, 0]
        counts[0] += 1
        counts[1] += 1
        return True

    def connection_closed(self, conn: Closable) -> None:
        if conn in self.connections:
            self.connections.discard(conn)
            self._per_front_end[conn.front_end][0] -= 1

    def connection_counts(self, front_end: str) -> tuple[int, int]:
        """``front_end``'s connections open now and ever opened."""
        counts = self._per_front_end.get(front_end)
        return (0, 0) if counts is None else (counts[0], counts[1])

    # ---- per-front-end counters -----------------------------------------------------------

    def add_counters(self, front_end: str, provider: Callable[[], list[Reading]]) -> None:
        """Register a front end's own figures (e.g. its ``cmd_*``): ``provider`` returns their
        readings (``figures.read(FIGURES, source)``, or ``figures.counts(dict)``), taken at
        each stats snapshot (``server/stats.py``)."""
        self._counters[front_end] = provider

    def add_labelled(
        self,
        front_end: str,
        label: str,
        provider: Callable[[], Iterable[tuple[str, list[Reading]]]],
    ) -> None:
        """Register a front end's figures per entity (beanstalkd's per tube): ``provider``
        gives ``(entity, readings)`` pairs, best lazily (a snapshot reads them in slices,
        ``server/exposition.py``), exported with the entity in the label ``label``."""
        self._labelled[front_end] = (label, provider)

    def labelled_counters(self) -> dict[str, tuple[str, Iterable[tuple[str, list[Reading]]]]]:
        """Per front end that registered some: its label and its ``(entity, readings)``."""
        return {fe: (label, provider()) for fe, (label, provider) in self._labelled.items()}

    def command_counts(self, front_end: str) -> dict[str, int]:
        """The ``cmd_<command>`` counters of a front end whose connections count their own
        commands (text, Thrift): one dict per front end, shared by its connections,
        registered with :meth:`add_counters` when first asked for."""
        got = self._cmd_counts.get(front_end)
        if got is None:
            got = self._cmd_counts[front_end] = {}
            self.add_counters(front_end, lambda: counts(got))
        return got

    def front_end_counters(self) -> dict[str, list[Reading]]:
        """Per front end: its connection counts and its own figures, now."""
        out: dict[str, list[Reading]] = {}
        for name, (now, ever) in self._per_front_end.items():
            out[name] = [(CURR_CONNECTIONS, now), (TOTAL_CONNECTIONS, ever)]
        for name, provider in self._counters.items():
            out.setdefault(name, []).extend(provider())
        return out

    # ---- status ---------------------------------------------------------------------------

    def status_changed(self) -> None:
        """Recompute the two flags handlers test on every command."""
        self.writable = not self.stopping and self.status.current.writable
        self.readable = not self.stopping and self.status.current.readable

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

    def check(self, access: int) -> None:
        """Raise UnavailableError unless the status allows an operation of ``access`` (one of
        :data:`ANY`, :data:`READS`, :data:`WRITES`, as each front end declares per operation).
        Two flag tests when allowed."""
        if access == WRITES:
            if not self.writable:
                self.check_writable()
        elif access == READS and not self.readable:
            self.check_readable()

    def set_status(self, status: Status) -> None:
        """Persist and apply a new status. Raises OSError (status unchanged) when the status
        file cannot be written."""
        self.status.set(status)
        self.status_changed()

    # ---- operations -----------------------------------------------------------------------

    def reload(self) -> None:
        """Re-read the config file and apply its queue settings and aliases to live queues.

        Raises ConfigError (the old config stays) when the file is bad. ``[server]`` and
        ``[tls]`` settings need a restart and are kept as they are; the :attr:`reload_hooks`
        run first (the TLS files are read again, for new connections). ``[users]`` apply at
        once: when the first user is added every open connection must log in before its next
        command; when the last is removed, none has to.
        """
        source = self.config.source
        fresh = None if source is None else load_config(source)
        for hook in self.reload_hooks:
            hook()
        if fresh is None:
            return
        self.config = ServerConfig(
            self.config.server,
            fresh.defaults,
            fresh.overrides,
            fresh.aliases,
            source,
            users=fresh.users,
            tls=self.config.tls,
        )
        self.collection.reload(self.config)
        was = self.auth.enabled
        self.auth.reload(fresh.users)
        if was != self.auth.enabled:  # users added to an open server, or all removed
            for conn in list(self.connections):
                conn.apply_auth()
        log.info("reloaded config from %s", source)

    def request_stop(self) -> None:
        """Ask the server to stop (signal handlers, ``shutdown``, ``POST /shutdown``)."""
        self._stop.set()

    async def stop_requested(self) -> None:
        """Return once :meth:`request_stop` was called."""
        await self._stop.wait()

    def dump_config(self) -> list[tuple[str, list[tuple[str, object]]]]:
        """One block per existing queue with its resolved settings, then one per alias."""
        blocks: list[tuple[str, list[tuple[str, object]]]] = []
        for q in sorted(self.collection, key=lambda q: q.name):
            blocks.append((q.name, list(q.config.describe())))
        for name, dests in sorted(self.config.aliases.items()):
            blocks.append((name, [("alias_of", ",".join(dests))]))
        return blocks


def sampled(ctx: ServerContext) -> bool:
    """True for the one command in ``latency_sample_every`` whose latency is recorded.

    Two clock reads and a histogram update cost about 0.5 us, a twentieth of a whole command
    here; a 1-in-16 sample keeps the percentiles and drops that cost to noise.
    """
    ctx.ticks -= 1
    if ctx.ticks:
        return False
    ctx.ticks = ctx.sample_every
    return True
