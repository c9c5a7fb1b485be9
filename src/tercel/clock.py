"""Time, injected: the core never reads the system clock itself.

``now_ms()`` is wall-clock epoch milliseconds (item add times and expiries are absolute, as in
Kestrel's journal). Tests use :class:`ManualClock` to move time without sleeping.
"""

from __future__ import annotations

import time
from typing import Final, Protocol

MAX_TIME_MS: Final = (1 << 63) - 1
"""The latest time an item can carry (the journal stores times as signed 64-bit ms, about
292 million years after 1970): later expiries are clamped to it, which means "never" in
practice."""


class Clock(Protocol):
    """Where the core gets the time from."""

    def now_ms(self) -> int:
        """Wall-clock time in epoch milliseconds."""
        ...


class SystemClock:
    """The real clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told to (tests)."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms

    def now_ms(self) -> int:
        return self._now

    def advance(self, ms: int) -> None:
        """Move time forward by ``ms`` milliseconds."""
        self._now += ms
