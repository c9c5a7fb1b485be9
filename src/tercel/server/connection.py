"""The protocol-neutral connection: the pump every front end's connection runs on.

A front end subclasses :class:`Connection` and fills in three hooks:

- :meth:`Connection.run` — run the complete commands its sans-IO codec holds (their handlers
  append replies to ``out``) until the codec needs more bytes, an operation parks or the
  connection is closing;
- :meth:`Connection.error_reply` — the reply (or close) that a tercel error gets on its wire;
- :meth:`Connection.refusal` — the one line sent before closing a connection that is refused
  (``max_connections``, shutdown).

The base owns the rest: ``data_received`` counts the bytes and runs every complete command
(stopping at a parked operation, so replies keep their order), then sends all the replies of
the batch as one write — through the group committer when they acknowledge journal records
(held until the records are written, released by :meth:`release`). It stops reading from a
client that does not read its replies (back-pressure) or that piles up input behind a parked
operation, notes when each connection last read (when idle ones are to be closed), and closes
after the last reply owed once the client quit or half-closed.

Parking: an operation that has to wait (a blocked read, ``lease`` on an empty queue, a
``reserve``) calls :meth:`park` with its waiter and deadline; the pump stops there. The
waiter's delivery callback — run inside another connection's command or a timer — calls
:meth:`settle_parked`, records its reply in ``out``, clears ``parked`` and calls
:meth:`resume_soon`, so no handler ever re-enters a queue.

Waiting for a replay: while start-up replays the queues on disk in the background, a command
that reaches a queue not replayed yet parks (:meth:`Connection.wait_for_replay`, called by the
front end's :meth:`run` before the command runs) until the background replay, which turns to
that queue next, has made it ready; it is then the front end's :attr:`Connection.redo`, run
before the next command read. So only that connection waits (its later commands, pipelined or
not, wait behind it: replies keep their order), never the loop.

Errors: a handler raises the tree's errors (``errors.py``) and the pump hands them to
:meth:`error_reply`; anything else is a bug, logged, and the connection is closed.

Like every hot class this subclasses nothing interpreted (docs/architecture.md, "Native
modules"); the loop only calls the ``asyncio.Protocol`` methods defined here. A front end's
connection class must be compiled too (listed in ``setup.py``), since a compiled class cannot
have interpreted subclasses.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

from tercel.errors import TercelError
from tercel.server.commit import Holder
from tercel.server.context import ServerContext
from tercel.session import PendingRead, Session

log = logging.getLogger(__name__)

MAX_BUFFERED_WHILE_BLOCKED = 1024 * 1024
"""Stop reading from a client whose operation is parked once this much input waits behind it."""

INLINE_READ_MAX: Final = 64 * 1024
"""A read shorter than this drained the socket: the loop reads this connection no more in
this pass (libuv stops at a read that does not fill its buffer, 256 KiB under uvloop; asyncio
reads once per pass). Then a lone connection's group-commit pass may run inline
(:meth:`Committer.end_batch`): no later read of this pass could have joined it."""


REPLAY: Final[object] = object()
"""The waiter of a command parked until a queue is replayed (:meth:`Connection.wait_for_replay`)."""


class Parked:
    """An operation waiting for an item: the command, its registered waiter, its deadline
    timer (None when the waiter's owner enforces the deadline itself, as beanstalkd's job
    store does for its waiting reservers) and what to answer when the deadline passes first."""

    __slots__ = ("command", "on_timeout", "timer", "waiter")

    def __init__(
        self,
        command: Any,
        waiter: object,
        timer: asyncio.TimerHandle | None,
        on_timeout: bytes,
    ) -> None:
        self.command = command
        self.waiter = waiter
        self.timer = timer
        self.on_timeout = on_timeout

    def cancel_timer(self) -> None:
        """Cancel the deadline timer, if this operation has one."""
        if self.timer is not None:
            self.timer.cancel()


class Connection(Holder):
    """One client connection of any front end (an asyncio protocol by duck typing)."""

    def __init__(self, ctx: ServerContext, front_end: str) -> None:
        self.ctx = ctx
        self.front_end = front_end
        """The listener's name (``memcache``, ...), under which the connection is counted."""
        self.session = Session(ctx.collection, ctx.max_open_reads, ctx.reservations.table)
        self.transport: asyncio.Transport | None = None
        self.out: list[bytes] = []
        """Replies of the batch being handled, joined and written once by :meth:`flush`."""
        self.parked: Parked | None = None
        self.closing = False
        """Set to close once the replies owed are out (``quit``, a fatal protocol error)."""
        self.last_active = 0.0
        self.reads_clock = True
        """The pump reads the clock into ``ctx.now`` before each batch; a front end whose
        handlers keep their own clock (beanstalkd's job store) turns it off."""
        self.redo: Any = None
        """A command that waited for its queue's replay (:meth:`wait_for_replay`): the front
        end's :meth:`run` runs it (asking :meth:`wait_for_replay` again) before reading the
        next command."""
        self._write_paused = False
        self._held = 0  # batches of replies the committer holds for this connection
        self._shut = False  # the transport was closed or aborted here: write nothing more
        self._eof = False  # half-closed while waiting for a replay: close once it is done

    # ---- the hooks a front end fills in ---------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Hand bytes read from the socket to the codec."""
        raise NotImplementedError

    def buffered(self) -> int:
        """Bytes the codec holds that no command has consumed yet."""
        raise NotImplementedError

    def run(self) -> None:
        """Run complete commands (their replies go to ``out``) until the codec needs more
        data, ``parked`` is set or ``closing`` is. A command that raises one of the tree's
        errors ends the call: the pump hands the error to :meth:`error_reply` and calls
        again for the commands behind it (one call per batch, not per command: the loop
        over commands lives in the front end, where its handlers are direct calls)."""
        raise NotImplementedError

    def error_reply(self, exc: TercelError) -> None:
        """Append the reply ``exc`` gets on this protocol (and set ``closing`` if the
        connection cannot go on)."""
        raise NotImplementedError

    def refusal(self, reason: str) -> bytes:
        """The line written before closing a refused connection."""
        raise NotImplementedError

    # ---- asyncio callbacks ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but they quack alike.
        t: asyncio.Transport = transport  # type: ignore[assignment]
        self.transport = t
        self.last_active = self.ctx.loop.time()
        if not self.ctx.connection_opened(self):
            t.write(self.refusal("too many connections"))
            self.closing = True
            t.close()

    def data_received(self, data: bytes) -> None:
        ctx = self.ctx
        ctx.bytes_read += len(data)
        if ctx.tracks_idle:  # only with client_timeout: a clock read per read otherwise
            self.last_active = ctx.loop.time()
        self.feed(data)
        if self.parked is None:
            committer = ctx.committer
            committer.begin_batch()
            try:
                self.process()
            finally:  # a lone connection's records are written and its replies sent now
                committer.end_batch(len(data) < INLINE_READ_MAX and len(ctx.connections) == 1)
        elif self.buffered() > MAX_BUFFERED_WHILE_BLOCKED and self.transport is not None:
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        """The client closed its side: close ours once the replies it is owed are out (some
        may wait for the group commit). A parked operation is cancelled, as on a close;
        except a command waiting for its queue's replay, which has not begun: it and the
        commands behind it run once the queue is ready, then the connection closes as here
        (:meth:`resume`)."""
        parked = self.parked
        if parked is not None:
            if parked.waiter is not REPLAY:
                return None  # asyncio.Protocol's default: the transport closes now
            self._eof = True
            return True
        self.closing = True
        self.flush()
        return True  # keep the transport open until the flush closes it

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self.parked is not None:
            self.parked.cancel_timer()
            self.parked = None
        self.session.close()
        self.ctx.connection_closed(self)
        self.transport = None

    def pause_writing(self) -> None:
        self._write_paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self.transport is not None and self.parked is None:
            self.transport.resume_reading()

    # ---- the pump -------------------------------------------------------------------------

    def process(self) -> None:
        """Run every complete command until the codec needs data, an operation parks or the
        connection is closing; then flush the replies."""
        if self.reads_clock:
            ctx = self.ctx
            ctx.now = ctx.clock.now_ms()  # one clock read per batch (Redis caches its clock too)
        while not self.closing and self.parked is None:
            try:
                self.run()
                break
            except TercelError as exc:
                self.error_reply(exc)
            except Exception:
                log.exception("bug while serving a command; closing the connection")
                self.out.clear()
                self.closing = True
        self.flush()

    def flush(self) -> None:
        """Write the replies recorded so far (held by the committer while it has records
        to write); close when closing and nothing is owed any more."""
        out = self.out
        if out:
            data = b"".join(out)
            out.clear()
            committer = self.ctx.committer
            if committer.holding:
                committer.hold(self, data)
                self._held += 1
                return
            self._write(data)
        elif self.closing and self.transport is not None and not self._held:
            self.transport.close()  # (with replies held, the last one's release closes)

    def release(self, data: bytes) -> None:
        """Write replies the committer held, now that what they acknowledge is journaled."""
        self._held -= 1
        self._write(data)

    def _write(self, data: bytes) -> None:
        """Write replies; once closing, close after the last batch (none held any more), so
        replies to requests sent before ``quit`` or a half-close still go out."""
        transport = self.transport
        if transport is None or self._shut:
            return
        self.ctx.bytes_written += len(data)
        transport.write(data)
        if self.closing and not self._held:
            self._shut = True
            transport.close()

    def fail(self) -> None:
        """Drop the connection without the replies whose records could not be written."""
        self.closing = True
        self._shut = True
        if self.transport is not None:
            self.transport.abort()

    # ---- parked operations ----------------------------------------------------------------

    def park(self, command: Any, waiter: PendingRead, timeout_ms: int, on_timeout: bytes) -> None:
        """Park ``command`` until ``waiter`` is served or ``timeout_ms`` passes; then
        ``on_timeout`` is the reply. The pump stops after the current command."""
        timer = self.ctx.loop.call_later(timeout_ms / 1000, waiter.timeout)
        self.parked = Parked(command, waiter, timer, on_timeout)

    def park_untimed(self, command: Any, waiter: object, on_timeout: bytes) -> None:
        """Park ``command`` on a waiter whose owner keeps the deadline (no timer here): the
        owner's wake-up records the reply, clears ``parked`` and calls :meth:`resume_soon`."""
        self.parked = Parked(command, waiter, None, on_timeout)

    def settle_parked(self, item: object) -> bool:
        """The common start of every parked operation's delivery callback.

        Cancels the deadline timer; on a timeout (``item`` None) records the timeout reply,
        unparks and resumes the pump on the next loop pass. Returns True when there is an item
        to deliver (the connection stays parked until the callback unparks it), False when
        there is nothing more to do.
        """
        parked = self.parked
        if parked is None:
            return False
        parked.cancel_timer()
        if item is None:
            self.parked = None
            self.out.append(parked.on_timeout)
            self.ctx.loop.call_soon(self.resume)
            return False
        return True

    def wait_for_replay(self, command: Any, every_queue: bool) -> bool:
        """Park ``command`` when it reaches a queue on disk not replayed yet while the
        background replay runs: its ``queue`` (and where an add to it goes: alias
        destinations, fanout children, see :meth:`QueueCollection.pending_reached`), or with
        ``every_queue`` (``flush_all``) any pending queue. True when parked: the replay turns
        to that queue next and, once it is ready, :meth:`_replayed` makes ``command`` the
        :attr:`redo` and resumes the pump, whose :meth:`run` asks again (a command reaching
        several pending queues waits for one after another). A command that names no queue
        never waits."""
        coll = self.ctx.collection
        if every_queue:
            name = coll.pending_any()
        else:
            queue = getattr(command, "queue", None)
            name = coll.pending_reached(queue) if type(queue) is str else None
        if name is None:
            return False
        self.parked = Parked(command, REPLAY, None, b"")
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

    def resume_soon(self) -> None:
        """Resume the pump on the next loop pass (from a delivery callback)."""
        self.ctx.loop.call_soon(self.resume)

    def resume(self) -> None:
        """Go on with the commands that waited behind a parked operation."""
        if self.transport is None:
            return
        if not self._write_paused:
            self.transport.resume_reading()
        self.process()
        parked = self.parked
        if self._eof and (parked is None or parked.waiter is not REPLAY):
            self.closing = True  # what eof_received would have done (a blocked read ends)
            self.flush()

    # ---- for the server -------------------------------------------------------------------

    def is_idle(self, cutoff: float) -> bool:
        """True when open, not parked and silent since ``cutoff`` (loop time)."""
        return self.parked is None and self.last_active < cutoff and self.transport is not None

    def end_session(self) -> None:
        """Cancel a parked read and return every open read (shutdown)."""
        self.session.close()

    def close(self) -> None:
        """Close the transport (queued replies are still written)."""
        if self.transport is not None:
            self.transport.close()
