"""The readings of Kestrel's figures (declared once in ``server/kestrel_figures.py``:
:data:`SERVER`, :data:`QUEUE`, :data:`ALIAS`), in slices, and memcache's
``stats`` and ``dump_stats`` made from them (:func:`stats_slices`, :func:`dump_stats_slices`).
The admin port's ``/stats.json`` and ``/metrics`` (``server/exposition.py``) and the dashboard
(``server/dashboard.py``) read them too, each only the figures it shows.

Front ends: each connection counts itself under its front end's name (``curr_connections``,
``total_connections`` per front end, :data:`~tercel.server.figures.CONNECTIONS`); a front end
with figures of its own registers them with
:meth:`~tercel.server.context.ServerContext.add_counters` (``cmd_*`` of its protocol,
beanstalkd's job counts), shown as ``<front end>_<figure>`` lines, ``<front end>/<figure>``
on the admin port and ``tercel_<front end>_<figure>`` metrics, without touching the others.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from tercel.core.queue import PersistentQueue
from tercel.server import figures
from tercel.server.context import ServerContext
from tercel.server.figures import DASHBOARD, WIRE, Figure, Reading
from tercel.server.kestrel_figures import ALIAS, QUEUE, SERVER, QueueSource, ServerSource
from tercel.steps import Steps, finish, relay

T = TypeVar("T")

# ---- readings -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueReading:
    """One queue's figures shown on one view, at one moment."""

    name: str
    readings: list[Reading]


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
    return finish(server_steps(ctx, view))


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
        ordered = yield from relay(sorted_names(ctx), [])
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
    readings = yield from relay(server_steps(ctx, WIRE), PAUSE)
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


async def drive(steps: Steps[T]) -> T:
    """Run ``steps``, letting the loop run at each of its yields."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            result: T = stop.value
            return result
        await asyncio.sleep(0)
