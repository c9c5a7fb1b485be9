"""Replay of a queue that was in read-behind or compacted must rebuild exactly the live
queue's state.

Regression (found by ``test_queue_model.py::TestQueuePagingOnFileJournal``): a REMOVE replayed
while memory was empty refilled with a budget of bytes only, read ADD records the replay had
not reached yet, drove ``disk_items`` negative and failed start-up with "-1 items missing
from the log". Siblings: a snapshot's window put partly on disk lost its DELIVERED counts, and
a snapshot's OPEN records wound the xid counter back.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tercel.clock import ManualClock
from tercel.config import QueueConfig
from tercel.core.queue import PersistentQueue
from tercel.journal import FileJournal, MemoryJournal

T0 = 1_700_000_000_000


class Restartable:
    """A queue with a 12-byte memory window on a file (or RAM) journal that can restart;
    ``tiny_log`` also gives it the model test's tiny journal limits (compaction at once)."""

    def __init__(self, kind: str, path: Path, *, tiny_log: bool = False, **config: object) -> None:
        self.kind = kind
        self.path = path
        self.memory = MemoryJournal()
        self.logs: list[FileJournal] = []
        self.clock = ManualClock(T0)
        self.config = dataclasses.replace(QueueConfig(**config), max_memory_size=12)  # type: ignore[arg-type]
        if tiny_log:
            self.config = dataclasses.replace(
                self.config, max_journal_size=64, max_journal_overflow=2
            )
        self.q = self.build()

    def build(self) -> PersistentQueue:
        log: MemoryJournal | FileJournal = self.memory
        if self.kind == "file":
            log = FileJournal(str(self.path), "q")
            self.logs.append(log)
        q = PersistentQueue("q", self.config, log, self.clock)
        q.replay()
        return q

    def restart(self) -> None:
        self.q.close()
        self.q = self.build()

    def state(self) -> tuple[list[tuple[int, bytes]], int, int]:
        q = self.q
        return [(i.id, i.data) for i in q.items_in_memory()], len(q), q.bytes

    def drain(self) -> list[tuple[int, bytes]]:
        out = []
        while (item := self.q.remove()) is not None:
            out.append((item.id, item.data))
        return out

    def close(self) -> None:
        self.q.close()
        for log in self.logs:
            log.close()


@pytest.fixture(params=["file", "memory"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_replayed_refill_stops_at_the_record_being_applied(kind: str, tmp_path: Path) -> None:
    r = Restartable(kind, tmp_path)
    for data in (b"a" * 8, b"b" * 8, b"c"):
        r.q.add(data)  # c goes to disk: the 12-byte window is full
    assert r.q.disk_items == 1
    assert [r.q.remove().data for _ in range(3)] == [b"a" * 8, b"b" * 8, b"c"]  # type: ignore[union-attr]
    r.q.add(b"d")  # after the REMOVEs: replaying the third must not read it back early
    live = r.state()
    r.restart()
    assert r.state() == live == ([(4, b"d")], 1, 1)
    assert r.drain() == [(4, b"d")]
    r.restart()
    assert r.state() == ([], 0, 0)
    r.close()


def test_replayed_discards_of_empty_items_on_disk(kind: str, tmp_path: Path) -> None:
    """The shrunk Hypothesis example: discard_old_when_full and expired heads drop items
    while empty ones wait on disk, so a replayed refill had a byte budget nothing could use."""
    r = Restartable(kind, tmp_path, tiny_log=True, max_items=3, discard_old_when_full=True)
    now = r.clock.now_ms()
    r.q.add(b"\xc3\xe7\x93\xf2_\xc6\xd1\x1a", now + 12)
    r.q.add(b"\x1b\xf0\x1f\xdc\xda\xd4\xef\xcc", now - 16)
    r.q.add(b"")  # on disk
    r.q.add(b"", now - 6)  # discards item 1 (REMOVE), which reads item 3 back
    r.restart()
    r.q.add(b"", now + 38)  # item 2 expired: REMOVE
    r.restart()
    r.q.add(b"Y\xcb\xbd", now + 7)  # full: item 3 discarded, REMOVE
    live = r.state()
    assert live == ([(4, b""), (5, b""), (6, b"Y\xcb\xbd")], 3, 3)
    r.restart()
    assert r.state() == live
    r.restart()
    assert r.state() == live
    assert r.q.peek() is not None  # item 4 expired at now - 6: dropped by the read
    assert r.drain() == [(5, b""), (6, b"Y\xcb\xbd")]
    r.close()


def test_replay_with_many_empty_items_on_disk(kind: str, tmp_path: Path) -> None:
    """Only empty items on disk (a byte budget of 0): each replayed REMOVE reads one back."""
    r = Restartable(kind, tmp_path)
    r.q.add(b"x" * 12)
    for _ in range(20):
        r.q.add(b"")
    assert r.q.disk_items == 20
    got = [r.q.remove() for _ in range(5)]
    assert [i.id for i in got if i is not None] == [1, 2, 3, 4, 5]
    r.q.add(b"tail")
    live = r.state()
    r.restart()
    assert r.state()[1:] == live[1:] == (17, 4)
    assert r.drain() == [(i, b"") for i in range(6, 22)] + [(22, b"tail")]
    r.close()


def test_snapshot_window_keeps_delivery_counts(tmp_path: Path) -> None:
    """A snapshot's items were the live window, which may pass max_memory_size (aborts put
    items back at the head): replay keeps them all in memory, so each DELIVERED record still
    reaches its item (max_deliveries survives compaction and restart)."""
    r = Restartable("file", tmp_path)
    for data in (b"a" * 8, b"b" * 4, b"c" * 4):
        r.q.add(data)
    assert r.q.disk_items == 1
    xids = []
    for _ in range(3):
        taken = r.q.remove_open()
        assert taken is not None
        xids.append(taken[0])
    assert r.q.abort_many(xids) == 3
    live = [(i.id, i.deliveries) for i in r.q.items_in_memory()]
    assert live == [(1, 1), (2, 1), (3, 1)]
    assert r.q.compact()
    r.restart()
    assert [(i.id, i.deliveries) for i in r.q.items_in_memory()] == live
    assert r.q.disk_items == 0
    r.q.add(b"d")  # after the snapshot's window: read-behind as usual
    assert r.q.disk_items == 1
    r.restart()
    assert [(i.id, i.deliveries) for i in r.q.items_in_memory()] == live
    assert [item_id for item_id, _ in r.drain()] == [1, 2, 3, 4]
    r.close()


def test_snapshot_open_reads_do_not_wind_the_xid_counter_back(tmp_path: Path) -> None:
    """A snapshot writes SNAPSHOT(xid counter) and then an OPEN per open read, whose xids are
    older: replay keeps the SNAPSHOT's counter (as the live queue had it)."""
    r = Restartable("file", tmp_path)
    for _ in range(2):
        r.q.add(b"x")
        assert r.q.remove_open() is not None
    assert r.q.abort(2)
    r.q.remove()  # xid 1 stays open
    assert r.q.last_xid == 2
    assert r.q.compact()
    r.restart()  # replay: SNAPSHOT xid=2, ADD, OPEN 1; then ABORT 1
    assert r.q.last_xid == 2
    taken = r.q.remove_open()
    assert taken is not None and (taken[0], taken[1].id) == (3, 1)
    r.close()
