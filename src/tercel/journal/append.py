"""The group-commit half of a journal, shared by the queue journals and the job log.

:class:`AppendLog` is the base of :class:`~tercel.journal.journal.FileJournal` (one queue) and
:class:`~tercel.journal.joblog.JobJournal` (beanstalkd's jobs). It owns what both do the same:

- **Buffered appends.** A record goes into a list of pieces (payloads are not copied); the
  first append to an empty buffer tells the owner (:meth:`AppendLog._dirty`: the server's group
  committer, ``server/commit.py``), which calls :meth:`AppendLog.write_out` once per event-loop
  pass, before any reply that depends on the records leaves. ``write_out`` hands every piece to
  the OS with one ``pwritev`` per :data:`IOV_MAX` pieces.
- **Failure for good.** A write that fails is cut back to the last complete record, and the
  journal refuses every later append (:class:`JournalWriteError`); so does a failed fsync
  (after one the kernel may have dropped the dirty pages).
- **The descriptor is had before a record is taken.** The first append to an empty buffer
  makes sure the file is open (:meth:`AppendLog._hold`: a queue journal's pool may have parked
  it). Out of descriptors, that append raises :class:`JournalOutOfDescriptors` with nothing
  buffered and the journal not failed: the caller changed nothing yet (the core journals
  before it changes its state), so exactly that request is refused, and a later one works
  once a descriptor is free. A queue journal that its pool parks while records are buffered
  writes them first (``FileJournal.park``: earlier than the group commit would, never later
  than a reply), so :meth:`AppendLog.write_out` never has to reopen a file, and a pass may
  write to more queues than there are descriptors.
- **Zeros written ahead** (:data:`PREALLOCATE`). Once a file has been fsynced, each write that
  grows it past what is allocated also writes the next step of zeros past its end, so the next
  ``fdatasync`` overwrites blocks instead of growing the file (measured ~40 % faster,
  docs/benchmarks.md). A clean close or rotation cuts them (:meth:`AppendLog._cut_ahead`);
  replay treats zeros after the last record of the newest file as the end of the data.
- **The sync hand-off** the committer uses: ``needs_sync``, ``begin_sync``, ``sync_failed``,
  ``failed``.

A subclass fills in four hooks: :meth:`_fd_now` (the descriptor of the file being appended
to, reopened if its pool parked it; called by :meth:`_hold` only when ``_fd`` is -1),
:meth:`_dirty`, :meth:`_error_path` and :meth:`sync`;
and may override :meth:`_after_write` and :meth:`sync_done`. Every file operation goes
through the subclass's :class:`~tercel.journal.files.FileOps` (``_ops``), the seam
fault-injection tests use.
Compiled (``setup.py``): a compiled base keeps the fields its subclasses read on every append
direct struct accesses, and the committer, which types its journals as ``AppendLog``, calls
them natively (a Protocol-typed call from compiled code is a generic Python call, ~9x the
instructions).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Final, NoReturn

from tercel.errors import JournalOutOfDescriptors, JournalWriteError
from tercel.journal.files import OUT_OF_DESCRIPTORS, FileOps

log = logging.getLogger("tercel.journal")

PREALLOCATE: Final = 1 << 20
"""The most zeros a journal that is fsynced writes ahead of its records at a time (format
version 2). An ``fdatasync`` after an append that grows the file must also commit the new
size through the filesystem's own journal; an overwrite of blocks that already exist need
not, and measured about 40 % faster here (docs/benchmarks.md). Cut off again when the file
is closed or rotated."""
PREALLOCATE_FIRST: Final = 64 << 10
"""The first step ahead in a file. Each step doubles up to :data:`PREALLOCATE`, so a queue that
writes little keeps little zeroed space on disk, and a busy one extends once per MiB."""
_ZEROS: Final = memoryview(bytes(PREALLOCATE))

IOV_MAX: Final = 1024
"""The most pieces one ``pwritev`` takes (Linux's ``UIO_MAXIOV``)."""


def write_all(ops: FileOps, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """Write all of ``data`` at file offset ``offset``."""
    n = ops.pwrite(fd, data, offset)
    if n == len(data):  # the common case: no view, no slice
        return
    view = memoryview(data)[n:]
    while view:
        offset += n
        n = ops.pwrite(fd, view, offset)
        view = view[n:]


def write_parts(ops: FileOps, fd: int, parts: list[bytes], size: int, offset: int) -> None:
    """Write ``parts`` (``size`` bytes in all) one after another from file offset ``offset``,
    :data:`IOV_MAX` pieces per call."""
    for i in range(0, len(parts), IOV_MAX):
        chunk = parts if len(parts) <= IOV_MAX else parts[i : i + IOV_MAX]  # no copy if one
        n = ops.pwritev(fd, chunk, offset)
        want = size if len(parts) <= IOV_MAX else sum(len(p) for p in chunk)
        if n < want:  # a short write: the rest of this chunk as one buffer
            write_all(ops, fd, memoryview(b"".join(chunk))[n:], offset + n)
        offset += want


class AppendLog:
    """Buffered appends, group-commit writes, zeros ahead and failure state of one journal
    (see the module docstring)."""

    def __init__(self, ops: FileOps, name: str) -> None:
        self._ops = ops
        self.name = name
        """The journal's name: the queue's, or the job log's (the committer's key for its
        ``sync_journal`` mode)."""
        self.closed = True
        """Not opened yet or closed: nothing is written."""
        self._parts: list[bytes] | None = None  # records not yet written, in order, as
        # pieces (None, not an empty list, while there are none: 56 bytes less per queue)
        self._pending = 0  # their bytes
        self._fd = -1
        self._written = 0  # bytes of the current file handed to the OS
        self._allocated = 0  # bytes of the current file, zeros written ahead included
        self._preallocating = False  # set by the first sync of the current file
        self._ahead = PREALLOCATE_FIRST  # the next step of zeros written ahead; 0: none
        self._failed: JournalWriteError | None = None
        self._unsynced = False
        self.syncing = False
        """True while a worker thread runs a sync of this journal."""
        self.sync_due = False
        """The sync owner's next group fsync covers this journal's records (the committer
        sets it when the buffer of a ``sync_journal = true`` journal fills and when it writes
        one; :meth:`_mark_synced` clears it): a pooled file parked meanwhile is written and
        fdatasynced first, so that the group's fsync needs no descriptor it might not get."""

    # ---- the hooks ------------------------------------------------------------------------

    def _fd_now(self) -> int:
        """The descriptor of the file being appended to (raises OSError when it cannot be
        reopened)."""
        return self._fd

    def _dirty(self) -> None:
        """The buffer went from empty to not empty: tell the owner."""
        raise NotImplementedError

    def _error_path(self) -> str:
        """The file named in errors: the one being appended to."""
        raise NotImplementedError

    def _after_write(self, size: int) -> None:
        """``size`` bytes of records were just written (rotation past a size, counters)."""

    def sync(self) -> None:
        """fdatasync what was written (safe to run in a worker thread: the committer's
        periodic sync); a failure marks the journal failed and raises
        :class:`JournalWriteError`."""
        raise NotImplementedError

    def sync_done(self) -> None:
        """Called by the sync owner on the loop thread when a worker's :meth:`sync` ended."""
        self.syncing = False

    # ---- appends --------------------------------------------------------------------------

    def _append(self, record: bytes) -> None:
        """Buffer one record (raises the failure once the journal has failed, and
        :class:`JournalOutOfDescriptors`, buffering nothing, when the file is not open and
        cannot be reopened: :meth:`_hold`)."""
        if self._failed is not None:
            raise self._failed
        parts = self._parts
        if parts is None:
            if self._fd < 0 and not self.closed:
                self._hold()
            self._pending += len(record)
            self._parts = [record]
            self._dirty()
        else:
            self._pending += len(record)
            parts.append(record)

    def _append_parts(self, pieces: list[bytes], size: int) -> None:
        """Buffer one record given as pieces of ``size`` bytes in all (a payload not copied;
        ``pieces`` becomes the buffer when it is empty, so the caller must not reuse it).
        Raises as :meth:`_append`."""
        if self._failed is not None:
            raise self._failed
        parts = self._parts
        if parts is None:
            if self._fd < 0 and not self.closed:
                self._hold()
            self._pending += size
            self._parts = pieces
            self._dirty()
        else:
            self._pending += size
            parts.extend(pieces)

    def _hold(self) -> None:
        """Reopen the file parked by its pool, before a first record is buffered: from then
        until it is written the descriptor stays (see the module docstring). Out of
        descriptors: :class:`JournalOutOfDescriptors`, the journal goes on; any other
        failure to open fails the journal."""
        try:
            self._fd_now()
        except OSError as exc:
            if exc.errno in OUT_OF_DESCRIPTORS:
                log.warning("journal %s: record refused: %s", self._error_path(), exc.strerror)
                raise JournalOutOfDescriptors(self._error_path(), self._written) from exc
            self._fail("open", exc)

    def write_out(self) -> int:
        """Hand every buffered record to the OS in one ``pwritev`` (per :data:`IOV_MAX`
        pieces); return the bytes written.

        On failure the file is cut back to its last complete record, the journal refuses
        every later append, and :class:`JournalWriteError` is raised.
        """
        parts = self._parts
        if parts is None or self.closed:
            return 0
        try:  # held since the first record was buffered (_hold): no reopen, no EMFILE
            fd = self._fd_now()
        except OSError as exc:  # the records stay buffered: nothing reached the file
            self._fail("open", exc)
        return self._write(fd, parts)

    def _write(self, fd: int, parts: list[bytes]) -> int:
        """:meth:`write_out`'s work, to ``fd`` (the pool's eviction of a journal with
        buffered records writes them this way, without touching the pool)."""
        size = self._pending
        self._parts = None
        self._pending = 0
        try:
            write_parts(self._ops, fd, parts, size, self._written)
        except OSError as exc:
            try:  # no partial record stays behind
                self._ops.ftruncate(fd, self._written)
                self._allocated = self._written
            except OSError:
                log.exception("journal %s: could not cut back a failed write", self._error_path())
            self._fail("write", exc)
        self._written += size
        self._unsynced = True
        if self._written > self._allocated:
            self._allocated = self._written
            if self._preallocating:
                self._preallocate()
        self._after_write(size)
        return size

    # ---- zeros written ahead --------------------------------------------------------------

    def _start_file(self, size: int) -> None:
        """A file of ``size`` bytes becomes the one appended to: nothing ahead yet."""
        self._written = self._allocated = size
        self._preallocating = False
        self._ahead = PREALLOCATE_FIRST

    def _preallocate(self) -> None:
        """Write the next step of zeros past the end of the file (see :data:`PREALLOCATE`).
        Best effort: on failure this file goes on without (the next record write reports a
        full disk); the next file tries again."""
        step = self._ahead
        try:
            write_all(self._ops, self._fd, _ZEROS[:step], self._allocated)
        except OSError as exc:
            log.warning("journal %s: stopped writing space ahead: %s", self._error_path(), exc)
            self._preallocating = False
            self._ahead = 0
            with contextlib.suppress(OSError):  # leave no part of the step behind
                self._ops.ftruncate(self._fd, self._allocated)
            return
        self._allocated += step
        self._ahead = min(2 * step, PREALLOCATE)

    def _cut_ahead(self) -> None:
        """Cut the zeros written ahead, so a closed file ends with its last record."""
        if self._allocated > self._written:
            self._ops.ftruncate(self._fd_now(), self._written)
            self._allocated = self._written

    # ---- failure and sync -----------------------------------------------------------------

    def _fail(self, what: str, exc: OSError) -> NoReturn:
        """Mark the journal failed (every later append raises) and raise the error."""
        raise self._mark_failed(what, exc) from exc

    def _mark_failed(self, what: str, exc: OSError) -> JournalWriteError:
        """Mark the journal failed (every later append raises), log it, return the error."""
        err = JournalWriteError(
            f"{what} failed: {exc.strerror or exc}", self._error_path(), self._written
        )
        self._failed = err
        log.error("%s", err)
        return err

    def _mark_synced(self) -> None:
        self._unsynced = False
        self.sync_due = False
        self._preallocating = self._ahead > 0  # a file that is synced: see PREALLOCATE

    def begin_sync(self) -> int:
        """Count every byte written so far as synced, and return the descriptor whose
        fdatasync makes that true (-1: the journal is closed). For an fsync run by someone
        else (native AIO); its failure must be reported with :meth:`sync_failed`. Raises
        :class:`JournalWriteError` (the journal is failed) if the file cannot be reopened."""
        if self.closed:
            return -1
        try:
            fd = self._fd_now()
        except OSError as exc:
            self._fail("fsync", exc)
        self._mark_synced()
        return fd

    def sync_failed(self, exc: OSError) -> NoReturn:
        """An fsync begun with :meth:`begin_sync` failed: mark the journal failed and raise
        :class:`JournalWriteError`."""
        self._fail("fsync", exc)

    @property
    def needs_sync(self) -> bool:
        """True when bytes were written since the last sync."""
        return self._unsynced

    @property
    def failed(self) -> bool:
        """True once a write has failed; every later append raises."""
        return self._failed is not None
