"""Group commit: journal bytes reach the OS before any reply that depends on them leaves.

How a loop pass goes. Handlers append records to journal buffers; the first append to a clean
journal registers it here (``journal_dirty``), and a connection that has replies while any
journal is dirty, or while a group fsync runs (``holding``), hands them here (``hold``) instead
of writing them. One callback, queued with ``call_soon`` by the first registration, then runs
at the start of the next pass, before any new I/O callback: it writes every dirty journal with
one ``write`` each, and only then sends the held replies. So ``STORED`` always follows the
record's ``write``, and 32 connections in one pass cost one write, not 32 (Redis's
``aof_buf``/``beforeSleep``). One exception, the same steps run earlier: when the server has
a single connection, its read drained the socket and the pass has no group fsync to run,
nothing else can join the pass, so it runs at the end of that read's batch instead of as a
loop callback (:meth:`end_batch`).

Queues with ``sync_journal = true`` add a step: the replies wait for a *group fsync*, one
``fdatasync`` per such journal written since the last group. A group that wrote
:data:`AIO_MIN_GROUP` bytes or more is submitted to the kernel through Linux native AIO
(:mod:`tercel.server.aio`) and the loop goes on serving: the passes that run meanwhile leave
their records in the journal buffers and hold their replies; when the fsync completes, its
replies go out, and those records are written and form the next group. So the disk's time
overlaps the parsing of the next requests (Redis's ``appendfsync always`` blocks its loop in
``beforeSleep`` instead). The kernel runs an AIO fsync in a worker bound to the CPU that
submitted it, which is the loop's own; a loop kept busy by those next requests held that worker
off until the scheduler tick (~4 ms on the benchmark machine, for an fsync of ~0.3 ms), so
every pass that runs while a group is being synced ends with ``sched_yield()``
(``bench/fsync_ahead.py``, modes ``aio-busy`` and ``aio-yield``, rerun from commit 1f1f505:
docs/benchmarks.md, "Investigations"). A smaller group, and every
group where AIO is missing, is fsynced on the loop, after the pass's writes and before its
replies: small groups come from unpipelined clients, whose next requests then pile up and are
read in one pass, where an overlapped fsync would wake the loop once per request (measured: a
fifth more CPU per op). An fsync in a *worker thread* was measured slower than both (the GIL
hand-off back to the loop; docs/benchmarks.md). Either way every reply held while a group is
being synced waits for the group after it, so a connection's replies never overtake each other.

Queues with ``sync_journal = "<period>"`` are fsynced by a timer at most once per period while
writes are pending, in a worker thread, without holding replies (Kestrel's
PeriodicSyncStorage).

If a write or fsync fails, the connections whose replies depended on it are closed without
those replies: nothing is acknowledged that is not in the journal.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from mypy_extensions import mypyc_attr

from tercel.errors import JournalWriteError
from tercel.journal.append import AppendLog
from tercel.server.aio import Aio, open_aio
from tercel.server.metrics import LogHistogram


@mypyc_attr(allow_interpreted_subclasses=True)
class Holder:
    """A connection whose replies the committer may hold: the base of every front end's
    connection (:class:`tercel.server.connection.Connection`). A compiled class, not a
    Protocol, so that the committer's calls are native ones (a Protocol-typed call from
    compiled code is a generic Python call); interpreted subclasses (test stand-ins) work
    too, through mypyc's glue."""

    def release(self, data: bytes) -> None:
        """Write ``data`` now (it no longer depends on unwritten journal bytes)."""
        raise NotImplementedError

    def fail(self) -> None:
        """Close without sending held replies: what they acknowledge is not journaled."""
        raise NotImplementedError


SyncPolicy = Callable[[str], int | None]
"""The ``sync_journal`` setting of the queue a journal (by name) belongs to: None, 0 (every
reply) or a period in ms. Called once per written journal per loop pass, so the server passes
a compiled method (``QueueCollection.sync_mode``), not an interpreted one."""


AIO_MIN_GROUP = 64 * 1024
"""The bytes a group must have written to be synced through AIO; smaller ones sync on the loop.
A small group comes from unpipelined clients: while its fsync ran on the loop, their next
requests pile up and one pass reads them all, where an overlapped fsync would let the loop wake
once per arriving request (measured: mixed load at depth 1, +20 % CPU per op through AIO)."""


def _sync_all(journals: list[AppendLog]) -> JournalWriteError | None:
    """fdatasync each journal; the first failure (the journal logged it) or None."""
    for journal in journals:
        try:
            journal.sync()
        except JournalWriteError as exc:
            return exc
    return None


_Group = tuple[list[AppendLog], list[tuple[Holder, bytes]], JournalWriteError | None]
"""The group fsync running through AIO: its journals (the AIO tag is the index), the replies
waiting for it, and the first failure."""


class Committer:
    """Owner of every journal's writes (see the module docstring)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        policy: SyncPolicy,
        aio_min_group: int = AIO_MIN_GROUP,
        aio: Callable[[], Aio | None] = open_aio,
    ) -> None:
        """``aio`` opens the AIO context when the first big group comes (None: no AIO); a
        test hands one whose completions report a failing disk (the fault seam's AIO half)."""
        self._loop = loop
        self._open_aio_context = aio
        self._aio_min_group = aio_min_group
        self._policy = policy
        self._fixed: dict[str, int | None] = {}
        """Sync modes of journals that are no queue's (the job log), by journal name."""
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tercel-fsync")
        self.dirty: list[AppendLog] = []
        """Journals with buffered records this pass (appended to by :meth:`journal_dirty`)."""
        self._held: list[tuple[Holder, bytes]] = []
        self._to_sync: dict[AppendLog, None] = {}
        self._group_bytes = 0  # written to the journals in _to_sync
        self._waiting: list[tuple[Holder, bytes]] = []
        self.syncing = False
        """True while a group fsync runs (through AIO): every reply waits behind it."""
        self._group: _Group = ([], [], None)
        self._aio: Aio | None = None
        self._aio_tried = False  # opened for the first big group: no sync queue, no context
        self._scheduled = False
        self._batches = 0  # connections' batches running (begin_batch .. end_batch): 0 or 1
        self._batch_pass = False  # a pass was asked for while a batch ran
        self._periodic: dict[AppendLog, asyncio.TimerHandle] = {}
        self.fsyncs = 0
        """Group fsyncs run for ``sync_journal = true`` (one per pass that wrote such a journal)."""
        self.fsync_waits = 0
        """Reply writes released after a group fsync (one per connection per pass):
        ``fsync_waits / fsyncs`` is the mean number of connections served by one fsync."""
        self.aio_fsyncs = 0
        """Of ``fsyncs``, the groups synced through native AIO (the rest ran on the loop)."""
        self.write_errors = 0
        self.fsync_latency = LogHistogram()
        """Microseconds per fsync that succeeded: a group's (on the loop or through AIO, from
        its start to its last completion) and each periodic one (on the worker thread)."""
        self._group_started = 0  # perf_counter_ns() when the AIO group was submitted
        # Made once, not per pass: the loop callback (no arguments to parse) and call_soon.
        self._pass_cb: Callable[[], None] = self._pass
        self._call_soon: Callable[[Callable[[], None]], object] = loop.call_soon

    def set_sync_mode(self, name: str, mode: int | None) -> None:
        """Give the journal ``name``, which belongs to no queue (the beanstalkd job log), its
        own ``sync_journal`` mode instead of asking the policy (choose a name no queue can
        have: ``names.py``)."""
        self._fixed[name] = mode

    @property
    def holding(self) -> bool:
        """True when a reply written now could overtake a record: records are buffered this
        pass, or a group fsync runs. A connection then hands its replies to :meth:`hold`."""
        return bool(self.dirty) or self.syncing

    @property
    def busy(self) -> bool:
        """True while records are buffered, replies held, or a group fsync runs."""
        return bool(self.dirty or self._held or self._waiting or self.syncing or self._scheduled)

    def journal_dirty(self, journal: AppendLog) -> None:
        """Called by a journal when its buffer goes from empty to not empty. A journal the
        next group fsync will cover is marked :attr:`~AppendLog.sync_due` now: if its pool
        parks the file before the pass, the park writes and syncs it first, and the group
        needs no reopen (which could find no descriptor)."""
        self.dirty.append(journal)
        if self._mode(journal) == 0:
            journal.sync_due = True
        if not self._scheduled:
            self._want_pass()

    def _mode(self, journal: AppendLog) -> int | None:
        """``journal``'s ``sync_journal`` mode: its own (:meth:`set_sync_mode`) or the policy's."""
        fixed = self._fixed
        if fixed and journal.name in fixed:
            return fixed[journal.name]
        return self._policy(journal.name)

    def hold(self, conn: Holder, data: bytes) -> None:
        """Keep ``data`` until what it acknowledges is written (and synced if configured)."""
        self._held.append((conn, data))
        if not self._scheduled:
            self._want_pass()

    def _want_pass(self) -> None:
        """A pass is needed: queued for the next loop pass, or, while a connection's batch
        runs, decided when it ends (:meth:`end_batch`)."""
        if self._batches:
            self._batch_pass = True
            return
        self._scheduled = True
        self._call_soon(self._pass_cb)

    def _sync_due(self) -> bool:
        """True when a dirty journal is one the next group fsync covers (``sync_journal =
        true``: :meth:`journal_dirty` marks it ``sync_due``)."""
        return any(journal.sync_due for journal in self.dirty)

    def begin_batch(self) -> None:
        """A connection starts running the commands it read (``Connection.data_received``)."""
        self._batches += 1

    def end_batch(self, solo: bool) -> None:
        """The batch begun last is done and its replies handed over (:meth:`hold`). If it
        asked for a pass: with ``solo`` (the server has this one connection, and its read
        drained the socket: ``Connection.data_received``, so no other request can join the
        pass) and no group fsync to run (no ``sync_journal = true`` journal written in the
        batch, none running or waiting), the pass runs now, inline, which saves the loop
        callback an unpipelined request costs otherwise (``call_soon`` and its idle handle:
        2.8k of a beanstalkd put's 21k instructions); else it is queued, so that the
        requests of every connection read in this loop pass share one write and one group
        fsync. (A pass with a group fsync stays a loop callback: inline, the c=1 durable p99
        measured 603-714 us against 513-559 queued, for no gain in CPU per op.)"""
        self._batches -= 1
        if self._batches or not self._batch_pass:
            return
        self._batch_pass = False
        if self._scheduled:
            return
        if solo and not self._waiting and not self.syncing and not self._sync_due():
            self.run()
        else:
            self._scheduled = True
            self._call_soon(self._pass_cb)

    def _pass(self) -> None:
        """The callback queued for the next loop pass."""
        self.run(False)

    def run(self, inline: bool = False) -> None:
        """Write every dirty journal; the replies held wait for the next group fsync of the
        ``sync_journal = true`` ones among them, or go out now if there is none to run."""
        self._scheduled = False
        if self.syncing:  # what this pass wrote waits in the buffers for the next group
            self._waiting += self._held
            self._held = []
            os.sched_yield()  # the fsync's kernel worker shares our CPU: see the module docstring
            return
        dirty, self.dirty = self.dirty, []
        held, self._held = self._held, []
        failed = False
        for journal in dirty:
            try:
                size = journal.write_out()
            except JournalWriteError:
                failed = True
                self.write_errors += 1
                continue
            if journal.failed:  # a write earlier in this pass failed (a rotation, a reader
                failed = True  # writing the buffer out): it took records replies wait for
                self.write_errors += 1
                continue
            mode = self._mode(journal)
            if mode is None:  # (tested first: a compiled int compare below, not a generic one)
                continue
            if mode == 0:
                self._to_sync[journal] = None
                journal.sync_due = True  # again if a park synced it: a park syncs it first
                self._group_bytes += size
            elif journal not in self._periodic:
                self._periodic[journal] = self._loop.call_later(
                    mode / 1000, self._periodic_sync, journal, mode
                )
        if failed:  # also the replies that waited behind a group: their records were here
            waiting, self._waiting = self._waiting, []
            for conn, _ in waiting + held:
                conn.fail()
            return
        if not self._waiting and not self._to_sync:  # the common pass: nothing to sync
            for conn, data in held:
                conn.release(data)
            return
        self._waiting += held
        self._start_group(inline)

    def _start_group(self, inline: bool = False) -> None:
        """fsync the journals written since the last group, then release the replies that
        waited for them: through AIO when the group is big enough and AIO is there, unless
        ``inline`` (:meth:`flush_now`); otherwise on the loop, now."""
        waiting, self._waiting = self._waiting, []
        if not self._to_sync:
            for conn, data in waiting:
                conn.release(data)
            return
        journals = list(self._to_sync)
        self._to_sync.clear()
        big = self._group_bytes >= self._aio_min_group
        self._group_bytes = 0
        aio = self._open_aio() if big and not inline else None
        started = time.perf_counter_ns()
        if aio is None:
            failed = _sync_all(journals)
            if failed is None:
                self.fsync_latency.add((time.perf_counter_ns() - started) // 1000)
            self._finish(waiting, failed)
            return
        error: JournalWriteError | None = None
        submitted: list[AppendLog] = []
        for journal in journals:
            try:
                fd = journal.begin_sync()
            except JournalWriteError as exc:  # its file could not be reopened
                error = error or exc
                continue
            if fd < 0:
                continue
            try:
                aio.fdatasync(fd, len(submitted))
            except OSError:  # refused (say, too many in flight): this one on the loop
                error = error or _sync_all([journal])
            else:
                submitted.append(journal)
        if not submitted:
            self._finish(waiting, error)
            return
        self.syncing = True
        self._group = (submitted, waiting, error)
        self._group_started = started

    def _open_aio(self) -> Aio | None:
        """The AIO context, opened on first use; None where AIO is not available."""
        if not self._aio_tried:
            self._aio_tried = True
            self._aio = self._open_aio_context()
            if self._aio is not None:
                self._loop.add_reader(self._aio.eventfd, self._aio_done)
        return self._aio

    def _aio_done(self) -> None:
        """The eventfd of the AIO context is readable: collect what completed."""
        assert self._aio is not None
        self._collect(self._aio.reap())

    def _collect(self, results: list[tuple[int, int]], inline: bool = False) -> None:
        """Take the completions of the group's fsyncs; once all are in, release the group
        and start the next one (``inline``: synced on the loop, for :meth:`flush_now`)."""
        if not self.syncing:
            return  # a late eventfd signal for a group already collected
        journals, group, error = self._group
        for tag, res in results:
            if res < 0:
                try:
                    journals[tag].sync_failed(OSError(-res, os.strerror(-res)))
                except JournalWriteError as exc:  # the journal logged it, refuses writes
                    error = error or exc
        self._group = (journals, group, error)
        assert self._aio is not None
        if self._aio.in_flight:
            return
        self.syncing = False
        self._group = ([], [], None)
        if error is None:
            self.aio_fsyncs += 1
            self.fsync_latency.add((time.perf_counter_ns() - self._group_started) // 1000)
        self._finish(group, error)
        self.run(inline)  # write what the passes since buffered, and start their group

    def _finish(self, group: list[tuple[Holder, bytes]], exc: BaseException | None) -> None:
        if exc is not None:
            self.write_errors += 1
            for conn, _ in group:
                conn.fail()
            return
        self.fsyncs += 1
        self.fsync_waits += len(group)
        for conn, data in group:
            conn.release(data)

    def _periodic_sync(self, journal: AppendLog, mode: int) -> None:
        """The period of ``journal`` (``mode`` ms) ran out: fdatasync it on the worker. If a
        sync of it is already running (a rotation's), try again one period later: what was
        written after that sync began must not wait for the next write to arm a timer."""
        del self._periodic[journal]
        if not journal.needs_sync:
            return
        if journal.syncing:
            self._periodic[journal] = self._loop.call_later(
                mode / 1000, self._periodic_sync, journal, mode
            )
            return
        journal.syncing = True
        started = time.perf_counter_ns()

        def done(f: Future[None]) -> None:  # on the worker thread
            took = (time.perf_counter_ns() - started) // 1000
            self._loop.call_soon_threadsafe(self._periodic_done, journal, f.exception(), took)

        self._executor.submit(journal.sync).add_done_callback(done)

    def _periodic_done(self, journal: AppendLog, exc: BaseException | None, took: int) -> None:
        journal.sync_done()
        if exc is not None:  # the journal logged it and refuses writes from now on
            self.write_errors += 1
        else:
            self.fsync_latency.add(took)

    def periodic_timer(self, journal: AppendLog) -> asyncio.TimerHandle | None:
        """The timer of ``journal``'s next periodic sync (``sync_journal = "<period>"``), or
        None while none is armed: a read-only view, for inspection."""
        return self._periodic.get(journal)

    def flush_now(self) -> None:
        """Write and sync everything buffered, before returning (start-up, shutdown): every
        held reply is released or failed."""
        if self.syncing:  # wait for it, then write and sync what came after, on the loop
            assert self._aio is not None
            self._collect(self._aio.wait_all(), inline=True)
        else:
            self.run(inline=True)

    def close(self) -> None:
        """Stop the timers, the fsync thread and AIO (after :meth:`flush_now` and after the
        journals were closed)."""
        for handle in self._periodic.values():
            handle.cancel()
        self._periodic.clear()
        self._executor.shutdown(wait=True)
        self._aio_tried = True  # never open one after this
        if self._aio is not None:
            self._loop.remove_reader(self._aio.eventfd)
            self._aio.close()
            self._aio = None
