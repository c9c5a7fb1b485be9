"""One queue's journal on disk: its files, buffered appends, replay, rotation, compaction.

Files live directly in the data directory and begin with the queue's name. ``<name>`` is the
file being appended to; ``<name>.<seq>`` are older files, replayed first in numeric order;
``<name>~~<anything>`` are temporary files, removed before replay. Every file has a sequence
number (the current file's is one more than the newest older file's), and a
:data:`~tercel.journal.records.Position` names a record as ``(seq, offset)``. Queue names can
never hold ``.`` or ``~`` (see :mod:`tercel.names`), so these names never collide.

Appends go to an in-memory list of pieces (an ADD's payload is not copied);
:meth:`FileJournal.write_out` hands them all to the OS in one ``pwritev``. Who calls it, and
when, is the owner's business (the server's group commit writes every dirty journal once per
event-loop pass, before any reply leaves); without an owner each append is written through
at once.

The queue decides *when* to rotate or compact; this module only executes. Compaction writes a
snapshot file (state at a rotation point, see docs/journal_format.md) through an injected
``background`` runner (a worker thread in the server; inline by default), then switches over
on the owner's thread in one short step: rename over the newest obsolete file, delete the
older ones. Every crash window of it can be hit by a test through the file seam
(:data:`tercel.journal.faults.COMPACTION_CRASHES`).

Threading: single-threaded, except :meth:`FileJournal.sync` and the snapshot writer, which run
on worker threads and touch only their own file descriptors.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from tercel.errors import (
    JournalCorrupt,
    JournalError,
    JournalOutOfDescriptors,
    JournalWriteError,
)
from tercel.journal import checkpoint as ckpt
from tercel.journal import records as rec
from tercel.journal.append import AppendLog, write_all
from tercel.journal.files import OUT_OF_DESCRIPTORS, DataDir, FileOps, QueueFiles, default_ops
from tercel.journal.reader import FOUND, MORE, ChunkReader, add_id, find_add, read_adds, skip_adds
from tercel.journal.tail import HOLE, Buffer, keep_cut, tail_cut, zero_first_page
from tercel.steps import Steps, finish

log = logging.getLogger(__name__)

_NO_OLDER: Final[dict[int, int]] = {}
"""The older files of every journal that has none: one empty dict shared, never added to
(:meth:`FileJournal._older_files` gives a journal its own), not 64 bytes per queue."""

_REPLAY_START: Final[rec.Position] = (1, 0)
"""``replay_position`` before and after a replay (one tuple for every journal)."""

CHECKPOINT_EVERY = 16 << 20
"""A journal offers to write a checkpoint (:meth:`FileJournal.checkpoint_due`) once per this
many bytes appended, so that a restart after a crash replays at most about this much (plus
what the queue could not sum up); a clean shutdown writes one too. Each one costs, in a
journal that is synced, an ``fdatasync`` of what was appended since the last sync (little,
as syncs are frequent), a walk of at most a few MiB of the page cache to find the head
item's record, and the queue's pass over the items in memory."""

MARK_EVERY = 1 << 20
"""The journal notes the position and id of an ADD at least once per this many bytes of a file
(and the first of each file): where to start looking for the head item's record."""


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


class ItemLike(Protocol):
    """What a snapshot needs of an item."""

    id: int
    add_time: int
    expiry: int
    data: bytes
    deliveries: int


class Pager(Protocol):
    """The optional fast path of replay for items that stay on disk (read-behind): runs of
    ADD records that the sink would only count are checked and counted here instead, with no
    call and no object per record."""

    def pages_from(self, seq: int) -> bool:
        """True when the ADD records that follow, in file ``seq``, are only counted (up to the
        next record that is not an ADD); asked before each run."""
        ...

    def on_adds_on_disk(self, position: rec.Position, count: int, size: int, last_id: int) -> None:
        """``count`` ADD records from ``position`` on, ``size`` payload bytes in all, the last
        one numbered ``last_id``, stay on disk: what ``count`` calls of ``on_add`` would do."""
        ...

    def on_checkpoint(
        self,
        head: rec.Position,
        *,
        items: int,
        size: int,
        next_id: int,
        xid: int,
        total: int,
        removed_add_time: int,
    ) -> None:
        """Replay starts at a checkpoint: the queue is the ``items`` ADD records read from
        ``head`` on (``size`` payload bytes), with these counters (``total``: items ever
        added); the records after the checkpoint follow as usual."""
        ...


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


def _older_seqs(data_dir: str, name: str) -> list[int]:
    prefix = name + "."
    return sorted(
        int(e[len(prefix) :])
        for e in os.listdir(data_dir)
        if e.startswith(prefix) and e[len(prefix) :].isdigit()
    )


def _sizes(files: list[tuple[int, str]]) -> dict[int, int]:
    """seq -> size of each of ``files`` (seq, path); the shared :data:`_NO_OLDER` for none."""
    return {seq: os.path.getsize(path) for seq, path in files} if files else _NO_OLDER


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


def _read_head(directory: DataDir, path: str, size: int) -> bytes:
    """The first ``size`` bytes of the file at ``path`` (fewer if it is shorter)."""
    ops = directory.ops
    fd = directory.open(path, os.O_RDONLY)
    try:
        return ops.pread(fd, size, 0)
    finally:
        ops.close(fd)


def _starts_with_snapshot(directory: DataDir, path: str) -> bool:
    head = _read_head(directory, path, rec.HEADER_SIZE + rec.PREFIX_SIZE + 1)
    return len(head) == rec.HEADER_SIZE + rec.PREFIX_SIZE + 1 and head[-1] == rec.OP_SNAPSHOT


@dataclass(slots=True)
class _ReplayState:
    skip_until: rec.Position | None = None
    adds_until: rec.Position | None = None
    pager: Pager | None = None
    start: rec.Position | None = None
    """Where replay starts (a checkpoint's end); None: at the first file's first record."""


class FileJournal(AppendLog):
    """The journal of queue ``name`` in ``data_dir`` (see the module docstring).

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
        on_dirty: Callable[[FileJournal], None] | None = None,
        background: Background | None = None,
        directory: DataDir | None = None,
    ) -> None:
        self.data_dir = data_dir
        self._dir = directory if directory is not None else DataDir(data_dir)
        super().__init__(self._dir.ops, name)
        self._current_version: int | None = None  # of the current file, read by replay
        self._current_size = 0  # of the current file after replay
        self._on_dirty = on_dirty if on_dirty is not None else FileJournal.write_out
        self._background = background or run_inline
        self._seq = 1  # sequence number of the current file
        self._older = _NO_OLDER  # seq -> size of each older file (see _older_files)
        self._older_total = 0
        self._size_before_cache: tuple[tuple[int, int, int], int] = ((0, 0, 0), 0)
        self._close_after_sync = False  # close and rotation wait for a worker's sync
        self.compacting = False
        """True while a snapshot is being written in the background."""
        self._erased = False
        self.replay_position: rec.Position = _REPLAY_START
        """During :meth:`replay`, where the record being applied starts."""
        self.rotations = 0
        self.rotations_put_off = 0
        """Rotations that found no descriptor for the new file (:meth:`rotate`)."""
        self._rotate_after = 0  # after a rotation put off: the size to try again at
        self.compactions = 0
        self.pages = True
        """Items can be left on disk and read back (read-behind)."""
        self._marks: list[int] = []  # see MARK_EVERY, in journal order, each mark's
        # item id, seq and offset one after another (no tuple per mark: 64 bytes per queue)
        self._mark_seq = 0  # the file of the last mark
        self._mark_off = 0  # the next mark is due at the first ADD from this offset on
        self._appended = 0  # bytes appended since the start
        self._checkpoint_at = 0  # _appended when a checkpoint was last due
        self._owner_syncs = False  # a sync ran: the owner makes records durable
        self._synced_at = 0  # bytes of the current file covered by its last sync (PRESYNC)
        self._name_unsynced = False
        """The current file was created (a new queue, a rotation) and the directory not
        fsynced since: the next sync fsyncs it too (:meth:`_sync_name`), so the file's name is
        as durable as its records (a power loss)."""

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

    # ---- replay ---------------------------------------------------------------------------

    def replay(self, sink: rec.RecordSink, pager: Pager | None = None) -> ReplayReport:
        """:meth:`replay_steps` all at once."""
        return finish(self.replay_steps(sink, pager))

    def replay_steps(self, sink: rec.RecordSink, pager: Pager | None = None) -> Steps[ReplayReport]:
        """Apply every record of every file to ``sink``, in order, then open for appends;
        a step ends after each chunk read (:data:`~tercel.journal.reader.CHUNK`, 1 MiB), so
        the caller may do other work between two (nothing else may use this journal until
        the last step: it is not open for appends until then).

        With a ``pager``, runs of ADD records it says stay on disk are counted in bulk
        (:class:`Pager`) instead of being passed to ``sink.on_add`` one by one.

        Replay starts at the newest file that begins with a SNAPSHOT (older files are left
        over from an interrupted compaction and are deleted). A torn tail of the newest file
        is cut off at its last good record (and reported); any other bad record raises
        :class:`JournalCorrupt` with path and offset, leaving every file as it was.

        A replay that raises, or is closed before its end, hands the queue's files back to
        the data dir's listing (:meth:`DataDir.give_back`): the next replay of this queue
        starts again from its first file (it would otherwise find no file at all).
        """
        listed = self._dir.take(self.name)  # the data dir's one listing, not one per queue
        try:
            return (yield from self._replay_listed(listed, sink, pager))
        except BaseException:
            older = [s for s in listed.older if os.path.exists(f"{self.path}.{s}")]
            self._dir.give_back(self.name, QueueFiles(older, os.path.exists(self.path)))
            raise

    def _replay_listed(
        self, listed: QueueFiles, sink: rec.RecordSink, pager: Pager | None
    ) -> Steps[ReplayReport]:
        for entry in listed.temps:
            self._ops.unlink(os.path.join(self.data_dir, entry))
        older = listed.older
        self._seq = (older[-1] + 1) if older else 1
        files = [(s, f"{self.path}.{s}") for s in older]
        if listed.current:
            files.append((self._seq, self.path))
        start = 0
        for i in range(len(files) - 1, 0, -1):
            if _starts_with_snapshot(self._dir, files[i][1]):
                start = i
                break
        for _, path in files[:start]:
            log.info("journal %s: removing %s, superseded by a snapshot", self.name, path)
            self._ops.unlink(path)
        files = files[start:]
        # Read-behind may read older files while they are replayed: know them up front.
        self._older = _sizes(files[:-1] if listed.current else files)
        report = ReplayReport()
        state = _ReplayState(pager=pager)
        if not files:  # a checkpoint without files is left over from an earlier queue
            with contextlib.suppress(FileNotFoundError):
                self._ops.unlink(self.checkpoint_path)
        cp = self._load_checkpoint(files) if pager is not None and files else None
        if pager is not None and cp is not None:
            log.info("journal %s: replay starts at the checkpoint at %s", self.name, cp.end)
            pager.on_checkpoint(
                cp.head,
                items=cp.items,
                size=cp.size,
                next_id=cp.next_id,
                xid=cp.xid,
                total=cp.total,
                removed_add_time=cp.removed_add_time,
            )
            self._marks = [
                n for m in cp.marks if m[1] == self._seq or m[1] in self._older for n in m
            ]
            state.start = cp.end
        for i, (seq, path) in enumerate(files):
            if state.start is not None and seq < state.start[0]:
                continue
            yield from self._replay_file(seq, path, sink, report, state, newest=i == len(files) - 1)
        self._older = _sizes(files[:-1] if listed.current else files)
        self._older_total = sum(self._older.values())
        self.replay_position = _REPLAY_START  # the last record's tuple is not kept per queue
        size = self._current_size if listed.current else 0
        if size >= rec.HEADER_SIZE and self._current_version == rec.VERSION:
            # Ready for appends; the file is opened on first use (an idle queue holds no
            # descriptor, and a start with many queues opens each file once, not twice).
            self._written = self._allocated = self._synced_at = size
            self.closed = False
        elif self._open() != rec.VERSION:  # older versions are read, never appended to
            self.rotate()
        return report

    def _replay_file(
        self,
        seq: int,
        path: str,
        sink: rec.RecordSink,
        report: ReplayReport,
        state: _ReplayState,
        *,
        newest: bool,
    ) -> Steps[None]:
        size = os.path.getsize(path)
        if size == 0:
            return
        head = _read_head(self._dir, path, rec.HEADER_SIZE)
        hole = newest and _first_page_zero(path)
        good = 0 if hole else self._check_header(head, path, newest)
        if path == self.path:
            self._current_version = rec.header_version(head)
        torn: Truncation | None = None
        if hole:  # the header's page never reached the disk: nothing in the file was fsynced
            reason = "a hole of zeros where the file header was, power loss in the unsynced tail"
            if size > HOLE:
                reason += f"; kept in {self._keep_cut(path, 0, size)}"
            torn = Truncation(path, 0, size, reason)
        elif not good:
            torn = Truncation(path, 0, size, "torn file header")
        else:
            start = good
            if state.start is not None and state.start[0] == seq:
                start = state.start[1]
            reader = self._dir.retrying(lambda: ChunkReader(path, start, self._ops))
            try:
                good = yield from self._replay_records(seq, reader, sink, report, state)
                if good < size:  # the records end in zeros written ahead (append.PREALLOCATE)
                    if not newest:  # rotation cuts them before the rename
                        raise rec.BadRecord(good, "zero bytes where a record starts")
                    reader.check_end()
            except rec.BadRecord as bad:
                reason = bad.reason
                if not newest:
                    raise JournalCorrupt(reason, path, bad.offset) from None
                with (
                    open(path, "rb") as fh,
                    mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf,
                ):
                    shape = tail_cut(buf, bad.offset, _record_end)
                if shape is None:
                    raise JournalCorrupt(reason, path, bad.offset) from None
                if shape:
                    kept = self._keep_cut(path, bad.offset, size)
                    reason = f"{reason}: {shape}, power loss in the unsynced tail; kept in {kept}"
                torn = Truncation(path, bad.offset, size - bad.offset, reason)
                good = bad.offset
            finally:
                reader.close()
        report.bytes += good
        if path == self.path:
            self._current_size = good  # what is left once the cuts below are made
        if torn is not None:
            report.truncations.append(torn)
            log.warning(
                "journal %s: torn tail at offset %d (%s); cut %d bytes",
                path,
                good,
                torn.reason,
                size - good,
            )
        elif good < size:
            log.info("journal %s: cut %d zero bytes written ahead", path, size - good)
        if good < size:
            fd = self._dir.open(path, os.O_RDWR)
            try:
                self._ops.ftruncate(fd, good)
                self._ops.fsync(fd)
            finally:
                self._ops.close(fd)

    def _keep_cut(self, path: str, offset: int, size: int) -> str:
        """:func:`~tercel.journal.tail.keep_cut`, opening through the data dir's pool."""
        return keep_cut(
            path, offset, size, ops=self._ops, open_file=self._dir.open, sync_dir=self._dir.sync
        )

    def _replay_records(
        self,
        seq: int,
        reader: ChunkReader,
        sink: rec.RecordSink,
        report: ReplayReport,
        state: _ReplayState,
    ) -> Steps[int]:
        chunk = b""
        while reader.prepare():
            if reader.buffer is not chunk:  # a chunk read: a step ends before the next one
                if chunk:
                    yield None
                chunk = reader.buffer
            if state.skip_until is None and state.adds_until is None:
                report.records += self._replay_fast(seq, reader, sink, state.pager)
            span = reader.next()  # one record the fast loop left: RESUME, skipped, or bad
            if span is None:
                break
            start, stop = span
            buf = reader.buffer
            pos = (seq, reader.file_offset(start))
            report.records += 1
            if state.skip_until is not None:
                if pos < state.skip_until:
                    continue
                state.skip_until = None
            op = rec.record_op(buf, start)
            if state.adds_until is not None:
                if pos < state.adds_until:
                    if op != rec.OP_ADD:
                        continue
                else:
                    state.adds_until = None
            if op == rec.OP_RESUME:
                state.skip_until, state.adds_until = rec.decode_resume(buf, start)
                continue
            self.replay_position = pos
            rec.apply_record(buf, start, stop, sink)
        return reader.offset

    def _replay_fast(
        self, seq: int, reader: ChunkReader, sink: rec.RecordSink, pager: Pager | None
    ) -> int:
        """Apply the complete, valid, ordinary records buffered at the read position (the
        start-up hot loop: :func:`records.scan`, and :func:`reader.skip_adds` for the runs of
        ADDs the pager counts); how many it applied."""
        buf = reader.buffer
        base = reader.file_offset(0)
        on_add = sink.on_add
        n = 0

        def add(pos: int, item_id: int, add_time: int, expiry: int, data: bytes) -> bool:
            nonlocal n
            self.replay_position = (seq, base + pos)
            if seq != self._mark_seq or base + pos >= self._mark_off:
                self._mark(item_id, seq, base + pos)
            on_add(item_id, add_time, expiry, data)
            n += 1
            return pager is None or not pager.pages_from(seq)  # then: count in bulk

        def other(pos: int, stop: int) -> None:
            nonlocal n
            self.replay_position = (seq, base + pos)
            rec.apply_record(buf, pos, stop, sink)
            n += 1

        pos = reader.pos
        while True:
            if pager is not None and pager.pages_from(seq):
                stop, count, size, last_id = skip_adds(buf, pos)
                if count:
                    if seq != self._mark_seq or base + pos >= self._mark_off:
                        self._mark(add_id(buf, pos), seq, base + pos)
                    pager.on_adds_on_disk((seq, base + pos), count, size, last_id)
                    n += count
                    pos = stop
            stop = rec.scan(buf, pos, add, other)
            if stop == pos:  # the end of the buffer, or a record for the careful path
                break
            pos = stop
        reader.advance(pos)
        return n

    @staticmethod
    def _check_header(head: bytes, path: str, newest: bool) -> int:
        if rec.header_version(head) is not None:
            return rec.HEADER_SIZE
        if (
            len(head) < rec.HEADER_SIZE
            and newest
            and any(rec.file_header(v).startswith(head) for v in rec.VERSIONS)
        ):
            return 0  # torn while the header itself was written; replay truncates to 0
        if head[:4] == rec.MAGIC and len(head) > 4:
            raise JournalCorrupt(f"unsupported journal format version {head[4]}", path, 4)
        raise JournalCorrupt("not a tercel journal (bad file header)", path, 0)

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
    def size(self) -> int:
        """Bytes of all this queue's files, including what is still buffered."""
        return self._older_total + self._written + self._pending

    @property
    def current_size(self) -> int:
        """Bytes of the current file (Kestrel's ``logsize``)."""
        return self._written + self._pending

    # ---- read-behind ----------------------------------------------------------------------

    def reader(self, position: rec.Position) -> AddReader:
        """A reader of the ADD records from ``position`` on (see :class:`AddReader`)."""
        return AddReader(self, position)

    # ---- checkpoints ----------------------------------------------------------------------

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

    def checkpoint_due(self) -> bool:
        """True once per :data:`CHECKPOINT_EVERY` bytes appended: the owner should call
        :meth:`checkpoint` now (or skip this turn)."""
        if self._appended + self._pending - self._checkpoint_at < CHECKPOINT_EVERY:
            return False
        self._checkpoint_at = self._appended + self._pending
        return True

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
    ) -> bool:
        """Replace the older files by one snapshot of the queue's state; True if started.

        The current file is rotated first; the snapshot describes the state at that point:
        ``open_items`` (xid, item) and ``items`` (in memory, head first), and, when
        ``cursor`` is given (read-behind), that the ADD records from ``cursor`` to the
        rotation point are items still on disk. Files before ``cursor``'s file are replaced;
        without a cursor every older file is. Items and open reads are read from the
        objects given, on a worker thread: the caller passes copies of its containers.
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
                _write_snapshot(
                    tmp,
                    ops=self._ops,
                    next_id=next_id,
                    xid=xid,
                    open_items=open_items,
                    items=items,
                    cursor=cursor,
                    taken=taken,
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
        for seq in [*sorted(self._older), self._seq]:  # no directory listing: it knows them
            temp = f"{self.path}~~gone.{seq}"
            try:
                ops.rename(self._path(seq), temp)
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


def _write_snapshot(
    path: str,
    *,
    ops: FileOps | None = None,
    next_id: int,
    xid: int,
    open_items: Sequence[tuple[int, ItemLike]],
    items: Iterable[ItemLike],
    cursor: rec.Position | None,
    taken: rec.Position,
) -> None:
    if ops is None:
        ops = default_ops()
    fd = ops.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        buf = bytearray(rec.FILE_HEADER)
        rec.encode_snapshot(buf, next_id, xid)
        for open_xid, item in open_items:
            rec.encode_add(buf, item.id, item.add_time, item.expiry, item.data)
            if item.deliveries > 1:  # the OPEN adds the last one
                rec.encode_xid(buf, rec.OP_DELIVERED, item.deliveries - 1)
            rec.encode_xid(buf, rec.OP_OPEN, open_xid)
        # The items (the whole memory window) are the bulk: their records are built as
        # pieces joined once per MiB, as encode_add would write them (a bytearray that is
        # cleared and regrown per MiB cost 2-3x more per 1 KiB item).
        parts: list[bytes | bytearray] = [buf]
        size = 0
        offset = 0
        add_header = rec.add_header
        for item in items:
            data = item.data
            parts += (*add_header(item.id, item.add_time, item.expiry, data), data)
            if item.deliveries:
                extra = bytearray()
                rec.encode_xid(extra, rec.OP_DELIVERED, item.deliveries)
                parts.append(extra)
            size += len(data)
            if size >= 1 << 20:
                chunk = b"".join(parts)
                write_all(ops, fd, chunk, offset)
                offset += len(chunk)
                parts.clear()
                size = 0
        if cursor is not None:
            tail = bytearray()
            rec.encode_resume(tail, cursor, taken)
            parts.append(tail)
        write_all(ops, fd, b"".join(parts), offset)
        ops.fsync(fd)
    finally:
        ops.close(fd)


class AddReader:
    """Reads the items a queue left on disk: every ADD record from a position on, across
    files, skipping other records and following RESUME jumps. Reads what is buffered in the
    journal too (it asks the journal to write it out first).

    Its descriptor is in the data dir's pool like the journal's: parked when evicted (the
    buffer is dropped), reopened at the same position by path on the next read."""

    __slots__ = ("_busy", "_journal", "_parked_at", "_reader", "_seq")

    def __init__(self, journal: FileJournal, position: rec.Position) -> None:
        self._journal = journal
        self._seq = position[0]
        self._parked_at = -1
        self._busy = False
        self._reader = self._open_at(position[1])

    def _open_at(self, offset: int) -> ChunkReader:
        journal = self._journal
        path = journal._path(self._seq)
        try:
            reader = journal._dir.retrying(lambda: ChunkReader(path, offset), keep=self)
        except OSError as exc:  # refuse this one request (an error reply), never a bug that
            # closes the connection; the reader opens again at its next use
            if exc.errno in OUT_OF_DESCRIPTORS:  # nothing left to evict: SERVER_ERROR too
                # many open files, and a JournalError to the core (an item taken stays taken)
                raise JournalOutOfDescriptors(path, offset) from exc
            raise JournalError(f"open failed: {exc.strerror or exc}", path, offset) from exc
        journal._dir.use(self)
        return reader

    @property
    def position(self) -> rec.Position:
        """Where the next record to read starts."""
        if self._parked_at >= 0:
            return self._seq, self._parked_at
        return self._seq, self._reader.offset

    def park(self) -> bool:
        """Close the file until the next read (the pool's eviction); False while reading."""
        if self._busy:
            return False
        if self._parked_at < 0:
            self._parked_at = self._reader.offset
            self._reader.close()
        return True

    def _resume(self) -> None:
        """Reopen after :meth:`park`, or mark this reader the pool's most recently used."""
        if self._parked_at >= 0:
            offset = self._parked_at
            self._reader = self._open_at(offset)
            self._parked_at = -1
            self._journal._dir.reopened()
        else:
            self._journal._dir.use(self)

    def _move(self, position: rec.Position) -> None:
        self._reader.close()
        self._seq = position[0]
        self._reader = self._open_at(position[1])

    def next_add(self) -> tuple[int, int, int, bytes] | None:
        """``(item_id, add_time, expiry, data)`` of the next ADD, or None when there is none.

        Raises :class:`JournalCorrupt` when a record cannot be read.
        """
        if self._busy:
            return self._next_add()
        self._busy = True  # the pool must not park this reader while it reads
        try:
            self._resume()
            return self._next_add()
        finally:
            self._busy = False

    def _next_add(self) -> tuple[int, int, int, bytes] | None:
        journal = self._journal
        flushed = reread = False
        while True:
            try:
                span = self._reader.next()
            except rec.BadRecord as bad:
                if not reread:  # buffered before the file changed under it (replay cut a
                    reread = True  # torn tail this reader had read, and records followed)
                    self._reader.drop_buffer()
                    continue
                raise JournalCorrupt(bad.reason, self._reader.path, bad.offset) from None
            if span is None:
                nxt = journal._next_seq(self._seq)
                if nxt is not None:
                    self._move((nxt, rec.HEADER_SIZE))
                    continue
                if journal._parts and not flushed:
                    journal.write_out()
                    flushed = True
                    continue
                return None
            start, stop = span
            buf = self._reader.buffer
            op = rec.record_op(buf, start)
            if op == rec.OP_ADD:
                return rec.decode_add(buf, start, stop)
            if op == rec.OP_RESUME:
                self._move(rec.decode_resume(buf, start)[0])

    def next_adds(self, budget: int) -> list[tuple[int, int, int, bytes]]:
        """The next items (as :meth:`next_add` gives them) until their payloads add up to
        ``budget`` bytes, at least one if there is any; an empty list when there is none.

        Complete, ordinary records already buffered are parsed in one tight loop (the
        read-behind hot path); anything unusual goes through :meth:`next_add`.
        """
        self._busy = True  # the pool must not park this reader while it reads
        try:
            self._resume()
            return self._next_adds(budget)
        finally:
            self._busy = False

    def _next_adds(self, budget: int) -> list[tuple[int, int, int, bytes]]:
        out: list[tuple[int, int, int, bytes]] = []
        got = 0
        while got < budget or not out:
            reader = self._reader
            if reader.prepare():
                pos = reader.pos
                stop, size = read_adds(reader.buffer, pos, budget - got, out)
                if stop != pos:
                    reader.advance(stop)
                    got += size
                    continue
            item = self._next_add()  # the end of a file, a RESUME, or a record to check
            if item is None:
                break
            out.append(item)
            got += len(item[3])
        return out

    def close(self) -> None:
        self._journal._dir.forget(self)
        if self._parked_at < 0:
            self._reader.close()
            self._parked_at = self._reader.offset


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


MARK_AHEAD = 4096
"""Bytes read ahead at each checkpoint mark (:func:`_read_ahead`): a whole ADD record of up to
~4 KiB; a longer one reads the rest when it is checked."""


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


def _first_page_zero(path: str) -> bool:
    """:func:`~tercel.journal.tail.zero_first_page` of the file at ``path``."""
    with open(path, "rb") as fh:
        return zero_first_page(fh.read(HOLE))


def _record_end(buf: Buffer, pos: int) -> int:
    """The queue journal's :data:`~tercel.journal.tail.RecordEnd`: §3's record check."""
    try:
        return rec.check_record(buf, pos)
    except rec.BadRecord:
        return -1
