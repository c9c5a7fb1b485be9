"""Kestrel's STATS and DUMP_STATS lines, built from the core's plain counters."""

from __future__ import annotations

import os

from tercel.core.queue import PersistentQueue
from tercel.server.context import ServerContext


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # pragma: no cover - non-POSIX
        return 1


def global_lines(server: ServerContext) -> list[tuple[str, object]]:
    """The 19 global lines in Kestrel's order, then tercel's own."""
    coll = server.collection
    st = coll.stats
    now_s = server.clock.now_ms() // 1000
    reserved = sum(q.config.max_memory_size for q in coll) / _physical_memory()
    return [
        ("uptime", now_s - server.started_at // 1000),
        ("time", now_s),
        ("version", server.version),
        ("curr_items", coll.total_length),
        ("total_items", st.total_items),
        ("bytes", coll.total_bytes),
        ("reserved_memory_ratio", f"{reserved:.3f}"),
        ("curr_connections", len(server.connections)),
        ("total_connections", server.total_connections),
        ("cmd_get", st.cmd_get),
        ("cmd_set", st.cmd_set),
        ("cmd_peek", st.cmd_peek),
        ("get_hits", st.get_hits),
        ("get_misses", st.get_misses),
        ("bytes_read", server.bytes_read),
        ("bytes_written", server.bytes_written),
        ("queue_creates", st.queue_creates),
        ("queue_deletes", st.queue_deletes),
        ("queue_expires", st.queue_expires),
        ("journal_torn_tails", st.journal_torn_tails),
        ("journal_write_errors", server.committer.write_errors),
        ("journal_fsyncs", server.committer.fsyncs),
        ("journal_fsync_waits", server.committer.fsync_waits),
        ("journal_fsyncs_aio", server.committer.aio_fsyncs),
    ]


def queue_lines(server: ServerContext, q: PersistentQueue) -> list[tuple[str, object]]:
    """One queue's lines in Kestrel's order (``children`` only for a fanout parent)."""
    now = server.clock.now_ms()
    lines: list[tuple[str, object]] = [
        ("items", len(q)),
        ("bytes", q.bytes),
        ("total_items", q.total_items),
        ("logsize", q.log.current_size),
        ("expired_items", q.expired_items),
        ("mem_items", q.mem_items),
        ("mem_bytes", q.mem_bytes),
        ("age", q.age(now)),
        ("discarded", q.discarded),
        ("waiters", q.waiters),
        ("open_transactions", q.open_reads),
        ("transactions", q.transactions),
        ("canceled_transactions", q.canceled_transactions),
        ("total_flushes", q.total_flushes),
        ("journal_rewrites", q.journal_rewrites),
        ("journal_rotations", q.journal_rotations),
    ]
    # tercel's own, after Kestrel's: leases open now, items moved to the dead-letter queue.
    lines.append(("open_leases", server.reservations.table.open_count(q)))
    lines.append(("dead_lettered", q.dead_lettered))
    children = server.collection.children(q.name)
    if children:
        lines.append(("children", ",".join(children)))
    return lines


def stats_lines(server: ServerContext) -> list[tuple[str, object]]:
    """Everything ``stats`` prints: global lines, then each queue's (sorted by name)."""
    lines = global_lines(server)
    for q in sorted(server.collection, key=lambda q: q.name):
        lines.extend((f"queue_{q.name}_{k}", v) for k, v in queue_lines(server, q))
    return lines


def dump_stats(
    server: ServerContext, names: tuple[str, ...]
) -> list[tuple[str, list[tuple[str, object]]]]:
    """``dump_stats`` blocks: the named queues (empty block for an unknown one), or all."""
    coll = server.collection
    if not names:
        names = tuple(sorted(q.name for q in coll))
    out: list[tuple[str, list[tuple[str, object]]]] = []
    for name in names:
        q = coll.queue(name)
        out.append((name, [] if q is None else queue_lines(server, q)))
    return out
