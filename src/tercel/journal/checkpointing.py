"""Checkpoints of a queue journal: when one is due, writing it, and checking one against the
files before replay trusts it (the file format is :mod:`tercel.journal.checkpoint`'s).

A checkpoint lets a restart replay from the head item's ADD record instead of the first file
(docs/journal_format.md §16). It is only ever a shortcut: one that does not fit the files
(its end moved, the head record changed, a mark's record is not the ADD it names) is ignored
and replay reads every file.
"""

from __future__ import annotations

import contextlib
import os

from tercel.journal import checkpoint as ckpt
from tercel.journal import records as rec
from tercel.journal.append import write_all
from tercel.journal.base import MARK_EVERY, JournalBase, log
from tercel.journal.reader import FOUND, MORE, ChunkReader, add_id, find_add

CHECKPOINT_EVERY = 16 << 20
"""A journal offers to write a checkpoint (:meth:`FileJournal.checkpoint_due`) once per this
many bytes appended, so that a restart after a crash replays at most about this much (plus
what the queue could not sum up); a clean shutdown writes one too. Each one costs, in a
journal that is synced, an ``fdatasync`` of what was appended since the last sync (little,
as syncs are frequent), a walk of at most a few MiB of the page cache to find the head
item's record, and the queue's pass over the items in memory."""

MARK_AHEAD = 4096
"""Bytes read ahead at each checkpoint mark (:func:`_read_ahead`): a whole ADD record of up to
~4 KiB; a longer one reads the rest when it is checked."""


class CheckpointingJournal(JournalBase):
    """:class:`~tercel.journal.base.JournalBase` with checkpoints (see the module docstring)."""

    def checkpoint(
        self,
        *,
        head_id: int,
        items: int,
        size: int,
        next_id: int,
        xid: int,
        total: int,
        removed_add_time: int,
        hint: rec.Position | None = None,
    ) -> bool:
        """Write the checkpoint file: the queue is the ``items`` ADD records from the one of
        ``head_id`` on (``size`` payload bytes), with these counters, after every record
        appended so far. ``hint``: where that ADD may be (else the marks are searched).

        The records are written out first, and fdatasynced in a journal its owner syncs, so
        a checkpoint never describes bytes a power cut could take back (a journal never synced,
        ``sync_journal = false``, promises nothing across a power cut anyway); the file goes
        through a temporary file and a rename (a checkpoint cut short fails its checksum and
        is ignored). False, writing nothing, when the head item's record is not found (it is
        in a snapshot file, say).
        """
        if self.closed or self._failed is not None:
            return False
        self.write_out()
        end = (self._seq, self._written)
        head: rec.Position | None = end
        if items:
            head = hint if hint is not None and self._add_id_at(hint) == head_id else None
            head = head or self._find_add(head_id)
            if head is None:
                return False
        assert head is not None
        ops = self._ops
        try:
            fd = self._fd_now()
        except OSError as exc:  # no descriptor to be had now (the pool is full): next time
            log.warning("journal %s: no checkpoint: %s", self.path, exc)
            return False
        if self._owner_syncs:
            try:
                ops.fdatasync(fd)
            except OSError as exc:
                self._fail("fsync", exc)
        start = max(rec.HEADER_SIZE, end[1] - ckpt.TAIL)
        all_marks = self._mark_list()
        first = max((i for i, m in enumerate(all_marks) if m[0] <= head_id), default=0)
        marks = tuple(all_marks[first:])  # from the one the head is found from
        cp = ckpt.Checkpoint(
            end,
            rec.crc32(ops.pread(fd, end[1] - start, start)),
            head,
            head_id,
            items,
            size,
            next_id,
            total,
            removed_add_time,
            xid,
            marks,
        )
        tmp = f"{self.path}~~checkpoint"
        try:
            out = ops.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                write_all(ops, out, ckpt.encode(cp), 0)
            finally:
                ops.close(out)
            ops.rename(tmp, self.checkpoint_path)
        except OSError as exc:  # a full disk, say: the journal itself is fine
            log.warning("journal %s: no checkpoint: %s", self.path, exc)
            with contextlib.suppress(OSError):
                ops.unlink(tmp)
            return False
        return True

    def _add_id_at(self, position: rec.Position) -> int | None:
        """The item id of the ADD record at ``position``; None if there is none there."""
        return _add_id_in(self._path(position[0]), position[1])

    def _find_add(self, item_id: int) -> rec.Position | None:
        """Where the ADD of ``item_id`` starts: found by walking from the last mark of a
        smaller or equal id, at most a few marks' distance; None when not found."""
        mark = next((m for m in reversed(self._mark_list()) if m[0] <= item_id), None)
        if mark is None or (mark[1] != self._seq and mark[1] not in self._older):
            return None
        seq = mark[1]
        reader = ChunkReader(self._path(seq), mark[2])
        try:
            walked = 0
            while walked <= 4 * MARK_EVERY and reader.prepare():
                pos, how = find_add(reader.buffer, reader.pos, item_id)
                if how == FOUND:
                    return seq, reader.file_offset(pos)
                if how != MORE or pos == reader.pos:
                    return None
                walked += pos - reader.pos
                reader.advance(pos)
            return None
        finally:
            reader.close()

    def _load_checkpoint(self, files: list[tuple[int, str]]) -> ckpt.Checkpoint | None:
        """The checkpoint, if there is one and the files still hold what it describes: its
        end inside a file whose last 4 KiB before it are unchanged, and the head item's ADD
        record whole and valid where it says. None otherwise (replay reads every file)."""
        try:
            with open(self.checkpoint_path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return None
        cp = ckpt.decode(data)
        paths = dict(files)
        why = "damaged"
        if cp is not None:
            why = self._checkpoint_mismatch(cp, paths)
        if why:
            log.info("journal %s: not using the checkpoint (%s)", self.name, why)
            return None
        return cp

    @staticmethod
    def _checkpoint_mismatch(cp: ckpt.Checkpoint, paths: dict[int, str]) -> str:
        """Why ``cp`` does not fit the files ``paths`` (seq -> path); empty when it does."""
        end_path = paths.get(cp.end[0])
        if end_path is None or cp.end[1] < rec.HEADER_SIZE:
            return "its file is gone"
        start = max(rec.HEADER_SIZE, cp.end[1] - ckpt.TAIL)
        with open(end_path, "rb") as fh:
            tail = os.pread(fh.fileno(), cp.end[1] - start, start)
        if len(tail) != cp.end[1] - start or rec.crc32(tail) != cp.tail_crc:
            return "the file changed"
        # Ids are handed out in order: an ADD right at the end is the next item's. This also
        # checks an end at a file header, where the tail above is empty.
        at_end = _add_id_in(end_path, cp.end[1])
        if at_end is not None and at_end != cp.next_id:
            return "the record at its end is not the next item's"
        if not cp.items:
            return ""
        if cp.head > cp.end:
            return "the head item's file is gone"
        why = _add_mismatch(paths, cp.head, cp.head_id)
        if why:
            return f"the head item's {why}"
        # The marks between the head and the end: a valid ADD of the recorded id at each,
        # the first record of every file among them and one per MiB (cheap: a read each,
        # all asked of the disk at once first).
        checks = [
            (item_id, (seq, offset))
            for item_id, seq, offset in cp.marks
            if item_id > cp.head_id and (seq, offset) < cp.end
        ]
        _read_ahead(paths, [position for _, position in checks])
        for item_id, position in checks:
            why = _add_mismatch(paths, position, item_id)
            if why:
                return f"item {item_id}'s {why}"
        return ""


def _add_id_in(path: str, offset: int) -> int | None:
    """The item id of the ADD record at ``offset`` of ``path``; None if there is none there
    (no file, another record, the end of the file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        head = os.pread(fd, rec.ADD_HEAD_SIZE, offset)
    finally:
        os.close(fd)
    if len(head) < rec.ADD_HEAD_SIZE or head[rec.PREFIX_SIZE] != rec.OP_ADD:
        return None
    return add_id(head, 0)


def _read_ahead(paths: dict[int, str], positions: list[rec.Position]) -> None:
    """Ask the kernel to read the record at each of ``positions`` ahead, all at once
    (``posix_fadvise(WILLNEED)``): checked one after another with nothing in the page cache,
    each waited for its own read (~0.15 ms a mark, ~1,000 marks per GB of journal; 200k x
    1 KiB from a checkpoint: 26-80 ms -> 13-17 ms, docs/benchmarks.md). A hint only: any
    error leaves the checks to read as they would have."""
    fds: dict[int, int] = {}
    try:
        for seq, offset in positions:
            fd = fds.get(seq)
            if fd is None:
                path = paths.get(seq)
                if path is None:
                    continue
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                fds[seq] = fd
            os.posix_fadvise(fd, offset, MARK_AHEAD, os.POSIX_FADV_WILLNEED)
    except (OSError, AttributeError):  # (AttributeError: no posix_fadvise, as on macOS)
        return
    finally:
        for fd in fds.values():
            os.close(fd)


def _add_mismatch(paths: dict[int, str], position: rec.Position, item_id: int) -> str:
    """Why the record at ``position`` is not a whole, valid ADD of ``item_id`` (checksum
    included); empty when it is. Reads that record only (two preads)."""
    path = paths.get(position[0])
    if path is None:
        return "file is gone"
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.pread(fd, rec.PREFIX_SIZE, position[1])
        if len(data) == rec.PREFIX_SIZE:
            length = min(rec.PREFIX.unpack_from(data)[0], rec.MAX_BODY)
            data += os.pread(fd, length, position[1] + rec.PREFIX_SIZE)
    finally:
        os.close(fd)
    try:
        rec.check_record(data, 0)
    except rec.BadRecord:
        return "record is damaged"
    if rec.record_op(data, 0) != rec.OP_ADD or add_id(data, 0) != item_id:
        return "record changed"
    return ""
