"""A front end as the server's lifecycle sees it: one row of the listener table, and what its
start hook returns.

A :class:`FrontEnd` row names the listener and the ``[server]`` key of its port, and loads the
front end's start hook (its modules are imported only for a listener that runs). At start-up
:class:`~tercel.server.app.Server` calls the hook with the server's context, once, before
anything listens; the :class:`Running` it returns makes each accepted socket's connection,
gives the front end's own counters to the stats, and is stopped by the server's one stop
sequence (after the listeners closed, before the sessions end and the journals are written).
A front end that keeps nothing beside its connections (memcache, text, Thrift) is
:func:`stateless`; one with state of its own (beanstalkd's job store and job log) returns its
own :class:`Running` (``server/beanstalk/frontend.py``).

This module knows no front end: the rows are in ``server/app.py`` (``FRONT_ENDS``) and in the
commands that run a server of their own rows (``tercel beanstalkd``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tercel.server.connection import Connection
from tercel.server.context import ServerContext
from tercel.server.figures import Reading

Counters = Callable[[], list[Reading]]
"""A front end's own figures, read at each stats snapshot (``figures.read(FIGURES, source)``;
plain dict counters through ``figures.counts``)."""
Labelled = Callable[[], Iterable[tuple[str, list[Reading]]]]
"""A front end's figures per entity (per tube): ``(entity, readings)`` pairs, read lazily."""


class Running:
    """A started front end (what a start hook returns).

    Subclasses override :meth:`connection`, and :meth:`stop` when they keep state; they set
    :attr:`counters` and :attr:`labelled` to export figures of their own (the server registers
    them under the row's name: ``ServerContext.add_counters``/``add_labelled``).
    """

    counters: Counters | None = None
    """Its own counters (``cmd_*``, levels), or None."""
    labelled: tuple[str, Labelled] | None = None
    """Its per-entity counters and the label they are exported under, or None."""

    def connection(self) -> Connection:
        """The connection of one accepted socket (called by the loop, once per accept)."""
        raise NotImplementedError

    async def stop(self) -> None:
        """Stop what the front end keeps beside its connections (timers, its own log): called
        once, after the listeners closed and before the server ends the sessions, writes and
        syncs the journals. Its connections are still open; it may close them."""


class Stateless(Running):
    """A front end whose connections are all it has (memcache, text, Thrift)."""

    def __init__(self, ctx: ServerContext, cls: Callable[[ServerContext], Connection]) -> None:
        self.ctx = ctx
        self.cls = cls

    def connection(self) -> Connection:
        return self.cls(self.ctx)


StartHook = Callable[[ServerContext], Running]
"""Starts a front end in a server: given the context, before anything listens. May raise
(a corrupt log, a directory in use): the start fails and nothing listens."""


def stateless(cls: Callable[[ServerContext], Connection]) -> StartHook:
    """The start hook of a front end that keeps no state beside its connections."""

    def start(ctx: ServerContext) -> Running:
        return Stateless(ctx, cls)

    return start


@dataclass(frozen=True)
class FrontEnd:
    """One row of the listener table."""

    name: str
    """The listener's name: its key in the ports file, ``/server_info`` and the stats, and in
    the early-bound sockets given to the server."""
    setting: str | None
    """The ``[server]`` key (and ``--<key>`` flag) of its port; None there: no listener. None
    here: the row listens only on a socket bound for it and given to the server."""
    load: Callable[[], StartHook] | None
    """Imports the front end and returns its start hook; None: this front end is not built
    yet. Called by ``Server.start`` for the front ends that will listen only, before anything
    listens: an import that fails stops the start, never a live server at its first
    connection."""
