"""A queue's items in memory: :class:`QItem`, and :class:`Items`, the FIFO that holds them.

:class:`Items` is a list and the index of its head, not a ``collections.deque``: an empty
deque is 760 bytes (its first 64-slot block is allocated with it), which at 100,000 queues of
a few items each was a quarter of the server's memory (docs/benchmarks.md, "Investigations");
this is about 150 bytes for three items. Both ends stay O(1), amortized:

- ``popleft`` moves the head; the slots before it are cut off once they are at least
  :data:`CUT_AT` and half the list (each cut moves at most as many pointers as were taken
  since the last), and all at once when the queue runs empty;
- ``appendleft`` (an item back from an open read) reuses the slot before the head, or opens
  a gap of an eighth of the list when there is none.

Same threading contract as :mod:`tercel.core.queue`: one thread, nothing waits.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from mypy_extensions import mypyc_attr


@mypyc_attr(acyclic=True)
class QItem:
    """An item: its per-queue id, add time and expiry (epoch ms, 0 = none), payload, and
    how many times it was handed out.

    Holds only ints and bytes, so it can never be part of a reference cycle; compiled, it is
    therefore left out of the cyclic garbage collector (``acyclic``). A tracked item was visited
    by every full collection: with 128 k 1 KiB items in memory one took 57 ms, all other work
    stopped meanwhile (``git show 1f1f505:docs/benchmarks.md``). Never give it a field that may
    hold a container."""

    __slots__ = ("add_time", "data", "deliveries", "expiry", "id")

    def __init__(self, item_id: int, add_time: int, expiry: int, data: bytes) -> None:
        self.id = item_id
        self.add_time = add_time
        self.expiry = expiry
        self.data = data
        self.deliveries = 0


_GONE: Final = QItem(0, 0, 0, b"")
"""What the slots before the head hold (the items taken from there are not kept alive)."""

CUT_AT: Final = 32
"""The fewest taken slots before the head that ``popleft`` cuts off the list (fewer are left
until the queue runs empty or they are half the list)."""

GAP_MIN: Final = 8
"""The fewest free slots ``appendleft`` opens before the head when there is none."""


class Items:
    """The items in memory, head first (see the module docstring). Indexing and iteration
    count from the head; ``first``/``last`` and indexing expect a non-empty queue (IndexError
    otherwise, as a deque)."""

    __slots__ = ("_head", "_list")

    def __init__(self) -> None:
        self._list: list[QItem] = []
        self._head = 0
        """Index of the head item in ``_list``; the slots before it hold :data:`_GONE`."""

    def __len__(self) -> int:
        return len(self._list) - self._head

    def __bool__(self) -> bool:
        return len(self._list) > self._head

    @property
    def slots(self) -> int:
        """Slots the backing list holds: the items and the taken slots not yet cut off (what
        the list costs in memory; a read-only view)."""
        return len(self._list)

    def __iter__(self) -> Iterator[QItem]:
        return iter(self._list[self._head :])

    def __getitem__(self, i: int) -> QItem:
        if i < 0:
            if i < self._head - len(self._list):
                raise IndexError(i)
            return self._list[i]
        return self._list[self._head + i]

    def first(self) -> QItem:
        """The head item."""
        return self._list[self._head]

    def last(self) -> QItem:
        """The newest item."""
        if len(self._list) <= self._head:
            raise IndexError(-1)
        return self._list[-1]

    def append(self, item: QItem) -> None:
        """Add ``item`` after the newest."""
        self._list.append(item)

    def popleft(self) -> QItem:
        """Take the head item."""
        items = self._list
        head = self._head
        item = items[head]
        head += 1
        if head == len(items):  # empty now: start again at the front
            items.clear()
            head = 0
        elif head >= CUT_AT and 2 * head >= len(items):
            del items[:head]
            head = 0
        else:
            items[head - 1] = _GONE
        self._head = head
        return item

    def appendleft(self, item: QItem) -> None:
        """Put ``item`` before the head."""
        head = self._head
        if not head:
            head = max(GAP_MIN, len(self._list) >> 3)
            self._list[0:0] = [_GONE] * head
        head -= 1
        self._list[head] = item
        self._head = head

    def put_back(self, item: QItem) -> None:
        """Return ``item`` (taken by an open read, a lease or a TTR) to its original place:
        the items are kept in item-id order (every memcache item has the same priority, so
        this is beanstalkd's ``(priority, id)`` order), not in the order the returns happen.
        Usually the item is older than every item left, and this is an ``appendleft``."""
        items = self._list
        item_id = item.id
        if len(items) <= self._head or item_id < items[self._head].id:
            self.appendleft(item)
            return
        lo, hi = self._head + 1, len(items)
        while lo < hi:  # the first position whose item is newer
            mid = (lo + hi) // 2
            if items[mid].id < item_id:
                lo = mid + 1
            else:
                hi = mid
        items.insert(lo, item)

    def clear(self) -> None:
        """Drop every item."""
        self._list.clear()
        self._head = 0
