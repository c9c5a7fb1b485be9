"""A hole inside the unsynced tail of the newest file, as a power loss leaves it.

The kernel writes dirty pages back in any order: after a power loss the newest file may hold
a run of zeros (a page never written back) followed by pages that were. Every byte after the
last successful fsync is in that tail, and an fsync covers all of a file's dirty pages, so
nothing before such a hole is missing and nothing after it was ever fsynced. Start-up does not
refuse it as damage (a bad record followed by valid data); it cuts the tail at the hole, as
a torn tail, and keeps the cut bytes in ``<name>.cut-<offset>``. The same holds when the lost
page is the one holding the end of the synced bytes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from recorder import Recorder

from tercel.errors import JournalCorrupt
from tercel.journal import FileJournal

PAGE = 4096


def write_then_lose_a_page(tmp_path: Path, hole_at: int | None) -> tuple[int, int]:
    """10 records fsynced, then 300 written but not fsynced; then the page at ``hole_at``
    (default: the second page after the synced size) reads as zeros. Returns (synced size,
    hole offset)."""
    j = FileJournal(str(tmp_path), "q", on_dirty=lambda _: None)
    j.replay(Recorder())
    for i in range(10):
        j.add(i + 1, 1, 0, b"synced %03d" % i + b"." * 90)
    j.write_out()
    j.sync()
    synced = j.size
    for i in range(300):
        j.add(i + 11, 1, 0, b"unsynced %03d" % i + b"." * 90)
    j.write_out()
    j.park()  # no close: a close would fsync
    hole = hole_at if hole_at is not None else (synced // PAGE + 2) * PAGE
    with open(tmp_path / "q", "r+b") as fh:
        fh.seek(hole)
        fh.write(bytes(PAGE))
    return synced, hole


def replayed(tmp_path: Path) -> tuple[list[bytes], FileJournal, object]:
    sink = Recorder()
    j = FileJournal(str(tmp_path), "q")
    report = j.replay(sink)
    return [e[-1] for e in sink.events if e[0] == "add"], j, report  # type: ignore[misc]


def test_a_hole_of_zeros_in_the_unsynced_tail_is_cut_and_the_cut_kept(tmp_path: Path) -> None:
    synced, hole = write_then_lose_a_page(tmp_path, None)
    size = os.path.getsize(tmp_path / "q")
    items, j, report = replayed(tmp_path)
    assert [d[:10] for d in items[:10]] == [b"synced %03d" % i for i in range(10)]
    assert all(d.startswith(b"unsynced") for d in items[10:])
    cut = report.truncations  # type: ignore[attr-defined]
    assert len(cut) == 1 and "hole" in cut[0].reason
    assert synced <= cut[0].offset <= hole  # nothing before the hole is lost
    kept = tmp_path / f"q.cut-{cut[0].offset}"  # the cut bytes, for salvage
    assert kept.stat().st_size == size - cut[0].offset
    assert kept.read_bytes().count(b"unsynced") > 0
    j.add(999, 1, 0, b"after")  # the journal goes on from the cut
    j.close()
    items2, j2, _ = replayed(tmp_path)
    assert items2 == [*items, b"after"]
    j2.close()


def lose_the_page_of_the_synced_end(tmp_path: Path) -> int:
    """10 records fsynced, 300 more written, not fsynced; then the page holding the end of
    the synced bytes reads as it was at the fsync (records, zeros to its end) while later
    pages were written. Returns the synced size."""
    synced, _ = write_then_lose_a_page(tmp_path, None)
    page = synced // PAGE * PAGE
    assert synced % PAGE  # the page holds synced bytes and unsynced ones
    with open(tmp_path / "q", "r+b") as fh:
        fh.seek(synced)
        fh.write(bytes(page + PAGE - synced))
    return synced


def test_the_lost_page_of_the_synced_end_is_cut_and_the_cut_kept(tmp_path: Path) -> None:
    """A shape start-up cuts rather than refuses (docs/reliability.md §6): synced records,
    zeros to the end of their page, data after. The data after was written after the last
    fsync (an fsync writes every dirty page, this one included), so the cut loses nothing
    synced; the cut bytes are kept, and the cut is logged and counted as a torn tail."""
    synced = lose_the_page_of_the_synced_end(tmp_path)
    size = os.path.getsize(tmp_path / "q")
    items, j, report = replayed(tmp_path)
    assert [d[:10] for d in items] == [b"synced %03d" % i for i in range(10)]
    cut = report.truncations  # type: ignore[attr-defined]
    assert [t.offset for t in cut] == [synced]
    assert "zeros to the end of the page" in cut[0].reason
    assert f"kept in {tmp_path / f'q.cut-{synced}'}" in cut[0].reason
    kept = (tmp_path / f"q.cut-{synced}").read_bytes()
    assert len(kept) == size - synced and kept.count(b"unsynced") > 200
    j.add(999, 1, 0, b"after")
    j.close()
    items2, j2, _ = replayed(tmp_path)
    assert items2 == [*items, b"after"]
    j2.close()


def test_a_second_cut_at_the_same_offset_keeps_the_first_cut(tmp_path: Path) -> None:
    """Kept bytes are never overwritten: a later cut at the same offset gets its own file."""
    synced = lose_the_page_of_the_synced_end(tmp_path)
    first = tmp_path / f"q.cut-{synced}"
    first.write_bytes(b"an operator's evidence")
    _, j, report = replayed(tmp_path)
    j.close()
    assert first.read_bytes() == b"an operator's evidence"
    again = tmp_path / f"q.cut-{synced}.1"
    assert again.read_bytes().count(b"unsynced") > 200
    assert str(again) in report.truncations[0].reason  # type: ignore[attr-defined]


def test_a_zeroed_sector_inside_synced_data_is_still_damage(tmp_path: Path) -> None:
    """Zeros inside synced data that do not reach the end of a page from where a record
    starts are not a power-loss shape: start-up stops (exit 3 in the server), nothing cut."""
    j = FileJournal(str(tmp_path), "q", on_dirty=lambda _: None)
    j.replay(Recorder())
    for i in range(200):
        j.add(i + 1, 1, 0, b"synced %03d" % i + b"." * 90)
    j.close()
    before = (tmp_path / "q").read_bytes()
    for start in (512, 2 * PAGE - 512):  # inside a page; the last sector of a page
        damaged = bytearray(before)
        damaged[start : start + 512] = bytes(512)
        (tmp_path / "q").write_bytes(damaged)
        with pytest.raises(JournalCorrupt):
            replayed(tmp_path)
        assert (tmp_path / "q").read_bytes() == damaged
        assert not list(tmp_path.glob("q.cut-*"))


def test_damage_that_is_not_a_hole_still_stops_start_up(tmp_path: Path) -> None:
    _, hole = write_then_lose_a_page(tmp_path, None)
    with open(tmp_path / "q", "r+b") as fh:  # the lost page holds garbage, not zeros
        fh.seek(hole)
        fh.write(b"\x5a" * PAGE)
    with pytest.raises(JournalCorrupt):
        replayed(tmp_path)


def test_a_hole_where_the_header_was_is_cut_not_refused(tmp_path: Path) -> None:
    """The page holding the file header not written back, later pages written: zeros from
    offset 0, records after. Nothing in that file was fsynced (an fsync writes every dirty
    page), so the whole file is cut (kept as ``q.cut-0``); start-up used to refuse ("not a
    tercel journal (bad file header)"). Found by ``tests/integration/test_power_cut.py``."""
    j = FileJournal(str(tmp_path), "q", on_dirty=lambda _: None)
    j.replay(Recorder())
    for i in range(300):
        j.add(i + 1, 1, 0, b"unsynced %03d" % i + b"." * 90)
    j.write_out()
    j.park()  # no close: a close would fsync
    data = (tmp_path / "q").read_bytes()
    (tmp_path / "q").write_bytes(bytes(PAGE) + data[PAGE:])
    items, j, report = replayed(tmp_path)
    assert items == []
    cut = report.truncations  # type: ignore[attr-defined]
    assert len(cut) == 1 and cut[0].offset == 0 and "file header" in cut[0].reason
    assert (tmp_path / "q.cut-0").read_bytes()[PAGE:] == data[PAGE:]
    j.add(1, 1, 0, b"after")  # the journal starts the file again
    j.close()
    items2, j2, _ = replayed(tmp_path)
    assert items2 == [b"after"]
    j2.close()


def test_a_zero_header_in_an_older_file_is_still_damage(tmp_path: Path) -> None:
    """Only the newest file can hold an unsynced tail: an older one was fsynced whole before
    its rotation, so zeros where its header was are damage, and start-up stops."""
    j = FileJournal(str(tmp_path), "q", on_dirty=lambda _: None)
    j.replay(Recorder())
    j.add(1, 1, 0, b"x" * 5000)
    j.rotate()
    j.add(2, 1, 0, b"y")
    j.close()
    older = tmp_path / "q.1"
    older.write_bytes(bytes(PAGE) + older.read_bytes()[PAGE:])
    with pytest.raises(JournalCorrupt, match="bad file header"):
        replayed(tmp_path)
