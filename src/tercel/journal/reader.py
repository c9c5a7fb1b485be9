"""Reading records forward from a byte offset, a chunk at a time.

Replay and read-behind both read this way: ``os.pread`` of 1 MiB chunks into one reused
``bytearray``, records checked and parsed in place. Nothing is memory-mapped, so a 2 GB
journal adds nothing to the process's resident set, and no single call reads more than one
chunk (or one record, if a record is larger).
"""

from __future__ import annotations

import os

from tercel.journal import records as rec

CHUNK = 1 << 20


class ChunkReader:
    """Checked records of one file, from ``offset`` to the end the OS knows of."""

    __slots__ = ("_base", "_buf", "_fd", "_pos", "path")

    def __init__(self, path: str, offset: int) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._buf = bytearray()
        self._base = offset  # file offset of _buf[0]
        self._pos = 0  # read position inside _buf

    @property
    def offset(self) -> int:
        """File offset of the next record."""
        return self._base + self._pos

    @property
    def buffer(self) -> bytearray:
        """The buffer the offsets returned by :meth:`next` point into."""
        return self._buf

    def _fill(self, need: int) -> bool:
        """Make ``need`` bytes available at the read position; False at end of file."""
        if self._pos:
            del self._buf[: self._pos]
            self._base += self._pos
            self._pos = 0
        while len(self._buf) < need:
            want = max(CHUNK, need - len(self._buf))
            data = os.pread(self._fd, want, self._base + len(self._buf))
            if not data:
                return False
            self._buf += data
        return True

    def prepare(self) -> bool:
        """Buffer at least one whole record at the read position if the file has one.

        False at a clean end of file. After True, the bytes at the read position are a
        whole record by their length field, or all the file has (then :meth:`next` raises).
        Callers may then parse complete records straight from :attr:`buffer` (from
        :attr:`pos`) and :meth:`advance` past them.
        """
        avail = len(self._buf) - self._pos
        if avail < rec.PREFIX_SIZE and not self._fill(rec.PREFIX_SIZE):
            return len(self._buf) > self._pos
        length = int.from_bytes(self._buf[self._pos : self._pos + 4], "little")
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
        """``(start, stop)`` of the next record inside :attr:`buffer`, or None at a clean end.

        Raises :class:`~tercel.journal.records.BadRecord` (with a *file* offset) when the
        bytes there are not a whole valid record. The returned offsets are valid until the
        next call.
        """
        if len(self._buf) - self._pos < rec.PREFIX_SIZE and not self._fill(rec.PREFIX_SIZE):
            if len(self._buf) == self._pos:
                return None
            raise rec.BadRecord(self.offset, "incomplete record header")
        length = int.from_bytes(self._buf[self._pos : self._pos + 4], "little")
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

    def file_offset(self, buffer_offset: int) -> int:
        """Translate an offset inside :attr:`buffer` to a file offset."""
        return self._base + buffer_offset

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
