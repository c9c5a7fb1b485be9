"""One queue's journal on disk: :class:`FileJournal`, built in layers, one module per concern.

Each layer is a class that extends the one below it, in its own module (beanstalkd keeps its
log group, ``walg.c``, apart from one file's record I/O, ``file.c``; Kestrel keeps packing,
``JournalPacker``, out of ``Journal``):

1. :class:`~tercel.journal.append.AppendLog` (``append.py``): one file's buffered appends,
   the group-commit write (one ``pwritev``), zeros written ahead, failure for good, the sync
   hand-off. Shared with beanstalkd's job log.
2. :class:`~tercel.journal.base.JournalBase` (``base.py``): the queue's file names and sizes,
   the current file's descriptor (in the data dir's pool), syncs (and the directory fsync
   that makes a new file's name durable), the ADD marks, close. Holds the state of every
   layer (one compiled struct).
3. :class:`~tercel.journal.checkpointing.CheckpointingJournal` (``checkpointing.py``): when a
   checkpoint is due, writing one, and checking one against the files at replay.
4. :class:`~tercel.journal.rotation.RotatingJournal` (``rotation.py``): **the crash-safe file
   moves**, rotation, the compaction switch-over and erase, each ordered for every crash window
   (the snapshot itself is written by :func:`~tercel.journal.snapshot.write_snapshot`).
5. :class:`~tercel.journal.replay.ReplayingJournal` (``replay.py``): **replay**, from the
   newest snapshot or a checkpoint, with the torn-tail policy.
6. :class:`FileJournal` (here): what the core calls on every command (the record appends
   ``add``, ``remove``, ``open_read``..., ``size``, ``checkpoint_due``) and the read-behind
   cursor (:class:`~tercel.journal.readbehind.AddReader`): the whole journal, as the core sees
   it through ``QueueLog`` (``core/log.py``) and :mod:`tercel.storage` builds it. The
   per-command methods live on this class, the one without subclasses, because compiled, a
   method called from the core checks ``self``'s type: one compare for such a class, a walk
   of the MRO for a layer below.

To review crash safety, read ``rotation.py`` and ``replay.py`` (with ``tail.py``, the shape of
a torn tail); the rest never moves or cuts a file.

The queue decides *when* to rotate or compact; the journal only executes. Compaction writes
its snapshot through an injected ``background`` runner (a worker thread in the server; inline
by default), then switches over on the owner's thread in one short step.

Threading: single-threaded, except :meth:`FileJournal.sync` and the snapshot writer, which run
on worker threads and touch only their own file descriptors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from tercel.journal import records as rec
from tercel.journal.base import (
    MARK_EVERY,
    Background,
    JournalBase,
    fsync_dir,
    journal_files,
    list_queue_names,
    run_inline,
)
from tercel.journal.checkpointing import CHECKPOINT_EVERY
from tercel.journal.files import DataDir
from tercel.journal.readbehind import AddReader
from tercel.journal.replay import Pager, ReplayingJournal, ReplayReport, Truncation
from tercel.journal.rotation import PRESYNC
from tercel.journal.snapshot import ItemLike

__all__ = [
    "CHECKPOINT_EVERY",
    "MARK_EVERY",
    "PRESYNC",
    "AddReader",
    "Background",
    "FileJournal",
    "ItemLike",
    "Pager",
    "ReplayReport",
    "Truncation",
    "fsync_dir",
    "journal_files",
    "list_queue_names",
    "run_inline",
]


class FileJournal(ReplayingJournal):
    """The journal of queue ``name`` in ``data_dir`` (see the module docstring for its
    layers, and :class:`~tercel.journal.base.JournalBase` for ``directory``).

    ``on_dirty(journal)`` is called on the first append to an empty buffer (the owner's
    group commit then calls :meth:`write_out`); without it each append is written through.
    ``background(work, done)`` runs a compaction's snapshot and the slow file work of
    rotation and erase (inline by default).
    """

    def __init__(
        self,
        data_dir: str,
        name: str,
        *,
        on_dirty: Callable[[FileJournal], None] | None = None,
        background: Background | None = None,
        directory: DataDir | None = None,
    ) -> None:
        # The layers call on_dirty with the journal itself, which is this FileJournal.
        super().__init__(
            data_dir,
            name,
            on_dirty=cast("Callable[[JournalBase], None] | None", on_dirty),
            background=background,
            directory=directory,
        )
        self.pages = True  # (here, not in a layer below: the core reads it, see below)
        """Items can be left on disk and read back (read-behind)."""

    # ---- what the core calls on every command ------------------------------------------------
    # Defined here, on the class the journal is, not in a layer below: called from the core
    # through ``QueueLog``, a compiled method checks that ``self`` is its class, an exact type
    # compare for a class without subclasses and a walk of the MRO otherwise.

    def add(self, item_id: int, add_time: int, expiry: int, data: bytes) -> None:
        """Journal an item entering the tail of the queue."""
        if self._failed is not None:
            raise self._failed
        if self._fd < 0 and self._parts is None and not self.closed:
            self._hold()  # before the mark: a refused ADD leaves none
        pos = self._written + self._pending
        if pos >= self._mark_off or self._seq != self._mark_seq:
            self._mark(item_id, self._seq, pos)
        prefix, fields = rec.add_header(item_id, add_time, expiry, data)
        # The payload is not copied: write_out hands all the pieces to pwritev.
        self._append_parts([prefix, fields, data], rec.ADD_HEAD_SIZE + len(data))

    def add_keyed(self, item_id: int, add_time: int, expiry: int, data: bytes, key: str) -> None:
        """Journal an item entering the tail of the queue with its dedup key: one ADD_KEYED
        record (docs/journal_format.md §18). The payload is not copied, as :meth:`add`'s."""
        prefix, fields = rec.add_keyed_header(item_id, add_time, expiry, data, key.encode("ascii"))
        self._append_parts([prefix, fields, data], len(prefix) + len(fields) + len(data))

    def remove(self) -> None:
        """Journal the removal of the head item."""
        self._append(rec.REMOVE_RECORD)

    def flush_items(self) -> None:
        """Journal the removal of every item that is not open."""
        self._append(rec.FLUSH_RECORD)

    def open_read(self, xid: int) -> None:
        """Journal the head item moving into open read ``xid``."""
        self._xid(rec.OP_OPEN, xid)

    def confirm(self, xid: int) -> None:
        """Journal open read ``xid`` being confirmed (the item is gone)."""
        self._xid(rec.OP_CONFIRM, xid)

    def abort(self, xid: int) -> None:
        """Journal open read ``xid`` being aborted: a RETURN record (the item back in place)."""
        self._xid(rec.OP_RETURN, xid)

    def _xid(self, op: int, xid: int) -> None:
        self._append(rec.xid_record(op, xid))

    @property
    def size(self) -> int:
        """Bytes of all this queue's files, including what is still buffered."""
        return self._older_total + self._written + self._pending

    @property
    def current_size(self) -> int:
        """Bytes of the current file (Kestrel's ``logsize``)."""
        return self._written + self._pending

    def checkpoint_due(self) -> bool:
        """True once per :data:`CHECKPOINT_EVERY` bytes appended: the owner should call
        :meth:`checkpoint` now (or skip this turn)."""
        if self._appended + self._pending - self._checkpoint_at < CHECKPOINT_EVERY:
            return False
        self._checkpoint_at = self._appended + self._pending
        return True

    # ---- read-behind ------------------------------------------------------------------------

    def reader(self, position: rec.Position) -> AddReader:
        """A reader of the ADD records from ``position`` on (see :class:`AddReader`)."""
        return AddReader(self, position)
