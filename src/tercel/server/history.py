"""The dashboard's memory of the last 15 minutes: depth and counters sampled every second, in
fixed-size rings, so the charts need no database and the memory used has a bound.

Every :meth:`History.record` stores one sample: the time, and for the whole server and for each
queue the number of items waiting and the cumulative number of items added. Rates are computed
when asked for: in = items added per second, out = items that left per second (taken, opened,
leased, expired, flushed or discarded: added minus the growth of the queue). A ring holds
``capacity`` samples (900: 15 minutes at one per second) as ``array('q')`` slots, -1 where a
queue did not exist yet. At most ``max_queues`` queues have rings (8 bytes x 2 series x 900
samples = 14 KiB each, 3.6 MiB for 256); the queues beyond have none until a tracked one is
deleted. A queue that disappears loses its rings at the next sample.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Any

HISTORY_CAPACITY = 900
"""Samples kept: 15 minutes at one sample per second."""
MAX_QUEUES = 256
"""Queues with their own rings (the server-wide rings are always kept)."""
MISSING = -1


class _Rings:
    """Two aligned rings: items waiting and cumulative items added."""

    __slots__ = ("added", "items")

    def __init__(self, capacity: int) -> None:
        self.items = array("q", [MISSING]) * capacity
        self.added = array("q", [MISSING]) * capacity


class History:
    """Samples of the server and its queues over the last ``capacity`` records."""

    def __init__(self, capacity: int = HISTORY_CAPACITY, max_queues: int = MAX_QUEUES) -> None:
        self.capacity = capacity
        self.max_queues = max_queues
        self._times = array("q", [0]) * capacity
        self._count = 0
        self._server = _Rings(capacity)
        self._queues: dict[str, _Rings] = {}

    def __len__(self) -> int:
        return min(self._count, self.capacity)

    def tracked(self, name: str) -> bool:
        """True when ``name`` has its own rings."""
        return name in self._queues

    def tracked_names(self) -> list[str]:
        """The queues with rings, in the order they got them."""
        return list(self._queues)

    @property
    def room(self) -> int:
        """How many more queues can get rings."""
        return self.max_queues - len(self._queues)

    def record(
        self, t_ms: int, server: tuple[int, int], queues: Iterable[tuple[str, int, int]]
    ) -> None:
        """Store one sample taken at ``t_ms``: the server's ``(items, added)`` (``added``: the
        global counter, which never falls) and ``(name, items, added)`` for every queue that
        has rings (:meth:`tracked_names`; one left out was deleted: its rings go) and for those
        that may get them (the first :attr:`room` of the others; the rest are ignored)."""
        slot = self._count % self.capacity
        self._times[slot] = t_ms
        now = {name: (items, added) for name, items, added in queues}
        for name in [n for n in self._queues if n not in now]:  # deleted: free their rings
            del self._queues[name]
        for name, (items, added) in now.items():
            rings = self._queues.get(name)
            if rings is None:
                if len(self._queues) >= self.max_queues:
                    continue
                rings = self._queues[name] = _Rings(self.capacity)
            rings.items[slot] = items
            rings.added[slot] = added
        self._server.items[slot], self._server.added[slot] = server
        self._count += 1

    def _slots(self) -> list[int]:
        n = len(self)
        first = self._count - n
        return [(first + i) % self.capacity for i in range(n)]

    def series(self, name: str | None = None) -> dict[str, Any] | None:
        """``{"t": [unix s], "items": [...], "in": [per s], "out": [per s]}`` for the server
        (``name`` None) or one tracked queue (None when it has no rings). A sample before the
        queue existed is ``null`` and its first rates count from zero; otherwise rates start at
        the second sample."""
        rings = self._server if name is None else self._queues.get(name)
        if rings is None:
            return None
        t: list[float] = []
        items: list[int | None] = []
        rate_in: list[float | None] = []
        rate_out: list[float | None] = []
        prev: tuple[int, int, int] | None = None
        for slot in self._slots():
            now, n, added = self._times[slot], rings.items[slot], rings.added[slot]
            t.append(now / 1000)
            if n == MISSING:  # the queue did not exist yet: it starts from nothing
                items.append(None)
                rate_in.append(None)
                rate_out.append(None)
                prev = (now, 0, 0)
                continue
            items.append(n)
            if prev is None or now <= prev[0]:
                rate_in.append(None)
                rate_out.append(None)
            else:
                seconds = (now - prev[0]) / 1000
                came = max(0, added - prev[2])
                rate_in.append(round(came / seconds, 3))
                rate_out.append(round(max(0, came - (n - prev[1])) / seconds, 3))
            prev = (now, n, added)
        return {"t": t, "items": items, "in": rate_in, "out": rate_out}

    def latest_rates(self) -> dict[str | None, tuple[float, float]]:
        """(in, out) per second between the last two samples, per tracked queue and for the
        server (key None); empty before the second sample."""
        if len(self) < 2:
            return {}
        cur = (self._count - 1) % self.capacity
        prev = (self._count - 2) % self.capacity
        seconds = (self._times[cur] - self._times[prev]) / 1000
        if seconds <= 0:
            return {}
        out: dict[str | None, tuple[float, float]] = {}
        every: list[tuple[str | None, _Rings]] = [(None, self._server)]
        every += list(self._queues.items())
        for name, rings in every:
            before_items, before_added = rings.items[prev], rings.added[prev]
            if before_items == MISSING:  # created since: it started from nothing
                before_items = before_added = 0
            came = max(0, rings.added[cur] - before_added)
            left = max(0, came - (rings.items[cur] - before_items))
            out[name] = (round(came / seconds, 3), round(left / seconds, 3))
        return out
