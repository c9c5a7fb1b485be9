"""Memcache extensions: ``features``, leases (``lease ack release renew``, with or without a
key) and Kestrel 2.x's ``monitor``/``confirm``; the wire side of
:mod:`tercel.core.reservations` and of the core's keyed leases (docs/protocol.md).

The handlers follow :mod:`tercel.server.memcache`'s rules: they append replies to
``conn.out`` and raise the tree's errors, which the pump translates; the work is Kestrel's
operations (:mod:`tercel.server.kestrel.ops`). A request that has to wait (``lease`` on an
empty queue, ``monitor``) parks the connection (``Connection.park``) with its own waiter,
exactly like a blocked ``get``; deliveries only record the reply and hand the rest to
``Connection.continue_soon`` (the next loop pass), so no handler re-enters a queue. Lease
expiry runs on one timer (:mod:`tercel.server.deadlines`). The handlers need only Kestrel's
connection base (:class:`~tercel.server.kestrel.connection.KestrelConnection`).
"""

from __future__ import annotations

import logging
from typing import Final

from tercel.core.queue import READ_PEEK, KeyedLease, PersistentQueue, QItem
from tercel.core.reservations import Reservation, ReservationTable
from tercel.errors import BadKey, OpenReadError, TercelError, TooManyLeases
from tercel.protocol import memcache as mc
from tercel.protocol import memcache_keyed as mk
from tercel.protocol.commands import (
    Ack,
    AckKey,
    Confirm,
    LeaseKey,
    LeaseSlice,
    Monitor,
    Release,
    ReleaseKey,
    Renew,
    RenewKey,
)
from tercel.protocol.commands import Lease as LeaseCmd
from tercel.server.auth import TAKE
from tercel.server.connection import Operation
from tercel.server.context import ANY, READS
from tercel.server.kestrel import ops
from tercel.server.kestrel.connection import KestrelConnection
from tercel.steps import Steps, finish

log = logging.getLogger(__name__)

FEATURES = [
    ("lease", 1),
    ("item-id", 1),
    ("dead-letter", 1),
    ("monitor", 1),
    ("lease-binary", 1),
    ("dedup", 1),
    ("lease-key", 1),
]
"""What ``features`` announces: one ``FEATURE <name> <version>`` line each."""


def _leased_reply(
    out: list[bytes], table: ReservationTable, leases: list[Reservation], binary: bool
) -> None:
    """The reply to a lease batch: ``LEASED`` lines, or one ``LEASEDB`` block for ``binary``."""
    if binary:
        _leased_binary(out, table, leases)
        return
    prefix = table.prefix_bytes
    for lease in leases:
        item = lease.item
        data = item.data
        head = mc.leased(
            prefix,
            table.lease_number(lease),
            item_id=item.id,
            deliveries=item.deliveries,
            add_ms=item.add_time,
            expiry_ms=item.expiry,
            size=len(data),
        )
        out += (head, data, b"\r\n")
    out.append(mc.END)


def _reply_budget(cmd: LeaseCmd) -> int | None:
    """The most payload bytes the reply to ``cmd`` may carry: ``mc.LEASED_BINARY_MAX`` for a
    binary one (int32 offsets), read at each call (a test launcher lowers it); None for text.
    The lease stops before an item that would pass it, which stays queued, never opened."""
    return mc.LEASED_BINARY_MAX if cmd.columns else None


def _leased_binary(out: list[bytes], table: ReservationTable, leases: list[Reservation]) -> None:
    """``mc.leased_binary`` of ``leases``. Those are cut to ``mc.LEASED_BINARY_MAX`` payload
    bytes already (:func:`_reply_budget`) but for the first item of a blocked lease, opened by
    the queue before the reply's size was known: leases past the limit are given back to the
    head of their queue unsent (a client cannot ack what it never saw)."""
    total = 0
    for k, lease in enumerate(leases):
        total += len(lease.item.data)
        if total > mc.LEASED_BINARY_MAX:
            table.abort(leases[k:])
            leases = leases[:k]
            break
    items = [lease.item for lease in leases]
    out += mc.leased_binary(
        table.prefix_bytes,
        [table.lease_number(lease) for lease in leases],
        item_ids=[item.id for item in items],
        deliveries=[item.deliveries for item in items],
        add_ms=[item.add_time for item in items],
        expiry_ms=[item.expiry for item in items],
        payloads=[item.data for item in items],
    )


# ---- lease ------------------------------------------------------------------------------------


def handle_lease(conn: KestrelConnection, cmd: LeaseCmd) -> None:
    """``lease <q> <max_items> <wait_ms> <lease_ms>``: wait only while the queue is empty."""
    ctx = conn.ctx
    queue = ops.source(ctx, cmd.queue) if cmd.max_items else None
    if queue is None:  # an alias, or no item asked for
        conn.out.append(mc.END)
        return
    table = ctx.reservations.table
    now = ctx.clock.now_ms()
    leases = ops.lease(ctx, queue, cmd.max_items, cmd.lease_ms, now, max_bytes=_reply_budget(cmd))
    if leases or not cmd.wait_ms:
        _leased_reply(conn.out, table, leases, cmd.columns)
        return

    def delivered(xid: int, item: QItem | None) -> None:
        if not conn.settle_parked(item):
            return
        assert item is not None
        # conn.parked stays set until _finish_lease has replied, so a command pipelined
        # behind this one cannot answer first.
        full = table.room(queue) == 0  # other blocked leases took the room meanwhile
        first = table.adopt(queue, xid, item, ttl_ms=cmd.lease_ms)

        def abandon() -> None:  # the client left meanwhile: nobody knows the id
            table.abort([first])

        conn.continue_soon(lambda: _finish_lease(conn, cmd, queue, first, full), abandon)

    conn.park(cmd, ops.wait_lease(conn, queue, delivered), cmd.wait_ms, mc.END)


def _finish_lease(
    conn: KestrelConnection, cmd: LeaseCmd, queue: PersistentQueue, first: Reservation, full: bool
) -> bool:
    """After a blocked lease got its first item: take the rest of the batch, then reply.

    Blocked leases on one queue wait side by side, each admitted while the queue had room: the
    one served when the queue was already at ``max_open_leases`` (``full``) gives its item back
    and gets the answer a lease with no room gets."""
    service = conn.ctx.reservations
    table = service.table
    leases = [first]
    if full:
        table.abort(leases)
        raise TooManyLeases()
    room = min(cmd.max_items - 1, table.room(queue))
    if room > 0 and not queue.closed:
        now = conn.ctx.clock.now_ms()
        budget = _reply_budget(cmd)
        if budget is not None:
            budget -= len(first.item.data)
        try:
            leases += table.take_leases(queue, room, cmd.lease_ms, now, budget)
        except TercelError:
            log.exception("could not lease more of %s; replying with one item", cmd.queue)
    service.arm()
    _leased_reply(conn.out, table, leases, cmd.columns)
    return False


# ---- ack, release, renew ------------------------------------------------------------------------


def _named(conn: KestrelConnection, name: str, ids: tuple[str, ...]) -> list[Reservation]:
    """The open leases of queue ``name`` among lease ids ``ids`` (unknown ones left out)."""
    table = conn.ctx.reservations.table
    numbers = [table.parse_lease_id(i) for i in ids]
    if -1 in numbers:  # not this table's: an item of a keyed lease is refused, not ignored
        ops.refuse_keyed_ids([i for i, n in zip(ids, numbers, strict=True) if n == -1])
    return ops.reserved(conn.ctx, name, numbers, False)


def handle_ack(conn: KestrelConnection, cmd: Ack) -> None:
    """``ack <q> <id>...`` -> ``ACKED <n>``. The CONFIRM records are in the journal buffer, so
    the committer holds this reply until they are written (and fsynced if the queue says so)."""
    n = ops.confirm_reserved(conn.ctx, _named(conn, cmd.queue, cmd.ids))
    conn.out.append(mc.counted(b"ACKED", n))


def handle_release(conn: KestrelConnection, cmd: Release) -> None:
    """``release <q> <id>...`` -> ``RELEASED <n>``: back to their places, in queue order."""
    n = ops.abort_reserved(conn.ctx, _named(conn, cmd.queue, cmd.ids))
    conn.out.append(mc.counted(b"RELEASED", n))


def handle_renew(conn: KestrelConnection, cmd: Renew) -> None:
    """``renew <q> <lease_ms> <id>...`` -> ``RENEWED <n>``."""
    n = ops.renew(conn.ctx, _named(conn, cmd.queue, cmd.ids), cmd.lease_ms)
    conn.out.append(mc.counted(b"RENEWED", n))


def features(conn: KestrelConnection, cmd: object) -> None:
    """``features`` -> ``FEATURE <name> <version>`` lines, ``END``."""
    conn.out.append(mc.features(FEATURES))


# ---- keyed leases (docs/protocol.md section 11, "Keyed leases") ------------------------------


def _keyed_empty(cmd: LeaseKey) -> bytes:
    """The reply of a keyed take when nothing was ready (no key was created)."""
    return mk.keyed(0, 0, 0) if cmd.nodata else mc.END


def _slice_reply(
    out: list[bytes], q: PersistentQueue, key: str, span: tuple[int, int], binary: bool
) -> None:
    """Items ``span`` (start, stop) of ``key`` with their payloads (read back from the
    journal when not in memory): ``LEASED`` lines, or one ``LEASEDB`` block within its size
    limit."""
    start, stop = span
    items = q.keyed_slice(key, start, stop)
    size = mk.payload_bytes(items)
    if binary and size > mc.LEASED_BINARY_MAX:
        raise BadKey(
            f"items {start}..{stop - 1} of lease key {key} hold {size} payload bytes, more than"
            f" one binary reply carries ({mc.LEASED_BINARY_MAX}): read smaller slices"
        )
    out += (mk.keyed_binary if binary else mk.keyed_items)(start, items)


class _KeyedTake:
    """A keyed take in progress: the core takes a large lease in steps (``take_keyed_steps``,
    a chunk of payload bytes each), one per loop pass, so that other connections are served
    meanwhile; the connection stays parked until the lease is taken (the commands behind it
    wait). When nothing was ready and ``deadline`` (epoch ms) is ahead, it waits for an item
    and takes again."""

    __slots__ = ("cmd", "conn", "deadline", "queue", "steps")

    def __init__(self, conn: KestrelConnection, cmd: LeaseKey, deadline: int) -> None:
        self.conn = conn
        self.cmd = cmd
        self.deadline = deadline
        self.queue: PersistentQueue | None = None
        self.steps: Steps[KeyedLease | None] | None = None

    def start(self) -> bool:
        """Begin (or, after a wait, begin again); True when parked."""
        cmd = self.cmd
        ctx = self.conn.ctx
        q = self.queue = ops.keyed_source(ctx, cmd.queue, cmd.key)
        if q is None:  # an alias: nothing to take
            self.conn.out.append(_keyed_empty(cmd))
            return False
        now = ctx.clock.now_ms()
        self.steps = q.take_keyed_steps(cmd.key, cmd.max_items, cmd.lease_ms, now)
        return self.step()

    def step(self) -> bool:
        """One step of the take; at the end the reply (or a wait). True when parked."""
        assert self.steps is not None
        try:
            next(self.steps)
        except StopIteration as stop:
            self.steps = None
            return self._taken(stop.value)
        conn = self.conn
        conn.park_untimed(self.cmd, self, b"")
        conn.continue_soon(self.step, self._abandon)
        return True

    def _abandon(self) -> None:
        """The client left mid-take: take the rest all the same (the key is busy until then;
        a later take of the key gets the whole lease)."""
        if self.steps is not None:
            try:
                finish(self.steps)
            except TercelError:
                log.exception("keyed take of %s stopped after its client left", self.cmd.key)

    def _taken(self, lease: KeyedLease | None) -> bool:
        conn, cmd, q = self.conn, self.cmd, self.queue
        assert q is not None
        if lease is not None:
            if cmd.nodata:
                conn.out.append(mk.keyed(lease.count, lease.size, lease.expires_at))
            else:
                _slice_reply(conn.out, q, cmd.key, (0, lease.count), cmd.columns)
            return False
        now = conn.ctx.clock.now_ms()
        if self.deadline > now:
            pending = conn.session.wait(cmd.queue, READ_PEEK, self._woken)
            if pending is not None:
                conn.park(cmd, pending, self.deadline - now, _keyed_empty(cmd))
                return True
        conn.out.append(_keyed_empty(cmd))
        return False

    def _woken(self, xid: int, item: QItem | None) -> None:
        """An item arrived (or the time ran out): take again on the next loop pass (another
        reader may have had the item: then it waits again)."""
        if self.conn.settle_parked(item):
            self.conn.continue_soon(self.start)


def handle_lease_key(conn: KestrelConnection, cmd: LeaseKey) -> None:
    """``lease <q> <max_items> <wait_ms> <lease_ms> [binary] key=<k> [nodata]``: the keyed
    lease ``k``, taken now (waiting up to ``wait_ms`` while nothing is ready) or again."""
    deadline = conn.ctx.clock.now_ms() + cmd.wait_ms if cmd.wait_ms else 0
    _KeyedTake(conn, cmd, deadline).start()


def handle_lease_slice(conn: KestrelConnection, cmd: LeaseSlice) -> None:
    """``lease <q> slice <start> <stop> [binary] key=<k>``: items of ``k``, nothing taken."""
    q = ops.keyed_queue(conn.ctx, cmd.queue, cmd.key)
    _slice_reply(conn.out, q, cmd.key, (cmd.start, cmd.stop), cmd.columns)


def handle_ack_key(conn: KestrelConnection, cmd: AckKey) -> None:
    """``ack <q> key=<k>`` -> ``ACKED <n>`` (0: acked before), once the records are written."""
    n = ops.keyed_queue(conn.ctx, cmd.queue, cmd.key).ack_keyed(cmd.key)
    conn.out.append(mc.counted(b"ACKED", n))


def handle_release_key(conn: KestrelConnection, cmd: ReleaseKey) -> None:
    """``release <q> key=<k>`` -> ``RELEASED <n>``: every item back at its place."""
    n = ops.keyed_queue(conn.ctx, cmd.queue, cmd.key).release_keyed(cmd.key)
    conn.out.append(mc.counted(b"RELEASED", n))


def handle_renew_key(conn: KestrelConnection, cmd: RenewKey) -> None:
    """``renew <q> <lease_ms> key=<k>`` -> ``KEYED <count> <bytes> <expires_ms>``."""
    q = ops.keyed_queue(conn.ctx, cmd.queue, cmd.key)
    expires = q.renew_keyed(cmd.key, cmd.lease_ms, conn.ctx.clock.now_ms())
    lease = q.keyed(cmd.key)
    count, size = (0, 0) if lease is None else (lease.count, lease.size)
    conn.out.append(mk.keyed(count, size, expires))


# ---- Kestrel 2.x: monitor and confirm -------------------------------------------------------


class _Monitor(ops.Monitor):
    """Kestrel 2.x's ``monitor``: ``VALUE`` blocks, then ``END``; it waits as an open read."""

    def __init__(self, conn: KestrelConnection, cmd: Monitor, left: int, deadline: int) -> None:
        super().__init__(conn, cmd.queue, left, deadline)
        self.key = cmd.queue.encode()

    def emit(self, item: QItem) -> None:
        data = item.data
        self.conn.out += (mc.value_head(self.key, len(data)), data, mc.VALUE_TAIL)

    def end(self) -> bytes:
        return mc.END

    def failed(self, exc: TercelError) -> bool:
        log.exception("monitor of %s stopped", self.queue)
        self.conn.out.append(mc.END)
        return True


def handle_monitor(conn: KestrelConnection, cmd: Monitor) -> None:
    """``monitor <q> <seconds> [max_items]``: open reads streamed as VALUE...END, then END.

    Stops after max_items (default: max_open_reads), at the deadline, or when this connection
    holds max_open_reads open reads on the queue (reference kestrel.md §1.5).
    """
    limit = conn.session.max_open_reads if cmd.max_items is None else cmd.max_items
    deadline = conn.ctx.clock.now_ms() + max(0, cmd.seconds) * 1000
    _Monitor(conn, cmd, limit, deadline).run()


def handle_confirm(conn: KestrelConnection, cmd: Confirm) -> None:
    """``confirm <q> <count>``: confirm the oldest ``count`` open reads -> ``END``; bare
    ``ERROR`` (connection kept) when fewer are open, confirming nothing (Kestrel 2.x)."""
    if not ops.confirm(conn, cmd.queue, cmd.count):
        raise OpenReadError("confirm of more reads than are open")
    conn.out.append(mc.END)


HANDLERS: Final[dict[type, Operation]] = {
    LeaseCmd: Operation("lease", handle_lease, READS, TAKE),
    Ack: Operation("ack", handle_ack, ANY, TAKE),
    Release: Operation("release", handle_release, ANY, TAKE),
    Renew: Operation("renew", handle_renew, ANY, TAKE),
    LeaseKey: Operation("lease_key", handle_lease_key, READS, TAKE),
    LeaseSlice: Operation("lease_slice", handle_lease_slice, READS, TAKE),
    AckKey: Operation("ack_key", handle_ack_key, ANY, TAKE),
    ReleaseKey: Operation("release_key", handle_release_key, ANY, TAKE),
    RenewKey: Operation("renew_key", handle_renew_key, ANY, TAKE),
    Monitor: Operation("monitor", handle_monitor, READS, TAKE),
    Confirm: Operation("confirm", handle_confirm, ANY, TAKE),
}
"""Each command with its operation (the access it needs, ``context.READS``...), checked by
the pump."""
