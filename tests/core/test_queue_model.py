"""PersistentQueue against a plain-list model, with restarts, on both journals.

Hypothesis drives random sequences of adds, removes, open reads, confirms, aborts, peeks,
flushes, expiry sweeps, clock moves and restarts (replay into a new queue object); after every
step the queue must hold exactly what the model holds.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tercel.clock import ManualClock
from tercel.config import UNLIMITED, QueueConfig
from tercel.core.queue import PersistentQueue, QItem
from tercel.errors import ItemTooLarge
from tercel.journal import FileJournal, MemoryJournal

T0 = 1_700_000_000_000


@dataclass
class MItem:
    id: int
    add_time: int
    expiry: int
    data: bytes


@dataclass
class Model:
    """What the queue should hold: a list, a dict of open reads and two counters."""

    cfg: QueueConfig
    items: list[MItem] = field(default_factory=list)
    open: dict[int, MItem] = field(default_factory=dict)
    next_id: int = 1
    xid: int = 0
    expired: list[bytes] = field(default_factory=list)
    discarded: int = 0

    def sweep(self, now: int) -> int:
        n = 0
        while (
            n < self.cfg.max_expire_sweep
            and self.items
            and self.items[0].expiry
            and self.items[0].expiry < now
        ):
            self.expired.append(self.items.pop(0).data)
            n += 1
        return n

    def full(self) -> bool:
        size = sum(len(i.data) for i in self.items)
        return len(self.items) >= self.cfg.max_items or size >= self.cfg.max_size

    def add(self, data: bytes, expiry: int | None, now: int) -> bool:
        self.sweep(now)
        if self.full():
            if not self.cfg.discard_old_when_full:
                return False
            while self.items and self.full():
                self.items.pop(0)
                self.discarded += 1
        if self.cfg.max_age is not None:
            cap = now + self.cfg.max_age
            expiry = cap if not expiry or expiry > cap else expiry
        self.items.append(MItem(self.next_id, now, expiry or 0, data))
        self.next_id += 1
        return True

    def put_back(self, item: MItem) -> None:
        """A returned item goes back to its place by id (not to the head)."""
        at = next((i for i, it in enumerate(self.items) if it.id > item.id), len(self.items))
        self.items.insert(at, item)

    def restart(self) -> None:
        for xid in sorted(self.open):
            self.put_back(self.open.pop(xid))


configs = st.builds(
    QueueConfig,
    max_items=st.sampled_from([UNLIMITED, 3]),
    max_size=st.sampled_from([UNLIMITED, 10]),
    max_item_size=st.sampled_from([UNLIMITED, 6]),
    discard_old_when_full=st.booleans(),
    max_age=st.sampled_from([None, 50]),
    max_expire_sweep=st.sampled_from([UNLIMITED, 1]),
)


class QueueMachine(RuleBasedStateMachine):
    """The model-based test; subclasses choose the journal."""

    kind = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="tercel-model-") if self.kind == "file" else ""
        self.memory = MemoryJournal()
        self.logs: list[FileJournal] = []
        self.clock = ManualClock(T0)
        self.expired: list[bytes] = []
        self.counted = (0, 0)  # (expired, discarded) before the queue object was built

    def _log(self) -> MemoryJournal | FileJournal:
        if self.kind == "memory":
            return self.memory
        log = FileJournal(self.dir, "q")
        self.logs.append(log)
        return log

    def _build(self) -> PersistentQueue:
        q = PersistentQueue("q", self.model.cfg, self._log(), self.clock, self._on_expired)
        q.replay()
        return q

    def _on_expired(self, q: PersistentQueue, item: QItem) -> None:
        self.expired.append(item.data)

    @initialize(cfg=configs)
    def start(self, cfg: QueueConfig) -> None:
        self.model = Model(cfg)
        self.q = self._build()

    # ---- rules --------------------------------------------------------------------------

    @rule(data=st.binary(max_size=8), ttl=st.none() | st.integers(-20, 100))
    def add(self, data: bytes, ttl: int | None) -> None:
        now = self.clock.now_ms()
        expiry = None if ttl is None else now + ttl
        if len(data) > self.model.cfg.max_item_size:
            try:
                self.q.add(data, expiry)
            except ItemTooLarge:
                return
            raise AssertionError("ItemTooLarge expected")
        assert self.q.add(data, expiry) == self.model.add(data, expiry, now)

    @rule()
    def remove(self) -> None:
        self.model.sweep(self.clock.now_ms())
        got = self.q.remove()
        want = self.model.items.pop(0) if self.model.items else None
        assert (got and got.data) == (want and want.data)

    @rule()
    def remove_open(self) -> None:
        self.model.sweep(self.clock.now_ms())
        got = self.q.remove_open()
        if not self.model.items:
            assert got is None
            return
        self.model.xid += 1
        want = self.model.items.pop(0)
        self.model.open[self.model.xid] = want
        assert got is not None
        assert (got[0], got[1].id, got[1].data) == (self.model.xid, want.id, want.data)

    @rule()
    def peek(self) -> None:
        self.model.sweep(self.clock.now_ms())
        got = self.q.peek()
        want = self.model.items[0] if self.model.items else None
        assert (got and got.id) == (want and want.id)

    @precondition(lambda self: self.model.open)
    @rule(pick=st.integers(0, 100))
    def confirm(self, pick: int) -> None:
        xids = sorted(self.model.open)
        xid = xids[pick % len(xids)]
        del self.model.open[xid]
        assert self.q.confirm(xid)

    @precondition(lambda self: self.model.open)
    @rule(pick=st.integers(0, 100))
    def abort(self, pick: int) -> None:
        xids = sorted(self.model.open)
        xid = xids[pick % len(xids)]
        self.model.put_back(self.model.open.pop(xid))
        assert self.q.abort(xid)

    @rule(xid=st.integers(0, 50))
    def unknown_xid(self, xid: int) -> None:
        if xid not in self.model.open:
            assert not self.q.confirm(xid)
            assert not self.q.abort(xid)

    @rule()
    def flush(self) -> None:
        self.model.items.clear()
        self.q.flush()

    @rule()
    def flush_expired(self) -> None:
        assert self.q.flush_expired() == self.model.sweep(self.clock.now_ms())

    @rule(ms=st.integers(0, 60))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule()
    def restart(self) -> None:
        self.q.close()
        self.q = self._build()
        self.model.restart()
        self.counted = (len(self.model.expired), self.model.discarded)  # counters restart

    # ---- checks -------------------------------------------------------------------------

    @invariant()
    def same_state(self) -> None:
        if not hasattr(self, "q"):
            return
        q, m = self.q, self.model
        in_memory = [(i.id, i.add_time, i.expiry, i.data) for i in q.items_in_memory()]
        wanted = [(i.id, i.add_time, i.expiry, i.data) for i in m.items]
        assert in_memory == wanted[: len(in_memory)]  # read-behind keeps only the head
        assert len(q) == len(m.items)
        assert q.bytes == sum(len(i.data) for i in m.items)
        assert {x: i.id for x, i in q.open_items().items()} == {x: i.id for x, i in m.open.items()}
        assert q.open_reads == len(m.open)
        assert self.expired == m.expired
        assert q.expired_items == len(m.expired) - self.counted[0]
        assert q.discarded == m.discarded - self.counted[1]

    def teardown(self) -> None:
        for log in self.logs:
            log.close()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)


class FileQueueMachine(QueueMachine):
    kind = "file"


class PagingQueueMachine(FileQueueMachine):
    """The same model with a tiny memory window and tiny journal limits, so read-behind,
    rotation and compaction (snapshots, RESUME records) happen all the time, restarts
    included. These limits never change what the queue holds, only where it keeps it."""

    def _build(self) -> PersistentQueue:
        cfg = dataclasses.replace(
            self.model.cfg, max_memory_size=12, max_journal_size=64, max_journal_overflow=2
        )
        q = PersistentQueue("q", cfg, self._log(), self.clock, self._on_expired)
        q.replay()
        return q


TestQueueOnMemoryJournal = QueueMachine.TestCase
TestQueueOnMemoryJournal.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None
)
TestQueueOnFileJournal = FileQueueMachine.TestCase
TestQueueOnFileJournal.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
TestQueuePagingOnFileJournal = PagingQueueMachine.TestCase
TestQueuePagingOnFileJournal.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None
)
