"""Queue policies with a manual clock: the expiry sweep and its per-queue limit, queue expiry
(``max_queue_age``), and the edges of fanout and aliases that the wire tests cannot reach.
"""

from __future__ import annotations

from typing import Any

from tercel.clock import ManualClock
from tercel.config import QueueConfig, parse_config
from tercel.core.collection import QueueCollection
from tercel.journal import MemoryJournal

T0 = 1_700_000_000_000


def make(doc: dict[str, Any] | None = None) -> tuple[QueueCollection, ManualClock]:
    clock = ManualClock(T0)
    journals: dict[str, MemoryJournal] = {}

    def open_log(name: str, config: QueueConfig) -> MemoryJournal:
        return journals.setdefault(name, MemoryJournal())

    return QueueCollection(parse_config(doc or {}), open_log, clock), clock


def items(qc: QueueCollection, name: str) -> list[bytes]:
    q = qc.queue(name)
    assert q is not None
    return [i.data for i in q.items_in_memory()]


# ---- the expiry sweep ----------------------------------------------------------------------


def test_sweep_is_limited_per_queue_per_round() -> None:
    qc, clock = make({"queues": {"max_expire_sweep": 2, "big": {"max_expire_sweep": 10}}})
    for name in ("a", "b", "big"):
        for i in range(5):
            assert qc.add(name, b"%d" % i, T0 + 10, T0)
    clock.advance(11)
    # Each round expires at most 2 from a and from b, and up to 10 from big.
    assert qc.flush_all_expired() == 2 + 2 + 5
    assert (len(items(qc, "a")), len(items(qc, "b")), len(items(qc, "big"))) == (3, 3, 0)
    assert qc.flush_all_expired() == 4
    assert qc.flush_all_expired() == 2
    assert qc.flush_all_expired() == 0
    assert qc.flush_expired("a") == 0
    a = qc.queue("a")
    assert a is not None and a.expired_items == 5


def test_flush_expired_of_one_queue_is_bounded_too() -> None:
    qc, clock = make({"queues": {"max_expire_sweep": 3}})
    for i in range(7):
        qc.add("q", b"%d" % i, T0 + 1, T0)
    clock.advance(2)
    assert [qc.flush_expired("q") for _ in range(4)] == [3, 3, 1, 0]


def test_expiry_is_strictly_after_the_deadline_and_only_at_the_head() -> None:
    qc, clock = make()
    qc.add("q", b"live", None, T0)
    qc.add("q", b"due", T0 + 5, T0)
    clock.advance(5)
    assert qc.flush_all_expired() == 0  # expiry < now, not <=
    clock.advance(1)
    # An expired item behind a live head stays until it reaches the head (Kestrel).
    assert qc.flush_all_expired() == 0
    assert items(qc, "q") == [b"live", b"due"]
    q = qc.queue("q")
    assert q is not None
    got = q.remove()
    assert got is not None and got.data == b"live"
    assert qc.flush_all_expired() == 1


def test_max_age_caps_the_expiry_at_add() -> None:
    qc, clock = make({"queues": {"max_age": 100}})
    qc.add("q", b"no expiry", None, T0)
    qc.add("q", b"later", T0 + 10_000, T0)
    qc.add("q", b"sooner", T0 + 50, T0)
    q = qc.queue("q")
    assert q is not None
    assert [i.expiry for i in q.items_in_memory()] == [T0 + 100, T0 + 100, T0 + 50]
    clock.advance(101)
    assert qc.flush_all_expired() == 3


def test_expired_items_move_in_bounded_rounds_to_their_queue() -> None:
    qc, clock = make({"queues": {"src": {"expire_to_queue": "dlq", "max_expire_sweep": 1}}})
    qc.add("src", b"1", T0 + 1, T0)
    qc.add("src", b"2", T0 + 1, T0)
    clock.advance(2)
    assert qc.flush_all_expired() == 1
    assert items(qc, "dlq") == [b"1"]
    assert qc.flush_all_expired() == 1
    assert items(qc, "dlq") == [b"1", b"2"]
    dlq = qc.queue("dlq")
    assert dlq is not None and all(i.expiry == 0 for i in dlq.items_in_memory())


def test_expire_to_an_alias_goes_to_each_destination() -> None:
    qc, clock = make({"queues": {"src": {"expire_to_queue": "al"}}, "aliases": {"al": ["x", "y"]}})
    qc.add("src", b"old", T0 + 1, T0)
    clock.advance(2)
    assert qc.flush_expired("src") == 1
    assert (items(qc, "x"), items(qc, "y")) == ([b"old"], [b"old"])


# ---- queue expiry (max_queue_age) ----------------------------------------------------------


def test_empty_queue_older_than_max_queue_age_is_deleted() -> None:
    qc, clock = make({"queues": {"max_queue_age": 1000, "keep": {"max_queue_age": 0}}})
    qc.get_or_create("temp")
    qc.get_or_create("keep")
    clock.advance(1000)
    assert qc.delete_expired_queues() == []  # strictly older
    clock.advance(1)
    assert qc.delete_expired_queues() == ["temp"]
    assert qc.queue("temp") is None and qc.queue("keep") is not None
    assert (qc.stats.queue_expires, qc.stats.queue_deletes) == (1, 1)
    # A later reference makes a new, empty queue whose age starts now.
    qc.get_or_create("temp")
    clock.advance(500)
    assert qc.delete_expired_queues() == []


def test_a_queue_in_use_is_not_expired() -> None:
    qc, clock = make({"queues": {"max_queue_age": 10}})
    qc.add("items", b"x", None, T0)
    opened = qc.get_or_create("opened")
    qc.add("opened", b"y", None, T0)
    taken = opened.remove_open()
    assert taken is not None
    clock.advance(11)
    assert qc.delete_expired_queues() == []
    # Once the item is gone and the open read ends, the queues go.
    items_q = qc.queue("items")
    assert items_q is not None and items_q.remove() is not None
    assert opened.confirm(taken[0])
    assert sorted(qc.delete_expired_queues()) == ["items", "opened"]


def test_an_expired_fanout_child_stops_receiving() -> None:
    qc, clock = make({"queues": {"orders+tmp": {"max_queue_age": 100}}})
    qc.get_or_create("orders+tmp")
    qc.add("orders", b"1", None, T0)
    assert qc.children("orders") == ["orders+tmp"]
    child = qc.queue("orders+tmp")
    assert child is not None and child.remove() is not None
    clock.advance(101)
    assert qc.delete_expired_queues() == ["orders+tmp"]
    assert qc.children("orders") == []
    qc.add("orders", b"2", None, clock.now_ms())
    assert qc.queue("orders+tmp") is None
    assert items(qc, "orders") == [b"1", b"2"]


# ---- fanout and alias edges ----------------------------------------------------------------


def test_a_child_with_a_smaller_item_limit_misses_the_item() -> None:
    qc, _ = make({"queues": {"big+small": {"max_item_size": 2}}})
    qc.get_or_create("big+small")
    qc.get_or_create("big+other")
    assert qc.add("big", b"12345", None, T0)
    assert items(qc, "big") == [b"12345"]
    assert items(qc, "big+other") == [b"12345"]
    assert items(qc, "big+small") == []


def test_an_alias_masks_delete_and_flush() -> None:
    qc, _ = make({"aliases": {"al": ["a"]}})
    assert qc.add("al", b"1", None, T0)
    assert not qc.delete("al")
    qc.flush("al")
    assert items(qc, "a") == [b"1"]
    assert qc.queue("al") is None


def test_alias_counts_what_was_put_through_it() -> None:
    qc, _ = make({"queues": {"b": {"max_items": 0}}, "aliases": {"al": ["a", "b"]}})
    assert not qc.add("al", b"abc", None, T0)  # b is full: the AND fails
    assert qc.add("a", b"direct", None, T0)
    assert qc.alias_puts == {"al": [1, 3]}
    assert items(qc, "a") == [b"abc", b"direct"]


def test_reload_swaps_aliases_and_settings_together() -> None:
    qc, _ = make({"aliases": {"al": ["a"]}})
    qc.add("al", b"1", None, T0)
    fresh = parse_config({"queues": {"b": {"max_items": 1}}, "aliases": {"al": ["b"]}})
    qc.reload(fresh)
    assert qc.add("al", b"2", None, T0)
    assert not qc.add("al", b"3", None, T0)
    assert (items(qc, "a"), items(qc, "b")) == ([b"1"], [b"2"])


def test_reload_with_a_smaller_max_age_expires_items_already_queued() -> None:
    from tercel.clock import ManualClock
    from tercel.config import ServerConfig, parse_config
    from tercel.core.collection import QueueCollection
    from tercel.journal import MemoryJournal

    clock = ManualClock()
    coll = QueueCollection(ServerConfig(), lambda name, cfg: MemoryJournal(), clock)
    now = clock.now_ms()
    coll.add("q", b"old", None, now)
    clock.advance(5_000)
    coll.add("q", b"new", None, clock.now_ms())
    coll.reload(parse_config({"queues": {"max_age": "3s"}}))
    q = coll.get_or_create("q")
    item = q.remove()
    assert item is not None and item.data == b"new"  # "old" was 5 s old: expired
    assert q.expired_items == 1


# ---- sync mode (read by the group committer) ----------------------------------------------


def test_sync_mode_is_the_queue_setting_and_none_for_unknown_queues() -> None:
    qc, _ = make({"queues": {"sync_journal": "20ms", "d": {"sync_journal": True}}})
    for name in ("d", "p"):
        qc.get_or_create(name)
    assert qc.sync_mode("d") == 0
    assert qc.sync_mode("p") == 20
    assert qc.sync_mode("missing") is None


def test_reload_with_a_smaller_max_age_caps_items_held_by_open_reads_too() -> None:
    """An item held by an open read (or a lease) when ``reload`` brings a ``max_age`` used to
    keep its old expiry: aborted later, it was handed out again though older than the new
    limit. Issue 21, item 7."""
    clock = ManualClock()
    qc = QueueCollection(parse_config({}), lambda name, cfg: MemoryJournal(), clock)
    qc.add("q", b"held", None, clock.now_ms())
    q = qc.get_or_create("q")
    taken = q.remove_open()
    assert taken is not None
    clock.advance(5_000)
    qc.reload(parse_config({"queues": {"max_age": "3s"}}))
    assert q.abort(taken[0])
    assert q.remove() is None  # 5 s old: expired on its way back to the head
    assert q.expired_items == 1
