"""Time, injected: the core never reads the system clock itself. One clock for the whole server.

``now_ms()`` is wall-clock epoch milliseconds (item add times and expiries are absolute, as in
Kestrel's journal; a delayed beanstalkd job's logged deadline). ``monotonic_ms()`` never jumps:
it times what is a duration from "now" and never persisted (reservation deadlines: a lease, an
auto-abort, a TTR; the job store's delays, wait timeouts and pauses), so setting the system
clock moves none of them. Every part of a server reads the same :class:`Clock` (the
``ServerContext``'s): the reservation table's deadlines and the job store's timers are on one
monotonic clock, in integer milliseconds.

:class:`Clock` is a compiled trait, not a Protocol: every connection's pump reads
``ctx.clock.now_ms()`` once per loop pass and the job store reads it on every command, and from
compiled code a call through a Protocol is a generic Python call (~885 instructions under
callgrind), through a trait a native one. A clock therefore subclasses :class:`Clock` (both
implementations here do).

Testing aid: :class:`ManualClock` is the one fake clock, for tercel's tests and users' own (it
is compiled with the rest, so a test passes it wherever a :class:`Clock` goes: a
``Server(clock=...)``, a queue, the job store).
"""

from __future__ import annotations

import time
from typing import Final

from librt.time import time as wall_time
from mypy_extensions import trait

MAX_TIME_MS: Final = (1 << 63) - 1
"""The latest time an item can carry (the journal stores times as signed 64-bit ms, about
292 million years after 1970): later expiries are clamped to it, which means "never" in
practice."""

_monotonic: Final = time.monotonic
"""Bound once (compiled, a name imported from ``time`` is looked up on every call). The float
seconds, not ``monotonic_ns``: compiled, a float comes back as a C double, while the
nanoseconds' int is made as a Python int and unboxed again (about 50 instructions more per
read, callgrind). A double holds the milliseconds exactly for the first 285,000 years of
uptime."""


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
    """The real clock: the wall clock through librt's native ``time()`` (compiled, a C call,
    where ``time.time_ns()`` is a Python call of ~0.7k instructions), the monotonic one
    ``CLOCK_MONOTONIC`` (the event loop's)."""

    def now_ms(self) -> int:
        return int(wall_time() * 1000.0)

    def monotonic_ms(self) -> int:
        return int(_monotonic() * 1000.0)


class ManualClock(Clock):
    """A clock that moves only when told to: the testing aid (see the module docstring). Its
    monotonic clock starts at ``start_ms`` too, and moves with :meth:`advance` but not with
    :meth:`jump`."""

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
