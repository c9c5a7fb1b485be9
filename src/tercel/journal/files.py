"""The files of one data directory as the journals see them: one listing, a bounded pool of
descriptors, and every file operation behind one small object.

**One listing.** :class:`DataDir` lists the directory once, the first time anyone asks, and
keeps what it found per queue name. A journal takes its own entry when it replays
(:meth:`DataDir.take`) and from then on knows its files itself, so a start with *n* queues
lists the directory once, not *n* times, and a queue created at run time lists nothing (its
entry is empty: the data dir is locked, nobody else adds files to it).

**A bounded pool of descriptors.** A journal holds a descriptor only between a use and its
eviction: every holder (the file a journal appends to, a read-behind reader) calls
:meth:`DataDir.use` when it uses its descriptor, and when more than ``max_open`` are held the
least recently used holder that can let go is asked to :meth:`~Holder.park` (close it; it
reopens by path on its next use). An open that fails with EMFILE or ENFILE evicts a holder and
tries again; with nothing left to evict it gives up the one descriptor kept in reserve, so an
append can still reach its file while connections use every other descriptor.

**The seam.** Every call the journal makes to the OS about its files (open, pwrite(v),
fdatasync, ftruncate, rename, unlink, ...) goes through one :class:`FileOps` object, by
default :data:`OS_FILES` (the plain ``os`` functions). Tests and the soak run swap in
:class:`tercel.journal.faults.FaultyFiles` to make a disk fill up, an fsync fail, the
descriptors run out or the disk slow down, without touching production code paths.

Threading: the pool is used on the owner's (the event loop's) thread only.
"""

from __future__ import annotations

import errno
import os
import resource
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from os import close as _close
from os import fdatasync as _fdatasync
from os import fsync as _fsync
from os import ftruncate as _ftruncate
from os import open as _open
from os import pread as _pread
from os import pwrite as _pwrite
from os import pwritev as _pwritev
from typing import Final, Protocol, TypeVar

from mypy_extensions import mypyc_attr

from tercel.names import valid_name

T = TypeVar("T")

OUT_OF_DESCRIPTORS: Final = frozenset({errno.EMFILE, errno.ENFILE})
"""The errnos of a process (EMFILE) or the system (ENFILE) out of file descriptors."""


@mypyc_attr(allow_interpreted_subclasses=True)
class FileOps:
    """The file operations of the journal (the fault-injection seam; see the module
    docstring), and the real thing: each method is the ``os`` function of the same name
    (``scandir`` returns the names of the regular files only), raising :class:`OSError` as it
    would.

    A compiled class, not a Protocol: the committer's ``pwritev`` on every write pass is then a
    native call (through a Protocol it was a generic Python call, ~2.2k instructions per
    pass under callgrind with the lookup of ``os.pwritev``). A fault-injecting stand-in
    subclasses it (``journal/faults.py``); interpreted subclasses work through mypyc's glue.
    """

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        return _open(path, flags, mode)

    def close(self, fd: int) -> None:
        _close(fd)

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> int:
        return _pwrite(fd, data, offset)

    def pwritev(self, fd: int, buffers: Sequence[bytes], offset: int) -> int:
        return _pwritev(fd, buffers, offset)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return _pread(fd, size, offset)

    def fdatasync(self, fd: int) -> None:
        _fdatasync(fd)

    def fsync(self, fd: int) -> None:
        _fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        _ftruncate(fd, size)

    def fstat_size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def scandir(self, path: str) -> list[str]:
        with os.scandir(path) as entries:
            return [e.name for e in entries if e.is_file()]


OsFiles = FileOps
"""The real file operations (the base class itself)."""

OS_FILES: Final = OsFiles()

_default_ops: list[FileOps] = [OS_FILES]


def default_ops() -> FileOps:
    """The :class:`FileOps` a :class:`DataDir` uses when it is given none."""
    return _default_ops[0]


def set_default_ops(ops: FileOps) -> FileOps:
    """Make ``ops`` the default of every :class:`DataDir` created from now on (a test or a
    fault-injecting launcher, before the server starts); returns the previous default."""
    previous = _default_ops[0]
    _default_ops[0] = ops
    return previous


class Holder(Protocol):
    """Something that keeps a descriptor in a :class:`DataDir`'s pool."""

    def park(self) -> bool:
        """Close the descriptor now (reopen by path on the next use); False if it cannot
        let go at the moment (an fsync in a worker thread uses it)."""
        ...


@dataclass(slots=True)
class QueueFiles:
    """One queue's files as the listing found them."""

    older: list[int] = field(default_factory=list)
    """Sequence numbers of ``<name>.<seq>``, ascending."""
    current: bool = False
    """``<name>`` exists."""
    temps: list[str] = field(default_factory=list)
    """Names of ``<name>~~<anything>`` (left over from a compaction)."""
    leases: list[int] = field(default_factory=list)
    """Numbers of the lease files ``<name>.key.<n>`` (keyed leases)."""


def scan_dir(names: list[str]) -> dict[str, QueueFiles]:
    """Group directory entries by queue name (see :mod:`tercel.journal.journal` for the
    naming rules); entries that belong to no valid queue name are left out."""
    out: dict[str, QueueFiles] = {}
    for entry in names:
        base, sep, _ = entry.partition("~~")
        if sep:
            if valid_name(base):
                out.setdefault(base, QueueFiles()).temps.append(entry)
            continue
        base, dot, suffix = entry.partition(".")
        if not valid_name(base):
            continue
        if not dot:
            out.setdefault(base, QueueFiles()).current = True
        elif suffix.isdigit():
            out.setdefault(base, QueueFiles()).older.append(int(suffix))
        elif suffix.startswith("key.") and suffix[4:].isdigit():
            out.setdefault(base, QueueFiles()).leases.append(int(suffix[4:]))
    for files in out.values():
        files.older.sort()
    return out


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (best effort); return the soft and
    hard limits in force afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError):
            pass
    return soft, hard


def auto_max_open(soft_limit: int) -> int:
    """The default size of the descriptor pool: a quarter of the open-file limit, between 16
    and 4096 (the rest is for connections, replay and the admin port)."""
    return max(16, min(4096, soft_limit // 4))


class DataDir:
    """One data directory: the listing, the descriptor pool and the file operations (see the
    module docstring). ``max_open`` 0 leaves the pool unbounded (one queue in-process)."""

    def __init__(self, path: str, *, max_open: int = 0, ops: FileOps | None = None) -> None:
        self.path = path
        self.ops: FileOps = ops if ops is not None else default_ops()
        self.max_open = max_open
        self._listing: dict[str, QueueFiles] | None = None
        self._held: dict[Holder, None] = {}
        self._reserve = -1
        self._dir_fd = -1  # the directory's own descriptor, kept once opened (sync)
        self.evictions = 0
        """Descriptors closed to keep within ``max_open`` or to free one for an open."""
        self.reopens = 0
        """Descriptors opened again by a holder the pool had parked (counted by the holder:
        :meth:`reopened`)."""
        self.out_of_descriptors = 0
        """Opens that failed with EMFILE or ENFILE (each then evicts and tries again)."""
        self.refusals = 0
        """Opens given up with EMFILE or ENFILE: nothing left to evict, no reserve left."""
        self.put_off = 0
        """Rotations and compactions of the journals in this directory put off for want of a
        descriptor for their new file (counted by the journals; each is tried again later)."""
        self.listings = 0
        """Times the directory was listed (once per start)."""
        if max_open:
            self._take_reserve()
            try:  # a server's: opened while descriptors are plentiful, kept
                self._dir_fd = self.ops.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                self._dir_fd = -1  # opened by the first sync instead

    # ---- the listing ----------------------------------------------------------------------

    def _list(self) -> dict[str, QueueFiles]:
        if self._listing is None:
            self._listing = scan_dir(self.ops.scandir(self.path))
            self.listings += 1
        return self._listing

    def queue_names(self) -> list[str]:
        """Names of the queues with journal files (a current or an older file), sorted."""
        return sorted(n for n, f in self._list().items() if f.current or f.older)

    def remove_orphans(self) -> int:
        """Unlink the temporary files (``<name>~~...``) of names that have no journal file:
        a deleted queue's files, renamed for a worker to unlink, that a crash left behind (a
        queue's replay removes its own temporaries; a deleted queue is never replayed).
        Returns how many were removed. For the data dir's owner only (a server at start)."""
        removed = 0
        for name, files in self._list().items():
            if files.current or files.older:
                continue
            files.temps += [f"{name}.key.{n}" for n in files.leases]  # (no queue: no lease)
            files.leases.clear()
            for entry in files.temps:
                try:
                    self.ops.unlink(os.path.join(self.path, entry))
                except FileNotFoundError:
                    continue
                removed += 1
            files.temps.clear()
        return removed

    def take(self, name: str) -> QueueFiles:
        """``name``'s files as listed, handed over to its journal (which keeps track of them
        from now on): a second call for the same name returns no files."""
        return self._list().pop(name, None) or QueueFiles()

    def give_back(self, name: str, files: QueueFiles) -> None:
        """Hand ``name``'s files (as they are now) back after a replay that did not finish,
        so that the next :meth:`take` for ``name`` finds them."""
        self._list()[name] = files

    # ---- descriptors ----------------------------------------------------------------------

    @property
    def held(self) -> int:
        """Descriptors held by the pool's holders now."""
        return len(self._held)

    def use(self, holder: Holder) -> None:
        """``holder`` is using its descriptor (opened it, or is about to use it): it becomes
        the most recently used, and the least recently used beyond ``max_open`` are parked."""
        if not self.max_open:
            return
        held = self._held
        if held.pop(holder, 0) is not None:  # new: room may have to be made
            held[holder] = None
            if len(held) > self.max_open:
                self._evict(holder)
            if self._reserve < 0:
                self._take_reserve()
            return
        held[holder] = None

    def reopened(self) -> None:
        """A holder parked by the pool is opening its file again (the ``reopens`` stat)."""
        self.reopens += 1

    def stats(self) -> dict[str, int]:
        """The pool's figures (the ``journal_files_*`` stats, docs/operations.md): ``open``
        (held now) and ``limit`` (``max_open``, 0: unbounded) are levels; ``evictions``,
        ``reopens``, ``emfile`` (opens that failed with EMFILE/ENFILE), ``refused`` (such
        opens given up) and ``put_off`` (rotations and compactions put off) count since the
        start."""
        return {
            "open": len(self._held),
            "limit": self.max_open,
            "evictions": self.evictions,
            "reopens": self.reopens,
            "emfile": self.out_of_descriptors,
            "refused": self.refusals,
            "put_off": self.put_off,
        }

    def forget(self, holder: Holder) -> None:
        """``holder`` closed its descriptor."""
        self._held.pop(holder, None)

    def _evict(self, keep: Holder | None) -> bool:
        """Park the least recently used holder other than ``keep``; False if none would."""
        for holder in self._held:
            if holder is not keep and holder.park():
                break
        else:
            return False
        self._held.pop(holder, None)
        self.evictions += 1
        return True

    def _take_reserve(self) -> None:
        try:
            self._reserve = self.ops.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._reserve = -1

    def retrying(self, fn: Callable[[], T], keep: Holder | None = None) -> T:
        """Call ``fn`` (which opens a descriptor); when it fails with EMFILE or ENFILE, free
        one of the pool's descriptors (not ``keep``'s), or the reserve, and try again."""
        while True:
            try:
                return fn()
            except OSError as exc:
                if exc.errno not in OUT_OF_DESCRIPTORS:
                    raise
                self.out_of_descriptors += 1
                if self._evict(keep):
                    continue
                if self._reserve < 0:
                    self.refusals += 1
                    raise
                self.ops.close(self._reserve)
                self._reserve = -1

    def open(self, path: str, flags: int, keep: Holder | None = None) -> int:
        """``ops.open(path, flags | O_CLOEXEC, 0o644)``, :meth:`retrying` on EMFILE/ENFILE."""
        flags |= os.O_CLOEXEC
        return self.retrying(lambda: self.ops.open(path, flags, 0o644), keep)

    def sync(self) -> None:
        """fsync the directory itself, so that creates, renames and unlinks in it are
        durable. Its descriptor is opened once (through :meth:`retrying`: EMFILE evicts a
        pooled file) and kept, so that a sync that makes a new file's name durable never
        fails for want of a descriptor: before, one that did failed its journal for good
        (``bench/soak.py --emfile``)."""
        if self._dir_fd < 0:
            self._dir_fd = self.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        self.ops.fsync(self._dir_fd)

    def close(self) -> None:
        """Give back the reserve descriptor and the directory's (the holders close their
        own)."""
        if self._reserve >= 0:
            self.ops.close(self._reserve)
            self._reserve = -1
        if self._dir_fd >= 0:
            self.ops.close(self._dir_fd)
            self._dir_fd = -1
