"""Journals that keep no file: the RAM twin used by tests, and the null journal.

:class:`MemoryJournal` encodes the same records into a ``bytearray`` and replays them with the
same decoder, so the core's test suite can run unchanged against it and against
:class:`~tercel.journal.journal.FileJournal`. :class:`NullJournal` is for queues configured
with ``journal = false``: it records nothing and replays nothing.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from tercel.errors import JournalCorrupt
from tercel.journal import leases
from tercel.journal import records as rec
from tercel.journal.replay import ReplayReport
from tercel.journal.snapshot import ItemLike
from tercel.steps import Steps


class MemoryJournal:
    """A journal in RAM with the same surface and record format as the file journal."""

    def __init__(self) -> None:
        self.data = bytearray(rec.FILE_HEADER)
        self.failed = False
        self.needs_sync = False
        self.compacting = False
        self.pages = True
        self.replay_position: rec.Position = (1, 0)
        self.rotations = 0
        self.compactions = 0
        self.leases: dict[int, bytearray] = {}
        """The lease files (keyed leases), in RAM: number -> bytes."""

    def replay(self, sink: rec.RecordSink, pager: object = None) -> ReplayReport:
        """Apply every record so far to ``sink`` (one by one: ``pager`` is not used)."""
        report = ReplayReport()
        for pos, stop in rec.iter_records(self.data, rec.HEADER_SIZE):
            self.replay_position = (1, pos)
            rec.apply_record(self.data, pos, stop, sink)
            report.records += 1
        report.bytes = len(self.data)
        return report

    def replay_steps(self, sink: rec.RecordSink, pager: object = None) -> Steps[ReplayReport]:
        """:meth:`replay` in one step (a journal in RAM is small)."""
        yield None
        return self.replay(sink, pager)

    def position(self) -> rec.Position:
        """Where the next record will start (there is only one "file", number 1)."""
        return 1, len(self.data)

    def size_before(self, seq: int) -> int:
        """No older files: always 0."""
        return 0

    def reader(self, position: rec.Position) -> MemoryAddReader:
        """A reader of the ADD records from ``position`` on."""
        return MemoryAddReader(self, position[1])

    def rotate(self) -> bool:
        """Nothing to rotate in RAM."""
        return False

    def checkpoint_due(self) -> bool:
        """Never: replay of the RAM twin is its whole history."""
        return False

    def checkpoint(self, **kwargs: object) -> bool:
        """No checkpoints in RAM."""
        return False

    def compact(self, *args: object, **kwargs: object) -> bool:
        """Nothing to compact in RAM: the twin keeps its whole history."""
        return False

    def add(self, item_id: int, add_time: int, expiry: int, data: bytes) -> None:
        rec.encode_add(self.data, item_id, add_time, expiry, data)

    def add_keyed(self, item_id: int, add_time: int, expiry: int, data: bytes, key: str) -> None:
        rec.encode_add_keyed(self.data, item_id, add_time, expiry, data, key=key.encode("ascii"))

    def remove(self) -> None:
        self.data += rec.REMOVE_RECORD

    def flush_items(self) -> None:
        self.data += rec.FLUSH_RECORD

    def open_read(self, xid: int) -> None:
        rec.encode_xid(self.data, rec.OP_OPEN, xid)

    def confirm(self, xid: int) -> None:
        rec.encode_xid(self.data, rec.OP_CONFIRM, xid)

    def abort(self, xid: int) -> None:
        rec.encode_xid(self.data, rec.OP_RETURN, xid)

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def current_size(self) -> int:
        return len(self.data)

    def close(self) -> None:
        """Nothing to release."""

    def erase(self) -> None:
        """Forget every record."""
        del self.data[rec.HEADER_SIZE :]
        self.leases.clear()

    # ---- keyed leases (as FileJournal's) ----------------------------------------------------

    def key_take(
        self,
        key: str,
        *,
        n: int,
        count: int,
        size: int,
        max_items: int,
        created_at: int,
        expires_at: int,
    ) -> None:
        rec.encode_key_take(
            self.data,
            key,
            n=n,
            count=count,
            size=size,
            max_items=max_items,
            created_at=created_at,
            expires_at=expires_at,
        )

    def key_end(self, key: str, how: int) -> None:
        rec.encode_key_end(self.data, key, how)

    def key_renew(self, key: str, expires_at: int) -> None:
        rec.encode_key_renew(self.data, key, expires_at)

    def lease_write(self, n: int, at: int, items: Sequence[ItemLike], sync: bool) -> list[int]:
        buf = self.leases.setdefault(n, bytearray())
        if at == 0:
            buf[:] = rec.FILE_HEADER
            at = rec.HEADER_SIZE
        body, ends = leases.encode_items(items, at)
        buf[at:] = body
        return ends

    def lease_index(self, n: int, count: int) -> array[int]:
        out = array("q", [rec.HEADER_SIZE])
        buf = self.leases.get(n, bytearray())
        try:
            leases.index_buffer(memoryview(buf)[rec.HEADER_SIZE :], rec.HEADER_SIZE, count, out)
        except rec.BadRecord as bad:
            raise JournalCorrupt(bad.reason, f"lease {n}", bad.offset) from None
        if len(out) <= count:
            raise JournalCorrupt(f"lease holds {len(out) - 1} of {count} items", f"lease {n}", 0)
        return out

    def lease_columns(self, n: int, start: int, stop: int) -> leases.Columns:
        return leases.decode_columns(self.leases[n], start, stop)

    def lease_remove(self, n: int) -> None:
        self.leases.pop(n, None)

    def lease_files(self) -> list[int]:
        return sorted(self.leases)

    def durable(self, position: rec.Position, synced: bool) -> bool:
        return True


class MemoryAddReader:
    """:class:`~tercel.journal.readbehind.AddReader` over a :class:`MemoryJournal`."""

    __slots__ = ("_journal", "_pos")

    def __init__(self, journal: MemoryJournal, pos: int) -> None:
        self._journal = journal
        self._pos = pos

    @property
    def position(self) -> rec.Position:
        return 1, self._pos

    def next_add(self) -> tuple[int, int, int, bytes] | None:
        data = self._journal.data
        while self._pos < len(data):
            start = self._pos
            self._pos = rec.check_record(data, start)
            op = rec.record_op(data, start)
            if op == rec.OP_ADD:
                return rec.decode_add(data, start, self._pos)
            if op == rec.OP_ADD_KEYED:
                return rec.decode_add_keyed(data, start, self._pos)[:4]
        return None

    def next_adds(self, budget: int) -> list[tuple[int, int, int, bytes]]:
        out: list[tuple[int, int, int, bytes]] = []
        got = 0
        while got < budget or not out:
            item = self.next_add()
            if item is None:
                break
            out.append(item)
            got += len(item[3])
        return out

    def close(self) -> None:
        """Nothing to release."""


class NullJournal(MemoryJournal):
    """A journal that keeps nothing (``journal = false``): restart starts empty, and items
    can never be left on disk (no read-behind)."""

    def __init__(self) -> None:
        super().__init__()
        self.pages = False

    def add(self, item_id: int, add_time: int, expiry: int, data: bytes) -> None:
        pass

    def add_keyed(self, item_id: int, add_time: int, expiry: int, data: bytes, key: str) -> None:
        pass

    def remove(self) -> None:
        pass

    def flush_items(self) -> None:
        pass

    def open_read(self, xid: int) -> None:
        pass

    def confirm(self, xid: int) -> None:
        pass

    def abort(self, xid: int) -> None:
        pass

    def key_take(self, key: str, **fields: int) -> None:
        pass  # (the lease's items stay in RAM, in :attr:`leases`, until the queue ends)

    def key_end(self, key: str, how: int) -> None:
        pass

    def key_renew(self, key: str, expires_at: int) -> None:
        pass

    @property
    def size(self) -> int:
        return 0

    @property
    def current_size(self) -> int:
        return 0
