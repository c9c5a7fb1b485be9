"""Kestrel's figures, declared once (:data:`SERVER`, :data:`QUEUE`), and their readings.

Each figure is one :class:`~tercel.server.figures.Figure` below: its name (the memcache
``stats`` line), kind, help, how it is read and where it is shown. memcache's ``stats`` and
``dump_stats`` (:func:`stats_lines`, :func:`dump_stats`), the admin port's ``/stats.json`` and
``/metrics`` (``server/admin.py``) and the dashboard (``server/dashboard.py``) read the
declarations, each only the figures it shows; nothing else lists them.

Front ends: each connection counts itself under its front end's name (``curr_connections``,
``total_connections`` per front end, :data:`~tercel.server.figures.CONNECTIONS`); a front end
with figures of its own registers them with
:meth:`~tercel.server.context.ServerContext.add_counters` (``cmd_*`` of its protocol,
beanstalkd's job counts), shown as ``<front end>_<figure>`` lines, ``<front end>/<figure>``
on the admin port and ``tercel_<front end>_<figure>`` metrics, without touching the others.
"""

from __future__ import annotations

import heapq
import itertools
import os
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

from tercel.config import QueueConfig
from tercel.core.queue import PersistentQueue
from tercel.core.stats import GlobalStats
from tercel.server import figures
from tercel.server.context import ServerContext
from tercel.server.figures import COUNTER, DASHBOARD, GAUGE, LABEL, WIRE, Figure, Reading


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # pragma: no cover - non-POSIX
        return 1


# ---- the server's figures -----------------------------------------------------------------


class ServerSource:
    """What the server-wide figures read: the context, and the sums over the queues (items,
    bytes, max_memory_size, journal bytes) taken by :func:`server_steps` in slices."""

    __slots__ = ("bytes", "ctx", "items", "journal_bytes", "now", "pool", "reserved", "stats")

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.now = ctx.clock.now_ms()
        self.stats: GlobalStats = ctx.collection.stats
        self.pool: dict[str, int] = ctx.journal_files()
        self.items = 0
        self.bytes = 0
        self.reserved = 0
        self.journal_bytes = 0


def _global(name: str, help_text: str) -> Figure[ServerSource]:
    """A counter of :class:`~tercel.core.stats.GlobalStats`."""
    return Figure(name, COUNTER, help_text, lambda s: getattr(s.stats, name))


def _pool(name: str, kind: figures.Kind, help_text: str) -> Figure[ServerSource]:
    """A figure of the journal descriptor pool (``DataDir.stats``)."""
    key = name.removeprefix("journal_files_")
    return Figure(name, kind, help_text, lambda s: s.pool.get(key, 0))


SERVER: tuple[Figure[ServerSource], ...] = (
    # Kestrel's 19, in Kestrel's order
    Figure(
        "uptime",
        GAUGE,
        "Seconds since the server started.",
        lambda s: s.now // 1000 - s.ctx.started_at // 1000,
    ),
    Figure("time", GAUGE, "The server's clock, in Unix seconds.", lambda s: s.now // 1000, None),
    Figure("version", LABEL, "tercel's version.", lambda s: s.ctx.version, dashboard="version"),
    Figure(
        "curr_items",
        GAUGE,
        "Items waiting, in every queue.",
        lambda s: s.items,
        "items",
        dashboard="items",
    ),
    _global("total_items", "Items added, to every queue."),
    Figure(
        "bytes",
        GAUGE,
        "Payload bytes waiting, in every queue.",
        lambda s: s.bytes,
        dashboard="bytes",
    ),
    Figure(
        "reserved_memory_ratio",
        GAUGE,
        "The queues' max_memory_size summed, over the physical memory.",
        lambda s: s.reserved / _physical_memory(),
    ),
    Figure(
        "curr_connections",
        GAUGE,
        "Client connections open now, every front end.",
        lambda s: len(s.ctx.connections),
        "connections",
        dashboard="connections",
    ),
    Figure(
        "total_connections",
        COUNTER,
        "Client connections accepted, every front end.",
        lambda s: s.ctx.total_connections,
    ),
    _global("cmd_get", "Reads asked for (memcache get, text and Thrift get)."),
    _global("cmd_set", "Items put."),
    _global("cmd_peek", "Peeks asked for."),
    _global("get_hits", "Reads that found an item."),
    _global("get_misses", "Reads that found none."),
    Figure("bytes_read", COUNTER, "Bytes read from clients.", lambda s: s.ctx.bytes_read),
    Figure("bytes_written", COUNTER, "Bytes written to clients.", lambda s: s.ctx.bytes_written),
    _global("queue_creates", "Queues created."),
    _global("queue_deletes", "Queues deleted."),
    _global("queue_expires", "Queues deleted for being empty past their expiry."),
    # tercel's own
    _global("journal_torn_tails", "Torn journal tails cut at start-up."),
    Figure(
        "journal_write_errors",
        COUNTER,
        "Failed journal writes and fsyncs.",
        lambda s: s.ctx.committer.write_errors,
    ),
    Figure(
        "journal_fsyncs",
        COUNTER,
        "Group fsyncs of sync_journal = true queues.",
        lambda s: s.ctx.committer.fsyncs,
    ),
    Figure(
        "journal_fsync_waits",
        COUNTER,
        "Reply writes released after a group fsync.",
        lambda s: s.ctx.committer.fsync_waits,
    ),
    Figure(
        "journal_fsyncs_aio",
        COUNTER,
        "Group fsyncs that went through native AIO.",
        lambda s: s.ctx.committer.aio_fsyncs,
    ),
    _pool("journal_files_open", GAUGE, "Journal file descriptors held by the pool now."),
    _pool("journal_files_limit", GAUGE, "The pool's bound (max_open_journals, or auto)."),
    _pool(
        "journal_files_evictions",
        COUNTER,
        "Journal descriptors closed by the pool (least recently used).",
    ),
    _pool("journal_files_reopens", COUNTER, "Parked journal files opened again on their next use."),
    _pool("journal_files_emfile", COUNTER, "Journal file opens that failed with EMFILE or ENFILE."),
    _pool(
        "journal_files_refused",
        COUNTER,
        "Opens given up: a request refused, a rotation or compaction put off.",
    ),
    _pool(
        "journal_files_put_off",
        COUNTER,
        "Journal rotations and compactions put off for want of a descriptor.",
    ),
    Figure(
        "queues_replaying",
        GAUGE,
        "Queues on disk not replayed yet (start-up replays in the background).",
        lambda s: s.ctx.collection.pending,
    ),
    # the admin port's and the dashboard's only
    Figure(
        "status",
        LABEL,
        "The server's status (UP, READONLY, QUIESCENT...).",
        lambda s: s.ctx.status.current.name,
        wire=False,
        dashboard="status",
    ),
    Figure(
        "uptime_ms",
        GAUGE,
        "Milliseconds since the server started.",
        lambda s: s.now - s.ctx.started_at,
        None,
        wire=False,
        dashboard="uptime_ms",
    ),
    Figure(
        "queues",
        GAUGE,
        "Queues replayed (those on disk not replayed yet aside).",
        lambda s: len(s.ctx.collection),
        None,
        wire=False,
        dashboard="queues",
    ),
    Figure(
        "journal_bytes",
        GAUGE,
        "Bytes of every queue's journal files.",
        lambda s: s.journal_bytes,
        None,
        wire=False,
        dashboard="journal_bytes",
    ),
    Figure(
        "fsyncs",
        COUNTER,
        "Group fsyncs timed (their latency: fsync_p50_us, fsync_p99_us).",
        lambda s: s.ctx.committer.fsync_latency.count,
        None,
        wire=False,
        dashboard="fsyncs",
    ),
    Figure(
        "fsync_p50_us",
        GAUGE,
        "Median group fsync time, in microseconds.",
        lambda s: s.ctx.committer.fsync_latency.percentile(0.5),
        None,
        wire=False,
        dashboard="fsync_p50_us",
    ),
    Figure(
        "fsync_p99_us",
        GAUGE,
        "99th percentile group fsync time, in microseconds.",
        lambda s: s.ctx.committer.fsync_latency.percentile(0.99),
        None,
        wire=False,
        dashboard="fsync_p99_us",
    ),
    Figure(
        "readable",
        GAUGE,
        "1 when the status lets clients read.",
        lambda s: int(s.ctx.status.current.readable),
        "status/readable",
        wire=False,
    ),
    Figure(
        "writable",
        GAUGE,
        "1 when the status lets clients write.",
        lambda s: int(s.ctx.status.current.writable),
        "status/writeable",
        wire=False,
    ),
)
"""The server-wide figures: the global ``stats`` lines are Kestrel's 19 in Kestrel's order,
then tercel's own."""


# ---- one queue's figures ------------------------------------------------------------------


class QueueSource:
    """What one queue's figures read. ``queue`` is None for a queue on disk not replayed yet
    (only the figures ``from_config`` are read then; the others are 0)."""

    __slots__ = ("config", "ctx", "name", "now", "queue", "replaying")

    def __init__(
        self,
        ctx: ServerContext,
        name: str,
        config: QueueConfig,
        queue: PersistentQueue | None,
        now: int,
        *,
        replaying: bool,
    ) -> None:
        self.ctx = ctx
        self.name = name
        self.config = config
        self.queue = queue
        self.now = now
        self.replaying = replaying

    @property
    def q(self) -> PersistentQueue:
        """The queue (a figure not ``from_config`` is read only when there is one)."""
        assert self.queue is not None
        return self.queue


def _attr(name: str, kind: figures.Kind, help_text: str, **where: Any) -> Figure[QueueSource]:
    """A figure read from the queue's attribute of the same name."""
    return Figure(name, kind, help_text, lambda s: getattr(s.q, name), **where)


QUEUE: tuple[Figure[QueueSource], ...] = (
    # Kestrel's, in Kestrel's order
    Figure(
        "items",
        GAUGE,
        "Items waiting (open reads excluded).",
        lambda s: len(s.q),
        dashboard="items",
    ),
    _attr("bytes", GAUGE, "Payload bytes waiting.", dashboard="bytes"),
    _attr("total_items", COUNTER, "Items added."),
    Figure(
        "logsize",
        GAUGE,
        "Bytes of the queue's current journal file.",
        lambda s: s.q.log.current_size,
        None,
    ),
    _attr("expired_items", COUNTER, "Items expired (max_age or their own expiry)."),
    _attr("mem_items", GAUGE, "Items waiting held in memory (read-behind keeps the rest on disk)."),
    _attr(
        "mem_bytes",
        GAUGE,
        "Payload bytes waiting held in memory.",
        dashboard="mem_bytes",
    ),
    Figure(
        "age",
        GAUGE,
        "Milliseconds the last item taken had waited (Kestrel's age); 0 when empty.",
        lambda s: s.q.age(s.now),
        "age_msec",
    ),
    _attr("discarded", COUNTER, "Items dropped for a full queue (discard_old_when_full)."),
    _attr("waiters", GAUGE, "Clients waiting for an item.", dashboard="waiters"),
    Figure(
        "open_transactions",
        GAUGE,
        "Reliable reads open now (open/close, leases excluded).",
        lambda s: s.q.open_reads,
        dashboard="open_reads",
    ),
    _attr("transactions", COUNTER, "Reliable reads opened."),
    _attr("canceled_transactions", COUNTER, "Reliable reads aborted (the item went back)."),
    _attr("total_flushes", COUNTER, "Flushes of the queue."),
    _attr("journal_rewrites", COUNTER, "Compactions of the queue's journal."),
    _attr("journal_rotations", COUNTER, "Rotations of the queue's journal."),
    # tercel's own
    Figure(
        "open_leases",
        GAUGE,
        "Leases open now.",
        lambda s: s.ctx.reservations.table.open_count(s.q),
        None,
        dashboard="open_leases",
    ),
    _attr("dead_lettered", COUNTER, "Items moved to the dead-letter queue.", admin=None),
    Figure(
        "children",
        LABEL,
        "A fanout parent's children, comma-separated.",
        lambda s: ",".join(s.ctx.collection.children(s.name)),
        None,
        omit_zero=True,
    ),
    Figure(
        "replaying",
        GAUGE,
        "1 while the queue's replay is not done (its figures: what it read so far).",
        lambda s: int(s.replaying),
        omit_zero=True,
        from_config=True,
    ),
    # the admin port's and the dashboard's only
    Figure(
        "max_items",
        GAUGE,
        "The queue's max_items.",
        lambda s: s.config.max_items,
        wire=False,
        from_config=True,
    ),
    Figure(
        "max_bytes",
        GAUGE,
        "The queue's max_size, in bytes.",
        lambda s: s.config.max_size,
        wire=False,
        from_config=True,
    ),
    Figure(
        "journal_size",
        GAUGE,
        "Bytes of the queue's journal files.",
        lambda s: s.q.log.size,
        wire=False,
    ),
    Figure(
        "create_time",
        GAUGE,
        "When the queue was created, in Unix seconds.",
        lambda s: s.q.create_time // 1000,
        wire=False,
    ),
    Figure(
        "head_age",
        GAUGE,
        "Milliseconds the head item has waited; 0 when empty.",
        lambda s: s.q.head_age(s.now),
        None,
        wire=False,
        dashboard="head_age_ms",
    ),
)
"""One queue's figures: its ``stats`` lines are Kestrel's in Kestrel's order, then tercel's own
(leases open now, items moved to the dead-letter queue); ``children`` follows for a fanout
parent, and ``replaying 1`` for a queue on disk not replayed yet."""


# ---- an alias's figures ------------------------------------------------------------------

ALIAS: tuple[Figure[tuple[int, int]], ...] = (
    Figure("put_items", COUNTER, "Items put through the alias.", lambda s: s[0], wire=False),
    Figure(
        "put_bytes", COUNTER, "Payload bytes put through the alias.", lambda s: s[1], wire=False
    ),
)
"""An alias's figures (its source: ``(items, bytes)`` put through it), shown per queue name."""


# ---- readings -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueReading:
    """One queue's figures shown on one view, at one moment."""

    name: str
    readings: list[Reading]

    def get(self, figure: str) -> Any:
        """The value of the figure called ``figure``, None when it is not read."""
        for f, v in self.readings:
            if f.name == figure:
                return v
        return None


SUM_SLICE = 1024
"""Queues summed per loop pass for the server-wide figures."""


def server_steps(ctx: ServerContext, view: str) -> Generator[None, None, list[Reading]]:
    """The server-wide figures shown on ``view``, now: the sums over the queues taken
    :data:`SUM_SLICE` queues at a time, a yield between."""
    src = ServerSource(ctx)
    queues = list(ctx.collection)
    journals = view == DASHBOARD
    for i in range(0, len(queues), SUM_SLICE):
        if i:
            yield
        for q in queues[i : i + SUM_SLICE]:
            src.items += len(q)
            src.bytes += q.bytes
            src.reserved += q.config.max_memory_size
            if journals:
                src.journal_bytes += q.log.size
    return figures.read(figures.shown(SERVER, view), src)


def server_readings(ctx: ServerContext, view: str) -> list[Reading]:
    """:func:`server_steps` at once."""
    steps = server_steps(ctx, view)
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]


def queue_reading(
    ctx: ServerContext,
    shown: tuple[Figure[QueueSource], ...],
    name: str,
    q: PersistentQueue | None,
    now: int,
    *,
    replaying: bool = False,
) -> QueueReading:
    """One queue's figures of ``shown``; ``q`` None for a queue on disk not read at all (its
    figures not ``from_config`` are 0)."""
    cfg = q.config if q is not None else ctx.collection.config.queue_config(name)
    src = QueueSource(ctx, name, cfg, q, now, replaying=replaying)
    if q is None:
        readings = [
            (f, f.read(src) if f.from_config else 0)
            for f in shown
            if not f.omit_zero or (f.from_config and f.read(src))
        ]
    else:
        readings = figures.read(shown, src)
    return QueueReading(name, readings)


SLICE = 64
"""Queues read per loop pass by a sliced render (about 2 ms of pure Python at most): memcache
``stats`` and ``dump_stats``, ``/stats.json``, ``/metrics`` and ``?period=`` windows of a
server with more queues answer over several loop passes, serving other clients in between."""
SORT_RUN = 4096
"""Names sorted per loop pass (the runs are then merged as they are read)."""


def queue_names(ctx: ServerContext, names: tuple[str, ...]) -> list[str]:
    """The named queues that exist (replayed or not), sorted."""
    coll = ctx.collection
    return sorted(n for n in set(names) if coll.replayed(n) is not None or coll.is_pending(n))


def sorted_names(ctx: ServerContext) -> Generator[None, None, Iterator[str]]:
    """Every queue's name, replayed or not, in order: sorted in runs of :data:`SORT_RUN`
    (yielding after each when there is more than one), merged as the result is read."""
    coll = ctx.collection
    queues = list(coll)
    pending = coll.pending_names()
    runs: list[list[str]] = []
    for i in range(0, len(queues), SORT_RUN):
        runs.append(sorted([q.name for q in queues[i : i + SORT_RUN]]))
        if len(queues) + len(pending) > SORT_RUN:
            yield
    for i in range(0, len(pending), SORT_RUN):
        runs.append(sorted(pending[i : i + SORT_RUN]))
        if len(queues) + len(pending) > SORT_RUN:
            yield
    if len(runs) == 1:
        return iter(runs[0])
    return heapq.merge(*runs)


def queue_batches(
    ctx: ServerContext, view: str, names: list[str] | None = None
) -> Iterator[list[QueueReading]]:
    """Each queue's figures shown on ``view`` (of ``names``, else of every queue; sorted by
    name), :data:`SLICE` queues per batch; an empty batch while the names are sorted. A
    caller that yields to the loop between batches never holds it long, whatever the number
    of queues; a queue deleted meanwhile is left out.

    A queue on disk not replayed yet is listed as replaying, never replayed now: those being
    replayed as far as their replay went, the others' all 0 (nothing is read for them:
    100,000 queues would be 100,000 file reads per ``stats``)."""
    if names is None:
        sorter = sorted_names(ctx)
        while True:
            try:
                next(sorter)
            except StopIteration as stop:
                ordered: Iterator[str] = stop.value
                break
            yield []
    else:
        ordered = iter(names)
    shown = figures.shown(QUEUE, view)
    coll = ctx.collection
    while True:
        now = ctx.clock.now_ms()
        half = coll.half_built() if coll.pending else {}
        batch = []
        for name in itertools.islice(ordered, SLICE):
            q = coll.replayed(name)
            if q is not None:
                batch.append(queue_reading(ctx, shown, name, q, now))
            elif coll.is_pending(name):
                batch.append(queue_reading(ctx, shown, name, half.get(name), now, replaying=True))
        if not batch:
            return
        yield batch


def queue_readings(
    ctx: ServerContext, view: str, names: list[str] | None = None
) -> Iterator[QueueReading]:
    """:func:`queue_batches` at once (for a caller that reads few queues)."""
    for batch in queue_batches(ctx, view, names):
        yield from batch


def alias_readings(ctx: ServerContext) -> list[QueueReading]:
    """Each alias's figures (on the admin port only)."""
    return [
        QueueReading(name, figures.read(ALIAS, (v[0], v[1])))
        for name, v in ctx.collection.alias_puts.items()
    ]


def _wire(value: Any) -> Any:
    return f"{value:.3f}" if isinstance(value, float) else value


def queue_lines(reading: QueueReading) -> list[tuple[str, object]]:
    """One queue's lines in Kestrel's order (``children`` only for a fanout parent)."""
    return [(f.name, _wire(v)) for f, v in reading.readings]


def front_end_lines(ctx: ServerContext) -> list[tuple[str, object]]:
    """Each front end's figures as ``<front end>_<figure>`` lines (sorted by front end, then
    figure)."""
    lines: list[tuple[str, object]] = []
    for fe, readings in sorted(ctx.front_end_counters().items()):
        named = sorted((f.admin_name or f.name, v) for f, v in readings)
        lines.extend((f"{fe}_{k}", _wire(v)) for k, v in named)
    return lines


Lines = list[tuple[str, object]]
"""``(name, value)`` lines of ``stats``, or of one ``dump_stats`` block."""
PAUSE = None
"""Yielded by a sliced render where its caller should let the loop run."""


def stats_slices(ctx: ServerContext) -> Iterator[Lines | None]:
    """Everything ``stats`` prints, in parts: global lines and each front end's, then each
    queue's, :data:`PAUSE` between slices of queues."""
    steps = server_steps(ctx, WIRE)
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            readings: list[Reading] = stop.value
            break
        yield PAUSE
    yield [(f.name, _wire(v)) for f, v in readings] + front_end_lines(ctx)
    first = True
    for batch in queue_batches(ctx, WIRE):
        if not first:
            yield PAUSE
        first = False
        yield [(f"queue_{r.name}_{k}", v) for r in batch for k, v in queue_lines(r)]


def stats_lines(ctx: ServerContext) -> Lines:
    """Everything ``stats`` prints, at once."""
    return [line for part in stats_slices(ctx) if part is not None for line in part]


def dump_stats_slices(
    ctx: ServerContext, names: tuple[str, ...]
) -> Iterator[list[tuple[str, Lines]] | None]:
    """``dump_stats`` blocks, in parts (:data:`PAUSE` between slices of queues): the named
    queues (empty block for an unknown one), or all."""
    if names:
        found = {r.name: r for r in queue_readings(ctx, WIRE, queue_names(ctx, names))}
        yield [(name, queue_lines(found[name]) if name in found else []) for name in names]
        return
    first = True
    for batch in queue_batches(ctx, WIRE):
        if not first:
            yield PAUSE
        first = False
        yield [(r.name, queue_lines(r)) for r in batch]


def dump_stats(ctx: ServerContext, names: tuple[str, ...]) -> list[tuple[str, Lines]]:
    """``dump_stats`` blocks, at once."""
    return [b for part in dump_stats_slices(ctx, names) if part is not None for b in part]
