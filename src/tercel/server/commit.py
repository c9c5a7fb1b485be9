"""Group commit: journal bytes reach the OS before any reply that depends on them leaves.

How a loop pass goes. Handlers append records to journal buffers; the first append to a
clean journal registers it here (``journal_dirty``), and a connection that has replies while
any journal is dirty hands them here (``hold``) instead of writing them. One callback, queued
with ``call_soon`` by the first registration, then runs at the start of the next pass, before
any new I/O callback: it writes every dirty journal with one ``write`` each, and only then
sends the held replies. So ``STORED`` always follows the record's ``write``, and 32
connections in one pass cost one write, not 32 (Redis's ``aof_buf``/``beforeSleep``).

Queues with ``sync_journal = true`` add a step: after the writes, the same callback runs one
``fdatasync`` per such journal, on the loop, and only then releases the replies (group commit,
as Redis's ``appendfsync always`` does in ``beforeSleep``). While the fsync blocks the loop,
clients' next requests pile up in their sockets and the next pass reads them all: they form
the next group. An fsync in a worker thread was measured slower on every count (see
docs/benchmarks.md): the GIL hand-off back to the loop and a loop pass per arriving request
cost more than the parallelism won, and groups came out smaller. Every reply held in a pass
waits for that pass's fsync, so replies never overtake each other. Queues with
``sync_journal = "<period>"`` are fsynced by a timer at most once per period while writes are
pending, in a worker thread, without holding replies (Kestrel's PeriodicSyncStorage).

If a write or fsync fails, the connections whose replies depended on it are closed without
those replies: nothing is acknowledged that is not in the journal.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from tercel.errors import JournalWriteError
from tercel.journal import FileJournal


class Holder(Protocol):
    """A connection whose replies the committer may hold."""

    def release(self, data: bytes) -> None:
        """Write ``data`` now (it no longer depends on unwritten journal bytes)."""
        ...

    def fail(self) -> None:
        """Close without sending held replies: what they acknowledge is not journaled."""
        ...


SyncPolicy = Callable[[str], int | None]
"""The ``sync_journal`` setting of the queue a journal (by name) belongs to: None, 0 (every
reply) or a period in ms. Called once per written journal per loop pass, so the server passes
a compiled method (``QueueCollection.sync_mode``), not an interpreted one."""


class Committer:
    """Owner of every journal's writes (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, policy: SyncPolicy) -> None:
        self._loop = loop
        self._policy = policy
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tercel-fsync")
        self.dirty: list[FileJournal] = []
        """Journals with buffered records this pass (read by connections; only we change it)."""
        self._held: list[tuple[Holder, bytes]] = []
        self._scheduled = False
        self._periodic: dict[FileJournal, asyncio.TimerHandle] = {}
        self.fsyncs = 0
        """Group fsyncs run for ``sync_journal = true`` (one per pass that wrote such a journal)."""
        self.fsync_waits = 0
        """Reply writes released after a group fsync (one per connection per pass):
        ``fsync_waits / fsyncs`` is the mean number of connections served by one fsync."""
        self.write_errors = 0

    def journal_dirty(self, journal: FileJournal) -> None:
        """Called by a journal when its buffer goes from empty to not empty."""
        self.dirty.append(journal)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.run)

    def hold(self, conn: Holder, data: bytes) -> None:
        """Keep ``data`` until what it acknowledges is written (and synced if configured)."""
        self._held.append((conn, data))
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.run)

    def run(self) -> None:
        """Write every dirty journal, fsync the ``sync_journal = true`` ones, release replies."""
        self._scheduled = False
        dirty, self.dirty = self.dirty, []
        held, self._held = self._held, []
        failed = False
        to_sync: list[FileJournal] = []
        for journal in dirty:
            try:
                journal.write_out()
            except JournalWriteError:
                failed = True
                self.write_errors += 1
                continue
            mode = self._policy(journal.name)
            if mode == 0:
                to_sync.append(journal)
            elif mode is not None and journal not in self._periodic:
                self._periodic[journal] = self._loop.call_later(
                    mode / 1000, self._periodic_sync, journal
                )
        if to_sync and not failed:
            try:
                for journal in to_sync:
                    journal.sync()
            except JournalWriteError:  # logged by the journal, which now refuses writes
                failed = True
                self.write_errors += 1
            else:
                self.fsyncs += 1
                self.fsync_waits += len(held)
        if failed:
            for conn, _ in held:
                conn.fail()
            return
        for conn, data in held:
            conn.release(data)

    def _periodic_sync(self, journal: FileJournal) -> None:
        del self._periodic[journal]
        if not journal.needs_sync or journal.syncing:
            return
        journal.syncing = True

        def done(f: Future[None]) -> None:  # on the worker thread
            self._loop.call_soon_threadsafe(self._periodic_done, journal, f.exception())

        self._executor.submit(journal.sync).add_done_callback(done)

    def _periodic_done(self, journal: FileJournal, exc: BaseException | None) -> None:
        journal.sync_done()
        if exc is not None:  # the journal logged it and refuses writes from now on
            self.write_errors += 1

    def flush_now(self) -> None:
        """Write everything buffered (shutdown); held replies are released or failed."""
        if self.dirty or self._held:
            self.run()

    def close(self) -> None:
        """Stop the timers and the fsync thread (after the journals were closed)."""
        for handle in self._periodic.values():
            handle.cancel()
        self._periodic.clear()
        self._executor.shutdown(wait=True)
