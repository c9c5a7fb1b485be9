"""The job log's records (format version 3, docs/journal_format.md §17): their encoders, the
check of one record, and the replay of one file's records into the latest state of each job.
Sans-IO: bytes in, bytes or jobs out; :mod:`tercel.journal.joblog` owns the files.

Four opcodes: JOB (a whole job), STATE (a job's new state), DELETE and SNAPSHOT (first
record of a snapshot file), framed as in every tercel journal (``u32 length | u32 crc32 |
body``); format version 4 adds two for ``put-key``'s dedup keys: PUT_KEYED (a JOB record and
its key, one record) and DEDUP_KEY (a remembered key, as a compaction's snapshot writes it).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final, Protocol

from librt.strings import BytesWriter, write_i32_le, write_i64_le
from mypy_extensions import i32, i64

from tercel.journal.records import FILE_HEADER, PREFIX, PREFIX_SIZE, crc32, header_version
from tercel.journal.tail import Buffer

HEADER: Final = FILE_HEADER
"""The record format's header (written); any version from :data:`FIRST_VERSION` is read."""
FIRST_VERSION: Final = 3
"""The first format version with the job records."""
HEADER_SIZE: Final = len(HEADER)
MAX_BODY: Final = 1024 * 1024 * 1024 + 256

OP_JOB: Final = 16
OP_STATE: Final = 17
OP_DELETE: Final = 18
OP_SNAPSHOT: Final = 19
# dedup keys (docs/journal_format.md, "Dedup keys"; format version 4)
OP_PUT_KEYED: Final = 23
"""``u8 23 | u8 key length | key | the JOB record's body after its opcode``."""
OP_DEDUP_KEY: Final = 24
"""``u8 24 | u64 job id | i64 put time (wall ms) | key``: a key a snapshot carries."""
DEDUP_KEY = struct.Struct("<BQq")
MAX_KEY: Final = 255

JOB = struct.Struct("<BQBIIIqqIIIIIB")  # op id state pri delay ttr created deadline 5xctr len
STATE = struct.Struct("<BQBIIqIIIII")  # op id state pri delay deadline 5 counters
DELETE = struct.Struct("<BQ")
SNAPSHOT = struct.Struct("<BQQ")  # op, next job id, last jobs file covered
_U32: Final = 0xFFFF_FFFF
_ZERO_COUNTERS: Final = bytes(20)
"""A new job's five u32 counters."""


class JobFields(Protocol):
    """What the log reads of a job (the core's ``JobRecord`` has these attributes)."""

    @property
    def job_id(self) -> int: ...
    @property
    def state(self) -> int: ...
    @property
    def pri(self) -> int: ...
    @property
    def delay(self) -> int: ...
    @property
    def deadline_ms(self) -> int: ...
    @property
    def counters(self) -> tuple[int, int, int, int, int]: ...
    @property
    def tube(self) -> str: ...
    @property
    def ttr(self) -> int: ...
    @property
    def created_ms(self) -> int: ...
    @property
    def body(self) -> bytes: ...


@dataclass(slots=True)
class LoggedJob:
    """A job as replay found it (the latest of its records)."""

    job_id: int
    state: int
    pri: int
    delay: int
    deadline_ms: int
    counters: tuple[int, int, int, int, int]
    tube: str
    ttr: int
    created_ms: int
    body: bytes
    file: int = 0
    """The number of the file its JOB record was read from (``jobs.<n>`` or ``snapshot.<n>``)."""


@dataclass(slots=True)
class JobReplay:
    """What :meth:`JobJournal.replay` found: the jobs (buried ones in bury order), the next
    free job id, how many bytes of torn tail were cut off, and from how many files (each a
    torn tail cut, the ``journal_torn_tails`` stat, as a queue journal's)."""

    jobs: list[LoggedJob]
    next_id: int
    torn_bytes: int
    records: int
    torn_tails: int = 0
    keys: dict[str, tuple[int, int]] | None = None
    """The dedup keys of ``put-key`` found: key -> (job id, put time in wall ms), oldest
    first (None: none)."""


# The encoders write the records' fixed fields with librt's BytesWriter: compiled, each
# ``write_*`` is a C call on an unboxed integer, where ``struct.pack`` is a Python call that
# boxes every field (a put's JOB record: ~6k instructions -> ~3k, docs/benchmarks.md). The
# bytes are those of the ``struct`` formats above (``JOB``, ``STATE``, ``DELETE``), which
# replay decodes; tests/journal/test_joblog_encode.py holds the two to each other.


def _u32(w: BytesWriter, value: int) -> None:
    """``value`` (0 .. 2**32-1) as 4 little-endian bytes (as i32: the same bytes)."""
    write_i32_le(w, i32(value - 0x1_0000_0000) if value > 0x7FFF_FFFF else i32(value))


def _u64(w: BytesWriter, value: int) -> None:
    """``value`` (0 .. 2**64-1) as 8 little-endian bytes (as i64: the same bytes). (Tested
    with a shift: compiled, a comparison with a constant past 2**62 is a Python call.)"""
    if value >> 62 == 0:
        write_i64_le(w, i64(value))
    else:
        write_i64_le(w, i64(value - (1 << 64)) if value >> 63 else i64(value))


def _counters(w: BytesWriter, counters: tuple[int, int, int, int, int]) -> None:
    """The five u32 counters, each clamped to the field."""
    for n in counters:
        _u32(w, n if n < _U32 else _U32)


def _head(length: int, crc: int, fields: bytes) -> bytes:
    """A record's prefix (``u32 length | u32 crc32``) followed by ``fields``."""
    w = BytesWriter()
    _u32(w, length)
    _u32(w, crc)
    w.write(fields)
    return w.getvalue()


def frame(body: bytes) -> bytes:
    return _head(len(body), crc32(body), body)


def encode_job(job: JobFields) -> list[bytes]:
    """A JOB record as two pieces, the head and the body (the body is not copied)."""
    return encode_job_fields(
        job.job_id,
        job.state,
        job.pri,
        job.delay,
        job.deadline_ms,
        job.counters,
        job.tube,
        job.ttr,
        job.created_ms,
        job.body,
    )


def encode_job_fields(  # noqa: PLR0917 (every field of the record, as encode_job's)
    job_id: int,
    state: int,
    pri: int,
    delay: int,
    deadline_ms: int,
    counters: tuple[int, int, int, int, int] | None,
    tube: str,
    ttr: int,
    created_ms: int,
    body: bytes,
) -> list[bytes]:
    """:func:`encode_job` from the fields themselves (a put has no record object to read);
    ``counters`` None: all zero (a new job)."""
    name = tube.encode("ascii")
    w = BytesWriter()
    w.append(OP_JOB)
    _u64(w, job_id)
    w.append(state)
    _u32(w, pri)
    _u32(w, delay)
    _u32(w, ttr)
    write_i64_le(w, i64(created_ms))
    write_i64_le(w, i64(deadline_ms))
    if counters is None:
        w.write(_ZERO_COUNTERS)
    else:
        _counters(w, counters)
    w.append(len(name))
    w.write(name)
    fields = w.getvalue()
    return [_head(len(fields) + len(body), crc32(body, crc32(fields)), fields), body]


def encode_job_keyed(  # noqa: PLR0917 (as encode_job_fields, and the key)
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
) -> list[bytes]:
    """A PUT_KEYED record as two pieces, the head and the body: a new job (counters 0) and
    its dedup key ``key`` (1-255 ASCII bytes), one record (a torn write keeps neither)."""
    head, _ = encode_job_fields(
        job_id, state, pri, delay, deadline_ms, None, tube, ttr, created_ms, b""
    )
    raw = key.encode("ascii")
    fields = bytes((OP_PUT_KEYED, len(raw))) + raw + head[PREFIX_SIZE + 1 :]
    return [_head(len(fields) + len(body), crc32(body, crc32(fields)), fields), body]


def encode_dedup_key(key: str, job_id: int, put_ms: int) -> bytes:
    """A DEDUP_KEY record: ``key`` put job ``job_id`` at wall time ``put_ms``."""
    return frame(DEDUP_KEY.pack(OP_DEDUP_KEY, job_id, put_ms) + key.encode("ascii"))


def encode_state(job: JobFields) -> bytes:
    w = BytesWriter()
    w.append(OP_STATE)
    _u64(w, job.job_id)
    w.append(job.state)
    _u32(w, job.pri)
    _u32(w, job.delay)
    write_i64_le(w, i64(job.deadline_ms))
    _counters(w, job.counters)
    return frame(w.getvalue())


def encode_delete(job_id: int) -> bytes:
    w = BytesWriter()
    w.append(OP_DELETE)
    _u64(w, job_id)
    return frame(w.getvalue())


class TornRecord(Exception):
    """A bad record; ``offset`` is where it starts."""

    def __init__(self, offset: int, why: str) -> None:
        super().__init__(why)
        self.offset = offset
        self.why = why


_SIZES: Final = {OP_STATE: STATE.size, OP_DELETE: DELETE.size, OP_SNAPSHOT: SNAPSHOT.size}
"""The body size of each fixed-size record (a JOB record is at least ``JOB.size``)."""


def check_record(data: Buffer, pos: int) -> int:
    """The offset just after the valid record at ``pos`` (framing, checksum, an opcode of the
    job log with its size, a JOB record's tube name inside it and ASCII); raises
    :class:`TornRecord` when there is none."""
    end = len(data)
    if end - pos < PREFIX_SIZE:
        raise TornRecord(pos, "record header runs past the end of the file")
    length, crc = PREFIX.unpack_from(data, pos)
    start = pos + PREFIX_SIZE
    stop = start + length
    if length == 0 or length > MAX_BODY or stop > end:
        raise TornRecord(pos, "record runs past the end of the file")
    body = data[start:stop]
    if crc32(body) != crc:
        raise TornRecord(pos, "checksum mismatch")
    op = body[0]
    if op in (OP_PUT_KEYED, OP_DEDUP_KEY):
        _check_keyed(body, pos)
        return int(stop)
    if length != _SIZES.get(op, -1) and not (op == OP_JOB and length >= JOB.size):
        raise TornRecord(pos, f"bad record (opcode {op}, length {length})")
    if op == OP_JOB:  # the checksum only says these bytes were written whole
        tube_end = JOB.size + body[JOB.size - 1]
        if tube_end > length or not body[JOB.size : tube_end].isascii():
            raise TornRecord(pos, f"bad JOB record (tube name of {body[JOB.size - 1]} bytes)")
    return int(stop)


def _check_keyed(body: Buffer, pos: int) -> None:
    """Check a PUT_KEYED or DEDUP_KEY body (whose checksum matched) at record ``pos``."""
    length = len(body)
    if body[0] == OP_DEDUP_KEY:
        if not DEDUP_KEY.size < length <= DEDUP_KEY.size + MAX_KEY:
            raise TornRecord(pos, f"bad DEDUP_KEY record (length {length})")
        return
    start = 2 + (body[1] if length > 1 else 0)
    if length < 2 or body[1] == 0 or length - start + 1 < JOB.size:
        raise TornRecord(pos, f"bad PUT_KEYED record (length {length})")
    tube_end = start - 1 + JOB.size + body[start - 1 + JOB.size - 1]
    if tube_end > length or not bytes(body[start - 1 + JOB.size : tube_end]).isascii():
        raise TornRecord(pos, "bad PUT_KEYED record (tube name)")


def _job(body: bytes, file: int) -> LoggedJob:
    """The job of a JOB record's ``body``."""
    f = JOB.unpack_from(body)
    tube_end = JOB.size + f[13]
    return LoggedJob(
        f[1],
        f[2],
        f[3],
        f[4],
        f[7],
        (f[8], f[9], f[10], f[11], f[12]),
        body[JOB.size : tube_end].decode("ascii"),
        f[5],
        f[6],
        body[tube_end:],
        file,
    )


def check_file(data: bytes) -> tuple[int, int, str]:
    """Check one job-log file's bytes (a ``jobs.<n>`` or a ``snapshot.<n>``) record by
    record, as replay frames them (``tercel journal check``): ``(records, offset, why)``,
    where ``offset`` is that of the first bad record (0: the header) and -1 when there is
    none. Zeros from a record boundary to the end are space written ahead, not damage."""
    version = header_version(data[:HEADER_SIZE]) if len(data) >= HEADER_SIZE else None
    if version is None or version < FIRST_VERSION:
        return 0, 0, "bad file header"
    pos = HEADER_SIZE
    end = len(data)
    count = 0
    while pos < end:
        if data[pos] == 0 and data.count(0, pos) == end - pos:
            break
        try:
            pos = check_record(data, pos)
        except TornRecord as torn:
            return count, torn.offset, torn.why
        count += 1
    return count, -1, ""


def record_end(data: Buffer, pos: int) -> int:
    """The job log's :data:`~tercel.journal.tail.RecordEnd`: :func:`check_record`, -1 for
    no record."""
    try:
        return check_record(data, pos)
    except TornRecord:
        return -1


def apply_records(
    data: bytes,
    file: int,
    jobs: dict[int, LoggedJob],
    snapshot: bool,
    keys: dict[str, tuple[int, int]] | None = None,
) -> tuple[int, int, int]:
    """Apply the records of one file's ``data`` (read from file number ``file``) to ``jobs``,
    the latest record of each id last; ``(next id seen, records, where the data ends)``.
    The dedup keys found go to ``keys`` (key -> (job id, put wall ms); dropped when None).
    Raises :class:`TornRecord` at the first bad record."""
    pos = HEADER_SIZE
    end = len(data)
    next_id = 1
    count = 0
    while pos < end:
        if data[pos] == 0 and data.count(0, pos) == end - pos:
            return next_id, count, pos  # zeros written ahead of the records
        stop = check_record(data, pos)
        body = data[pos + PREFIX_SIZE : stop]
        op = body[0]
        if op == OP_JOB:
            f = JOB.unpack_from(body)
            tube_end = JOB.size + f[13]
            job = LoggedJob(
                f[1],
                f[2],
                f[3],
                f[4],
                f[7],
                (f[8], f[9], f[10], f[11], f[12]),
                body[JOB.size : tube_end].decode("ascii"),
                f[5],
                f[6],
                body[tube_end:],
                file,
            )
            jobs.pop(job.job_id, None)
            jobs[job.job_id] = job
            next_id = max(next_id, job.job_id + 1)
        elif op == OP_STATE:
            f = STATE.unpack_from(body)
            old = jobs.pop(f[1], None)
            if old is not None:  # a state change keeps the bury order: move to the end
                old.state, old.pri, old.delay, old.deadline_ms = f[2], f[3], f[4], f[5]
                old.counters = (f[6], f[7], f[8], f[9], f[10])
                jobs[old.job_id] = old
            next_id = max(next_id, f[1] + 1)
        elif op == OP_DELETE:
            _, job_id = DELETE.unpack(body)
            jobs.pop(job_id, None)
            next_id = max(next_id, job_id + 1)
        elif op == OP_PUT_KEYED:
            start = 2 + body[1]
            job = _job(bytes((OP_JOB,)) + body[start:], file)
            jobs.pop(job.job_id, None)
            jobs[job.job_id] = job
            next_id = max(next_id, job.job_id + 1)
            if keys is not None:
                keys[body[2:start].decode("ascii", "replace")] = (job.job_id, job.created_ms)
        elif op == OP_DEDUP_KEY:
            _, job_id, put_ms = DEDUP_KEY.unpack_from(body)
            if keys is not None:
                keys[body[DEDUP_KEY.size :].decode("ascii", "replace")] = (job_id, put_ms)
        elif snapshot and count == 0:  # OP_SNAPSHOT: only first in a snapshot file
            _, snap_next, _ = SNAPSHOT.unpack(body)
            next_id = max(next_id, snap_next)
        else:
            raise TornRecord(pos, f"bad record (opcode {op}, length {len(body)})")
        count += 1
        pos = stop
    return next_id, count, end
