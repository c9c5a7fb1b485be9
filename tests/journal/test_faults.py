"""Disk faults injected through the journal's file seam, each with its documented outcome.

:class:`tercel.journal.faults.FaultyFiles` stands between the journal and the OS: a disk that
fills (ENOSPC), a disk whose fsync fails (EIO), a process out of descriptors (EMFILE), a slow
disk. The files are real; only the chosen calls fail.
"""

from __future__ import annotations

import asyncio
import errno
import os
import random
import threading
from pathlib import Path

import pytest
from recorder import Recorder

from tercel.clock import ManualClock
from tercel.config import ServerConfig, ServerSettings
from tercel.core.collection import QueueCollection
from tercel.core.reservations import ReservationTable
from tercel.errors import JournalWriteError, TooManyOpenFiles
from tercel.journal import FileJournal
from tercel.journal.faults import FaultyFiles, PowerLossFiles, power_loss
from tercel.journal.files import DataDir
from tercel.server.commit import Committer
from tercel.server.commit import Holder as CommitHolder


def journal(tmp_path: Path, name: str, directory: DataDir) -> FileJournal:
    j = FileJournal(str(tmp_path), name, directory=directory, on_dirty=lambda _: None)
    j.replay(Recorder())
    return j


def collection(tmp_path: Path, files: DataDir) -> QueueCollection:
    """Queues whose journals open their files through ``files``."""
    return QueueCollection(
        ServerConfig(ServerSettings(data_dir=str(tmp_path))),
        lambda name, _: FileJournal(str(tmp_path), name, directory=files),
        ManualClock(),
    )


def replayed(tmp_path: Path, name: str) -> list[bytes]:
    sink = Recorder()
    j = FileJournal(str(tmp_path), name)
    j.replay(sink)
    j.close()
    return [e[-1] for e in sink.events if e[0] == "add"]  # type: ignore[misc]


@pytest.mark.parametrize("op", ["pwritev", "fdatasync"])
def test_a_full_disk_or_a_failing_fsync_fails_the_journal_and_keeps_what_was_written(
    tmp_path: Path, op: str
) -> None:
    """ENOSPC on a write, EIO on an fsync: JournalWriteError, the journal refuses every later
    append, and a restart finds exactly the records written before."""
    faults = FaultyFiles()
    j = journal(tmp_path, "q", DataDir(str(tmp_path), ops=faults))
    j.add(1, 1, 0, b"kept")
    j.write_out()
    j.sync()
    faults.fail(op, errno.ENOSPC if op == "pwritev" else errno.EIO)
    j.add(2, 2, 0, b"lost")
    with pytest.raises(
        JournalWriteError, match="No space left" if op == "pwritev" else "Input/output"
    ):
        j.write_out()
        j.sync()
    assert j.failed
    with pytest.raises(JournalWriteError):
        j.add(3, 3, 0, b"refused")
    j.close()
    faults.clear()
    want = [b"kept"] if op == "pwritev" else [b"kept", b"lost"]  # lost was written, not synced
    assert replayed(tmp_path, "q") == want


def test_emfile_on_open_parks_a_pooled_journal_and_goes_on(tmp_path: Path) -> None:
    faults = FaultyFiles()
    files = DataDir(str(tmp_path), max_open=8, ops=faults)
    a = journal(tmp_path, "a", files)  # a new file: its journal holds the descriptor
    a.add(1, 1, 0, b"a1")
    a.write_out()
    assert files.held == 1
    faults.fail("open", errno.EMFILE, times=1, path="/b")
    b = journal(tmp_path, "b", files)  # the first open of b's file fails: a is parked
    assert (files.evictions, files.held) == (1, 1)
    b.add(1, 1, 0, b"b1")
    b.write_out()
    a.add(2, 2, 0, b"a2")  # a reopens its file by path
    a.write_out()
    assert files.held == 2
    faults.fail("open", errno.EMFILE, times=3, path="/c")
    c = journal(tmp_path, "c", files)  # b and a are parked, then the reserve is given up
    assert (files.evictions, files.held) == (3, 1)
    c.add(1, 1, 0, b"c1")
    c.write_out()
    # The pool's stats (memcache stats journal_files_*): a reopened once, four EMFILEs
    # answered by three evictions and the reserve, none refused.
    assert files.stats() == {
        "open": 1,
        "limit": 8,
        "evictions": 3,
        "reopens": 1,
        "emfile": 4,
        "refused": 0,
        "put_off": 0,
    }
    for j in (a, b, c):
        j.close()
    files.close()
    assert (replayed(tmp_path, "a"), replayed(tmp_path, "b")) == ([b"a1", b"a2"], [b"b1"])
    assert replayed(tmp_path, "c") == [b"c1"]


def test_the_directory_fsync_after_a_rotation_needs_no_descriptor(tmp_path: Path) -> None:
    """After a rotation the data dir is fsynced (at the journal's next sync) through the
    directory's own descriptor, which the pool opened once and keeps: with no descriptor to
    be had at all, the sync goes through. Opening the directory for each fsync would fail
    there ("rotation failed: Too many open files", or a group fsync of a ``sync_journal =
    true`` queue failing its journal, as ``bench/soak.py --emfile --seed 9`` showed)."""
    faults = FaultyFiles()
    files = DataDir(str(tmp_path), max_open=8, ops=faults)
    other = journal(tmp_path, "other", files)
    other.add(1, 1, 0, b"o1")
    other.write_out()
    q = journal(tmp_path, "q", files)
    q.add(1, 1, 0, b"q1")
    # After the rename: the new file's open goes through, every later open fails.
    faults.fail("open", errno.EMFILE, skip=1, armed_by=("rename", None))
    assert q.rotate()
    q.add(2, 2, 0, b"q2")
    q.write_out()
    fsyncs = faults.calls["fsync"]
    q.sync()
    assert not q.failed and faults.calls["fsync"] == fsyncs + 1  # the directory's
    assert files.stats()["emfile"] == 0
    faults.clear()
    other.add(2, 2, 0, b"o2")
    other.write_out()
    for j in (q, other):
        j.close()
    files.close()
    assert replayed(tmp_path, "q") == [b"q1", b"q2"]
    assert replayed(tmp_path, "other") == [b"o1", b"o2"]


def test_a_queue_that_cannot_get_a_descriptor_is_refused_cleanly(tmp_path: Path) -> None:
    """EMFILE with nothing left to free: that one request gets TooManyOpenFiles (``SERVER_ERROR
    too many open files``); the queue is not created, the others go on."""
    faults = FaultyFiles()
    files = DataDir(str(tmp_path), max_open=8, ops=faults)
    coll = collection(tmp_path, files)
    assert coll.add("kept", b"x", None, 1)
    faults.fail("open", errno.EMFILE, path="/new")
    with pytest.raises(TooManyOpenFiles):
        coll.add("new", b"y", None, 1)
    assert coll.queue("new") is None
    assert files.stats()["refused"] >= 1 and files.stats()["emfile"] >= 2
    assert coll.add("kept", b"z", None, 1)
    faults.clear()
    assert coll.add("new", b"y", None, 1)
    coll.close()
    assert replayed(tmp_path, "kept") == [b"x", b"z"]


def test_a_slow_disk_delays_a_periodic_sync_without_stopping_appends(tmp_path: Path) -> None:
    """A periodic fsync runs in a worker thread: while the disk is slow, the loop goes on
    appending and writing; the fsync ends, and close waits for it."""
    started = threading.Event()
    release = threading.Event()

    class Gate(FaultyFiles):  # the slow disk: the fsync waits until the test lets it go
        def fdatasync(self, fd: int) -> None:
            started.set()
            release.wait(10)
            super().fdatasync(fd)

    files = DataDir(str(tmp_path), ops=Gate())
    passes_while_syncing = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        committer = Committer(loop, lambda _: 1)  # sync_journal = "1ms"
        j = FileJournal(str(tmp_path), "q", directory=files, on_dirty=committer.journal_dirty)
        j.replay(Recorder())
        j.add(1, 1, 0, b"first")
        while not started.is_set():
            await asyncio.sleep(0.001)
        for i in range(3):  # the loop is free: appends go on during the fsync
            j.add(i + 2, 1, 0, b"more")
            await asyncio.sleep(0)
            passes_while_syncing.append(j.syncing)
        release.set()
        while j.syncing:
            await asyncio.sleep(0.001)
        j.close()
        committer.close()

    asyncio.run(main())
    assert passes_while_syncing == [True, True, True]
    assert replayed(tmp_path, "q") == [b"first", b"more", b"more", b"more"]


def test_a_new_journal_file_name_is_durable_after_its_first_sync(tmp_path: Path) -> None:
    """Power loss (:class:`PowerLossFiles`): the first sync of a new journal fsyncs the
    directory too; before, the file's bytes were durable and its name was not, so a power
    cut lost every acknowledged item of a queue created since the last rotation."""
    data = tmp_path / "data"
    data.mkdir()
    ops = PowerLossFiles(str(data), str(tmp_path / "shadow"))
    j = journal(data, "q", DataDir(str(data), ops=ops))
    j.add(1, 1, 0, b"acked")
    j.write_out()
    j.sync()  # what a sync_journal = true reply waits for
    os.close(os.open(data / "q", os.O_RDONLY))  # the journal is abandoned: a power cut
    power_loss(str(data), str(tmp_path / "shadow"), random.Random(1), "drop")
    assert replayed(data, "q") == [b"acked"]


def test_rotation_leaves_the_directory_fsync_to_the_next_sync_and_delete_fsyncs_nothing(
    tmp_path: Path,
) -> None:
    """The event loop's share of slow calls (issue 21): a rotation no longer fsyncs the
    directory itself (the next sync of the journal does, with the records it makes durable:
    a periodic sync in its worker thread), and deleting a queue does not fsync files it is
    about to unlink."""
    faults = FaultyFiles()
    j = journal(tmp_path, "q", DataDir(str(tmp_path), ops=faults))
    j.add(1, 1, 0, b"one")
    j.sync()  # the new file's first sync: its data and the directory
    assert (faults.calls["fdatasync"], faults.calls["fsync"]) == (1, 1)
    j.add(2, 2, 0, b"two")
    assert j.rotate()
    assert (faults.calls["fdatasync"], faults.calls["fsync"]) == (2, 1)  # the old file only
    j.add(3, 3, 0, b"three")
    j.write_out()
    j.sync()
    assert (faults.calls["fdatasync"], faults.calls["fsync"]) == (3, 2)  # and the directory
    j.add(4, 4, 0, b"four")
    j.write_out()
    j.sync()
    assert (faults.calls["fdatasync"], faults.calls["fsync"]) == (4, 2)  # once per new file
    j.erase()
    assert (faults.calls["fdatasync"], faults.calls["fsync"]) == (4, 2)
    assert faults.calls["unlink"] >= 2 and not list(tmp_path.glob("q*"))


def _parked(tmp_path: Path, files: DataDir, q: FileJournal) -> list[FileJournal]:
    """Use two other journals (a pool of two) so that ``q``'s descriptor is parked; they
    are returned, to be closed."""
    others = [journal(tmp_path, name, files) for name in ("o1", "o2")]
    for other in others:
        other.add(1, 1, 0, other.name.encode())
        other.write_out()
    assert not q.holds_descriptor  # parked
    return others


def test_a_parked_journal_out_of_descriptors_refuses_that_record_and_goes_on(
    tmp_path: Path,
) -> None:
    """The record that would need a reopen is refused before it is taken (TooManyOpenFiles:
    ``SERVER_ERROR too many open files``), the journal is not failed, and once descriptors
    are there again the next record goes in. Before: the record was buffered, its write
    could not reopen the file, and the journal refused every later append until a restart
    ("open failed", found by ``bench/soak.py --emfile``)."""
    faults = FaultyFiles()
    files = DataDir(str(tmp_path), max_open=2, ops=faults)
    q = journal(tmp_path, "q", files)
    q.add(1, 1, 0, b"kept")
    q.write_out()
    others = _parked(tmp_path, files, q)
    faults.fail("open", errno.EMFILE, path=str(tmp_path / "q"))
    with pytest.raises(TooManyOpenFiles):
        q.add(2, 2, 0, b"refused")
    with pytest.raises(TooManyOpenFiles):
        q.remove()
    assert not q.failed and q.write_out() == 0 and files.stats()["refused"] == 2
    faults.clear()
    q.add(2, 2, 0, b"later")
    q.write_out()
    for j in (q, *others):
        j.close()
    files.close()
    assert replayed(tmp_path, "q") == [b"kept", b"later"]


def test_a_journal_parked_with_records_buffered_writes_them_first(tmp_path: Path) -> None:
    """The pool parks a journal whose records wait for the group commit by writing them
    first (and running its due group fsync): the group commit then needs no reopen, which
    could fail, and one pass can write to more queues than the pool holds."""
    faults = FaultyFiles()
    files = DataDir(str(tmp_path), max_open=1, ops=faults)
    q = journal(tmp_path, "q", files)
    q.add(1, 1, 0, b"buffered")
    q.write_out()
    q.sync()  # the new file's name is durable: q may be parked with a sync due
    q.add(2, 2, 0, b"also")
    other = journal(tmp_path, "other", files)  # beyond the pool: q is parked
    assert not q.holds_descriptor and faults.calls["pwritev"] == 2
    faults.fail("open", errno.EMFILE, path=str(tmp_path / "q"))
    assert q.write_out() == 0  # nothing left to write: no reopen
    faults.clear()
    q.add(3, 3, 0, b"synced")  # reopens (other is parked in turn) ...
    q.write_out()
    q.sync_due = True  # ... what the committer sets for a sync_journal = true group
    other.add(1, 1, 0, b"o")  # q is parked again: fdatasynced first
    assert not q.holds_descriptor and faults.calls["fdatasync"] == 2
    faults.fail("open", errno.EMFILE, path=str(tmp_path / "q"))
    q.sync()  # the group's fsync: done already, no reopen
    assert not q.failed and faults.calls["fdatasync"] == 2
    faults.clear()
    for j in (q, other):
        j.close()
    files.close()
    assert replayed(tmp_path, "q") == [b"buffered", b"also", b"synced"]


def test_a_rotation_out_of_descriptors_is_put_off(tmp_path: Path) -> None:
    """No descriptor for the new file: the old one is renamed back and stays current, the
    rotation is put off, the journal goes on and rotates later. Before: "rotation failed:
    Too many open files", and the queue refused every write until a restart."""
    faults = FaultyFiles()
    files = DataDir(str(tmp_path), max_open=2, ops=faults)
    q = journal(tmp_path, "q", files)
    q.add(1, 1, 0, b"one")
    faults.fail("open", errno.EMFILE, path=str(tmp_path / "q"))
    assert not q.rotate()
    assert (q.rotations, q.rotations_put_off, q.failed) == (0, 1, False)
    assert files.stats()["put_off"] == 1  # the journal_files_put_off stat
    fdatasyncs = faults.calls["fdatasync"]
    assert not q.rotate()  # not tried again until more is written: no fdatasync, no rename
    assert (q.rotations_put_off, faults.calls["fdatasync"]) == (1, fdatasyncs)
    assert sorted(p.name for p in tmp_path.glob("q*")) == ["q"]
    q.add(2, 2, 0, b"two")
    q.write_out()
    faults.clear()
    assert q.rotate()
    q.add(3, 3, 0, b"three")
    q.close()
    files.close()
    assert sorted(p.name for p in tmp_path.glob("q*")) == ["q", "q.1"]
    assert replayed(tmp_path, "q") == [b"one", b"two", b"three"]


def test_a_group_fsync_needs_no_reopen_after_its_journal_was_parked(tmp_path: Path) -> None:
    """``sync_journal = true``: a journal whose buffered records the pool parks before the
    pass (another queue's request needed its descriptor) is written and fdatasynced by the
    park; the group commit then writes and syncs nothing more of it, so with no descriptor
    to reopen it the replies still go out. Before, the park wrote the records but left the
    sync to the group, whose reopen failed the journal for good ("fsync failed")."""
    faults = FaultyFiles()
    files = DataDir(str(tmp_path), max_open=1, ops=faults)
    released: list[bytes] = []

    class Conn(CommitHolder):
        def release(self, data: bytes) -> None:
            released.append(data)

        def fail(self) -> None:
            released.append(b"FAILED")

    async def main() -> None:
        committer = Committer(asyncio.get_running_loop(), lambda _: 0)

        def open_journal(name: str) -> FileJournal:
            j = FileJournal(str(tmp_path), name, directory=files, on_dirty=committer.journal_dirty)
            j.replay(Recorder())
            return j

        q = open_journal("q")
        q.add(1, 1, 0, b"one")
        committer.run(inline=True)  # q's file and its name are durable
        q.add(2, 2, 0, b"two")
        committer.hold(Conn(), b"STORED")
        other = open_journal("other")  # its new file takes the pool's one place: q is parked
        other.add(1, 1, 0, b"o")
        assert not q.holds_descriptor
        faults.fail("open", errno.EMFILE, path=str(tmp_path / "q"))
        committer.run(inline=True)
        assert not q.failed
        faults.clear()
        for j in (q, other):
            j.close()
        committer.close()

    asyncio.run(main())
    files.close()
    assert released == [b"STORED"]
    assert replayed(tmp_path, "q") == [b"one", b"two"]


def test_reads_returned_out_of_descriptors_go_back_at_the_next_try(tmp_path: Path) -> None:
    """Open reads returned (their connection closed, their lease ran out) while their queue's
    parked file cannot be reopened: the ABORT records cannot be journaled, so the items stay
    taken, and the return is tried again (the server's sweep calls ``retry_returns``) until
    it goes in. Before: they stayed open until a restart ("reads of q not returned")."""
    faults = FaultyFiles()
    files = DataDir(str(tmp_path), max_open=2, ops=faults)
    coll = collection(tmp_path, files)
    for data in (b"a", b"b", b"c"):
        assert coll.add("q", data, None, 1)
    q = coll.queue("q")
    assert q is not None
    table = ReservationTable()
    owner = object()
    taken = [table.take(q, 1, owner=owner) for _ in range(2)]
    assert [r.item.data for r in taken if r is not None] == [b"a", b"b"]
    q.log.write_out()
    others = _parked(tmp_path, files, q.log)  # type: ignore[arg-type]
    faults.fail("open", errno.EMFILE, path=str(tmp_path / "q"))
    assert table.release_owner(owner) == 0  # not journaled: still taken, nothing lost
    assert (q.open_reads, len(q), len(table), q.log.failed) == (2, 1, 0, False)
    assert table.retry_returns() == 0  # still no descriptor
    faults.clear()
    assert table.retry_returns() == 2 and table.retry_returns() == 0
    assert (q.open_reads, len(q)) == (0, 3)
    assert [q.remove(1).data for _ in range(3)] == [b"a", b"b", b"c"]  # type: ignore[union-attr]
    for j in others:
        j.close()
    coll.close()
