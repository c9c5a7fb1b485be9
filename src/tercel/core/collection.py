"""All the queues of a server: creation on first use, fanout, aliases, delete and flush.

The collection is handed an ``open_log(name, config)`` factory and never a path: what a log is
made of is the server's choice. Same threading contract as :mod:`tercel.core.queue`.

Fanout: a queue named ``parent+child`` is registered as a child of ``parent`` when it is
created; every add to ``parent`` goes first to each child (each through its own add rules),
then to the parent, and the result is the parent's. Children inherit the parent's settings;
``fanout_only`` parents store nothing. Aliases: an add to an alias goes to each destination and
succeeds only if every destination took it; reads of an alias are always empty.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tercel.clock import Clock
from tercel.config import QueueConfig, ServerConfig
from tercel.core.log import QueueLog
from tercel.core.queue import PersistentQueue, QItem
from tercel.core.stats import GlobalStats
from tercel.errors import (
    BadKey,
    BadQueueName,
    ItemTooLarge,
    JournalError,
    NoSpaceLeft,
    TooManyOpenFiles,
    TooManyQueues,
)
from tercel.names import fanout_parent, key_problem, valid_name
from tercel.steps import Steps, finish

log = logging.getLogger(__name__)

OpenLog = Callable[[str, QueueConfig], QueueLog]


class QueueCollection:
    """Name -> queue, with the rules in the module docstring."""

    def __init__(self, config: ServerConfig, open_log: OpenLog, clock: Clock) -> None:
        self.config = config
        self._open_log = open_log
        self.clock = clock
        self._queues: dict[str, PersistentQueue] = {}
        self._children: dict[str, dict[str, None]] = {}
        self._plain: dict[str, PersistentQueue] = {}
        """Names whose adds go to exactly their own queue (no alias, no fanout children, not
        ``fanout_only``): :meth:`add`'s fast path. Cleared whenever a queue is created or
        deleted or the configuration changes, and refilled by :meth:`add` as names are used."""
        self.alias_puts: dict[str, list[int]] = {}
        """Alias name -> [items, bytes] written through it (Kestrel's put_items, put_bytes)."""
        self.stats = GlobalStats()
        self._pending: dict[str, None] = {}
        """Queues found on disk and not replayed yet (:meth:`defer`), in replay order."""
        self._pending_children: dict[str, list[str]] = {}
        """Parent name -> its fanout children among :attr:`_pending`."""
        self._pending_order: list[str] = []
        self._next_pending = 0
        """:meth:`replay_next` walks :attr:`_pending_order` from here (names replayed at first
        reference meanwhile are skipped). Not a fresh iteration of :attr:`_pending`: a dict
        iterates past the slots of every key deleted before, so taking its first key each
        time was quadratic (5.7 s of CPU for 100,000 queues)."""
        self._begun: dict[str, _Replay] = {}
        """The queues whose replay :meth:`replay_slice` began (still in :attr:`_pending`)."""
        self._waiters: dict[str, list[Callable[[], None]]] = {}
        """Pending queue -> what to call once it is replayed (:meth:`wait_for`)."""
        self.replaying_in_background = False
        """Set by the owner while it runs :meth:`replay_slice` until no queue is left: a
        command that reaches a pending queue may then wait for it (:meth:`pending_reached`,
        :meth:`pending_any`)."""
        self._lease_keys: dict[str, str] = {}
        """Lease key -> the queue holding it, live or remembered (keys are unique per server;
        each queue fills in its own as it replays, and keeps them up to date)."""
        # One bound method each for every queue, not one per queue (100,000 queues: 14 MB).
        self._on_expired: Callable[[PersistentQueue, QItem], None] = self._expired
        self._on_dead_letter: Callable[[PersistentQueue, QItem], bool] = self._dead_letter

    # ---- lookup and creation --------------------------------------------------------------

    def __iter__(self) -> Iterator[PersistentQueue]:
        """The queues replayed so far (not those :attr:`pending`)."""
        return iter(list(self._queues.values()))

    def __len__(self) -> int:
        """Queues that exist: replayed or :attr:`pending`."""
        return len(self._queues) + len(self._pending)

    @property
    def pending(self) -> int:
        """Queues on disk that are not replayed yet (see :meth:`defer`)."""
        return len(self._pending)

    def queue(self, name: str) -> PersistentQueue | None:
        """The queue called ``name`` if it exists (never creates one; replays it first when
        it is :attr:`pending`)."""
        q = self._queues.get(name)
        if q is None and name in self._pending:
            return self._create(name)
        return q

    def replayed(self, name: str) -> PersistentQueue | None:
        """The queue called ``name`` if it exists and is replayed (never replays one)."""
        return self._queues.get(name)

    def is_pending(self, name: str) -> bool:
        """True when ``name`` is a queue on disk not replayed yet (:attr:`pending`)."""
        return name in self._pending

    def sync_mode(self, name: str) -> int | None:
        """The ``sync_journal`` setting of queue ``name``: None (no fsync while running), 0
        (before every reply) or a period in ms; None for a queue that does not exist."""
        q = self._queues.get(name)
        return None if q is None else q.config.sync_journal

    def for_reading(self, name: str, create: bool = True) -> PersistentQueue | None:
        """The queue a read of ``name`` takes from, created on first reference (with
        ``create`` False: None for a queue that does not exist); None for an alias (reads of
        an alias are always empty). Raises :class:`BadQueueName`."""
        if name in self.config.aliases:
            return None
        if not create:
            q = self.queue(name)
            if q is None and not valid_name(name):
                raise BadQueueName(name)
            return q
        return self.get_or_create(name)

    def is_alias(self, name: str) -> bool:
        """True when ``name`` is an alias (aliases mask queues of the same name)."""
        return name in self.config.aliases

    def get_or_create(self, name: str) -> PersistentQueue:
        """The queue called ``name``, created (and replayed) on first reference."""
        q = self._queues.get(name)
        if q is not None:
            return q
        if not valid_name(name):
            raise BadQueueName(name)
        return self._create(name)

    def _create(self, name: str) -> PersistentQueue:
        """Create and replay queue ``name`` (all of its replay, or the rest of it when the
        background replay began it: :meth:`replay_slice`). Raises :class:`TooManyQueues`
        past ``max_queues`` (except for a queue on disk: every one is loaded),
        :class:`TooManyOpenFiles` when no descriptor is left to open its log, and
        :class:`NoSpaceLeft` when the file system has no room for it."""
        partial = self._begun.pop(name, None)
        if partial is None:
            partial = self._begin(name)
        with _descriptors(name):
            report = finish(partial.steps)
        return self._register(partial.q, report)

    def _begin(self, name: str) -> _Replay:
        """Open queue ``name``'s log and make the queue, its replay not begun (see
        :meth:`_create` for what this raises)."""
        limit = self.config.server.max_queues
        if limit is not None and len(self) >= limit and name not in self._pending:
            raise TooManyQueues()
        cfg = self.config.queue_config(name)
        with _descriptors(name):
            log_ = self._open_log(name, cfg)
        q = PersistentQueue(name, cfg, log_, self.clock, self._on_expired)
        q.on_dead_letter = self._on_dead_letter
        q.key_owners = self._lease_keys
        return _Replay(q, q.replay_steps())

    def _register(self, q: PersistentQueue, report: object) -> PersistentQueue:
        """Make replayed queue ``q`` one of the collection's."""
        name = q.name
        self._queues[name] = q
        self._pending.pop(name, None)
        self._plain.clear()  # a new fanout child changes where its parent's adds go
        self.stats.queue_creates += 1
        self.stats.total_items += q.total_items
        truncations = getattr(report, "truncations", ())
        self.stats.journal_torn_tails += len(truncations)
        parent = fanout_parent(name)
        if parent is not None:
            self._children.setdefault(parent, {})[name] = None
        log.debug("queue %s ready: %d items, %d bytes", name, len(q), q.bytes)
        if self._waiters:
            self._wake(name)
        return q

    def load(self, names: list[str]) -> None:
        """Create (and replay) the queues found on disk at start-up, parents first (all of
        them, even beyond ``max_queues``)."""
        self.defer(names)
        while self.replay_next() is not None:
            pass

    def defer(self, names: list[str]) -> None:
        """Note the queues found on disk at start-up without replaying them: each replays
        at its first reference (by a command, an alias, a fanout parent's add) or by
        :meth:`replay_next`, whichever comes first. Until then it counts in ``len()`` and
        ``max_queues`` but is not iterated (stats list the queues replayed so far)."""
        for name in sorted(names, key=lambda n: (n.count("+"), n)):  # parents first
            if name in self._queues or name in self._pending or not valid_name(name):
                continue
            self._pending[name] = None
            self._pending_order.append(name)
            parent = fanout_parent(name)
            if parent is not None:
                self._pending_children.setdefault(parent, []).append(name)

    def replay_next(self) -> str | None:
        """Replay the next :attr:`pending` queue (parents before their fanout children), or
        the rest of one :meth:`replay_slice` began; its name, or None when none is left.
        Raises what its replay raises (the queue stays pending)."""
        if self._begun:
            return self._create(next(iter(self._begun))).name
        name = self._next_name()
        if name is not None:
            self._create(name)  # if this raises, the name is the next one again
            self._next_pending += 1
        return name

    def replay_slice(self, now: Callable[[], float], until: float) -> str | None:
        """Go on with the background replay until ``now()`` reaches ``until`` (checked
        after each step, about a MiB of one queue's log) or a queue is ready: the name of the
        queue made ready, ``""`` when the time ran out in the middle of a queue (which
        stays :attr:`pending`, half replayed, until a later call or its first reference
        finishes it), None when no queue is left. Raises what a replay raises (the queue
        stays pending, its replay to be begun again).

        Which queue: one that commands wait for (:meth:`wait_for`; one not begun before
        those half replayed, else in the order they asked), else one begun before, else the
        next in replay order. So one queue's replay, however long, never holds the caller
        for more than about one step past ``until``, nor the commands waiting for another
        queue for longer than that queue's replay (and a slice of the long one)."""
        name = self._wanted_name()
        if name is None and self._begun:
            name = next(iter(self._begun))
        if name is None:
            name = self._next_name()
            if name is None:
                return None
        partial = self._begun.get(name)
        if partial is None:
            partial = self._begun[name] = self._begin(name)
        steps = partial.steps
        try:
            while True:
                next(steps)
                if now() >= until:
                    return ""
        except StopIteration as stop:
            del self._begun[name]
            return self._register(partial.q, stop.value).name
        except BaseException as exc:
            del self._begun[name]
            if isinstance(exc, OSError):
                _check_descriptors(name, exc)
            raise

    def _wanted_name(self) -> str | None:
        """A queue commands wait for that is still pending, or None: the first asked for
        whose replay has not begun, else the first asked for. So a small queue asked for is
        replayed in the next slice even while commands wait for a long one half replayed
        (which goes on after it), instead of waiting for the rest of that one."""
        first = None
        for name in self._waiters:
            if name in self._pending:
                if name not in self._begun:
                    return name
                if first is None:
                    first = name
        return first

    # ---- waiting for a queue's replay -----------------------------------------------------

    def pending_reached(self, name: str) -> str | None:
        """While :attr:`replaying_in_background`: a :attr:`pending` queue that a command on
        ``name`` may reach, to wait for (:meth:`wait_for`) instead of replaying it on the
        caller's time; None when it reaches none (or when no background replay runs: then a
        first reference replays the queue). Reached: ``name`` itself; for an alias, each
        destination as an add reaches it; for a fanout parent, its pending children (an add
        replays them first); the ``expire_to_queue`` and ``dead_letter_queue`` of ``name``
        (its reads and expiries add there). Waiting for one at a time is enough: the caller
        asks again once that one is ready."""
        if not self.replaying_in_background:
            return None
        if name in self._pending:
            return name
        reached = self._pending_route(name)
        if reached is not None:
            return reached
        q = self._queues.get(name)
        cfg = self.config.queue_config(name) if q is None else q.config
        for target in (cfg.expire_to_queue, cfg.dead_letter_queue):
            if target is not None and target != name:
                reached = self._pending_route(target)
                if reached is not None:
                    return reached
        return None

    def pending_any(self) -> str | None:
        """While :attr:`replaying_in_background`: a :attr:`pending` queue (the one being
        replayed, else the next), for a command on every queue (``flush_all``) to wait for,
        one after another; None when none is left or no background replay runs."""
        if not self.replaying_in_background:
            return None
        if self._begun:
            return next(iter(self._begun))
        return self._next_name()

    def _pending_route(self, name: str) -> str | None:
        """A pending queue an add to ``name`` reaches (itself, an alias's destinations, a
        fanout parent's children), or None. Forgets a parent's children once none is pending
        (they are then ordinary children, :meth:`children`)."""
        pending = self._pending
        if name in pending:
            return name
        dests = self.config.aliases.get(name)
        if dests is not None:  # (aliases have no cycles: the config refuses them)
            for dest in dests:
                reached = self._pending_route(dest)
                if reached is not None:
                    return reached
            return None
        children = self._pending_children.get(name)
        if children:
            for child in children:
                if child in pending:
                    return child
            del self._pending_children[name]
        return None

    def wait_for(self, name: str, ready: Callable[[], None]) -> None:
        """Call ``ready()`` once pending queue ``name`` is replayed (or the background replay
        ends: :meth:`stop_background`); :meth:`replay_slice` works on it first meanwhile.
        ``ready`` runs inside the collection: it must only schedule work, not use it."""
        self._waiters.setdefault(name, []).append(ready)

    def stop_background(self) -> None:
        """The background replay is over (done, stopped): every command still waiting is
        told to go on (it replays its queue itself, as a first reference)."""
        self.replaying_in_background = False
        for name in list(self._waiters):
            self._wake(name)

    def _wake(self, name: str) -> None:
        for ready in self._waiters.pop(name, ()):
            try:
                ready()
            except Exception:
                log.exception("waking a command that waited for queue %s failed", name)

    def _next_name(self) -> str | None:
        """The next pending name in replay order (:attr:`_next_pending` points at it), or
        None when none is left."""
        order = self._pending_order
        while self._next_pending < len(order):
            name = order[self._next_pending]
            if name in self._pending:
                return name
            self._next_pending += 1
        order.clear()
        self._next_pending = 0
        return None

    def half_built(self) -> dict[str, PersistentQueue]:
        """The queues whose replay :meth:`replay_slice` began and has not finished (for
        their figures so far only)."""
        return {name: partial.q for name, partial in self._begun.items()}

    def pending_names(self) -> list[str]:
        """The names of the :attr:`pending` queues."""
        return list(self._pending)

    def _replay_children(self, name: str) -> None:
        """Replay the pending fanout children of ``name`` (before an add to ``name`` is
        routed, so that no child misses it)."""
        children = self._pending_children.pop(name, None)
        if children:
            for child in children:
                if child in self._pending:
                    self._create(child)

    def children(self, name: str) -> list[str]:
        """Names of the fanout children registered under ``name``."""
        return list(self._children.get(name, ()))

    # ---- writes ---------------------------------------------------------------------------

    def add(
        self, name: str, data: bytes, expiry: int | None, now: int, maintain: bool = True
    ) -> bool:
        """Add an item to a queue or alias (with fanout); see the module docstring.
        ``maintain`` False: no log maintenance (one item of a batch; :meth:`Queue.add`).

        Raises :class:`BadQueueName`, :class:`~tercel.errors.ItemTooLarge`, or a journal error.
        """
        q = self._plain.get(name)
        if q is None:
            return self._add_routed(name, data, expiry, now, maintain)
        if q.add(data, expiry, now, maintain):
            self.stats.total_items += 1
            return True
        return False

    def _add_routed(
        self, name: str, data: bytes, expiry: int | None, now: int, maintain: bool
    ) -> bool:
        if self._pending_children:
            self._replay_children(name)
        dests = self.config.aliases.get(name)
        if dests is not None:
            puts = self.alias_puts.setdefault(name, [0, 0])
            puts[0] += 1
            puts[1] += len(data)
            ok = True
            for dest in dests:
                ok = self._add_quietly(dest, data, expiry, now, maintain) and ok
            return ok
        q = self._queues.get(name)
        if q is None:
            q = self.get_or_create(name)
        children = self._children.get(name)
        if children:
            # A child that is full or has a smaller max_item_size just misses the item.
            for child in list(children):
                self._add_quietly(child, data, expiry, now, maintain)
        elif not q.config.fanout_only:
            self._plain[name] = q
        if q.config.fanout_only and "+" not in name:
            return True
        if q.add(data, expiry, now, maintain):
            self.stats.total_items += 1
            return True
        return False

    def add_keyed(
        self,
        name: str,
        key: str,
        data: bytes,
        expiry: int | None,
        now: int,
        *,
        maintain: bool = True,
    ) -> int:
        """Add an item with a dedup key (:meth:`PersistentQueue.add_keyed`): the new item's id,
        ``-id`` of the item an earlier put with ``key`` stored within the window (nothing
        stored), or 0 when the queue refused it (full). Fanout children get the item too (each
        by its own add rules, without the key: the parent's key decides). The key is checked
        here (:func:`tercel.names.key_problem`).

        Raises :class:`BadKey` (a bad key; an alias or a ``fanout_only`` queue, which keep no
        items to name), :class:`BadQueueName`, :class:`~tercel.errors.ItemTooLarge`,
        :class:`~tercel.errors.TooManyKeys`, or a journal error."""
        why = key_problem(key)
        if why is not None:
            raise BadKey(why)
        q = self._plain.get(name)  # no alias, no fanout children, not fanout_only
        if q is not None:
            got = q.add_keyed(key, data, expiry, now, maintain)
            if got > 0:
                self.stats.total_items += 1
            return got
        if name in self.config.aliases:
            raise BadKey(f"alias {name} keeps no dedup keys: put with a key to a queue")
        if self._pending_children:
            self._replay_children(name)
        q = self._queues.get(name)
        if q is None:
            q = self.get_or_create(name)
        if q.config.fanout_only and "+" not in name:
            raise BadKey(f"queue {name} is fanout_only and keeps no dedup keys")
        children = self._children.get(name)
        if not children and not q.config.fanout_only:
            self._plain[name] = q  # as add's routing: the next put goes straight to it
        got = q.add_keyed(key, data, expiry, now, maintain)
        if got > 0:
            self.stats.total_items += 1
            for child in list(children or ()):
                self._add_quietly(child, data, expiry, now, maintain)
        return got

    def _add_quietly(
        self, name: str, data: bytes, expiry: int | None, now: int, maintain: bool
    ) -> bool:
        """:meth:`add` for one destination of an alias or fanout: too large is False."""
        try:
            return self.add(name, data, expiry, now, maintain)
        except ItemTooLarge:
            return False

    def _expired(self, q: PersistentQueue, item: QItem) -> None:
        target = q.config.expire_to_queue
        if target is not None and target != q.name:
            try:
                self.add(target, item.data, None, self.clock.now_ms())
            except Exception:
                log.exception("could not move an expired item from %s to %s", q.name, target)

    def _dead_letter(self, q: PersistentQueue, item: QItem) -> bool:
        """Move ``item`` to ``q``'s dead-letter queue (or drop it when there is none); False
        when that queue refuses it (full, item too large, not creatable, journal failed):
        the item then stays in ``q`` and is handed out again, never lost."""
        target = q.config.dead_letter_queue
        if target is None or target == q.name:
            log.warning("dropping an item of %s delivered %d times", q.name, item.deliveries)
            return True
        try:
            if self.add(target, item.data, item.expiry or None, self.clock.now_ms()):
                return True
            reason = "it is full"
        except Exception as exc:  # any failure: the item must not be lost
            reason = str(exc) or type(exc).__name__
        log.warning(
            "dead-letter queue %s refused an item of %s (%s): it stays and is handed out again",
            target,
            q.name,
            reason,
        )
        return False

    def delete(self, name: str) -> bool:
        """Delete a queue and its journal; its fanout registration ends too. An alias (or
        the queue an alias masks) is left alone, as in Kestrel."""
        if self.is_alias(name) or self.queue(name) is None:  # (replayed first when pending)
            return False
        q = self._queues.pop(name)
        self._plain.clear()
        q.erase()
        parent = fanout_parent(name)
        if parent is not None and parent in self._children:
            self._children[parent].pop(name, None)
        self.stats.queue_deletes += 1
        return True

    def flush(self, name: str) -> None:
        """Drop every item of ``name`` that is not open (no-op for a missing queue or an
        alias)."""
        if self.is_alias(name):
            return
        q = self.queue(name)
        if q is not None:
            q.flush()

    def flush_all(self) -> None:
        """Flush every queue (replaying the pending ones first)."""
        while self.replay_next() is not None:
            pass
        for q in self:
            q.flush()

    def flush_expired(self, name: str) -> int:
        """Expire what is due in ``name`` now; the count."""
        q = self.queue(name)
        return 0 if q is None else q.flush_expired()

    def flush_all_expired(self) -> int:
        """Expire what is due in every queue; the total count.

        The same pass gives each queue's log its maintenance (:meth:`Queue.maintain_log`):
        a queue checks its log every few operations, and a check that came while a
        compaction was still running is otherwise not made again until the queue is used.
        It also releases the keyed leases that ran out (:meth:`expire_keyed`; their items
        are not counted here).
        """
        now = self.clock.now_ms()
        total = 0
        for q in self:
            try:
                total += q.flush_expired(now)
                if q.has_keys:
                    q.expire_keyed(now)
                q.maintain_log()
            except JournalError as exc:  # that queue's journal failed; the others go on
                log.error("expiry of %s stopped: %s", q.name, exc)
        return total

    def delete_expired_queues(self, now: int | None = None) -> list[str]:
        """Delete every queue with ``max_queue_age`` that is older than that and idle: no
        items, no open reads and no blocked readers (Kestrel also deletes a queue holding
        open reads, losing them; tercel waits until they end). Returns the names deleted.
        """
        if now is None:
            now = self.clock.now_ms()
        gone = []
        for q in self:
            age = q.config.max_queue_age
            idle = not (len(q) or q.open_reads or q.waiters or q.keyed_figures()[0])
            if age and now > q.create_time + age and idle and self.delete(q.name):
                self.stats.queue_expires += 1
                gone.append(q.name)
        return gone

    # ---- keyed leases ---------------------------------------------------------------------

    def lease_key_queue(self, key: str) -> str | None:
        """The queue that holds lease key ``key`` (live or remembered), or None. Queues not
        replayed yet (:attr:`pending`) are not known until they are."""
        return self._lease_keys.get(key)

    def expire_keyed(self, now: int) -> int:
        """Release the keyed leases that ran out in every queue (``expires_at`` <= ``now``,
        wall-clock ms); the items put back. The server's sweep calls it."""
        total = 0
        for q in [q for q in self._queues.values() if q.has_keys]:
            if q.has_keys:
                try:
                    total += q.expire_keyed(now)
                except JournalError as exc:  # that queue's journal failed; the others go on
                    log.error("keyed lease expiry of %s stopped: %s", q.name, exc)
        return total

    # ---- configuration and shutdown -------------------------------------------------------

    def reload(self, config: ServerConfig) -> None:
        """Apply a new configuration's queue settings and aliases to every live queue (and
        to those half replayed)."""
        self.config = config
        self._plain.clear()
        for q in [*self, *self.half_built().values()]:
            q.reconfigure(config.queue_config(q.name))

    def close(self) -> None:
        """Close every queue's log (after which nothing may be written); a log that fails
        to close is logged and the others are still closed. A queue half replayed is left
        as it is on disk (its replay wrote nothing)."""
        begun, self._begun = self._begun, {}
        for partial in begun.values():
            partial.steps.close()
        for q in self:
            try:
                q.close()
            except (JournalError, OSError) as exc:
                log.error("closing the journal of %s failed: %s", q.name, exc)

    @property
    def total_bytes(self) -> int:
        """Payload bytes in every queue."""
        return sum(q.bytes for q in self._queues.values())

    @property
    def total_length(self) -> int:
        """Items in every queue."""
        return sum(len(q) for q in self._queues.values())


class _Replay:
    """A queue being made and the rest of its replay (:meth:`QueueCollection.replay_slice`)."""

    __slots__ = ("q", "steps")

    def __init__(self, q: PersistentQueue, steps: Steps[object]) -> None:
        self.q = q
        self.steps = steps


@contextmanager
def _descriptors(name: str) -> Iterator[None]:
    """Turn running out of file descriptors or of disk space while opening or replaying
    queue ``name``'s log into :class:`TooManyOpenFiles` or :class:`NoSpaceLeft`."""
    try:
        yield
    except OSError as exc:
        _check_descriptors(name, exc)
        raise


def _check_descriptors(name: str, exc: OSError) -> None:
    """Raise :class:`TooManyOpenFiles` if ``exc`` (raised making queue ``name``) is running
    out of file descriptors, :class:`NoSpaceLeft` if it is a full file system (or quota)."""
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        log.warning("queue %s not created: %s", name, exc.strerror)
        raise TooManyOpenFiles() from exc
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        log.warning("queue %s not created: %s", name, exc.strerror)
        raise NoSpaceLeft() from exc
