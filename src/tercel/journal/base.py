"""One queue's journal files and the current file's appends and syncs: the base every layer of
:class:`~tercel.journal.journal.FileJournal` builds on (see that module for the layers).

Files live directly in the data directory and begin with the queue's name. ``<name>`` is the
file being appended to; ``<name>.<seq>`` are older files, replayed first in numeric order;
``<name>~~<anything>`` are temporary files, removed before replay. Every file has a sequence
number (the current file's is one more than the newest older file's), and a
:data:`~tercel.journal.records.Position` names a record as ``(seq, offset)``. Queue names can
never hold ``.`` or ``~`` (see :mod:`tercel.names`), so these names never collide.

Appends go to an in-memory list of pieces (an ADD's payload is not copied);
:meth:`~tercel.journal.append.AppendLog.write_out` hands them all to the OS in one
``pwritev``. Who calls it, and when, is the owner's business (the server's group commit
writes every dirty journal once per event-loop pass, before any reply leaves); without an
owner each append is written through at once.

:class:`JournalBase` holds the state of every layer (one compiled struct: an attribute read
on the append path is a field access, whichever layer's module declares the method).

Threading: single-threaded, except :meth:`JournalBase.sync`, which runs on worker threads and
touches only its file descriptor.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from typing import Final

from tercel.errors import JournalWriteError
from tercel.journal import checkpoint as ckpt
from tercel.journal import records as rec
from tercel.journal.append import AppendLog, write_all
from tercel.journal.files import OUT_OF_DESCRIPTORS, DataDir, FileOps, default_ops

log = logging.getLogger("tercel.journal.journal")

_NO_OLDER: Final[dict[int, int]] = {}
"""The older files of every journal that has none: one empty dict shared, never added to
(:meth:`JournalBase._older_files` gives a journal its own), not 64 bytes per queue."""

REPLAY_START: Final[rec.Position] = (1, 0)
"""``replay_position`` before and after a replay (one tuple for every journal)."""

MARK_EVERY = 1 << 20
"""The journal notes the position and id of an ADD at least once per this many bytes of a file
(and the first of each file): where to start looking for the head item's record."""

Background = Callable[[Callable[[], None], Callable[[BaseException | None], None]], None]
"""``run(work, done)``: run ``work`` somewhere, then call ``done(error)`` on the owner's thread."""


def run_inline(work: Callable[[], None], done: Callable[[BaseException | None], None]) -> None:
    """The default :data:`Background`: do the work now, on this thread."""
    try:
        work()
    except Exception as exc:
        done(exc)
    else:
        done(None)


def _older_seqs(data_dir: str, name: str) -> list[int]:
    prefix = name + "."
    return sorted(
        int(e[len(prefix) :])
        for e in os.listdir(data_dir)
        if e.startswith(prefix) and e[len(prefix) :].isdigit()
    )


def journal_files(data_dir: str, name: str) -> list[str]:
    """The paths of ``name``'s journal files in replay order (older files, then current)."""
    base = os.path.join(data_dir, name)
    paths = [f"{base}.{seq}" for seq in _older_seqs(data_dir, name)]
    if os.path.exists(base):
        paths.append(base)
    return paths


def list_queue_names(data_dir: str) -> list[str]:
    """Names of the queues that have journal files in ``data_dir``, sorted.

    Any other file (a temp file, the status file, a stray file with an invalid name) is
    ignored, so a stray file never becomes a queue.
    """
    return DataDir(data_dir).queue_names()


def fsync_dir(path: str, ops: FileOps | None = None) -> None:
    """fsync a directory, so that renames and unlinks in it are durable."""
    if ops is None:
        ops = default_ops()
    fd = ops.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        ops.fsync(fd)
    finally:
        ops.close(fd)


class JournalBase(AppendLog):
    """The journal of queue ``name`` in ``data_dir``: its files' names and sizes, the current
    file's descriptor, appends and syncs, the ADD marks, and close (see the module docstring).

    ``directory`` is the data directory's listing, descriptor pool and file operations
    (:class:`~tercel.journal.files.DataDir`), shared by every journal of a server; without
    one the journal has its own (an unbounded pool: one queue in-process). The descriptor of
    the current file is held only between a use and its eviction from the pool (the journal
    reopens it by path when it next needs it); :attr:`closed` is the life cycle.
    """

    def __init__(
        self,
        data_dir: str,
        name: str,
        *,
        on_dirty: Callable[[JournalBase], None] | None = None,
        background: Background | None = None,
        directory: DataDir | None = None,
    ) -> None:
        self.data_dir = data_dir
        self._dir = directory if directory is not None else DataDir(data_dir)
        super().__init__(self._dir.ops, name)
        self._on_dirty = on_dirty if on_dirty is not None else JournalBase.write_out
        self._background = background or run_inline
        self._seq = 1  # sequence number of the current file
        self._older = _NO_OLDER  # seq -> size of each older file (see _older_files)
        self._older_total = 0
        self._size_before_cache: tuple[tuple[int, int, int], int] = ((0, 0, 0), 0)
        self._close_after_sync = False  # close and rotation wait for a worker's sync
        self._erased = False
        self._leases: set[int] | None = None  # the lease files (keyed leases) that exist
        self._marks: list[int] = []  # see MARK_EVERY, in journal order, each mark's
        # item id, seq and offset one after another (no tuple per mark: 64 bytes per queue)
        self._mark_seq = 0  # the file of the last mark
        self._mark_off = 0  # the next mark is due at the first ADD from this offset on
        self._appended = 0  # bytes appended since the start
        self._owner_syncs = False  # a sync ran: the owner makes records durable
        self._synced_at = 0  # bytes of the current file covered by its last sync (PRESYNC)
        self._name_unsynced = False
        """The current file was created (a new queue, a rotation) and the directory not
        fsynced since: the next sync fsyncs it too (:meth:`_sync_name`), so the file's name is
        as durable as its records (a power loss)."""
        # The other layers' state, here so that it is one struct (see the module docstring):
        self._checkpoint_at = 0  # checkpoints.py: _appended when a checkpoint was last due
        self.compacting = False  # rotation.py
        """True while a snapshot is being written in the background."""
        self.rotations = 0
        self.rotations_put_off = 0
        """Rotations that found no descriptor for the new file (``rotate``)."""
        self._rotate_after = 0  # after a rotation put off: the size to try again at
        self.compactions = 0
        self._current_version: int | None = None  # replay.py: of the current file
        self._current_size = 0  # of the current file after replay
        self.replay_position: rec.Position = REPLAY_START
        """During ``replay``, where the record being applied starts."""

    # ---- files ----------------------------------------------------------------------------

    @property
    def path(self) -> str:
        """The current file, ``<data_dir>/<name>``. Made when asked, not kept: the paths are
        used when a file is opened or renamed, and two strings per queue cost 20 MB at
        100,000 queues (docs/benchmarks.md, "Many queues, read-behind, leases")."""
        return os.path.join(self.data_dir, self.name)

    @property
    def checkpoint_path(self) -> str:
        """The checkpoint file (:mod:`tercel.journal.checkpoint`)."""
        return self.path + ckpt.SUFFIX

    def _older_files(self) -> dict[int, int]:
        """The older files' sizes, as a dict that may be changed (the journal's own, made now
        if it had none)."""
        older = self._older
        if older is _NO_OLDER:
            older = self._older = {}
        return older

    def _path(self, seq: int) -> str:
        return self.path if seq == self._seq else f"{self.path}.{seq}"

    def _next_seq(self, seq: int) -> int | None:
        later = [s for s in self._older if s > seq]
        if later:
            return min(later)
        return self._seq if seq < self._seq else None

    def position(self) -> rec.Position:
        """Where the next appended record will start."""
        return self._seq, self._written + self._pending

    def size_before(self, seq: int) -> int:
        """Bytes of the older files whose sequence number is below ``seq``."""
        key = (seq, len(self._older), self._older_total)
        if self._size_before_cache[0] != key:
            total = sum(size for s, size in self._older.items() if s < seq)
            self._size_before_cache = (key, total)
        return self._size_before_cache[1]

    # ---- appends --------------------------------------------------------------------------

    def _open(self, fd: int = -1) -> int | None:
        """Open the current file for appends (after replay, which cut any zeros at its end),
        or take ``fd``, already opened on it (a rotation); return its format version. Raises
        OSError when the file cannot be opened or given its header (a full disk: the file,
        found or made empty, is then removed, so a refused new queue leaves no file)."""
        ops = self._ops
        empty = False  # a file of ours without a header: removed if the header fails
        if fd < 0:
            fd = self._dir.open(self.path, os.O_RDWR | os.O_CREAT)
            empty = True
        try:  # the descriptor is the journal's only once the file has its header
            size = ops.fstat_size(fd)
            empty = empty and size == 0
            if size == 0:
                write_all(ops, fd, rec.FILE_HEADER, 0)
                size = rec.HEADER_SIZE
                self._name_unsynced = True
            empty = False
            version = rec.header_version(ops.pread(fd, rec.HEADER_SIZE, 0))
        except BaseException:
            ops.close(fd)
            if empty:  # no record was in it: a full disk leaves no empty file behind
                with contextlib.suppress(OSError):
                    ops.unlink(self.path)
            raise
        self._fd = fd
        self.closed = False
        self._dir.use(self)
        self._start_file(size)
        self._synced_at = size
        return version

    def _fd_now(self) -> int:
        """The descriptor of the current file, reopened if the pool parked it (raises
        OSError when that fails); the journal becomes the pool's most recently used."""
        fd = self._fd
        if fd < 0:
            fd = self._fd = self._dir.open(self.path, os.O_RDWR, keep=self)
            self._dir.reopened()
        self._dir.use(self)
        return fd

    def _dirty(self) -> None:
        self._on_dirty(self)  # after the append: without an owner this writes at once

    def _error_path(self) -> str:
        return self.path

    def _after_write(self, size: int) -> None:
        self._appended += size

    def park(self) -> bool:
        """Close the descriptor of the current file until the next use (the pool's
        eviction; :class:`~tercel.journal.files.Holder`); the zeros written ahead stay
        (replay cuts them). False while a worker thread syncs.

        What the descriptor is still needed for is done first, so that nothing has to
        reopen the file to finish what was accepted (the reopen could find no descriptor):
        buffered records are written (they were had with the descriptor:
        :meth:`AppendLog._hold`), and a group fsync that is due (:attr:`sync_due`) is run
        now, unless the file's name is not yet durable either (a new file: then False, the
        directory fsync waits for the group). A failure there fails the journal, as in the
        group commit, which then fails the replies that waited for it."""
        if self.syncing or (self.sync_due and self._name_unsynced):
            return False
        fd = self._fd
        if fd < 0:
            return True
        try:
            parts = self._parts
            if parts is not None:
                self._write(fd, parts)
            if self.sync_due:
                self._mark_synced()
                try:
                    self._ops.fdatasync(fd)
                except OSError as exc:
                    self._mark_failed("fsync", exc)
        except JournalWriteError:  # logged and kept: every later append raises it
            pass
        self._fd = -1
        self._ops.close(fd)
        return True

    # ---- syncs ----------------------------------------------------------------------------

    def sync(self) -> None:
        """fdatasync the current file (safe to run in a worker thread).

        A failure marks the journal failed, as a failed write does, and raises
        :class:`JournalWriteError`: after a failed fsync the kernel may have dropped the dirty
        pages, so a later fsync could report success for bytes that never reached the disk.
        """
        if self.closed:
            return
        if self._failed is not None:  # say, the fdatasync of a park (the pool's eviction)
            raise self._failed
        fd = self._fd
        if fd < 0 and not self._unsynced and not self._name_unsynced:
            return  # parked after its last sync: nothing to sync, no reopen
        own = -1
        try:
            if fd < 0 and self.syncing:  # a worker thread: the pool is the loop's
                fd = own = self._ops.open(self.path, os.O_RDWR | os.O_CLOEXEC)
            elif fd < 0:
                fd = self._fd_now()
        except OSError as exc:
            if exc.errno in OUT_OF_DESCRIPTORS and self.syncing:
                log.warning("journal %s: periodic sync put off: %s", self.path, exc)
                return  # still needs_sync: the next period tries again
            self._fail("fsync", exc)
        self._mark_synced()
        try:
            self._ops.fdatasync(fd)
            self._sync_name()
        except OSError as exc:
            self._fail("fsync", exc)
        finally:
            if own >= 0:
                self._ops.close(own)

    def _sync_name(self) -> None:
        """fsync the directory when the current file was created (a new queue, a rotation)
        since the last directory fsync: the file's name (and a rotation's rename) become as
        durable as the records the caller's fsync covers. In a worker thread (a periodic
        sync) the directory is opened outside the pool, and no descriptor puts it off."""
        if not self._name_unsynced:
            return
        if self.syncing:
            try:
                fsync_dir(self.data_dir, self._ops)
            except OSError as exc:
                if exc.errno not in OUT_OF_DESCRIPTORS:
                    raise
                log.warning("journal %s: directory fsync put off: %s", self.path, exc)
                return
        else:
            self._dir.sync()
        self._name_unsynced = False

    def _mark_synced(self) -> None:
        self._owner_syncs = True
        self._synced_at = self._written
        super()._mark_synced()

    def begin_sync(self) -> int:
        """As :meth:`AppendLog.begin_sync`; the first sync of a new file also fsyncs the
        directory (on the loop), so the file's name is as durable as its records."""
        if self.closed:
            return -1
        if self._failed is not None:  # say, the fdatasync of a park (the pool's eviction)
            raise self._failed
        if self._fd < 0 and not self._unsynced and not self._name_unsynced:
            return -1  # parked after its last sync (park): nothing to sync, no reopen
        if not self.closed and self._name_unsynced:
            try:
                self._fd_now()
                self._sync_name()  # before the fsync is submitted: it may complete first
            except OSError as exc:
                self._fail("fsync", exc)
        return super().begin_sync()

    @property
    def holds_descriptor(self) -> bool:
        """True while the current file's descriptor is open; False when the journal is
        closed, or its descriptor parked by the data dir's pool until the next use."""
        return self._fd >= 0

    # ---- marks (where to find an ADD: checkpoints and compaction use them) ---------------

    def _mark(self, item_id: int, seq: int, offset: int) -> None:
        """Note the ADD of ``item_id`` at ``(seq, offset)`` (see :data:`MARK_EVERY`)."""
        marks = self._marks
        marks.append(item_id)
        marks.append(seq)
        marks.append(offset)
        self._mark_seq = seq
        self._mark_off = offset + MARK_EVERY

    def _mark_list(self) -> list[ckpt.Mark]:
        """The marks as ``(item_id, seq, offset)``, in journal order."""
        m = self._marks
        return [(m[i], m[i + 1], m[i + 2]) for i in range(0, len(m), 3)]

    # ---- life cycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Write out, fsync and close. Deferred to the end of an in-flight sync. A journal
        whose descriptor is parked and that has nothing to write or sync is not reopened."""
        if self.closed:
            return
        if self.syncing:
            self._close_after_sync = True
            return
        try:
            if (
                self._failed is None
                and not self._erased  # its files are about to go: no fsync for them
                and (
                    self._fd >= 0
                    or self._parts
                    or self._unsynced
                    or self._allocated > self._written
                    or self._name_unsynced
                )
            ):
                self.write_out()
                self._cut_ahead()
                self._ops.fsync(self._fd_now())
                self._sync_name()
        finally:
            self.closed = True
            fd = self._fd
            self._fd = -1
            self._dir.forget(self)
            if fd >= 0:
                self._ops.close(fd)

    def sync_done(self) -> None:
        """Called by the sync owner on the loop thread when a worker's :meth:`sync` ended."""
        self.syncing = False
        if self._close_after_sync:
            self._close_after_sync = False
            self.close()
