"""Items that come back from an open read (a lease, a TTR, a disconnect) return to their
original place in the queue, by item id, not to the head in the order of the returns; replay
rebuilds the same order (RETURN records, format version 3), and a version-2 file's ABORT still
puts the item at the head, as it did when it was written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tercel.clock import ManualClock
from tercel.config import QueueConfig
from tercel.core.items import Items
from tercel.core.queue import PersistentQueue, QItem
from tercel.journal import FileJournal, MemoryJournal
from tercel.journal import records as rec

T0 = 1_700_000_000_000


@pytest.fixture(params=["memory", "file"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class World:
    def __init__(self, kind: str, path: Path, config: QueueConfig | None = None) -> None:
        self.kind, self.path = kind, path
        self.memory = MemoryJournal()
        self.config = config or QueueConfig()
        self.logs: list[FileJournal] = []
        self.q = self.build()

    def build(self) -> PersistentQueue:
        log: MemoryJournal | FileJournal = self.memory
        if self.kind == "file":
            log = FileJournal(str(self.path), "q")
            self.logs.append(log)
        q = PersistentQueue("q", self.config, log, ManualClock(T0))
        q.replay()
        return q

    def restart(self) -> None:
        self.q.close()
        self.q = self.build()

    def order(self) -> list[bytes]:
        return [i.data for i in self.q.items_in_memory()]

    def close(self) -> None:
        self.q.close()
        for log in self.logs:
            log.close()


def test_returns_go_back_to_their_original_place(kind: str, tmp_path: Path) -> None:
    w = World(kind, tmp_path)
    for data in (b"a", b"b", b"c", b"d"):
        w.q.add(data)
    xids = {}
    for _ in range(3):
        taken = w.q.remove_open()
        assert taken is not None
        xids[taken[1].data] = taken[0]
    for data in (b"c", b"a", b"b"):  # released one at a time as c, a, b
        assert w.q.abort(xids[data])
    assert w.order() == [b"a", b"b", b"c", b"d"]
    w.restart()
    assert w.order() == [b"a", b"b", b"c", b"d"]
    w.close()


def test_open_reads_left_at_restart_come_back_in_order(kind: str, tmp_path: Path) -> None:
    w = World(kind, tmp_path)
    for data in (b"a", b"b", b"c"):
        w.q.add(data)
    for _ in range(3):
        assert w.q.remove_open() is not None
    assert w.q.remove_open() is None
    first = w.q.open_items()
    assert w.q.abort(max(first))  # c returns; a and b stay open over the restart
    w.restart()
    assert w.order() == [b"a", b"b", b"c"]
    w.close()


def test_version_2_abort_still_means_the_head(tmp_path: Path) -> None:
    """A file written before version 3: ABORT put the item at the head, and the records after
    it (a REMOVE here) were written against that order."""
    buf = bytearray(rec.file_header(2))
    for item_id, data in ((1, b"a"), (2, b"b"), (3, b"c")):
        rec.encode_add(buf, item_id, T0, 0, data)
    for xid in (1, 2):
        rec.encode_xid(buf, rec.OP_OPEN, xid)  # a, b open
    rec.encode_xid(buf, rec.OP_ABORT, 1)  # a to the head: a, c
    rec.encode_xid(buf, rec.OP_ABORT, 2)  # b to the head: b, a, c (by id it would be a, b, c)
    buf += rec.REMOVE_RECORD  # b removed, as the live queue did
    (tmp_path / "q").write_bytes(bytes(buf))
    w = World("file", tmp_path)
    assert w.order() == [b"a", b"c"]
    w.q.add(b"d")
    w.close()
    assert (tmp_path / "q.1").read_bytes()[:8] == bytes(buf[:8])  # only read, then rotated
    assert (tmp_path / "q").read_bytes()[:8] == rec.FILE_HEADER


def test_put_back_keeps_id_order() -> None:
    items = Items()
    for item_id in (9, 2, 5, 1, 7, 3):
        items.put_back(QItem(item_id, 0, 0, b""))
    assert [i.id for i in items] == [1, 2, 3, 5, 7, 9]
