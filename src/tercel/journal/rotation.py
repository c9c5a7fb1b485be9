"""The crash-safe file moves of a queue journal: rotation, the compaction switch-over, and
erase. Every step here is ordered so that a crash between any two leaves files that replay
(:mod:`tercel.journal.replay`) turns back into the same queue (docs/journal_format.md §12-13).

- **Rotation** closes the current file as ``<name>.<seq>`` and starts ``<name>``: the old
  file is fdatasynced (and its zeros written ahead cut) before its rename, so an older file
  never has an unsynced tail; the new file's name is made durable by the next sync's
  directory fsync. Out of descriptors, it is renamed back and the rotation put off.
- **Compaction** (the queue decides when; this module executes, as Kestrel's
  ``JournalPacker`` does beside its journal): rotate, write a snapshot of the state at the
  rotation point on the ``background`` worker (:func:`~tercel.journal.snapshot.write_snapshot`),
  then switch over: rename it over the newest obsolete file, fsync the directory, unlink the
  older obsolete files, fsync the directory. Every crash window of it can be hit by a test
  through the file seam (:data:`tercel.journal.faults.COMPACTION_CRASHES`).
- **Erase** renames every file to a temporary name (which replay removes) before unlinking
  them on the worker: a crash half way leaves no queue behind.

Threading: the snapshot and the switch-over's file work run on the worker thread; every
change to the journal's state is made on the owner's thread (``done`` callbacks).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Final

from tercel.journal import records as rec
from tercel.journal.base import fsync_dir, log, run_inline
from tercel.journal.checkpointing import CheckpointingJournal
from tercel.journal.files import OUT_OF_DESCRIPTORS, FileOps
from tercel.journal.snapshot import ItemLike, KeyState, write_snapshot

PRESYNC = 256 << 10
"""Rotation fdatasyncs the file it closes before renaming it (an older file never has an
unsynced tail). When more than this many bytes were written since that file's last sync (a
queue that never fsyncs while running: up to ``max_journal_size``), :meth:`FileJournal.rotate`
first has them synced on the background worker and returns False; the owner calls again, and
the fdatasync left on the owner's thread covers only what was written meanwhile."""

_SWITCH_LOCK: Final = threading.Lock()
"""Held by a compaction's switch-over on the worker thread, and by :meth:`FileJournal.erase`
of a journal that is compacting: an erased journal's snapshot is never renamed into place."""


class _Discarded(Exception):
    """A compaction's switch-over found its journal erased or closed: its snapshot file was
    removed, nothing else changed."""


class _Renamed(Exception):
    """A compaction's switch-over failed after its rename: ``steps`` of its three later steps
    (directory fsync, unlinks, directory fsync) were done; ``error`` stopped the next."""

    def __init__(self, steps: int, error: OSError) -> None:
        super().__init__(str(error))
        self.steps = steps
        self.error = error


class RotatingJournal(CheckpointingJournal):
    """A queue journal that rotates, compacts and erases its files (see the module
    docstring)."""

    # ---- rotation and compaction ----------------------------------------------------------

    def rotate(self) -> bool:
        """Close the current file as ``<name>.<seq>`` and start a new one. False if a sync
        is running, or if no descriptor is to be had for the new file (try again later).

        The new file is opened while the old one still is: out of descriptors (EMFILE,
        ENFILE, after the pool closed what it could), the old file is renamed back and stays
        the current one, and the rotation is put off (:attr:`rotations_put_off`); the journal
        goes on. If another step fails (a full disk, a name taken), the journal is marked
        failed, as after a failed write, and :class:`JournalWriteError` is raised: every
        later append raises, so nothing is acknowledged that has no file to go to. What was
        written stays readable at the next start (the old file under one of its two names)."""
        if self.closed or self.syncing or self._failed is not None:
            return False
        if self._written + self._pending < self._rotate_after:
            return False  # put off a moment ago (_put_off)
        self.write_out()
        try:
            fd = self._fd_now()
        except OSError as exc:
            if exc.errno in OUT_OF_DESCRIPTORS:
                return self._put_off(exc)
            self._fail("rotation", exc)
        if self._written - self._synced_at > PRESYNC and self._background is not run_inline:
            self._presync()
            if self.syncing or self._failed is not None:
                return False  # the owner calls again once the worker synced (see PRESYNC)
        ops = self._ops
        old = self._seq
        older = f"{self.path}.{old}"
        try:
            self._cut_ahead()
            ops.fdatasync(fd)
            ops.rename(self.path, older)
            try:
                new = self._dir.open(self.path, os.O_RDWR | os.O_CREAT, keep=self)
            except OSError as exc:
                if exc.errno not in OUT_OF_DESCRIPTORS:
                    raise
                ops.rename(older, self.path)  # back: the old file goes on as the current
                return self._put_off(exc)
            self._fd = -1
            self._dir.forget(self)
            ops.close(fd)
            self._older_files()[old] = self._written
            self._older_total += self._written
            self._seq = old + 1
            self._unsynced = False
            self._open(new)  # the directory is fsynced by the next sync (_sync_name)
        except OSError as exc:
            self._fail("rotation", exc)
        self.rotations += 1
        return True

    def _put_off(self, exc: OSError) -> bool:
        """A rotation found no descriptor for the new file: log, count, return False, and
        try again only once another sixteenth of the file is written (each try costs an
        fdatasync and two renames)."""
        self._rotate_after = self._written + (self._written >> 4)
        self.rotations_put_off += 1
        self._dir.put_off += 1
        log.warning("journal %s: rotation put off: %s", self.path, exc.strerror or exc)
        return False

    def _presync(self) -> None:
        """fdatasync what was written of the current file on the background worker, ahead of
        a rotation (:data:`PRESYNC`). The descriptor stays open meanwhile (:attr:`syncing`:
        the pool does not park it, close and rotation wait). A failure fails the journal, as
        a failed fsync does: the kernel may have dropped the pages, so a later fdatasync could
        succeed without them."""
        try:
            fd = self._fd_now()
        except OSError as exc:
            self._fail("rotation", exc)
        self.syncing = True
        written = self._written
        fdatasync = self._ops.fdatasync

        def done(exc: BaseException | None) -> None:
            if exc is None:
                self._synced_at = max(self._synced_at, written)
            elif self._failed is None:
                error = exc if isinstance(exc, OSError) else OSError(str(exc))
                self._mark_failed("fsync", error)
            self.sync_done()
            if self._unsynced and not self.closed:
                # Written during the sync: a periodic sync timer that fired meanwhile found
                # the journal syncing and was not armed again; this arms it (and retries
                # nothing else: the owner rotates at its next write).
                self._on_dirty(self)

        self._background(lambda: fdatasync(fd), done)

    def compact(
        self,
        next_id: int,
        xid: int,
        open_items: Sequence[tuple[int, ItemLike]],
        items: Iterable[ItemLike],
        cursor: rec.Position | None,
        *,
        dedup_keys: Sequence[tuple[str, int, int]] = (),
        keyed: Sequence[KeyState] = (),
    ) -> bool:
        """Replace the older files by one snapshot of the queue's state; True if started.

        The current file is rotated first; the snapshot describes the state at that point:
        ``open_items`` (xid, item) and ``items`` (in memory, head first), and, when
        ``cursor`` is given (read-behind), that the ADD records from ``cursor`` to the
        rotation point are items still on disk. Files before ``cursor``'s file are replaced;
        without a cursor every older file is. ``keyed``: the keyed leases live and the keys
        remembered (:data:`~tercel.journal.snapshot.KeyState`); ``dedup_keys`` (a list the
        caller made) are the dedup keys held at this point. Items and open reads are read
        from the objects given, on a worker thread: the caller passes copies of its
        containers.
        """
        if self.compacting or self.syncing or self._failed is not None or self.closed:
            return False
        if not self.rotate():
            return False
        taken = (self._seq, rec.HEADER_SIZE)
        keep_from = cursor[0] if cursor is not None else self._seq
        obsolete = sorted(s for s in self._older if s < keep_from)
        if not obsolete:
            return False
        target = obsolete[-1]
        tmp = f"{self.path}~~{target}"
        self.compacting = True

        def work() -> None:  # on the worker thread: the snapshot, then the switch-over
            try:
                write_snapshot(
                    tmp,
                    ops=self._ops,
                    next_id=next_id,
                    xid=xid,
                    open_items=open_items,
                    items=items,
                    cursor=cursor,
                    taken=taken,
                    dedup_keys=dedup_keys,
                    keyed=keyed,
                )
            except BaseException:
                with contextlib.suppress(OSError):
                    self._ops.unlink(tmp)
                raise
            self._switch_files(tmp, target, obsolete)

        self._background(work, lambda exc: self._switched(target, obsolete, taken[0], exc))
        return True

    def _switch_files(self, tmp: str, target: int, obsolete: list[int]) -> None:
        """The switch-over's file work, on the worker thread after the snapshot was written:
        rename it over ``<name>.<target>``, fsync the directory, unlink the other obsolete
        files, fsync the directory (the order every crash window of journal_format.md §13
        relies on). Raises the rename's OSError (nothing changed, the snapshot removed),
        :class:`_Renamed` for a later failure, :class:`_Discarded` when the journal was
        erased (or closed) meanwhile. The directory is opened outside the descriptor pool
        (the loop's): EMFILE there ends the worker's part, and the loop does the rest."""
        ops = self._ops
        with _SWITCH_LOCK:
            if self._erased or self.closed:
                with contextlib.suppress(OSError):
                    ops.unlink(tmp)
                raise _Discarded
            try:
                ops.rename(tmp, f"{self.path}.{target}")
            except OSError:
                with contextlib.suppress(OSError):
                    ops.unlink(tmp)
                raise
            self._finish_switch(target, obsolete, 0, lambda: fsync_dir(self.data_dir, ops))

    def _finish_switch(
        self, target: int, obsolete: list[int], steps: int, sync_dir: Callable[[], None]
    ) -> None:
        """The switch-over's steps after the rename, from step ``steps`` on (0: the first
        directory fsync, 1: the unlinks, 2: the last directory fsync); raises
        :class:`_Renamed` with the steps done."""
        try:
            if steps == 0:
                sync_dir()
                steps = 1
            if steps == 1:
                for seq in obsolete:
                    if seq != target:
                        with contextlib.suppress(FileNotFoundError):
                            self._ops.unlink(f"{self.path}.{seq}")
                steps = 2
            if steps == 2:
                sync_dir()
        except OSError as error:
            raise _Renamed(steps, error) from error

    def _switched(
        self, target: int, obsolete: list[int], seq: int, exc: BaseException | None
    ) -> None:
        """On the owner's thread when the compaction's work ended: take the new files into
        account, or report why not. ``seq`` was the current file's when it started."""
        self.compacting = False
        if self._erased:  # deleted once the worker was done: its files are going anyway
            return
        if isinstance(exc, _Renamed) and exc.error.errno in OUT_OF_DESCRIPTORS:
            try:  # the loop has the pool: it frees a descriptor for the directory
                self._finish_switch(target, obsolete, exc.steps, self._dir.sync)
                exc = None
            except _Renamed as again:
                exc = again
        if isinstance(exc, _Renamed):
            # Renamed, not all of it durable or deleted: what is on disk is a state replay
            # resumes (journal_format.md §13); until a restart this journal takes no more.
            self._mark_failed("compaction", exc.error)
            return
        if isinstance(exc, _Discarded):
            return
        if exc is not None:  # the snapshot or its rename failed: nothing changed
            if isinstance(exc, OSError) and exc.errno in OUT_OF_DESCRIPTORS:
                self._dir.put_off += 1
                log.warning("journal %s: compaction put off: %s", self.path, exc)
            else:
                log.error("journal %s: compaction failed: %s", self.path, exc)
            return
        if seq == self._seq:
            self._name_unsynced = False  # the directory fsyncs covered the current file's name
        gone = set(obsolete)
        for s in obsolete:
            if s != target:
                self._older.pop(s, None)
        self._marks = [n for m in self._mark_list() if m[1] not in gone for n in m]
        self._older[target] = os.path.getsize(f"{self.path}.{target}")
        self._older_total = sum(self._older.values())
        self.compactions += 1
        log.debug("journal %s: compacted into %s.%d", self.path, self.path, target)

    # ---- erase ----------------------------------------------------------------------------

    def erase(self) -> None:
        """Close and delete every file of this journal (a compaction still running is thrown
        away when it ends, not switched over).

        The files are renamed to temporary names here (``<name>~~gone.<seq>``, which replay
        removes: a crash leaves no queue behind) and unlinked on the background worker (an
        unlink frees the file's blocks: milliseconds for a large file); the names are free at
        once for a new queue of the same name."""
        if self.compacting:  # a switch-over may be renaming on the worker right now
            with _SWITCH_LOCK:
                self._erased = True
        self._erased = True
        self._parts = None
        self._pending = 0
        self._unsynced = False  # nothing of it is worth an fsync any more
        self._allocated = self._written
        self.close()
        ops = self._ops
        # The checkpoint first: one left without its files (a crash half way) would be taken
        # by the next queue of this name once its files reach the checkpoint's end.
        with contextlib.suppress(FileNotFoundError):
            ops.unlink(self.checkpoint_path)
        gone: list[str] = []
        moves = [
            (self._path(s), f"{self.path}~~gone.{s}") for s in [*sorted(self._older), self._seq]
        ]
        for n in sorted(self._leases or ()):  # the keyed leases' files go with the queue
            moves.append((f"{self.path}.key.{n}", f"{self.path}~~gone.key.{n}"))
        self._leases = None
        for path, temp in moves:  # no directory listing: it knows them
            try:
                ops.rename(path, temp)
            except FileNotFoundError:
                continue
            gone.append(temp)
        self._marks.clear()
        self._older.clear()
        self._older_total = self._written = 0
        if gone:
            self._background(lambda: _unlink_all(ops, gone), _unlinked)


def _unlink_all(ops: FileOps, paths: list[str]) -> None:
    """Unlink every file of ``paths`` that is there (the worker's part of an erase)."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            ops.unlink(path)


def _unlinked(exc: BaseException | None) -> None:
    if exc is not None:  # left under a temporary name: the next start removes it
        log.error("deleting journal files failed: %s", exc)
