"""Kestrel's text protocol: :class:`TextConnection` and one small handler per command.

The connection runs on Kestrel's connection base (:mod:`tercel.server.kestrel.connection`) and
its operations (:mod:`tercel.server.kestrel.ops`); this module adds the codec
(:mod:`tercel.protocol.kestrel_text`), the handlers and the text form of tercel's errors: one
``-<message>`` line each, and the connection stays open. Replies are
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

from typing import Any, Final

from tercel.core.queue import READ_OPEN, READ_PEEK, QItem
from tercel.errors import QueueError, TercelError
from tercel.protocol import kestrel_text as kt
from tercel.protocol.commands import Confirm, Delete, Flush, Simple, Status
from tercel.server import auth
from tercel.server.connection import Operation
from tercel.server.context import ANY, READS, WRITES, ServerContext
from tercel.server.kestrel import ops
from tercel.server.kestrel.connection import KestrelConnection

DOES_NOT_FIT: Final = (
    "Item holds a line feed or ends in a carriage return; take it over memcache or Thrift."
)


class TextConnection(KestrelConnection):
    """One client connection speaking Kestrel's text protocol."""

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx, "text")
        self.codec = kt.TextServerCodec()
        self.counts = ctx.command_counts("text")
        """``cmd_<command>``: commands received, refused ones included (``stats``)."""

    # ---- the hooks of the connection bases ------------------------------------------------

    def feed(self, data: bytes) -> None:
        self.codec.receive_data(data)

    def buffered(self) -> int:
        return self.codec.buffered

    def read_command(self) -> Any:
        cmd = self.codec.next_command()
        return None if cmd is kt.NEED_DATA else cmd

    def dispatch(self, cmd: Any) -> None:
        if type(cmd) is Simple:
            self.perform(SIMPLE[cmd.name], cmd)
        else:
            self.perform(HANDLERS[type(cmd)], cmd)

    def error_reply(self, exc: TercelError) -> None:
        self.out.append(kt.error(self.message(exc)))

    def refusal(self, reason: str) -> bytes:
        return kt.error(reason)

    def denied(self, kind: int, message: str) -> None:
        """``-Unauthenticated: auth <user> <password> first`` before a login, else
        ``-Permission denied: ...`` / ``-User limit reached: ...``."""
        if kind == auth.UNAUTHENTICATED:
            self.out.append(kt.error("Unauthenticated: auth <user> <password> first"))
        else:
            self.out.append(kt.error(message[:1].upper() + message[1:]))

    def auth_reply(self, cmd: Any, failure: str | None) -> None:
        if failure is None:
            self.out.append(kt.count(0))
        else:
            self.out.append(kt.error(f"Authentication failure: {failure}"))

    def message(self, exc: TercelError) -> str:
        """The ``-`` message of one of tercel's errors (Kestrel's wording where it had one)."""
        kind = ops.error_kind(exc)
        if kind == ops.BAD_REQUEST:
            return ops.error_reason(exc)
        if kind == ops.OPEN_READS:
            return f"Too many open transactions; limit={self.session.max_open_reads}"
        if kind == ops.UNAVAILABLE:
            return f"Server not available for operation {self.op}"
        if kind == ops.NO_SPACE:
            return f"Server not available for operation {self.op}: {ops.error_reason(exc)}"
        if kind == ops.JOURNAL:
            return "Journal write failed."
        return str(exc)


# ---- reads: get, peek, monitor --------------------------------------------------------------


def _start_read(conn: TextConnection, queue: str, timeout_ms: int | None) -> int:
    """What every read does first: confirm this connection's reads on ``queue``; the deadline
    (epoch ms; 0: do not wait)."""
    conn.session.confirm_all(queue)
    return conn.ctx.now + timeout_ms if timeout_ms else 0


class _Read:
    """A ``get`` (an open read) or a ``peek`` in progress, until ``deadline`` (epoch ms).

    A blocked read waits as a peek and, once woken, reads again (checking the head), since
    an item that does not fit a line is never opened here."""

    __slots__ = ("conn", "deadline", "mode", "queue")

    def __init__(self, conn: TextConnection, cmd: kt.TextGet | kt.TextPeek, deadline: int) -> None:
        self.conn = conn
        self.queue = cmd.queue
        self.mode = READ_OPEN if isinstance(cmd, kt.TextGet) else READ_PEEK
        self.deadline = deadline

    def run(self) -> bool:
        """Answer now, or park until an item comes or the deadline; True when parked."""
        conn = self.conn
        session = conn.session
        now = conn.ctx.clock.now_ms()
        head = ops.head(conn.ctx, self.queue, now)
        if head is not None:
            if not kt.fits_a_line(head.data):
                conn.out.append(kt.error(DOES_NOT_FIT))
                return False
            got = session.fetch(self.queue, self.mode, now)
            if got is not None:
                conn.out += kt.item_parts(got[1].data)
                return False
        if self.deadline > now:
            pending = session.wait(self.queue, READ_PEEK, self._woken)
            if pending is not None:
                conn.park(self, pending, self.deadline - now, kt.NO_ITEM)
                return True
        session.count_miss()
        conn.out.append(kt.NO_ITEM)
        return False

    def _woken(self, xid: int, item: QItem | None) -> None:
        if self.conn.settle_parked(item):  # an item is there (a timeout was answered)
            self.conn.continue_soon(self.run)


class _Monitor(ops.Monitor):
    """The text ``monitor``: ``:<item>`` lines, then ``*``. It waits as a peek and checks the
    head before opening it (an item that does not fit a line ends the stream with an error)."""

    def __init__(self, conn: TextConnection, cmd: kt.TextMonitor, left: int, deadline: int) -> None:
        super().__init__(conn, cmd.queue, left, deadline, READ_PEEK, True)

    def emit(self, item: QItem) -> None:
        self.conn.out += kt.item_parts(item.data)

    def end(self) -> bytes:
        return kt.NO_ITEM

    def take(self, now: int) -> QItem | None:
        head = ops.head(self.conn.ctx, self.queue, now)
        if head is None:
            return None
        if not kt.fits_a_line(head.data):
            self.stop = kt.error(DOES_NOT_FIT)
            return None
        return super().take(now)


def handle_get(conn: TextConnection, cmd: kt.TextGet) -> None:
    """``get <q> [timeout_ms]``: confirm this connection's reads on q, open one: ``:<item>``
    or ``*``."""
    _Read(conn, cmd, _start_read(conn, cmd.queue, cmd.timeout_ms)).run()


def handle_peek(conn: TextConnection, cmd: kt.TextPeek) -> None:
    """``peek <q> [timeout_ms]``: confirm this connection's reads on q; the head, not taken."""
    _Read(conn, cmd, _start_read(conn, cmd.queue, cmd.timeout_ms)).run()


def handle_monitor(conn: TextConnection, cmd: kt.TextMonitor) -> None:
    """``monitor <q> <timeout_ms> [max]``: confirm this connection's reads on q, then stream
    open reads as ``:<item>`` lines until ``max`` (default and cap: max_open_reads open on q),
    or the timeout; then ``*``."""
    deadline = _start_read(conn, cmd.queue, cmd.timeout_ms if cmd.timeout_ms > 0 else None)
    limit = conn.session.max_open_reads if cmd.max_items is None else cmd.max_items
    _Monitor(conn, cmd, limit, deadline).run()


def handle_confirm(conn: TextConnection, cmd: Confirm) -> None:
    """``confirm <q> <count>``: confirm the oldest ``count`` reads -> ``+<count>``, or
    ``-Not that many transactions open.`` (nothing confirmed)."""
    if not ops.confirm(conn, cmd.queue, cmd.count):
        raise QueueError("Not that many transactions open.")
    conn.out.append(kt.count(cmd.count))


# ---- writes and the rest --------------------------------------------------------------------


def handle_put(conn: TextConnection, cmd: kt.TextPut) -> None:
    """``put <q> [expiry_ms]:`` + item lines + an empty line -> ``+<stored>`` (every record
    journaled first). Items refused (queue full, too large) are not counted."""
    if cmd.key is not None:
        _put_keyed(conn, cmd, cmd.key)
        return
    n = ops.put_items(conn.ctx, cmd.queue, cmd.items, cmd.expiry_ms, False)
    conn.out.append(kt.count(n))


def _put_keyed(conn: TextConnection, cmd: kt.TextPut, key: str) -> None:
    """``put <q> [expiry_ms] key=<K>:`` + one item line -> ``:<item_id>`` or ``:<item_id>
    duplicate``; ``+0`` when the queue refused it (docs/protocol.md, "Dedup keys")."""
    ctx = conn.ctx
    expiry = ctx.now + cmd.expiry_ms if cmd.expiry_ms > 0 else None
    got = ops.put_keyed(ctx, cmd.queue, key, cmd.items[0], expiry)
    if not got:
        conn.out.append(kt.count(0))
    else:
        conn.out.append(kt.string(f"{abs(got)} duplicate" if got < 0 else str(abs(got))))


def handle_flush(conn: TextConnection, cmd: Flush) -> None:
    ops.flush(conn.ctx, cmd.queue)
    conn.out.append(kt.count(0))


def handle_delete(conn: TextConnection, cmd: Delete) -> None:
    ops.delete(conn.ctx, cmd.queue)
    conn.out.append(kt.count(0))


def handle_status(conn: TextConnection, cmd: Status) -> None:
    """``status`` -> ``:<STATUS>``; ``status <s>`` (any case) -> ``+0``."""
    if cmd.value is None:
        conn.out.append(kt.string(ops.status(conn.ctx).name))
        return
    ops.set_status_word(conn.ctx, cmd.value)
    conn.out.append(kt.count(0))


def handle_version(conn: TextConnection, cmd: Simple) -> None:
    conn.out.append(kt.string(conn.ctx.version))


def handle_shutdown(conn: TextConnection, cmd: Simple) -> None:
    conn.out.append(kt.count(0))
    conn.ctx.request_stop()


def handle_quit(conn: TextConnection, cmd: Simple) -> None:
    """Close once the replies owed are out."""
    conn.closing = True


def handle_auth(conn: TextConnection, cmd: kt.TextAuth) -> None:
    """``auth <user> <password>`` -> ``+0`` (logged in) or ``-Authentication failure: ...``;
    ``-No users are configured`` on a server without users."""
    guard = conn.guard
    if guard is None:
        raise QueueError("No users are configured")
    guard.login(conn, cmd, cmd.user, cmd.password)


HANDLERS: Final[dict[type, Operation]] = {
    kt.TextPut: Operation("put", handle_put, WRITES, auth.PUT),
    kt.TextGet: Operation("get", handle_get, READS, auth.TAKE),
    kt.TextPeek: Operation("peek", handle_peek, READS, auth.TAKE),
    kt.TextMonitor: Operation("monitor", handle_monitor, READS, auth.TAKE),
    Confirm: Operation("confirm", handle_confirm, ANY, auth.TAKE),
    Flush: Operation("flush", handle_flush, WRITES, auth.MANAGE),
    Delete: Operation("delete", handle_delete, WRITES, auth.MANAGE),
    Status: Operation("status", handle_status, ANY, auth.SET_STATUS),
    kt.TextAuth: Operation("auth", handle_auth, ANY, auth.LOGIN),
}
"""Each command with its operation: its name (counted as ``text_cmd_<name>``, named in
``-Server not available for operation <name>``), handler and access (``context.ANY``/
``READS``/``WRITES``), checked by the pump before the handler runs."""

SIMPLE: Final[dict[str, Operation]] = {
    name: Operation(name, handler, ANY, right)
    for name, handler, right in (
        ("version", handle_version, auth.NONE),
        ("shutdown", handle_shutdown, auth.MANAGE_ALL),
        ("quit", handle_quit, auth.NONE),
    )
}
"""The commands without arguments (``Simple``), by name."""
