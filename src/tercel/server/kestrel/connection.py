"""The connection base of Kestrel's front ends: a client's session, the batch clock and the
wait for a queue's replay, on top of the protocol-neutral pump (:mod:`tercel.server.connection`).

A Kestrel front end (memcache, text, Thrift) subclasses :class:`KestrelConnection` and fills
in :meth:`~KestrelConnection.read_command` (its codec's next complete command, None when it
needs more bytes) and :meth:`~tercel.server.connection.Connection.dispatch`; the base's
:meth:`~KestrelConnection.next_command` puts a command that waited for its queue's replay
first and parks a command that reaches a queue not replayed yet.

Waiting for a replay: while start-up replays the queues on disk in the background, a command
that reaches a queue not replayed yet parks before it runs (:meth:`wait_for_replay`) until the
background replay, which turns to that queue next, has made it ready; it is then the
connection's :attr:`redo`, run before the next command read. So only that connection waits
(its later commands, pipelined or not, wait behind it: replies keep their order), never the
loop.

The clock: every batch reads it once into ``ctx.now`` (:meth:`process`), the time every
handler of the batch sees.
"""

from __future__ import annotations

from typing import Any, Final

from tercel.server.auth import User, held_in
from tercel.server.connection import Connection
from tercel.server.context import ServerContext
from tercel.session import Session

REPLAY: Final[object] = object()
"""The waiter of a command parked until its queue is replayed
(:meth:`KestrelConnection.wait_for_replay`)."""


class KestrelConnection(Connection):
    """One client connection of a Kestrel front end (see the module docstring)."""

    def __init__(self, ctx: ServerContext, front_end: str) -> None:
        super().__init__(ctx, front_end)
        self.session = Session(ctx.collection, ctx.max_open_reads, ctx.reservations.table)
        """The client's open reads and blocked read (Kestrel's transactions)."""
        self.redo: Any = None
        """A command that waited for its queue's replay (:meth:`wait_for_replay`): run before
        the next command read."""

    # ---- the hooks a Kestrel front end fills in -------------------------------------------

    def read_command(self) -> Any:
        """The codec's next complete command, or None when it needs more bytes."""
        raise NotImplementedError

    def waits_for_every_queue(self, cmd: Any) -> bool:
        """True for a command on every queue (``flush_all``): it waits while any queue is
        not replayed yet. A command's queue is its ``queue`` attribute."""
        return False

    # ---- the base's hooks -----------------------------------------------------------------

    def next_command(self) -> Any:
        """The command that waited for its replay, else the codec's next; None when there is
        none or the command must wait for its queue's replay (then it is parked)."""
        cmd = self.redo
        if cmd is None:
            cmd = self.read_command()
            if cmd is None:
                return None
        else:
            self.redo = None
        if self.ctx.collection.replaying_in_background and self.wait_for_replay(
            cmd, self.waits_for_every_queue(cmd)
        ):
            return None
        return cmd

    def process(self) -> None:
        """Read the clock once for the batch (Redis caches its clock too), then run it."""
        ctx = self.ctx
        ctx.now = ctx.clock.now_ms()
        super().process()

    def end_session(self) -> None:
        """Cancel a blocked read and return every open read (a close, or shutdown)."""
        self.session.close()

    def held(self, user: User) -> tuple[int, int]:
        """What the queues ``user`` may put to hold (items, bytes): one pass over the queues,
        for a user with ``max_items``/``max_bytes`` only."""
        return held_in(user, ((q.name, len(q), q.bytes) for q in self.ctx.collection))

    # ---- waiting for a replay -------------------------------------------------------------

    def wait_for_replay(self, command: Any, every_queue: bool) -> bool:
        """Park ``command`` when it reaches a queue on disk not replayed yet while the
        background replay runs: its ``queue`` (and where an add to it goes: alias
        destinations, fanout children, see :meth:`QueueCollection.pending_reached`), or with
        ``every_queue`` (``flush_all``) any pending queue. True when parked: the replay turns
        to that queue next and, once it is ready, :meth:`_replayed` makes ``command`` the
        :attr:`redo` and resumes the pump, which asks again (a command reaching several
        pending queues waits for one after another). A command that names no queue never
        waits."""
        coll = self.ctx.collection
        if every_queue:
            name = coll.pending_any()
        else:
            queue = getattr(command, "queue", None)
            name = coll.pending_reached(queue) if type(queue) is str else None
        if name is None:
            return False
        self.park_unbegun(command, REPLAY)
        coll.wait_for(name, self._replayed)
        return True

    def _replayed(self) -> None:
        """The queue a parked command waited for is replayed (or the background replay
        ended): that command is the next to run, on the next loop pass."""
        parked = self.parked
        if parked is None or parked.waiter is not REPLAY or self.ctx.stopping:
            return  # the connection went away, or the server is stopping
        self.parked = None
        self.redo = parked.command
        self.resume_soon()
