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

import contextlib
from array import array
from collections.abc import Callable, Sequence
from typing import cast

from tercel.errors import JournalError, JournalOutOfDescriptors, JournalWriteError
from tercel.journal import leases
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
from tercel.journal.files import OUT_OF_DESCRIPTORS, DataDir
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
        record (docs/journal_format.md §19). The payload is not copied, as :meth:`add`'s."""
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

    # ---- keyed leases: the records and the lease files (docs/journal_format.md §18) ---------

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
        """Journal ``count`` items leaving the head for lease file ``n`` of ``key``."""
        buf = bytearray()
        rec.encode_key_take(
            buf,
            key,
            n=n,
            count=count,
            size=size,
            max_items=max_items,
            created_at=created_at,
            expires_at=expires_at,
        )
        self._append(bytes(buf))

    def key_end(self, key: str, how: int) -> None:
        """Journal keyed lease ``key`` ending (``how``: acked, released or expired)."""
        buf = bytearray()
        rec.encode_key_end(buf, key, how)
        self._append(bytes(buf))

    def key_renew(self, key: str, expires_at: int) -> None:
        """Journal keyed lease ``key``'s new end of life."""
        buf = bytearray()
        rec.encode_key_renew(buf, key, expires_at)
        self._append(bytes(buf))

    def lease_path(self, n: int) -> str:
        """Lease file ``n``: ``<data_dir>/<name>.key.<n>``."""
        return self.path + leases.lease_suffix(n)

    def lease_write(self, n: int, at: int, items: Sequence[ItemLike], sync: bool) -> list[int]:
        """Write ``items`` into lease file ``n`` from offset ``at`` (0: a new file) and, with
        ``sync``, fdatasync it (and, a new file, the directory): before the record that
        names them is written. Returns where each item's records end. Raises
        :class:`JournalWriteError` (nothing is recorded; the file is an orphan, or its tail is
        written over by the next write)."""
        path = self.lease_path(n)
        try:
            ends, created = self._dir.retrying(
                lambda: leases.write_items(self._ops, path, at, items, sync)
            )
            if created:
                if self._leases is None:
                    self._leases = set()
                self._leases.add(n)
                if sync:
                    self._dir.sync()
        except OSError as exc:
            if exc.errno in OUT_OF_DESCRIPTORS:
                raise JournalOutOfDescriptors(path, at) from exc
            raise JournalWriteError(f"write failed: {exc.strerror or exc}", path, at) from exc
        return ends

    def lease_index(self, n: int, count: int) -> array[int]:
        """Where each of the first ``count`` items of lease file ``n`` starts, and where the
        last ends. Raises :class:`JournalError`."""
        path = self.lease_path(n)
        try:
            return self._dir.retrying(lambda: leases.index_file(self._ops, path, count))
        except OSError as exc:
            raise JournalError(f"read failed: {exc.strerror or exc}", path, 0) from exc

    def lease_columns(self, n: int, start: int, stop: int) -> leases.Columns:
        """The items of lease file ``n`` whose records lie between ``start`` and ``stop``.
        Raises :class:`JournalError`."""
        path = self.lease_path(n)
        try:
            return self._dir.retrying(lambda: leases.read_columns(self._ops, path, start, stop))
        except OSError as exc:
            raise JournalError(f"read failed: {exc.strerror or exc}", path, start) from exc

    def lease_remove(self, n: int) -> None:
        """Unlink lease file ``n`` (nothing names it any more)."""
        if self._leases is not None:
            self._leases.discard(n)
        with contextlib.suppress(FileNotFoundError):
            self._ops.unlink(self.lease_path(n))

    def lease_files(self) -> list[int]:
        """The numbers of the lease files that exist (found at replay, or written since)."""
        return sorted(self._leases or ())

    def durable(self, position: rec.Position, synced: bool) -> bool:
        """True when every record before ``position`` was written (``synced``: and fsynced,
        if the owner fsyncs this journal at all)."""
        seq, offset = position
        if seq != self._seq:
            return seq < self._seq  # an older file was fsynced before its rename
        return offset <= (self._synced_at if synced and self._owner_syncs else self._written)
