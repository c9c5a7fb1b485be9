"""Replay of a queue journal: every record of every file applied in order, torn tails cut.

Replay starts at the newest file that begins with a SNAPSHOT (older ones are left over from
an interrupted compaction, :mod:`tercel.journal.rotation`, and are deleted), or at a
checkpoint's end when one fits the files (:mod:`tercel.journal.checkpointing`). The torn-tail
policy (docs/journal_format.md §5-6): only the newest file may end badly; its tail is cut at the
last good record when the damage has the shape of a power loss in the unsynced tail
(:func:`~tercel.journal.tail.tail_cut`; the bytes cut are kept aside in a file), a hole of zeros
where its header was means nothing in it was ever fsynced, and zeros written ahead
(:data:`~tercel.journal.append.PREALLOCATE`) are cut silently. Any other bad record, in any
file, raises :class:`~tercel.errors.JournalCorrupt` with path and offset and changes nothing.

Replay is resumable (:meth:`ReplayingJournal.replay_steps`): a step ends after each chunk
read, so a server may answer other queues between two.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from dataclasses import dataclass, field
from typing import Protocol

from tercel.errors import JournalCorrupt
from tercel.journal import records as rec
from tercel.journal.base import _NO_OLDER, REPLAY_START, log
from tercel.journal.files import DataDir, QueueFiles
from tercel.journal.reader import ChunkReader, add_id, skip_adds
from tercel.journal.rotation import RotatingJournal
from tercel.journal.tail import HOLE, Buffer, keep_cut, tail_cut, zero_first_page
from tercel.steps import Steps, finish


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


def _sizes(files: list[tuple[int, str]]) -> dict[int, int]:
    """seq -> size of each of ``files`` (seq, path); the shared :data:`_NO_OLDER` for none."""
    return {seq: os.path.getsize(path) for seq, path in files} if files else _NO_OLDER


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


class ReplayingJournal(RotatingJournal):
    """A queue journal that replays its files before it opens for appends (see the module
    docstring)."""

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
            again = QueueFiles(older, os.path.exists(self.path), leases=listed.leases)
            self._dir.give_back(self.name, again)
            raise

    def _replay_listed(
        self, listed: QueueFiles, sink: rec.RecordSink, pager: Pager | None
    ) -> Steps[ReplayReport]:
        for entry in listed.temps:
            self._ops.unlink(os.path.join(self.data_dir, entry))
        if listed.leases:
            self._leases = set(listed.leases)
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
        self.replay_position = REPLAY_START  # the last record's tuple is not kept per queue
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
                    if op != rec.OP_ADD and op != rec.OP_ADD_KEYED:
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
