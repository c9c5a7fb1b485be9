"""Latency distributions: log-scale histograms cheap enough for every command.

Recording a sample is one table look-up and one list increment (plus a running sum): no
per-sample list, no lock, no allocation, so a command pays a ``perf_counter_ns()`` pair, one
dict look-up for its queue and one ``add``. Only per-queue histograms are written; the
server-wide distribution is their sum, made when read. Values below 16 are counted exactly;
above that each power of two is split into 8 buckets, so a bucket is at most 12.5% wide and a
percentile read from the bucket midpoint is within about 6% of the true value (HdrHistogram's
idea with 3 significant bits; Ostrich's Histogram has similar 1.3x buckets). Values from 2**36
up share the last bucket. Reading (percentiles, deltas for ``?period=``) walks the buckets and
is the admin endpoint's cost, not the command's.
"""

from __future__ import annotations

from array import array
from collections.abc import Generator, Iterator

_MAX_BITS = 36
BUCKETS = ((_MAX_BITS - 4) << 3) + 16
"""Number of buckets: 16 exact ones, then 8 per power of two up to 2**36."""

PERCENTILES = (
    ("p25", 0.25),
    ("p50", 0.5),
    ("p75", 0.75),
    ("p90", 0.9),
    ("p95", 0.95),
    ("p99", 0.99),
    ("p999", 0.999),
    ("p9999", 0.9999),
)
"""Ostrich's percentile keys, in its order."""


def bucket_index(v: int) -> int:
    """The bucket of a non-negative value (negatives count as 0, huge values as the last)."""
    if v < 16:
        return v if v > 0 else 0
    b = v.bit_length()
    if b > _MAX_BITS:
        return BUCKETS - 1
    return ((b - 4) << 3) + ((v >> (b - 4)) & 7) + 8


def bucket_bounds(idx: int) -> tuple[int, int]:
    """``(lowest, highest)`` value counted in bucket ``idx`` (both inclusive)."""
    if idx < 16:
        return idx, idx
    k = idx - 8
    exp, mantissa = k >> 3, k & 7
    low = (8 + mantissa) << exp
    return low, low + (1 << exp) - 1


_FAST = 1 << 12  # a 64 Ki table took 50 ms to build at start-up; 4 Ki covers < 4 ms
_INDEX = array("H", (bucket_index(v) for v in range(_FAST)))
"""The bucket of every value below 65536 (128 KiB, once): latencies in µs below 65 ms and
deliveries in ms below 65 s skip the arithmetic."""


class LogHistogram:
    """Counts of integer samples in log-scale buckets (see the module docstring)."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts: list[int] = []
        """One count per bucket, up to the highest bucket that has a sample (a server with
        100,000 queues keeps four histograms per queue, most of them never used or with a few
        samples: 2.2 KB each with every bucket, about 0.4 KB up to a few ms)."""
        self.sum = 0

    def add(self, v: int) -> None:
        """Count one sample (microseconds or milliseconds, whatever the metric says)."""
        counts = self.counts
        idx = _INDEX[v] if 0 <= v < _FAST else bucket_index(v)
        if idx >= len(counts):
            counts.extend([0] * (idx + 1 - len(counts)))
        counts[idx] += 1
        self.sum += v

    @property
    def count(self) -> int:
        """Samples counted."""
        return sum(self.counts)

    def copy(self) -> LogHistogram:
        """An independent copy (a snapshot for ``?period=`` deltas)."""
        h = LogHistogram()
        h.counts = self.counts.copy()
        h.sum = self.sum
        return h

    def merge(self, other: LogHistogram) -> None:
        """Count ``other``'s samples here too."""
        if not other.counts:
            return
        if not self.counts:
            self.counts = other.counts.copy()
        else:
            mine, theirs = _padded(self.counts, other.counts)
            self.counts = [a + b for a, b in zip(mine, theirs, strict=True)]
        self.sum += other.sum

    def minus(self, earlier: LogHistogram) -> LogHistogram:
        """The samples counted since ``earlier`` (a previous copy of this histogram)."""
        h = LogHistogram()
        now, before = _padded(self.counts, earlier.counts)
        h.counts = [a - b for a, b in zip(now, before, strict=True)]
        h.sum = self.sum - earlier.sum
        return h

    def _nonempty(self) -> Iterator[tuple[int, int]]:
        return ((i, n) for i, n in enumerate(self.counts) if n)

    def percentile(self, p: float) -> int:
        """The value below which a fraction ``p`` of the samples lie (bucket midpoint); 0
        when empty."""
        total = self.count
        if not total:
            return 0
        rank = max(1, round(p * total))
        seen = 0
        for idx, n in self._nonempty():
            seen += n
            if seen >= rank:
                low, high = bucket_bounds(idx)
                return (low + high) // 2
        return 0  # pragma: no cover - the loop always reaches rank

    def summary(self) -> dict[str, int | float]:
        """Ostrich's distribution fields: count, sum, minimum, maximum, average and the
        percentiles p25 ... p9999 (bucket-approximated)."""
        total = self.count
        filled = [i for i, _ in self._nonempty()]
        out: dict[str, int | float] = {
            "count": total,
            "sum": self.sum,
            "minimum": bucket_bounds(filled[0])[0] if filled else 0,
            "maximum": bucket_bounds(filled[-1])[1] if filled else 0,
            "average": self.sum // total if total else 0,
        }
        for key, p in PERCENTILES:
            out[key] = self.percentile(p)
        return out


def _padded(a: list[int], b: list[int]) -> tuple[list[int], list[int]]:
    """``a`` and ``b`` with zeros appended to the shorter, so they have the same length."""
    n = max(len(a), len(b))
    return a + [0] * (n - len(a)), b + [0] * (n - len(b))


DISTRIBUTIONS = {
    "set_latency_usec": "Time to handle a set, in microseconds.",
    "get_hit_latency_usec": "Time to answer a get that found an item, in microseconds.",
    "get_miss_latency_usec": "Time to answer a get that found none, in microseconds.",
    "delivery_latency_msec": "Time from an item's add to its removal, in milliseconds.",
}
"""The distributions each :class:`LatencySet` keeps (Ostrich's names, as in ``/stats.json``'s
``metrics``) and their help (``/metrics``' summaries)."""


class LatencySet:
    """The four distributions Kestrel keeps, for the whole server or one queue."""

    __slots__ = ("delivery", "get_hit", "get_miss", "set")

    def __init__(self) -> None:
        self.set = LogHistogram()
        self.get_hit = LogHistogram()
        self.get_miss = LogHistogram()
        self.delivery = LogHistogram()

    def items(self) -> list[tuple[str, LogHistogram]]:
        """``(ostrich_name, histogram)`` pairs."""
        return [
            ("set_latency_usec", self.set),
            ("get_hit_latency_usec", self.get_hit),
            ("get_miss_latency_usec", self.get_miss),
            ("delivery_latency_msec", self.delivery),
        ]


class Metrics:
    """Per-queue latency distributions, and their server-wide sum.

    Per-queue sets are made on first use and dropped by :meth:`prune` once their queue is
    gone (Kestrel removes a deleted queue's stats too, PR #101); what they counted stays in
    the server-wide :attr:`total`.
    """

    __slots__ = ("_retired", "queues")

    def __init__(self) -> None:
        self.queues: dict[str, LatencySet] = {}
        self._retired = LatencySet()

    @property
    def total(self) -> LatencySet:
        """The server-wide distributions (a new object, summed now)."""
        out = LatencySet()
        for lat in (self._retired, *self.queues.values()):
            for (_, mine), (_, theirs) in zip(out.items(), lat.items(), strict=True):
                mine.merge(theirs)
        return out

    def queue(self, name: str) -> LatencySet:
        """The distributions of queue (or alias) ``name``, made on first use."""
        got = self.queues.get(name)
        if got is None:
            got = self.queues[name] = LatencySet()
        return got

    def prune(self, alive: set[str]) -> None:
        """Forget the distributions of names not in ``alive``."""
        for name in [n for n in self.queues if n not in alive]:
            self.retire(name)

    def retire(self, name: str) -> None:
        """Forget the distributions of ``name`` (what they counted stays in the total)."""
        lat = self.queues.pop(name, None)
        if lat is None:
            return
        for (_, mine), (_, theirs) in zip(self._retired.items(), lat.items(), strict=True):
            mine.merge(theirs)

    def total_steps(self, per_pass: int) -> Generator[None, None, LatencySet]:
        """:attr:`total`, summed ``per_pass`` queues at a time with a yield between (a caller
        on the loop lets it run there)."""
        out = LatencySet()
        sets = [self._retired, *self.queues.values()]
        for i in range(0, len(sets), per_pass):
            if i:
                yield
            for lat in sets[i : i + per_pass]:
                for (_, mine), (_, theirs) in zip(out.items(), lat.items(), strict=True):
                    mine.merge(theirs)
        return out
