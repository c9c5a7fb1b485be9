"""Memcache extensions: ``features``, leases (``lease ack release renew``) and Kestrel 2.x's
``monitor``/``confirm``; the wire side of :mod:`tercel.core.leases` (docs/protocol.md).

The handlers follow :mod:`tercel.server.memcache`'s rules: they append replies to
``conn.out`` and raise the tree's errors, which the pump translates. A request that has to wait
(``lease`` on an empty queue, ``monitor``) parks the connection in ``conn.blocked`` with its own
waiter, exactly like a blocked ``get``; deliveries only record the reply and schedule the rest
on the next loop pass, so no handler re-enters a queue. Lease expiry runs on one timer, set for
the earliest deadline of the table (a renew or a shorter lease moves it earlier).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tercel.core.leases import Lease, LeaseTable
from tercel.core.queue import QItem
from tercel.errors import OpenReadError, TercelError
from tercel.protocol import memcache as mc
from tercel.protocol.commands import Ack, Confirm, Monitor, Release, Renew
from tercel.protocol.commands import Lease as LeaseCmd
from tercel.session import PendingRead

if TYPE_CHECKING:
    from tercel.server.app import Server
    from tercel.server.memcache import MemcacheConnection

log = logging.getLogger(__name__)

FEATURES = [("lease", 1), ("item-id", 1), ("dead-letter", 1), ("monitor", 1)]
"""What ``features`` announces: one ``FEATURE <name> <version>`` line each."""


class LeaseService:
    """The server's :class:`LeaseTable` and the one timer that expires its leases."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.table = LeaseTable()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0

    def arm(self) -> None:
        """(Re)schedule the expiry timer for the table's earliest deadline."""
        deadline = self.table.next_deadline()
        if self._timer is not None:
            if deadline is not None and self._timer_at <= deadline:
                return
            self._timer.cancel()
            self._timer = None
        if deadline is None or self.server.stopping:
            return
        delay = max(0, deadline - self.server.clock.now_ms()) / 1000
        self._timer_at = deadline
        self._timer = self.server.loop.call_later(delay + 0.001, self._expire)

    def _expire(self) -> None:
        self._timer = None
        try:
            self.table.expire(self.server.clock.now_ms())
        finally:
            self.arm()  # whatever happened, the leases still open keep their timer

    def close(self) -> None:
        """Stop the timer (shutdown: the journal returns leased items at the next start)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _leased_reply(out: list[bytes], leases: list[Lease]) -> None:
    for lease in leases:
        item = lease.item
        data = item.data
        head = mc.leased(lease.id, item.id, item.deliveries, item.add_time, item.expiry)
        out += (head, b"%d\r\n" % len(data), data, b"\r\n")
    out.append(mc.END)


# ---- lease ------------------------------------------------------------------------------------


class LeaseWaiter(PendingRead):
    """A blocked ``lease``: the queue opens the first item for it; that read is detached from
    the session at once (a lease belongs to no connection)."""

    __slots__ = ()

    def deliver(self, xid: int, item: QItem) -> None:
        self.session.pending = None
        self.session.collection.stats.get_hits += 1
        self.callback(xid, item)


def handle_lease(conn: MemcacheConnection, cmd: LeaseCmd) -> None:
    """``lease <q> <max_items> <wait_ms> <lease_ms>``: wait only while the queue is empty."""
    server = conn.server
    server.check_readable()
    if server.collection.is_alias(cmd.queue) or cmd.max_items == 0:
        conn.out.append(mc.END)
        return
    queue = server.collection.get_or_create(cmd.queue)
    service = server.leases
    leases = service.table.take(queue, cmd.max_items, cmd.lease_ms, server.clock.now_ms())
    if leases or not cmd.wait_ms:
        service.arm()
        _leased_reply(conn.out, leases)
        return

    def delivered(xid: int, item: QItem | None) -> None:
        if not conn.settle_blocked(item):
            return
        assert item is not None
        # conn.blocked stays set until _finish_lease has replied, so a command pipelined
        # behind this one cannot answer first.
        first = service.table.adopt(queue, xid, item, cmd.lease_ms, server.clock.now_ms())
        server.loop.call_soon(_finish_lease, conn, cmd, first)

    waiter = LeaseWaiter(conn.session, queue, "open", delivered)
    queue.wait(waiter)
    conn.session.pending = waiter
    timer = server.loop.call_later(cmd.wait_ms / 1000, waiter.timeout)
    conn.blocked = (cmd, waiter, timer)


def _finish_lease(conn: MemcacheConnection, cmd: LeaseCmd, first: Lease) -> None:
    """After a blocked lease got its first item: take the rest of the batch, then reply."""
    conn.blocked = None
    service = conn.server.leases
    leases = [first]
    if conn.transport is None:  # the client left meanwhile: nobody knows the id
        service.table.release(first.queue, [first.id])
        return
    room = min(cmd.max_items - 1, service.table.room(first.queue))
    if room > 0 and not first.queue.closed:
        now = conn.server.clock.now_ms()
        try:
            leases += service.table.take(first.queue, room, cmd.lease_ms, now)
        except TercelError:
            log.exception("could not lease more of %s; replying with one item", cmd.queue)
    service.arm()
    _leased_reply(conn.out, leases)
    conn._resume()


# ---- ack, release, renew ------------------------------------------------------------------------


def handle_ack(conn: MemcacheConnection, cmd: Ack) -> None:
    """``ack <q> <id>...`` -> ``ACKED <n>``. The CONFIRM records are in the journal buffer, so
    the committer holds this reply until they are written (and fsynced if the queue says so)."""
    queue = conn.server.collection.queue(cmd.queue)
    conn.out.append(mc.counted(b"ACKED", conn.server.leases.table.ack(queue, cmd.ids)))


def handle_release(conn: MemcacheConnection, cmd: Release) -> None:
    """``release <q> <id>...`` -> ``RELEASED <n>``: back to the head, in queue order."""
    queue = conn.server.collection.queue(cmd.queue)
    conn.out.append(mc.counted(b"RELEASED", conn.server.leases.table.release(queue, cmd.ids)))


def handle_renew(conn: MemcacheConnection, cmd: Renew) -> None:
    """``renew <q> <lease_ms> <id>...`` -> ``RENEWED <n>``."""
    server = conn.server
    queue = server.collection.queue(cmd.queue)
    n = server.leases.table.renew(queue, cmd.ids, cmd.lease_ms, server.clock.now_ms())
    server.leases.arm()
    conn.out.append(mc.counted(b"RENEWED", n))


def features(conn: MemcacheConnection) -> None:
    """``features`` -> ``FEATURE <name> <version>`` lines, ``END``."""
    conn.out.append(mc.features(FEATURES))


# ---- Kestrel 2.x: monitor and confirm -------------------------------------------------------


def handle_monitor(conn: MemcacheConnection, cmd: Monitor) -> None:
    """``monitor <q> <seconds> [max_items]``: open reads streamed as VALUE...END, then END.

    Stops after max_items (default: max_open_reads), at the deadline, or when this connection
    holds max_open_reads open reads on the queue (reference kestrel.md §1.5).
    """
    server = conn.server
    server.check_readable()
    limit = conn.session.max_open_reads if cmd.max_items is None else cmd.max_items
    _monitor_step(conn, cmd, limit, server.clock.now_ms() + max(0, cmd.seconds) * 1000)


def _monitor_step(conn: MemcacheConnection, cmd: Monitor, left: int, deadline: int) -> bool:
    """Stream what is there; block for more while time is left. True when it blocked."""
    session = conn.session
    now = conn.server.clock.now_ms()
    key = cmd.queue.encode()
    while left > 0 and session.open_count(cmd.queue) < session.max_open_reads:
        got = session.fetch(cmd.queue, "open", now)
        if got is None:
            break
        _stream_value(conn, key, got[1])
        left -= 1
    room = left > 0 and session.open_count(cmd.queue) < session.max_open_reads
    if room and now < deadline:
        pending = session.wait(cmd.queue, "open", _monitor_delivered(conn, cmd, left, deadline))
        if pending is not None:
            timer = conn.server.loop.call_later((deadline - now) / 1000, pending.timeout)
            conn.blocked = (cmd, pending, timer)
            return True
    conn.out.append(mc.END)
    return False


def _stream_value(conn: MemcacheConnection, key: bytes, item: QItem) -> None:
    conn.out += (mc.value_head(key, len(item.data)), item.data, mc.VALUE_TAIL)


def _monitor_delivered(
    conn: MemcacheConnection, cmd: Monitor, left: int, deadline: int
) -> Callable[[int, QItem | None], None]:
    def delivered(xid: int, item: QItem | None) -> None:
        if not conn.settle_blocked(item):
            return
        assert item is not None
        _stream_value(conn, cmd.queue.encode(), item)
        conn.server.loop.call_soon(_monitor_more, conn, cmd, left - 1, deadline)

    return delivered


def _monitor_more(conn: MemcacheConnection, cmd: Monitor, left: int, deadline: int) -> None:
    conn.blocked = None
    if conn.transport is None:
        return
    try:
        blocked = _monitor_step(conn, cmd, left, deadline)
    except TercelError:
        log.exception("monitor of %s stopped", cmd.queue)
        conn.out.append(mc.END)
        blocked = False
    if blocked:
        conn._flush()  # stream what was found so far, keep waiting
    else:
        conn._resume()


def handle_confirm(conn: MemcacheConnection, cmd: Confirm) -> None:
    """``confirm <q> <count>``: confirm the oldest ``count`` open reads -> ``END``; bare
    ``ERROR`` (connection kept) when fewer are open, confirming nothing (Kestrel 2.x)."""
    session = conn.session
    if cmd.count > session.open_count(cmd.queue):
        raise OpenReadError("confirm of more reads than are open")
    for _ in range(cmd.count):
        session.confirm_oldest(cmd.queue)
    conn.out.append(mc.END)


HANDLERS: dict[type, Callable[[MemcacheConnection, Any], None]] = {
    LeaseCmd: handle_lease,
    Ack: handle_ack,
    Release: handle_release,
    Renew: handle_renew,
    Monitor: handle_monitor,
    Confirm: handle_confirm,
}
