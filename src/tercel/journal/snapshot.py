"""The snapshot writer: one file holding a queue's whole state at a rotation point (the
packer, kept out of the journal as Kestrel keeps ``JournalPacker`` out of ``Journal``).

A snapshot file starts with a SNAPSHOT record (the counters), then the dedup keys held
(DEDUP_KEY records), then the open reads (each an ADD,
its deliveries and its OPEN), then the items in memory, head first, then, for a queue that
leaves items on disk, a RESUME record saying where they are (docs/journal_format.md §11, §13).
:mod:`tercel.journal.rotation` writes it on a worker thread under a temporary name and
switches it into place.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Protocol

from tercel.journal import records as rec
from tercel.journal.append import write_all
from tercel.journal.files import FileOps, default_ops

__all__ = ["ItemLike", "KeyState", "write_snapshot"]

KeyState = tuple[str, int, int, int, int, int, int, int]
"""A keyed lease as a snapshot writes it: ``(key, lease file n, count, size, max_items,
created_at, expires_at, how)``, ``how`` 0 for a live lease (KEY_LIVE), else a key that ended
that way and is remembered (KEY_END; the other fields 0)."""


class ItemLike(Protocol):
    """What a snapshot needs of an item."""

    id: int
    add_time: int
    expiry: int
    data: bytes
    deliveries: int


def write_snapshot(
    path: str,
    *,
    ops: FileOps | None = None,
    next_id: int,
    xid: int,
    open_items: Sequence[tuple[int, ItemLike]],
    items: Iterable[ItemLike],
    cursor: rec.Position | None,
    taken: rec.Position,
    dedup_keys: Sequence[tuple[str, int, int]] = (),
    keyed: Sequence[KeyState] = (),
) -> None:
    """Write the snapshot of a queue to ``path`` (created or truncated) and fsync it:
    counters ``next_id`` and ``xid``, the ``open_items`` as ``(xid, item)``, the ``items``
    head first, and, when ``cursor`` is given, a RESUME record saying that the ADD records
    from ``cursor`` to ``taken`` are items still on disk; the ``keyed`` leases and remembered
    keys right after the SNAPSHOT record, in the order given, then the ``dedup_keys``
    ``(key, item_id, put time)`` as DEDUP_KEY records. Raises the OSError of a failed write or
    fsync (the caller removes the file)."""
    if ops is None:
        ops = default_ops()
    fd = ops.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        buf = bytearray(rec.FILE_HEADER)
        rec.encode_snapshot(buf, next_id, xid)
        for key, n, count, size, max_items, created_at, expires_at, how in keyed:
            if how:
                rec.encode_key_end(buf, key, how)
            else:
                rec.encode_key_take(
                    buf,
                    key,
                    n=n,
                    count=count,
                    size=size,
                    max_items=max_items,
                    created_at=created_at,
                    expires_at=expires_at,
                    live=True,
                )
        for key, key_id, put_time in dedup_keys:
            rec.encode_dedup_key(buf, key.encode("ascii"), key_id, put_time)
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
