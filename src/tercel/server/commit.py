"""Group commit: journal bytes reach the OS before any reply that depends on them leaves.

How a loop pass goes. Handlers append records to journal buffers; the first append to a
clean journal registers it here (``journal_dirty``), and a connection that has replies while
any journal is dirty hands them here (``hold``) instead of writing them. One callback, queued
with ``call_soon`` by the first registration, then runs at the start of the next pass, before
any new I/O callback: it writes every dirty journal with one ``write`` each, and only then
sends the held replies. So ``STORED`` always follows the record's ``write``, and 32
connections in one pass cost one write, not 32 (Redis's ``aof_buf``/``beforeSleep``).

Queues with ``sync_journal = true`` add a step: their replies wait for an ``fdatasync`` run in a
worker thread, one at a time for everything written so far (group commit proper); while one
runs, the next group gathers. A connection whose earlier replies wait for a sync has all its
later replies queued behind them, so replies never overtake each other. Queues with
``sync_journal = "<period>"`` are fsynced by a timer at most once per period while writes are
pending, without holding replies (Kestrel's PeriodicSyncStorage).

If a write or fsync fails, the connections whose replies depended on it are closed without
those replies: nothing is acknowledged that is not in the journal.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from tercel.errors import JournalWriteError
from tercel.journal import FileJournal

log = logging.getLogger(__name__)


class Holder(Protocol):
    """A connection whose replies the committer may hold."""

    sync_waits: int

    def release(self, data: bytes) -> None:
        """Write ``data`` now (it no longer depends on unwritten journal bytes)."""
        ...

    def fail(self) -> None:
        """Close without sending held replies: what they acknowledge is not journaled."""
        ...


SyncPolicy = Callable[[FileJournal], int | None]
"""The ``sync_journal`` setting of a journal's queue: None, 0 (every reply) or a period ms."""


def _sync_all(journals: list[FileJournal]) -> None:
    for j in journals:
        j.sync()


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
        self._sync_next: dict[FileJournal, None] = {}
        self._sync_waiting: list[tuple[Holder, bytes]] = []
        self._sync_running = False
        self._periodic: dict[FileJournal, asyncio.TimerHandle] = {}
        self.fsyncs = 0
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
        """Write every dirty journal, then release or park the held replies."""
        self._scheduled = False
        dirty, self.dirty = self.dirty, []
        held, self._held = self._held, []
        failed = False
        for journal in dirty:
            try:
                journal.write_out()
            except JournalWriteError:
                failed = True
                self.write_errors += 1
                continue
            mode = self._policy(journal)
            if mode == 0:
                self._sync_next[journal] = None
            elif mode is not None and journal not in self._periodic:
                self._periodic[journal] = self._loop.call_later(
                    mode / 1000, self._periodic_sync, journal
                )
        if failed:
            for conn, _ in held:
                conn.fail()
            return
        wait_for_sync = bool(self._sync_next)
        for conn, data in held:
            if wait_for_sync or conn.sync_waits:
                conn.sync_waits += 1
                self._sync_waiting.append((conn, data))
            else:
                conn.release(data)
        self._start_sync()

    def _start_sync(self) -> None:
        if self._sync_running:
            return
        if not self._sync_next:
            # Replies parked only to keep their order behind earlier synced ones.
            waiting, self._sync_waiting = self._sync_waiting, []
            for conn, data in waiting:
                conn.sync_waits -= 1
                conn.release(data)
            return
        journals = list(self._sync_next)
        self._sync_next.clear()
        waiting, self._sync_waiting = self._sync_waiting, []
        for j in journals:
            j.syncing = True
        self._sync_running = True
        fut = self._executor.submit(_sync_all, journals)
        fut.add_done_callback(
            lambda f: self._loop.call_soon_threadsafe(self._synced, f, journals, waiting)
        )

    def _synced(
        self, fut: Future[None], journals: list[FileJournal], waiting: list[tuple[Holder, bytes]]
    ) -> None:
        self._sync_running = False
        self.fsyncs += 1
        for j in journals:
            j.sync_done()
        exc = fut.exception()
        for conn, data in waiting:
            conn.sync_waits -= 1
            if exc is None:
                conn.release(data)
            else:
                conn.fail()
        if exc is not None:
            self.write_errors += 1
            log.error("journal fsync failed: %s", exc)
        self._start_sync()

    def _periodic_sync(self, journal: FileJournal) -> None:
        del self._periodic[journal]
        if not journal.needs_sync or journal.syncing:
            return
        journal.syncing = True

        def done(f: Future[None]) -> None:
            self._loop.call_soon_threadsafe(journal.sync_done)
            if f.exception() is not None:
                log.error("periodic fsync of %s failed: %s", journal.path, f.exception())

        self._executor.submit(journal.sync).add_done_callback(done)

    @property
    def busy(self) -> bool:
        """True while an fsync runs or replies wait for one."""
        return self._sync_running or bool(self._sync_waiting) or bool(self._held)

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
