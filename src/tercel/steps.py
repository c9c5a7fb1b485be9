"""Work done in steps: a generator that yields between steps and returns a result at the end.

Replay is written this way (``FileJournal.replay_steps``, ``PersistentQueue.replay_steps``) so
that its owner can run a queue's replay a slice at a time between other work (the server's
background replay yields to the event loop between slices) or all at once (:func:`finish`).
A step yields ``None``; what the work returns is the generator's return value.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TypeVar

T = TypeVar("T")
P = TypeVar("P")

Steps = Generator[None, None, T]
"""Resumable work returning a ``T``: ``next()`` runs one step."""


def finish(steps: Steps[T]) -> T:
    """Run ``steps`` to the end; what it returns."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            result: T = stop.value
            return result


def relay(steps: Steps[T], pause: P) -> Generator[P, None, T]:
    """``steps`` inside another generator that yields ``pause`` where ``steps`` yields:
    ``result = yield from relay(steps, PAUSE)``."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            result: T = stop.value
            return result
        yield pause
