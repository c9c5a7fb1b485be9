"""The one timer that returns reservations whose deadline passed: the loop side of
:class:`tercel.core.reservations.ReservationTable`.

Protocol-neutral: any front end that sets or moves a deadline (memcache's ``lease`` and
``renew``, a Thrift auto-abort read, a beanstalkd ``reserve`` or ``touch``) calls
:meth:`Reservations.arm` after changing the table, and the timer fires at the earliest deadline
(a renew or a shorter one moves it earlier). Deadlines are on the clock's monotonic
milliseconds, so setting the system clock neither fires nor postpones the timer.
"""

from __future__ import annotations

import asyncio

from tercel.clock import Clock
from tercel.core.reservations import ReservationTable


class Reservations:
    """The server's one :class:`ReservationTable` and the timer that enforces its deadlines."""

    def __init__(self, loop: asyncio.AbstractEventLoop, clock: Clock) -> None:
        self.loop = loop
        self.clock = clock
        self.table = ReservationTable(deadline_clock=clock.monotonic_ms)
        self.closed = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0

    def arm(self) -> None:
        """(Re)schedule the expiry timer for the table's earliest deadline."""
        deadline = self.table.next_deadline()
        if self._timer is not None:
            # A timer already set no later than the deadline stays; so does one when no
            # deadline is left: it fires once for nothing, where cancelling it would cost a
            # cancel and a new timer for every reserve+delete of a beanstalkd worker.
            if deadline is None or self._timer_at <= deadline:
                return
            self._timer.cancel()
            self._timer = None
        if deadline is None or self.closed:
            return
        delay = max(0, deadline - self.clock.monotonic_ms()) / 1000  # the table's clock
        self._timer_at = deadline
        self._timer = self.loop.call_later(delay + 0.001, self._expire)

    def _expire(self) -> None:
        self._timer = None
        try:
            self.table.expire()
        finally:
            self.arm()  # whatever happened, the leases still open keep their timer

    def close(self) -> None:
        """Stop the timer for good (shutdown: the journal returns reserved items at the next
        start)."""
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
