"""The job log of the beanstalkd front end: one log for every tube, records keyed by job id.

Format version 3 (``docs/journal_format.md`` §17). The files live in their own directory
(``<data_dir>/beanstalk.d`` under ``tercel serve``, the ``-b`` directory of ``tercel
beanstalkd``) and are named only by numbers, never by tube names: a tube name is a field
inside a record, so no name beanstalkd allows (``.``, ``/``, ``;``, ``(``, ``)``) ever
becomes a path.

- ``jobs.<n>``: the log, appended to in order; a new file starts when the current one
  passes ``max_file_size`` (beanstalkd's ``-s``). ``n`` counts up from 1.
- ``snapshot.<n>``: the state of every job recorded in ``jobs.1`` .. ``jobs.<n>``, written
  by a compaction. Replay starts from the newest snapshot and reads only ``jobs.<m>`` with
  ``m > n``; older files still on disk are ignored and deleted.
- ``snapshot.<n>.tmp``: a snapshot being written; deleted at start-up.
- ``lock``: held with ``flock`` while a server runs.

Each file starts with the 8-byte header ``TRCL 03 00 00 00`` and holds records framed as in
every tercel journal (``u32 length | u32 crc32 | body``), with four opcodes: JOB (a whole
job), STATE (a job's new state), DELETE and SNAPSHOT (first record of a snapshot file),
encoded and decoded by :mod:`tercel.journal.jobrecords`.
Replay keeps the latest record of each id (later records override earlier ones), so a job
that was reserved when the process died comes back as it was last logged: ready, delayed
(with its wall-clock deadline) or buried. A bad record in the newest ``jobs`` file follows the
queue journals' rule (:mod:`tercel.journal.tail`): a torn tail is cut, a power-loss hole is cut
with its bytes kept in ``jobs.<n>.cut-<offset>``, anything else (valid records after it)
stops start-up (:class:`JournalCorrupt`), as does a bad record in any other file.

Writes are buffered and handed to the OS by :meth:`JobJournal.write_out` (the server's group
commit calls it before any reply that depends on the records): :class:`JobJournal` is an
:class:`~tercel.journal.append.AppendLog`, as the queue journals are, so it shares their
buffering, failure rules and zeros written ahead once a file is synced (cut at a clean close or
rotation; after a crash, zeros after the last record of a file are the end of its data, not a
torn tail). Every file operation goes through a :class:`~tercel.journal.files.FileOps`, the
seam :mod:`tercel.journal.faults` injects faults and crashes through
(:data:`~tercel.journal.faults.JOB_COMPACTION_CRASHES`: each window of a compaction).
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Final

from tercel.errors import JournalCorrupt
from tercel.journal.append import IOV_MAX, AppendLog, write_all, write_parts
from tercel.journal.base import fsync_dir
from tercel.journal.files import OUT_OF_DESCRIPTORS, FileOps, default_ops
from tercel.journal.jobrecords import (
    FIRST_VERSION,
    HEADER,
    HEADER_SIZE,
    OP_SNAPSHOT,
    SNAPSHOT,
    JobFields,
    JobReplay,
    LoggedJob,
    TornRecord,
    apply_records,
    encode_dedup_key,
    encode_delete,
    encode_job,
    encode_job_fields,
    encode_job_keyed,
    encode_state,
    frame,
    record_end,
)
from tercel.journal.records import VERSION, header_version
from tercel.journal.tail import HOLE, keep_cut, tail_cut, zero_first_page

log = logging.getLogger("tercel.journal")

DEFAULT_MAX_FILE_SIZE: Final = 10 * 1024 * 1024
JOBS_PREFIX: Final = "jobs."
SNAP_PREFIX: Final = "snapshot."
SERVE_DIR: Final = "beanstalk.d"
"""The job log's directory inside a data dir under ``tercel serve``."""


def _seqs(names: list[str], prefix: str) -> list[int]:
    return sorted(
        int(e[len(prefix) :]) for e in names if e.startswith(prefix) and e[len(prefix) :].isdigit()
    )


class JobJournal(AppendLog):
    """The job log in ``directory`` (see the module docstring). Every file operation goes
    through ``ops`` (the default :class:`~tercel.journal.files.FileOps` when None: the seam
    fault-injection tests use)."""

    def __init__(
        self,
        directory: str,
        max_file_size: int = DEFAULT_MAX_FILE_SIZE,
        on_dirty: Callable[[JobJournal], None] | None = None,
        name: str = "beanstalk",
        ops: FileOps | None = None,
    ) -> None:
        super().__init__(ops if ops is not None else default_ops(), name)
        self.directory = directory
        self.max_file_size = max_file_size
        self.on_dirty = on_dirty
        """Told when the buffer goes from empty to not empty (the group committer); without
        one, records wait for :meth:`write_out`."""
        os.makedirs(directory, exist_ok=True)
        self._lock_fd = os.open(os.path.join(directory, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # Held for the log's life, so that the directory fsyncs of a rotation or a
            # compaction never need a descriptor the process may not have (EMFILE).
            self._dir_fd = self._ops.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            os.close(self._lock_fd)
            raise
        self.seq = 0  # the current jobs file
        self._older = 0  # bytes of the other files
        self._retired: list[int] = []  # descriptors of rotated files a running sync may use
        self.records_written = 0
        self.records_migrated = 0
        self.oldest_seq = 0
        self.put_off = 0
        self._keys: dict[str, tuple[int, int]] | None = None  # replay's dedup keys
        self._retry_at = 0  # after a rotation put off: the size of the file to try again at
        """Rotations and compactions put off: no descriptor for the new file (EMFILE,
        ENFILE). The log goes on in its current file and tries again later."""

    # ------------------------------------------------------------------------- AppendLog

    def _dirty(self) -> None:
        if self.on_dirty is not None:
            self.on_dirty(self)

    def _error_path(self) -> str:
        return self._path(self.seq)

    def _after_write(self, size: int) -> None:
        if self._written >= self.max_file_size and self._written >= self._retry_at:
            self.rotate()

    # ------------------------------------------------------------------------------- replay

    def _names(self) -> list[str]:
        return self._ops.scandir(self.directory)

    def replay(self) -> JobReplay:
        """Read the newest snapshot and every later jobs file; open the log for appends."""
        d = self.directory
        ops = self._ops
        for entry in self._names():
            if entry.startswith(SNAP_PREFIX) and entry.endswith(".tmp"):
                ops.unlink(os.path.join(d, entry))
        names = self._names()
        snaps = _seqs(names, SNAP_PREFIX)
        covered = snaps[-1] if snaps else 0
        jobs: dict[int, LoggedJob] = {}
        keys: dict[str, tuple[int, int]] = {}
        self._keys = keys
        next_id = 1
        records = 0
        if snaps:
            path = os.path.join(d, f"{SNAP_PREFIX}{covered}")
            next_id, n, _ = self._replay_file(path, covered, jobs, newest=False, snapshot=True)
            records += n
        self._remove_covered(covered, snaps[:-1])
        seqs = [s for s in _seqs(self._names(), JOBS_PREFIX) if s > covered]
        torn = tails = 0
        for i, seq in enumerate(seqs):
            path = os.path.join(d, f"{JOBS_PREFIX}{seq}")
            top, n, cut = self._replay_file(path, seq, jobs, newest=i == len(seqs) - 1)
            next_id = max(next_id, top)
            records += n
            torn += cut
            if cut:
                tails += 1
        for job_id in jobs:
            next_id = max(next_id, job_id + 1)
        self.oldest_seq = seqs[0] if seqs else covered + 1
        self.seq = seqs[-1] if seqs else covered + 1
        self._older = sum(
            os.path.getsize(os.path.join(d, f"{JOBS_PREFIX}{s}")) for s in seqs[:-1]
        ) + (os.path.getsize(os.path.join(d, f"{SNAP_PREFIX}{covered}")) if snaps else 0)
        self._open(self.seq)
        self._keys = None
        return JobReplay(list(jobs.values()), next_id, torn, records, tails, keys or None)

    def _remove_covered(self, covered: int, old_snaps: list[int]) -> None:
        d = self.directory
        for seq in _seqs(self._names(), JOBS_PREFIX):
            if seq <= covered:
                self._ops.unlink(os.path.join(d, f"{JOBS_PREFIX}{seq}"))
        for seq in old_snaps:
            self._ops.unlink(os.path.join(d, f"{SNAP_PREFIX}{seq}"))

    def _read(self, path: str) -> bytes:
        ops = self._ops
        fd = ops.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return ops.pread(fd, ops.fstat_size(fd), 0)
        finally:
            ops.close(fd)

    def _truncate(self, path: str, size: int) -> None:
        ops = self._ops
        fd = ops.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            ops.ftruncate(fd, size)
            ops.fsync(fd)
        finally:
            ops.close(fd)

    def _replay_file(
        self,
        path: str,
        file: int,
        jobs: dict[int, LoggedJob],
        *,
        newest: bool,
        snapshot: bool = False,
    ) -> tuple[int, int, int]:
        """Apply one file; (next id seen, records, torn bytes cut off). Zeros written ahead
        after the last record end the data (cut off the newest file, which is appended to).
        A bad record in the newest jobs file is cut only as the queue journals cut one
        (:func:`~tercel.journal.tail.tail_cut`: a torn tail, or a power-loss hole whose bytes
        are kept in ``<file>.cut-<offset>``); any other raises :class:`JournalCorrupt`."""
        data = self._read(path)
        newest = newest and not snapshot
        if newest and not data:
            return 1, 0, 0
        if newest and data and zero_first_page(data):  # the header's page never written back
            why = "a hole of zeros where the file header was, power loss in the unsynced tail"
            return self._cut(path, data, 0, why, len(data) > HOLE)
        if len(data) < HEADER_SIZE:
            if newest and HEADER.startswith(data):
                return self._cut(path, data, 0, "torn file header", False)
            raise JournalCorrupt("not a tercel job log (bad file header)", path, 0)
        version = header_version(data[:HEADER_SIZE])
        if version is None or version < FIRST_VERSION:
            raise JournalCorrupt(f"not a version {VERSION} job log (bad file header)", path, 0)
        try:
            next_id, count, stop = apply_records(data, file, jobs, snapshot, self._keys)
        except TornRecord as torn:
            shape = tail_cut(data, torn.offset, record_end) if newest else None
            if shape is None:
                raise JournalCorrupt(torn.why, path, torn.offset) from None
            why = torn.why
            if shape:
                why = f"{why}: {shape}, power loss in the unsynced tail"
            _, _, cut = self._cut(path, data, torn.offset, why, bool(shape))
            next_id, count, _ = apply_records(data[: torn.offset], file, jobs, snapshot, self._keys)
            return next_id, count, cut
        if stop < len(data) and newest:  # zeros written ahead: not a torn tail
            self._truncate(path, stop)
        return next_id, count, 0

    def _cut(
        self, path: str, data: bytes, offset: int, why: str, keep: bool
    ) -> tuple[int, int, int]:
        """Cut ``path`` (read as ``data``) at ``offset``, first copying the cut bytes to
        ``<path>.cut-<offset>`` when ``keep`` (a power-loss hole); logged as a torn tail.
        (1, 0, bytes cut): what :meth:`_replay_file` returns for a file cut to nothing."""
        if keep:
            ops = self._ops
            kept = keep_cut(
                path,
                offset,
                len(data),
                ops=ops,
                open_file=lambda name, flags: ops.open(name, flags | os.O_CLOEXEC, 0o644),
                sync_dir=lambda: fsync_dir(self.directory, ops),
            )
            why = f"{why}; kept in {kept}"
        log.warning(
            "job log %s: torn tail at offset %d (%s); cut %d bytes",
            path,
            offset,
            why,
            len(data) - offset,
        )
        self._truncate(path, offset)
        return 1, 0, len(data) - offset

    # ------------------------------------------------------------------------------- writes

    def _path(self, seq: int) -> str:
        return os.path.join(self.directory, f"{JOBS_PREFIX}{seq}")

    def _open(self, seq: int, fd: int = -1) -> None:
        """Make ``jobs.<seq>`` the file appended to (created with its header if new), opening
        it, or taking ``fd`` already opened on it."""
        ops = self._ops
        if fd < 0:
            fd = ops.open(self._path(seq), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
        try:
            size = ops.fstat_size(fd)
            if size == 0:
                write_all(ops, fd, HEADER, 0)
                size = HEADER_SIZE
                ops.fsync(self._dir_fd)
        except BaseException:
            ops.close(fd)
            raise
        self._fd = fd
        self.closed = False
        self._start_file(size)

    def put(  # noqa: PLR0917 (the store's JobLog.put: fields, for every put)
        self,
        job_id: int,
        state: int,
        pri: int,
        delay: int,
        deadline_ms: int,
        tube: str,
        ttr: int,
        created_ms: int,
        body: bytes,
    ) -> int:
        """A new job's JOB record (counters 0), from its fields (the store's ``JobLog``); the
        number of the file it is written to."""
        parts = encode_job_fields(  # [prefix and fields, body]: the body is not copied
            job_id, state, pri, delay, deadline_ms, None, tube, ttr, created_ms, body
        )
        self._append_parts(parts, len(parts[0]) + len(parts[1]))
        self.records_written += 1
        return self.seq

    def put_keyed(  # noqa: PLR0917 (as put, and the key)
        self,
        job_id: int,
        state: int,
        pri: int,
        delay: int,
        deadline_ms: int,
        tube: str,
        ttr: int,
        created_ms: int,
        body: bytes,
        key: str,
    ) -> int:
        """:meth:`put` of a ``put-key``: one PUT_KEYED record, the job and its dedup key."""
        parts = encode_job_keyed(
            job_id, state, pri, delay, deadline_ms, tube, ttr, created_ms, body, key
        )
        self._append_parts(parts, len(parts[0]) + len(parts[1]))
        self.records_written += 1
        return self.seq

    def change(self, record: JobFields) -> None:
        self._append(encode_state(record))
        self.records_written += 1

    def delete(self, job_id: int) -> None:
        self._append(encode_delete(job_id))
        self.records_written += 1

    @property
    def current_file(self) -> int:
        """The ``n`` of the ``jobs.<n>`` a record appended now is written to."""
        return self.seq

    def rotate(self) -> bool:
        """Close the current file (zeros ahead cut, synced) and start the next; False when
        the log is closed, or when no descriptor is to be had for the next file (EMFILE,
        ENFILE): that rotation is put off (:attr:`put_off`), the log goes on in the current
        file. The next file is opened before the current one is let go, and only once the
        current one is synced (a file that is not the newest must not end torn)."""
        self.write_out()
        if self.closed:
            return False
        ops = self._ops
        fd = self._fd
        try:
            self._cut_ahead()
            ops.fdatasync(fd)
        except OSError as exc:
            self._fail("fsync", exc)
        try:
            new = ops.open(self._path(self.seq + 1), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno in OUT_OF_DESCRIPTORS:  # again once another 1/16 is written: each
                self.put_off += 1  # try costs an fdatasync of the current file
                self._retry_at = self._written + (self.max_file_size >> 4)
                log.warning("job log %s: rotation put off: %s", self.directory, exc.strerror)
                return False
            self._fail("rotation", exc)
        if self.syncing:  # a periodic fdatasync of this file runs on a worker thread
            self._retired.append(fd)  # closed by sync_done, never under its feet
        else:
            ops.close(fd)
        self._fd = -1
        self._older += self._written
        self._unsynced = False
        self.seq += 1
        try:
            self._open(self.seq, new)
        except OSError as exc:
            self._fail("rotation", exc)
        return True

    def sync(self) -> None:
        fd = self.begin_sync()
        if fd >= 0:
            try:
                self._ops.fdatasync(fd)
            except OSError as exc:
                self._fail("fsync", exc)

    def sync_done(self) -> None:
        """A periodic sync finished (on the loop): close the files rotated meanwhile."""
        self.syncing = False
        while self._retired:
            self._ops.close(self._retired.pop())

    @property
    def size(self) -> int:
        """Bytes of every file of the log, buffered records included."""
        return self._older + self._written + self._pending

    # --------------------------------------------------------------------------- compaction

    @property
    def compact_floor(self) -> int:
        """Never compact a log smaller than two files."""
        return 2 * self.max_file_size

    def compact(
        self,
        next_id: int,
        jobs: Iterable[JobFields],
        keys: Sequence[tuple[str, int, int]] = (),
    ) -> int | None:
        """Replace every file by one snapshot of ``jobs`` (the state now), crash-safely:
        rotate, write ``snapshot.<n>.tmp``, fsync, rename, fsync the directory, then delete
        the files it covers by name; ``n``. Runs on the caller's thread. Each crash window
        can be hit through the file seam (:data:`tercel.journal.faults.JOB_COMPACTION_CRASHES`).

        None, with nothing changed, when the log is closed or out of descriptors (the
        snapshot's file is opened before the rotation; a rotation put off puts the
        compaction off): the caller tries again later. ``keys`` ``(key, job id, put wall ms)``:
        the dedup keys held, written after the SNAPSHOT record (DEDUP_KEY records)."""
        if self.closed:
            return None
        covered = self.seq  # the current file, once rotated
        d = self.directory
        tmp = os.path.join(d, f"{SNAP_PREFIX}{covered}.tmp")
        final = os.path.join(d, f"{SNAP_PREFIX}{covered}")
        ops = self._ops
        count = 0
        try:
            fd = ops.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno not in OUT_OF_DESCRIPTORS:
                raise
            self.put_off += 1
            log.warning("job log %s: compaction put off: %s", d, exc.strerror)
            return None
        try:
            rotated = self.rotate()
        except BaseException:
            ops.close(fd)
            raise
        if not rotated:
            ops.close(fd)
            ops.unlink(tmp)
            return None
        try:
            parts = [HEADER, frame(SNAPSHOT.pack(OP_SNAPSHOT, next_id, covered))]
            parts += [encode_dedup_key(k, job_id, put_ms) for k, job_id, put_ms in keys]
            pending = sum(len(p) for p in parts)
            offset = 0
            for job in jobs:
                head, body = encode_job(job)
                parts += (head, body)
                pending += len(head) + len(body)
                count += 1
                if len(parts) >= IOV_MAX:
                    write_parts(ops, fd, parts, pending, offset)
                    offset += pending
                    parts, pending = [], 0
            if parts:
                write_parts(ops, fd, parts, pending, offset)
                offset += pending
            ops.fdatasync(fd)
        finally:
            ops.close(fd)
        ops.rename(tmp, final)
        ops.fsync(self._dir_fd)
        self._remove_covered(covered, [s for s in _seqs(self._names(), SNAP_PREFIX) if s < covered])
        ops.fsync(self._dir_fd)
        self._older = offset
        self.oldest_seq = self.seq
        self.records_migrated += count
        return covered

    def close(self) -> None:
        """Write what is buffered, cut the zeros ahead, sync, close the file and release the
        lock."""
        if not self.closed:
            try:
                if self._failed is None:
                    self.write_out()
                    self._cut_ahead()
                    self.sync()
            finally:
                self.closed = True
                if self._fd >= 0:
                    self._ops.close(self._fd)
                    self._fd = -1
        while self._retired:
            self._ops.close(self._retired.pop())
        if self._dir_fd >= 0:
            self._ops.close(self._dir_fd)
            self._dir_fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
