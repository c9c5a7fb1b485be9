"""The storage seam: the one place where the core meets the journal, and the data dir's lock.

Three things open a data directory — the server (``tercel.server.app``), the in-process
:class:`tercel.PersistentQueue` (``tercel.embedded``) and the journal tools (``tercel journal
compact``/``salvage``) — and all three come through here:

- :class:`DataDirLock` is the data dir's one lock, ``<data dir>/.lock`` (``flock``, exclusive,
  never waited for). Whoever holds it is the only writer of every journal in the directory.
  Two ``PersistentQueue`` objects of one process on one directory share the process's hold
  (they open different queues; the same queue twice is refused); any other holder — a server,
  a tool, another process — is refused with :class:`~tercel.errors.ConfigError`.
- :func:`open_log` gives a queue its journal (a :class:`~tercel.journal.FileJournal`, or a null
  journal for ``journal = false``) and :func:`open_queue` a core queue over it; the core sees
  only the ``QueueLog`` protocol (``core/log.py``).

Before this seam the three took different locks (``.lock`` and ``.<queue>.lock``), so a server
and a ``PersistentQueue`` could write one journal at once and lose acknowledged items
(issue 21).
"""

from __future__ import annotations

import fcntl
import os
import resource
from collections.abc import Callable

from tercel.clock import Clock
from tercel.config import QueueConfig
from tercel.core.log import QueueLog
from tercel.core.queue import PersistentQueue
from tercel.errors import ConfigError
from tercel.journal import FileJournal, NullJournal, list_queue_names
from tercel.journal.files import DataDir, auto_max_open, raise_open_files_limit
from tercel.journal.journal import run_inline

__all__ = [
    "LOCK_FILE",
    "DataDir",
    "DataDirLock",
    "FileJournal",
    "auto_max_connections",
    "auto_max_open",
    "list_queue_names",
    "open_log",
    "open_queue",
    "raise_open_files_limit",
    "run_inline",
]

RESERVED_DESCRIPTORS = 64
"""Descriptors client connections never take: the listeners, admin HTTP connections, the data
dir, log and status files, snapshot and job-log files, the loop's own (``max_connections``)."""


def auto_max_connections(soft_limit: int, journals: int) -> int | None:
    """The most client connections (every front end but the admin port's) the open-file
    limit ``soft_limit`` leaves room for beside ``journals`` pooled journal descriptors and
    :data:`RESERVED_DESCRIPTORS`: so idle connections can never take the descriptors the
    admin port and the journals need. At least 16; None for an unlimited limit."""
    if soft_limit < 0 or soft_limit == resource.RLIM_INFINITY:
        return None
    return max(16, soft_limit - journals - RESERVED_DESCRIPTORS)


LOCK_FILE = ".lock"
"""The data dir's lock file (kept; only its ``flock`` matters)."""

Background = Callable[[Callable[[], None], Callable[[BaseException | None], None]], None]
"""Runs journal work (snapshot writing) off the loop: ``(work, done)``."""


class DataDirLock:
    """A hold on a data dir's one lock (see the module docstring). Release with
    :meth:`release` (idempotent)."""

    _shared: dict[str, tuple[int, set[str]]] = {}
    """Per real path, the fd and queue names of this process's embedded queues' shared hold."""

    def __init__(self, data_dir: str, fd: int, queue: str | None) -> None:
        self.data_dir = data_dir
        self._fd = fd
        self._queue = queue

    @classmethod
    def exclusive(cls, data_dir: str) -> DataDirLock:
        """The whole directory for this caller alone (a server, a journal tool). Raises
        ConfigError when anything else holds it, in this process or another."""
        return cls(data_dir, _flock(data_dir), None)

    @classmethod
    def for_queue(cls, data_dir: str, name: str) -> DataDirLock:
        """Queue ``name`` of the directory for an embedded queue: shares this process's hold
        with its other embedded queues. Raises ConfigError when a server, a tool or another
        process holds the directory, or ``name`` is already open here."""
        key = os.path.realpath(data_dir)
        held = cls._shared.get(key)
        if held is None:
            held = cls._shared[key] = (_flock(data_dir), set())
        if name in held[1]:
            raise ConfigError(f"queue {name} in {data_dir} is already open")
        held[1].add(name)
        return cls(data_dir, held[0], name)

    def release(self) -> None:
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        if self._queue is None:
            os.close(fd)
            return
        key = os.path.realpath(self.data_dir)
        held = self._shared.get(key)
        if held is None:  # pragma: no cover - released twice through two objects
            return
        held[1].discard(self._queue)
        if not held[1]:
            del self._shared[key]
            os.close(held[0])


def _flock(data_dir: str) -> int:
    fd = os.open(os.path.join(data_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise ConfigError(
            f"data dir {data_dir} is in use by another tercel (a server, a tool or an "
            "embedded queue)"
        ) from None
    return fd


def open_log(
    data_dir: str,
    name: str,
    config: QueueConfig,
    *,
    on_dirty: Callable[[FileJournal], None] | None = None,
    background: Background | None = None,
    directory: DataDir | None = None,
) -> QueueLog:
    """Queue ``name``'s journal in ``data_dir`` (a null one for ``journal = false``).

    ``on_dirty`` makes writes buffered until the caller's group commit (the server);
    without it the journal writes through (the embedded queue, the tools). ``directory`` is
    the data dir's shared listing and descriptor pool (the server's; one of its own without)."""
    if not config.journal:
        return NullJournal()
    return FileJournal(
        data_dir, name, on_dirty=on_dirty, background=background, directory=directory
    )


def open_queue(data_dir: str, name: str, config: QueueConfig, clock: Clock) -> PersistentQueue:
    """A core queue over its write-through journal, not yet replayed (the caller holds the
    data dir's lock)."""
    return PersistentQueue(name, config, open_log(data_dir, name, config), clock)
