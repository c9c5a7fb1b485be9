"""Keyed leases in the core (PersistentQueue.take_keyed and friends), on the RAM twin and the
file journal: the same items every time, across restarts, compaction and rotation, until
acked or released (docs/journal_format.md §18)."""

from __future__ import annotations

import errno
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tercel.clock import ManualClock
from tercel.config import QueueConfig, parse_config
from tercel.core.collection import QueueCollection
from tercel.core.keyed import KeyedSlice
from tercel.core.queue import PersistentQueue
from tercel.errors import (
    BadKey,
    JournalCorrupt,
    JournalWriteError,
    LeaseKeyEnded,
    TooManyKeys,
    UnavailableError,
)
from tercel.journal import FileJournal, MemoryJournal, list_queue_names
from tercel.journal.faults import FaultyFiles
from tercel.journal.files import DataDir
from tercel.steps import finish

T0 = 1_700_000_000_000


class Harness:
    """A queue ``q`` on a RAM or file journal that can be restarted (closed and replayed)."""

    def __init__(self, kind: str, path: Path, **config: Any) -> None:
        self.kind = kind
        self.path = path
        self.memory = MemoryJournal()
        self.clock = ManualClock(T0)
        self.config = QueueConfig(**config)
        self.owners: dict[str, str] = {}
        self.q = self.build()

    def build(self) -> PersistentQueue:
        log = self.memory if self.kind == "memory" else FileJournal(str(self.path), "q")
        q = PersistentQueue("q", self.config, log, self.clock)
        self.owners.clear()
        q.key_owners = self.owners
        q.replay()
        return q

    def restart(self) -> PersistentQueue:
        self.q.close()
        self.q = self.build()
        return self.q

    def fill(self, n: int, size: int = 8) -> None:
        for i in range(n):
            assert self.q.add(f"{i:0{size}d}".encode(), now=T0)

    def lease_files(self) -> list[str]:
        return sorted(e for e in os.listdir(self.path) if ".key." in e)


@pytest.fixture(params=["memory", "file"])
def h(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(request.param, tmp_path)
    yield harness
    harness.q.close()


def drain(q: PersistentQueue) -> list[bytes]:
    out = []
    while (item := q.remove(T0)) is not None:
        out.append(item.data)
    return out


def rows(s: KeyedSlice) -> list[tuple[int, int, bytes]]:
    return [
        (s.item_ids[i], s.deliveries[i], bytes(s.data[s.offsets[i] : s.offsets[i + 1]]))
        for i in range(len(s))
    ]


def test_take_then_take_again_is_the_same_lease_after_restart(h: Harness) -> None:
    h.fill(10)
    lease = h.q.take_keyed("batch.1", 4, 0, T0)
    assert lease is not None
    assert (lease.key, lease.count, lease.size, lease.max_items) == ("batch.1", 4, 32, 4)
    assert lease.created_at == T0 and lease.expires_at == T0 + 86_400_000
    assert len(h.q) == 6
    first = rows(h.q.keyed_slice("batch.1", 0, 4))
    assert first == [(i + 1, 1, f"{i:08d}".encode()) for i in range(4)]
    again = h.q.take_keyed("batch.1", 4, 0, T0 + 5)
    assert again is not None and again.count == 4 and len(h.q) == 6
    q = h.restart()
    assert len(q) == 6
    lease = q.take_keyed("batch.1", 4, 0, T0 + 10)
    assert lease is not None and (lease.count, lease.size, lease.created_at) == (4, 32, T0)
    assert rows(q.keyed_slice("batch.1", 0, 4)) == first
    assert rows(q.keyed_slice("batch.1", 1, 3)) == first[1:3]
    assert drain(q) == [f"{i:08d}".encode() for i in range(4, 10)]


def test_empty_queue_makes_no_key(h: Harness) -> None:
    assert h.q.take_keyed("k", 5, 0, T0) is None
    assert h.q.keyed("k") is None
    h.fill(1)
    lease = h.q.take_keyed("k", 5, 0, T0)
    assert lease is not None and lease.count == 1


def test_bad_input_is_refused_and_changes_nothing(h: Harness) -> None:
    h.fill(3)
    for key in ("", "a b", "x" * 201, "é"):
        with pytest.raises(BadKey):
            h.q.take_keyed(key, 1, 0, T0)
    with pytest.raises(BadKey):
        h.q.take_keyed("k", 0, 0, T0)
    assert h.q.take_keyed("k", 2, 0, T0) is not None
    with pytest.raises(BadKey, match="max_items 2"):
        h.q.take_keyed("k", 3, 0, T0)
    with pytest.raises(BadKey, match=r"slice 1\.\.3 past the end of lease key k \(2 items\)"):
        h.q.keyed_slice("k", 1, 3)
    with pytest.raises(BadKey):
        h.q.keyed_slice("k", 2, 1)
    with pytest.raises(BadKey):
        h.q.ack_keyed("nope")
    assert len(h.q.keyed_slice("k", 2, 2)) == 0
    h.owners["other"] = "elsewhere"
    with pytest.raises(BadKey, match="belongs to queue elsewhere"):
        h.q.take_keyed("other", 1, 0, T0)
    assert len(h.q) == 1


def test_ack_ends_the_key_for_good(h: Harness) -> None:
    h.fill(5)
    h.q.take_keyed("k", 3, 0, T0)
    assert h.q.ack_keyed("k") == 3
    assert h.q.ack_keyed("k") == 0
    with pytest.raises(LeaseKeyEnded, match="acked"):
        h.q.take_keyed("k", 3, 0, T0)
    with pytest.raises(LeaseKeyEnded):
        h.q.keyed_slice("k", 0, 1)
    with pytest.raises(LeaseKeyEnded):
        h.q.release_keyed("k")
    q = h.restart()
    with pytest.raises(LeaseKeyEnded, match="acked"):
        q.take_keyed("k", 3, 0, T0)
    assert drain(q) == [b"00000003", b"00000004"]
    if h.kind == "file":
        assert h.lease_files() == []


def test_release_puts_items_back_in_place_with_deliveries(h: Harness) -> None:
    h.fill(6)
    h.q.take_keyed("a", 2, 0, T0)  # items 1, 2
    xid_item = h.q.remove_open(T0)  # item 3, an open read
    assert xid_item is not None
    h.q.take_keyed("b", 2, 0, T0)  # items 4, 5
    assert h.q.release_keyed("a") == 2
    assert h.q.release_keyed("a") == 0
    assert h.q.keyed_figures() == (1, 2, T0)
    q = h.restart()  # the open read returns too
    with pytest.raises(LeaseKeyEnded, match="released"):
        q.take_keyed("a", 2, 0, T0)
    head = [q.remove_open(T0) for _ in range(4)]
    assert [(x[1].id, x[1].deliveries) for x in head if x] == [(1, 2), (2, 2), (3, 2), (6, 1)]
    assert q.keyed("b") is not None
    assert rows(q.keyed_slice("b", 0, 2)) == [(4, 1, b"00000003"), (5, 1, b"00000004")]


def test_expiry_returns_items_and_survives_restart(h: Harness) -> None:
    h.fill(3)
    lease = h.q.take_keyed("k", 2, 1000, T0)
    assert lease is not None and lease.expires_at == T0 + 1000
    assert h.q.renew_keyed("k", 5000, T0 + 500) == T0 + 5500
    q = h.restart()
    assert q.expire_keyed(T0 + 5499) == 0
    assert q.expire_keyed(T0 + 5500) == 2
    with pytest.raises(LeaseKeyEnded, match="expired"):
        q.take_keyed("k", 2, 0, T0)
    q = h.restart()
    with pytest.raises(LeaseKeyEnded, match="expired"):
        q.keyed("k")
    assert drain(q) == [b"00000000", b"00000001", b"00000002"]


def test_max_deliveries_and_dead_letters_apply(tmp_path: Path) -> None:
    h = Harness("file", tmp_path, max_deliveries=1)
    h.fill(3)
    got = h.q.remove_open(T0)
    assert got is not None
    h.q.abort(got[0])  # item 1 delivered once: at the limit
    lease = h.q.take_keyed("k", 5, 0, T0)
    assert lease is not None and lease.count == 2
    assert [r[0] for r in rows(h.q.keyed_slice("k", 0, 2))] == [2, 3]
    q = h.restart()
    assert [r[0] for r in rows(q.keyed_slice("k", 0, 2))] == [2, 3]
    assert len(q) == 0
    q.close()


def test_too_many_keys_forgets_the_oldest_ended_first(tmp_path: Path) -> None:
    h = Harness("file", tmp_path, max_lease_keys=2)
    h.fill(10)
    h.q.take_keyed("a", 1, 0, T0)
    h.q.take_keyed("b", 1, 0, T0)
    with pytest.raises(TooManyKeys, match="too many lease keys"):
        h.q.take_keyed("c", 1, 0, T0)
    h.q.ack_keyed("a")
    assert h.q.take_keyed("c", 1, 0, T0) is not None  # "a" forgotten
    assert "a" not in h.owners and h.owners["c"] == "q"
    assert h.q.keyed("a") is None
    q = h.restart()
    assert q.keyed("a") is None and q.keyed("b") is not None
    q.close()


def test_compaction_and_rotation_carry_live_and_ended_keys(tmp_path: Path) -> None:
    h = Harness("file", tmp_path, max_journal_size=1024)
    h.fill(50, size=64)
    h.q.take_keyed("live", 5, 0, T0)
    h.q.take_keyed("gone", 3, 0, T0)
    h.q.ack_keyed("gone")
    h.q.take_keyed("back", 2, 0, T0)
    h.q.release_keyed("back")
    before = rows(h.q.keyed_slice("live", 0, 5))
    assert h.q.log.rotate()
    for _ in range(10):
        h.q.remove(T0)
    assert h.q.compact()
    assert h.q.log.compactions >= 1
    h.q.expire_keyed(T0)  # tidies: the released lease's file went with the compaction
    assert h.lease_files() == ["q.key.1"]
    q = h.restart()
    assert rows(q.keyed_slice("live", 0, 5)) == before
    with pytest.raises(LeaseKeyEnded, match="acked"):
        q.keyed("gone")
    with pytest.raises(LeaseKeyEnded, match="released"):
        q.keyed("back")
    assert len(q) == 50 - 5 - 3 - 10
    q.close()


def test_orphan_lease_files_are_removed_at_replay(tmp_path: Path) -> None:
    h = Harness("file", tmp_path)
    h.fill(3)
    h.q.take_keyed("k", 1, 0, T0)
    h.q.close()
    (tmp_path / "q.key.7").write_bytes(b"TRCL\x04\x00\x00\x00junk")
    h.q = h.build()
    assert h.lease_files() == ["q.key.1"]
    lease = h.q.take_keyed("k2", 1, 0, T0)
    assert lease is not None
    assert h.lease_files() == ["q.key.1", "q.key.8"]
    h.q.close()


def test_a_large_lease_holds_no_payload_in_memory(tmp_path: Path) -> None:
    h = Harness("file", tmp_path, max_memory_size=64 * 1024)
    for i in range(3000):
        h.q.add(bytes([i % 251]) * 1024, now=T0)
    lease = h.q.take_keyed("big", 2500, 0, T0)
    assert lease is not None and lease.count == 2500 and lease.size == 2500 * 1024
    assert h.q.mem_bytes <= 64 * 1024 and len(h.q.items_in_memory()) <= 64
    part = h.q.keyed_slice("big", 2000, 2010)
    assert [r[0] for r in rows(part)] == list(range(2001, 2011))
    q = h.restart()
    assert q.mem_bytes <= 1 << 20
    assert [r[0] for r in rows(q.keyed_slice("big", 2490, 2500))] == list(range(2491, 2501))
    assert len(q) == 500
    q.close()


def test_delete_removes_lease_files_and_keys(tmp_path: Path) -> None:
    h = Harness("file", tmp_path)
    h.fill(3)
    h.q.take_keyed("k", 2, 0, T0)
    assert h.owners == {"k": "q"}
    h.q.erase()
    assert h.owners == {}
    assert not [e for e in os.listdir(tmp_path) if e.startswith("q.key")]


def test_rotation_keeps_live_keys(tmp_path: Path) -> None:
    h = Harness("file", tmp_path)
    h.fill(20)
    h.q.take_keyed("a", 3, 0, T0)
    assert h.q.log.rotate()
    h.q.take_keyed("b", 3, 0, T0)
    assert h.q.log.rotate()
    h.q.ack_keyed("a")
    expect = rows(h.q.keyed_slice("b", 0, 3))
    q = h.restart()
    assert rows(q.keyed_slice("b", 0, 3)) == expect
    assert [r[0] for r in expect] == [4, 5, 6]
    with pytest.raises(LeaseKeyEnded):
        q.keyed("a")
    assert len(q) == 14
    q.close()


def test_read_behind_compaction_keeps_keys_and_released_items(tmp_path: Path) -> None:
    h = Harness("file", tmp_path, max_memory_size=2048, max_journal_size=4096)
    h.fill(200, size=64)
    assert h.q.disk_items
    h.q.take_keyed("live", 10, 0, T0)  # items 1-10
    h.q.take_keyed("back", 5, 0, T0)  # items 11-15
    for _ in range(60):
        h.q.remove(T0)  # items 16-75
    h.q.release_keyed("back")  # 11-15 back at the head
    expect = rows(h.q.keyed_slice("live", 0, 10))
    assert h.q.compact()
    h.q.expire_keyed(T0)
    q = h.restart()
    assert rows(q.keyed_slice("live", 0, 10)) == expect
    got = []
    while (item := q.remove(T0)) is not None:
        got.append((item.id, item.deliveries))
    assert got[:5] == [(i, 2) for i in range(11, 16)]  # (a remove counts a delivery too)
    assert [i for i, _ in got[5:]] == list(range(76, 201))
    q.close()
    assert h.lease_files() == ["q.key.1"]


def test_a_take_in_steps_keeps_its_key_busy(tmp_path: Path) -> None:
    h = Harness("file", tmp_path)
    for i in range(3000):
        h.q.add(b"%04d" % i + b"x" * 2044, now=T0)  # 6 MB: two chunks
    steps = h.q.take_keyed_steps("k", 2500, 0, T0)
    next(steps)  # the first chunk is recorded
    with pytest.raises(UnavailableError, match="being taken"):
        h.q.take_keyed("k", 2500, 0, T0)
    with pytest.raises(UnavailableError):
        h.q.ack_keyed("k")
    assert h.q.add(b"meanwhile", now=T0)  # the queue serves others between steps
    lease = finish(steps)
    assert lease is not None and lease.count == 2500
    q = h.restart()
    assert [r[0] for r in rows(q.keyed_slice("k", 2040, 2050))] == list(range(2041, 2051))
    assert len(q) == 501
    q.close()


def test_a_failed_lease_file_write_changes_nothing(tmp_path: Path) -> None:
    faults = FaultyFiles()
    faults.fail("pwrite", errno.ENOSPC, path=".key.", times=1)
    log = FileJournal(str(tmp_path), "q", directory=DataDir(str(tmp_path), ops=faults))
    q = PersistentQueue("q", QueueConfig(), log, ManualClock(T0))
    q.replay()
    for i in range(5):
        q.add(b"%d" % i, now=T0)
    with pytest.raises(JournalWriteError):
        q.take_keyed("k", 3, 0, T0)
    assert q.keyed("k") is None
    assert [(i.id, i.deliveries) for i in q.items_in_memory()] == [(n, 0) for n in range(1, 6)]
    lease = q.take_keyed("k", 3, 0, T0)
    assert lease is not None and lease.count == 3
    q.close()
    q = PersistentQueue("q", QueueConfig(), FileJournal(str(tmp_path), "q"), ManualClock(T0))
    q.replay()
    assert [r[0] for r in rows(q.keyed_slice("k", 0, 3))] == [1, 2, 3]
    q.close()


def test_the_collection_knows_every_key_and_expires_them(tmp_path: Path) -> None:
    def open_log(name: str, config: QueueConfig) -> FileJournal:
        return FileJournal(str(tmp_path), name)

    config = parse_config({"queues": {"key_lease_ms": 1000}})
    clock = ManualClock(T0)
    c = QueueCollection(config, open_log, clock)
    a = c.get_or_create("a")
    for i in range(4):
        c.add("a", b"%d" % i, None, T0)
    a.take_keyed("k1", 2, 0, T0)
    assert c.lease_key_queue("k1") == "a"
    b = c.get_or_create("b")
    with pytest.raises(BadKey, match="belongs to queue a"):
        b.take_keyed("k1", 2, 0, T0)
    assert c.expire_keyed(T0 + 999) == 0
    c.close()
    c = QueueCollection(config, open_log, clock)
    c.load(list_queue_names(str(tmp_path)))
    assert c.lease_key_queue("k1") == "a"
    assert c.expire_keyed(T0 + 1000) == 2
    assert c.lease_key_queue("k1") == "a"  # remembered: still a's
    with pytest.raises(LeaseKeyEnded, match="expired"):
        c.get_or_create("a").take_keyed("k1", 2, 0, T0)
    assert c.delete("a")
    assert c.lease_key_queue("k1") is None
    c.close()


def test_items_larger_than_a_read_are_indexed_after_a_restart(tmp_path: Path) -> None:
    h = Harness("file", tmp_path)
    big = [bytes([65 + i]) * (3 << 19) for i in range(3)]  # 1.5 MiB each
    for data in big:
        h.q.add(data, now=T0)
    h.q.take_keyed("k", 3, 0, T0)
    q = h.restart()
    assert [r[2] for r in rows(q.keyed_slice("k", 0, 3))] == big
    q.close()


def test_lease_files_of_a_queue_without_files_are_removed_at_start(tmp_path: Path) -> None:
    (tmp_path / "gone.key.3").write_bytes(b"TRCL\x04\x00\x00\x00")
    (tmp_path / "kept").write_bytes(b"TRCL\x04\x00\x00\x00")
    (tmp_path / "kept.key.1").write_bytes(b"TRCL\x04\x00\x00\x00")
    assert DataDir(str(tmp_path)).remove_orphans() == 1
    assert sorted(os.listdir(tmp_path)) == ["kept", "kept.key.1"]


def test_expired_heads_are_dropped_not_taken(tmp_path: Path) -> None:
    h = Harness("file", tmp_path)
    h.q.add(b"old", expiry=T0 + 10, now=T0)
    h.q.add(b"new", now=T0)
    lease = h.q.take_keyed("k", 5, 0, T0 + 20)
    assert lease is not None and lease.count == 1
    assert h.q.expired_items == 1
    q = h.restart()
    assert bytes(q.keyed_slice("k", 0, 1).data) == b"new"
    assert len(q) == 0
    q.close()
    h = Harness("memory", tmp_path, max_expire_sweep=0)  # nothing may expire: taken
    h.q.add(b"old", expiry=T0 + 10, now=T0)
    lease = h.q.take_keyed("k", 5, 0, T0 + 20)
    assert lease is not None and lease.count == 1


def test_the_sweep_releases_keyed_leases_that_ran_out(tmp_path: Path) -> None:
    def open_log(name: str, config: QueueConfig) -> FileJournal:
        return FileJournal(str(tmp_path), name)

    clock = ManualClock(T0)
    c = QueueCollection(parse_config({}), open_log, clock)
    q = c.get_or_create("a")
    c.add("a", b"x", None, T0)
    q.take_keyed("k", 1, 60_000, T0)
    c.flush_all_expired()
    assert q.keyed("k") is not None
    clock.advance(60_000)
    c.flush_all_expired()
    with pytest.raises(LeaseKeyEnded, match="expired"):
        q.keyed("k")
    assert len(q) == 1
    c.close()


def test_a_damaged_lease_file_is_reported_with_its_path_and_offset(tmp_path: Path) -> None:
    h = Harness("file", tmp_path)
    h.fill(3)
    h.q.take_keyed("k", 3, 0, T0)
    h.q.close()
    path = tmp_path / "q.key.1"
    raw = bytearray(path.read_bytes())
    raw[8 + 54 + 33 + 2] ^= 0xFF  # the second item (54 bytes of records each): its payload
    path.write_bytes(bytes(raw))
    q = h.build()
    assert len(q.keyed_slice("k", 0, 1)) == 1
    with pytest.raises(JournalCorrupt) as info:
        q.keyed_slice("k", 1, 2)
    assert (info.value.path, info.value.offset) == (str(path), 8 + 54)
    q.close()


@pytest.mark.parametrize("seed", range(6))
def test_random_operations_against_a_model(tmp_path: Path, seed: int) -> None:
    """Adds, removes, takes, acks, releases, renewals, expiries, rotations, compactions and
    restarts in a random order, in read-behind with small files; the queue and every lease
    match a plain model."""
    rng = random.Random(seed)
    h = Harness("file", tmp_path, max_memory_size=600, max_journal_size=2000)
    queue: list[int] = []  # the model: item ids in the queue (always in id order)
    live: dict[str, list[int]] = {}
    expires: dict[str, int] = {}
    ended: dict[str, str] = {}
    next_id = 1
    for step in range(500):
        now = T0 + 100 * step
        op = rng.random()
        if op < 0.33:
            assert h.q.add(b"%05d" % next_id + b"." * rng.randrange(40), now=now)
            queue.append(next_id)
            next_id += 1
        elif op < 0.45:
            item = h.q.remove(now)
            assert (item.id if item else None) == (queue.pop(0) if queue else None)
        elif op < 0.6:
            key = f"k{rng.randrange(40)}"
            n = 1 + rng.randrange(6)
            if key in ended:
                with pytest.raises(LeaseKeyEnded):
                    h.q.take_keyed(key, n, 0, now)
            elif key in live:
                view = h.q.keyed(key)
                assert view is not None and view.count == len(live[key])
                h.q.take_keyed(key, view.max_items, 0, now)
            else:
                lease_ms = rng.choice([500, 3000, 0])
                lease = h.q.take_keyed(key, n, lease_ms, now)
                assert (lease.count if lease else 0) == min(n, len(queue))
                if lease is not None:
                    live[key], queue = queue[:n], queue[n:]
                    expires[key] = lease.expires_at
        elif op < 0.68 and live:
            key = rng.choice(sorted(live))
            assert h.q.ack_keyed(key) == len(live.pop(key))
            ended[key] = "acked"
        elif op < 0.76 and live:
            key = rng.choice(sorted(live))
            assert h.q.release_keyed(key) == len(live[key])
            queue = sorted(queue + live.pop(key))
            ended[key] = "released"
        elif op < 0.8 and live:
            key = rng.choice(sorted(live))
            expires[key] = h.q.renew_keyed(key, 2000, now)
        elif op < 0.86:
            due = sorted(k for k in live if expires[k] <= now)
            assert h.q.expire_keyed(now) == sum(len(live[k]) for k in due)
            for key in due:
                queue = sorted(queue + live.pop(key))
                ended[key] = "expired"
        elif op < 0.9:
            h.q.log.rotate()
        elif op < 0.95:
            h.q.compact()
            h.q.expire_keyed(T0)  # (nothing is due at T0: the lease files' upkeep only)
        else:
            h.restart()
        assert len(h.q) == len(queue), step
    q = h.restart()
    for key, ids in live.items():
        assert list(q.keyed_slice(key, 0, len(ids)).item_ids) == ids
    for key, how in ended.items():
        with pytest.raises(LeaseKeyEnded, match=how):
            q.keyed(key)
    assert [x.id for x in iter(lambda: q.remove(T0), None)] == queue
    q.close()
    assert len(h.lease_files()) >= len(live)  # (and released ones until a compaction)
