"""The data of a queue's keyed leases (:mod:`tercel.core.keyed` has what they do): the views
a caller gets (:class:`KeyedLease`, :class:`KeyedSlice`), one live lease (:class:`Lease`) and
a queue's whole keyed state (:class:`KeyedState`, the queue's ``_keyed`` field, None until
its first keyed lease). No behaviour; below :mod:`tercel.core.queue_state`, which holds it.
"""

from __future__ import annotations

from array import array
from typing import Final

from tercel.core.log import KeyState, Position

ACKED: Final = 1
RELEASED: Final = 2
EXPIRED: Final = 3
HOW: Final = {ACKED: "acked", RELEASED: "released", EXPIRED: "expired"}
"""How a key ended, as KEY_END records it (docs/journal_format.md §18)."""

CHUNK: Final = 1 << 20
"""Payload bytes a take moves per step (and per KEY_TAKE record): a take of a GiB writes
its lease file in 1,024 steps, each a ``pwrite`` (and an ``fdatasync`` for a synced queue),
between which the loop may serve others (``keyed.take_steps``). A 1 KiB item costs about
3 µs of CPU to take (pop, encode, read back from disk in read-behind; pure Python and
compiled alike): a step is a few ms of CPU and its write (docs/journal_format.md §18)."""

CHUNK_ITEMS: Final = 8_192
"""Items a take moves per step at most (small items: the per-item work bounds a step)."""

HEADER: Final = 8
"""A lease file's header: its first item's records start here."""


class KeyedLease:
    """A read-only view of one keyed lease (a copy: it does not change with the lease)."""

    __slots__ = ("count", "created_at", "expires_at", "key", "max_items", "size")

    def __init__(
        self, key: str, *, count: int, size: int, max_items: int, created_at: int, expires_at: int
    ) -> None:
        self.key = key
        self.count = count
        """Items under the key (never 0: an empty take creates nothing)."""
        self.size = size
        """Payload bytes of those items."""
        self.max_items = max_items
        """As first asked (a later take with another max_items is refused)."""
        self.created_at = created_at
        """Wall-clock epoch ms of the first take."""
        self.expires_at = expires_at
        """Wall-clock epoch ms when it runs out (journaled: survives restarts); 0 never."""


class KeyedSlice:
    """Items ``start .. stop - 1`` of a keyed lease as columns, no object per item:
    ``item_ids``, ``add_ms``, ``expiry_ms`` (``array('q')``), ``deliveries``
    (``array('i')``), the payloads one after another in ``data``, and ``offsets``
    (``array('q')``, one more than the items: where each payload starts and the last ends)."""

    __slots__ = ("add_ms", "data", "deliveries", "expiry_ms", "item_ids", "offsets")

    def __init__(  # noqa: PLR0917 (the columns, in order: KeyedSlice(*columns))
        self,
        item_ids: array[int],
        deliveries: array[int],
        add_ms: array[int],
        expiry_ms: array[int],
        data: bytearray,
        offsets: array[int],
    ) -> None:
        self.item_ids = item_ids
        self.deliveries = deliveries
        self.add_ms = add_ms
        self.expiry_ms = expiry_ms
        self.data = data
        self.offsets = offsets

    def __len__(self) -> int:
        return len(self.item_ids)


class Lease:
    """One live keyed lease: its lease file ``n``, its figures and the index of its items'
    records (None until first needed after a restart)."""

    __slots__ = (
        "busy",
        "count",
        "created_at",
        "expires_at",
        "index",
        "key",
        "max_items",
        "n",
        "size",
    )

    def __init__(
        self, key: str, *, n: int, max_items: int, created_at: int, expires_at: int
    ) -> None:
        self.key = key
        self.n = n
        self.count = 0
        self.size = 0
        self.max_items = max_items
        self.created_at = created_at
        self.expires_at = expires_at
        self.index: array[int] | None = array("q", [HEADER])
        """Where each item's records start in the lease file, then where the last ends."""
        self.busy = False
        """A take in steps is still adding to it."""

    def view(self) -> KeyedLease:
        return KeyedLease(
            self.key,
            count=self.count,
            size=self.size,
            max_items=self.max_items,
            created_at=self.created_at,
            expires_at=self.expires_at,
        )


class KeyedState:
    """A queue's keyed leases: live ones, the ended keys it remembers (in the order they
    ended), the next lease file number, and the lease files waiting to be unlinked."""

    __slots__ = ("awaiting", "covering", "ended", "live", "next_n", "unlink_after")

    def __init__(self) -> None:
        self.live: dict[str, Lease] = {}
        self.ended: dict[str, int] = {}
        self.next_n = 1
        self.unlink_after: list[tuple[Position, int]] = []
        """Acked leases' files, unlinked once the KEY_END before the position is durable."""
        self.awaiting: list[int] = []
        """Released leases' files, kept until a compaction that begins after them."""
        self.covering: list[tuple[int, list[int]]] = []
        """``(compactions when one began, files)``: unlinked once the count is passed."""

    def __bool__(self) -> bool:
        return bool(self.live or self.ended)

    def snapshot(self) -> list[KeyState]:
        """The live leases and remembered keys, as a compaction's snapshot writes them."""
        out: list[KeyState] = [(k, 0, 0, 0, 0, 0, 0, how) for k, how in self.ended.items()]
        for lease in self.live.values():
            out.append(
                (
                    lease.key,
                    lease.n,
                    lease.count,
                    lease.size,
                    lease.max_items,
                    lease.created_at,
                    lease.expires_at,
                    0,
                )
            )
        return out
