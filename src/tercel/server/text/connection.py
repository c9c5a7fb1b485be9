"""Kestrel's text protocol: :class:`TextConnection` and one small handler per command.

The connection runs on the protocol-neutral pump of :mod:`tercel.server.connection`; this
module adds the codec (:mod:`tercel.protocol.kestrel_text`), the handlers and the text form of
tercel's errors: one ``-<message>`` line each, and the connection stays open. Replies are
Kestrel 2.4's (docs/protocol.md, "Text protocol").

Reads are open reads of the connection's session, as in Kestrel: ``get``, ``peek`` and
``monitor`` first confirm every read this connection holds on the queue, and a disconnect
returns what is still open. An item that cannot travel as one line (it holds a LF, or ends in
a CR a reader would take for a line end) is never opened here: the read answers
``-Item ...`` and the item stays at the head for memcache or Thrift. That is also why a blocked
read waits as a peek and, once woken, reads again (checking the head) instead of letting the
queue hand it an item: it may lose the item to another reader and then waits again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from tercel.core.queue import READ_OPEN, READ_PEEK, QItem
from tercel.errors import (
    JournalError,
    OpenReadError,
    ProtocolError,
    QueueError,
    TercelError,
    UnavailableError,
)
from tercel.protocol import kestrel_text as kt
from tercel.protocol.commands import Confirm, Delete, Flush, Simple, Status
from tercel.server.connection import Connection
from tercel.server.context import ANY, READS, WRITES, ServerContext
from tercel.server.kestrel_ops import put_items, set_status
from tercel.server.status import parse_status

DOES_NOT_FIT: Final = (
    "Item holds a line feed or ends in a carriage return; take it over memcache or Thrift."
)


class TextConnection(Connection):
    """One client connection speaking Kestrel's text protocol."""

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx, "text")
        self.codec = kt.TextServerCodec()
        self.op = ""
        """The command being run (named in ``-Server not available for operation <op>``)."""
        self.counts = ctx.command_counts("text")
        """``cmd_<command>``: commands received, refused ones included (``stats``)."""

    # ---- the hooks of server.connection ---------------------------------------------------

    def feed(self, data: bytes) -> None:
        self.codec.receive_data(data)

    def buffered(self) -> int:
        return self.codec.buffered

    def run(self) -> None:
        codec = self.codec
        while not self.closing and self.parked is None:
            cmd = self.redo
            if cmd is None:
                cmd = codec.next_command()
                if cmd is kt.NEED_DATA:
                    return
            else:
                self.redo = None
            # A queue not replayed yet: wait for it, counted once it runs.
            if self.ctx.collection.replaying_in_background and self.wait_for_replay(cmd, False):
                return
            name, handler, access = HANDLERS[type(cmd)]
            self.op = name
            key = f"cmd_{cmd.name if isinstance(cmd, Simple) else name}"
            self.counts[key] = self.counts.get(key, 0) + 1
            if access:
                self.ctx.check(access)
            handler(self, cmd)

    def error_reply(self, exc: TercelError) -> None:
        self.out.append(kt.error(self.message(exc)))

    def refusal(self, reason: str) -> bytes:
        return kt.error(reason)

    def message(self, exc: TercelError) -> str:
        """The ``-`` message of one of tercel's errors (Kestrel's wording where it had one)."""
        if isinstance(exc, ProtocolError | QueueError) and not isinstance(exc, OpenReadError):
            return exc.reason
        if isinstance(exc, OpenReadError):
            return f"Too many open transactions; limit={self.session.max_open_reads}"
        if isinstance(exc, UnavailableError):
            return f"Server not available for operation {self.op}"
        if isinstance(exc, JournalError):
            return "Journal write failed."
        return str(exc)


# ---- reads: get, peek, monitor --------------------------------------------------------------


def _start_read(conn: TextConnection, queue: str, timeout_ms: int | None) -> int:
    """What every read does first: confirm this connection's reads on ``queue``; the deadline
    (epoch ms; 0: do not wait)."""
    conn.session.confirm_all(queue)
    return conn.ctx.now + timeout_ms if timeout_ms else 0


def _head(conn: TextConnection, queue: str, now: int) -> QItem | None:
    q = conn.ctx.collection.for_reading(queue, create=False)
    return None if q is None else q.peek(now)


def _read(conn: TextConnection, cmd: kt.TextGet | kt.TextPeek, deadline: int) -> bool:
    """Answer a get (an open read) or a peek now, or park it until ``deadline``; True when
    parked."""
    session = conn.session
    now = conn.ctx.clock.now_ms()
    head = _head(conn, cmd.queue, now)
    if head is not None:
        if not kt.fits_a_line(head.data):
            conn.out.append(kt.error(DOES_NOT_FIT))
            return False
        got = session.fetch(cmd.queue, _mode(cmd), now)
        if got is not None:
            conn.out += kt.item_parts(got[1].data)
            return False
    return _wait(conn, cmd, deadline, now, _read)


def _mode(cmd: kt.TextGet | kt.TextPeek) -> int:
    return READ_OPEN if isinstance(cmd, kt.TextGet) else READ_PEEK


Step = Callable[[TextConnection, Any, int], bool]


def _wait(conn: TextConnection, cmd: Any, deadline: int, now: int, again: Step) -> bool:
    """Park ``cmd`` until an item is there (then run ``again``) or ``deadline`` passes (then
    ``*``); without time left answer ``*`` now. True when parked."""
    session = conn.session
    if deadline > now:
        pending = session.wait(cmd.queue, READ_PEEK, _woken(conn, cmd, deadline, again))
        if pending is not None:
            conn.park(cmd, pending, deadline - now, kt.NO_ITEM)
            return True
    session.count_miss()
    conn.out.append(kt.NO_ITEM)
    return False


def _woken(
    conn: TextConnection, cmd: Any, deadline: int, again: Step
) -> Callable[[int, QItem | None], None]:
    def delivered(xid: int, item: QItem | None) -> None:
        if conn.settle_parked(item):  # an item is there (a timeout was answered by the base)
            conn.ctx.loop.call_soon(_again, conn, cmd, deadline, again)

    return delivered


def _again(conn: TextConnection, cmd: Any, deadline: int, again: Step) -> None:
    """Run a woken read again on the next loop pass (no handler re-enters a queue)."""
    conn.parked = None
    if conn.transport is None:
        return
    try:
        parked = again(conn, cmd, deadline)
    except TercelError as exc:
        conn.error_reply(exc)
        parked = False
    if parked:
        conn.flush()  # what a monitor streamed so far goes out while it waits
    else:
        conn.resume()


def handle_get(conn: TextConnection, cmd: kt.TextGet) -> None:
    """``get <q> [timeout_ms]``: confirm this connection's reads on q, open one: ``:<item>``
    or ``*``."""
    _read(conn, cmd, _start_read(conn, cmd.queue, cmd.timeout_ms))


def handle_peek(conn: TextConnection, cmd: kt.TextPeek) -> None:
    """``peek <q> [timeout_ms]``: confirm this connection's reads on q; the head, not taken."""
    _read(conn, cmd, _start_read(conn, cmd.queue, cmd.timeout_ms))


def handle_monitor(conn: TextConnection, cmd: kt.TextMonitor) -> None:
    """``monitor <q> <timeout_ms> [max]``: confirm this connection's reads on q, then stream
    open reads as ``:<item>`` lines until ``max`` (default and cap: max_open_reads open on q),
    or the timeout; then ``*``."""
    deadline = _start_read(conn, cmd.queue, cmd.timeout_ms if cmd.timeout_ms > 0 else None)
    limit = conn.session.max_open_reads if cmd.max_items is None else cmd.max_items
    _monitor(conn, _Monitor(cmd.queue, limit), deadline)


class _Monitor:
    """A monitor in progress: its queue and how many items it may still stream."""

    __slots__ = ("left", "queue")

    def __init__(self, queue: str, left: int) -> None:
        self.queue = queue
        self.left = left


def _monitor(conn: TextConnection, mon: _Monitor, deadline: int) -> bool:
    session = conn.session
    now = conn.ctx.clock.now_ms()
    while mon.left > 0 and session.open_count(mon.queue) < session.max_open_reads:
        head = _head(conn, mon.queue, now)
        if head is None:
            break
        if not kt.fits_a_line(head.data):
            conn.out.append(kt.error(DOES_NOT_FIT))  # ends the stream instead of '*'
            return False
        got = session.fetch(mon.queue, READ_OPEN, now)
        if got is None:
            break
        conn.out += kt.item_parts(got[1].data)
        mon.left -= 1
    if mon.left <= 0 or session.open_count(mon.queue) >= session.max_open_reads:
        conn.out.append(kt.NO_ITEM)
        return False
    return _wait(conn, mon, deadline, now, _monitor)


def handle_confirm(conn: TextConnection, cmd: Confirm) -> None:
    """``confirm <q> <count>``: confirm the oldest ``count`` reads -> ``+<count>``, or
    ``-Not that many transactions open.`` (nothing confirmed)."""
    session = conn.session
    if cmd.count > session.open_count(cmd.queue):
        raise QueueError("Not that many transactions open.")
    for _ in range(cmd.count):
        session.confirm_oldest(cmd.queue)
    conn.out.append(kt.count(cmd.count))


# ---- writes and the rest --------------------------------------------------------------------


def handle_put(conn: TextConnection, cmd: kt.TextPut) -> None:
    """``put <q> [expiry_ms]:`` + item lines + an empty line -> ``+<stored>`` (every record
    journaled first). Items refused (queue full, too large) are not counted."""
    conn.out.append(kt.count(put_items(conn.ctx, cmd.queue, cmd.items, cmd.expiry_ms, False)))


def handle_flush(conn: TextConnection, cmd: Flush) -> None:
    conn.ctx.collection.flush(cmd.queue)
    conn.out.append(kt.count(0))


def handle_delete(conn: TextConnection, cmd: Delete) -> None:
    conn.ctx.collection.delete(cmd.queue)
    conn.out.append(kt.count(0))


def handle_status(conn: TextConnection, cmd: Status) -> None:
    """``status`` -> ``:<STATUS>``; ``status <s>`` (any case) -> ``+0``."""
    ctx = conn.ctx
    if cmd.value is None:
        conn.out.append(kt.string(ctx.status.current.name))
        return
    try:
        status = parse_status(cmd.value)
    except ValueError as exc:
        raise QueueError(str(exc)) from None
    set_status(ctx, status)
    conn.out.append(kt.count(0))


def handle_simple(conn: TextConnection, cmd: Simple) -> None:
    conn.op = cmd.name
    if cmd.name == "version":
        conn.out.append(kt.string(conn.ctx.version))
    elif cmd.name == "shutdown":
        conn.out.append(kt.count(0))
        conn.ctx.request_stop()
    else:  # quit: close once the replies owed are out
        conn.closing = True


Operation = tuple[str, Callable[[TextConnection, Any], None], int]
"""A command's name (for ``-Server not available for operation <name>``), its handler and
the access it needs (``context.ANY``/``READS``/``WRITES``), checked by
:meth:`TextConnection.run` before the handler runs."""

HANDLERS: Final[dict[type, Operation]] = {
    kt.TextPut: ("put", handle_put, WRITES),
    kt.TextGet: ("get", handle_get, READS),
    kt.TextPeek: ("peek", handle_peek, READS),
    kt.TextMonitor: ("monitor", handle_monitor, READS),
    Confirm: ("confirm", handle_confirm, ANY),
    Flush: ("flush", handle_flush, WRITES),
    Delete: ("delete", handle_delete, WRITES),
    Status: ("status", handle_status, ANY),
    Simple: ("", handle_simple, ANY),
}
