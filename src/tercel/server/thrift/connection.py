"""Kestrel's Thrift service: :class:`ThriftConnection` and one small handler per method.

The connection runs on Kestrel's connection base (:mod:`tercel.server.kestrel.connection`) and
its operations (:mod:`tercel.server.kestrel.ops`); this module adds the codec
(:mod:`tercel.protocol.thrift`), the handlers and the Thrift form of tercel's errors: a
``TApplicationException`` answering the call (``INTERNAL_ERROR`` with Kestrel's ``Server not
available for operation <method>`` when the status refuses it), and the connection stays open.
Only a frame that cannot be read (length out of bounds, header unreadable) closes it: there is
no call left to answer.

``get`` with ``auto_abort_msec > 0`` reserves items as *detached* reservations of the
server's one table (:mod:`tercel.core.reservations`, like memcache leases): any connection may
confirm or abort them by id, a disconnect does not end them, the deadline does, and the
journal's OPEN records return them at a restart. A ``get`` that may wait (``timeout_msec > 0``)
holds the items it gathers as reservations owned by the connection's session, confirmed only
when the reply goes out, so a client that leaves while it waits loses nothing (a reservation
``get`` whose client leaves returns what it reserved: nobody has the ids); one that does not
wait takes them for good at once (Kestrel's at-most-once plain get).
"""

from __future__ import annotations

from typing import Any, Final

from tercel.core.queue import READ_PEEK, PersistentQueue, QItem
from tercel.core.reservations import Reservation
from tercel.errors import ProtocolError, QueueError, TercelError, TooManyLeases
from tercel.protocol import thrift as t
from tercel.protocol.memcache import MAX_VALUE, NEED_DATA
from tercel.server import auth
from tercel.server.connection import Operation
from tercel.server.context import ANY, READS, WRITES, ServerContext
from tercel.server.kestrel import ops
from tercel.server.kestrel.connection import KestrelConnection
from tercel.server.status import Status

MAX_FRAME: Final = MAX_VALUE + 64 * 1024
"""The largest call accepted: the item limit of every front end (64 MiB) and room for the
rest of the call. A larger declared frame is refused before it is buffered."""

_TO_WIRE: Final = {Status.UP: t.UP, Status.READONLY: t.READ_ONLY, Status.QUIESCENT: t.QUIESCENT}
"""Statuses the IDL names; any other (WRITEAVOID) is NOT_CONFIGURED, as in Kestrel."""
_FROM_WIRE: Final = {wire: status for status, wire in _TO_WIRE.items()}


class ThriftConnection(KestrelConnection):
    """One client connection speaking Kestrel's Thrift service (framed, binary)."""

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx, "thrift")
        self.codec = t.ThriftServerCodec(MAX_FRAME)
        self.call: Any = None
        """The call being served (its seqid and method answer an error)."""
        self.gathering: _Gather | None = None
        """A ``get`` parked for more items."""
        self.counts = ctx.command_counts("thrift")
        """``cmd_<method>``: calls received, refused ones included; ``cmd_bad_call`` for
        calls the codec could not build (``stats``)."""

    # ---- the hooks of the connection bases ------------------------------------------------

    def feed(self, data: bytes) -> None:
        self.codec.receive_data(data)

    def buffered(self) -> int:
        return self.codec.buffered

    def read_command(self) -> Any:
        call = self.codec.next_call()
        return None if call is NEED_DATA else call

    def waits_for_every_queue(self, cmd: Any) -> bool:
        return type(cmd) is t.FlushAllQueues

    def dispatch(self, cmd: Any) -> None:
        self.call = cmd
        self.perform(HANDLERS[type(cmd)], cmd)

    def error_reply(self, exc: TercelError) -> None:
        if isinstance(exc, ProtocolError) and exc.close:
            self.closing = True  # no call to answer: the frame boundary is lost
            return
        call = self.call
        if call is None:
            self.closing = True
            return
        self.out.append(
            t.reply_exception(call.seqid, _method(call), t.INTERNAL_ERROR, self.message(exc))
        )

    def refusal(self, reason: str) -> bytes:
        return b""  # Thrift has no unsolicited message: the connection just closes

    def denied(self, kind: int, message: str) -> None:
        """A ``TApplicationException`` (``INTERNAL_ERROR``) answering the call:
        ``unauthenticated: call auth(user, password) first``, ``permission denied: ...``."""
        if kind == auth.UNAUTHENTICATED:
            message = "unauthenticated: call auth(user, password) first"
        call = self.call
        self.out.append(t.reply_exception(call.seqid, _method(call), t.INTERNAL_ERROR, message))

    def auth_reply(self, cmd: Any, failure: str | None) -> None:
        if failure is None:
            self.out.append(t.reply_void(cmd))
        else:
            message = failure
            if failure != auth.LOGIN_FAILURE:
                message = f"{auth.LOGIN_FAILURE}: {failure}"
            self.out.append(t.reply_exception(cmd.seqid, "auth", t.INTERNAL_ERROR, message))

    def message(self, exc: TercelError) -> str:
        kind = ops.error_kind(exc)
        if kind == ops.UNAVAILABLE:
            return f"Server not available for operation {_method(self.call)}"
        if kind == ops.NO_SPACE:
            reason = ops.error_reason(exc)
            return f"Server not available for operation {_method(self.call)}: {reason}"
        if kind == ops.JOURNAL:
            return "journal write failed"
        return ops.error_reason(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        gathering, self.gathering = self.gathering, None
        super().connection_lost(exc)  # the session's close returns the reads it owns
        if gathering is not None and gathering.call.auto_abort_msec > 0:
            # Reserved for a reply that will never be sent: nobody has their ids.
            self.ctx.reservations.table.abort(gathering.reserved)


def _method(call: Any) -> str:
    method: str = call.method if isinstance(call, t.BadCall) else call.METHOD
    return method


# ---- get ------------------------------------------------------------------------------------


class _Gather:
    """A ``get`` in progress: what it took so far and until when it may wait."""

    __slots__ = ("call", "conn", "deadline", "full", "items", "queue", "reserved")

    def __init__(
        self, conn: ThriftConnection, call: t.Get, queue: PersistentQueue, deadline: int
    ) -> None:
        self.conn = conn
        self.call = call
        self.queue = queue
        self.deadline = deadline
        self.items: list[bytes] = []  # taken for good (a get that does not wait)
        self.reserved: list[Reservation] = []  # auto-abort leases, or a waiting get's reads
        self.full = False  # the queue's max_open_leases are all out: stop

    def count(self) -> int:
        return len(self.reserved) + len(self.items)

    def woken(self, xid: int, item: QItem | None) -> None:
        """An item is there (take it, and more), or the deadline passed (reply with what was
        gathered): either way on the next loop pass, so no handler re-enters a queue."""
        conn = self.conn
        parked = conn.parked
        if parked is None:
            return
        parked.cancel_timer()
        conn.continue_soon(self._finish_now if item is None else self.more)

    def more(self) -> bool:
        """Take what came and more; True when parked again."""
        self.conn.gathering = None
        return _gather(self.conn, self)

    def _finish_now(self) -> bool:
        self.conn.gathering = None
        _finish(self.conn, self, self.conn.ctx.clock.now_ms())
        return False


def handle_get(conn: ThriftConnection, call: t.Get) -> None:
    """``get``: up to max_items now; with a timeout, wait until max_items or the deadline."""
    ctx = conn.ctx
    ctx.collection.stats.cmd_get += 1
    queue = ops.source(ctx, call.queue) if call.max_items > 0 else None
    if queue is None:  # an alias, or no item asked for
        conn.out.append(t.reply_items(call, []))
        return
    deadline = ctx.now + call.timeout_msec if call.timeout_msec > 0 else 0
    _gather(conn, _Gather(conn, call, queue, deadline))


def _gather(conn: ThriftConnection, g: _Gather) -> bool:
    """Take what is there; park for more while time is left (True), else reply."""
    now = conn.ctx.clock.now_ms()
    want = g.call.max_items - g.count()
    if want > 0 and not g.queue.closed:
        _take(conn, g, want, now)
    if g.count() < g.call.max_items and not g.full and g.deadline > now:
        pending = conn.session.wait(g.call.queue, READ_PEEK, g.woken)
        if pending is not None:
            conn.gathering = g
            conn.park(g.call, pending, g.deadline - now, b"")
            return True
    _finish(conn, g, now)
    return False


def _take(conn: ThriftConnection, g: _Gather, want: int, now: int) -> None:
    queue = g.queue
    auto_abort = g.call.auto_abort_msec
    reservations = conn.ctx.reservations
    if auto_abort > 0:  # detached: any connection ends them, a disconnect does not
        # Reserved until auto_abort after the reply: after the deadline at the latest.
        ttl = auto_abort + max(0, g.deadline - now)
        try:
            g.reserved += ops.lease(conn.ctx, queue, want, ttl, now)
        except TooManyLeases:
            g.full = True
    elif g.deadline:  # may wait: owned by the session (a disconnect returns them) until the reply
        for _ in range(want):
            res = reservations.table.take(queue, now, owner=conn.session)
            if res is None:
                break
            g.reserved.append(res)
    else:  # Kestrel's plain get: for good at once
        for _ in range(want):
            item = queue.remove(now)
            if item is None:
                break
            g.items.append(item.data)


def _finish(conn: ThriftConnection, g: _Gather, now: int) -> None:
    """Reply with what ``g`` gathered. Auto-abort reservations count their time from now; a
    waiting get's reads are confirmed (the reply waits for those records)."""
    table = conn.ctx.reservations.table
    if g.call.auto_abort_msec > 0:
        if g.deadline:  # taken with room for the wait: auto_abort counts from the reply
            table.extend(g.reserved, g.call.auto_abort_msec)
            conn.ctx.reservations.arm()
        items = [(res.item.data, res.id) for res in g.reserved]
    elif g.reserved:
        table.confirm(g.reserved)
        items = [(res.item.data, 0) for res in g.reserved]
    else:
        items = [(data, 0) for data in g.items]
    conn.ctx.collection.stats.get_hits += len(items)
    conn.out.append(t.reply_items(g.call, items))


# ---- the other methods ------------------------------------------------------------------------


def handle_put(conn: ThriftConnection, call: t.Put) -> None:
    """``put``: add in order, stop at the first refused item; the count (journaled first)."""
    n = ops.put_items(conn.ctx, call.queue, call.items, call.expiration_msec, True)
    conn.out.append(t.reply_count(call, n))


def handle_put_keyed(conn: ThriftConnection, call: t.PutKeyed) -> None:
    """``put_keyed`` -> ``PutResult(item_id, duplicate)``, item_id 0 when the queue refused the
    item (docs/protocol.md, "Dedup keys"); journaled before the reply."""
    ctx = conn.ctx
    expiry = ctx.now + call.expiration_msec if call.expiration_msec > 0 else None
    got = ops.put_keyed(ctx, call.queue, call.key, call.item, expiry)
    conn.out.append(t.reply_put_keyed(call, abs(got), got < 0))


def _reserved(conn: ThriftConnection, call: t.Confirm | t.Abort) -> list[Reservation]:
    """The open auto-abort reservations of ``call.queue`` among ``call.ids`` (reads another
    connection holds open for itself are not Thrift's to end)."""
    return ops.reserved(conn.ctx, call.queue, call.ids, True)


def handle_confirm(conn: ThriftConnection, call: t.Confirm) -> None:
    """``confirm``: end reservations for good, from any connection; the count found."""
    conn.out.append(t.reply_count(call, ops.confirm_reserved(conn.ctx, _reserved(conn, call))))


def handle_abort(conn: ThriftConnection, call: t.Abort) -> None:
    """``abort``: return reserved items to the head, in order; the count found."""
    conn.out.append(t.reply_count(call, ops.abort_reserved(conn.ctx, _reserved(conn, call))))


def handle_peek(conn: ThriftConnection, call: t.Peek) -> None:
    """``peek`` -> ``QueueInfo`` (creates the queue, as Kestrel did)."""
    info = t.QueueInfo(*ops.queue_info(conn.ctx, call.queue))
    conn.out.append(t.reply_queue_info(call, info))


def handle_flush_queue(conn: ThriftConnection, call: t.FlushQueue) -> None:
    ops.flush(conn.ctx, call.queue)
    conn.out.append(t.reply_void(call))


def handle_flush_all_queues(conn: ThriftConnection, call: t.FlushAllQueues) -> None:
    ops.flush_all(conn.ctx)
    conn.out.append(t.reply_void(call))


def handle_delete_queue(conn: ThriftConnection, call: t.DeleteQueue) -> None:
    ops.delete(conn.ctx, call.queue)
    conn.out.append(t.reply_void(call))


def handle_current_status(conn: ThriftConnection, call: t.CurrentStatus) -> None:
    status = _TO_WIRE.get(ops.status(conn.ctx), t.NOT_CONFIGURED)
    conn.out.append(t.reply_status(call, status))


def handle_set_status(conn: ThriftConnection, call: t.SetStatus) -> None:
    status = _FROM_WIRE.get(call.status)
    if status is None:
        name = t.STATUS_NAMES.get(call.status, str(call.status))
        raise QueueError(f"status {name} cannot be set")
    ops.set_status(conn.ctx, status)
    conn.out.append(t.reply_void(call))


def handle_get_version(conn: ThriftConnection, call: t.GetVersion) -> None:
    conn.out.append(t.reply_version(call, conn.ctx.version))


def handle_auth(conn: ThriftConnection, call: t.Auth) -> None:
    """``auth``: log in (void), or an exception naming why not (no users configured,
    ``authentication failure``)."""
    guard = conn.guard
    if guard is None:
        raise QueueError("no users are configured")
    guard.login(conn, call, call.user, call.password)


def handle_bad_call(conn: ThriftConnection, call: t.BadCall) -> None:
    """A call the codec could not build: its ``TApplicationException``."""
    conn.out.append(t.reply_exception(call.seqid, call.method, call.kind, call.reason))


HANDLERS: Final[dict[type, Operation]] = {
    t.Put: Operation("put", handle_put, WRITES, auth.PUT),
    t.PutKeyed: Operation("put_keyed", handle_put_keyed, WRITES, auth.PUT),
    t.Get: Operation("get", handle_get, READS, auth.TAKE),
    # As in Kestrel: reads opened before QUIESCENT can end.
    t.Confirm: Operation("confirm", handle_confirm, ANY, auth.TAKE),
    t.Abort: Operation("abort", handle_abort, ANY, auth.TAKE),
    t.Peek: Operation("peek", handle_peek, READS, auth.TAKE),
    t.FlushQueue: Operation("flush_queue", handle_flush_queue, WRITES, auth.MANAGE),
    t.FlushAllQueues: Operation(
        "flush_all_queues", handle_flush_all_queues, WRITES, auth.MANAGE_ALL
    ),
    t.DeleteQueue: Operation("delete_queue", handle_delete_queue, WRITES, auth.MANAGE),
    t.CurrentStatus: Operation("current_status", handle_current_status, ANY),
    t.SetStatus: Operation("set_status", handle_set_status, ANY, auth.MANAGE_ALL),
    t.GetVersion: Operation("get_version", handle_get_version, ANY),
    t.Auth: Operation("auth", handle_auth, ANY, auth.LOGIN),
    t.BadCall: Operation("bad_call", handle_bad_call, ANY),
}
"""Each method with its operation: its name (counted as ``thrift_cmd_<name>``; a call the
codec could not build is ``bad_call``), handler and access (``context.ANY``/``READS``/
``WRITES``), checked by the pump before the handler runs."""
