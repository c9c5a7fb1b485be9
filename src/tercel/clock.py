"""Time, injected: the core never reads the system clock itself.

``now_ms()`` is wall-clock epoch milliseconds (item add times and expiries are absolute, as in
Kestrel's journal). ``monotonic_ms()`` never jumps: it times what is a duration from "now" and
never persisted (reservation deadlines: a lease, an auto-abort, a TTR), so setting the system
clock moves none of them. Tests use :class:`ManualClock` to move time without sleeping.

:class:`Clock` is a compiled trait, not a Protocol: every connection's pump reads
``ctx.clock.now_ms()`` once per loop pass, and from compiled code a call through a Protocol is a
generic Python call (~885 instructions under callgrind), through a trait a native one. A clock
therefore subclasses :class:`Clock` (both implementations here do).
"""

from __future__ import annotations

from time import monotonic_ns, time_ns
from typing import Final

from mypy_extensions import trait

MAX_TIME_MS: Final = (1 << 63) - 1
"""The latest time an item can carry (the journal stores times as signed 64-bit ms, about
292 million years after 1970): later expiries are clamped to it, which means "never" in
practice."""


@trait
class Clock:
    """Where the core gets the time from."""

    def now_ms(self) -> int:
        """Wall-clock time in epoch milliseconds."""
        raise NotImplementedError

    def monotonic_ms(self) -> int:
        """Milliseconds on a clock that never jumps (its zero means nothing)."""
        raise NotImplementedError


class SystemClock(Clock):
    """The real clock."""

    def now_ms(self) -> int:
        return time_ns() // 1_000_000

    def monotonic_ms(self) -> int:
        return monotonic_ns() // 1_000_000


class ManualClock(Clock):
    """A clock that moves only when told to (tests). Its monotonic clock starts at
    ``start_ms`` too, and moves with :meth:`advance` but not with :meth:`jump`."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms
        self._mono = start_ms

    def now_ms(self) -> int:
        return self._now

    def monotonic_ms(self) -> int:
        return self._mono

    def advance(self, ms: int) -> None:
        """Move time forward by ``ms`` milliseconds."""
        self._now += ms
        self._mono += ms

    def jump(self, ms: int) -> None:
        """Set the wall clock ``ms`` milliseconds forward (or back: negative); the monotonic
        clock stays."""
        self._now += ms
