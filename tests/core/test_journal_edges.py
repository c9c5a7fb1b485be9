"""A queue on a real file journal at the edges a review found: a torn tail cut at start-up
while read-behind had already read it, a snapshot written while the loop goes on, and a
delete while a compaction and a periodic fsync are both in flight.

The server runs snapshots on a worker thread and hands the result back to the loop; here
``background`` keeps the work until the test runs it, so "meanwhile" is exact.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from tercel.clock import ManualClock
from tercel.config import QueueConfig
from tercel.core.queue import PersistentQueue, QItem
from tercel.journal import FileJournal

Work = tuple[Callable[[], None], Callable[[BaseException | None], None]]


def open_queue(
    path: Path, config: QueueConfig, pending: list[Work] | None = None
) -> PersistentQueue:
    def background(work: Callable[[], None], done: Callable[[BaseException | None], None]) -> None:
        assert pending is not None
        pending.append((work, done))

    log = FileJournal(str(path), "q", background=background if pending is not None else None)
    q = PersistentQueue("q", config, log, ManualClock())
    q.replay()
    return q


def item(i: int) -> bytes:
    return (b"item-%03d" % i).ljust(50, b".")


def drain(q: PersistentQueue) -> list[bytes]:
    out = []
    while (got := q.remove()) is not None:
        out.append(got.data)
    return out


def drain_n(q: PersistentQueue, n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        got = q.remove()
        assert got is not None
        out.append(got.data)
    return out


def test_a_torn_tail_read_ahead_before_it_was_cut_is_read_again(tmp_path: Path) -> None:
    config = QueueConfig(max_memory_size=100, sync_journal=0)
    q = open_queue(tmp_path, config)
    q.add(item(0))
    q.log.sync()  # a synced journal writes zeros ahead of its records
    for i in range(1, 20):
        q.add(item(i))  # two in memory, the rest on disk (read-behind)
    assert drain_n(q, 5) == [item(i) for i in range(5)]
    torn_at = q.log.position()[1]
    q.add(b"X" * 50)
    # A crash: nothing is closed, and only the start of the last record reached the disk.
    with open(tmp_path / "q", "r+b") as fh:
        fh.seek(torn_at + 40)
        fh.write(b"\0" * 43)
    q = open_queue(tmp_path, config)  # replay reads items back (and the torn bytes) and cuts
    assert len(q) == 15
    for i in range(20, 25):
        q.add(item(i))  # written where the torn record was
    assert drain(q) == [item(i) for i in range(5, 25)]


def test_a_snapshot_has_the_delivery_counts_of_when_it_was_taken(tmp_path: Path) -> None:
    pending: list[Work] = []
    dead: list[tuple[bytes, int]] = []
    config = QueueConfig(max_deliveries=2)

    def on_dead_letter(_: PersistentQueue, it: QItem) -> bool:
        dead.append((it.data, it.deliveries))
        return True

    q = open_queue(tmp_path, config, pending)
    q.add(b"job-A")
    q.add(b"job-B")
    assert q.compact()  # the snapshot of [A, B] is written later, "on the worker"
    opened = q.remove_open()  # meanwhile a consumer opens A: its first delivery
    assert opened is not None and opened[1].deliveries == 1
    work, done = pending.pop()
    work()
    done(None)
    q.close()
    q = open_queue(tmp_path, config, [])
    q.on_dead_letter = on_dead_letter
    head = q.peek()  # A's open read came back to the head at replay
    assert head is not None and (head.data, head.deliveries) == (b"job-A", 1)
    again = q.remove_open()
    assert again is not None and again[1].data == b"job-A"  # one delivery left, not dropped
    assert dead == []


def test_a_queue_deleted_during_a_compaction_stays_deleted(tmp_path: Path) -> None:
    pending: list[Work] = []
    config = QueueConfig(max_journal_size=200, max_journal_overflow=1)
    q = open_queue(tmp_path, config, pending)
    for i in range(40):
        q.add(b"secret-%d" % i)
    for _ in range(20):
        q.remove()
    while not q.log.compacting:  # the rules start a compaction
        q.add(b"secret-x")
        q.remove()
    assert isinstance(q.log, FileJournal)
    q.log.syncing = True  # a periodic fsync (sync_journal = "<period>") is in flight too
    q.erase()  # delete q: its close waits for that fsync
    work, done = pending.pop()
    work()
    done(None)  # the compaction ends: nothing may come back
    q.log.sync_done()
    assert os.listdir(tmp_path) == []
    assert len(open_queue(tmp_path, config)) == 0
