"""``tercel.journal.salvage.plan`` on hand-made bytes: where a cut starts and ends."""

from __future__ import annotations

from tercel.journal import records as rec
from tercel.journal.salvage import plan


def add(item_id: int, data: bytes) -> bytes:
    buf = bytearray()
    rec.encode_add(buf, item_id, 1, 0, data)
    return bytes(buf)


def test_a_record_that_ends_in_zero_bytes_is_kept_whole() -> None:
    """An OPEN of xid 256 ends in three zero bytes: they are its own, not space written ahead."""
    tail = rec.xid_record(rec.OP_OPEN, 256)
    assert tail.endswith(b"\0\0")
    buf = rec.FILE_HEADER + add(1, b"a") + b"\xee" * 5 + tail + b"\0" * 64
    got = plan("q", 1, buf)
    first = rec.HEADER_SIZE + len(add(1, b"a"))
    assert got.keep == [(8, first), (first + 5, first + 5 + len(tail))]
    assert [(c.start, c.stop) for c in got.cuts] == [(first, first + 5)]
    assert got.zeros == 64


def test_one_record_lookalike_inside_damage_is_not_a_resync_point() -> None:
    """Inside a damaged span, a single valid record followed by more damage (a journal stored
    as an item, say) is cut with the damage; the cut ends where records run on."""
    fake = rec.REMOVE_RECORD
    damage = b"\xee" * 7 + fake + b"\xee" * 7
    good = add(2, b"bb") + add(3, b"ccc")
    buf = rec.FILE_HEADER + add(1, b"a") + damage + good
    got = plan("q", 1, buf)
    start = rec.HEADER_SIZE + len(add(1, b"a"))
    assert [(c.start, c.stop) for c in got.cuts] == [(start, start + len(damage))]
    assert len(got.keep) == 3


def test_new_offsets_skip_the_cuts() -> None:
    one, two = add(1, b"a"), add(2, b"bb")
    buf = rec.FILE_HEADER + one + b"\xee" * 10 + two
    got = plan("q", 1, buf)
    after = rec.HEADER_SIZE + len(one)
    assert got.new_offset(rec.HEADER_SIZE) == rec.HEADER_SIZE
    assert got.new_offset(after + 10) == after  # the record after the cut moves back
    assert got.new_offset(after + 3) == after  # a position inside the cut: the next record
    assert got.new_offset(len(buf)) == len(buf) - 10  # the end of the file
