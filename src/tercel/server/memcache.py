"""The memcache listener: one asyncio protocol per connection, one small handler per command.

The pump: ``data_received`` feeds the codec, runs every complete command (stopping at a blocked
read, so replies keep their order), and sends all the replies of the batch as one write, through
the committer when they acknowledge journal records. Errors are translated to replies here and
nowhere else: ``ProtocolError``/``QueueError`` -> ``CLIENT_ERROR <reason>``, open-read
violations and unknown commands -> ``ERROR``, ``UnavailableError``/journal failures ->
``SERVER_ERROR <reason>``. Anything else is a bug: logged, and the connection is closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, Final

from tercel.clock import Clock
from tercel.core.collection import QueueCollection
from tercel.core.queue import QItem
from tercel.errors import (
    ConfigError,
    JournalError,
    OpenReadError,
    ProtocolError,
    QueueError,
    UnavailableError,
)
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
    Set,
    Simple,
    Status,
    Unknown,
)
from tercel.protocol.memcache import NEED_DATA
from tercel.server import leases as ext
from tercel.server.commit import Committer
from tercel.server.metrics import Metrics
from tercel.server.status import parse_status
from tercel.session import PendingRead, Session

if TYPE_CHECKING:
    from tercel.server.app import Server

log = logging.getLogger(__name__)

MAX_BUFFERED_WHILE_BLOCKED = 1024 * 1024
"""Stop reading from a client whose read is blocked once this much input waits behind it."""

EXPIRY_RELATIVE_LIMIT = 1_000_000
"""Kestrel's rule: a set's exptime below this is relative seconds, at or above it epoch
seconds (memcached uses 30 days; Kestrel uses 1,000,000 s and so do we)."""


class Hub:
    """What the memcache commands read and count on every call, in one compiled object.

    The :class:`~tercel.server.app.Server` is an interpreted object, so each ``server.x``
    read from compiled code is a dict lookup; these fields are read or bumped once or more per
    command, and here a read is a struct load. The Server makes the one Hub, keeps
    ``writable``/``readable`` current and reads the byte counters for ``stats``.
    """

    def __init__(
        self,
        collection: QueueCollection,
        committer: Committer,
        clock: Clock,
        metrics: Metrics,
        loop: asyncio.AbstractEventLoop,
        *,
        sample_every: int,
        tracks_idle: bool,
    ) -> None:
        self.collection = collection
        self.committer = committer
        self.clock = clock
        self.now = 0
        """The time of the batch of commands being handled (set by each connection's pump
        before its first command, so every handler sees the time of its batch)."""
        self.metrics = metrics
        self.loop = loop
        self.writable = True
        """False when writes are refused (shutdown, READONLY, QUIESCENT)."""
        self.readable = True
        """False when reads are refused (shutdown, QUIESCENT)."""
        self.sample_every = sample_every
        self.ticks = 1
        """Commands until the next latency sample (counted down by :func:`sampled`)."""
        self.tracks_idle = tracks_idle
        """Connections note when they last read only when idle ones are to be closed."""
        self.bytes_read = 0
        self.bytes_written = 0


def sampled(hub: Hub) -> bool:
    """True for the one command in ``latency_sample_every`` whose latency is recorded.

    Two clock reads and a histogram update cost about 0.5 us, a twentieth of a whole command
    here; a 1-in-16 sample keeps the percentiles and drops that cost to noise.
    """
    hub.ticks -= 1
    if hub.ticks:
        return False
    hub.ticks = hub.sample_every
    return True


def expiry_ms(exptime: int, now: int) -> int | None:
    """Absolute expiry in epoch ms from a memcache exptime (Kestrel's rule); None: never."""
    if exptime == 0:
        return None
    if exptime < EXPIRY_RELATIVE_LIMIT:
        return now + exptime * 1000
    return exptime * 1000


class MemcacheConnection:
    """One client connection speaking Kestrel's memcache protocol (an asyncio protocol).

    Deliberately not a subclass of ``asyncio.Protocol``: that (interpreted) base would make
    this a non-native class whose every ``self.x`` is a dict lookup. uvloop and asyncio only
    call the methods below.
    """

    def __init__(self, server: Server) -> None:
        self.server = server
        self.hub = server.hub
        self.codec = mc.MemcacheServerCodec()
        self.session = Session(server.collection, server.config.server.max_open_reads)
        self.transport: asyncio.Transport | None = None
        self.out: list[bytes] = []
        # A blocked Get, or an extension command (server/leases.py) with its own waiter.
        self.blocked: tuple[Any, PendingRead, asyncio.TimerHandle] | None = None
        self.closing = False
        self.last_active = 0.0
        self._write_paused = False
        self._held = 0  # batches of replies the committer holds for this connection
        self._shut = False  # the transport was closed or aborted here: write nothing more

    # ---- asyncio callbacks ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but they quack alike.
        t: asyncio.Transport = transport  # type: ignore[assignment]
        self.transport = t
        self.last_active = self.server.loop.time()
        if not self.server.connection_opened(self):
            t.write(mc.server_error("too many connections"))
            self.closing = True
            t.close()

    def data_received(self, data: bytes) -> None:
        hub = self.hub
        hub.bytes_read += len(data)
        if hub.tracks_idle:  # only with client_timeout: a clock read per read otherwise
            self.last_active = hub.loop.time()
        self.codec.receive_data(data)
        if self.blocked is None:
            self._process()
        elif self.codec.buffered > MAX_BUFFERED_WHILE_BLOCKED and self.transport is not None:
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        """The client closed its side: close ours once the replies it is owed are out (some
        may wait for the group commit). A blocked read is cancelled, as on a close."""
        if self.blocked is not None:
            return None  # asyncio.Protocol's default: the transport closes now
        self.closing = True
        self._flush()
        return True  # keep the transport open until the flush closes it

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self.blocked is not None:
            self.blocked[2].cancel()
            self.blocked = None
        self.session.close()
        self.server.connection_closed(self)
        self.transport = None

    def pause_writing(self) -> None:
        self._write_paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self.transport is not None and self.blocked is None:
            self.transport.resume_reading()

    # ---- the pump -------------------------------------------------------------------------

    def _process(self) -> None:
        codec = self.codec
        out = self.out
        hub = self.hub
        hub.now = hub.clock.now_ms()  # one clock read per batch (Redis caches its clock too)
        while not self.closing:
            try:
                # Direct calls: compiled, a method called on its object is a C call, while a
                # bound method kept in a local or a handler looked up in a dict is a generic one.
                cmd = codec.next_command()
                if cmd is NEED_DATA:
                    break
                if type(cmd) is SET_CLASS:
                    handle_set(self, cmd)
                elif type(cmd) is GET_CLASS:
                    handle_get(self, cmd)
                else:
                    HANDLERS[type(cmd)](self, cmd)
            except ProtocolError as exc:
                out.append(mc.client_error(exc.reason))
                if exc.close:
                    self.closing = True
            except OpenReadError:
                out.append(mc.ERROR)
            except QueueError as exc:
                out.append(mc.client_error(exc.reason))
            except UnavailableError as exc:
                out.append(mc.server_error(exc.reason))
            except JournalError:
                out.append(mc.server_error("journal write failed"))
            except ConfigError as exc:
                out.append(mc.server_error(f"reload refused: {exc}"))
            except Exception:
                log.exception("bug while serving a memcache command; closing the connection")
                self.out.clear()
                self.closing = True
            if self.blocked is not None:
                break
        self._flush()

    def _flush(self) -> None:
        out = self.out
        if out:
            data = b"".join(out)
            out.clear()
            committer = self.hub.committer
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
        self.hub.bytes_written += len(data)
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

    # ---- blocked reads --------------------------------------------------------------------

    def _block(self, cmd: Get, mode: str, timeout_ms: int) -> None:
        pending = self.session.wait(cmd.queue, mode, self._delivered)
        if pending is None:
            self.out.append(mc.END)
            return
        timer = self.hub.loop.call_later(timeout_ms / 1000, pending.timeout)
        self.blocked = (cmd, pending, timer)

    def settle_blocked(self, item: QItem | None) -> bool:
        """The common start of every blocked read's delivery callback (get, lease, monitor).

        Such callbacks run inside another connection's command or a timer, so they only
        record replies and resume this connection's pump on a later loop pass. Cancels the
        deadline timer; on a timeout (``item`` None) answers ``END``, unblocks and resumes.
        Returns True when there is an item to deliver (the connection is still blocked), False
        when there is nothing more to do.
        """
        if self.blocked is None:
            return False
        self.blocked[2].cancel()
        if item is None:
            self.blocked = None
            self.out.append(mc.END)
            self.hub.loop.call_soon(self._resume)
            return False
        return True

    def _delivered(self, xid: int, item: QItem | None) -> None:
        if not self.settle_blocked(item):
            return
        assert self.blocked is not None and item is not None
        cmd = self.blocked[0]
        self.blocked = None
        self._value(cmd, item)
        hub = self.hub
        if not cmd.peek and sampled(hub):
            hub.metrics.queue(cmd.queue).delivery.add(hub.clock.now_ms() - item.add_time)
        hub.loop.call_soon(self._resume)

    def _resume(self) -> None:
        if self.transport is None:
            return
        if not self._write_paused:
            self.transport.resume_reading()
        self._process()

    def _value(self, cmd: Get, item: QItem) -> None:
        data = item.data
        self.out += (
            mc.value_head(cmd.key, len(data), item.id if cmd.cas else None),
            data,
            mc.VALUE_TAIL,
        )


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
    hub = conn.hub
    if not hub.readable:
        conn.server.check_readable()
    mode = "peek" if peek else "open" if open_ else "get"
    timed = sampled(hub)
    t0 = perf_counter_ns() if timed else 0
    now = hub.now
    if mode == "get":
        item = session.take(queue, now)
    else:
        got = session.fetch(queue, mode, now)
        item = None if got is None else got[1]
    if item is not None:
        conn._value(cmd, item)
        if timed:
            lat = hub.metrics.queue(queue)
            lat.get_hit.add((perf_counter_ns() - t0) // 1000)
            if not peek:
                lat.delivery.add(now - item.add_time)
    elif timeout is not None:
        conn._block(cmd, mode, timeout)
    else:
        session.count_miss()
        conn.out.append(mc.END)
        if timed:
            hub.metrics.queue(queue).get_miss.add((perf_counter_ns() - t0) // 1000)


def handle_set(conn: MemcacheConnection, cmd: Set) -> None:
    queue, _flags, exptime, data, noreply = cmd
    hub = conn.hub
    if not hub.writable:
        conn.server.check_writable()
    coll = hub.collection
    coll.stats.cmd_set += 1
    now = hub.now
    expiry = expiry_ms(exptime, now) if exptime else None
    if not sampled(hub):
        stored = coll.add(queue, data, expiry, now)
    else:
        t0 = perf_counter_ns()
        stored = coll.add(queue, data, expiry, now)
        hub.metrics.queue(queue).set.add((perf_counter_ns() - t0) // 1000)
    if not noreply:
        conn.out.append(mc.STORED if stored else mc.NOT_STORED)


def handle_delete(conn: MemcacheConnection, cmd: Delete) -> None:
    conn.server.check_writable()
    conn.server.collection.delete(cmd.queue)
    if not cmd.noreply:
        conn.out.append(mc.DELETED)


def handle_flush(conn: MemcacheConnection, cmd: Flush) -> None:
    conn.server.check_writable()
    conn.server.collection.flush(cmd.queue)
    if not cmd.noreply:
        conn.out.append(mc.END)


def handle_flush_all(conn: MemcacheConnection, cmd: FlushAll) -> None:
    conn.server.check_writable()
    conn.server.collection.flush_all()
    if not cmd.noreply:
        conn.out.append(mc.OK)


def handle_flush_expired(conn: MemcacheConnection, cmd: FlushExpired) -> None:
    conn.server.check_writable()
    conn.out.append(mc.number(conn.server.collection.flush_expired(cmd.queue)))


def handle_dump_stats(conn: MemcacheConnection, cmd: DumpStats) -> None:
    conn.out.append(mc.blocks(conn.server.dump_stats(cmd.queues)))


def handle_status(conn: MemcacheConnection, cmd: Status) -> None:
    """``status`` answers the current status; ``status <s>`` (any case) sets it: ``END``."""
    server = conn.server
    if cmd.value is None:
        conn.out.append(server.status.current.name.encode() + b"\r\n")
        return
    try:
        status = parse_status(cmd.value)
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None
    try:
        server.set_status(status)
    except OSError as exc:
        raise UnavailableError(f"cannot write the status file: {exc.strerror or exc}") from None
    conn.out.append(mc.END)


def handle_unknown(conn: MemcacheConnection, cmd: Unknown) -> None:
    conn.out.append(mc.ERROR)


def handle_simple(conn: MemcacheConnection, cmd: Simple) -> None:
    SIMPLE[cmd.name](conn)


def _version(conn: MemcacheConnection) -> None:
    conn.out.append(mc.version(conn.server.version))


def _quit(conn: MemcacheConnection) -> None:
    conn.closing = True


def _shutdown(conn: MemcacheConnection) -> None:
    conn.closing = True
    conn.server.request_stop()


def _reload(conn: MemcacheConnection) -> None:
    conn.server.reload()  # raises ConfigError -> SERVER_ERROR below
    conn.out.append(mc.RELOADED)


def _stats(conn: MemcacheConnection) -> None:
    conn.out.append(mc.stats(conn.server.stats_lines()))


def _dump_config(conn: MemcacheConnection) -> None:
    conn.out.append(mc.blocks(conn.server.dump_config()))


def _flush_all_expired(conn: MemcacheConnection) -> None:
    conn.server.check_writable()
    conn.out.append(mc.number(conn.server.collection.flush_all_expired()))


SIMPLE: Final[dict[str, Callable[[MemcacheConnection], None]]] = {
    "version": _version,
    "quit": _quit,
    "shutdown": _shutdown,
    "reload": _reload,
    "stats": _stats,
    "dump_config": _dump_config,
    "flush_all_expired": _flush_all_expired,
    "features": ext.features,
}

HANDLERS: Final[dict[type, Callable[[MemcacheConnection, Any], None]]] = {
    Get: handle_get,
    Set: handle_set,
    Delete: handle_delete,
    Flush: handle_flush,
    FlushAll: handle_flush_all,
    FlushExpired: handle_flush_expired,
    DumpStats: handle_dump_stats,
    Simple: handle_simple,
    Status: handle_status,
    Unknown: handle_unknown,
}
HANDLERS.update(ext.HANDLERS)
