"""Named crash windows of the streaming source: the seam its crash tests use.

Production code calls :func:`failpoint` at every step of the fetch → stage → ack → commit →
recover cycle where a crash leaves a different state on disk or on the servers. It does
nothing unless a test installed a hook (:func:`set_hook`), which may raise to simulate a
kill -9 at that point (tests/spark/test_spark_crashes.py): the staging log writes through
unbuffered after each fsync, so abandoning the process state there leaves exactly what a
killed process leaves.
"""

from __future__ import annotations

from collections.abc import Callable

POINTS = (
    "fetch.leased",
    "fetch.staged",
    "fetch.acked",
    "fetch.finishing",
    "fetch.finished",
    "suspects.saved",
    "drop.acked",
    "recover.read",
    "recover.suspects",
    "recover.written",
    "recover.renamed",
    "recover.unlinked",
    "recover.acked",
    "gc.deleted",
)
"""Every fail point, in cycle order (the crash test enumerates pairs of them)."""

_hook: Callable[[str], None] | None = None


def set_hook(hook: Callable[[str], None] | None) -> None:
    """Install (or with None remove) the function called at every fail point."""
    global _hook
    _hook = hook


def failpoint(name: str) -> None:
    """A crash window named ``name`` (one of :data:`POINTS`)."""
    if _hook is not None:
        _hook(name)
