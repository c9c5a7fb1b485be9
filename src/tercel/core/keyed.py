"""Keyed leases: a batch of a queue's items handed out again, identically, under a key, until
it is acked or released (docs/journal_format.md §18, docs/architecture.md "Keyed leases").

The first take of a key moves up to ``max_items`` items from the head of the queue into a
*lease file* of their own (``QueueLog.lease_write``), then journals a KEY_TAKE record naming
it, a chunk at a time (:data:`CHUNK`); at replay a KEY_TAKE takes its items off the head
again (they live in the lease file). Nothing of the payloads stays in memory: a lease keeps
the index of its items' records (8 bytes an item) and reads slices back with ``pread``.

- **ack**: a KEY_END record; the lease file is unlinked once the record is durable
  (:func:`tidy`; a crash before: replay removes the file, which nothing names any more).
- **release, expiry**: the items are read back and go back to their places by item id with
  their delivery counts, after a KEY_END record; the file is kept until a compaction that
  began after it has switched in (replay of the KEY_END reads the items from it again).
- **ended keys** are remembered (their KEY_END, and in a snapshot the same record), so a take
  of one raises :class:`~tercel.errors.LeaseKeyEnded`; ``max_lease_keys`` bounds live and
  remembered keys together, the oldest ended forgotten first (a forgotten key can be taken
  anew).

Functions on a :class:`~tercel.core.queue_state.QueueState`, called through the methods of
:class:`~tercel.core.queue.PersistentQueue` (and by replay, :mod:`tercel.core.queue_replay`).
Same threading contract as :mod:`tercel.core.queue`; a take in steps (:func:`take_steps`)
marks its lease busy until its last step.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable

from tercel.core.items import QItem
from tercel.core.keyed_state import (
    ACKED,
    CHUNK,
    CHUNK_ITEMS,
    EXPIRED,
    HOW,
    RELEASED,
    KeyedLease,
    KeyedSlice,
    KeyedState,
    Lease,
)
from tercel.core.queue_paging import low, refill
from tercel.core.queue_state import QueueState
from tercel.errors import BadKey, LeaseKeyEnded, TooManyKeys, UnavailableError
from tercel.names import key_problem
from tercel.steps import Steps

__all__ = ["ACKED", "EXPIRED", "RELEASED", "KeyedLease", "KeyedSlice", "KeyedState"]

_log = logging.getLogger("tercel.core.queue")


def state(q: QueueState) -> KeyedState:
    """``q``'s keyed leases, made now if it had none."""
    ks = q._keyed
    if ks is None:
        ks = q._keyed = KeyedState()
    return ks


# ---- taking -------------------------------------------------------------------------------


def _existing(q: QueueState, key: str, max_items: int) -> KeyedLease | None:
    """The view of live lease ``key`` (refusing another max_items), or None when the key is
    new here; raises what a take of an ended or foreign key raises."""
    problem = key_problem(key)
    if problem is not None:
        raise BadKey(problem)
    if max_items <= 0:
        raise BadKey(f"max_items {max_items}: a keyed lease takes at least 1 item")
    ks = q._keyed
    if ks is not None:
        lease = ks.live.get(key)
        if lease is not None:
            if lease.busy:
                raise UnavailableError(f"lease key {key} is being taken, try again")
            if lease.max_items != max_items:
                raise BadKey(
                    f"lease key {key} was taken with max_items {lease.max_items}, not {max_items}"
                )
            return lease.view()
        how = ks.ended.get(key)
        if how is not None:
            raise LeaseKeyEnded(key, HOW[how])
    owners = q.key_owners
    owner = owners.get(key) if owners is not None else None
    if owner is not None and owner != q.name:
        raise BadKey(f"lease key {key} belongs to queue {owner}")
    return None


def take_steps(
    q: QueueState,
    key: str,
    max_items: int,
    lease_ms: int,
    now: int,
    *,
    expire_head: Callable[[int], int],
    dead_letter: Callable[[QItem], bool],
) -> Steps[KeyedLease | None]:
    """Take (or take again) keyed lease ``key`` of ``q``, a chunk (:data:`CHUNK`) per step;
    see :meth:`~tercel.core.queue.PersistentQueue.take_keyed`. ``expire_head(now)`` drops
    expired heads (journaled), ``dead_letter(item)`` moves the head out (False: refused)."""
    found = _existing(q, key, max_items)
    if found is not None or q.closed:
        return found
    cfg = q.config
    lease_ms = lease_ms or cfg.key_lease_ms
    limit = cfg.max_deliveries
    ks = state(q)
    if len(ks.live) >= cfg.max_lease_keys:
        _drop_if_empty(q)
        raise TooManyKeys("too many lease keys")  # (before anything is taken)
    lease: Lease | None = None
    chunk: list[QItem] = []
    size = 0

    def record(lease: Lease | None, chunk: list[QItem], size: int) -> Lease:
        return _record(
            q, ks, lease, chunk, size, key=key, max_items=max_items, now=now, lease_ms=lease_ms
        )

    refused = kept = -1  # heads the dead-letter queue refused, or that could not expire:
    try:  # each is taken all the same
        while (lease.count if lease is not None else 0) + len(chunk) < max_items:
            items = q._items
            if not items:
                if not q.disk_items:
                    break
                refill(q)
                continue
            head = items.first()
            expired = head.expiry and head.expiry < now and head.id != kept
            due = limit and head.deliveries >= limit and head.id != refused
            if expired or due:
                if chunk:  # what was taken is recorded before the head's own record
                    lease = record(lease, chunk, size)
                    chunk, size = [], 0
                if expired:
                    if not expire_head(now):  # (max_expire_sweep 0)
                        kept = head.id
                elif not dead_letter(head):
                    refused = head.id
                continue
            items.popleft()
            q.mem_bytes -= len(head.data)
            head.deliveries += 1
            chunk.append(head)
            size += len(head.data)
            if size >= CHUNK or len(chunk) >= CHUNK_ITEMS:
                lease = record(lease, chunk, size)
                chunk, size = [], 0
                lease.busy = True
                yield None
                lease.busy = False
                if q.closed or ks.live.get(key) is not lease:
                    return None  # the queue was deleted meanwhile
        if chunk:
            lease = record(lease, chunk, size)
            chunk = []
        if q.disk_items and low(q):  # (a take reads back only what it takes: no window)
            refill(q)
    finally:
        if lease is not None:
            lease.busy = False
        _unpop(q, chunk)  # a failed record: the items go back where they were
        _drop_if_empty(q)
    return lease.view() if lease is not None else None


def _drop_if_empty(q: QueueState) -> None:
    """Forget a keyed state that holds nothing (a take that found nothing): a queue without
    keyed leases keeps its checkpoints."""
    ks = q._keyed
    if ks is not None and not (ks or ks.unlink_after or ks.awaiting or ks.covering):
        q._keyed = None


def _unpop(q: QueueState, chunk: list[QItem]) -> None:
    for item in reversed(chunk):
        item.deliveries -= 1
        q._items.put_back(item)
        q.mem_bytes += len(item.data)


def _record(
    q: QueueState,
    ks: KeyedState,
    lease: Lease | None,
    chunk: list[QItem],
    size: int,
    *,
    key: str,
    max_items: int,
    now: int,
    lease_ms: int,
) -> Lease:
    """Write ``chunk`` to the lease file, then its KEY_TAKE record; the lease (made by the
    first chunk). Raises the log's error with nothing recorded (the caller puts the items
    back)."""
    if lease is None:
        if len(ks.live) + len(ks.ended) >= q.config.max_lease_keys:
            if not ks.ended:
                raise TooManyKeys("too many lease keys")
            _forget(q, ks, next(iter(ks.ended)))
        expires_at = now + lease_ms if lease_ms else 0
        lease = Lease(key, n=ks.next_n, max_items=max_items, created_at=now, expires_at=expires_at)
    assert lease.index is not None
    log = q.log
    ends = log.lease_write(lease.n, lease.index[-1] if lease.count else 0, chunk, _synced(q))
    log.key_take(
        key,
        n=lease.n,
        count=len(chunk),
        size=size,
        max_items=max_items,
        created_at=lease.created_at,
        expires_at=lease.expires_at,
    )
    if not lease.count:
        ks.next_n = lease.n + 1
        ks.live[key] = lease
        owners = q.key_owners
        if owners is not None:
            owners[key] = q.name
    lease.index.extend(ends)
    lease.count += len(chunk)
    lease.size += size
    chunk.clear()
    return lease


def _synced(q: QueueState) -> bool:
    return q.config.sync_journal is not None


def _forget(q: QueueState, ks: KeyedState, key: str) -> None:
    del ks.ended[key]
    owners = q.key_owners
    if owners is not None and owners.get(key) == q.name:
        del owners[key]


# ---- reading ------------------------------------------------------------------------------


def _live(q: QueueState, key: str) -> Lease:
    """Live lease ``key``; raises LeaseKeyEnded for an ended one, BadKey for none."""
    ks = q._keyed
    lease = ks.live.get(key) if ks is not None else None
    if lease is None:
        how = ks.ended.get(key) if ks is not None else None
        if how is not None:
            raise LeaseKeyEnded(key, HOW[how])
        problem = key_problem(key)
        raise BadKey(problem or f"no lease key {key} in queue {q.name}")
    if lease.busy:
        raise UnavailableError(f"lease key {key} is being taken, try again")
    return lease


def find(q: QueueState, key: str) -> KeyedLease | None:
    """The view of live lease ``key``, None for an unknown key; LeaseKeyEnded if ended."""
    ks = q._keyed
    if ks is None or (key not in ks.live and key not in ks.ended):
        return None
    return _live(q, key).view()


def _index(q: QueueState, lease: Lease) -> array[int]:
    index = lease.index
    if index is None:
        index = lease.index = q.log.lease_index(lease.n, lease.count)
    return index


def read_slice(q: QueueState, key: str, start: int, stop: int) -> KeyedSlice:
    """Items ``start .. stop - 1`` of live lease ``key``, read back from its lease file."""
    lease = _live(q, key)
    if not 0 <= start <= stop <= lease.count:
        raise BadKey(f"slice {start}..{stop} past the end of lease key {key} ({lease.count} items)")
    if start == stop:
        return KeyedSlice(
            array("q"), array("i"), array("q"), array("q"), bytearray(), array("q", [0])
        )
    index = _index(q, lease)
    return KeyedSlice(*q.log.lease_columns(lease.n, index[start], index[stop]))


def figures(q: QueueState) -> tuple[int, int, int]:
    """(leases open, items under them, oldest created_at or 0)."""
    ks = q._keyed
    if ks is None or not ks.live:
        return 0, 0, 0
    leases = ks.live.values()
    return len(ks.live), sum(x.count for x in leases), min(x.created_at for x in leases)


# ---- ending -------------------------------------------------------------------------------


def ack(q: QueueState, key: str) -> int:
    """Confirm every item of lease ``key``; 0 when it was acked already."""
    ks = q._keyed
    if ks is not None and ks.ended.get(key) == ACKED:
        return 0
    lease = _live(q, key)
    q.log.key_end(key, ACKED)
    _ended(q, ks, lease, ACKED)
    assert ks is not None
    ks.unlink_after.append((q.log.position(), lease.n))
    return lease.count


def release(q: QueueState, key: str, how: int, serve: Callable[[], None]) -> int:
    """Put every item of lease ``key`` back at its place (by item id) with its delivery
    count (``how``: RELEASED or EXPIRED); 0 when it was released or expired already."""
    ks = q._keyed
    if ks is not None and ks.ended.get(key) in (RELEASED, EXPIRED):
        return 0
    lease = _live(q, key)
    items = _read_items(q, lease)  # before the record: a failed read changes nothing
    q.log.key_end(key, how)
    _ended(q, ks, lease, how)
    assert ks is not None
    ks.awaiting.append(lease.n)
    put_back(q, items)
    serve()
    return lease.count


def _read_items(q: QueueState, lease: Lease) -> list[QItem]:
    if not lease.count:
        return []
    index = _index(q, lease)
    ids, deliveries, add_ms, expiry_ms, data, offsets = q.log.lease_columns(
        lease.n, index[0], index[lease.count]
    )
    out = []
    for i in range(len(ids)):
        item = QItem(ids[i], add_ms[i], expiry_ms[i], bytes(data[offsets[i] : offsets[i + 1]]))
        item.deliveries = deliveries[i]
        out.append(item)
    return out


def put_back(q: QueueState, items: list[QItem]) -> None:
    """Return ``items`` to their places by item id (highest first: mostly ``appendleft``)."""
    for item in reversed(items):
        q._items.put_back(item)
        q.mem_bytes += len(item.data)


def _ended(q: QueueState, ks: KeyedState | None, lease: Lease, how: int) -> None:
    """Lease ``lease`` ended ``how``: remembered, within ``max_lease_keys``."""
    assert ks is not None
    del ks.live[lease.key]
    ks.ended[lease.key] = how
    while ks.ended and len(ks.live) + len(ks.ended) > q.config.max_lease_keys:
        _forget(q, ks, next(iter(ks.ended)))


def renew(q: QueueState, key: str, lease_ms: int, now: int) -> int:
    """Lease ``key`` now runs out ``lease_ms`` from ``now`` (0: the queue's default); the new
    ``expires_at`` (0: never)."""
    lease = _live(q, key)
    lease_ms = lease_ms or q.config.key_lease_ms
    expires_at = now + lease_ms if lease_ms else 0
    q.log.key_renew(key, expires_at)
    lease.expires_at = expires_at
    return expires_at


def expire(q: QueueState, now: int, serve: Callable[[], None]) -> int:
    """Release every lease whose ``expires_at`` has passed (as EXPIRED), and unlink the
    lease files nothing needs any more (:func:`tidy`); the items put back."""
    ks = q._keyed
    if ks is None:
        return 0
    n = 0
    for lease in [x for x in ks.live.values() if x.expires_at and x.expires_at <= now]:
        if not lease.busy:
            n += release(q, lease.key, EXPIRED, serve)
    tidy(q)
    return n


def tidy(q: QueueState) -> None:
    """Unlink the lease files of acked leases whose KEY_END is durable, and of released ones
    a compaction has covered."""
    ks = q._keyed
    if ks is None:
        return
    log = q.log
    while ks.unlink_after and log.durable(ks.unlink_after[0][0], _synced(q)):
        log.lease_remove(ks.unlink_after.pop(0)[1])
    while ks.covering and log.compactions > ks.covering[0][0] and not log.compacting:
        for n in ks.covering.pop(0)[1]:
            log.lease_remove(n)


def compaction_started(q: QueueState, compactions: int) -> None:
    """A compaction began (its count before: ``compactions``): the released leases' files
    are unlinked once it has switched in."""
    ks = q._keyed
    if ks is not None and ks.awaiting:
        ks.covering.append((compactions, ks.awaiting))
        ks.awaiting = []


def closed(q: QueueState) -> None:
    """The log was closed (written and fsynced): the acked leases' files can go."""
    ks = q._keyed
    if ks is not None:
        for _, n in ks.unlink_after:
            q.log.lease_remove(n)
        ks.unlink_after.clear()


def erase(q: QueueState) -> None:
    """The queue is deleted (its log erases the lease files): forget its keys."""
    ks = q._keyed
    owners = q.key_owners
    if ks is not None and owners is not None:
        for key in [*ks.live, *ks.ended]:
            if owners.get(key) == q.name:
                del owners[key]
    q._keyed = None


# ---- replay -------------------------------------------------------------------------------


def replay_take(
    q: QueueState,
    key: str,
    record: Lease,
    *,
    count: int,
    size: int,
    pop: Callable[[], QItem | None] | None,
) -> None:
    """A KEY_TAKE (``pop`` takes a head item off) or KEY_LIVE (``pop`` None) record: its
    fields as ``record``, which becomes the lease if the key is new (or names another file)."""
    ks = state(q)
    lease = ks.live.get(key)
    if lease is None or lease.n != record.n:
        lease = ks.live[key] = record
        lease.index = None
        ks.ended.pop(key, None)
    lease.count += count
    lease.size += size
    lease.expires_at = record.expires_at
    ks.next_n = max(ks.next_n, record.n + 1)
    if pop is not None:
        for _ in range(count):
            pop()


def replay_end(q: QueueState, key: str, how: int, in_snapshot: bool) -> None:
    """A KEY_END record: a live lease ends (released or expired: its items back in place,
    read from its lease file, which is kept); in a snapshot, a key remembered."""
    ks = state(q)
    lease = ks.live.pop(key, None)
    ks.ended.pop(key, None)
    ks.ended[key] = how
    if lease is None or in_snapshot:
        return
    if how != ACKED:
        put_back(q, _read_items(q, lease))
        ks.awaiting.append(lease.n)


def replay_renew(q: QueueState, key: str, expires_at: int) -> None:
    ks = q._keyed
    lease = ks.live.get(key) if ks is not None else None
    if lease is not None:
        lease.expires_at = expires_at


def replay_snapshot(q: QueueState) -> None:
    """A SNAPSHOT record: the keyed state follows it (KEY_LIVE, KEY_END)."""
    ks = q._keyed
    if ks is not None:
        ks.live.clear()
        ks.ended.clear()
        ks.awaiting.clear()


def replay_done(q: QueueState) -> None:
    """The end of replay: unlink the lease files no live lease or pending release needs
    (written by a take that crashed before its record, or by an acked lease), and make the
    ended keys within ``max_lease_keys``."""
    files = q.log.lease_files()
    ks = q._keyed
    if ks is None and not files:
        return
    ks = state(q)
    needed = {x.n for x in ks.live.values()} | set(ks.awaiting)
    for n in files:
        if n not in needed:
            _log.info("queue %s: removing lease file %d, no lease names it", q.name, n)
            q.log.lease_remove(n)
        ks.next_n = max(ks.next_n, n + 1)
    while ks.ended and len(ks.live) + len(ks.ended) > q.config.max_lease_keys:
        _forget(q, ks, next(iter(ks.ended)))
    owners = q.key_owners
    if owners is not None:
        for key in [*ks.live, *ks.ended]:
            owners.setdefault(key, q.name)
    _drop_if_empty(q)
