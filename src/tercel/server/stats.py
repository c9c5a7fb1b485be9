"""One typed stats snapshot, and Kestrel's STATS and DUMP_STATS lines rendered from it.

:func:`snapshot` reads every figure once into a :class:`StatsSnapshot` (server-wide figures,
one :class:`QueueStats` per queue, and each front end's own counters); memcache's ``stats`` and
``dump_stats`` (:func:`stats_lines`, :func:`dump_stats`), the admin port's ``/stats.json`` and
``/metrics`` (``server/admin.py``) all render that one object, so no figure is computed twice
or parsed back from text.

Front ends: each connection counts itself under its front end's name (``curr_connections``,
``total_connections`` per front end); a front end with counters of its own registers a
provider with :meth:`~tercel.server.context.ServerContext.add_counters` (``cmd_*`` of its
protocol), shown as ``<front end>_<counter>`` lines, ``<front end>/<counter>`` counters and
``tercel_<front end>_<counter>`` metrics, without touching the others.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from tercel.core.queue import PersistentQueue
from tercel.server.context import ServerContext


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # pragma: no cover - non-POSIX
        return 1


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue's figures (``mem_*``: the part held in memory; the rest is on disk)."""

    name: str
    items: int
    bytes: int
    total_items: int
    logsize: int
    journal_size: int
    expired_items: int
    mem_items: int
    mem_bytes: int
    age: int
    discarded: int
    waiters: int
    open_transactions: int
    transactions: int
    canceled_transactions: int
    total_flushes: int
    journal_rewrites: int
    journal_rotations: int
    open_leases: int
    dead_lettered: int
    children: tuple[str, ...]
    max_items: int
    max_bytes: int
    create_time: int
    replaying: bool = False
    """A queue on disk whose replay has not finished (start-up replays in the background):
    its figures are what its replay has read so far (0 before it starts; from a checkpoint,
    the checkpoint's items and bytes as soon as it starts)."""


@dataclass(frozen=True, slots=True)
class StatsSnapshot:
    """Every figure of a server at one moment."""

    uptime: int
    time: int
    version: str
    curr_items: int
    total_items: int
    bytes: int
    reserved_memory_ratio: float
    curr_connections: int
    total_connections: int
    cmd_get: int
    cmd_set: int
    cmd_peek: int
    get_hits: int
    get_misses: int
    bytes_read: int
    bytes_written: int
    queue_creates: int
    queue_deletes: int
    queue_expires: int
    journal_torn_tails: int
    journal_write_errors: int
    journal_fsyncs: int
    journal_fsync_waits: int
    journal_fsyncs_aio: int
    journal_files_open: int
    journal_files_limit: int
    journal_files_evictions: int
    journal_files_reopens: int
    journal_files_emfile: int
    journal_files_refused: int
    journal_files_put_off: int
    queues_replaying: int
    """Queues on disk not replayed yet (start-up replays them in the background); they are in
    :attr:`queues` with ``replaying`` set."""
    status: str
    readable: bool
    writable: bool
    queues: list[QueueStats] = field(default_factory=list)
    """Sorted by name."""
    front_ends: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per front end (by listener name): its connection counts and its own counters."""
    labelled: dict[str, tuple[str, dict[str, dict[str, int]]]] = field(default_factory=dict)
    """Per front end with counters per entity (beanstalkd: per tube): the label's name and
    ``{entity: {counter: value}}`` (``curr_*`` are levels, the rest count)."""
    alias_puts: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per alias: items and bytes put through it."""

    def queue(self, name: str) -> QueueStats | None:
        for q in self.queues:
            if q.name == name:
                return q
        return None


GLOBAL_LINES = (
    "uptime",
    "time",
    "version",
    "curr_items",
    "total_items",
    "bytes",
    "reserved_memory_ratio",
    "curr_connections",
    "total_connections",
    "cmd_get",
    "cmd_set",
    "cmd_peek",
    "get_hits",
    "get_misses",
    "bytes_read",
    "bytes_written",
    "queue_creates",
    "queue_deletes",
    "queue_expires",
    "journal_torn_tails",
    "journal_write_errors",
    "journal_fsyncs",
    "journal_fsync_waits",
    "journal_fsyncs_aio",
    "journal_files_open",
    "journal_files_limit",
    "journal_files_evictions",
    "journal_files_reopens",
    "journal_files_emfile",
    "journal_files_refused",
    "journal_files_put_off",
    "queues_replaying",
)
"""The global ``stats`` lines: Kestrel's 19 in Kestrel's order, then tercel's own."""

GLOBAL_LEVELS = frozenset(
    {
        "uptime",
        "time",
        "version",
        "curr_items",
        "bytes",
        "reserved_memory_ratio",
        "curr_connections",
        "journal_files_open",
        "journal_files_limit",
    }
)
"""The global lines that are levels, not counts (the admin port's gauges and labels)."""

GLOBAL_COUNTERS = tuple(k for k in GLOBAL_LINES if k not in GLOBAL_LEVELS)
"""The global lines that only grow: the admin port's ``counters`` (``/stats.json``) and
``tercel_<name>_total`` (``/metrics``)."""

QUEUE_LINES = (
    "items",
    "bytes",
    "total_items",
    "logsize",
    "expired_items",
    "mem_items",
    "mem_bytes",
    "age",
    "discarded",
    "waiters",
    "open_transactions",
    "transactions",
    "canceled_transactions",
    "total_flushes",
    "journal_rewrites",
    "journal_rotations",
    "open_leases",
    "dead_lettered",
)
"""One queue's lines: Kestrel's in Kestrel's order, then tercel's own (leases open now, items
moved to the dead-letter queue); ``children`` follows for a fanout parent, and ``replaying 1``
for a queue on disk not replayed yet."""


def queue_stats(
    ctx: ServerContext, q: PersistentQueue, now: int, replaying: bool = False
) -> QueueStats:
    cfg = q.config
    return QueueStats(
        name=q.name,
        items=len(q),
        bytes=q.bytes,
        total_items=q.total_items,
        logsize=q.log.current_size,
        journal_size=q.log.size,
        expired_items=q.expired_items,
        mem_items=q.mem_items,
        mem_bytes=q.mem_bytes,
        age=q.age(now),
        discarded=q.discarded,
        waiters=q.waiters,
        open_transactions=q.open_reads,
        transactions=q.transactions,
        canceled_transactions=q.canceled_transactions,
        total_flushes=q.total_flushes,
        journal_rewrites=q.journal_rewrites,
        journal_rotations=q.journal_rotations,
        open_leases=ctx.reservations.table.open_count(q),
        dead_lettered=q.dead_lettered,
        children=tuple(ctx.collection.children(q.name)),
        max_items=cfg.max_items,
        max_bytes=cfg.max_size,
        create_time=q.create_time,
        replaying=replaying,
    )


def pending_stats(ctx: ServerContext, now: int, names: list[str] | None = None) -> list[QueueStats]:
    """The figures of the queues on disk not replayed yet (of ``names``, all pending, or of
    every one): those being replayed as far as their replay went, the others' all 0
    (nothing is read for them: 100,000 queues would be 100,000 file reads per ``stats``)."""
    coll = ctx.collection
    if names is None:
        names = coll.pending_names()
    if not names:
        return []
    half = coll.half_built()
    out = []
    for name in names:
        q = half.get(name)
        if q is not None:
            out.append(queue_stats(ctx, q, now, replaying=True))
            continue
        cfg = coll.config.queue_config(name)
        out.append(replace(_NOT_READ, name=name, max_items=cfg.max_items, max_bytes=cfg.max_size))
    return out


_NOT_READ = QueueStats(
    name="",
    items=0,
    bytes=0,
    total_items=0,
    logsize=0,
    journal_size=0,
    expired_items=0,
    mem_items=0,
    mem_bytes=0,
    age=0,
    discarded=0,
    waiters=0,
    open_transactions=0,
    transactions=0,
    canceled_transactions=0,
    total_flushes=0,
    journal_rewrites=0,
    journal_rotations=0,
    open_leases=0,
    dead_lettered=0,
    children=(),
    max_items=0,
    max_bytes=0,
    create_time=0,
    replaying=True,
)
"""A queue on disk not replayed yet (its own name and limits replaced)."""


def snapshot(ctx: ServerContext, names: tuple[str, ...] | None = None) -> StatsSnapshot:
    """Read every figure now (the queues named, or all)."""
    coll = ctx.collection
    st = coll.stats
    now = ctx.clock.now_ms()
    committer = ctx.committer
    status = ctx.status.current
    if names is None:
        queues = list(coll)
        listed = [queue_stats(ctx, q, now) for q in queues] + pending_stats(ctx, now)
        listed.sort(key=lambda q: q.name)
    else:  # a queue not replayed yet is listed as replaying, not replayed now
        queues = [q for q in (coll.replayed(n) for n in names) if q is not None]
        listed = [queue_stats(ctx, q, now) for q in queues]
        listed += pending_stats(ctx, now, [n for n in names if coll.is_pending(n)])
    reserved = sum(q.config.max_memory_size for q in coll) / _physical_memory()
    pool = ctx.journal_files()
    return StatsSnapshot(
        uptime=now // 1000 - ctx.started_at // 1000,
        time=now // 1000,
        version=ctx.version,
        curr_items=coll.total_length,
        total_items=st.total_items,
        bytes=coll.total_bytes,
        reserved_memory_ratio=reserved,
        curr_connections=len(ctx.connections),
        total_connections=ctx.total_connections,
        cmd_get=st.cmd_get,
        cmd_set=st.cmd_set,
        cmd_peek=st.cmd_peek,
        get_hits=st.get_hits,
        get_misses=st.get_misses,
        bytes_read=ctx.bytes_read,
        bytes_written=ctx.bytes_written,
        queue_creates=st.queue_creates,
        queue_deletes=st.queue_deletes,
        queue_expires=st.queue_expires,
        journal_torn_tails=st.journal_torn_tails,
        journal_write_errors=committer.write_errors,
        journal_fsyncs=committer.fsyncs,
        journal_fsync_waits=committer.fsync_waits,
        journal_fsyncs_aio=committer.aio_fsyncs,
        journal_files_open=pool.get("open", 0),
        journal_files_limit=pool.get("limit", 0),
        journal_files_evictions=pool.get("evictions", 0),
        journal_files_reopens=pool.get("reopens", 0),
        journal_files_emfile=pool.get("emfile", 0),
        journal_files_refused=pool.get("refused", 0),
        journal_files_put_off=pool.get("put_off", 0),
        queues_replaying=coll.pending,
        status=status.name,
        readable=status.readable,
        writable=status.writable,
        queues=listed,
        front_ends=ctx.front_end_counters(),
        labelled=ctx.labelled_counters(),
        alias_puts={k: (v[0], v[1]) for k, v in coll.alias_puts.items()},
    )


def _value(snap: StatsSnapshot, key: str) -> object:
    if key == "reserved_memory_ratio":
        return f"{snap.reserved_memory_ratio:.3f}"
    return getattr(snap, key)


def queue_lines(q: QueueStats) -> list[tuple[str, object]]:
    """One queue's lines in Kestrel's order (``children`` only for a fanout parent)."""
    lines: list[tuple[str, object]] = [(k, getattr(q, k)) for k in QUEUE_LINES]
    if q.children:
        lines.append(("children", ",".join(q.children)))
    if q.replaying:
        lines.append(("replaying", 1))
    return lines


def stats_lines(ctx: ServerContext) -> list[tuple[str, object]]:
    """Everything ``stats`` prints: global lines, each front end's, then each queue's."""
    snap = snapshot(ctx)
    lines = [(k, _value(snap, k)) for k in GLOBAL_LINES]
    for fe, counters in sorted(snap.front_ends.items()):
        lines.extend((f"{fe}_{k}", v) for k, v in sorted(counters.items()))
    for q in snap.queues:
        lines.extend((f"queue_{q.name}_{k}", v) for k, v in queue_lines(q))
    return lines


def dump_stats(
    ctx: ServerContext, names: tuple[str, ...]
) -> list[tuple[str, list[tuple[str, object]]]]:
    """``dump_stats`` blocks: the named queues (empty block for an unknown one), or all."""
    snap = snapshot(ctx, names or None)
    if not names:
        return [(q.name, queue_lines(q)) for q in snap.queues]
    out: list[tuple[str, list[tuple[str, object]]]] = []
    for name in names:
        q = snap.queue(name)
        out.append((name, [] if q is None else queue_lines(q)))
    return out
