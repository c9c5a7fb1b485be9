"""Checkpoints: replay that starts at one must rebuild exactly what a full replay rebuilds.

Every test compares against a full replay of a copy of the same files with the checkpoint
removed (the reference), on real files, and drains both queues item by item.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import shutil
from pathlib import Path

import pytest

from tercel.clock import ManualClock
from tercel.config import QueueConfig
from tercel.core.queue import PersistentQueue
from tercel.errors import JournalCorrupt
from tercel.journal import FileJournal
from tercel.journal import checkpoint as ckpt
from tercel.journal.faults import FaultyFiles
from tercel.journal.files import DataDir

T0 = 1_700_000_000_000
CONFIG = dataclasses.replace(QueueConfig(), max_memory_size=64 * 1024)  # read-behind early


def open_queue(path: Path) -> PersistentQueue:
    q = PersistentQueue("q", CONFIG, FileJournal(str(path), "q"), ManualClock(T0))
    q.replay()
    return q


def fill(q: PersistentQueue, start: int, count: int, size: int = 1000) -> None:
    for i in range(start, start + count):
        assert q.add(b"%08d" % i + b"x" * (size - 8))


def snapshot_of(q: PersistentQueue) -> tuple[int, int, int, list[tuple[int, bytes]]]:
    """Counters and every item, drained (the queue is closed without a checkpoint after).
    The next item id is that of a probe added and removed once the queue is drained."""
    length, size = len(q), q.bytes
    items = []
    while (item := q.remove()) is not None:
        items.append((item.id, item.data[:8]))
    assert q.add(b"probe")
    probe = q.remove()
    assert probe is not None
    return (length, size, probe.id, items)


def used_checkpoint(path: Path, caplog: pytest.LogCaptureFixture) -> tuple[object, bool]:
    """Replay ``path`` and drain it; whether the log said replay started at the checkpoint."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tercel.journal.journal"):
        q = open_queue(path)
    used = any("replay starts at the checkpoint" in r.getMessage() for r in caplog.records)
    return snapshot_of(q), used


def reference(path: Path, tmp: Path) -> object:
    ref = tmp / "reference"
    shutil.rmtree(ref, ignore_errors=True)
    shutil.copytree(path, ref)
    (ref / "q.checkpoint").unlink(missing_ok=True)
    return snapshot_of(open_queue(ref))


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    return path


def test_a_clean_close_leaves_a_checkpoint_replay_starts_from(
    data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    q = open_queue(data)
    fill(q, 0, 3000)  # 3 MB through a 64 KB window: most items on disk, several marks
    for _ in range(1500):  # the head moves past the first marks
        q.remove()
    q.close()
    assert (data / "q.checkpoint").exists()
    expected = reference(data, tmp_path)
    state, used = used_checkpoint(data, caplog)
    assert used
    assert state == expected
    assert state[0] == 1500 and state[3][0] == (1501, b"%08d" % 1500)  # type: ignore[index]


def test_records_after_the_checkpoint_are_replayed(
    data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    q = open_queue(data)
    fill(q, 0, 2000)
    for _ in range(10):
        q.remove()
    q.close()
    q = open_queue(data)  # from the checkpoint; then a crash after more work
    for _ in range(700):
        q.remove()
    fill(q, 2000, 300)
    xid, _ = q.remove_open()  # type: ignore[misc]
    q.abort(xid)  # the head was handed out: no new checkpoint can describe this
    xid2, _ = q.remove_open()  # type: ignore[misc]
    q.confirm(xid2)
    q.log.write_out()  # type: ignore[attr-defined]  # what a crash leaves: in the kernel
    expected = reference(data, tmp_path)
    state, used = used_checkpoint(data, caplog)
    assert used
    assert state == expected
    assert state[0] == 2000 - 10 - 700 + 300 - 1  # type: ignore[index]


def test_no_checkpoint_while_reads_are_open_or_a_head_was_handed_out(data: Path) -> None:
    q = open_queue(data)
    fill(q, 0, 10)
    xid, _ = q.remove_open()  # type: ignore[misc]
    assert not q.checkpoint()
    q.abort(xid)  # back at the head with a delivery count
    assert not q.checkpoint()
    q.remove()
    assert q.checkpoint()


def test_an_empty_queue_checkpoints_its_counters(
    data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    q = open_queue(data)
    fill(q, 0, 5)
    while q.remove() is not None:
        pass
    q.close()
    expected = reference(data, tmp_path)
    q = open_queue(data)
    assert len(q) == 0
    fill(q, 5, 2)
    head = q.peek()
    assert head is not None and head.id == 6  # the ids go on from where they were
    q.close()
    again = reference(data, tmp_path)
    state, used = used_checkpoint(data, caplog)
    assert used and state == again == (2, 2000, 8, [(6, b"00000005"), (7, b"00000006")])
    assert expected == (0, 0, 6, [])


@pytest.mark.parametrize("damage", ["checksum", "truncated", "tail", "head"])
def test_a_checkpoint_that_does_not_fit_the_files_is_ignored(
    data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    q = open_queue(data)
    fill(q, 0, 500)
    q.close()
    cp_path = data / "q.checkpoint"
    raw = bytearray(cp_path.read_bytes())
    cp = ckpt.decode(bytes(raw))
    assert cp is not None
    if damage == "checksum":
        raw[20] ^= 1
        cp_path.write_bytes(raw)
    elif damage == "truncated":
        cp_path.write_bytes(raw[:-3])
    else:  # the files changed under a well-formed checkpoint
        seq, offset = cp.end if damage == "tail" else cp.head
        target = data / f"q.{seq}" if (data / f"q.{seq}").exists() else data / "q"
        with open(target, "r+b") as fh:
            fh.seek(offset - 100 if damage == "tail" else offset + 20)
            byte = fh.read(1)
            fh.seek(-1, os.SEEK_CUR)
            fh.write(bytes([byte[0] ^ 0xFF]))
        if damage == "head":  # damage the full replay refuses too: the checkpoint hides none
            caplog.clear()
            with (
                caplog.at_level(logging.INFO, logger="tercel.journal.journal"),
                pytest.raises(JournalCorrupt, match="checksum"),
            ):
                open_queue(data)
            assert any("not using the checkpoint" in r.getMessage() for r in caplog.records)
            return
    expected = reference(data, tmp_path)
    state, used = used_checkpoint(data, caplog)
    assert not used
    assert any("not using the checkpoint" in r.getMessage() for r in caplog.records)
    assert state == expected


def test_compaction_past_the_head_makes_the_checkpoint_unusable(
    data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = dataclasses.replace(CONFIG, max_journal_size=256 * 1024)
    q = PersistentQueue("q", config, FileJournal(str(data), "q"), ManualClock(T0))
    q.replay()
    fill(q, 0, 1000)
    q.close()
    q = PersistentQueue("q", config, FileJournal(str(data), "q"), ManualClock(T0))
    q.replay()
    for _ in range(900):  # read-behind compaction replaces the consumed files
        q.remove()
    assert q.log.compactions  # type: ignore[attr-defined]
    q.log.write_out()  # type: ignore[attr-defined]  # a crash: the old checkpoint stays
    expected = reference(data, tmp_path)
    state, used = used_checkpoint(data, caplog)
    assert not used
    assert state == expected
    assert state[0] == 100  # type: ignore[index]


def test_data_dirs_without_a_checkpoint_replay_as_before(
    data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    q = open_queue(data)
    fill(q, 0, 300)
    q.log.write_out()  # type: ignore[attr-defined]  # killed: no checkpoint
    assert not (data / "q.checkpoint").exists()
    expected = reference(data, tmp_path)
    state, used = used_checkpoint(data, caplog)
    assert not used
    assert state == expected
    assert state[0] == 300  # type: ignore[index]


def test_erase_removes_the_checkpoint(data: Path) -> None:
    q = open_queue(data)
    fill(q, 0, 3)
    assert q.checkpoint()
    q.erase()
    assert not (data / "q.checkpoint").exists()


@pytest.mark.parametrize("how", ["eio-on-the-checkpoint", "crash-after-the-files"])
def test_a_queue_deleted_half_way_leaves_no_checkpoint_for_its_next_incarnation(
    data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    # The first life ends empty, two rotations in: its checkpoint says "nothing before
    # (3, header)". A delete then stops half way (an I/O error on the checkpoint's unlink;
    # or a crash once the journal files are gone, the checkpoint still there): the next queue
    # of that name, once it reaches file 3, must not replay from that checkpoint and skip
    # files 1 and 2 (four acknowledged items lost before the fix).
    q = open_queue(data)
    fill(q, 0, 3)
    for _ in range(3):
        q.remove()
    q.log.rotate()
    q.log.rotate()
    q.close()
    saved = (data / "q.checkpoint").read_bytes()
    faults = FaultyFiles()
    if how == "eio-on-the-checkpoint":
        faults.fail("unlink", errno.EIO, path="q.checkpoint")
    journal = FileJournal(str(data), "q", directory=DataDir(str(data), ops=faults))
    q = PersistentQueue("q", CONFIG, journal, ManualClock(T0))
    q.replay()
    with contextlib.suppress(OSError):
        q.erase()
    if how == "crash-after-the-files":
        (data / "q.checkpoint").write_bytes(saved)
    q = open_queue(data)  # the queue made again under the same name
    fill(q, 100, 2)
    q.log.rotate()
    fill(q, 102, 2)
    q.log.rotate()
    fill(q, 104, 2)
    q.log.write_out()  # then kill -9: no clean close, no new checkpoint
    want = reference(data, tmp_path)
    got, _ = used_checkpoint(data, caplog)
    assert got == want
    assert [d for _, d in got[3]] == [b"%08d" % i for i in range(100, 106)]  # type: ignore[index]


def test_damage_between_the_head_and_the_end_at_a_mark_stops_start_up(data: Path) -> None:
    """Replay from a checkpoint reads no record between the head and the end, so damage there
    used to show only later, as an error on the get that reached it. Start-up now checks the
    record at each mark in that range (the first ADD of each file, one per MiB): damage there
    makes the checkpoint unusable, and the full replay stops at it as journal_format.md §6
    says, as it would have without a checkpoint."""
    q = open_queue(data)
    fill(q, 0, 3000)
    for _ in range(100):
        q.remove()
    q.close()
    cp = ckpt.decode((data / "q.checkpoint").read_bytes())
    assert cp is not None
    inside = [m for m in cp.marks if cp.head_id < m[0] and (m[1], m[2]) < cp.end]
    assert inside, cp.marks
    _, seq, offset = inside[0]
    path = data / ("q" if seq == cp.end[0] else f"q.{seq}")
    raw = bytearray(path.read_bytes())
    raw[offset + 40] ^= 0xFF  # a payload byte of that item: its checksum fails
    path.write_bytes(raw)
    with pytest.raises(JournalCorrupt, match="checksum"):
        open_queue(data)


def test_a_checkpoint_ending_at_a_file_header_is_checked_against_the_next_add(
    data: Path, tmp_path: Path
) -> None:
    """An end at a file header has no tail to compare: another queue's files of the same name
    and sequence numbers passed for it, and replay skipped their first files. The ADD at the
    end must now be the checkpoint's next item."""
    q = open_queue(data)
    fill(q, 0, 5)
    while q.remove() is not None:
        pass
    assert q.log.rotate()  # type: ignore[attr-defined]
    q.close()  # checkpoint: empty, next id 6, the end at the new file's header
    cp = ckpt.decode((data / "q.checkpoint").read_bytes())
    assert cp is not None and cp.end[1] == 8 and cp.items == 0
    other = tmp_path / "other"  # the next queue of that name: ids 1-3, a rotation, ids 4-5
    other.mkdir()
    b = open_queue(other)
    fill(b, 100, 3)
    assert b.log.rotate()  # type: ignore[attr-defined]
    fill(b, 103, 2)
    b.log.close()  # type: ignore[attr-defined]  # a crash: no checkpoint of its own
    for f in data.glob("q*"):
        if f.name != "q.checkpoint":
            f.unlink()
    for f in other.glob("q*"):
        shutil.copy(f, data / f.name)
    assert sorted(f.name for f in data.glob("q*")) == ["q", "q.1", "q.checkpoint"]
    assert cp.end[0] == 2  # the same sequence numbers: only the record at the end differs
    state = snapshot_of(open_queue(data))
    assert [d for _, d in state[3]] == [b"%08d" % i for i in range(100, 105)]  # type: ignore[index]
