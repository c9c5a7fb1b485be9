"""Kestrel's figures, declared once: the server's (:data:`SERVER`), each queue's
(:data:`QUEUE`) and each alias's (:data:`ALIAS`), with the sources they read.

Each figure is one :class:`~tercel.server.figures.Figure`: its name (the memcache ``stats``
line), kind, help, how it is read and where it is shown. memcache's ``stats`` and
``dump_stats``, the admin port's ``/stats.json`` and ``/metrics`` and the dashboard read these
tuples (through ``server/stats.py``), each only the figures it shows; nothing else lists them.
A new figure is one more ``Figure(...)`` here (a new ``stats`` line at the end of its group:
clients parse them in order).
"""

from __future__ import annotations

import os
from typing import Any

from tercel.config import QueueConfig
from tercel.core.queue import PersistentQueue
from tercel.core.stats import GlobalStats
from tercel.server import figures
from tercel.server.context import ServerContext
from tercel.server.figures import COUNTER, GAUGE, LABEL, Figure


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


def _oldest_age(created_at: int, now: int) -> int:
    """Milliseconds since ``created_at`` (epoch ms; 0: none, the age is 0)."""
    return max(0, now - created_at) if created_at else 0


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
        "keyed_leases",
        GAUGE,
        "Keyed leases open now (taken, not acked, released or expired).",
        lambda s: s.q.keyed_figures()[0],
        dashboard="keyed_leases",
    ),
    Figure(
        "keyed_items",
        GAUGE,
        "Items held under keyed leases now.",
        lambda s: s.q.keyed_figures()[1],
        dashboard="keyed_items",
    ),
    Figure(
        "keyed_oldest_age",
        GAUGE,
        "Milliseconds since the oldest open keyed lease was taken; 0 when none is open.",
        lambda s: _oldest_age(s.q.keyed_figures()[2], s.now),
        "keyed_oldest_age_msec",
        dashboard="keyed_oldest_age_ms",
    ),
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
    # dedup keys (docs/protocol.md, "Dedup keys")
    Figure(
        "dedup_keys",
        GAUGE,
        "Dedup keys held: keyed puts remembered for the queue's dedup_window_ms.",
        lambda s: s.q.dedup_keys,
        omit_zero=True,
    ),
    Figure(
        "dedup_duplicates",
        COUNTER,
        "Keyed puts answered as duplicates (the original's item id; nothing stored).",
        lambda s: s.q.dedup_duplicates,
        omit_zero=True,
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
(leases open now, items moved to the dead-letter queue, keyed leases open, their items and the
oldest one's age); ``children`` follows for a fanout
parent, and ``replaying 1`` for a queue on disk not replayed yet."""


# ---- an alias's figures ------------------------------------------------------------------

ALIAS: tuple[Figure[tuple[int, int]], ...] = (
    Figure("put_items", COUNTER, "Items put through the alias.", lambda s: s[0], wire=False),
    Figure(
        "put_bytes", COUNTER, "Payload bytes put through the alias.", lambda s: s[1], wire=False
    ),
)
"""An alias's figures (its source: ``(items, bytes)`` put through it), shown per queue name."""
