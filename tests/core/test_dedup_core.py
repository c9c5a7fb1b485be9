"""Dedup keys in the core and their records: :class:`DedupKeys` alone, then a queue's keyed puts
on both journals (RAM and files), across restarts, read-behind, compaction, a torn tail and
the window passing (a ManualClock), and the record codecs of both journals."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tercel.clock import ManualClock
from tercel.config import QueueConfig
from tercel.core.dedup import DedupKeys
from tercel.core.queue import PersistentQueue
from tercel.errors import JournalWriteError, TooManyKeys
from tercel.journal import FileJournal, MemoryJournal
from tercel.journal import jobrecords as jr
from tercel.journal import records as rec
from tercel.journal.faults import FaultyFiles
from tercel.journal.files import DataDir

T0 = 1_700_000_000_000

# ---- DedupKeys -----------------------------------------------------------------------------


def test_keys_expire_in_order_after_the_window() -> None:
    keys = DedupKeys(window=1000, max_keys=10)
    assert keys.find("a", T0) == -1
    keys.remember("a", 1, T0)
    keys.remember("b", 2, T0 + 500)
    assert (keys.find("a", T0 + 999), keys.find("b", T0 + 999)) == (1, 2)
    assert keys.find("a", T0 + 1000) == -1  # a window of 1000 ms: gone at +1000
    assert (keys.find("b", T0 + 1000), len(keys)) == (2, 1)
    assert keys.find("b", T0 + 1500) == -1
    assert len(keys) == 0


def test_a_clock_that_steps_back_never_keeps_a_key_short() -> None:
    keys = DedupKeys(window=1000, max_keys=10)
    keys.remember("a", 1, T0 + 5000)
    keys.remember("b", 2, T0)  # the wall clock stepped back: b is kept as of T0 + 5000
    assert keys.find("b", T0 + 5999) == 2
    assert keys.live() == [("a", 1, T0 + 5000), ("b", 2, T0 + 5000)]


def test_full_of_young_keys_refuses_and_drops_nothing() -> None:
    keys = DedupKeys(window=1000, max_keys=2)
    keys.remember("a", 1, T0)
    keys.remember("b", 2, T0)
    with pytest.raises(TooManyKeys, match="max_dedup_keys=2 dedup keys younger than"):
        keys.check_room("queue q")
    assert keys.find("a", T0 + 1000) == -1  # once they expire there is room again
    keys.check_room("queue q")


def test_window_zero_keeps_nothing_and_restore_skips_old_and_known_keys() -> None:
    off = DedupKeys(window=0, max_keys=2)
    off.remember("a", 1, T0)
    assert len(off) == 0
    keys = DedupKeys(window=1000, max_keys=2)
    keys.restore("old", 1, T0, T0 + 1000)
    keys.restore("a", 2, T0 + 10, T0 + 1000)
    keys.restore("a", 3, T0 + 20, T0 + 1000)
    assert keys.live() == [("a", 2, T0 + 10)]


# ---- a queue's keyed puts ------------------------------------------------------------------


class Harness:
    """A queue on a RAM or file journal, with a manual clock; ``restart`` replays it."""

    def __init__(self, kind: str, path: Path, **config: Any) -> None:
        self.kind = kind
        self.path = path
        self.memory = MemoryJournal()
        self.clock = ManualClock(T0)
        self.config = QueueConfig(**{"dedup_window_ms": 60_000, **config})
        self.logs: list[FileJournal] = []
        self.q = self.build()

    def build(self) -> PersistentQueue:
        log: Any = self.memory
        if self.kind == "file":
            log = FileJournal(str(self.path), "q")
            self.logs.append(log)
        q = PersistentQueue("q", self.config, log, self.clock)
        q.replay()
        return q

    def restart(self) -> PersistentQueue:
        self.q.close()
        self.q = self.build()
        return self.q

    def close(self) -> None:
        for log in self.logs:
            log.close()


@pytest.fixture(params=["memory", "file"])
def h(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(request.param, tmp_path)
    yield harness
    harness.close()


def drain(q: PersistentQueue) -> list[bytes]:
    out = []
    while (item := q.remove()) is not None:
        out.append(item.data)
    return out


def test_a_second_put_with_the_key_stores_nothing(h: Harness) -> None:
    q = h.q
    assert q.add(b"plain")
    assert q.add_keyed("k1", b"one") == 2
    size = q.log.size
    assert q.add_keyed("k1", b"again") == -2  # the original's id, negative: a duplicate
    assert q.log.size == size  # nothing written
    assert q.add_keyed("k2", b"two") == 3
    assert (q.dedup_keys, q.dedup_duplicates) == (2, 1)
    assert drain(q) == [b"plain", b"one", b"two"]
    assert q.add_keyed("k1", b"late") == -2  # consumed: still within the window


def test_keys_survive_a_restart_and_go_with_the_window(h: Harness) -> None:
    for i in range(5):
        assert h.q.add_keyed(f"k{i}", b"%d" % i) == i + 1
    h.clock.advance(30_000)
    assert h.q.add_keyed("late", b"L") == 6
    q = h.restart()
    assert [q.add_keyed(f"k{i}", b"x") for i in range(5)] == [-1, -2, -3, -4, -5]
    assert drain(q) == [b"0", b"1", b"2", b"3", b"4", b"L"]
    h.clock.advance(30_000)  # k0..k4 are 60 s old: replay drops them, late stays
    q = h.restart()
    assert q.dedup_keys == 1
    assert q.add_keyed("k0", b"new") == 7
    assert q.add_keyed("late", b"x") == -6


def test_the_expiry_sweep_forgets_keys_past_the_window(h: Harness) -> None:
    assert h.q.add_keyed("a", b"1") == 1
    h.clock.advance(60_000)
    assert h.q.dedup_keys == 1  # nothing looked yet
    h.q.flush_expired()
    assert h.q.dedup_keys == 0


def test_max_dedup_keys_refuses_without_writing(tmp_path: Path) -> None:
    h = Harness("file", tmp_path, max_dedup_keys=2)
    q = h.q
    assert q.add_keyed("a", b"1") == 1
    assert q.add_keyed("b", b"2") == 2
    size = q.log.size
    with pytest.raises(TooManyKeys):
        q.add_keyed("c", b"3")
    assert (q.log.size, len(q)) == (size, 2)
    assert q.add_keyed("a", b"x") == -1  # known keys still answer
    h.close()


def test_a_full_queue_stores_neither_item_nor_key(h: Harness) -> None:
    h.config = QueueConfig(max_items=1)
    h.q.config = h.config
    assert h.q.add_keyed("a", b"1") == 1
    assert h.q.add_keyed("b", b"2") == 0
    assert h.q.dedup_keys == 1


def test_no_checkpoint_while_keys_are_held(tmp_path: Path) -> None:
    h = Harness("file", tmp_path, dedup_window_ms=1000)
    assert h.q.add_keyed("a", b"1") == 1
    assert not h.q.checkpoint()  # its replay would skip the ADD_KEYED records before it
    h.clock.advance(1000)
    assert h.q.remove() is not None
    assert h.q.add(b"plain")
    assert h.q.checkpoint()  # the key is past its window, the queue one run of ADDs
    h.close()


def test_read_behind_reads_keyed_items_back(tmp_path: Path) -> None:
    h = Harness("file", tmp_path, max_memory_size=1024)
    body = b"x" * 100
    for i in range(50):
        assert h.q.add_keyed(f"k{i}", body + b"%d" % i) == i + 1
    assert h.q.disk_items > 0
    taken = [h.q.remove() for _ in range(10)]
    assert [i.data for i in taken if i is not None] == [body + b"%d" % i for i in range(10)]
    q = h.restart()  # replay counts the keyed items left on disk and reads them back
    assert q.add_keyed("k49", b"x") == -50
    assert q.add_keyed("k0", b"x") == -1
    assert drain(q) == [body + b"%d" % i for i in range(10, 50)]
    h.close()


def test_compaction_carries_the_keys(tmp_path: Path) -> None:
    h = Harness("file", tmp_path)
    for i in range(20):
        assert h.q.add_keyed(f"k{i}", b"%d" % i) == i + 1
    assert len(drain(h.q)) == 20
    assert h.q.compact()  # inline: the snapshot holds no item, only the 20 keys
    assert h.q.journal_rewrites == 1
    q = h.restart()
    assert [q.add_keyed(f"k{i}", b"x") for i in (0, 19)] == [-1, -20]
    assert q.add_keyed("k20", b"x") == 21
    h.close()


def test_a_torn_add_keyed_keeps_neither_item_nor_key(tmp_path: Path) -> None:
    h = Harness("file", tmp_path)
    assert h.q.add_keyed("a", b"first") == 1
    assert h.q.add_keyed("b", b"second") == 2
    h.q.close()
    h.close()
    path = tmp_path / "q"
    os.truncate(path, os.path.getsize(path) - 3)  # the second record torn
    h.logs.clear()
    q = h.build()
    assert q.add_keyed("a", b"x") == -1
    assert q.add_keyed("b", b"again") == 2  # stored now: the torn put was never acknowledged
    assert drain(q) == [b"first", b"again"]
    h.close()


def test_after_a_write_failure_no_duplicate_is_answered(tmp_path: Path) -> None:
    faults = FaultyFiles()  # the file seam: every write refused once armed
    log = FileJournal(str(tmp_path), "q", directory=DataDir(str(tmp_path), ops=faults))
    q = PersistentQueue("q", QueueConfig(), log, ManualClock(T0))
    q.replay()
    assert q.add_keyed("a", b"1") == 1
    for op in ("pwrite", "pwritev"):
        faults.fail(op, errno.EBADF)
    with pytest.raises(JournalWriteError):
        q.add_keyed("b", b"2")
    assert (len(q), q.dedup_keys) == (1, 1)  # neither the item nor its key
    with pytest.raises(JournalWriteError):  # "a" may not be on disk either: no answer
        q.add_keyed("a", b"again")
    faults.clear()
    log.close()


# ---- records -------------------------------------------------------------------------------


class Sink:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *args: self.calls.append((name, *args))


def test_add_keyed_and_dedup_key_records() -> None:
    buf = bytearray()
    rec.encode_add_keyed(buf, 7, T0, 0, b"payload", key=b"job-7")
    rec.encode_dedup_key(buf, b"job-3", 3, T0 - 5)
    first = rec.check_record(buf, 0)
    assert rec.check_record(buf, first) == len(buf)
    sink = Sink()
    rec.apply_record(buf, 0, first, sink)  # type: ignore[arg-type]
    rec.apply_record(buf, first, len(buf), sink)  # type: ignore[arg-type]
    assert sink.calls == [
        ("on_add", 7, T0, 0, b"payload"),
        ("on_dedup_key", "job-7", 7, T0),
        ("on_dedup_key", "job-3", 3, T0 - 5),
    ]
    described = rec.describe_record(buf, 0, first)
    assert (described["op"], described["key"], described["data"]) == (
        "ADD_KEYED",
        "job-7",
        b"payload",
    )
    assert rec.describe_record(buf, first, len(buf))["op"] == "DEDUP_KEY"
    # The fast scan leaves both to the careful reader.
    assert rec.scan(bytes(buf), 0, lambda *a: True) == 0


def test_keyed_records_that_do_not_fit_their_opcode_are_bad() -> None:
    def record(body: bytes) -> bytes:
        return rec.PREFIX.pack(len(body), rec.crc32(body)) + body

    empty_key = record(bytes([rec.OP_ADD_KEYED]) + bytes(24) + b"\0" + b"data")
    short = record(bytes([rec.OP_ADD_KEYED]) + bytes(24) + b"\x09" + b"abc")
    no_key = record(bytes([rec.OP_DEDUP_KEY]) + bytes(16))
    for bad, why in ((empty_key, "empty key"), (short, "too short"), (no_key, "wrong length")):
        with pytest.raises(rec.BadRecord, match=why):
            rec.check_record(bad, 0)


def test_job_log_put_keyed_and_dedup_key_records() -> None:
    head, body = jr.encode_job_keyed(5, 0, 10, 0, 0, "tube.a", 60, T0, b"job body", "key-5")
    data = jr.HEADER + head + body + jr.encode_dedup_key("key-1", 1, T0 - 9)
    jobs: dict[int, jr.LoggedJob] = {}
    keys: dict[str, tuple[int, int]] = {}
    next_id, count, _ = jr.apply_records(data, 1, jobs, False, keys)
    assert (next_id, count) == (6, 2)
    job = jobs[5]
    assert (job.tube, job.pri, job.ttr, job.created_ms, job.body) == (
        "tube.a",
        10,
        60,
        T0,
        b"job body",
    )
    assert keys == {"key-5": (5, T0), "key-1": (1, T0 - 9)}
    assert jr.check_file(data) == (2, -1, "")
    torn = data[:-3]
    assert jr.check_file(torn)[1] == len(jr.HEADER) + len(head) + len(body)


# ---- version 3 files -----------------------------------------------------------------------

V3_FIXTURE = Path(__file__).parent.parent / "journal" / "fixtures" / "v3-basic.jrnl"
"""Written by version 3 (commit 5813307, ``tercel.PersistentQueue``, then ``os._exit``): ADD
one..four, REMOVE, OPEN 1, RETURN 1, OPEN 2 (open at the crash)."""


def test_a_version_3_file_replays_and_keyed_puts_go_to_a_version_4_file(tmp_path: Path) -> None:
    old = V3_FIXTURE.read_bytes()
    assert old[:8] == b"TRCL\x03\x00\x00\x00"
    (tmp_path / "q").write_bytes(old)
    h = Harness("file", tmp_path)
    assert (tmp_path / "q.1").read_bytes() == old  # read, never appended to
    assert (tmp_path / "q").read_bytes()[:8] == rec.FILE_HEADER
    assert h.q.add_keyed("k", b"five") == 5
    q = h.restart()
    assert q.add_keyed("k", b"again") == -5
    assert drain(q) == [b"two", b"three", b"four", b"five"]
    h.close()
