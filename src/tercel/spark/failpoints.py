"""Named crash windows of the connector: the seam its crash tests use.

Production code calls :func:`failpoint` at every step where a crash leaves a different state
on the servers or in Spark's checkpoint. It does nothing unless a test installed a hook
(:func:`set_hook`, in-process tests) or armed a point with the environment variable
``TERCEL_SPARK_FAILPOINT=<name>[:<hit>]``: then the process that reaches ``name`` for the
``hit``-th time (default 1) ends at once with ``os._exit(137)`` (kill -9 semantics: no
``finally``, no flush). Spark's JVM passes its environment on to the Python processes it
starts (the streaming source runner, the sink's commit runner, executors' workers), so the
variable arms every process of a driver started with it.
"""

from __future__ import annotations

import os
from collections.abc import Callable

POINTS = (
    "source.planned",
    "source.partitions",
    "source.read",
    "source.commit.before",
    "source.commit.after",
    "sink.write",
    "sink.commit",
)
"""Every fail point, in the order a batch reaches them."""

ENV = "TERCEL_SPARK_FAILPOINT"

_hook: Callable[[str], None] | None = None
_armed: tuple[str, int] | None = None
_seen = 0
_parsed = False


def set_hook(hook: Callable[[str], None] | None) -> None:
    """Install (or with None remove) the function called at every fail point."""
    global _hook
    _hook = hook


def _arm() -> tuple[str, int] | None:
    global _armed, _parsed
    _parsed = True
    spec = os.environ.get(ENV, "")
    if not spec:
        return None
    name, _, hit = spec.partition(":")
    _armed = (name, int(hit) if hit else 1)
    return _armed


def failpoint(name: str) -> None:
    """A crash window named ``name`` (one of :data:`POINTS`)."""
    global _seen
    if _hook is not None:
        _hook(name)
    armed = _armed if _parsed else _arm()
    if armed is not None and armed[0] == name:
        _seen += 1
        if _seen == armed[1]:
            os._exit(137)
