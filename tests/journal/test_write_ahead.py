"""Zeros written ahead of the records (format version 2, ``journal.PREALLOCATE``).

A journal that has been fsynced keeps zeros written past its last record, so an fdatasync
does not have to commit a new file size. These tests pin what that means on disk: where the
zeros are, that closing and rotating cut them, that a crash image (the file as it is while
the journal is open) replays exactly, and that the torn-tail rules still tell a torn record
from damage when zeros follow it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from recorder import Recorder, file_size_limit

from tercel import journal_tool
from tercel.config import QueueConfig
from tercel.embedded import PersistentQueue
from tercel.errors import JournalCorrupt
from tercel.journal import FileJournal, append
from tercel.journal import journal as jmod
from tercel.journal import records as rec

V1_HEADER = rec.file_header(1)


def open_journal(path: Path, name: str = "q") -> FileJournal:
    j = FileJournal(str(path), name)  # no owner: every append is written through
    j.replay(Recorder())
    return j


def replay(path: Path, name: str = "q") -> tuple[list[object], jmod.ReplayReport]:
    j = FileJournal(str(path), name)
    sink = Recorder()
    report = j.replay(sink)
    j.close()
    return sink.events, report


def payloads(events: list[object]) -> list[bytes]:
    return [e[4] for e in events if isinstance(e, tuple) and e[0] == "add"]


def crash_image(src: Path, dst_dir: Path) -> Path:
    """The file as a crash would leave it: copied while the journal is still open."""
    dst_dir.mkdir()
    shutil.copy(src, dst_dir / "q")
    return dst_dir / "q"


def test_a_synced_journal_writes_zeros_ahead_and_close_cuts_them(tmp_path: Path) -> None:
    j = open_journal(tmp_path)
    j.add(1, 1, 0, b"a")
    assert (tmp_path / "q").stat().st_size == j.current_size  # not synced yet: nothing ahead
    j.sync()
    j.add(2, 2, 0, b"b")
    data = (tmp_path / "q").read_bytes()
    assert len(data) == j.current_size + append.PREALLOCATE_FIRST
    assert data[j.current_size :] == bytes(append.PREALLOCATE_FIRST)
    assert data[:8] == rec.FILE_HEADER and rec.VERSION >= 2
    steps = []  # each time the records reach the zeros: how many more are written
    for i in range(3, 40):
        before = (tmp_path / "q").stat().st_size
        j.add(i, i, 0, b"x" * 100_000)
        after = (tmp_path / "q").stat().st_size
        if after > before:
            steps.append(after - j.current_size)
    first = append.PREALLOCATE_FIRST
    assert steps == [2 * first, 4 * first, 8 * first] + [append.PREALLOCATE] * (len(steps) - 3)
    size = j.current_size
    j.close()
    assert (tmp_path / "q").stat().st_size == size
    events, report = replay(tmp_path)
    assert payloads(events)[:2] == [b"a", b"b"] and len(payloads(events)) == 39
    assert report.truncations == [] and report.bytes == size


def test_a_crash_image_replays_exactly_and_appends_follow_the_last_record(
    tmp_path: Path,
) -> None:
    (tmp_path / "live").mkdir()
    j = open_journal(tmp_path / "live")
    for i in range(5):
        j.add(i, i, 0, b"item%d" % i)
        j.sync()
    records_end = j.current_size
    image = crash_image(tmp_path / "live" / "q", tmp_path / "crashed")
    j.close()
    assert image.stat().st_size > records_end
    events, report = replay(image.parent)
    assert payloads(events) == [b"item%d" % i for i in range(5)]
    assert report.truncations == []  # zeros written ahead are no torn tail
    assert image.stat().st_size == records_end
    again = open_journal(image.parent)
    again.add(9, 9, 0, b"after")
    again.close()
    assert payloads(replay(image.parent)[0])[-2:] == [b"item4", b"after"]


def test_rotation_cuts_the_zeros_of_the_rotated_file(tmp_path: Path) -> None:
    j = open_journal(tmp_path)
    j.add(1, 1, 0, b"a")
    j.sync()
    j.add(2, 2, 0, b"b")
    size = j.current_size
    assert j.rotate()
    assert (tmp_path / "q.1").stat().st_size == size
    j.add(3, 3, 0, b"c")
    j.sync()
    j.add(4, 4, 0, b"d")
    assert (tmp_path / "q").stat().st_size > j.current_size  # the new file writes ahead
    j.close()
    assert payloads(replay(tmp_path)[0]) == [b"a", b"b", b"c", b"d"]


FIXTURE = Path(__file__).with_name("fixtures") / "v1-basic.jrnl"
"""Written by version 1 (commit 8350770): ADD one..four, REMOVE, OPEN 1, CONFIRM 1, OPEN 2."""


def test_a_version_1_file_replays_and_is_rotated_away_unchanged(tmp_path: Path) -> None:
    old = FIXTURE.read_bytes()
    assert old[:8] == V1_HEADER
    shutil.copy(FIXTURE, tmp_path / "q")
    queue = PersistentQueue(tmp_path, "q", QueueConfig(sync_journal=0))
    assert (tmp_path / "q.1").read_bytes() == old  # read, never appended to
    assert (tmp_path / "q").read_bytes()[:8] == rec.FILE_HEADER
    head = queue.peek()
    assert head is not None and head.data == b"three"  # the open read was aborted
    queue.add(b"five")
    queue.add(b"six")  # after a sync: the new file writes ahead
    assert (tmp_path / "q").stat().st_size > append.PREALLOCATE_FIRST
    queue.close()
    queue = PersistentQueue(tmp_path, "q")
    got = [queue.remove() for _ in range(5)]
    assert [i.data for i in got if i is not None] == [b"three", b"four", b"five", b"six"]
    queue.close()


def test_the_reader_follows_a_file_whose_zeros_become_records(tmp_path: Path) -> None:
    j = FileJournal(str(tmp_path), "q", on_dirty=lambda _: None)  # written when we say
    j.replay(Recorder())
    j.add(1, 1, 0, b"a")
    j.write_out()
    j.sync()
    j.add(2, 2, 0, b"b")
    j.write_out()  # now zeros follow the records
    reader = j.reader((1, rec.HEADER_SIZE))
    assert [x[3] for x in reader.next_adds(1 << 20)] == [b"a", b"b"]
    assert reader.next_add() is None  # it read zeros: the end, for now
    j.add(3, 3, 0, b"c")
    j.write_out()  # over the zeros the reader saw
    j.add(4, 4, 0, b"d")  # buffered: the reader has it written out
    assert [x[3] for x in reader.next_adds(1 << 20)] == [b"c", b"d"]
    reader.close()
    j.close()


def _with_zeros_after(tmp_path: Path, tail: bytes) -> Path:
    """A crash image: two good records, then ``tail`` over zeros written ahead."""
    (tmp_path / "live").mkdir()
    j = open_journal(tmp_path / "live")
    j.add(1, 1, 0, b"a")
    j.sync()
    j.add(2, 2, 0, b"b")
    image = crash_image(tmp_path / "live" / "q", tmp_path / "crashed")
    end = j.current_size
    j.close()
    with open(image, "r+b") as fh:
        fh.seek(end)
        fh.write(tail)
    return image


def test_a_torn_record_before_the_zeros_is_a_torn_tail(tmp_path: Path) -> None:
    torn = bytearray()
    rec.encode_add(torn, 3, 3, 0, b"z" * 5000)
    image = _with_zeros_after(tmp_path, bytes(torn[:2000]))  # the rest of it still zeros
    end = image.stat().st_size - append.PREALLOCATE_FIRST
    events, report = replay(image.parent)
    assert payloads(events) == [b"a", b"b"]
    assert [(t.offset, t.reason) for t in report.truncations] == [(end, "checksum mismatch")]


def test_zeros_with_data_after_them_are_damage(tmp_path: Path) -> None:
    """Zeros where a record starts, data after, the zeros not reaching a page end: no power
    loss leaves that (a lost page reads as zeros to its end), so it is damage, a zeroed
    sector say; start-up stops and nothing is cut."""
    late = bytearray()
    rec.encode_add(late, 3, 3, 0, b"late")
    image = _with_zeros_after(tmp_path, bytes(512) + late)
    end = image.stat().st_size - append.PREALLOCATE_FIRST
    assert end + 512 < 4096
    before = image.read_bytes()
    with pytest.raises(JournalCorrupt) as info:
        replay(image.parent)
    assert (info.value.offset, image.read_bytes()) == (end, before)
    out = _check(image.parent)
    assert f"BAD at offset {end}" in out


def test_zeros_to_a_page_end_with_data_after_them_are_a_lost_page(tmp_path: Path) -> None:
    """The same, the zeros reaching the end of their page: the page holding the end of the
    records was lost in a power loss (it reads as it was at the last fsync) while a later
    page was written. Cut there (docs/journal_format.md §6), the cut bytes kept."""
    late = bytearray()
    rec.encode_add(late, 3, 3, 0, b"late")
    image = _with_zeros_after(tmp_path, bytes(4096) + late)
    end = image.stat().st_size - append.PREALLOCATE_FIRST
    cut = image.read_bytes()[end:]
    events, report = replay(image.parent)
    assert payloads(events) == [b"a", b"b"]
    assert [t.offset for t in report.truncations] == [end]
    assert "zeros to the end of the page" in report.truncations[0].reason
    assert (image.parent / f"q.cut-{end}").read_bytes() == cut


def _check(data_dir: Path) -> str:
    import io

    buf = io.StringIO()
    journal_tool.check(str(data_dir), buf)
    return buf.getvalue()


def test_the_journal_tool_reads_a_crash_image(tmp_path: Path) -> None:
    image = _with_zeros_after(tmp_path, b"")
    assert "BAD" not in _check(image.parent)


def test_a_failed_step_ahead_leaves_the_journal_appending_without(tmp_path: Path) -> None:
    j = open_journal(tmp_path)
    j.add(1, 1, 0, b"a")
    j.sync()
    # A file size limit lets the record through and refuses the zeros after it (EFBIG).
    with file_size_limit(j.current_size + 1000):
        j.add(2, 2, 0, b"b")
        j.add(3, 3, 0, b"c")
    assert not j.failed
    assert (tmp_path / "q").stat().st_size == j.current_size  # no part of a step left
    j.sync()
    j.add(4, 4, 0, b"d")  # and no more steps for this file, even after a sync
    assert (tmp_path / "q").stat().st_size == j.current_size
    j.close()
    assert payloads(replay(tmp_path)[0]) == [b"a", b"b", b"c", b"d"]
