"""One queue's journal on disk: :class:`FileJournal`, built in layers, one module per concern.

Each layer is a class that extends the one below it, in its own module (beanstalkd keeps its
log group, ``walg.c``, apart from one file's record I/O, ``file.c``; Kestrel keeps packing,
``JournalPacker``, out of ``Journal``):

1. :class:`~tercel.journal.append.AppendLog` (``append.py``): one file's buffered appends,
   the group-commit write (one ``pwritev``), zeros written ahead, failure for good, the sync
   hand-off. Shared with beanstalkd's job log.
2. :class:`~tercel.journal.base.JournalBase` (``base.py``): the queue's file names and sizes,
   the current file's descriptor (in the data dir's pool), the record appends (``add``,
   ``remove``...), syncs (and the directory fsync that makes a new file's name durable), the
   ADD marks, close. Holds the state of every layer (one compiled struct).
3. :class:`~tercel.journal.checkpointing.CheckpointingJournal` (``checkpointing.py``): when a
   checkpoint is due, writing one, and checking one against the files at replay.
4. :class:`~tercel.journal.rotation.RotatingJournal` (``rotation.py``): **the crash-safe file
   moves**, rotation, the compaction switch-over and erase, each ordered for every crash window
   (the snapshot itself is written by :func:`~tercel.journal.snapshot.write_snapshot`).
5. :class:`~tercel.journal.replay.ReplayingJournal` (``replay.py``): **replay**, from the
   newest snapshot or a checkpoint, with the torn-tail policy.
6. :class:`FileJournal` (here): the read-behind cursor (:class:`~tercel.journal.readbehind.
   AddReader`) on top: the whole journal, as the core sees it through ``QueueLog``
   (``core/log.py``) and :mod:`tercel.storage` builds it.

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

    def reader(self, position: rec.Position) -> AddReader:
        """A reader of the ADD records from ``position`` on (see :class:`AddReader`)."""
        return AddReader(self, position)
