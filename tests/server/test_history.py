"""The dashboard's rings: bounded, aligned, rates from consecutive samples."""

from __future__ import annotations

from tercel.server.history import History


def test_rates_depth_and_a_queue_that_appears_later() -> None:
    h = History(capacity=4, max_queues=8)
    h.record(1000, (10, 100), [("a", 10, 100)])
    h.record(2000, (12, 110), [("a", 8, 104), ("b", 4, 6)])  # b created with 6 added, 2 left
    h.record(4000, (12, 110), [("a", 8, 104), ("b", 4, 6)])
    a = h.series("a")
    assert a == {
        "t": [1.0, 2.0, 4.0],
        "items": [10, 8, 8],
        "in": [None, 4.0, 0.0],
        "out": [None, 6.0, 0.0],
    }
    b = h.series("b")
    assert b is not None and b["items"] == [None, 4, 4]
    assert (b["in"][1], b["out"][1]) == (6.0, 2.0)  # counted from nothing
    server = h.series()
    assert server is not None and server["items"] == [10, 12, 12] and server["in"][1] == 10.0
    assert h.latest_rates() == {None: (0.0, 0.0), "a": (0.0, 0.0), "b": (0.0, 0.0)}


def test_the_ring_keeps_the_last_samples_and_bounds_the_queues() -> None:
    h = History(capacity=3, max_queues=2)
    for i in range(10):
        h.record(i * 1000, (i, i), [("a", i, i), ("b", 0, 0), ("c", 1, 1)])
    assert len(h) == 3
    a = h.series("a")
    assert a is not None and a["t"] == [7.0, 8.0, 9.0] and a["items"] == [7, 8, 9]
    assert a["in"] == [None, 1.0, 1.0] and a["out"] == [None, 0.0, 0.0]
    assert h.tracked("a") and h.tracked("b") and not h.tracked("c")
    assert h.series("c") is None
    h.record(10_000, (0, 10), [("c", 1, 1)])  # a and b deleted: their rings go, c gets one
    assert not h.tracked("a") and h.tracked("c")
    assert h.series("nosuch") is None


def test_a_queue_recreated_between_samples_never_has_negative_rates() -> None:
    h = History(capacity=5)
    h.record(0, (5, 50), [("q", 5, 50)])
    h.record(1000, (1, 51), [("q", 1, 1)])  # deleted and created again with one item
    q = h.series("q")
    assert q is not None and q["in"][1] == 0.0 and q["out"][1] == 4.0
    assert h.latest_rates()["q"] == (0.0, 4.0)
    assert History().latest_rates() == {}


def test_room_and_tracked_names_say_which_queues_a_sample_must_read() -> None:
    h = History(capacity=3, max_queues=2)
    assert (h.room, h.tracked_names()) == (2, [])
    h.record(0, (0, 0), [("a", 0, 0), ("b", 0, 0), ("c", 0, 0)])
    assert (h.room, h.tracked_names()) == (0, ["a", "b"])
    h.record(1000, (0, 0), [("b", 0, 0)])  # a deleted: room for one more
    assert (h.room, h.tracked_names()) == (1, ["b"])
