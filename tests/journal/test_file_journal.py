"""FileJournal: replay, file headers, torn tails vs corruption, file naming, write failures.

Journal files are built byte by byte from the record encoders, so each test states exactly
what is on disk; MemoryJournal must behave like the file journal for the same appends.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from zlib import crc32

import pytest
from recorder import Event, Recorder, file_size_limit

from tercel.errors import JournalCorrupt, JournalWriteError
from tercel.journal import FileJournal, MemoryJournal, NullJournal, list_queue_names
from tercel.journal import journal as jmod
from tercel.journal import records as rec
from tercel.journal.append import IOV_MAX
from tercel.journal.faults import FaultyFiles
from tercel.journal.files import DataDir
from tercel.journal.tail import TORN_SCAN


def add(item_id: int, data: bytes = b"x") -> bytes:
    buf = bytearray()
    rec.encode_add(buf, item_id, 1000 + item_id, 0, data)
    return bytes(buf)


def add_event(item_id: int, data: bytes = b"x") -> Event:
    return ("add", item_id, 1000 + item_id, 0, data)


def xid_record(op: int, xid: int) -> bytes:
    buf = bytearray()
    rec.encode_xid(buf, op, xid)
    return bytes(buf)


def write(path: Path, *records: bytes, header: bytes = rec.FILE_HEADER) -> bytes:
    data = header + b"".join(records)
    path.write_bytes(data)
    return data


def replay(tmp_path: Path, name: str = "q") -> tuple[FileJournal, Recorder, jmod.ReplayReport]:
    j = FileJournal(str(tmp_path), name)
    sink = Recorder()
    report = j.replay(sink)
    return j, sink, report


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[FileJournal]:
    j = FileJournal(str(tmp_path), "q")
    j.replay(Recorder())
    yield j
    j.close()


# ---- appends and replay --------------------------------------------------------------------


def test_new_journal_writes_a_header(tmp_path: Path) -> None:
    j, sink, report = replay(tmp_path)
    j.close()
    assert (tmp_path / "q").read_bytes() == rec.FILE_HEADER
    assert sink.events == []
    assert (report.records, report.bytes, report.truncations) == (0, 0, [])


def test_appends_replay_in_order(tmp_path: Path, journal: FileJournal) -> None:
    journal.add(1, 10, 20, b"one")
    journal.add(2, 11, 0, b"")
    journal.open_read(5)
    journal.abort(5)
    journal.open_read(6)
    journal.confirm(6)
    journal.remove()
    journal.flush_items()
    journal.close()
    expected = [
        ("add", 1, 10, 20, b"one"),
        ("add", 2, 11, 0, b""),
        ("open", 5),
        ("return", 5),  # abort() writes RETURN since format version 3
        ("open", 6),
        ("confirm", 6),
        ("remove",),
        ("flush",),
    ]
    j2, sink, report = replay(tmp_path)
    j2.close()
    assert sink.events == expected
    assert report.records == len(expected)
    assert report.bytes == (tmp_path / "q").stat().st_size


def test_each_append_is_written_through_without_an_owner(
    tmp_path: Path, journal: FileJournal
) -> None:
    journal.add(1, 10, 0, b"abc")
    assert (tmp_path / "q").stat().st_size == journal.current_size == journal.size
    assert journal.needs_sync
    journal.sync()
    assert not journal.needs_sync


def test_an_owner_decides_when_to_write(tmp_path: Path) -> None:
    dirty: list[FileJournal] = []
    j = FileJournal(str(tmp_path), "q", on_dirty=dirty.append)
    j.replay(Recorder())
    j.add(1, 10, 0, b"abc")
    j.remove()
    j.open_read(1)
    assert dirty == [j]  # once per batch, not once per record
    assert (tmp_path / "q").stat().st_size == rec.HEADER_SIZE
    assert j.current_size == rec.HEADER_SIZE + len(add(1, b"abc")) + 9 + 13
    j.write_out()
    assert (tmp_path / "q").stat().st_size == j.current_size
    j.confirm(1)
    assert dirty == [j, j]
    j.close()  # close writes out what is buffered
    assert (tmp_path / "q").stat().st_size == j.current_size
    _, sink, _ = replay(tmp_path)
    assert sink.events[-1] == ("confirm", 1)


def test_one_write_out_of_more_records_than_one_pwritev_takes(tmp_path: Path) -> None:
    j = FileJournal(str(tmp_path), "q", on_dirty=lambda _: None)
    j.replay(Recorder())
    count = IOV_MAX  # three pieces per ADD: three pwritev calls
    for i in range(1, count + 1):
        j.add(i, 1000 + i, 0, b"p%d" % i)
        if i % 100 == 0:
            j.remove()
    size = j.current_size
    j.write_out()
    assert (tmp_path / "q").stat().st_size == size == j.current_size
    j.close()
    _, sink, report = replay(tmp_path)
    adds = [e for e in sink.events if e[0] == "add"]
    assert adds == [("add", i, 1000 + i, 0, b"p%d" % i) for i in range(1, count + 1)]
    assert len(sink.events) - len(adds) == count // 100 and report.truncations == []


def test_replay_appends_after_existing_records(tmp_path: Path) -> None:
    write(tmp_path / "q", add(1))
    j, sink, _ = replay(tmp_path)
    j.add(2, 1002, 0, b"x")
    j.close()
    _, sink, _ = replay(tmp_path)
    assert sink.events == [add_event(1), add_event(2)]


def test_older_files_replay_first_in_numeric_order(tmp_path: Path) -> None:
    write(tmp_path / "q.10", add(3))
    write(tmp_path / "q.2", add(2))
    write(tmp_path / "q.1", add(1))
    write(tmp_path / "q", add(4))
    write(tmp_path / "qq", add(99))  # another queue's file
    j, sink, report = replay(tmp_path)
    assert sink.events == [add_event(1), add_event(2), add_event(3), add_event(4)]
    one = rec.HEADER_SIZE + len(add(1))
    assert report.bytes == 4 * one
    assert j.current_size == one
    assert j.size == 4 * one
    j.close()


def test_older_files_without_a_current_file(tmp_path: Path) -> None:
    write(tmp_path / "q.1", add(1))
    j, sink, _ = replay(tmp_path)
    j.close()
    assert sink.events == [add_event(1)]
    assert (tmp_path / "q").read_bytes() == rec.FILE_HEADER


def test_empty_file_is_an_empty_journal(tmp_path: Path) -> None:
    (tmp_path / "q").write_bytes(b"")
    j, sink, report = replay(tmp_path)
    j.close()
    assert (sink.events, report.truncations) == ([], [])
    assert (tmp_path / "q").read_bytes() == rec.FILE_HEADER


def test_temp_files_are_removed_at_replay(tmp_path: Path) -> None:
    write(tmp_path / "q~~123", add(9))
    write(tmp_path / "q~~", add(9))
    write(tmp_path / "qq~~1", add(9))
    write(tmp_path / "q", add(1))
    j, sink, _ = replay(tmp_path)
    j.close()
    assert sink.events == [add_event(1)]
    assert sorted(os.listdir(tmp_path)) == ["q", "qq~~1"]


def test_erase_removes_every_file(tmp_path: Path) -> None:
    write(tmp_path / "q.1", add(1))
    write(tmp_path / "q", add(2))
    write(tmp_path / "q+b", add(3))
    j, _, _ = replay(tmp_path)
    j.add(4, 1, 0, b"")
    j.erase()
    assert os.listdir(tmp_path) == ["q+b"]
    assert j.size == 0
    j.erase()  # twice is harmless
    j.close()
    j2, sink, _ = replay(tmp_path)
    j2.close()
    assert sink.events == []


def test_close_is_idempotent_and_deferred_while_syncing(tmp_path: Path) -> None:
    j, _, _ = replay(tmp_path)
    j.syncing = True
    j.close()
    j.add(1, 1, 0, b"late")  # still open: the close waits for the sync
    j.sync()
    j.sync_done()
    j.close()
    _, sink, _ = replay(tmp_path)
    assert sink.events == [("add", 1, 1, 0, b"late")]


# ---- headers -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["q", "q.1"])
def test_bad_magic_is_corrupt(tmp_path: Path, name: str) -> None:
    data = write(tmp_path / name, add(1), header=b"KSTL\x01\x00\x00\x00")
    with pytest.raises(JournalCorrupt) as info:
        replay(tmp_path)
    assert info.value.path == str(tmp_path / name)
    assert info.value.offset == 0
    assert str(tmp_path / name) in str(info.value)
    assert (tmp_path / name).read_bytes() == data


def test_unsupported_version_is_corrupt(tmp_path: Path) -> None:
    data = write(tmp_path / "q", add(1), header=b"TRCL\x05\x00\x00\x00")
    with pytest.raises(JournalCorrupt) as info:
        replay(tmp_path)
    assert (info.value.path, info.value.offset) == (str(tmp_path / "q"), 4)
    assert "version 5" in str(info.value)
    assert (tmp_path / "q").read_bytes() == data


def test_a_kestrel_journal_is_refused(tmp_path: Path) -> None:
    # A Kestrel 2.x ADDX record starts with opcode 8; it must never be read as ours.
    (tmp_path / "q").write_bytes(b"\x08\x05\x00\x00\x00hello")
    with pytest.raises(JournalCorrupt):
        replay(tmp_path)


@pytest.mark.parametrize("size", [1, 3, 4, 5, 7])
def test_torn_header_is_truncated(tmp_path: Path, size: int) -> None:
    (tmp_path / "q").write_bytes(rec.FILE_HEADER[:size])
    j, sink, report = replay(tmp_path)
    j.close()
    assert sink.events == []
    assert [(t.path, t.offset, t.dropped) for t in report.truncations] == [
        (str(tmp_path / "q"), 0, size)
    ]
    assert (tmp_path / "q").read_bytes() == rec.FILE_HEADER


def test_torn_header_in_an_older_file_is_corrupt(tmp_path: Path) -> None:
    (tmp_path / "q.1").write_bytes(rec.FILE_HEADER[:5])
    write(tmp_path / "q", add(1))
    with pytest.raises(JournalCorrupt) as info:
        replay(tmp_path)
    assert info.value.path == str(tmp_path / "q.1")


# ---- torn tails ----------------------------------------------------------------------------

TAILS = {
    "partial record": add(3, b"abcdef")[:-2],
    "partial prefix": add(3)[:5],
    "zeros": b"\x00" * 100,
    "garbage": bytes((i * 151 + 7) % 256 for i in range(300)),
    "bad checksum of the last record": add(3)[:-1] + b"?",
}


@pytest.mark.parametrize("tail", list(TAILS.values()), ids=list(TAILS))
def test_torn_tail_is_cut_at_the_last_good_record(tmp_path: Path, tail: bytes) -> None:
    good = write(tmp_path / "q", add(1), add(2))
    with (tmp_path / "q").open("ab") as fh:
        fh.write(tail)
    j, sink, report = replay(tmp_path)
    assert sink.events == [add_event(1), add_event(2)]
    if tail == TAILS["zeros"]:  # space written ahead (test_write_ahead.py): cut, no torn tail
        assert report.truncations == []
    else:
        assert len(report.truncations) == 1
        cut = report.truncations[0]
        assert (cut.path, cut.offset, cut.dropped) == (str(tmp_path / "q"), len(good), len(tail))
        assert cut.reason
    assert (tmp_path / "q").read_bytes() == good
    assert report.bytes == len(good)
    # The journal continues right after the last good record.
    j.add(4, 1004, 0, b"x")
    j.close()
    _, sink, report = replay(tmp_path)
    assert sink.events == [add_event(1), add_event(2), add_event(4)]
    assert report.truncations == []


def test_torn_tail_of_the_newest_older_file_when_no_current_file(tmp_path: Path) -> None:
    write(tmp_path / "q.1", add(1))
    good = write(tmp_path / "q.2", add(2))
    with (tmp_path / "q.2").open("ab") as fh:
        fh.write(b"\x00\x00")
    j, sink, report = replay(tmp_path)
    j.close()
    assert sink.events == [add_event(1), add_event(2)]
    assert [t.path for t in report.truncations] == [str(tmp_path / "q.2")]
    assert (tmp_path / "q.2").read_bytes() == good


# ---- corruption ----------------------------------------------------------------------------


def test_bad_checksum_in_the_middle_is_corrupt_and_untouched(tmp_path: Path) -> None:
    first = rec.HEADER_SIZE + len(add(1))
    damaged = bytearray(add(2, b"payload"))
    damaged[-1] ^= 0xFF
    data = write(tmp_path / "q", add(1), bytes(damaged), add(3))
    with pytest.raises(JournalCorrupt) as info:
        replay(tmp_path)
    assert (info.value.path, info.value.offset) == (str(tmp_path / "q"), first)
    assert "checksum" in str(info.value)
    assert f"offset {first}" in str(info.value)
    assert (tmp_path / "q").read_bytes() == data
    assert os.listdir(tmp_path) == ["q"]


def test_damage_inside_a_large_record_is_found_through_its_length(tmp_path: Path) -> None:
    # The next record starts beyond the torn-tail scan window; the damaged record's own
    # length still points at it, so this is damage, not a torn tail.
    big = bytearray(add(2, b"z" * (TORN_SCAN * 3)))
    big[len(big) // 2] ^= 1
    data = write(tmp_path / "q", add(1), bytes(big), add(3))
    with pytest.raises(JournalCorrupt):
        replay(tmp_path)
    assert (tmp_path / "q").read_bytes() == data


def test_bad_length_with_valid_records_after_is_corrupt(tmp_path: Path) -> None:
    body = b"\x02"
    bad = struct.pack("<II", 0, crc32(body)) + body
    data = write(tmp_path / "q", add(1), bad, add(3), add(4))
    with pytest.raises(JournalCorrupt):
        replay(tmp_path)
    assert (tmp_path / "q").read_bytes() == data


@pytest.mark.parametrize("tail", list(TAILS.values()), ids=list(TAILS))
def test_any_bad_record_in_an_older_file_is_fatal(tmp_path: Path, tail: bytes) -> None:
    older = write(tmp_path / "q.1", add(1), tail)
    current = write(tmp_path / "q", add(2))
    sink = Recorder()
    with pytest.raises(JournalCorrupt) as info:
        FileJournal(str(tmp_path), "q").replay(sink)
    assert info.value.path == str(tmp_path / "q.1")
    assert info.value.offset == rec.HEADER_SIZE + len(add(1))
    assert (tmp_path / "q.1").read_bytes() == older
    assert (tmp_path / "q").read_bytes() == current


# ---- file names ----------------------------------------------------------------------------


def test_list_queue_names_ignores_stray_files(tmp_path: Path) -> None:
    for name in [
        "a",
        "a.1",
        "a.22",
        "b.3",
        "c+d",
        "e~~tmp",
        "f.tmp",
        "g.1.2",
        ".kestrel-status",
        "bad name",
        "x" * 201,
        "caf\u00e9",
        "+h",
    ]:
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir.1").mkdir()
    assert list_queue_names(str(tmp_path)) == ["a", "b", "c+d"]


def test_list_queue_names_of_an_empty_dir(tmp_path: Path) -> None:
    assert list_queue_names(str(tmp_path)) == []


def test_journal_files_order(tmp_path: Path) -> None:
    for name in ["q", "q.3", "q.20", "q.1", "q.x", "q.1.1", "qq.1", "q~~1"]:
        (tmp_path / name).write_bytes(b"")
    got = jmod.journal_files(str(tmp_path), "q")
    assert got == [str(tmp_path / n) for n in ["q.1", "q.3", "q.20", "q"]]


# ---- write failures ------------------------------------------------------------------------


def faulty_journal(tmp_path: Path, faults: FaultyFiles, dirty: list[FileJournal]) -> FileJournal:
    """A journal whose file operations go through ``faults`` (the fault seam)."""
    files = DataDir(str(tmp_path), ops=faults)
    return FileJournal(str(tmp_path), "q", on_dirty=dirty.append, directory=files)


@pytest.mark.parametrize("error", [errno.EBADF, errno.ENOSPC], ids=["read-only fd", "disk full"])
def test_failed_write_raises_and_later_appends_refuse(tmp_path: Path, error: int) -> None:
    dirty: list[FileJournal] = []
    faults = FaultyFiles()
    j = faulty_journal(tmp_path, faults, dirty)
    j.replay(Recorder())
    j.add(1, 1, 0, b"kept")
    j.write_out()
    faults.fail("pwritev", error)
    j.add(2, 2, 0, b"lost")
    with pytest.raises(JournalWriteError) as info:
        j.write_out()
    err = info.value
    assert err.path == str(tmp_path / "q")
    assert err.offset == rec.HEADER_SIZE + len(add(1, b"kept"))
    assert j.failed
    for append in (
        lambda: j.add(3, 3, 0, b""),
        j.remove,
        j.flush_items,
        lambda: j.open_read(1),
        lambda: j.confirm(1),
        lambda: j.abort(1),
    ):
        with pytest.raises(JournalWriteError) as again:
            append()
        assert again.value is err
    j.close()
    _, sink, _ = replay(tmp_path)
    assert sink.events == [("add", 1, 1, 0, b"kept")]


def test_failed_fsync_marks_the_journal_failed(tmp_path: Path) -> None:
    faults = FaultyFiles()
    j = faulty_journal(tmp_path, faults, [])
    j.replay(Recorder())
    j.add(1, 1, 0, b"kept")
    j.write_out()
    faults.fail("fdatasync", errno.EIO)
    with pytest.raises(JournalWriteError, match="fsync failed") as info:
        j.sync()
    assert j.failed
    with pytest.raises(JournalWriteError) as again:
        j.add(2, 2, 0, b"refused")
    assert again.value is info.value
    j.close()


def test_a_partial_write_is_cut_back_to_the_last_record(tmp_path: Path) -> None:
    dirty: list[FileJournal] = []
    j = FileJournal(str(tmp_path), "q", on_dirty=dirty.append)
    j.replay(Recorder())
    j.add(1, 1, 0, b"kept")
    j.write_out()
    good = (tmp_path / "q").stat().st_size
    j.add(2, 2, 0, b"y" * 5000)
    # A file size limit lets part of the write through, then fails with EFBIG.
    with file_size_limit(good + 1000), pytest.raises(JournalWriteError):
        j.write_out()
    assert (tmp_path / "q").stat().st_size == good
    j.close()
    _, sink, report = replay(tmp_path)
    assert sink.events == [("add", 1, 1, 0, b"kept")]
    assert report.truncations == []


def test_a_rotation_that_cannot_rename_fails_the_journal_and_loses_nothing(
    tmp_path: Path, journal: FileJournal
) -> None:
    journal.add(1, 1, 0, b"kept")
    (tmp_path / "q.1").mkdir()  # the name rotation renames to is taken: EISDIR
    with pytest.raises(JournalWriteError):
        journal.rotate()
    assert journal.failed
    with pytest.raises(JournalWriteError):
        journal.add(2, 2, 0, b"refused")  # nothing more is accepted without a file
    journal.close()
    (tmp_path / "q.1").rmdir()
    _, sink, _ = replay(tmp_path)
    assert sink.events == [("add", 1, 1, 0, b"kept")]


def test_a_rotation_whose_new_file_gets_no_header_fails_the_journal(
    tmp_path: Path, journal: FileJournal
) -> None:
    journal.add(1, 1, 0, b"kept")
    # A file size limit below the header's 8 bytes: the old file is renamed, the new one
    # stays empty, and the journal must not go on as if it had a file.
    with file_size_limit(4), pytest.raises(JournalWriteError):
        journal.rotate()
    assert journal.failed
    with pytest.raises(JournalWriteError):
        journal.add(2, 2, 0, b"refused")
    journal.close()
    assert (tmp_path / "q").stat().st_size < rec.HEADER_SIZE  # what got through of it
    _, sink, _ = replay(tmp_path)  # the old file; the torn header is cut (a torn tail)
    assert sink.events == [("add", 1, 1, 0, b"kept")]


def test_a_torn_record_whose_payload_holds_a_record_is_still_a_torn_tail(
    tmp_path: Path, journal: FileJournal
) -> None:
    journal.add(1, 1, 0, b"acknowledged")
    good = journal.current_size
    journal.add(2, 2, 0, b"x" * 100 + rec.REMOVE_RECORD + b"y" * 65536)  # a journal as data
    journal.close()
    with open(tmp_path / "q", "r+b") as fh:
        fh.truncate(good + 4096)  # only the first 4 KiB of the last write reached the disk
    _, sink, report = replay(tmp_path)
    assert sink.events == [("add", 1, 1, 0, b"acknowledged")]
    assert [t.offset for t in report.truncations] == [good]


# ---- the RAM twins -------------------------------------------------------------------------


def test_memory_journal_matches_the_file_journal(tmp_path: Path, journal: FileJournal) -> None:
    mem = MemoryJournal()
    for j in (journal, mem):
        j.add(1, 10, 20, b"one")
        j.open_read(1)
        j.abort(1)
        j.remove()
        j.flush_items()
        j.confirm(3)
    journal.close()
    assert (tmp_path / "q").read_bytes() == bytes(mem.data)
    assert mem.size == mem.current_size == journal.size
    sink = Recorder()
    report = mem.replay(sink)
    assert sink.events == replay(tmp_path)[1].events
    assert report.records == 6
    mem.close()
    mem.erase()
    assert bytes(mem.data) == rec.FILE_HEADER
    assert mem.replay(Recorder()).records == 0


def test_null_journal_keeps_nothing() -> None:
    j = NullJournal()
    j.add(1, 1, 0, b"x")
    j.remove()
    j.flush_items()
    j.open_read(1)
    j.confirm(1)
    j.abort(1)
    sink = Recorder()
    j.replay(sink)
    assert sink.events == []
    assert (j.size, j.current_size, j.failed) == (0, 0, False)
