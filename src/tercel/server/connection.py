"""The protocol-neutral connection: the pump every front end's connection runs on.

A front end subclasses :class:`Connection` (a Kestrel front end through
:class:`tercel.server.kestrel.connection.KestrelConnection`) and fills in its hooks:

- :meth:`Connection.next_command` — the codec's next complete command (None when it needs
  more bytes) and :meth:`Connection.dispatch` — run one command, usually
  :meth:`Connection.perform` with the command's :class:`Operation` from the front end's table.
  The base's :meth:`Connection.run` loops over them; a front end whose hot commands must be
  direct calls (memcache's ``get``/``set``) overrides :meth:`run` with the same loop inlined;
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
:meth:`settle_parked`, and either records its reply in ``out``, clears ``parked`` and calls
:meth:`resume_soon`, or, when the operation has more to do (take more items, stream the next
one), hands that step to :meth:`continue_soon`, which runs it on the next loop pass. So no
handler ever re-enters a queue. A command may also park before it has begun (``begun``
False: a Kestrel command waiting for its queue's replay at start-up); a half-close then lets
it and the commands behind it run first.

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
from collections.abc import Callable
from typing import Any, Final, Protocol

from tercel.errors import TercelError
from tercel.server.auth import LOGIN, MANAGE_ALL, NONE, PUT, SET_STATUS, Guard, User, peer_host
from tercel.server.commit import Holder
from tercel.server.context import ServerContext
from tercel.server.tls import peer_subject

log = logging.getLogger(__name__)

MAX_BUFFERED_WHILE_BLOCKED = 1024 * 1024
"""Stop reading from a client whose operation is parked once this much input waits behind it."""

INLINE_READ_MAX: Final = 64 * 1024
"""A read shorter than this drained the socket: the loop reads this connection no more in
this pass (libuv stops at a read that does not fill its buffer, 256 KiB under uvloop; asyncio
reads once per pass). Then a lone connection's group-commit pass may run inline
(:meth:`Committer.end_batch`): no later read of this pass could have joined it."""


OUT_OF_MEMORY: Final = "out of memory storing object"
"""The reason a connection over ``max_partial_request_bytes`` is refused with (memcached's
words for a request it cannot buffer)."""


class Parked:
    """An operation waiting: the command, its registered waiter, its deadline timer (None when
    the waiter's owner enforces the deadline itself, as beanstalkd's job store does for its
    waiting reservers), what to answer when the deadline passes first, and whether the
    command has begun (False: it waits before running, as for its queue's replay)."""

    __slots__ = ("begun", "command", "on_timeout", "timer", "waiter")

    def __init__(
        self,
        command: Any,
        waiter: object,
        timer: asyncio.TimerHandle | None,
        on_timeout: bytes,
        begun: bool = True,
    ) -> None:
        self.command = command
        self.waiter = waiter
        self.timer = timer
        self.on_timeout = on_timeout
        self.begun = begun

    def cancel_timer(self) -> None:
        """Cancel the deadline timer, if this operation has one."""
        if self.timer is not None:
            self.timer.cancel()


class Timed(Protocol):
    """What :meth:`Connection.park` needs of a waiter: the method its deadline timer calls
    (a Kestrel session's ``PendingRead``)."""

    def timeout(self) -> None: ...


Handler = Callable[[Any, Any], None]
"""A front end's handler: ``handler(conn, cmd)`` appends replies to ``conn.out`` and raises
the tree's errors."""


class Operation:
    """One row of a front end's command table: the operation's name (named in refusals such as
    Kestrel's ``Server not available for operation <name>``, and counted as ``cmd_<name>``
    when the front end counts its commands), its handler, the access it needs
    (``context.ANY``/``READS``/``WRITES``), checked before the handler runs, and the right a
    user needs for it (``auth.NONE``/``PUT``/``TAKE``/``MANAGE``/..., on the command's
    ``queue``), checked first when users are configured. Built once per module, shared by
    every connection."""

    __slots__ = ("access", "counter", "handler", "name", "right")

    def __init__(self, name: str, handler: Handler, access: int, right: int = NONE) -> None:
        self.name = name
        self.handler = handler
        self.access = access
        self.right = right
        self.counter = f"cmd_{name}"


class Connection(Holder):
    """One client connection of any front end (an asyncio protocol by duck typing)."""

    def __init__(self, ctx: ServerContext, front_end: str) -> None:
        self.ctx = ctx
        self.front_end = front_end
        """The listener's name (``memcache``, ...), under which the connection is counted."""
        self.transport: asyncio.Transport | None = None
        self.out: list[bytes] = []
        """Replies of the batch being handled, joined and written once by :meth:`flush`."""
        self.parked: Parked | None = None
        self.closing = False
        """Set to close once the replies owed are out (``quit``, a fatal protocol error)."""
        self.last_active = 0.0
        self.op = ""
        """The name of the operation running (set by :meth:`perform`; error replies name it)."""
        self.counts: dict[str, int] | None = None
        """The front end's ``cmd_<operation>`` counters, counted by :meth:`perform`
        (``ctx.command_counts(front_end)``, shared by its connections); None: not counted."""
        self.guard: Guard | None = None
        """The login state and permission checks (:mod:`tercel.server.auth`); None when no
        user is configured: then a command pays this one attribute test for them."""
        self._write_paused = False
        self._held = 0  # batches of replies the committer holds for this connection
        self._shut = False  # the transport was closed or aborted here: write nothing more
        self._eof = False  # half-closed while a command waits unbegun: close once it ran
        self.partial = 0
        """Bytes of this connection's incomplete input counted in ``ctx.partial_bytes``."""

    # ---- the hooks a front end fills in ---------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Hand bytes read from the socket to the codec."""
        raise NotImplementedError

    def buffered(self) -> int:
        """Bytes the codec holds that no command has consumed yet."""
        raise NotImplementedError

    def next_command(self) -> Any:
        """The next command to run, or None when there is none yet (the codec needs more
        bytes, or the command was parked before it began)."""
        raise NotImplementedError

    def dispatch(self, cmd: Any) -> None:
        """Run one command: its replies go to ``out``; it may park, set ``closing`` or raise
        one of the tree's errors. Usually :meth:`perform` with the command's operation."""
        raise NotImplementedError

    def error_reply(self, exc: TercelError) -> None:
        """Append the reply ``exc`` gets on this protocol (and set ``closing`` if the
        connection cannot go on)."""
        raise NotImplementedError

    def refusal(self, reason: str) -> bytes:
        """The line written before closing a refused connection."""
        raise NotImplementedError

    def over_budget(self) -> bytes:
        """The reply before closing a connection whose incomplete request would take the
        server beyond ``max_partial_request_bytes``; by default :meth:`refusal`'s line."""
        return self.refusal(OUT_OF_MEMORY)

    def end_session(self) -> None:
        """Undo what the client holds and no one else may end (a Kestrel session's open
        reads): on a close, and for every connection at shutdown. Nothing here."""

    def denied(self, kind: int, message: str) -> None:
        """Append the reply to a command a user may not run: ``kind`` is ``auth``'s
        UNAUTHENTICATED (no login yet), DENIED (its permissions) or LIMITED (its limits)."""
        raise NotImplementedError

    def auth_reply(self, cmd: Any, failure: str | None) -> None:
        """Append the reply to the login command ``cmd``: None when it succeeded, else why
        not (``auth.LOGIN_FAILURE`` for wrong credentials)."""
        raise NotImplementedError

    def apply_auth(self) -> None:
        """Give the connection a guard when the server has users (none logged in yet), drop
        it when it has none (at the connection's start, and when a reload changes that)."""
        auth = self.ctx.auth
        if auth.enabled:
            if self.guard is None:
                self.guard = guard = Guard(auth, peer_host(self.transport))
                subject = peer_subject(self.transport)  # mutual TLS: the certificate's user
                name = None if subject is None else auth.user_for_subject(subject)
                if name is not None:
                    guard.assume(name)
        elif self.guard is not None:
            self.guard.release()
            self.guard = None

    # ---- the dispatch loop ----------------------------------------------------------------

    def run(self) -> None:
        """Run complete commands (their replies go to ``out``) until there is none left,
        ``parked`` is set or ``closing`` is. A command that raises one of the tree's errors
        ends the call: :meth:`process` hands the error to :meth:`error_reply` and calls again
        for the commands behind it (one call per batch, not per command)."""
        while not self.closing and self.parked is None:
            cmd = self.next_command()
            if cmd is None:
                return
            self.dispatch(cmd)

    def perform(self, op: Operation, cmd: Any) -> None:
        """Run ``cmd`` as ``op``: name it, count it (when the front end counts), check the
        status for its access, call its handler."""
        self.op = op.name
        counts = self.counts
        if counts is not None:
            key = op.counter
            counts[key] = counts.get(key, 0) + 1
        guard = self.guard
        if guard is not None and not self.admitted(guard, op, cmd):
            return
        if op.access:
            self.ctx.check(op.access)
        op.handler(self, cmd)

    def admitted(self, guard: Guard, op: Operation, cmd: Any) -> bool:
        """Whether the connection's user may run ``cmd`` as ``op`` (the refusal is answered
        when not): its right on the command's ``queue``."""
        right = op.right
        if right == SET_STATUS:
            right = NONE if getattr(cmd, "value", None) is None else MANAGE_ALL
        queue = getattr(cmd, "queue", None) if right != NONE and right != LOGIN else None
        name = queue if type(queue) is str else None
        if name is not None and guard.fast(right, name):
            return True
        if not guard.allows(self, right, name, op.name):
            return False
        return right != PUT or guard.within_limits(self)

    def held(self, user: User) -> tuple[int, int]:
        """Items and bytes held by the queues (or tubes) ``user`` may put to, for its
        ``max_items``/``max_bytes`` (only for a user with such limits, on each put)."""
        return 0, 0

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
        elif self.ctx.auth.enabled:
            self.apply_auth()

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
        held = self.buffered()
        if held != self.partial:  # the common read, whole commands only: 0 == 0
            self.track_partial(held)

    def eof_received(self) -> bool | None:
        """The client closed its side: close ours once the replies it is owed are out (some
        may wait for the group commit). A parked operation is cancelled, as on a close;
        except a command parked before it began (waiting for its queue's replay): it and the
        commands behind it run first, then the connection closes as here (:meth:`resume`)."""
        parked = self.parked
        if parked is not None:
            if parked.begun:
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
        self.end_session()
        if self.partial:
            self.ctx.partial_bytes -= self.partial
            self.partial = 0
        self.ctx.connection_closed(self)
        if self.guard is not None:
            self.guard.release()
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
        connection is closing, answering the tree's errors with :meth:`error_reply` (the one
        place they are caught); then flush the replies."""
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

    # ---- the budget of incomplete requests --------------------------------------------------

    def track_partial(self, held: int) -> None:
        """Count ``held`` (the bytes this connection buffers that no command consumed yet) in
        the server's ``ctx.partial_bytes`` instead of what was counted before. When that
        would take the total beyond ``max_partial_request_bytes`` while this connection's
        share grows, the connection is refused instead: :meth:`over_budget`'s reply, then
        closed, its bytes no longer counted. Called after each read whose held bytes changed
        (not for a read of whole commands: nothing held before or after)."""
        ctx = self.ctx
        total = ctx.partial_bytes + held - self.partial
        if held > self.partial and total > ctx.max_partial_bytes and not self.closing:
            ctx.partial_bytes -= self.partial
            self.partial = 0
            ctx.partial_refused += 1
            n = ctx.partial_refused
            if n & (n - 1) == 0:  # 1, 2, 4, 8...: a flood does not flood the log
                log.warning(
                    "max_partial_request_bytes (%d) reached: %d connection(s) refused so far",
                    ctx.max_partial_bytes,
                    n,
                )
            if self.transport is not None:
                self.transport.pause_reading()
            self.out.append(self.over_budget())
            self.closing = True
            self.flush()
            return
        ctx.partial_bytes = total
        self.partial = held

    # ---- parked operations ----------------------------------------------------------------

    def park(self, command: Any, waiter: Timed, timeout_ms: int, on_timeout: bytes) -> None:
        """Park ``command`` until ``waiter`` is served or ``timeout_ms`` passes (then its
        ``timeout()`` runs, whose callback answers ``on_timeout`` through
        :meth:`settle_parked`). The pump stops after the current command."""
        timer = self.ctx.loop.call_later(timeout_ms / 1000, waiter.timeout)
        self.parked = Parked(command, waiter, timer, on_timeout)

    def park_untimed(self, command: Any, waiter: object, on_timeout: bytes) -> None:
        """Park ``command`` on a waiter whose owner keeps the deadline (no timer here): the
        owner's wake-up records the reply, clears ``parked`` and calls :meth:`resume_soon`."""
        self.parked = Parked(command, waiter, None, on_timeout)

    def park_unbegun(self, command: Any, waiter: object) -> None:
        """Park ``command`` before it runs, until ``waiter``'s owner makes it the next to run
        (a Kestrel command waiting for its queue's replay)."""
        self.parked = Parked(command, waiter, None, b"", False)

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
            self.resume_soon()
            return False
        return True

    def continue_soon(
        self, step: Callable[[], bool], abandon: Callable[[], None] | None = None
    ) -> None:
        """Go on with the parked operation on the next loop pass (from a delivery callback,
        which must not re-enter a queue): unpark, then run ``step`` — it takes more items or
        replies, returning True when it parked again — and answer a tree error it raises with
        :meth:`error_reply`; then write what it recorded and, unless it parked again, run the
        commands behind it. If the client left meanwhile, ``abandon`` runs instead (return
        what was taken for a reply that will never go out)."""
        self.ctx.loop.call_soon(self._continue, step, abandon)

    def _continue(self, step: Callable[[], bool], abandon: Callable[[], None] | None) -> None:
        self.parked = None
        if self.transport is None:
            if abandon is not None:
                abandon()
            return
        try:
            parked = step()
        except TercelError as exc:
            self.error_reply(exc)
            parked = False
        if parked:
            self.flush()  # what was found so far goes out while it waits again
        else:
            self.resume()

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
        held = self.buffered()
        if held != self.partial:
            self.track_partial(held)
        parked = self.parked
        if self._eof and (parked is None or parked.begun):
            self.closing = True  # what eof_received would have done (a blocked read ends)
            self.flush()

    # ---- for the server -------------------------------------------------------------------

    def is_idle(self, cutoff: float) -> bool:
        """True when open, not parked and silent since ``cutoff`` (loop time)."""
        return self.parked is None and self.last_active < cutoff and self.transport is not None

    def close(self) -> None:
        """Close the transport (queued replies are still written)."""
        if self.transport is not None:
            self.transport.close()
