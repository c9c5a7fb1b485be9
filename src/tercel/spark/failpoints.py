"""Named crash windows of the Spark connector: the seam its crash tests use.

Production code calls :func:`failpoint` at every step where a crash leaves a different state
in Spark's checkpoint or on the servers (docs/spark.md §2 lists what each one tests):

- ``source.planned``: ``latestOffset`` took the batch's keyed leases, before it returns (Spark
  has not logged the offsets yet);
- ``source.partitions``: ``partitions`` was called (Spark wrote the offset log);
- ``source.read``: an executor yielded its first Arrow batch of a slice;
- ``source.commit.before`` / ``source.commit.after``: around ``commit``'s acks;
- ``sink.write``: a sink task mid-write; ``sink.commit``: the sink's driver-side commit.

Two ways to arm them:

- in any process (the driver's source process, an executor's Python worker), the environment
  variable ``TERCEL_SPARK_FAILPOINT=<name>[:<hit>]`` ends the process with ``os._exit(137)``
  (what a kill -9 leaves: nothing flushed, no ``finally``) the ``hit``-th time (default 1st)
  ``name`` is reached in that process;
- in-process tests install a hook with :func:`set_hook`, which may raise.
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
"""Every fail point, in the order a micro-batch reaches them."""

ENV = "TERCEL_SPARK_FAILPOINT"
"""``<name>[:<hit>]``: end this process at the ``hit``-th time ``name`` is reached."""

EXIT_CODE = 137
"""What the process exits with at an armed point (128 + SIGKILL, as after kill -9)."""

_hook: Callable[[str], None] | None = None
_hits: dict[str, int] = {}


def set_hook(hook: Callable[[str], None] | None) -> None:
    """Install (or with None remove) the function called at every fail point."""
    global _hook
    _hook = hook


def armed() -> tuple[str, int] | None:
    """The point and hit :data:`ENV` arms in this process, or None. Raises ValueError for a
    name that is not in :data:`POINTS` or a hit that is not a positive integer."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    name, _, hit = raw.partition(":")
    if name not in POINTS:
        raise ValueError(f"{ENV}={raw!r}: unknown fail point (one of {', '.join(POINTS)})")
    try:
        n = int(hit) if hit else 1
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{ENV}={raw!r}: the hit after ':' must be a positive integer")
    return name, n


def failpoint(name: str) -> None:
    """A crash window named ``name`` (one of :data:`POINTS`): call the hook, then end the
    process if :data:`ENV` arms this point and this is its armed hit."""
    if _hook is not None:
        _hook(name)
    target = armed()
    if target is None or target[0] != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == target[1]:
        os._exit(EXIT_CODE)
