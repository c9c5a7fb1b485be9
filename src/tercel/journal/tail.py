"""The torn-tail rule every tercel log shares: what replay may cut off the newest file.

A bad record in the newest file of a log (a queue journal, ``journal.py``; the beanstalkd job
log, ``joblog.py``) is cut only when it is a **torn tail** (nothing valid after it) or a
**power-loss hole** of zeros (docs/journal_format.md §6); any other bad record is damage and
start-up refuses. Both logs frame records alike (``u32 length | u32 crc32 | body``) but accept
different bodies, so each passes its own :data:`RecordEnd`. Which bytes are cut is decided
here, on a buffer; the caller reads the file, keeps a hole's bytes (:func:`keep_cut`) and
truncates.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from typing import Final

from tercel.journal.append import write_all
from tercel.journal.files import FileOps
from tercel.journal.records import PREFIX_SIZE

Buffer = bytes | mmap.mmap
"""A file's bytes: read whole, or mapped."""

TORN_SCAN: Final = 1 << 20
"""How much of a file after a bad record replay searches for a valid record before deciding
the bad record is a torn tail (nothing valid after it) rather than damage (valid data after
it, which must never be cut away). The whole rest of the file is searched when it is shorter;
a longer rest is a torn tail only if the bad record claims to run past the end of the file
(a large record cut short) and its first MiB holds nothing valid. After a record that claims to
run past the end, "valid" means a run of records reaching the end of the data: the cut record's
own payload may hold record bytes (a journal stored as an item)."""

HOLE: Final = 4096
"""The unit of a power-loss hole: a page (and the usual filesystem block)."""

RecordEnd = Callable[[Buffer, int], int]
"""A log's record check: the offset just after the valid record that starts at ``pos`` in
``buf``, or -1 when none does (framing, checksum and the log's own body rules)."""


def data_end(buf: Buffer) -> int:
    """The offset just past the last non-zero byte of ``buf`` (0 if there is none)."""
    end = len(buf)
    while end > 0:
        start = max(0, end - TORN_SCAN)
        kept = len(buf[start:end].rstrip(b"\0"))
        if kept:
            return start + kept
        end = start
    return 0


def records_up_to(buf: Buffer, pos: int, end: int, record_end: RecordEnd) -> bool:
    """True when valid records follow one another from ``pos`` to exactly ``end``."""
    while 0 <= pos < end:
        pos = record_end(buf, pos)
    return pos == end


def valid_data_after(buf: Buffer, bad: int, record_end: RecordEnd) -> bool:
    """True when the bytes after the bad record at ``bad`` hold a valid record (then the bad
    record is damage, not a torn tail; see :data:`TORN_SCAN`)."""
    end = data_end(buf)  # zeros written ahead at the end are no data
    claimed_end = end + 1
    if bad + PREFIX_SIZE <= end:
        length = int.from_bytes(buf[bad : bad + 4], "little")
        claimed_end = bad + PREFIX_SIZE + length
        if claimed_end < end and record_end(buf, claimed_end) >= 0:
            return True
    if end - bad > TORN_SCAN and claimed_end <= end:
        return True  # a long rest after a record that claims to fit: not a torn write
    scan = range(bad + 1, min(end, bad + TORN_SCAN))
    if claimed_end <= end:
        return any(record_end(buf, pos) >= 0 for pos in scan)
    # The bad record claims to run past the data: a record cut short, whose own payload
    # may hold record bytes (a journal stored as an item). Only a run of records that
    # goes on to the end of the data shows damage before it.
    return any(records_up_to(buf, pos, end, record_end) for pos in scan)


def hole_after(buf: Buffer, bad: int) -> str:
    """What power-loss hole cuts the bad record at ``bad`` ("" when none does). Two shapes,
    both left by dirty pages written back out of order (journal_format.md §6):

    - a whole aligned :data:`HOLE` of zero bytes at the first page boundary at or after
      ``bad``, reached by the bad record (its claimed length runs into it, or only zeros lie
      between them): a page of the unsynced tail never written back;
    - zeros from ``bad``, not on a page boundary, to the end of its page, data after: the page
      holding the last synced bytes, whose later write was lost (it reads as at the last
      fsync: records, then the zeros written ahead or nothing, which reads as zeros).

    Other damage rarely looks like either: a zeroed sector inside synced data matches only
    if it starts where a record starts and ends on a page boundary."""
    page = -(-bad // HOLE) * HOLE
    to_page_end = buf[bad:page].count(0) == page - bad
    if bad % HOLE and page < len(buf) and to_page_end:
        return "zeros to the end of the page holding the last good record"
    if page + HOLE > len(buf) or buf[page : page + HOLE].count(0) != HOLE:
        return ""
    if to_page_end:
        return "a hole of zeros"  # zeros from the bad record on
    if bad + PREFIX_SIZE > page:
        return ""  # the length field itself is cut: nothing tells its span
    length = int.from_bytes(buf[bad : bad + 4], "little")
    return "a hole of zeros" if bad + PREFIX_SIZE + length > page else ""


def tail_cut(buf: Buffer, bad: int, record_end: RecordEnd) -> str | None:
    """The rule for a bad record at ``bad`` in the newest file ``buf`` of a log: None when it
    is damage (start-up refuses); "" when it is a torn tail (cut); else the power-loss hole
    shape (:func:`hole_after`) that explains the valid data after it (cut, the bytes kept)."""
    if not valid_data_after(buf, bad, record_end):
        return ""
    return hole_after(buf, bad) or None


def zero_first_page(buf: Buffer) -> bool:
    """True when the first :data:`HOLE` bytes of a file (all of it, if shorter) are zeros:
    its header's page was never written back (a power loss), so no fsync covered the file."""
    first = buf[:HOLE]
    return first.count(0) == len(first)


def keep_cut(
    path: str,
    offset: int,
    size: int,
    *,
    ops: FileOps,
    open_file: Callable[[str, int], int],
    sync_dir: Callable[[], None],
) -> str:
    """Copy the bytes from ``offset`` to ``size`` of ``path`` to ``<path>.cut-<offset>``
    (never replayed: not a log file name) before a hole cuts them off; the copy's name. A name
    already taken (an earlier cut at the same offset) gets ``.<n>`` added: kept bytes are never
    overwritten. ``open_file(path, flags)`` opens (the data dir's pool, or ``ops`` directly),
    ``sync_dir()`` makes the new name durable; the copy itself is fsynced."""
    src = open_file(path, os.O_RDONLY)
    dst = -1
    try:
        kept = f"{path}.cut-{offset}"
        n = 1
        while dst < 0:
            try:
                dst = open_file(kept, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                kept = f"{path}.cut-{offset}.{n}"
                n += 1
        pos = offset
        while pos < size:
            data = ops.pread(src, min(1 << 20, size - pos), pos)
            if not data:
                break
            write_all(ops, dst, data, pos - offset)
            pos += len(data)
        ops.fsync(dst)
    finally:
        ops.close(src)
        if dst >= 0:
            ops.close(dst)
    sync_dir()
    return kept
