""":class:`tercel.core.items.Items` behaves as the ``deque`` it replaced, whatever the sequence
of operations (the cuts and gaps of its list never show)."""

from __future__ import annotations

import gc
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tercel.core.items import CUT_AT, Items, QItem

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 200)),
        st.tuples(st.just("popleft"), st.integers(0, 200)),
        st.tuples(st.just("appendleft"), st.integers(1, 50)),
        st.tuples(st.just("put_back"), st.integers(0, 10_000)),
        st.tuples(st.just("clear"), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_items_match_a_deque(ops: list[tuple[str, int]]) -> None:
    """Item ids stay in order, as in a queue: appends take ids above every other, items
    put before the head ids below the head's, returns (put_back) ids below both."""
    items = Items()
    model: deque[QItem] = deque()
    next_id, before = 1_000_000, 999_999
    for op, n in ops:
        if op == "append":
            for _ in range(n):
                item = QItem(next_id, 0, 0, b"x")
                next_id += 1
                items.append(item)
                model.append(item)
        elif op == "popleft":
            for _ in range(min(n, len(model))):
                assert items.popleft() is model.popleft()
        elif op == "appendleft":
            if model and model[0].id <= before:
                continue  # a returned item with a low id is the head: none go before it
            for _ in range(n):
                item = QItem(before, 0, 0, b"")
                before -= 1
                items.appendleft(item)
                model.appendleft(item)
        elif op == "put_back":
            item = QItem(n, 0, 0, b"")
            items.put_back(item)
            # before the first item after the head with an id as large or larger
            if not model or n < model[0].id:
                model.appendleft(item)
            else:
                at = next((i for i in range(1, len(model)) if model[i].id >= n), len(model))
                model.insert(at, item)
        else:
            items.clear()
            model.clear()
        assert len(items) == len(model)
        assert bool(items) == bool(model)
        assert list(items) == list(model)
        if model:
            assert items.first() is model[0] and items.last() is model[-1]
            assert items[0] is model[0] and items[-1] is model[-1]
            assert items[len(model) - 1] is model[-1] and items[-len(model)] is model[0]


def test_empty_items_raise_index_error() -> None:
    items = Items()
    for call in (items.first, items.last, items.popleft):
        with pytest.raises(IndexError):
            call()
    items.append(QItem(1, 0, 0, b""))
    items.append(QItem(2, 0, 0, b""))
    items.popleft()
    with pytest.raises(IndexError):
        items[-2]
    with pytest.raises(IndexError):
        items[1]


def test_taken_slots_are_cut_off_and_not_kept() -> None:
    """The list does not grow without bound while items pass through, and taken items are
    not referenced any more."""
    items = Items()
    for i in range(10 * CUT_AT):
        items.append(QItem(i, 0, 0, b""))
        items.append(QItem(i, 0, 0, b""))
        items.popleft()
        assert items.slots <= 2 * len(items) + CUT_AT
    taken = items.popleft()
    assert not any(isinstance(r, list) for r in gc.get_referrers(taken))  # its slot let go
