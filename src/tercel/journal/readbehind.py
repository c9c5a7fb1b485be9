"""The read-behind cursor: reads back the items a queue left on disk (Kestrel's read-behind),
one :class:`AddReader` per queue that pages, from the journal's files and what it still
buffers. Knows the journal's files (:class:`~tercel.journal.base.JournalBase`), never writes.
"""

from __future__ import annotations

from tercel.errors import JournalCorrupt, JournalError, JournalOutOfDescriptors
from tercel.journal import records as rec
from tercel.journal.base import JournalBase
from tercel.journal.files import OUT_OF_DESCRIPTORS
from tercel.journal.reader import ChunkReader, read_adds


class AddReader:
    """Reads the items a queue left on disk: every ADD record from a position on, across
    files, skipping other records and following RESUME jumps. Reads what is buffered in the
    journal too (it asks the journal to write it out first).

    Its descriptor is in the data dir's pool like the journal's: parked when evicted (the
    buffer is dropped), reopened at the same position by path on the next read."""

    __slots__ = ("_busy", "_journal", "_parked_at", "_reader", "_seq")

    def __init__(self, journal: JournalBase, position: rec.Position) -> None:
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
            if op == rec.OP_ADD_KEYED:  # its key was replayed: the item is what is read back
                return rec.decode_add_keyed(buf, start, stop)[:4]
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
