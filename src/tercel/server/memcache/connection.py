"""The memcache front end: :class:`MemcacheConnection` and one small handler per command.

The connection runs on Kestrel's connection base (:mod:`tercel.server.kestrel.connection`) and
its operations (:mod:`tercel.server.kestrel.ops`); this module only adds the codec
(:mod:`tercel.protocol.memcache`), the handlers, the hot loop (``get`` and ``set`` are direct
calls) and the memcache form of tercel's errors: ``ProtocolError``/``QueueError`` ->
``CLIENT_ERROR <reason>``, open-read violations and unknown commands -> ``ERROR``,
``UnavailableError``/journal failures -> ``SERVER_ERROR <reason>``. The lease and monitor
commands are in :mod:`tercel.server.memcache.leases`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from time import perf_counter_ns
from typing import Any, Final

from tercel.core.queue import READ_GET, READ_OPEN, READ_PEEK, QItem
from tercel.errors import ProtocolError, TercelError
from tercel.protocol import memcache as mc
from tercel.protocol.commands import (
    GET_CLASS,
    SET_CLASS,
    Delete,
    DumpStats,
    Flush,
    FlushAll,
    FlushExpired,
    Get,
    KeyedSet,
    Set,
    Simple,
    Status,
    Unknown,
)
from tercel.protocol.dedup import stored_id
from tercel.protocol.memcache import NEED_DATA
from tercel.server import auth, stats
from tercel.server.auth import Guard
from tercel.server.connection import Operation
from tercel.server.context import ANY, WRITES, ServerContext, sampled
from tercel.server.kestrel import ops
from tercel.server.kestrel.connection import KestrelConnection
from tercel.server.memcache import leases as ext

log = logging.getLogger(__name__)

EXPIRY_RELATIVE_LIMIT = 1_000_000
"""Kestrel's rule: a set's exptime below this is relative seconds, at or above it epoch
seconds (memcached uses 30 days; Kestrel uses 1,000,000 s and so do we)."""


def expiry_ms(exptime: int, now: int) -> int | None:
    """Absolute expiry in epoch ms from a memcache exptime (Kestrel's rule); None: never."""
    if exptime == 0:
        return None
    if exptime < EXPIRY_RELATIVE_LIMIT:
        return now + exptime * 1000
    return exptime * 1000


class MemcacheConnection(KestrelConnection):
    """One client connection speaking Kestrel's memcache protocol (see ``server.connection``
    for the pump it runs on)."""

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx, "memcache")
        self.codec = mc.MemcacheServerCodec()

    # ---- the hooks of server.connection ---------------------------------------------------

    def feed(self, data: bytes) -> None:
        self.codec.receive_data(data)

    def buffered(self) -> int:
        return self.codec.buffered

    def read_command(self) -> Any:
        cmd = self.codec.next_command()
        return None if cmd is NEED_DATA else cmd

    def waits_for_every_queue(self, cmd: Any) -> bool:
        return type(cmd) is FlushAll

    def dispatch(self, cmd: Any) -> None:
        if type(cmd) is SET_CLASS:
            if self.guard is None or self.admit_set(self.guard, cmd):
                handle_set(self, cmd)
        elif type(cmd) is GET_CLASS:
            if self.guard is None or self.admit_get(self.guard, cmd):
                handle_get(self, cmd)
        else:
            self.perform(HANDLERS[type(cmd)], cmd)

    def run(self) -> None:
        """The base's loop (:meth:`KestrelConnection.next_command`, :meth:`dispatch`) inlined:
        direct calls for the codec, ``set`` and ``get`` (compiled, a method called on its
        object is a C call, while a bound method kept in a local or a handler looked up in a
        dict is a generic one), the table for the rest."""
        codec = self.codec
        while not self.closing:
            redo = self.redo
            if redo is None:
                cmd = codec.next_command()
                if cmd is NEED_DATA:
                    return
            else:
                self.redo = None
                cmd = redo
            if self.ctx.collection.replaying_in_background and self.wait_for_replay(
                cmd, type(cmd) is FlushAll
            ):
                return
            # With users (docs/operations.md), ``guard`` checks every command; without,
            # that is one attribute test.
            if type(cmd) is SET_CLASS:
                if self.guard is None or self.admit_set(self.guard, cmd):
                    handle_set(self, cmd)
            elif type(cmd) is GET_CLASS:
                if self.guard is None or self.admit_get(self.guard, cmd):
                    handle_get(self, cmd)
            else:
                self.perform(HANDLERS[type(cmd)], cmd)
            if self.parked is not None:
                return

    def error_reply(self, exc: TercelError) -> None:
        """``CLIENT_ERROR <reason>`` for bad requests, bare ``ERROR`` for open-read
        violations, ``SERVER_ERROR <reason>`` for server-side failures."""
        self.out.append(error_reply(exc))
        if isinstance(exc, ProtocolError) and exc.close:
            self.closing = True

    def refusal(self, reason: str) -> bytes:
        return mc.server_error(reason)

    # ---- users (memcached's ASCII authentication, ``memcached -Y``) -------------------------

    def admit_set(self, guard: Guard, cmd: Set) -> bool:
        """Before a login a ``set`` is the login: its data is ``<user> <password>`` (the key,
        flags and exptime are ignored; answered ``STORED`` or ``CLIENT_ERROR authentication
        failure``, even with ``noreply``), as memcached's. After it, a ``set`` needs the
        right to put to its queue, within the user's limits."""
        if guard.fast(auth.PUT, cmd.queue):
            return True
        if guard.current() is None:
            name, space, password = cmd.data.partition(b" ")
            if not space:
                self.out.append(mc.client_error("bad authentication token format"))
                return False
            guard.login(self, cmd, name.decode("utf-8", "replace"), password)
            return False
        return guard.allows(self, auth.PUT, cmd.queue, "set") and guard.within_limits(self)

    def admit_get(self, guard: Guard, cmd: Get) -> bool:
        """A ``get`` (any option) needs the right to take from its queue."""
        return guard.fast(auth.TAKE, cmd.queue) or guard.allows(self, auth.TAKE, cmd.queue, "get")

    def denied(self, kind: int, message: str) -> None:
        """``CLIENT_ERROR unauthenticated`` (memcached's words) before a login, else
        ``CLIENT_ERROR <message>`` (``permission denied: ...``, ``user limit reached: ...``)."""
        if kind == auth.UNAUTHENTICATED:
            self.out.append(mc.client_error("unauthenticated"))
        else:
            self.out.append(mc.client_error(message))

    def auth_reply(self, cmd: Any, failure: str | None) -> None:
        if failure is None:
            self.out.append(mc.STORED)
        elif failure == auth.LOGIN_FAILURE:
            self.out.append(mc.client_error(failure))
        else:
            self.out.append(mc.client_error(f"{auth.LOGIN_FAILURE}: {failure}"))

    # ---- blocked gets ---------------------------------------------------------------------

    def block_get(self, cmd: Get, mode: int, timeout_ms: int) -> None:
        pending = self.session.wait(cmd.queue, mode, self._delivered)
        if pending is None:
            self.out.append(mc.END)
            return
        self.park(cmd, pending, timeout_ms, mc.END)

    def _delivered(self, xid: int, item: QItem | None) -> None:
        if not self.settle_parked(item):
            return
        assert self.parked is not None and item is not None
        cmd: Get = self.parked.command
        self.parked = None
        self.value(cmd, item)
        ctx = self.ctx
        if not cmd.peek and sampled(ctx):
            ctx.metrics.queue(cmd.queue).delivery.add(ctx.clock.now_ms() - item.add_time)
        self.resume_soon()

    def value(self, cmd: Get, item: QItem) -> None:
        """Append ``VALUE <key> <flags> <len> [cas]``, the data and its tail."""
        data = item.data
        self.out += (
            mc.value_head(cmd.key, len(data), item.id if cmd.cas else None),
            data,
            mc.VALUE_TAIL,
        )


def error_reply(exc: TercelError) -> bytes:
    """The memcache reply of one of tercel's errors (docs/protocol.md, "Errors")."""
    kind = ops.error_kind(exc)
    if kind == ops.OPEN_READS:
        return mc.ERROR
    if kind == ops.BAD_REQUEST:
        return mc.client_error(ops.error_reason(exc))
    if kind == ops.UNAVAILABLE or kind == ops.NO_SPACE:
        return mc.server_error(ops.error_reason(exc))
    if kind == ops.JOURNAL:
        return mc.server_error("journal write failed")
    if kind == ops.CONFIG:
        return mc.server_error(f"reload refused: {exc}")
    return mc.server_error(str(exc))


# ---- handlers: one per command, a table at the bottom ---------------------------------------


def handle_get(conn: MemcacheConnection, cmd: Get) -> None:
    """Kestrel's get with /abort, /close, /open, /peek and /t= (reference §1.3)."""
    _key, queue, timeout, open_, close, abort, peek, _cas = cmd
    session = conn.session
    if abort:
        session.abort_oldest(queue)
        conn.out.append(mc.END)
        return
    if close:
        session.confirm_oldest(queue)
        if not open_:
            conn.out.append(mc.END)
            return
    ctx = conn.ctx
    if not ctx.readable:
        ctx.check_readable()
    mode = READ_PEEK if peek else READ_OPEN if open_ else READ_GET
    timed = sampled(ctx)
    t0 = perf_counter_ns() if timed else 0
    now = ctx.now
    if mode == READ_GET:
        item = session.take(queue, now)
    else:
        got = session.fetch(queue, mode, now)
        item = None if got is None else got[1]
    if item is not None:
        conn.value(cmd, item)
        if timed:
            lat = ctx.metrics.queue(queue)
            lat.get_hit.add((perf_counter_ns() - t0) // 1000)
            if not peek:
                lat.delivery.add(now - item.add_time)
    elif timeout is not None:
        conn.block_get(cmd, mode, timeout)
    else:
        session.count_miss()
        conn.out.append(mc.END)
        if timed:
            ctx.metrics.queue(queue).get_miss.add((perf_counter_ns() - t0) // 1000)


def handle_set(conn: MemcacheConnection, cmd: Set) -> None:
    queue, _flags, exptime, data, noreply = cmd
    ctx = conn.ctx
    if not ctx.writable:
        ctx.check_writable()
    coll = ctx.collection
    coll.stats.cmd_set += 1
    now = ctx.now
    expiry = expiry_ms(exptime, now) if exptime else None
    if not sampled(ctx):
        stored = coll.add(queue, data, expiry, now)
    else:
        t0 = perf_counter_ns()
        stored = coll.add(queue, data, expiry, now)
        ctx.metrics.queue(queue).set.add((perf_counter_ns() - t0) // 1000)
    if not noreply:
        conn.out.append(mc.STORED if stored else mc.NOT_STORED)


def handle_keyed_set(conn: MemcacheConnection, cmd: KeyedSet) -> None:
    """``set ... key=<K>``: ``STORED <id>`` or ``STORED <id> duplicate`` (flags ignored, as
    for ``set``), ``NOT_STORED`` when the queue is full."""
    got = ops.put_keyed(
        conn.ctx, cmd.queue, cmd.key, cmd.data, expiry_ms(cmd.exptime, conn.ctx.now)
    )
    if not cmd.noreply:
        conn.out.append(stored_id(abs(got), got < 0) if got else mc.NOT_STORED)


def handle_delete(conn: MemcacheConnection, cmd: Delete) -> None:
    ops.delete(conn.ctx, cmd.queue)
    if not cmd.noreply:
        conn.out.append(mc.DELETED)


def handle_flush(conn: MemcacheConnection, cmd: Flush) -> None:
    ops.flush(conn.ctx, cmd.queue)
    if not cmd.noreply:
        conn.out.append(mc.END)


def handle_flush_all(conn: MemcacheConnection, cmd: FlushAll) -> None:
    ops.flush_all(conn.ctx)
    if not cmd.noreply:
        conn.out.append(mc.OK)


def handle_flush_expired(conn: MemcacheConnection, cmd: FlushExpired) -> None:
    conn.out.append(mc.number(conn.ctx.collection.flush_expired(cmd.queue)))


def handle_dump_stats(conn: MemcacheConnection, cmd: DumpStats) -> None:
    SlicedReply(conn, stats.dump_stats_slices(conn.ctx, cmd.queues), _blocks).start()


def handle_status(conn: MemcacheConnection, cmd: Status) -> None:
    """``status`` answers the current status; ``status <s>`` (any case) sets it: ``END``."""
    if cmd.value is None:
        conn.out.append(ops.status(conn.ctx).name.encode() + b"\r\n")
        return
    ops.set_status_word(conn.ctx, cmd.value)
    conn.out.append(mc.END)


def handle_unknown(conn: MemcacheConnection, cmd: Unknown) -> None:
    conn.out.append(mc.ERROR)


def handle_simple(conn: MemcacheConnection, cmd: Simple) -> None:
    conn.perform(SIMPLE[cmd.name], cmd)


def _version(conn: MemcacheConnection, cmd: Simple) -> None:
    conn.out.append(mc.version(conn.ctx.version))


def _quit(conn: MemcacheConnection, cmd: Simple) -> None:
    conn.closing = True


def _shutdown(conn: MemcacheConnection, cmd: Simple) -> None:
    conn.closing = True
    conn.ctx.request_stop()


def _reload(conn: MemcacheConnection, cmd: Simple) -> None:
    conn.ctx.reload()  # raises ConfigError -> SERVER_ERROR below
    conn.out.append(mc.RELOADED)


def _stats(conn: MemcacheConnection, cmd: Simple) -> None:
    SlicedReply(conn, stats.stats_slices(conn.ctx), _stat_lines).start()


def _stat_lines(lines: Any) -> bytes:
    return mc.stats(lines)[: -len(mc.END)]


def _blocks(blocks: Any) -> bytes:
    return mc.blocks(blocks)[: -len(mc.END)]


class SlicedReply:
    """A reply rendered over several loop passes: memcache ``stats`` and ``dump_stats`` of a
    server with many queues (``stats.SLICE`` queues per pass). ``parts`` yields what to
    encode, and ``None`` where the loop should run. Rendered in one pass, the reply is
    recorded at once; else the connection parks on it (the commands behind it wait, other
    connections are served), each loop pass renders up to the next pause, and the last one
    records the reply and resumes the connection."""

    def __init__(
        self, conn: MemcacheConnection, parts: Iterator[Any], encode: Callable[[Any], bytes]
    ) -> None:
        self.conn = conn
        self.parts = parts
        self.encode = encode
        self.chunks: list[bytes] = []

    def start(self) -> None:
        conn = self.conn
        if self.advance():
            conn.out.append(b"".join(self.chunks) + mc.END)
            return
        conn.park_untimed(None, self, b"")
        conn.continue_soon(self.step)

    def advance(self) -> bool:
        """Render up to the next pause; True when the reply is complete."""
        for part in self.parts:
            if part is None:
                return False
            self.chunks.append(self.encode(part))
        return True

    def step(self) -> bool:
        """One loop pass of rendering (:meth:`Connection.continue_soon`): True while parked
        again for the next pass; else the reply is recorded."""
        conn = self.conn
        try:
            done = self.advance()
        except Exception:
            log.exception("bug while rendering stats; closing the connection")
            conn.closing = True
            return False
        if not done:
            conn.park_untimed(None, self, b"")
            conn.continue_soon(self.step)
            return True
        conn.out.append(b"".join(self.chunks) + mc.END)
        self.chunks = []
        return False


def _dump_config(conn: MemcacheConnection, cmd: Simple) -> None:
    conn.out.append(mc.blocks(conn.ctx.dump_config()))


def _flush_all_expired(conn: MemcacheConnection, cmd: Simple) -> None:
    conn.out.append(mc.number(conn.ctx.collection.flush_all_expired()))


SIMPLE: Final[dict[str, Operation]] = {
    "version": Operation("version", _version, ANY),
    "quit": Operation("quit", _quit, ANY),
    "shutdown": Operation("shutdown", _shutdown, ANY, auth.MANAGE_ALL),
    "reload": Operation("reload", _reload, ANY, auth.MANAGE_ALL),
    "stats": Operation("stats", _stats, ANY),
    "dump_config": Operation("dump_config", _dump_config, ANY, auth.MANAGE_ALL),
    "flush_all_expired": Operation(
        "flush_all_expired", _flush_all_expired, WRITES, auth.MANAGE_ALL
    ),
    "features": Operation("features", ext.features, ANY),
}
"""The commands without arguments, each with the access it needs and the right a user needs,
checked by the pump."""

HANDLERS: Final[dict[type, Operation]] = {
    # get and set test the status flags themselves (their own fast path; a get that only
    # closes or aborts an open read is allowed whatever the status), so they are not here.
    KeyedSet: Operation("set", handle_keyed_set, WRITES, auth.PUT),
    Delete: Operation("delete", handle_delete, WRITES, auth.MANAGE),
    Flush: Operation("flush", handle_flush, WRITES, auth.MANAGE),
    FlushAll: Operation("flush_all", handle_flush_all, WRITES, auth.MANAGE_ALL),
    FlushExpired: Operation("flush_expired", handle_flush_expired, WRITES, auth.MANAGE),
    DumpStats: Operation("dump_stats", handle_dump_stats, ANY),
    Simple: Operation("simple", handle_simple, ANY),
    Status: Operation("status", handle_status, ANY, auth.SET_STATUS),
    Unknown: Operation("unknown", handle_unknown, ANY),
}
"""Every command but ``get`` and ``set`` with its operation: the status check is declared
here, once per operation, and made by :meth:`Connection.perform` before the handler runs."""
HANDLERS.update(ext.HANDLERS)
