"""Lease files: the items of one keyed lease, in a file of their own (docs/journal_format.md
§18).

A keyed lease's items leave the queue's journal for ``<name>.key.<n>``: the file header, then
for each item its ADD record and a DELIVERED record (its delivery count), the forms a
snapshot writes, so ``tercel journal`` reads the file as any journal file. The queue keeps only
an index of where each item's records start (8 bytes an item, :class:`array.array` ``'q'``);
slices are read back with ``pread``. This module encodes, writes, indexes and decodes such
files; which items go where, and when a file may go, is the queue's business.

Pure functions on bytes, and three on files through a :class:`~tercel.journal.files.FileOps`.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Sequence
from typing import TypeAlias

from tercel.errors import JournalCorrupt
from tercel.journal import records as rec
from tercel.journal.append import write_all
from tercel.journal.files import FileOps
from tercel.journal.snapshot import ItemLike

Columns: TypeAlias = "tuple[array[int], array[int], array[int], array[int], bytearray, array[int]]"
"""``(item_ids, deliveries, add_ms, expiry_ms, data, offsets)`` of a run of items: ``q``,
``i``, ``q``, ``q`` arrays, the payloads one after another, and ``offsets`` (``q``, one more
than the items) where each payload starts in ``data`` and where the last ends."""

READ_CHUNK = 1 << 20
"""Bytes read per ``pread`` when a lease file is indexed."""


def lease_suffix(n: int) -> str:
    """The part of lease file ``n``'s name after the queue's name."""
    return f".key.{n}"


def encode_items(items: Sequence[ItemLike], base: int) -> tuple[bytes, list[int]]:
    """The records of ``items`` (ADD, then DELIVERED) to be written at offset ``base``, and
    where each item's records end (file offsets)."""
    parts: list[bytes] = []
    ends: list[int] = []
    at = base
    add_header = rec.add_header
    for item in items:
        prefix, fields = add_header(item.id, item.add_time, item.expiry, item.data)
        delivered = rec.xid_record(rec.OP_DELIVERED, min(item.deliveries, 0xFFFFFFFF))
        parts += (prefix, fields, item.data, delivered)
        at += rec.ADD_HEAD_SIZE + len(item.data) + len(delivered)
        ends.append(at)
    return b"".join(parts), ends


def write_items(
    ops: FileOps, path: str, at: int, items: Sequence[ItemLike], sync: bool
) -> tuple[list[int], bool]:
    """Write ``items`` into the lease file at ``path`` from offset ``at`` (0: a new file,
    created or truncated, its header first) and, with ``sync``, fdatasync it. Returns where
    each item's records end, and whether the file was created. Raises the OSError of a
    failed open, write or sync."""
    created = at == 0
    flags = os.O_WRONLY | os.O_CLOEXEC | (os.O_CREAT | os.O_TRUNC if created else 0)
    fd = ops.open(path, flags, 0o644)
    try:
        head = rec.FILE_HEADER if created else b""
        body, ends = encode_items(items, at + len(head))
        write_all(ops, fd, head + body, at)
        if sync:
            ops.fdatasync(fd)
    finally:
        ops.close(fd)
    return ends, created


def index_buffer(buf: rec.Bytes, base: int, count: int, out: array[int]) -> int:
    """Walk the records of ``buf`` (read from file offset ``base``) and append to ``out`` the
    file offset where each item's records end (each item is an ADD and its DELIVERED), until
    ``out`` has ``count`` + 1 entries or the complete records run out; returns the bytes of
    ``buf`` used (up to the last whole item). Raises
    :class:`~tercel.journal.records.BadRecord` (offset in ``buf``) at a bad record."""
    end = len(buf)
    pos = used = 0
    while pos + rec.PREFIX_SIZE <= end and len(out) <= count:
        length = int.from_bytes(buf[pos : pos + 4], "little")
        if length == 0 or pos + rec.PREFIX_SIZE + length > end:
            break  # zeros or a record cut by the end of the chunk: the next read has it
        stop = rec.check_record(buf, pos)
        op = rec.record_op(buf, pos)
        if op == rec.OP_DELIVERED and pos != used:  # (an ADD came first)
            out.append(base + stop)
            used = stop
        elif op != rec.OP_ADD or pos != used:
            raise rec.BadRecord(pos, f"{rec.OP_NAMES[op]} record out of place in a lease file")
        pos = stop
    return used


def index_file(ops: FileOps, path: str, count: int) -> array[int]:
    """Where the records of each of the first ``count`` items of the lease file at ``path``
    start, and where the last ends (``count`` + 1 offsets). Raises :class:`JournalCorrupt`
    when the file holds fewer items or a bad record."""
    out = array("q", [rec.HEADER_SIZE])
    fd = ops.open(path, os.O_RDONLY | os.O_CLOEXEC)
    base = rec.HEADER_SIZE
    try:
        if rec.header_version(ops.pread(fd, rec.HEADER_SIZE, 0)) is None:
            raise JournalCorrupt("not a lease file (bad file header)", path, 0)
        size = READ_CHUNK
        while len(out) <= count:
            chunk = ops.pread(fd, size, base)
            try:
                used = index_buffer(chunk, base, count, out)
            except rec.BadRecord as bad:
                raise JournalCorrupt(bad.reason, path, base + bad.offset) from None
            if not used:
                if len(chunk) < size:
                    break  # the end of the file
                size *= 2  # one item larger than the chunk
            base += used
    finally:
        ops.close(fd)
    if len(out) <= count:
        raise JournalCorrupt(f"lease file holds {len(out) - 1} of {count} items", path, base)
    return out


def decode_columns(buf: rec.Bytes, pos: int, stop: int) -> Columns:
    """The items whose records lie between ``pos`` and ``stop`` of ``buf`` as columns."""
    ids: array[int] = array("q")
    deliveries: array[int] = array("i")
    add_ms: array[int] = array("q")
    expiry_ms: array[int] = array("q")
    data = bytearray()
    offsets: array[int] = array("q", [0])
    while pos < stop:
        end = rec.check_record(buf, pos)
        op = rec.record_op(buf, pos)
        if op == rec.OP_ADD:
            item_id, add_time, expiry, payload = rec.decode_add(buf, pos, end)
            ids.append(item_id)
            deliveries.append(0)
            add_ms.append(add_time)
            expiry_ms.append(expiry)
            data += payload
            offsets.append(len(data))
        elif op == rec.OP_DELIVERED and ids:
            deliveries[-1] = int.from_bytes(buf[pos + rec.PREFIX_SIZE + 1 : end], "little")
        else:
            raise rec.BadRecord(pos, f"{rec.OP_NAMES[op]} record in a lease file")
        pos = end
    return ids, deliveries, add_ms, expiry_ms, data, offsets


def read_columns(ops: FileOps, path: str, start: int, stop: int) -> Columns:
    """The items whose records lie between file offsets ``start`` and ``stop`` of the lease
    file at ``path`` (one ``pread``). Raises :class:`JournalCorrupt` when they cannot be read."""
    fd = ops.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        buf = ops.pread(fd, stop - start, start)
    finally:
        ops.close(fd)
    if len(buf) < stop - start:
        raise JournalCorrupt("lease file ends early", path, start + len(buf))
    try:
        return decode_columns(buf, 0, len(buf))
    except rec.BadRecord as bad:
        raise JournalCorrupt(bad.reason, path, start + bad.offset) from None
