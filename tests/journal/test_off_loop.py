"""File work off the owner's thread: a rotation's fdatasync of a large unsynced file, a
compaction's switch-over, an erase's unlinks (issue 21; journal_format.md §12, §13).

The journals here get a background runner that only queues the work (:class:`Deferred`), so a
test sees what happened on the owner's thread before the worker ran, and a file seam that
notes on which side each operation ran (:class:`Sides`).
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from recorder import Recorder

from tercel.errors import JournalWriteError
from tercel.journal import FileJournal
from tercel.journal.faults import FaultyFiles
from tercel.journal.files import DataDir
from tercel.journal.journal import PRESYNC

T = TypeVar("T")


class Deferred:
    """A background runner that queues ``(work, done)`` until :meth:`run`; the worker side
    is flagged on the seam while the work runs."""

    def __init__(self, sides: Sides) -> None:
        self.jobs: list[tuple[Callable[[], None], Callable[[BaseException | None], None]]] = []
        self.sides = sides

    def __call__(
        self, work: Callable[[], None], done: Callable[[BaseException | None], None]
    ) -> None:
        self.jobs.append((work, done))

    def run(self) -> None:
        """Run the work queued, each ``done`` right after its work."""
        while self.jobs:
            self.run_work()()

    def run_work(self) -> Callable[[], None]:
        """Run the next work; return its ``done`` call, for the caller to make."""
        work, done = self.jobs.pop(0)
        self.sides.worker = True
        try:
            work()
        except Exception as exc:
            error: BaseException | None = exc
        else:
            error = None
        finally:
            self.sides.worker = False
        return lambda: done(error)


class Sides(FaultyFiles):
    """Notes ``(side, op, file name)`` of every operation; side is "worker" or "loop"."""

    def __init__(self) -> None:
        super().__init__()
        self.worker = False
        self.log: list[tuple[str, str, str]] = []

    def run(self, op: str, path: str, call: Callable[[], T]) -> T:
        self.log.append(("worker" if self.worker else "loop", op, Path(path).name))
        return super().run(op, path, call)

    def ran(self, op: str, side: str) -> list[str]:
        """The files ``op`` ran on, on ``side`` (not the checkpoint file, which a replay and
        an erase unlink on the loop if it is there: it is small)."""
        return [
            name
            for s, o, name in self.log
            if o == op and s == side and not name.endswith(".checkpoint")
        ]


def journal(path: Path, sides: Sides, deferred: Deferred) -> FileJournal:
    j = FileJournal(
        str(path),
        "q",
        on_dirty=lambda _: None,
        background=deferred,
        directory=DataDir(str(path), ops=sides),
    )
    j.replay(Recorder())
    return j


def items(path: Path) -> list[bytes]:
    sink = Recorder()
    j = FileJournal(str(path), "q")
    j.replay(sink)
    j.close()
    return [e[-1] for e in sink.events if e[0] == "add"]  # type: ignore[misc]


def fill(j: FileJournal, first: int, count: int, size: int = 1000) -> list[bytes]:
    data = [b"%06d" % (first + i) + b"." * (size - 6) for i in range(count)]
    for i, d in enumerate(data):
        j.add(first + i, 1, 0, d)
    j.write_out()
    return data


@pytest.fixture
def sides() -> Sides:
    return Sides()


def test_a_rotation_syncs_a_large_unsynced_file_on_the_worker_first(
    tmp_path: Path, sides: Sides
) -> None:
    deferred = Deferred(sides)
    j = journal(tmp_path, sides, deferred)
    sent = fill(j, 1, PRESYNC // 1000 + 10)
    assert j.rotate() is False  # the bulk is synced off the loop first
    assert j.syncing and not (tmp_path / "q.1").exists()
    assert sides.ran("fdatasync", "loop") == []
    sent += fill(j, 1000, 5)  # appends go on meanwhile, to the same file
    deferred.run()
    assert not j.syncing and sides.ran("fdatasync", "worker") == ["q"]
    assert j.rotate() is True
    # What came during the worker's sync is synced on the loop, before the rename.
    assert sides.ran("fdatasync", "loop") == ["q"]
    ops = [(s, o) for s, o, _ in sides.log if o in {"fdatasync", "rename"}]
    assert ops == [("worker", "fdatasync"), ("loop", "fdatasync"), ("loop", "rename")]
    sent += fill(j, 2000, 3)
    j.close()
    assert items(tmp_path) == sent


def test_a_small_unsynced_tail_is_rotated_at_once(tmp_path: Path, sides: Sides) -> None:
    deferred = Deferred(sides)
    j = journal(tmp_path, sides, deferred)
    fill(j, 1, 10)
    assert j.rotate() is True and not deferred.jobs
    j.close()


def test_a_failed_sync_before_a_rotation_fails_the_journal(tmp_path: Path, sides: Sides) -> None:
    deferred = Deferred(sides)
    j = journal(tmp_path, sides, deferred)
    sent = fill(j, 1, PRESYNC // 1000 + 10)
    sides.fail("fdatasync", errno.EIO, times=1)
    assert j.rotate() is False
    deferred.run()
    assert j.failed and not j.syncing
    with pytest.raises(JournalWriteError):
        j.add(9999, 1, 0, b"refused")
    assert j.rotate() is False
    j.close()
    assert items(tmp_path) == sent  # written before the failure: readable after a restart


def test_a_close_during_the_sync_waits_for_it(tmp_path: Path, sides: Sides) -> None:
    deferred = Deferred(sides)
    j = journal(tmp_path, sides, deferred)
    sent = fill(j, 1, PRESYNC // 1000 + 10)
    assert j.rotate() is False
    j.close()  # deferred to the end of the sync: the descriptor is the worker's
    assert not j.closed
    deferred.run()
    assert j.closed
    assert items(tmp_path) == sent


def rotated_files(tmp_path: Path, sides: Sides, deferred: Deferred) -> FileJournal:
    j = journal(tmp_path, sides, deferred)
    for n in range(3):
        fill(j, n * 10 + 1, 10)
        assert j.rotate()
    fill(j, 100, 5)
    return j


def test_an_erase_frees_the_names_at_once_and_unlinks_on_the_worker(
    tmp_path: Path, sides: Sides
) -> None:
    deferred = Deferred(sides)
    j = rotated_files(tmp_path, sides, deferred)
    j.erase()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["q~~gone.1", "q~~gone.2", "q~~gone.3", "q~~gone.4"]
    assert sides.ran("unlink", "loop") == []  # (no checkpoint was written)
    # A new queue of the same name before the worker ran: its files are its own.
    again = FileJournal(str(tmp_path), "q", on_dirty=lambda _: None)
    again.replay(Recorder())
    fill(again, 1, 3)
    again.close()
    deferred.run()
    assert sorted(sides.ran("unlink", "worker")) == [
        "q~~gone.1",
        "q~~gone.2",
        "q~~gone.3",
        "q~~gone.4",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q"]
    assert len(items(tmp_path)) == 3


def test_a_crash_before_the_worker_unlinked_leaves_no_queue(tmp_path: Path, sides: Sides) -> None:
    deferred = Deferred(sides)
    j = rotated_files(tmp_path, sides, deferred)
    j.erase()  # and the worker never runs: the process died
    listing = DataDir(str(tmp_path))
    assert listing.queue_names() == []  # no queue comes back
    assert listing.remove_orphans() == 4  # what a server's start does
    assert list(tmp_path.iterdir()) == []


def test_a_queue_of_that_name_removes_them_too(tmp_path: Path, sides: Sides) -> None:
    deferred = Deferred(sides)
    j = rotated_files(tmp_path, sides, deferred)
    j.erase()
    assert items(tmp_path) == []  # a new queue "q": its replay removes q~~ temporaries
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q"]


def compacted(tmp_path: Path, sides: Sides, deferred: Deferred) -> tuple[FileJournal, list[bytes]]:
    """A journal with three older files and a compaction started, its work not run yet."""
    j = rotated_files(tmp_path, sides, deferred)
    live = [b"%06d" % 100 + b"." * 994]
    assert j.compact(200, 0, [], [_Item(100, live[0])], None)
    assert j.compacting and deferred.jobs
    return j, live


class _Item:
    def __init__(self, item_id: int, data: bytes) -> None:
        self.id = item_id
        self.add_time = 1
        self.expiry = 0
        self.data = data
        self.deliveries = 0


def test_the_compaction_switch_over_runs_on_the_worker(tmp_path: Path, sides: Sides) -> None:
    deferred = Deferred(sides)
    j, _ = compacted(tmp_path, sides, deferred)
    sides.log.clear()  # (the replay at the start unlinked a checkpoint that was not there)
    deferred.run()
    assert j.compactions == 1 and not j.compacting and not j.failed
    on_loop = [
        (o, n) for s, o, n in sides.log if s == "loop" and o in {"rename", "unlink", "fsync"}
    ]
    assert on_loop == []
    assert sides.ran("rename", "worker") == ["q~~4"]  # the snapshot over the newest older file
    assert sorted(sides.ran("unlink", "worker")) == ["q.1", "q.2", "q.3"]
    assert sides.ran("fsync", "worker").count(tmp_path.name) == 2  # the directory, twice
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q", "q.4"]
    j.close()
    assert items(tmp_path) == [b"%06d" % 100 + b"." * 994]


def test_an_erase_during_a_compaction_never_renames_its_snapshot(
    tmp_path: Path, sides: Sides
) -> None:
    deferred = Deferred(sides)
    j, _ = compacted(tmp_path, sides, deferred)
    j.erase()
    deferred.run()
    assert j.compactions == 0
    assert sides.ran("rename", "worker") == []
    assert list(tmp_path.iterdir()) == []
    assert items(tmp_path) == []


def test_an_erase_after_the_switch_over_before_its_done_call(tmp_path: Path, sides: Sides) -> None:
    deferred = Deferred(sides)
    j, _ = compacted(tmp_path, sides, deferred)
    done = deferred.run_work()  # switched over on the worker
    j.erase()  # before the loop heard of it
    done()
    deferred.run()  # the erase's unlinks
    assert j.compactions == 0 and not j.compacting and not j.failed
    assert list(tmp_path.iterdir()) == []


def test_out_of_descriptors_in_the_worker_the_loop_finishes_the_switch_over(
    tmp_path: Path, sides: Sides
) -> None:
    deferred = Deferred(sides)
    j, _ = compacted(tmp_path, sides, deferred)
    # The directory's open fails once on the worker (EMFILE): the loop does the rest with
    # the descriptor pool, which frees one when it must (the compaction does not fail).
    sides.fail("open", errno.EMFILE, path=str(tmp_path), times=1, armed_by=("rename", "~~"))
    deferred.run()
    assert j.compactions == 1 and not j.failed
    assert sides.ran("unlink", "loop") == ["q.1", "q.2", "q.3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q", "q.4"]
    j.close()
