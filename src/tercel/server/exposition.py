"""The admin port's documents, rendered in slices: Ostrich's ``/stats.json`` and Prometheus'
``/metrics``, from one :class:`Snapshot` of the figures the admin port shows
(``server/kestrel_figures.py``) and the latency distributions (``server/metrics.py``).

Every step here that grows with the number of queues (reading their figures, summing their
distributions, sorting keys, formatting) is a generator that yields between slices
(:data:`~tercel.server.stats.SLICE` queues, :data:`KEYS` keys, :data:`SAMPLES` samples), so the
admin server, which drives them on the loop (``await asyncio.sleep(0)`` at each yield), never
holds the loop for long whatever the number of queues. A server with few queues renders in one
pass, as one response; a bigger one streams its answer (chunked).
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.metrics_core import SummaryMetricFamily
from prometheus_client.samples import Sample

from tercel.server import stats
from tercel.server.context import ServerContext
from tercel.server.figures import ADMIN, COUNTER, LABEL, Reading
from tercel.server.metrics import DISTRIBUTIONS, PERCENTILES, LogHistogram
from tercel.steps import Steps, finish, relay

T = TypeVar("T")

QUEUE_PREFIX = "q/"
"""Per-queue stats are ``q/<queue>/<stat>`` (exported with a ``queue`` label)."""
KEYS = 1024
"""Keys sorted, classified or written as JSON per loop pass."""
SAMPLES = 256
"""Prometheus samples formatted per loop pass."""
PAUSE = None
"""Yielded where the caller should let the loop run."""

Chunks = Iterator[bytes | None]
"""A document's bytes in chunks, :data:`PAUSE` where the loop may run."""


def run(steps: Steps[T]) -> T:
    """``steps`` at once (tests, and small documents)."""
    return finish(steps)


@dataclass
class Snapshot:
    """Every stat at one moment, in Ostrich's four groups."""

    counters: dict[str, int] = field(default_factory=dict)
    gauges: dict[str, int | float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, LogHistogram] = field(default_factory=dict)
    families: dict[str, str] = field(default_factory=lambda: {QUEUE_PREFIX: "queue"})
    """Key prefixes of per-entity stats (``<prefix><entity>/<stat>``) and the Prometheus label
    the entity goes in: ``q/`` (queues) and each front end's, as ``beanstalk/tube/``."""
    help: dict[str, str] = field(default_factory=dict)
    """Each stat's help (its figure's), by its key without the entity: ``items``,
    ``beanstalk/curr_producers``, ``beanstalk/tube/total_jobs``."""

    def minus(self, earlier: Snapshot) -> Snapshot:
        """Counters and distributions counted since ``earlier``; gauges and labels as now."""
        return run(self.minus_steps(earlier))

    def minus_steps(self, earlier: Snapshot) -> Steps[Snapshot]:
        """:meth:`minus` in slices of :data:`KEYS` (gauges, labels and the rest are shared
        with this snapshot: a snapshot is not changed once made)."""
        out = Snapshot({}, self.gauges, self.labels, {}, self.families, self.help)
        before = earlier.counters
        counters = self.counters
        for part in _slices(list(counters), KEYS):
            out.counters.update((k, counters[k] - before.get(k, 0)) for k in part)
            yield
        hists = earlier.metrics
        for some in _slices(list(self.metrics.items()), KEYS // 8):
            out.metrics.update((k, h.minus(hists[k]) if k in hists else h) for k, h in some)
            yield
        return out

    def to_json(self) -> dict[str, Any]:
        """Ostrich's ``stats.json`` document (as :func:`json_chunks` writes it)."""
        return {
            "counters": dict(sorted(self.counters.items())),
            "gauges": dict(sorted(self.gauges.items())),
            "labels": dict(sorted(self.labels.items())),
            "metrics": {k: h.summary() for k, h in sorted(self.metrics.items())},
        }


def _slices(items: list[T], size: int) -> Iterator[list[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class _Budget:
    """Work done since the loop last ran: :meth:`spend` says when to let it run again."""

    def __init__(self, per_pass: int) -> None:
        self.per_pass = per_pass
        self.left = per_pass

    def spend(self, n: int) -> bool:
        """Count ``n`` units; True (and start over) once a pass's worth is spent."""
        self.left -= n
        if self.left > 0:
            return False
        self.left = self.per_pass
        return True


# ---- reading ------------------------------------------------------------------------------


def snapshot_steps(server: ServerContext, copy: bool = False) -> Steps[Snapshot]:
    """Every stat of ``server`` now in Ostrich's groups: the figures shown on the admin port
    (``server/kestrel_figures.py``, each front end's) and the latency distributions; ``copy`` the
    histograms to keep the snapshot. Yields between slices of queues."""
    snap = Snapshot()
    _add(snap, (yield from stats.server_steps(server, ADMIN)), "")
    for fe, readings in server.front_end_counters().items():
        _add(snap, readings, f"{fe}/")
    for fe, (label, entities) in server.labelled_counters().items():
        prefix = f"{fe}/{label}/"
        snap.families[prefix] = label
        for i, (entity, readings) in enumerate(entities, 1):
            _add(snap, readings, prefix, f"{entity}/")
            if i % stats.SLICE == 0:
                yield
    for batch in stats.queue_batches(server, ADMIN):
        for r in batch:
            _add(snap, r.readings, QUEUE_PREFIX, f"{r.name}/")
        yield
    for r in stats.alias_readings(server):
        _add(snap, r.readings, QUEUE_PREFIX, f"{r.name}/")
    metrics = server.metrics
    coll = server.collection
    aliases = coll.config.aliases
    for part in _slices(list(metrics.queues), KEYS):
        for name in part:  # a deleted queue's distributions go (Kestrel PR #101)
            if name not in aliases and coll.replayed(name) is None:
                metrics.retire(name)
        yield
    total = yield from metrics.total_steps(stats.SLICE)
    for key, h in total.items():
        snap.metrics[key] = h
    for sets in _slices(list(metrics.queues.items()), stats.SLICE):
        for name, lat in sets:
            for key, h in lat.items():
                if h.sum or any(h.counts):  # a queue's empty distributions are left out
                    snap.metrics[f"q/{name}/{key}"] = h.copy() if copy else h
        yield
    return snap


def _add(snap: Snapshot, readings: list[Reading], prefix: str, entity: str = "") -> None:
    """File each reading under ``<prefix><entity><its admin name>`` in its kind's group."""
    for f, v in readings:
        key = f.admin_name
        if key is None:
            continue
        stat = key if prefix == QUEUE_PREFIX else prefix + key
        snap.help[stat] = f.help
        full = prefix + entity + key
        if f.kind is LABEL:
            snap.labels[full] = str(v)
        elif f.kind is COUNTER:
            snap.counters[full] = v
        else:
            snap.gauges[full] = round(v, 3) if isinstance(v, float) else v


class PeriodCollector:
    """Ostrich's latched collector: :meth:`latch` closes a window every ``period`` seconds;
    :meth:`report` gives the last closed window, or what was counted since the collector
    began while the first window is still open. The admin server takes the snapshots in
    slices itself and hands them to :meth:`close` (``start`` is the first)."""

    def __init__(self, take: Callable[[], Snapshot], start: Snapshot | None = None) -> None:
        self._take = take
        self.start = take() if start is None else start
        """The snapshot the open window began with."""
        self.last: Snapshot | None = None
        """The deltas of the last closed window (None before the first closes)."""

    def close(self, now: Snapshot, deltas: Snapshot) -> None:
        """Close the current window at ``now`` (``deltas``: ``now.minus(start)``)."""
        self.last = deltas
        self.start = now

    def latch(self) -> None:
        """Close the current window."""
        now = self._take()
        self.close(now, now.minus(self.start))

    def report(self) -> Snapshot:
        """The deltas of the last closed window (or of the open first one)."""
        if self.last is not None:
            return self.last
        return self._take().minus(self.start)


# ---- /stats.json --------------------------------------------------------------------------


def _sorted_keys(keys: list[str]) -> Generator[None, None, Iterator[str]]:
    """``keys`` in order: sorted in runs of :data:`KEYS` (a yield after each), merged as
    read."""
    runs: list[list[str]] = []
    for part in _slices(keys, KEYS):
        if runs:
            yield
        runs.append(sorted(part))
    if len(runs) <= 1:
        return iter(runs[0] if runs else [])
    return heapq.merge(*runs)


def json_chunks(snap: Snapshot) -> Chunks:
    """Ostrich's ``stats.json`` document of ``snap`` (compact JSON, keys sorted)."""
    groups: list[tuple[str, dict[str, Any], Callable[[Any], Any], int]] = [
        ("counters", snap.counters, _same, 1),
        ("gauges", snap.gauges, _same, 1),
        ("labels", snap.labels, _same, 1),
        ("metrics", snap.metrics, LogHistogram.summary, 16),  # (a summary: 16 keys' worth)
    ]
    budget = _Budget(KEYS)
    for i, (group, values, encode, cost) in enumerate(groups):
        ordered = yield from relay(_sorted_keys(list(values)), PAUSE)
        yield (b"{" if i == 0 else b",") + b'"' + group.encode() + b'":{'
        first = True
        while part := [(k, encode(values[k])) for k in _take(ordered, KEYS // cost)]:
            text = json.dumps(dict(part), separators=(",", ":"))[1:-1].encode()
            yield text if first else b"," + text
            first = False
            if budget.spend(len(part) * cost):
                yield PAUSE
        yield b"}"
    yield b"}"


def _same(v: T) -> T:
    return v


def _take(it: Iterator[T], n: int) -> Iterable[T]:
    for _, x in zip(range(n), it, strict=False):
        yield x


# ---- /metrics -----------------------------------------------------------------------------


class _Families:
    """Metric families as ``generate_latest`` reads a registry."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def _entity_stat(key: str, families: dict[str, str]) -> tuple[str, str, str] | None:
    """For a per-entity key (``q/<queue>/<stat>``, ``beanstalk/tube/<tube>/<stat>``): the
    stat as exported (queues' bare, the others' under their prefix: ``beanstalk/tube/<stat>``),
    the label and the entity (which may contain ``/``: the stat is the last part)."""
    for prefix, label in families.items():
        if key.startswith(prefix):
            entity, stat = key[len(prefix) :].rsplit("/", 1)
            return (stat if prefix == QUEUE_PREFIX else prefix + stat), label, entity
    return None


def prometheus_chunks(snap: Snapshot) -> Chunks:
    """Prometheus text of ``snap``: ``tercel_<stat>`` with a ``queue`` label on per-queue
    stats, ``tercel_<front end>_<label>_<stat>`` with a ``<label>`` label on a front end's
    per-entity ones (beanstalkd's ``tube``). A stat kept both server-wide and per queue (items,
    bytes, total_items, the latencies) is exported per queue only: the server total is their
    sum. prometheus-client formats every sample; a family written over several passes has its
    ``# HELP``/``# TYPE`` lines once."""
    labelled: dict[tuple[str, str], tuple[str, list[tuple[str, Any]]]] = {}
    plain: list[tuple[str, str, Any]] = []
    keys = _Budget(KEYS)
    for kind, values in (("counter", snap.counters), ("gauge", snap.gauges)):
        for part in _slices(list(values), KEYS):
            for key in part:
                value = values[key]
                found = _entity_stat(key, snap.families)
                if found is None:
                    plain.append((kind, key, value))
                    continue
                stat, label, entity = found
                labelled.setdefault((kind, stat), (label, []))[1].append((entity, value))
            if keys.spend(len(part)):
                yield PAUSE
    yield generate_latest(
        _Families(
            [
                _family(kind, _metric_name(key), snap.help.get(key, key), value)
                for kind, key, value in plain
                if (kind, key) not in labelled
            ]
        )
    )
    budget = _Budget(SAMPLES)
    for (kind, stat), (label, samples) in labelled.items():
        doc = snap.help.get(stat, stat)
        for i, some in enumerate(_slices(samples, SAMPLES)):
            fam = _family(kind, _metric_name(stat), doc, None, label)
            for entity, v in some:
                fam.add_metric([entity], v)
            yield _continued(generate_latest(_Families([fam])), i)
            if budget.spend(len(some)):
                yield PAUSE
    yield from _summaries(snap, keys, budget)


def _summaries(snap: Snapshot, keys: _Budget, budget: _Budget) -> Chunks:
    """The per-queue distributions as Prometheus summaries."""
    summaries: dict[str, list[tuple[str, LogHistogram]]] = {}
    for part in _slices(list(snap.metrics.items()), KEYS):
        for key, hist in part:
            if key.startswith(QUEUE_PREFIX):
                name, stat = key[2:].rsplit("/", 1)
                summaries.setdefault(stat, []).append((name, hist))
        if keys.spend(len(part)):
            yield PAUSE
    for stat, hists in summaries.items():
        for i, some in enumerate(_slices(hists, SAMPLES // 8)):
            fam = SummaryMetricFamily(
                _metric_name(stat), DISTRIBUTIONS.get(stat, stat), labels=["queue"]
            )
            for name, hist in some:
                fam.add_metric([name], hist.count, hist.sum)
                for _, p in PERCENTILES:
                    fam.samples.append(
                        Sample(fam.name, {"queue": name, "quantile": str(p)}, hist.percentile(p))
                    )
            yield _continued(generate_latest(_Families([fam])), i)
            if budget.spend(len(some) * 10):  # (count, sum and 8 quantiles)
                yield PAUSE


def _continued(text: bytes, part: int) -> bytes:
    """A family's text; after its first part, without the ``# HELP`` and ``# TYPE`` lines."""
    return text if part == 0 else text.split(b"\n", 2)[2]


def _metric_name(stat: str) -> str:
    return "tercel_" + stat.replace("/", "_")


def _family(
    kind: str, name: str, doc: str, value: Any, label: str = "queue"
) -> CounterMetricFamily | GaugeMetricFamily:
    labels = None if value is not None else [label]
    if kind == "counter":
        return CounterMetricFamily(name, doc, value=value, labels=labels)
    return GaugeMetricFamily(name, doc, value=value, labels=labels)
