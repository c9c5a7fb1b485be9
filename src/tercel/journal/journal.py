"""One queue's journal on disk: the files, the buffered appends, replay and torn tails.

Files live directly in the data directory and begin with the queue's name: ``<name>`` is the
file being appended to; ``<name>.<n>`` are older files, replayed first in numeric order;
``<name>~~<anything>`` are temporary files, removed before replay. Queue names can never hold
``.`` or ``~`` (see :mod:`tercel.names`), so these names never collide.

Appends go to an in-memory buffer; :meth:`FileJournal.write_out` hands the whole buffer to the
OS in one ``write`` call. Who calls it, and when, is the owner's business (the server's
group-commit writes every dirty journal once per event-loop pass, before any reply leaves);
without an owner each append is written through at once. Single-threaded, except
:meth:`FileJournal.sync`, which a worker thread may run while the loop keeps appending.
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from tercel.errors import JournalCorrupt, JournalWriteError
from tercel.journal import records as rec
from tercel.names import valid_name

log = logging.getLogger(__name__)

TORN_SCAN = 4096
"""How far past a bad record replay looks for a valid one before calling the bad record a
torn tail. Torn writes are page-sized or smaller: power loss leaves at most the last pages
of a file half-written, so valid data beyond one page means real damage."""


@dataclass(slots=True)
class Truncation:
    """A torn tail that replay cut off."""

    path: str
    offset: int
    dropped: int
    reason: str


@dataclass(slots=True)
class ReplayReport:
    """What a replay read."""

    records: int = 0
    bytes: int = 0
    truncations: list[Truncation] = field(default_factory=list)


def journal_files(data_dir: str, name: str) -> list[str]:
    """The paths of ``name``'s journal files in replay order (older files, then current)."""
    older: list[tuple[int, str]] = []
    prefix = name + "."
    current = None
    for entry in os.listdir(data_dir):
        if entry == name:
            current = os.path.join(data_dir, entry)
        elif entry.startswith(prefix) and entry[len(prefix) :].isdigit():
            older.append((int(entry[len(prefix) :]), os.path.join(data_dir, entry)))
    paths = [p for _, p in sorted(older)]
    if current is not None:
        paths.append(current)
    return paths


def list_queue_names(data_dir: str) -> list[str]:
    """Names of the queues that have journal files in ``data_dir``, sorted.

    Any other file (a temp file, the status file, a stray file with an invalid name) is
    ignored, so a stray file never becomes a queue.
    """
    names = set()
    for entry in os.listdir(data_dir):
        base, dot, suffix = entry.partition(".")
        wanted = (not dot or suffix.isdigit()) and valid_name(base)
        if wanted and os.path.isfile(os.path.join(data_dir, entry)):
            names.add(base)
    return sorted(names)


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class FileJournal:
    """The journal of queue ``name`` in ``data_dir`` (see the module docstring)."""

    def __init__(
        self,
        data_dir: str,
        name: str,
        *,
        on_dirty: Callable[[FileJournal], None] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.name = name
        self.path = os.path.join(data_dir, name)
        self._on_dirty = on_dirty if on_dirty is not None else FileJournal.write_out
        self._buf = bytearray()
        self._fd = -1
        self._written = 0  # bytes of the current file handed to the OS
        self._older = 0  # bytes in older files
        self._failed: JournalWriteError | None = None
        self.syncing = False
        """True while a worker thread runs :meth:`sync`; close waits for it."""
        self._close_after_sync = False
        self._unsynced = False

    # ---- replay -------------------------------------------------------------------------

    def replay(self, sink: rec.RecordSink) -> ReplayReport:
        """Apply every record of every file to ``sink``, in order, then open for appends.

        A torn tail of the newest file is cut off at its last good record (and reported);
        any other bad record raises :class:`JournalCorrupt` with path and offset, leaving
        every file as it was.
        """
        for entry in os.listdir(self.data_dir):
            if entry.startswith(self.name + "~~"):
                os.unlink(os.path.join(self.data_dir, entry))
        report = ReplayReport()
        paths = journal_files(self.data_dir, self.name)
        for i, path in enumerate(paths):
            self._replay_file(path, sink, report, newest=i == len(paths) - 1)
        self._older = sum(os.path.getsize(p) for p in paths if p != self.path)
        self._open()
        return report

    def _replay_file(
        self, path: str, sink: rec.RecordSink, report: ReplayReport, *, newest: bool
    ) -> None:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                return
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                good = self._check_header(buf, path, newest)
                try:
                    for pos, stop in rec.iter_records(buf, good):
                        rec.apply_record(buf, pos, stop, sink)
                        report.records += 1
                        good = stop
                except rec.BadRecord as bad:
                    if not newest or _valid_data_after(buf, bad.offset):
                        raise JournalCorrupt(bad.reason, path, bad.offset) from None
                    report.truncations.append(
                        Truncation(path, bad.offset, size - bad.offset, bad.reason)
                    )
        report.bytes += good
        if good < size:
            log.warning(
                "journal %s: torn tail at offset %d (%s); cut %d bytes",
                path,
                good,
                report.truncations[-1].reason if report.truncations else "header",
                size - good,
            )
            with open(path, "r+b") as fh:
                fh.truncate(good if good >= rec.HEADER_SIZE else 0)
                os.fsync(fh.fileno())

    @staticmethod
    def _check_header(buf: mmap.mmap, path: str, newest: bool) -> int:
        head = buf[: rec.HEADER_SIZE]
        if head == rec.FILE_HEADER:
            return rec.HEADER_SIZE
        if len(head) < rec.HEADER_SIZE and newest and rec.FILE_HEADER.startswith(head):
            return 0  # torn while the header itself was written; replay truncates to 0
        if head[:4] == rec.MAGIC:
            raise JournalCorrupt(f"unsupported journal format version {head[4]}", path, 4)
        raise JournalCorrupt("not a tercel journal (bad file header)", path, 0)

    # ---- appends ------------------------------------------------------------------------

    def _open(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._written = os.fstat(self._fd).st_size
        if self._written == 0:
            _write_all(self._fd, rec.FILE_HEADER)
            self._written = rec.HEADER_SIZE

    def add(self, item_id: int, add_time: int, expiry: int, data: bytes) -> None:
        """Journal an item entering the tail of the queue."""
        if self._failed is not None:
            raise self._failed
        first = not self._buf
        rec.encode_add(self._buf, item_id, add_time, expiry, data)
        if first:
            self._on_dirty(self)

    def remove(self) -> None:
        """Journal the removal of the head item."""
        self._simple(rec.REMOVE_RECORD)

    def flush_items(self) -> None:
        """Journal the removal of every item that is not open."""
        self._simple(rec.FLUSH_RECORD)

    def open_read(self, xid: int) -> None:
        """Journal the head item moving into open read ``xid``."""
        self._xid(rec.OP_OPEN, xid)

    def confirm(self, xid: int) -> None:
        """Journal open read ``xid`` being confirmed (the item is gone)."""
        self._xid(rec.OP_CONFIRM, xid)

    def abort(self, xid: int) -> None:
        """Journal open read ``xid`` being aborted (the item is back at the head)."""
        self._xid(rec.OP_ABORT, xid)

    def _simple(self, record: bytes) -> None:
        if self._failed is not None:
            raise self._failed
        first = not self._buf
        self._buf += record
        if first:
            self._on_dirty(self)

    def _xid(self, op: int, xid: int) -> None:
        if self._failed is not None:
            raise self._failed
        first = not self._buf
        rec.encode_xid(self._buf, op, xid)
        if first:
            self._on_dirty(self)

    def write_out(self) -> None:
        """Hand every buffered record to the OS in one write.

        On failure the file is cut back to its last complete record, the journal refuses
        every later append, and :class:`JournalWriteError` is raised.
        """
        if not self._buf or self._fd < 0:
            return
        data, self._buf = self._buf, bytearray()
        try:
            _write_all(self._fd, data)
        except OSError as exc:
            self._fail(exc)
        self._written += len(data)
        self._unsynced = True

    def _fail(self, exc: OSError) -> None:
        err = JournalWriteError(f"write failed: {exc.strerror or exc}", self.path, self._written)
        self._failed = err
        try:
            os.ftruncate(self._fd, self._written)
        except OSError:
            log.exception("journal %s: could not cut back a failed write", self.path)
        log.error("%s", err)
        raise err

    def sync(self) -> None:
        """fdatasync the current file (safe to run in a worker thread)."""
        if self._fd >= 0:
            self._unsynced = False
            os.fdatasync(self._fd)

    @property
    def needs_sync(self) -> bool:
        """True when bytes were written since the last :meth:`sync`."""
        return self._unsynced

    @property
    def failed(self) -> bool:
        """True once a write has failed; every later append raises."""
        return self._failed is not None

    @property
    def size(self) -> int:
        """Bytes of all this queue's files, including what is still buffered."""
        return self._older + self._written + len(self._buf)

    @property
    def current_size(self) -> int:
        """Bytes of the current file (Kestrel's ``logsize``)."""
        return self._written + len(self._buf)

    def close(self) -> None:
        """Write out, fsync and close. Deferred to the end of an in-flight sync."""
        if self._fd < 0:
            return
        if self.syncing:
            self._close_after_sync = True
            return
        try:
            if self._failed is None:
                self.write_out()
                os.fsync(self._fd)
        finally:
            os.close(self._fd)
            self._fd = -1

    def sync_done(self) -> None:
        """Called by the sync owner on the loop thread when a worker's :meth:`sync` ended."""
        self.syncing = False
        if self._close_after_sync:
            self._close_after_sync = False
            self.close()

    def erase(self) -> None:
        """Close and delete every file of this journal."""
        self._buf.clear()
        self.close()
        for path in journal_files(self.data_dir, self.name):
            os.unlink(path)
        self._older = self._written = 0


def _valid_data_after(buf: mmap.mmap, bad: int) -> bool:
    """True when a valid record starts anywhere in the page after offset ``bad``, or where
    the bad record's own length points (then the bad record is damage, not a torn tail)."""
    candidates: Iterator[int] = iter(range(bad + 1, min(len(buf), bad + TORN_SCAN)))
    if bad + rec.PREFIX_SIZE <= len(buf):
        length = int.from_bytes(buf[bad : bad + 4], "little")
        nxt = bad + rec.PREFIX_SIZE + length
        if nxt < len(buf) and rec.looks_like_record(buf, nxt):
            return True
    return any(rec.looks_like_record(buf, pos) for pos in candidates)
