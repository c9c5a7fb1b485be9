"""Reading records forward from a byte offset, a chunk at a time.

Replay and read-behind both read this way: ``os.pread`` of 1 MiB chunks, records checked and
parsed in place. Nothing is memory-mapped, so a 2 GB journal adds nothing to the process's
resident set, and no single call reads more than one chunk (or one record, if a record is
larger).

The buffer is the ``bytes`` object ``pread`` returned, used as it is: a refill reads the next
chunk *from the read position*, so the few bytes of a record cut at the end of the last chunk
are read again from the page cache instead of being copied to the front of a ``bytearray``
(which cost an allocation and two 1 MiB copies per chunk), and payloads sliced out of it are
already ``bytes``.
"""

from __future__ import annotations

import os
import struct
from typing import Final

from tercel.journal import records as rec
from tercel.journal.files import OS_FILES, FileOps

CHUNK = 1 << 20


class ChunkReader:
    """Checked records of one file, from ``offset`` to the end the OS knows of; its reads go
    through ``ops`` (the journal's file seam, :class:`~tercel.journal.files.FileOps`) when
    given, else straight to ``os``."""

    __slots__ = ("_base", "_buf", "_fd", "_ops", "_pos", "path")

    def __init__(self, path: str, offset: int, ops: FileOps | None = None) -> None:
        self.path = path
        self._ops = ops if ops is not None else OS_FILES
        self._fd = self._ops.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._buf = b""
        self._base = offset  # file offset of _buf[0]
        self._pos = 0  # read position inside _buf

    @property
    def offset(self) -> int:
        """File offset of the next record."""
        return self._base + self._pos

    @property
    def buffer(self) -> bytes:
        """The buffer the offsets returned by :meth:`next` point into (replaced, not
        changed, by the next read: offsets into it stay valid until then)."""
        return self._buf

    def _fill(self, need: int) -> bool:
        """Read a new buffer starting at the read position (the position becomes 0): at
        least ``need`` bytes, or all the file has; False when that is fewer than ``need``."""
        start = self._base + self._pos
        want = max(CHUNK, need)
        pread = self._ops.pread
        data = pread(self._fd, want, start)
        while len(data) < need:  # a short read, or the end of the file
            more = pread(self._fd, want - len(data), start + len(data))
            if not more:
                break
            data += more
        self._buf = data
        self._base = start
        self._pos = 0
        return len(data) >= need

    def prepare(self) -> bool:
        """Buffer at least one whole record at the read position if the file has one.

        False at the end of the records (see :meth:`next`). After True, the bytes at the
        read position are a whole record by their length field, or all the file has (then
        :meth:`next` raises).
        Callers may then parse complete records straight from :attr:`buffer` (from
        :attr:`pos`) and :meth:`advance` past them.
        """
        avail = len(self._buf) - self._pos
        if avail < rec.PREFIX_SIZE and not self._fill(rec.PREFIX_SIZE):
            return len(self._buf) > self._pos
        length = int.from_bytes(self._buf[self._pos : self._pos + 4], "little")
        if length == 0 and self._at_zeros():
            return False
        if 0 < length <= rec.MAX_BODY and len(self._buf) - self._pos < rec.PREFIX_SIZE + length:
            self._fill(rec.PREFIX_SIZE + length)
        return True

    @property
    def pos(self) -> int:
        """The read position inside :attr:`buffer`."""
        return self._pos

    def advance(self, pos: int) -> None:
        """Move the read position to ``pos`` inside :attr:`buffer` (past parsed records)."""
        self._pos = pos

    def next(self) -> tuple[int, int] | None:
        """``(start, stop)`` of the next record inside :attr:`buffer`, or None at the end of
        the records: the end of the file, or eight zero bytes where a record would start
        (space written ahead of the records, format version 2; :meth:`check_end` says
        whether only zeros follow). Calling again later reads on from the same place, so a
        reader can follow a file that is still being written.

        Raises :class:`~tercel.journal.records.BadRecord` (with a *file* offset) when the
        bytes there are not a whole valid record. The returned offsets are valid until the
        next call.
        """
        if len(self._buf) - self._pos < rec.PREFIX_SIZE and not self._fill(rec.PREFIX_SIZE):
            if len(self._buf) == self._pos:
                return None
            raise rec.BadRecord(self.offset, "incomplete record header")
        length = int.from_bytes(self._buf[self._pos : self._pos + 4], "little")
        if length == 0 and self._at_zeros():
            return None
        if 0 < length <= rec.MAX_BODY:
            total = rec.PREFIX_SIZE + length
            if len(self._buf) - self._pos < total:
                self._fill(total)
        try:
            stop = rec.check_record(self._buf, self._pos)
        except rec.BadRecord as bad:
            raise rec.BadRecord(self._base + bad.offset, bad.reason) from None
        start = self._pos
        self._pos = stop
        return start, stop

    def _at_zeros(self) -> bool:
        """True when the read position holds eight zero bytes, the end of the records
        (called once a prefix of length 0 is buffered); the bytes buffered from there on
        are dropped, because the writer may replace those zeros with records before the next
        read."""
        if self._buf[self._pos + 4 : self._pos + 8] != b"\0\0\0\0":
            return False
        self.drop_buffer()
        return True

    def drop_buffer(self) -> None:
        """Forget what is buffered past the read position: the next read comes from the file
        (for bytes that may have changed since they were read)."""
        self._base += self._pos
        self._buf = b""
        self._pos = 0

    def check_end(self) -> None:
        """After :meth:`next` returned None: raise :class:`~tercel.journal.records.BadRecord`
        at the read position unless nothing but zero bytes follows it."""
        pos = self.offset
        while data := self._ops.pread(self._fd, CHUNK, pos):
            if data.count(0) != len(data):
                raise rec.BadRecord(self.offset, "zero bytes where a record starts, data after")
            pos += len(data)

    def file_offset(self, buffer_offset: int) -> int:
        """Translate an offset inside :attr:`buffer` to a file offset."""
        return self._base + buffer_offset

    def close(self) -> None:
        if self._fd >= 0:
            self._ops.close(self._fd)
            self._fd = -1


_PREFIX = rec.PREFIX.unpack_from
_HEAD = struct.Struct("<IIBQqq").unpack_from  # prefix and ADD fields: an ADD's first 33 bytes
_FIXED = {op: size for op, size in rec.FIXED_LENGTHS.items() if op != rec.OP_RESUME}
_ADD_ID = struct.Struct("<IIBQ").unpack_from  # prefix, opcode and item id of an ADD


def skip_adds(buf: bytes, pos: int) -> tuple[int, int, int, int]:
    """Walk the run of complete, valid ADD records of ``buf`` that starts at ``pos`` without
    decoding them; return ``(offset where it stopped, records, payload bytes, item id of the
    last one)`` (that id is 0 when there were none).

    The replay of items that stay on disk (read-behind): each record's checksum is checked as
    by :func:`records.scan`, but no object is made per record, only the one slice the checksum
    reads. Stops at the first record that is not an ADD, or is incomplete or bad, leaving it
    to the caller. The queue numbers items in the order it writes them, so within a file the
    last ADD of a run has the largest id.

    The fields are read a byte at a time: compiled, that is a few machine instructions, where
    a ``struct`` unpack (a tuple and its ints per record) cost ~5x more per 64-byte record,
    and a ``memoryview`` slice for the checksum ~1.7x more than copying the slice
    (``git show 1f1f505:docs/benchmarks.md``, "Where restart time goes").
    """
    end = len(buf)
    crc32_ = rec.crc32
    op_add, p, h, fields = rec.OP_ADD, rec.PREFIX_SIZE, rec.ADD_HEAD_SIZE, rec.ADD_FIELDS_SIZE
    count = size = 0
    last = -1
    while pos + h <= end:
        length = buf[pos] | buf[pos + 1] << 8 | buf[pos + 2] << 16 | buf[pos + 3] << 24
        stop = pos + p + length
        if buf[pos + p] != op_add or length < fields or stop > end:
            break
        crc = buf[pos + 4] | buf[pos + 5] << 8 | buf[pos + 6] << 16 | buf[pos + 7] << 24
        if crc32_(buf[pos + p : stop]) != crc:
            break
        count += 1
        size += length - fields
        last = pos
        pos = stop
    return pos, count, size, (_ADD_ID(buf, last)[3] if last >= 0 else 0)


def add_id(buf: bytes, pos: int) -> int:
    """The item id of the ADD record at ``pos`` (whole at least up to its id)."""
    return int(_ADD_ID(buf, pos)[3])


FOUND: Final = 1
MORE: Final = 0
LOST: Final = -1


def find_add(buf: bytes, pos: int, item_id: int) -> tuple[int, int]:
    """Walk the complete records of ``buf`` from ``pos`` (by their length fields; checksums
    are not checked) to the ADD of ``item_id``: ``(its offset, FOUND)``, ``(offset of the
    first incomplete record, MORE)`` at the end of the buffer, or ``(offset, LOST)`` at an ADD
    with a larger id, a RESUME or the end of the records. Where to look is a hint (a mark);
    whoever uses the answer checks the record."""
    end = len(buf)
    p, h, op_add, op_resume = rec.PREFIX_SIZE, rec.ADD_HEAD_SIZE, rec.OP_ADD, rec.OP_RESUME
    while pos + p < end:
        length = buf[pos] | buf[pos + 1] << 8 | buf[pos + 2] << 16 | buf[pos + 3] << 24
        op = buf[pos + p]
        if length == 0 or op == op_resume:
            return pos, LOST
        if op == op_add:
            if pos + h > end:
                break
            found = add_id(buf, pos)
            if found == item_id:
                return pos, FOUND
            if found > item_id:
                return pos, LOST
        if pos + p + length > end:
            break
        pos += p + length
    return pos, MORE


def read_adds(
    buf: bytes, pos: int, budget: int, out: list[tuple[int, int, int, bytes]]
) -> tuple[int, int]:
    """Append ``(item_id, add_time, expiry, data)`` of the ADD records of ``buf`` from ``pos``
    to ``out`` until their payloads reach ``budget`` bytes (at least one), skipping other
    ordinary records; return ``(offset where it stopped, payload bytes appended)``.

    Stops, leaving the record for a careful reader, at anything unusual: an incomplete or
    bad record, or a RESUME. Every record's checksum is checked, as by
    :func:`records.scan`; this is the same walk specialised for read-behind (no callback per
    item, one ``unpack`` per record, payloads sliced straight out of the ``bytes`` buffer).
    """
    end = len(buf)
    head, fixed, crc32_ = _HEAD, _FIXED, rec.crc32
    op_add, p, h, fields = rec.OP_ADD, rec.PREFIX_SIZE, rec.ADD_HEAD_SIZE, rec.ADD_FIELDS_SIZE
    got = 0
    while pos + h <= end:
        # Past a short record these fields are the next record's bytes: only used for an ADD.
        length, crc, op, item_id, add_time, expiry = head(buf, pos)
        stop = pos + p + length
        if op == op_add and length >= fields and stop <= end:
            data = buf[pos + h : stop]
            if crc32_(data, crc32_(buf[pos + p : pos + h])) != crc:
                return pos, got
            out.append((item_id, add_time, expiry, data))  # compiled: a direct list append
            pos = stop
            got += length - fields
            if got >= budget:
                return pos, got
            continue
        if stop > end or fixed.get(op) != length or crc32_(buf[pos + p : stop]) != crc:
            return pos, got
        pos = stop
    while pos + p <= end:  # the last bytes of the buffer: too few for an ADD
        length, crc = _PREFIX(buf, pos)
        stop = pos + p + length
        if stop > end or fixed.get(buf[pos + p]) != length or crc32_(buf[pos + p : stop]) != crc:
            break
        pos = stop
    return pos, got
