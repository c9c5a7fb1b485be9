"""QueueCollection: creation, fanout, aliases, expire_to_queue, delete/flush, reload.

Run on the RAM twin and on the file journal: the collection only ever sees ``open_log``.
"""

from __future__ import annotations

import errno
import itertools
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tercel.clock import ManualClock
from tercel.config import QueueConfig, ServerConfig, parse_config
from tercel.core.collection import QueueCollection
from tercel.core.queue import PersistentQueue
from tercel.errors import BadQueueName, TooManyQueues
from tercel.journal import FileJournal, MemoryJournal, list_queue_names
from tercel.journal.faults import FaultyFiles
from tercel.journal.files import DataDir

T0 = 1_700_000_000_000


class Logs:
    """An ``open_log`` factory that keeps each queue's storage across collections."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind = kind
        self.path = path
        self.memory: dict[str, MemoryJournal] = {}
        self.opened: list[str] = []
        self.failing: set[str] = set()
        """Names whose log fails to open (EIO)."""

    def __call__(self, name: str, config: QueueConfig) -> MemoryJournal | FileJournal:
        if name in self.failing:
            raise OSError(errno.EIO, "injected")
        self.opened.append(name)
        if self.kind == "file":
            return FileJournal(str(self.path), name)
        return self.memory.setdefault(name, MemoryJournal())

    def names(self) -> list[str]:
        """Queues with stored records."""
        if self.kind == "file":
            return list_queue_names(str(self.path))
        return sorted(n for n, j in self.memory.items() if len(j.data) > 8)


@pytest.fixture(params=["memory", "file"])
def logs(request: pytest.FixtureRequest, tmp_path: Path) -> Logs:
    return Logs(request.param, tmp_path)


class World:
    def __init__(self, logs: Logs, doc: dict[str, Any] | None = None) -> None:
        self.logs = logs
        self.clock = ManualClock(T0)
        self.qc = QueueCollection(parse_config(doc or {}), logs, self.clock)

    def add(self, name: str, data: bytes, expiry: int | None = None) -> bool:
        return self.qc.add(name, data, expiry, self.clock.now_ms())

    def items(self, name: str) -> list[bytes]:
        q = self.qc.queue(name)
        assert q is not None, f"no queue {name}"
        return [i.data for i in q.items_in_memory()]

    def restart(self) -> None:
        self.qc.close()
        self.qc = QueueCollection(self.qc.config, self.logs, self.clock)
        self.qc.load(self.logs.names())


@pytest.fixture
def world(logs: Logs) -> Iterator[World]:
    w = World(logs)
    yield w
    w.qc.close()


def make(logs: Logs, doc: dict[str, Any]) -> World:
    return World(logs, doc)


# ---- creation ------------------------------------------------------------------------------


def test_queues_are_created_on_first_reference(world: World) -> None:
    qc = world.qc
    assert qc.queue("a") is None
    assert len(qc) == 0
    q = qc.get_or_create("a")
    assert qc.get_or_create("a") is q
    assert qc.queue("a") is q
    assert list(qc) == [q]
    assert world.logs.opened == ["a"]
    assert qc.stats.queue_creates == 1


@pytest.mark.parametrize("name", ["", ".", "a/b", "a~b", "a.1", "+a", "x" * 201, "caf\u00e9"])
def test_bad_names_are_refused(world: World, name: str) -> None:
    with pytest.raises(BadQueueName):
        world.qc.get_or_create(name)
    with pytest.raises(BadQueueName):
        world.add(name, b"x")
    assert len(world.qc) == 0


def test_add_counts_and_totals(world: World) -> None:
    assert world.add("a", b"xx")
    assert world.add("b", b"yyy")
    qc = world.qc
    assert (qc.total_length, qc.total_bytes, qc.stats.total_items) == (2, 5, 2)


def test_load_replays_queues_parents_first(logs: Logs) -> None:
    w = World(logs)
    w.qc.get_or_create("a+b")
    w.add("a", b"1")
    w.add("a+b", b"2")
    w.add("c", b"3")
    w.restart()
    assert logs.opened[-3:] == ["a", "c", "a+b"]  # parents (no '+') first
    assert w.items("a") == [b"1"]
    assert w.items("a+b") == [b"1", b"2"]
    assert w.qc.children("a") == ["a+b"]
    assert w.qc.stats.total_items == 4  # replayed adds count
    w.add("a", b"4")
    assert w.items("a+b") == [b"1", b"2", b"4"]
    w.qc.close()


def deferred(w: World) -> QueueCollection:
    """``w`` restarted with its queues noted, not replayed (the server's start-up)."""
    w.qc.close()
    w.qc = QueueCollection(w.qc.config, w.logs, w.clock)
    w.qc.defer(w.logs.names())
    return w.qc


def test_deferred_queues_replay_at_their_first_reference_only(logs: Logs) -> None:
    w = World(logs)
    for name in ("a", "b", "c"):
        w.add(name, name.encode())
    qc = deferred(w)
    opened = len(logs.opened)
    assert (len(qc), qc.pending, list(qc)) == (3, 3, [])
    assert w.items("b") == [b"b"]  # queue() replays b, and only b
    assert logs.opened[opened:] == ["b"]
    assert (len(qc), qc.pending) == (3, 2)
    assert qc.replay_next() == "a"
    assert qc.replay_next() == "c"
    assert qc.replay_next() is None
    assert (len(qc), qc.pending, sorted(q.name for q in qc)) == (3, 0, ["a", "b", "c"])
    assert logs.opened[opened:] == ["b", "a", "c"]  # each replayed once
    w.qc.close()


def test_a_deferred_replay_that_fails_is_the_next_one_again(logs: Logs) -> None:
    """replay_next walks the deferred names once, in order: a replay that raises leaves its
    queue pending and first in line; names replayed meanwhile are skipped."""
    w = World(logs)
    for name in ("a", "b", "c", "d"):
        w.add(name, name.encode())
    qc = deferred(w)
    logs.failing.add("b")
    assert qc.replay_next() == "a"
    with pytest.raises(OSError):
        qc.replay_next()
    assert qc.pending == 3
    assert w.items("c") == [b"c"]  # replayed at its first reference
    logs.failing.clear()
    assert [qc.replay_next() for _ in range(3)] == ["b", "d", None]
    assert (len(qc), qc.pending) == (4, 0)
    w.qc.close()


def test_an_add_to_a_parent_replays_its_deferred_fanout_children_first(logs: Logs) -> None:
    w = World(logs)
    w.qc.get_or_create("p+c")
    w.add("p", b"1")
    qc = deferred(w)
    w.add("p", b"2")  # the child, still on disk, must not miss it
    assert w.items("p+c") == [b"1", b"2"]
    assert qc.children("p") == ["p+c"]
    w.qc.close()


def test_reads_deletes_and_flushes_of_deferred_queues(logs: Logs) -> None:
    w = World(logs, {"aliases": {"al": ["x"]}})
    for name in ("x", "y", "z", "f"):
        w.add(name, b"v")
    qc = deferred(w)
    assert qc.for_reading("y", create=False) is not None
    assert qc.delete("z") and qc.queue("z") is None
    w.add("al", b"w")  # through the alias
    assert w.items("x") == [b"v", b"w"]
    qc.flush("f")
    assert w.items("f") == []
    assert qc.pending == 0
    w.restart()
    assert sorted(logs.names()) == ["f", "x", "y"]
    w.qc.close()


def test_deferred_queues_count_against_max_queues_but_always_load(logs: Logs) -> None:
    w = World(logs)
    for name in ("a", "b"):
        w.add(name, b"v")
    w.qc.close()
    w.qc = QueueCollection(parse_config({"server": {"max_queues": 1}}), logs, w.clock)
    qc = w.qc
    qc.defer(logs.names())
    with pytest.raises(TooManyQueues):
        qc.get_or_create("new")
    assert w.items("b") == [b"v"] and w.items("a") == [b"v"]  # beyond max_queues: on disk
    w.qc.close()


def test_flush_all_replays_every_deferred_queue(logs: Logs) -> None:
    w = World(logs)
    for name in ("a", "b"):
        w.add(name, b"v")
    qc = deferred(w)
    qc.flush_all()
    assert qc.pending == 0 and w.items("a") == [] and w.items("b") == []
    w.qc.close()


def without_checkpoints(w: World) -> QueueCollection:
    """:func:`deferred`, with every checkpoint removed (a data dir from before checkpoints:
    each replay reads every record)."""
    qc = deferred(w)
    for path in w.logs.path.glob("*.checkpoint"):
        path.unlink()
    return qc


def test_a_long_replay_runs_in_slices_between_other_work(tmp_path: Path) -> None:
    """replay_slice stops after the step (about a MiB of journal) that reaches its time
    limit, in the middle of a queue if need be; meanwhile other queues are served, the half
    replayed one counts as pending, and the next call goes on where the last one stopped."""
    w = World(Logs("file", tmp_path))
    for i in range(3000):  # about 3 MiB of journal
        w.add("big", b"%04d" % i + b"x" * 1000)
    w.add("small", b"s")
    qc = without_checkpoints(w)
    ticks = itertools.count()
    answers = []
    while (answer := qc.replay_slice(lambda: float(next(ticks)), 0.0)) == "":
        answers.append(answer)
        half = qc.half_built().get("big")
        assert half is not None and qc.pending == 2
        assert 0 < half.total_items < 3000  # its figures so far
        assert w.add("fresh", b"f")  # another queue, new or replayed, is served meanwhile
    assert len(answers) >= 2 and answer == "big" and not qc.half_built()
    assert qc.replay_slice(time.monotonic, 0.0) == "small"
    assert qc.replay_slice(time.monotonic, 0.0) is None
    big = qc.queue("big")
    assert big is not None and len(big) == 3000 and qc.pending == 0
    assert [i.data[:4] for i in big.items_in_memory()][:2] == [b"0000", b"0001"]
    w.qc.close()


def test_a_reference_to_a_half_replayed_queue_finishes_its_replay(tmp_path: Path) -> None:
    w = World(Logs("file", tmp_path))
    for _ in range(2000):
        w.add("big", b"x" * 1000)
    qc = without_checkpoints(w)
    assert qc.replay_slice(lambda: 1.0, 0.0) == ""
    assert list(qc.half_built()) == ["big"]
    assert w.qc.stats.queue_creates == 0
    big = qc.queue("big")  # the rest of the replay, now
    assert big is not None and len(big) == 2000 and qc.pending == 0 and not qc.half_built()
    assert qc.replay_slice(lambda: 1.0, 0.0) is None
    assert w.qc.stats.queue_creates == 1
    w.qc.close()


def test_a_queue_commands_wait_for_is_replayed_first(tmp_path: Path) -> None:
    """wait_for: the background replay turns to the queue a command waits for (leaving the
    one it is in half built, even when commands wait for that one too), calls back once it is
    ready, then goes on where it was."""
    w = World(Logs("file", tmp_path))
    for _ in range(3000):
        w.add("a_big", b"x" * 1000)
    w.add("b", b"1")
    w.add("c", b"2")
    qc = without_checkpoints(w)
    qc.replaying_in_background = True
    assert qc.replay_slice(lambda: 1.0, 0.0) == ""  # a_big half built
    assert qc.pending_reached("c") == "c" and qc.pending_reached("fresh") is None
    woken: list[str] = []
    qc.wait_for("a_big", lambda: woken.append("a_big"))
    qc.wait_for("c", lambda: woken.append("c"))  # not begun: before the half-built one
    assert qc.replay_slice(lambda: 1.0, 0.0) == "c"
    assert woken == ["c"] and list(qc.half_built()) == ["a_big"]
    answers = []
    while (answer := qc.replay_slice(lambda: 1.0, 0.0)) is not None:
        answers.append(answer)
    assert [a for a in answers if a] == ["a_big", "b"] and woken == ["c", "a_big"]
    big = qc.queue("a_big")
    assert big is not None and len(big) == 3000
    w.qc.close()


def test_the_end_of_the_background_replay_wakes_every_waiting_command(logs: Logs) -> None:
    w = World(logs)
    w.add("a", b"1")
    qc = deferred(w)
    qc.replaying_in_background = True
    woken: list[int] = []
    qc.wait_for("a", lambda: woken.append(1))
    qc.wait_for("a", lambda: woken.append(2))
    qc.stop_background()  # (stopped: no descriptor left, say)
    assert woken == [1, 2] and qc.pending_reached("a") is None and qc.pending == 1
    assert w.items("a") == [b"1"]  # the woken command replays its queue itself
    w.qc.close()


def test_what_a_command_waits_for_is_every_pending_queue_it_reaches(logs: Logs) -> None:
    """pending_reached: the queue named, an alias's destinations, a fanout parent's pending
    children, the expire_to_queue and dead_letter_queue; one at a time, until none is left;
    pending_any for flush_all. Nothing without the background replay."""
    doc = {
        "aliases": {"al": ["d1", "p"]},
        "queues": {"e": {"expire_to_queue": "et", "dead_letter_queue": "dl"}},
    }
    w = make(logs, doc)
    for name in ("d1", "p", "p+c1", "p+c2", "et", "dl", "e", "plain"):
        w.add(name, b"1")
    qc = deferred(w)
    assert qc.pending_reached("plain") is None  # no background replay: first reference
    qc.replaying_in_background = True
    assert qc.pending_reached("plain") == "plain"
    assert qc.pending_reached("fresh") is None
    assert qc.pending_reached("al") == "d1"
    qc.get_or_create("d1")
    assert qc.pending_reached("al") == "p"
    qc.get_or_create("p")
    assert qc.pending_reached("al") == "p+c1" == qc.pending_reached("p")
    qc.get_or_create("p+c1")
    qc.get_or_create("p+c2")
    assert qc.pending_reached("al") is None and qc.pending_reached("p") is None
    qc.get_or_create("e")
    assert qc.pending_reached("e") == "et"
    qc.get_or_create("et")
    assert qc.pending_reached("e") == "dl"
    qc.get_or_create("dl")
    assert qc.pending_reached("e") is None
    assert qc.pending_any() == "plain"
    qc.get_or_create("plain")
    assert qc.pending_any() is None and qc.pending == 0
    qc.stop_background()
    assert w.items("p+c2") == [b"1"]
    w.qc.close()


def test_a_replay_that_fails_half_way_is_done_again_from_the_start(tmp_path: Path) -> None:
    """A replay that raised (here: an I/O error on the second chunk read) gives the queue's
    files back to the data dir's listing: the next attempt replays every record (it used to
    find no files, come up empty and append after the records it had not read)."""
    w = World(Logs("file", tmp_path))
    for i in range(3000):
        w.add("big", b"%04d" % i + b"x" * 1000)
    w.qc.close()
    (tmp_path / "big.checkpoint").unlink()
    ops = FaultyFiles()
    ops.fail("pread", errno.EIO, path="/big", skip=2, times=1)
    files = DataDir(str(tmp_path), ops=ops)
    qc = QueueCollection(
        w.qc.config, lambda n, c: FileJournal(str(tmp_path), n, directory=files), w.clock
    )
    qc.defer(files.queue_names())
    with pytest.raises(OSError):
        while qc.replay_slice(lambda: 1.0, 0.0) is not None:
            pass
    assert qc.pending == 1 and not qc.half_built()
    big = qc.queue("big")  # again, from the start
    assert big is not None and len(big) == 3000
    assert big.peek() is not None and big.peek().data[:4] == b"0000"
    qc.close()


def test_closing_in_the_middle_of_a_replay_leaves_the_queue_as_it_was(tmp_path: Path) -> None:
    logs = Logs("file", tmp_path)
    w = World(logs)
    for _ in range(2000):
        w.add("big", b"x" * 1000)
    qc = without_checkpoints(w)
    assert qc.replay_slice(lambda: 1.0, 0.0) == ""
    qc.close()  # the half-built queue is dropped, its files untouched
    w.qc = QueueCollection(w.qc.config, logs, w.clock)
    w.qc.load(logs.names())
    big = w.qc.queue("big")
    assert big is not None and len(big) == 2000
    w.qc.close()


# ---- fanout --------------------------------------------------------------------------------


def test_fanout_children_get_copies(world: World) -> None:
    qc = world.qc
    world.add("a", b"before")  # no child yet: not copied later
    qc.get_or_create("a+x")
    qc.get_or_create("a+y")
    assert qc.children("a") == ["a+x", "a+y"]
    assert world.add("a", b"one")
    assert world.items("a") == [b"before", b"one"]
    assert world.items("a+x") == [b"one"]
    assert world.items("a+y") == [b"one"]
    assert qc.children("a+x") == []
    assert world.add("a+x", b"direct")  # a child is a queue of its own
    assert world.items("a+x") == [b"one", b"direct"]
    assert world.items("a") == [b"before", b"one"]


def test_fanout_child_registered_by_a_set(world: World) -> None:
    world.add("a+x", b"first")
    assert world.qc.children("a") == ["a+x"]
    assert world.qc.queue("a") is None  # the parent is not created by its child
    world.add("a", b"second")
    assert world.items("a+x") == [b"first", b"second"]


def test_fanout_children_inherit_the_parent_config(logs: Logs) -> None:
    doc = {
        "queues": {
            "max_items": 100,
            "a": {"max_items": 2, "max_age": "1s"},
            "a+own": {"max_items": 5},
        }
    }
    w = make(logs, doc)
    child = w.qc.get_or_create("a+x")
    own = w.qc.get_or_create("a+own")
    other = w.qc.get_or_create("b")
    assert (child.config.max_items, child.config.max_age) == (2, 1000)
    assert (own.config.max_items, own.config.max_age) == (5, 1000)
    assert other.config.max_items == 100
    w.qc.close()


def test_fanout_reply_reflects_only_the_parent(logs: Logs) -> None:
    w = make(logs, {"queues": {"a": {"max_items": 1}, "a+big": {"max_items": 10}}})
    w.qc.get_or_create("a+big")
    w.qc.get_or_create("a+small")  # inherits max_items = 1
    assert w.add("a", b"1")
    assert not w.add("a", b"2")  # the parent is full...
    assert w.items("a+big") == [b"1", b"2"]  # ...but the children were fed first
    assert w.items("a+small") == [b"1"]  # a full child silently misses
    w.qc.delete("a")
    w.qc.get_or_create("a+small").remove()
    assert w.add("a", b"3")  # the parent re-created: its children are still registered
    assert w.items("a+small") == [b"3"]
    w.qc.close()


def test_deleting_a_child_stops_its_feed(world: World) -> None:
    qc = world.qc
    qc.get_or_create("a+x")
    world.add("a", b"1")
    assert qc.delete("a+x")
    assert qc.children("a") == []
    assert qc.queue("a+x") is None
    world.add("a", b"2")
    assert qc.queue("a+x") is None  # not fed, not re-created
    qc.get_or_create("a+x")
    assert world.items("a+x") == []  # re-created empty
    world.add("a", b"3")
    assert world.items("a+x") == [b"3"]


def test_fanout_only_parent_stores_nothing(logs: Logs) -> None:
    w = make(logs, {"queues": {"a": {"fanout_only": True}}})
    assert w.add("a", b"lost")  # no children: a black hole that says STORED
    w.qc.get_or_create("a+x")
    assert w.add("a", b"1")
    assert w.items("a") == []
    assert w.items("a+x") == [b"1"]
    assert w.qc.queue("a+x").config.fanout_only  # type: ignore[union-attr]  # inherited
    w.restart()
    assert w.qc.get_or_create("a").bytes == 0
    assert w.items("a+x") == [b"1"]
    w.add("a", b"2")
    assert w.items("a+x") == [b"1", b"2"]
    w.qc.close()


# ---- aliases -------------------------------------------------------------------------------


def test_alias_writes_to_every_destination(logs: Logs) -> None:
    w = make(logs, {"aliases": {"all": ["a", "b"], "outer": ["all", "c"]}})
    assert w.qc.is_alias("all") and not w.qc.is_alias("a")
    assert w.add("all", b"1")
    assert w.add("outer", b"2")
    assert w.items("a") == [b"1", b"2"]
    assert w.items("b") == [b"1", b"2"]
    assert w.items("c") == [b"2"]
    assert w.qc.queue("all") is None  # an alias is never a queue
    w.qc.close()


def test_alias_succeeds_only_if_every_destination_took_it(logs: Logs) -> None:
    w = make(logs, {"queues": {"a": {"max_items": 1}}, "aliases": {"all": ["a", "b"]}})
    assert w.add("all", b"1")
    assert not w.add("all", b"2")
    assert w.items("a") == [b"1"]
    assert w.items("b") == [b"1", b"2"]  # the other destinations still got it
    w.qc.close()


def test_alias_to_a_fanout_parent(logs: Logs) -> None:
    w = make(logs, {"aliases": {"al": ["a"]}})
    w.qc.get_or_create("a+x")
    w.add("al", b"1")
    assert w.items("a+x") == [b"1"]
    w.qc.close()


# ---- expiry --------------------------------------------------------------------------------


def test_expire_to_queue(logs: Logs) -> None:
    doc = {"queues": {"a": {"expire_to_queue": "dead"}, "dead": {"max_age": 500}}}
    w = make(logs, doc)
    w.add("a", b"1", expiry=T0 + 10)
    w.add("a", b"2", expiry=T0 + 10)
    w.add("a", b"3")
    w.clock.advance(100)
    assert w.qc.flush_expired("a") == 2
    assert w.items("a") == [b"3"]
    assert w.items("dead") == [b"1", b"2"]
    dead = w.qc.queue("dead")
    assert dead is not None
    # No expiry of its own, a new add time, and the target's max_age applies.
    assert [(i.add_time, i.expiry) for i in dead.items_in_memory()] == [(T0 + 100, T0 + 600)] * 2
    w.qc.close()


def test_expire_to_itself_is_ignored(logs: Logs) -> None:
    w = make(logs, {"queues": {"a": {"expire_to_queue": "a"}}})
    w.add("a", b"1", expiry=T0 + 1)
    w.clock.advance(5)
    assert w.qc.flush_expired("a") == 1
    assert w.items("a") == []
    w.qc.close()


def test_flush_expired_and_flush_all_expired(world: World) -> None:
    qc = world.qc
    assert qc.flush_expired("missing") == 0
    assert qc.queue("missing") is None
    world.add("a", b"1", expiry=T0 + 1)
    world.add("a", b"2", expiry=T0 + 1)
    world.add("b", b"3", expiry=T0 + 1)
    world.add("c", b"4")
    world.clock.advance(2)
    assert qc.flush_all_expired() == 3
    assert qc.flush_all_expired() == 0
    assert (qc.total_length, qc.total_bytes) == (1, 1)


# ---- delete and flush ----------------------------------------------------------------------


def test_delete(world: World) -> None:
    qc = world.qc
    assert not qc.delete("missing")
    assert qc.queue("missing") is None
    world.add("a", b"1")
    world.add("b", b"2")
    q = qc.queue("a")
    assert q is not None
    assert qc.delete("a")
    assert q.closed
    assert qc.queue("a") is None
    assert qc.stats.queue_deletes == 1
    assert world.logs.names() == ["b"]
    if world.logs.kind == "file":
        assert os.listdir(world.logs.path) == ["b"]
    assert world.items("b") == [b"2"]
    assert qc.get_or_create("a") is not q
    assert world.items("a") == []


def test_flush(world: World) -> None:
    qc = world.qc
    qc.flush("missing")
    assert qc.queue("missing") is None
    world.add("a", b"1")
    world.add("a", b"2")
    world.add("b", b"3")
    got = qc.get_or_create("a").remove_open()
    qc.flush("a")
    assert world.items("a") == []
    assert world.items("b") == [b"3"]
    assert qc.get_or_create("a").open_reads == 1
    assert got is not None
    qc.get_or_create("a").abort(got[0])
    assert world.items("a") == [b"1"]
    qc.flush_all()
    assert qc.total_length == 0


# ---- configuration -------------------------------------------------------------------------


def test_reload_changes_live_queues(logs: Logs) -> None:
    w = make(logs, {"queues": {"a": {"max_items": 1}}})
    w.add("a", b"1")
    w.qc.get_or_create("a+x")
    w.qc.get_or_create("b")
    assert not w.add("a", b"2")
    new: ServerConfig = parse_config(
        {"queues": {"max_items": 7, "a": {"max_items": 3}}, "aliases": {"al": ["b"]}}
    )
    w.qc.reload(new)
    assert w.qc.config is new
    configs = {q.name: q.config.max_items for q in w.qc}
    assert configs == {"a": 3, "a+x": 3, "b": 7}
    assert w.add("a", b"2")
    assert w.add("al", b"via alias")
    assert w.items("b") == [b"via alias"]
    w.qc.close()


def test_close_closes_every_log(world: World) -> None:
    queues: list[PersistentQueue] = [world.qc.get_or_create(n) for n in ("a", "b")]
    world.qc.close()
    assert all(q.closed for q in queues)


def test_expire_to_queue_failure_is_logged_not_raised(
    logs: Logs, caplog: pytest.LogCaptureFixture
) -> None:
    w = make(logs, {"queues": {"a": {"expire_to_queue": "small"}, "small": {"max_item_size": 1}}})
    w.add("a", b"too big", expiry=T0 + 1)
    w.add("a", b"x", expiry=T0 + 1)
    w.clock.advance(5)
    with caplog.at_level("ERROR", logger="tercel.core.collection"):
        assert w.qc.flush_expired("a") == 2
    assert w.items("small") == [b"x"]
    assert "could not move an expired item from a to small" in caplog.text
    w.qc.close()


# ---- dead letters that cannot be moved (issue 21, item 7) ----------------------------------


@pytest.mark.parametrize("refusal", ["full", "too large", "too many queues"])
def test_an_item_the_dead_letter_queue_refuses_stays_in_its_queue(logs: Logs, refusal: str) -> None:
    """A dead-letter add that fails (the dead-letter queue is full, the item is too large for
    it, or it cannot be created) used to drop the item anyway. It stays at the head of its
    queue and is handed out again: a duplicate delivery rather than a loss."""
    dlq: dict[str, Any] = {"max_items": 1} if refusal == "full" else {"max_item_size": 1}
    doc: dict[str, Any] = {
        "queues": {"work": {"max_deliveries": 1, "dead_letter_queue": "dlq"}, "dlq": dlq}
    }
    if refusal == "too many queues":
        doc = {"server": {"max_queues": 1}, "queues": {"work": doc["queues"]["work"]}}
    w = make(logs, doc)
    if refusal == "full":
        assert w.add("dlq", b"x")
    assert w.add("work", b"job")
    q = w.qc.get_or_create("work")
    xid, _ = q.remove_open()  # type: ignore[misc]
    q.abort(xid)  # delivered once: the next read would dead-letter it
    taken = q.remove_open()
    assert taken is not None and taken[1].data == b"job"  # refused there: handed out again
    assert q.dead_lettered == 0
    q.abort(taken[0])
    w.restart()
    assert w.items("work") == [b"job"]
    w.qc.close()
