"""The checkpoint file, ``<name>.checkpoint``: pure encode and decode, no files.

A checkpoint says "after the records before position ``end``, the queue was the ADD records
read from position ``head`` on (``items`` of them, ``size`` payload bytes), with these
counters", so replay can start at ``end`` instead of at the first file. It is a hint: replay
uses it only when the files still hold what it describes (see
:meth:`tercel.journal.FileJournal.replay`), and reads every file otherwise. The byte layout is
in docs/journal_format.md ("The checkpoint file"); all integers are little-endian.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from tercel.journal import records as rec

MAGIC: Final = b"TRCP"
VERSION: Final = 1
SUFFIX: Final = ".checkpoint"
"""Appended to the queue's name. Queue names hold no ``.``, and only digits after the dot make
a journal file, so the checkpoint is never taken for a queue or a journal file."""

_HEAD = struct.Struct("<4sB3xQQIQQQQQQQqII")
_MARK = struct.Struct("<QQQ")
_CRC = struct.Struct("<I")

Mark = tuple[int, int, int]
"""``(item id, file seq, offset)`` of an ADD record: where to start looking for an item."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The fields of a checkpoint file (docs/journal_format.md)."""

    end: rec.Position
    """Replay goes on from here; every record before it is summed up by the rest."""
    tail_crc: int
    """crc32 of the (up to) 4 KiB of the file just before ``end``: the file is still the same."""
    head: rec.Position
    """The ADD record of the first item (``end`` when there is none)."""
    head_id: int
    items: int
    size: int
    next_id: int
    total: int
    """Items ever added (a statistic)."""
    removed_add_time: int
    """The add time of the last item removed (the queue's age statistic)."""
    xid: int
    marks: tuple[Mark, ...]
    """Where ADDs of the items start, at least one per MiB (to find the head next time)."""


TAIL: Final = 4096
"""Bytes before ``end`` whose crc32 the checkpoint keeps."""


def encode(cp: Checkpoint) -> bytes:
    """The bytes of the checkpoint file of ``cp``."""
    body = bytearray(
        _HEAD.pack(
            MAGIC,
            VERSION,
            cp.end[0],
            cp.end[1],
            cp.tail_crc,
            cp.head[0],
            cp.head[1],
            cp.head_id,
            cp.items,
            cp.size,
            cp.next_id,
            cp.total,
            cp.removed_add_time,
            cp.xid,
            len(cp.marks),
        )
    )
    for mark in cp.marks:
        body += _MARK.pack(*mark)
    body += _CRC.pack(rec.crc32(body))
    return bytes(body)


def decode(data: bytes) -> Checkpoint | None:
    """The checkpoint in ``data``; None when it is not a whole, intact checkpoint file of this
    version (a torn or damaged checkpoint is ignored, never trusted)."""
    if len(data) < _HEAD.size + _CRC.size or data[:4] != MAGIC:
        return None
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    if rec.crc32(data[: len(data) - _CRC.size]) != crc:
        return None
    (_, version, es, eo, tail, hs, ho, hid, items, size, nid, total, age, xid, n) = (
        _HEAD.unpack_from(data)
    )
    if version != VERSION or len(data) != _HEAD.size + n * _MARK.size + _CRC.size:
        return None
    marks = tuple(
        (int(m[0]), int(m[1]), int(m[2]))
        for m in (_MARK.unpack_from(data, _HEAD.size + i * _MARK.size) for i in range(n))
    )
    return Checkpoint((es, eo), tail, (hs, ho), hid, items, size, nid, total, age, xid, marks)
