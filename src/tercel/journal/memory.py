"""Journals that keep no file: the RAM twin used by tests, and the null journal.

:class:`MemoryJournal` encodes the same records into a ``bytearray`` and replays them with the
same decoder, so the core's test suite can run unchanged against it and against
:class:`~tercel.journal.journal.FileJournal`. :class:`NullJournal` is for queues configured
with ``journal = false``: it records nothing and replays nothing.
"""

from __future__ import annotations

from tercel.journal import records as rec
from tercel.journal.journal import ReplayReport


class MemoryJournal:
    """A journal in RAM with the same surface and record format as the file journal."""

    def __init__(self) -> None:
        self.data = bytearray(rec.FILE_HEADER)
        self.failed = False
        self.needs_sync = False

    def replay(self, sink: rec.RecordSink) -> ReplayReport:
        """Apply every record so far to ``sink``."""
        report = ReplayReport()
        for pos, stop in rec.iter_records(self.data, rec.HEADER_SIZE):
            rec.apply_record(self.data, pos, stop, sink)
            report.records += 1
        report.bytes = len(self.data)
        return report

    def add(self, item_id: int, add_time: int, expiry: int, data: bytes) -> None:
        rec.encode_add(self.data, item_id, add_time, expiry, data)

    def remove(self) -> None:
        self.data += rec.REMOVE_RECORD

    def flush_items(self) -> None:
        self.data += rec.FLUSH_RECORD

    def open_read(self, xid: int) -> None:
        rec.encode_xid(self.data, rec.OP_OPEN, xid)

    def confirm(self, xid: int) -> None:
        rec.encode_xid(self.data, rec.OP_CONFIRM, xid)

    def abort(self, xid: int) -> None:
        rec.encode_xid(self.data, rec.OP_ABORT, xid)

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


class NullJournal(MemoryJournal):
    """A journal that keeps nothing (``journal = false``): restart starts empty."""

    def __init__(self) -> None:
        super().__init__()

    def add(self, item_id: int, add_time: int, expiry: int, data: bytes) -> None:
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

    @property
    def size(self) -> int:
        return 0

    @property
    def current_size(self) -> int:
        return 0
