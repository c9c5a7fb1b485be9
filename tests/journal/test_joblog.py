"""The beanstalkd job log (journal/joblog.py) under the job store: replay, torn tails,
rotation, compaction and a crash at each of its fail points."""

from __future__ import annotations

import dataclasses
import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tercel
from tercel.clock import ManualClock
from tercel.core.tubes import BURIED, DELAYED, READY, JobRecord, JobStore, Worker
from tercel.errors import JournalCorrupt, JournalWriteError
from tercel.journal.append import PREALLOCATE_FIRST
from tercel.journal.faults import CRASH_EXIT, JOB_COMPACTION_CRASHES, FaultyFiles
from tercel.journal.joblog import JobJournal
from tercel.journal.jobrecords import HEADER


def _open(
    path: Path, clock: ManualClock, max_file_size: int = 1 << 20
) -> tuple[JobStore, JobJournal]:
    journal = JobJournal(str(path), max_file_size)
    found = journal.replay()
    store = JobStore(clock, journal)
    for job in found.jobs:
        store.restore(JobRecord(*[getattr(job, f.name) for f in dataclasses.fields(JobRecord)]))
    store.next_id = max(store.next_id, found.next_id)
    return store, journal


def _worker(store: JobStore) -> Worker:
    return store.connect(lambda job, why: None)


def _states(store: JobStore) -> dict[int, tuple[str, int, int, bytes]]:
    return {j.id: (j.tube.name, j.state, j.pri, j.body) for j in store.jobs.values()}


def test_replay_restores_states_ids_and_deadlines(tmp_path: Path) -> None:
    clock = ManualClock()
    store, journal = _open(tmp_path, clock)
    w = _worker(store)
    store.use(w, "a.b/c;(d)")
    store.watch(w, "a.b/c;(d)")
    for i in range(6):
        store.put(w, i, 0, 60, b"job%d" % i)
    store.put(w, 9, 30, 60, b"delayed")
    for _ in range(4):
        store.reserve(w, 0)
    store.bury(w, 2, 100)
    store.bury(w, 1, 100)
    store.release(w, 3, 7, 0)
    store.delete(w, 4)  # reserved by w; job 5 and 6 stay ready
    expected = _states(store)
    assert expected[3][1:3] == (READY, 7)
    assert expected[1][1] == BURIED and 4 not in expected
    journal.write_out()
    journal.close()
    assert sorted(os.listdir(tmp_path)) == ["jobs.1", "lock"]  # no tube name became a path

    clock.jump(10_000)  # a new process: 10 s of wall time later, another monotonic origin
    store2, journal2 = _open(tmp_path, clock)
    assert _states(store2) == expected
    assert store2.time_left(store2.jobs[7]) == 20
    assert store2.jobs[7].state == DELAYED
    w2 = _worker(store2)
    store2.use(w2, "a.b/c;(d)")
    peeked = store2.peek_buried(w2)
    assert peeked is not None and peeked.id == 2  # bury order kept
    assert store2.put(w2, 0, 0, 1, b"new").id == 8
    journal2.close()


def test_deleted_last_job_id_is_not_reused(tmp_path: Path) -> None:
    clock = ManualClock()
    store, journal = _open(tmp_path, clock)
    w = _worker(store)
    store.put(w, 0, 0, 1, b"a")
    store.delete(w, 1)
    journal.close()
    store, journal = _open(tmp_path, clock)
    assert store.put(_worker(store), 0, 0, 1, b"b").id == 2
    journal.close()


def test_torn_tail_is_cut_and_middle_damage_stops_startup(tmp_path: Path) -> None:
    clock = ManualClock()
    store, journal = _open(tmp_path, clock)
    w = _worker(store)
    store.put(w, 0, 0, 1, b"a" * 100)
    store.put(w, 0, 0, 1, b"b" * 100)
    journal.close()
    path = tmp_path / "jobs.1"
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    store, journal = _open(tmp_path, clock)
    assert list(store.jobs) == [1]
    assert path.stat().st_size < len(data) - 10
    journal.close()
    damaged = bytearray(path.read_bytes())
    damaged[len(HEADER) + 20] ^= 0xFF
    path.write_bytes(bytes(damaged))
    (tmp_path / "jobs.2").write_bytes(HEADER)
    with pytest.raises(JournalCorrupt):
        _open(tmp_path, clock)


def test_rotation_and_compaction_keep_the_state(tmp_path: Path) -> None:
    clock = ManualClock()
    store, journal = _open(tmp_path, clock, max_file_size=4096)
    w = _worker(store)
    for i in range(600):
        store.put(w, i % 7, 0, 60, b"%d" % i)
        journal.write_out()
        if i % 3:
            store.delete(w, i + 1)
            journal.write_out()
    assert store.compactions >= 1
    expected = _states(store)
    journal.close()
    names = os.listdir(tmp_path)
    assert any(n.startswith("snapshot.") for n in names)
    store2, journal2 = _open(tmp_path, clock, max_file_size=4096)
    assert _states(store2) == expected
    assert store2.next_id == 601
    journal2.close()


def test_a_snapshot_larger_than_one_vectored_write(tmp_path: Path) -> None:
    """A snapshot of more records than one ``pwritev`` takes (IOV_MAX pieces) is written in
    several, whole (a snapshot that overran the limit once failed every compaction with
    EINVAL)."""
    clock = ManualClock()
    store, journal = _open(tmp_path, clock)
    w = _worker(store)
    for i in range(1500):
        store.put(w, i % 5, 0, 60, b"job %d" % i)
    journal.write_out()
    expected = _states(store)
    now = clock.monotonic_ms()
    store.log.compact(store.next_id, (store.record(j, now) for j in store.snapshot()))
    journal.close()
    store2, journal2 = _open(tmp_path, clock)
    assert _states(store2) == expected
    assert store2.next_id == 1501
    journal2.close()


def test_each_job_knows_the_file_of_its_record(tmp_path: Path) -> None:
    """``stats-job``'s ``file``: the jobs.<n> a job's JOB record went to, the snapshot.<n>
    that holds it after a compaction, and the same numbers after a restart."""
    clock = ManualClock()
    store, journal = _open(tmp_path, clock, max_file_size=4096)
    w = _worker(store)
    first = store.put(w, 0, 0, 60, b"a" * 100)
    journal.write_out()
    assert first.file == 1
    while journal.seq == 1:  # fill jobs.1 until the log rotates
        store.put(w, 0, 0, 60, b"b" * 100)
        journal.write_out()
    later = store.put(w, 0, 0, 60, b"c")
    assert later.file == 2
    store.bury(w, store.reserve(w, 0)[0].id, 5)  # a state change does not move the record
    journal.write_out()
    assert first.file == 1
    journal.close()
    store2, journal2 = _open(tmp_path, clock, max_file_size=4096)
    assert (store2.jobs[first.id].file, store2.jobs[later.id].file) == (1, 2)
    journal2.rotate()
    assert store2.maybe_compact() is False  # the log is small: compacted only on request
    covered = journal2.compact(
        store2.next_id, (store2.record(j, clock.monotonic_ms()) for j in store2.snapshot())
    )
    journal2.close()
    store3, journal3 = _open(tmp_path, clock, max_file_size=4096)
    assert {j.file for j in store3.jobs.values()} == {covered}
    assert store3.put(_worker(store3), 0, 0, 60, b"d").file == journal3.seq == covered + 1
    journal3.close()


def test_store_compaction_renumbers_the_jobs(tmp_path: Path) -> None:
    clock = ManualClock()
    store, journal = _open(tmp_path, clock, max_file_size=4096)
    w = _worker(store)
    for i in range(600):
        store.put(w, 0, 0, 60, b"%d" % i)
        journal.write_out()
        if i % 3:
            store.delete(w, i + 1)
            journal.write_out()
    assert store.compactions >= 1
    snaps = [int(n.split(".")[1]) for n in os.listdir(tmp_path) if n.startswith("snapshot.")]
    assert snaps and all(1 <= j.file <= journal.seq for j in store.jobs.values())
    assert min(j.file for j in store.jobs.values()) == max(snaps)
    journal.close()


def test_zeros_written_ahead_once_synced_are_cut_or_ignored(tmp_path: Path) -> None:
    """The job log shares the queue journals' write-ahead of zeros (journal/append.py): after
    the first sync each growing write also zeroes the next step; a clean close cuts them, and
    a restart after a crash reads them as the end of the data, not as a torn tail."""
    clock = ManualClock()
    store, journal = _open(tmp_path, clock)
    w = _worker(store)
    store.put(w, 0, 0, 60, b"a")
    journal.write_out()
    journal.sync()
    store.put(w, 0, 0, 60, b"b")
    journal.write_out()
    path = tmp_path / "jobs.1"
    data = path.read_bytes()
    assert len(data) == journal.size + PREALLOCATE_FIRST
    assert data[journal.size :] == bytes(PREALLOCATE_FIRST)
    # A crash now (the descriptor dropped, nothing cut): the zeros are no torn tail.
    copy = tmp_path / "crashed"
    copy.mkdir()
    (copy / "jobs.1").write_bytes(data)
    store2, journal2 = _open(copy, clock)
    assert sorted(store2.jobs) == [1, 2]
    assert (copy / "jobs.1").stat().st_size == journal.size
    journal2.close()
    journal.close()
    assert path.stat().st_size == len(data) - PREALLOCATE_FIRST


def test_a_failed_write_fails_the_log_for_good(tmp_path: Path) -> None:
    faults = FaultyFiles()
    journal = JobJournal(str(tmp_path), 1 << 20, ops=faults)
    journal.replay()
    store = JobStore(ManualClock(), journal)
    w = _worker(store)
    store.put(w, 0, 0, 60, b"kept")
    journal.write_out()
    faults.fail("pwritev", errno.ENOSPC, times=1)
    store.put(w, 0, 0, 60, b"lost")
    with pytest.raises(JournalWriteError):
        journal.write_out()
    assert journal.failed
    with pytest.raises(JournalWriteError):
        store.put(w, 0, 0, 60, b"refused")
    journal.close()
    store2, journal2 = _open(tmp_path, ManualClock())
    assert [j.body for j in store2.jobs.values()] == [b"kept"]
    journal2.close()


def test_out_of_descriptors_puts_rotation_and_compaction_off(tmp_path: Path) -> None:
    """No descriptor for the next file: the log stays in its current file (rotation and
    compaction put off, nothing failed, every reply still possible) and rotates once there
    is one. Before: the rotation closed the current file first, its open raised EMFILE out
    of the group commit's write, and the log was left without a file."""
    faults = FaultyFiles()
    journal = JobJournal(str(tmp_path), 4096, ops=faults)
    journal.replay()
    store = JobStore(ManualClock(), journal)
    w = _worker(store)
    faults.fail("open", errno.EMFILE)  # every open from now on (the directory's is held)
    for i in range(100):
        store.put(w, 0, 0, 60, b"job %d " % i + b"x" * 100)
        journal.write_out()
    assert (journal.seq, journal.failed) == (1, False) and journal.put_off >= 2
    jobs = (store.record(j, store.clock.monotonic_ms()) for j in store.snapshot())
    assert store.log.compact(store.next_id, jobs) is None
    assert sorted(os.listdir(tmp_path)) == ["jobs.1", "lock"]
    faults.clear()
    store.put(w, 0, 0, 60, b"last")
    journal.write_out()
    assert journal.seq == 2
    expected = _states(store)
    journal.close()
    store2, journal2 = _open(tmp_path, ManualClock(), max_file_size=4096)
    assert _states(store2) == expected and len(expected) == 101
    journal2.close()


_CRASH = """
import sys
sys.path.insert(0, {src!r})
from tercel.clock import ManualClock
from tercel.core.tubes import JobStore
from tercel.journal.faults import JOB_COMPACTION_CRASHES, FaultyFiles
from tercel.journal.joblog import JobJournal
faults = FaultyFiles()
JOB_COMPACTION_CRASHES[{point!r}](faults)
journal = JobJournal({path!r}, 1 << 20, ops=faults)
journal.replay()
store = JobStore(ManualClock(), journal)
w = store.connect(lambda job, why: None)
for i in range(50):
    store.put(w, i, 0, 60, b"x%d" % i)
for i in range(1, 40):
    store.delete(w, i)
store.reserve(w, 0)
store.bury(w, 40, 1)
journal.write_out()
now = store.clock.monotonic_ms()
store.log.compact(store.next_id, (store.record(j, now) for j in store.snapshot()))
"""


@pytest.mark.parametrize("point", JOB_COMPACTION_CRASHES)
def test_crash_at_every_compaction_step(tmp_path: Path, point: str) -> None:
    """A crash in each window of a compaction (through the file seam, journal/faults.py)
    loses nothing: the next start finds the state of before or after it."""
    src = str(Path(tercel.__file__).resolve().parents[1])  # the tercel this test imports
    script = _CRASH.format(src=src, path=str(tmp_path), point=point)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], check=False)
    assert done.returncode == CRASH_EXIT
    store, journal = _open(tmp_path, ManualClock())
    assert sorted(store.jobs) == list(range(40, 51))
    assert store.jobs[40].state == BURIED
    assert store.next_id == 51
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    journal.close()
