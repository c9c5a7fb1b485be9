"""tercel as a library: one durable queue in-process, without a server (Kestrel's "as a
library" use).

:class:`PersistentQueue` is the server's own core queue (:mod:`tercel.core.queue`) over the
server's own journal (:class:`tercel.journal.FileJournal`), wired here because the core must
not import the journal. The journal is in write-through mode: every change is handed to the OS
before the call returns, so it survives a crash of the process (``kill -9``); with
``sync_journal = 0`` in the config it is also fsynced, and survives a crash of the machine.

Contract: one thread (or one event loop) uses a queue; :meth:`PersistentQueue.wait_remove` is
the only coroutine. The folder is a data dir like the server's, with its one lock
(:mod:`tercel.storage`): a server, a journal tool or another process holding it refuses
the queue, and the same queue is not opened twice in one process.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from tercel import storage
from tercel.clock import SystemClock
from tercel.config import QueueConfig
from tercel.core import queue as core
from tercel.errors import ConfigError, TercelError
from tercel.names import valid_name


@dataclass(slots=True)
class Item:
    """An item taken or peeked: its payload, its open-read ``xid`` (0 unless taken with
    ``open=True``), and its per-queue ``id`` (which identifies the item, in logs and
    journals; it is never an argument). :meth:`PersistentQueue.confirm` and
    :meth:`~PersistentQueue.abort` take the item itself, or its ``xid``."""

    data: bytes
    xid: int
    id: int


class _FutureWaiter:
    """A blocked :meth:`PersistentQueue.wait_remove`: always an open read, so that an item
    delivered to a caller that gave up meanwhile can be put back."""

    mode = core.READ_OPEN

    def __init__(self, fut: asyncio.Future[tuple[int, core.QItem]]) -> None:
        self.fut = fut

    def deliver(self, xid: int, item: core.QItem) -> None:
        self.fut.set_result((xid, item))


class PersistentQueue:
    """A durable FIFO queue in folder ``path`` (created if missing), named ``name``.

    ``config`` is a :class:`tercel.config.QueueConfig` (default: the server's defaults).
    Usable as a context manager (closed on exit).
    """

    def __init__(self, path: str | Path, name: str, config: QueueConfig | None = None) -> None:
        if not valid_name(name):
            raise ConfigError(f"bad queue name {name!r}")
        self.path = str(path)
        self.name = name
        os.makedirs(self.path, exist_ok=True)
        # The data dir's one lock (tercel.storage): refused while a server or a journal tool
        # holds the folder; shared with this process's other embedded queues.
        self._lock = storage.DataDirLock.for_queue(self.path, name)
        try:
            self._journal = storage.FileJournal(self.path, name)  # no on_dirty: write-through
            self._queue = core.PersistentQueue(
                name, config or QueueConfig(), self._journal, SystemClock()
            )
            self._queue.replay()
        except BaseException:
            self._lock.release()
            raise
        self._sync = self._queue.config.sync_journal == 0
        self._closed = False
        # The open reads handed out, both ways (item id <-> xid): to refuse an id given where
        # an xid belongs.
        self._xid_of: dict[int, int] = {}
        self._id_of: dict[int, int] = {}

    def _durable(self) -> None:
        if self._sync and self._journal.needs_sync:
            self._journal.sync()

    def _check(self) -> core.PersistentQueue:
        if self._closed:
            raise TercelError("the queue is closed")
        return self._queue

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def open_reads(self) -> int:
        """Items taken with ``open=True`` and not yet confirmed or aborted."""
        return self._queue.open_reads

    # ---- the API --------------------------------------------------------------------------

    def add(self, data: bytes, expiry: float | None = None) -> bool:
        """Append ``data`` (expiry: seconds from now); False when the queue is full.

        Raises :class:`~tercel.errors.ItemTooLarge` or a journal error.
        """
        q = self._check()
        now = q.clock.now_ms()
        ok = q.add(bytes(data), None if expiry is None else now + int(expiry * 1000), now)
        self._durable()
        return ok

    def remove(self, open: bool = False) -> Item | None:
        """Take the head item (for good, or as an open read to confirm or abort); None when
        the queue is empty."""
        q = self._check()
        if open:
            got = q.remove_open()
            item = None if got is None else self._opened(got[0], got[1])
        else:
            taken = q.remove()
            item = None if taken is None else Item(taken.data, 0, taken.id)
        self._durable()
        return item

    def peek(self) -> Item | None:
        """The head item without taking it, or None."""
        head = self._check().peek()
        return None if head is None else Item(head.data, 0, head.id)

    def _opened(self, xid: int, item: core.QItem) -> Item:
        self._xid_of[item.id] = xid
        self._id_of[xid] = item.id
        return Item(item.data, xid, item.id)

    def _xid(self, read: Item | int, verb: str) -> int:
        """The xid of ``read`` (an item taken with ``open=True``, or its xid). ValueError for
        an item that is no open read, or an item's ``id`` given where its xid belongs."""
        if isinstance(read, Item):
            if read.xid == 0:
                raise ValueError(f"{verb}: the item was not taken with open=True")
            return read.xid
        if read not in self._id_of and read in self._xid_of:
            raise ValueError(
                f"{verb}({read}): {read} is an open item's id; {verb} takes the item itself "
                f"or its xid ({self._xid_of[read]})"
            )
        return read

    def confirm(self, read: Item | int) -> bool:
        """Finish an open read for good: ``read`` is the item :meth:`remove` (``open=True``)
        returned, or its ``xid``. False when it is not open (confirmed or aborted before, or
        returned by a close). ValueError for an item that was not taken open, or its ``id``
        given instead of its ``xid``."""
        xid = self._xid(read, "confirm")
        ok = self._check().confirm(xid)
        self._forget(xid)
        self._durable()
        return ok

    def abort(self, read: Item | int) -> bool:
        """Return an open read's item to its place in the queue (``read`` as for
        :meth:`confirm`); False when it is not open."""
        xid = self._xid(read, "abort")
        ok = self._check().abort(xid)
        self._forget(xid)
        self._durable()
        return ok

    def _forget(self, xid: int) -> None:
        item_id = self._id_of.pop(xid, None)
        if item_id is not None:
            self._xid_of.pop(item_id, None)

    async def wait_remove(self, timeout: float | None, open: bool = False) -> Item | None:
        """:meth:`remove`, waiting up to ``timeout`` seconds (None: forever) for an item added
        by this process meanwhile."""
        item = self.remove(open)
        if item is not None or (timeout is not None and timeout <= 0):
            return item
        q = self._check()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[int, core.QItem]] = loop.create_future()
        waiter = _FutureWaiter(fut)
        q.wait(waiter)
        try:
            async with asyncio.timeout(timeout):
                xid, got = await asyncio.shield(fut)
        except BaseException as exc:  # timed out or cancelled
            q.cancel_wait(waiter)
            if fut.done():  # delivered just as the caller gave up: give it back
                q.abort(fut.result()[0])
                self._durable()
            else:
                fut.cancel()
            if isinstance(exc, TimeoutError):
                return None
            raise
        if not open:
            q.confirm(xid)
            self._durable()
            return Item(got.data, 0, got.id)
        self._durable()
        return self._opened(xid, got)

    def close(self) -> None:
        """Close the journal and release the lock (open reads return at the next open)."""
        if self._closed:
            return
        self._closed = True
        self._queue.close()
        self._lock.release()

    def __enter__(self) -> PersistentQueue:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
