"""Dedup keys: the keys of a queue's keyed puts, each remembered for the queue's dedup window.

A keyed put (:meth:`~tercel.core.queue.PersistentQueue.add_keyed`) first asks :meth:`DedupKeys.
find`: a key put within the window names the item it stored, and the put stores nothing.
Otherwise the put stores its item and :meth:`DedupKeys.remember` keeps the key.

Contract: keys expire in the order they were remembered (one ``deque`` of keys and one of times,
oldest first; times never go back: a wall clock that steps back is read as the last time seen),
so expiry is a pop from the front, never a scan. At most ``max_keys`` keys are held: a key to
remember beyond them, every held key being younger than the window, raises
:class:`~tercel.errors.TooManyKeys` (nothing is dropped to make room: a key dropped early
would let a retry store its item twice). Replay (:meth:`restore`) is never refused: a log's
keys are what was acknowledged. Same threading contract as :mod:`tercel.core.queue`.

Memory: about 200 bytes per key of 40 bytes (the key's ``str``, its dict slot and item id, its
two deque slots and its time; docs/configuration.md, "Dedup keys", has the measurement).
"""

from __future__ import annotations

from collections import deque

from tercel.errors import TooManyKeys

__all__ = ["DedupKeys"]


class DedupKeys:
    """The dedup keys of one queue: key -> item id, expiring ``window`` ms after their put."""

    __slots__ = ("_ids", "_keys", "_last", "_times", "duplicates", "max_keys", "window")

    def __init__(self, window: int, max_keys: int) -> None:
        self.window = window
        """Milliseconds a key is remembered (0: none is)."""
        self.max_keys = max_keys
        self._ids: dict[str, int] = {}
        self._keys: deque[str] = deque()
        self._times: deque[int] = deque()
        self._last = 0
        self.duplicates = 0
        """Keyed puts answered with an earlier put's item id (a count for the stats)."""

    def __len__(self) -> int:
        return len(self._ids)

    def expire(self, now: int) -> None:
        """Forget the keys remembered ``window`` ms or more before ``now``."""
        times = self._times
        cutoff = now - self.window
        while times and times[0] <= cutoff:
            times.popleft()
            self._ids.pop(self._keys.popleft(), None)

    def find(self, key: str, now: int) -> int:
        """The item id ``key`` stored within the window, or -1 (the expired keys are
        forgotten first)."""
        if self._times and self._times[0] <= now - self.window:
            self.expire(now)
        return self._ids.get(key, -1)

    def check_room(self, what: str) -> None:
        """Raise :class:`TooManyKeys` when one more key would exceed ``max_keys`` (call
        :meth:`find` first: it forgets the expired keys). ``what`` names the queue."""
        if len(self._ids) >= self.max_keys:
            raise TooManyKeys(
                f"{what} holds max_dedup_keys={self.max_keys} dedup keys younger than"
                f" dedup_window_ms={self.window}: put without a key or retry later"
            )

    def remember(self, key: str, item_id: int, now: int) -> None:
        """Keep ``key`` for the item ``item_id`` put at ``now`` (after :meth:`find` said -1
        and :meth:`check_room` passed). With a window of 0 nothing is kept."""
        if self.window <= 0:
            return
        now = max(now, self._last)
        self._last = now
        self._ids[key] = item_id
        self._keys.append(key)
        self._times.append(now)

    def restore(self, key: str, item_id: int, at: int, now: int) -> None:
        """Replay: keep ``key`` (put at ``at``) unless it is already held or older than the
        window at ``now``; never refused."""
        if at <= now - self.window or key in self._ids:
            return
        self.remember(key, item_id, at)

    def clear(self) -> None:
        """Forget every key (a snapshot record in replay: the keys that follow are all)."""
        self._ids.clear()
        self._keys.clear()
        self._times.clear()

    def live(self) -> list[tuple[str, int, int]]:
        """``(key, item_id, put time)`` of every key held, oldest first (a compaction's
        snapshot carries them)."""
        ids = self._ids
        return [(k, ids[k], t) for k, t in zip(self._keys, self._times, strict=True) if k in ids]

    def reconfigure(self, window: int, max_keys: int) -> None:
        """Take new settings (``reload``): a shorter window forgets older keys at the next
        :meth:`find`; a lower ``max_keys`` refuses new keys until enough expire."""
        self.window = window
        self.max_keys = max_keys
