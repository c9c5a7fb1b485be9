"""What a reservation is taken from: the small interface :class:`ReservationTable` calls.

A reservation (:mod:`tercel.core.reservations`) is one of a source's items taken out until it
is confirmed or returned. The table knows nothing else of its sources: it hands a confirmed
or returned reservation back to its source with the source's own id for it (``xid``), and
says why an item comes back, since a source may count the reasons apart (beanstalkd counts a
TTR that passed as a ``timeout``, not a disconnect).

A compiled trait (``mypy_extensions.trait``), so a compiled table calls a compiled source
through its vtable, not as a generic Python call. Implemented by
:class:`tercel.core.queue.PersistentQueue` (the open reads of a Kestrel queue).
"""

from __future__ import annotations

from typing import Final

from mypy_extensions import trait

RETURN_ABORT: Final = 0
"""Returned by a client's request (Kestrel ``/abort``, memcache ``release``, Thrift abort)."""
RETURN_OWNER_GONE: Final = 1
"""Returned because its owner ended (the connection closed)."""
RETURN_EXPIRED: Final = 2
"""Returned because its deadline passed."""


@trait
class ReservationSource:
    """The calls a :class:`~tercel.core.reservations.ReservationTable` makes on a source."""

    def confirm_reserved(self, xid: int) -> bool:
        """Remove reserved item ``xid`` for good; whether it was still reserved. Raises the
        source's error when it cannot record that."""
        raise NotImplementedError

    def return_reserved(self, xids: list[int], reason: int) -> int:
        """Put reserved items ``xids`` back where they were (in this order: the oldest
        first), ``reason`` one of the ``RETURN_*`` constants; how many were still reserved.
        Raises the source's error when it cannot record that."""
        raise NotImplementedError

    def source_name(self) -> str:
        """A name for logs."""
        raise NotImplementedError
