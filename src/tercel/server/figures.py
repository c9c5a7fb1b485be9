"""A figure is declared once: its name, kind, help, where its value comes from and where it is
shown; every stats surface renders the declarations.

A :class:`Figure` says

- ``name``: its key in its protocol's own stats (a memcache ``stats`` line, a beanstalkd
  ``stats``/``stats-tube`` key);
- ``kind``: :data:`COUNTER` (only grows), :data:`GAUGE` (a level) or :data:`LABEL` (text);
  the admin port puts it in ``counters``, ``gauges`` or ``labels`` of ``/stats.json`` and
  makes a Prometheus counter (``<name>_total``) or gauge of it in ``/metrics`` (a label is
  not exported to Prometheus);
- ``help``: one sentence, the ``# HELP`` of ``/metrics`` (and docs);
- ``read``: a function of its *source* (what one scope of figures reads: the server, one
  queue, one beanstalkd tube...) returning the value;
- where it is shown: ``wire`` (on its protocol's stats; default yes), ``admin`` (its key on
  the admin port, ``""`` for ``name``, None for nowhere), ``dashboard`` (its key in
  ``/dashboard.json``, None for nowhere).

The declarations of a scope are one tuple, in the order the protocol lists them (Kestrel's
``stats``: ``server/kestrel_figures.py``; beanstalkd's: ``server/beanstalk/service.py``). A surface
reads only the figures it shows (:func:`read`), so a figure only the dashboard shows costs
``stats`` nothing. A front end's own figures reach the server-wide surfaces (memcache
``stats`` as ``<front end>_<admin name>``, ``/stats.json`` as ``<front end>/<admin name>``,
``/metrics`` as ``tercel_<front end>_<admin name>``) as :data:`Reading` lists, registered
with :meth:`~tercel.server.context.ServerContext.add_counters`.

This module knows no server object: the scopes' sources are their declarers' business.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

S = TypeVar("S")


class Kind(enum.Enum):
    """What a figure's value is (decides the admin group and the Prometheus type)."""

    COUNTER = "counter"
    GAUGE = "gauge"
    LABEL = "label"


COUNTER = Kind.COUNTER
GAUGE = Kind.GAUGE
LABEL = Kind.LABEL

WIRE = "wire"
ADMIN = "admin"
DASHBOARD = "dashboard"
VIEWS = (WIRE, ADMIN, DASHBOARD)
"""The surfaces a figure can be shown on: its protocol's own stats (``wire``: memcache
``stats``/``dump_stats``, beanstalkd ``stats``/``stats-tube``, and for a front end's figures the
``<front end>_*`` lines of memcache ``stats``), the admin port (``/stats.json``, ``/metrics``)
and the dashboard (``/dashboard.json``)."""


@dataclass(frozen=True, slots=True)
class Figure(Generic[S]):
    """One figure: see the module docstring."""

    name: str
    kind: Kind
    help: str
    read: Callable[[S], Any]
    admin: str | None = ""
    """Its key on the admin port (``""``: ``name``; None: not shown there)."""
    wire: bool = True
    """Shown on its protocol's own stats."""
    dashboard: str | None = None
    """Its key in ``/dashboard.json`` (None: not shown there)."""
    omit_zero: bool = False
    """Listed only when its value is not 0 (or empty): a fanout parent's ``children``, a
    queue's ``replaying``."""
    from_config: bool = False
    """Known before its queue is replayed (from its config): the others read 0 then."""

    @property
    def admin_name(self) -> str | None:
        """Its key on the admin port, or None."""
        return self.name if self.admin == "" else self.admin

    def key(self, view: str) -> str | None:
        """Its key on ``view`` (one of :data:`VIEWS`), None when not shown there."""
        if view == WIRE:
            return self.name if self.wire else None
        if view == ADMIN:
            return self.admin_name
        return self.dashboard


Reading = tuple[Figure[Any], Any]
"""A figure and its value now."""


def shown(figures: Sequence[Figure[S]], view: str) -> tuple[Figure[S], ...]:
    """The figures shown on ``view``, in their declared order."""
    return tuple(f for f in figures if f.key(view) is not None)


def read(figures: Iterable[Figure[S]], source: S) -> list[Reading]:
    """Each figure's value now, in order (a figure listed only when not 0 left out when 0)."""
    out: list[Reading] = []
    for f in figures:
        v = f.read(source)
        if f.omit_zero and not v:
            continue
        out.append((f, v))
    return out


def keyed(readings: Iterable[Reading], view: str) -> list[tuple[str, Any]]:
    """``(key on view, value)`` pairs of the readings shown on ``view``."""
    out = []
    for f, v in readings:
        k = f.key(view)
        if k is not None:
            out.append((k, v))
    return out


def _kept(source: object) -> int:  # pragma: no cover - such a figure is never read
    raise TypeError("this figure's value is handed over by its owner (a Reading)")


CURR_CONNECTIONS: Figure[Any] = Figure(
    "curr_connections", GAUGE, "Client connections open now on this front end.", _kept
)
TOTAL_CONNECTIONS: Figure[Any] = Figure(
    "total_connections", COUNTER, "Client connections this front end accepted.", _kept
)
CONNECTIONS = (CURR_CONNECTIONS, TOTAL_CONNECTIONS)
"""Every front end's connection counts (kept by the connection layer, ``server/context.py``)."""

_COUNTERS: dict[str, Figure[Any]] = {}


def counted(name: str, help_text: str = "") -> Figure[Any]:
    """A counter whose value its owner keeps in a dict (``{name: n}``, say a front end's
    ``cmd_<command>`` counts): the same object for the same name."""
    got = _COUNTERS.get(name)
    if got is None:
        text = help_text or f"{name.removeprefix('cmd_')} commands received."
        got = _COUNTERS[name] = Figure(name, COUNTER, text, _kept)
    return got


def counts(values: dict[str, int]) -> list[Reading]:
    """Readings of a dict of counters (keys sorted): see :func:`counted`."""
    return [(counted(k), v) for k, v in sorted(values.items())]
