"""The snapshot file compaction writes is exactly the records encode_* would write."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from tercel.journal import records as rec
from tercel.journal.snapshot import write_snapshot


@dataclass
class Item:
    id: int
    add_time: int
    expiry: int
    data: bytes
    deliveries: int


def reference(
    *,
    next_id: int,
    xid: int,
    open_items: list[tuple[int, Item]],
    items: list[Item],
    cursor: rec.Position | None,
    taken: rec.Position,
) -> bytes:
    buf = bytearray(rec.FILE_HEADER)
    rec.encode_snapshot(buf, next_id, xid)
    for open_xid, item in open_items:
        rec.encode_add(buf, item.id, item.add_time, item.expiry, item.data)
        if item.deliveries > 1:
            rec.encode_xid(buf, rec.OP_DELIVERED, item.deliveries - 1)
        rec.encode_xid(buf, rec.OP_OPEN, open_xid)
    for item in items:
        rec.encode_add(buf, item.id, item.add_time, item.expiry, item.data)
        if item.deliveries:
            rec.encode_xid(buf, rec.OP_DELIVERED, item.deliveries)
    if cursor is not None:
        rec.encode_resume(buf, cursor, taken)
    return bytes(buf)


@pytest.mark.parametrize("cursor", [None, (3, 1234)])
@pytest.mark.parametrize("count", [0, 1, 3000])
def test_snapshot_bytes(tmp_path: Path, cursor: rec.Position | None, count: int) -> None:
    rng = random.Random(count)
    items = [
        Item(
            i,
            1_700_000_000_000 + i,
            rng.choice([0, 1_800_000_000_000]),
            rng.randbytes(rng.choice([0, 1, 1024, 5000])),
            rng.choice([0, 0, 0, 1, 4]),
        )
        for i in range(10, 10 + count)
    ]
    open_items = [(7, Item(3, 5, 0, b"open", 1)), (9, Item(4, 6, 0, b"again", 3))]
    path = tmp_path / "snap"
    write_snapshot(
        str(path),
        next_id=10 + count,
        xid=9,
        open_items=open_items,
        items=items,
        cursor=cursor,
        taken=(4, 8),
    )
    expected = reference(
        next_id=10 + count, xid=9, open_items=open_items, items=items, cursor=cursor, taken=(4, 8)
    )
    assert path.read_bytes() == expected
