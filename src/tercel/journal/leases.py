"""Lease files: the items of one keyed lease, in a file of their own (docs/journal_format.md
§18).

A keyed lease's items leave the queue's journal for ``<name>.key.<n>``: the file header, then
for each item its ADD record and a DELIVERED record (its delivery count), the forms a
snapshot writes (``records.iter_records`` reads the file as any journal file). The queue keeps only
an index of where each item's records start (8 bytes an item, :class:`array.array` ``'q'``);
slices are read back with ``pread``. This module encodes, writes, indexes and decodes such
files; which items go where, and when a file may go, is the queue's business.

Pure functions on bytes, and three on files through a :class:`~tercel.journal.files.FileOps`.
"""

from __future__ import annotations

import os
import struct
from array import array
from collections.abc import Sequence
from typing import Final, TypeAlias

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


_HEAD = struct.Struct("<IIBQqq")  # an ADD's prefix and fields: its first 33 bytes
_DELIVERED = struct.Struct("<IIBI")  # a DELIVERED record, whole: 13 bytes
_DELIVERED_SIZE: Final = _DELIVERED.size
_ITEM_MIN: Final = rec.ADD_HEAD_SIZE + _DELIVERED_SIZE
"""The fewest bytes of one item's records (an empty payload)."""


def index_buffer(buf: rec.Bytes, base: int, count: int, out: array[int]) -> int:
    """Walk the items of ``buf`` (read from file offset ``base``; each an ADD record and its
    DELIVERED) and append to ``out`` the file offset where each one's records end, until
    ``out`` has ``count`` + 1 entries or the whole items run out; returns the bytes of ``buf``
    used. Checks the framing only (lengths and opcodes), not the checksums: a slice read
    checks those (:func:`decode_columns`). Raises
    :class:`~tercel.journal.records.BadRecord` (offset in ``buf``) at a record out of place."""
    end = len(buf)
    pos = 0
    prefix = rec.PREFIX_SIZE
    while pos + _ITEM_MIN <= end and len(out) <= count:
        length = buf[pos] | buf[pos + 1] << 8 | buf[pos + 2] << 16 | buf[pos + 3] << 24
        if buf[pos + prefix] != rec.OP_ADD or not rec.ADD_FIELDS_SIZE <= length <= rec.MAX_BODY:
            raise rec.BadRecord(pos, "a lease file's item does not start with an ADD record")
        delivered = pos + prefix + length
        stop = delivered + _DELIVERED_SIZE
        if stop > end:
            break  # cut by the end of the chunk: the next read has it
        if buf[delivered] != 5 or buf[delivered + prefix] != rec.OP_DELIVERED:
            raise rec.BadRecord(delivered, "a lease file's ADD record has no DELIVERED after it")
        out.append(base + stop)
        pos = stop
    return pos


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
    """The items whose records lie between ``pos`` and ``stop`` of ``buf`` as columns, each
    record's checksum checked. Raises :class:`~tercel.journal.records.BadRecord`."""
    ids: array[int] = array("q")
    deliveries: array[int] = array("i")
    add_ms: array[int] = array("q")
    expiry_ms: array[int] = array("q")
    data = bytearray()
    offsets: array[int] = array("q", [0])
    head = _HEAD.unpack_from
    tail = _DELIVERED.unpack_from
    crc32 = rec.crc32
    prefix, fields = rec.PREFIX_SIZE, rec.ADD_HEAD_SIZE
    view = memoryview(buf)
    while pos < stop:
        if pos + _ITEM_MIN > stop:
            raise rec.BadRecord(pos, "a lease file's item runs past the end")
        length, crc, op, item_id, add_time, expiry = head(buf, pos)
        delivered = pos + prefix + length
        if op != rec.OP_ADD or length < rec.ADD_FIELDS_SIZE or delivered + _DELIVERED_SIZE > stop:
            raise rec.BadRecord(pos, "a lease file's item does not start with an ADD record")
        if crc32(view[pos + prefix : delivered]) != crc:
            raise rec.BadRecord(pos, "checksum mismatch")
        dlen, dcrc, dop, count = tail(buf, delivered)
        if (
            dlen != 5
            or dop != rec.OP_DELIVERED
            or crc32(view[delivered + prefix : delivered + 13]) != dcrc
        ):
            raise rec.BadRecord(delivered, "a lease file's ADD record has no valid DELIVERED")
        ids.append(item_id)
        deliveries.append(count)
        add_ms.append(add_time)
        expiry_ms.append(expiry)
        data += view[pos + fields : delivered]
        offsets.append(len(data))
        pos = delivered + _DELIVERED_SIZE
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
