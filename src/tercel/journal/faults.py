"""Fault injection through the journal's file seam (:class:`~tercel.journal.files.FileOps`).

:class:`FaultyFiles` wraps the real operations and, by rules a test sets, makes some of them
fail with an errno (a full disk: ENOSPC on ``pwritev``; a failing disk: EIO on ``fdatasync``;
no descriptors: EMFILE on ``open``), take longer (a slow disk), or end the process as a crash
would (``os._exit(99)``, no cleanup) just before or just after they run. Production code
never tests for a fault: it only calls its ``FileOps``.

Use it in-process by handing it to a :class:`~tercel.journal.files.DataDir` (``ops=``), or
for every data dir created afterwards with :func:`~tercel.journal.files.set_default_ops`
(a test's subprocess, or the soak's server launcher, before the server starts)::

    faults = FaultyFiles()
    faults.fail("pwritev", errno.ENOSPC, path="orders")       # every write to orders' files
    faults.fail("fdatasync", errno.EIO, times=1)              # the next fsync only
    faults.fail("open", errno.EMFILE, skip=3, times=2)        # the 4th and 5th open
    faults.slow("fdatasync", 0.05)                            # 50 ms per fsync
    faults.crash("rename", path="~~", after=True)             # die right after a snapshot rename

Rules match an operation name (a :class:`FileOps` method) and optionally a substring of the
path (for the descriptor operations, the path the descriptor was opened with). ``skip`` lets
that many matching calls through first; ``times`` (None: forever) bounds how often the rule
fires; ``armed_by=(op, path)`` keeps the rule asleep until such a call has completed, and
``disarmed_by=(op, path)`` ends it once such a call has completed (a client can lift a fault
from outside a server process by making that call happen: creating a queue of that name). The
compaction crash windows the journals document are :data:`COMPACTION_CRASHES` (queue
journals) and :data:`JOB_COMPACTION_CRASHES` (the beanstalkd job log).

A subclass may watch every call by overriding :meth:`FaultyFiles.run` (the one method every
operation goes through). This module is public, part of tercel's testing API with
:mod:`tercel.testing`, which re-exports it (docs/testing.md): users' own tests may use it.

Thread-safe enough for the journal's worker threads (a lock around the rule bookkeeping).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from tercel.journal.files import FileOps, default_ops

__all__ = [
    "COMPACTION_CRASHES",
    "CRASH_EXIT",
    "JOB_COMPACTION_CRASHES",
    "KEYED_CRASHES",
    "PAGE",
    "TAILS",
    "Crashes",
    "FaultyFiles",
    "PowerLossFiles",
    "Rule",
    "power_loss",
]

T = TypeVar("T")

CRASH_EXIT = 99
"""The exit status of a crash rule."""


@dataclass(slots=True)
class Rule:
    """One fault: see the module docstring."""

    op: str
    path: str | None = None
    error: int | None = None
    delay: float = 0.0
    crash: str | None = None  # "before" or "after" the call
    skip: int = 0
    times: int | None = None
    armed_by: tuple[str, str | None] | None = None
    disarmed_by: tuple[str, str | None] | None = None
    fired: int = 0

    def matches(self, op: str, path: str) -> bool:
        return op == self.op and (self.path is None or self.path in path)


class FaultyFiles(FileOps):
    """A :class:`FileOps` that injects the faults its rules describe (module docstring)."""

    def __init__(self, inner: FileOps | None = None) -> None:
        self.inner = inner if inner is not None else default_ops()
        self.rules: list[Rule] = []
        self.calls: Counter[str] = Counter()
        """Calls per operation name, faulty or not."""
        self._paths: dict[int, str] = {}
        self._lock = threading.Lock()

    # ---- rules ----------------------------------------------------------------------------

    def fail(
        self,
        op: str,
        error: int,
        *,
        path: str | None = None,
        skip: int = 0,
        times: int | None = None,
        armed_by: tuple[str, str | None] | None = None,
        disarmed_by: tuple[str, str | None] | None = None,
    ) -> Rule:
        """Make ``op`` raise ``OSError(error)`` (without doing anything)."""
        return self._add(
            Rule(
                op,
                path,
                error=error,
                skip=skip,
                times=times,
                armed_by=armed_by,
                disarmed_by=disarmed_by,
            )
        )

    def slow(self, op: str, seconds: float, *, path: str | None = None) -> Rule:
        """Make ``op`` sleep ``seconds`` before it runs (a slow disk)."""
        return self._add(Rule(op, path, delay=seconds))

    def crash(
        self,
        op: str,
        *,
        path: str | None = None,
        after: bool = False,
        skip: int = 0,
        armed_by: tuple[str, str | None] | None = None,
    ) -> Rule:
        """End the process (``os._exit(99)``) just before ``op`` runs, or just after."""
        crash = "after" if after else "before"
        return self._add(Rule(op, path, crash=crash, skip=skip, times=1, armed_by=armed_by))

    def _add(self, rule: Rule) -> Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        """Drop every rule: from now on every call goes through."""
        with self._lock:
            self.rules.clear()

    # ---- the machinery --------------------------------------------------------------------

    def _before(self, op: str, path: str) -> Rule | None:
        """Count the call; apply the first rule that fires before it; return a rule that
        wants to crash after it."""
        with self._lock:
            self.calls[op] += 1
            fired: Rule | None = None
            for rule in self.rules:
                if rule.armed_by is not None or not rule.matches(op, path):
                    continue
                if rule.skip:
                    rule.skip -= 1
                    continue
                if rule.times is not None and rule.fired >= rule.times:
                    continue
                rule.fired += 1
                fired = rule
                break
        if fired is None:
            return None
        if fired.delay:
            time.sleep(fired.delay)
        if fired.crash == "before":
            os._exit(CRASH_EXIT)
        if fired.error is not None:
            raise OSError(fired.error, os.strerror(fired.error), path)
        return fired if fired.crash == "after" else None

    def _after(self, op: str, path: str, rule: Rule | None) -> None:
        with self._lock:
            for r in self.rules:
                arm = r.armed_by
                if arm is not None and arm[0] == op and (arm[1] is None or arm[1] in path):
                    r.armed_by = None
                off = r.disarmed_by
                if off is not None and off[0] == op and (off[1] is None or off[1] in path):
                    r.times = r.fired  # fires no more
        if rule is not None:
            os._exit(CRASH_EXIT)

    def run(self, op: str, path: str, call: Callable[[], T]) -> T:
        """Every operation goes through here: apply the rules to ``op`` on ``path``, then
        ``call()`` (the real operation). A subclass may override it to watch the calls (and
        must call this one)."""
        rule = self._before(op, path)
        result = call()
        self._after(op, path, rule)
        return result

    def _fd_path(self, fd: int) -> str:
        return self._paths.get(fd, "")

    # ---- FileOps --------------------------------------------------------------------------

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        fd = self.run("open", path, lambda: self.inner.open(path, flags, mode))
        self._paths[fd] = path
        return fd

    def close(self, fd: int) -> None:
        path = self._paths.pop(fd, "")
        self.run("close", path, lambda: self.inner.close(fd))

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> int:
        return self.run("pwrite", self._fd_path(fd), lambda: self.inner.pwrite(fd, data, offset))

    def pwritev(self, fd: int, buffers: Sequence[bytes], offset: int) -> int:
        path = self._fd_path(fd)
        return self.run("pwritev", path, lambda: self.inner.pwritev(fd, buffers, offset))

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return self.run("pread", self._fd_path(fd), lambda: self.inner.pread(fd, size, offset))

    def fdatasync(self, fd: int) -> None:
        self.run("fdatasync", self._fd_path(fd), lambda: self.inner.fdatasync(fd))

    def fsync(self, fd: int) -> None:
        self.run("fsync", self._fd_path(fd), lambda: self.inner.fsync(fd))

    def ftruncate(self, fd: int, size: int) -> None:
        self.run("ftruncate", self._fd_path(fd), lambda: self.inner.ftruncate(fd, size))

    def fstat_size(self, fd: int) -> int:
        return self.run("fstat_size", self._fd_path(fd), lambda: self.inner.fstat_size(fd))

    def rename(self, src: str, dst: str) -> None:
        self.run("rename", src, lambda: self.inner.rename(src, dst))

    def unlink(self, path: str) -> None:
        self.run("unlink", path, lambda: self.inner.unlink(path))

    def scandir(self, path: str) -> list[str]:
        return self.run("scandir", path, lambda: self.inner.scandir(path))


Crashes = dict[str, Callable[[FaultyFiles], None]]


def _compaction_crashes(marker: str, prefix: str) -> Crashes:
    """The four crash windows of a compaction whose snapshot file is written under a name
    containing ``marker`` and then renamed: as rules, named ``<prefix>_<window>``."""

    def before_write(f: FaultyFiles) -> None:
        f.crash("open", path=marker)  # the snapshot file is about to be created

    def after_write(f: FaultyFiles) -> None:
        f.crash("rename", path=marker)  # written and fsynced, not yet renamed

    def after_rename(f: FaultyFiles) -> None:
        f.crash("fsync", armed_by=("rename", marker))  # renamed; the directory not yet fsynced

    def after_delete(f: FaultyFiles) -> None:
        # The second directory fsync after the rename follows the deletion of the older files.
        f.crash("fsync", after=True, skip=1, armed_by=("rename", marker))

    return {
        f"{prefix}_before_write": before_write,
        f"{prefix}_after_write": after_write,
        f"{prefix}_after_rename": after_rename,
        f"{prefix}_after_delete": after_delete,
    }


COMPACTION_CRASHES: Crashes = _compaction_crashes("~~", "compact")
"""The crash windows of a queue journal's compaction (``<name>~~<n>`` renamed over
``<name>.<n>``), in order, as rules to add to a :class:`FaultyFiles`."""
JOB_COMPACTION_CRASHES: Crashes = _compaction_crashes(".tmp", "jobs_compact")
"""The crash windows of a beanstalkd job-log compaction (``snapshot.<n>.tmp`` renamed to
``snapshot.<n>``, ``journal/joblog.py``), in order."""


def _keyed_crashes() -> Crashes:
    """The crash windows of keyed leases, named after the step each ends the process at."""

    def take_before_lease_file(f: FaultyFiles) -> None:
        f.crash("open", path=".key.")  # a take: nothing written yet

    def take_after_lease_file(f: FaultyFiles) -> None:
        f.crash("pwrite", path=".key.", after=True)  # the items written, no record yet

    def take_after_record(f: FaultyFiles) -> None:
        f.crash("pwritev", after=True, armed_by=("pwrite", ".key."))  # KEY_TAKE written

    def ack_before_unlink(f: FaultyFiles) -> None:
        f.crash("unlink", path=".key.")  # KEY_END written, the lease file still there

    def release_after_record(f: FaultyFiles) -> None:
        f.crash("pwritev", after=True, armed_by=("pread", ".key."))  # items read, KEY_END

    return {
        "key_take_before_lease_file": take_before_lease_file,
        "key_take_after_lease_file": take_after_lease_file,
        "key_take_after_record": take_after_record,
        "key_ack_before_unlink": ack_before_unlink,
        "key_release_after_record": release_after_record,
    }


KEYED_CRASHES: Crashes = _keyed_crashes()
"""The crash windows of keyed leases (docs/journal_format.md §18), as rules to add to a
:class:`FaultyFiles`; each names the step it ends the process at."""


# ---- power loss -------------------------------------------------------------------------------

_DIR = "dir:"
"""Prefix of the identity of a descriptor open on a directory (then its path relative to the
data dir, ``.`` for the data dir itself)."""


def _parent(rel: str) -> str:
    """The directory of a path relative to the data dir (``.`` for the data dir)."""
    return os.path.dirname(rel) or "."


class PowerLossFiles(FileOps):
    """A :class:`FileOps` that records what a power cut would leave of one data directory.

    A kill -9 keeps everything the process wrote (the page cache survives); a power loss keeps
    only what was made durable: a file's bytes as of its last ``fsync``/``fdatasync``, and the
    directory's names (creates, renames, unlinks) as of its last ``fsync``. Through this seam
    every such call is mirrored into a *shadow* directory outside the data dir, kept on the
    filesystem so that it survives the process (a test kills the server with SIGKILL, then
    calls :func:`power_loss` to rewrite the data dir to the state a power cut would leave):

    - ``shadow/<id>``: a file's content at its last fsync (``id``: one per file created, which
      follows the file through renames, like an inode);
    - ``shadow/durable.json``: the directory as of its last fsync, name → id;
    - ``shadow/live.json``: the directory now, name → id (to find each file's unsynced tail).

    Only the files the seam sees are modelled (the journals, the checkpoints, the beanstalkd
    job log in ``beanstalk.d``: every directory under the data dir); files written around it
    (the locks, the status file) are left as they are. Every file present when the
    seam is installed counts as durable. Thread-safe (the journal syncs on worker threads):
    a file's copy is taken after its fsync returned, under a lock that writes through the
    seam hold too, so it holds whole writes only (perhaps some made after the fsync: a little
    optimistic, never a torn record the disk could not hold).
    """

    def __init__(self, data_dir: str, shadow: str, inner: FileOps | None = None) -> None:
        self.inner = inner if inner is not None else default_ops()
        self.data_dir = os.path.realpath(data_dir)
        self.shadow = shadow
        self._lock = threading.Lock()
        self._fds: dict[int, str] = {}
        """Descriptor → file id (:data:`_DIR` and the directory for a directory)."""
        self._live: dict[str, str] = {}
        self._next = 0
        os.makedirs(shadow, exist_ok=True)
        for old in os.scandir(shadow):
            os.unlink(old.path)
        for root, _, names in os.walk(self.data_dir):
            for entry in names:
                path = os.path.join(root, entry)
                fid = self._new_id()
                self._live[os.path.relpath(path, self.data_dir)] = fid
                with open(path, "rb") as f:
                    self._save(fid, f.read())
        self._write_json("live.json", self._live)
        self._write_json("durable.json", self._live)

    # ---- the shadow -----------------------------------------------------------------------

    def _new_id(self) -> str:
        self._next += 1
        return f"f{self._next}"

    def _save(self, fid: str, data: bytes) -> None:
        tmp = os.path.join(self.shadow, fid + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(self.shadow, fid))

    def _write_json(self, name: str, value: dict[str, str]) -> None:
        tmp = os.path.join(self.shadow, name + ".tmp")
        with open(tmp, "w") as f:
            json.dump(value, f)
        os.replace(tmp, os.path.join(self.shadow, name))

    def _name(self, path: str) -> str | None:
        """``path`` relative to the data dir, if it is inside (at any depth: the beanstalkd
        job log's ``beanstalk.d``); None otherwise."""
        rel = os.path.relpath(os.path.realpath(path), self.data_dir)
        return None if rel == "." or rel.startswith("..") else rel

    # ---- FileOps --------------------------------------------------------------------------

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        with self._lock:
            if os.path.isdir(path):
                fd = self.inner.open(path, flags, mode)
                self._fds[fd] = _DIR + (self._name(path) or ".")
                return fd
            name = self._name(path)
            existed = os.path.exists(path)
            fd = self.inner.open(path, flags, mode)
            if name is not None:
                if not existed or name not in self._live:
                    self._live[name] = self._new_id()
                    self._write_json("live.json", self._live)
                self._fds[fd] = self._live[name]
            return fd

    def close(self, fd: int) -> None:
        with self._lock:
            self._fds.pop(fd, None)
        self.inner.close(fd)

    def _synced(self, fd: int) -> None:
        with self._lock:
            fid = self._fds.get(fd)
            if fid is None:
                return
            if fid.startswith(_DIR):  # this directory's entries, as they are now
                where = fid[len(_DIR) :]
                with open(os.path.join(self.shadow, "durable.json")) as f:
                    durable: dict[str, str] = json.load(f)
                durable = {n: i for n, i in durable.items() if _parent(n) != where}
                durable.update((n, i) for n, i in self._live.items() if _parent(n) == where)
                self._write_json("durable.json", durable)
                return
            # Read by the file's name now (the descriptor may be write-only).
            names = [n for n, i in self._live.items() if i == fid]
            if names:
                with open(os.path.join(self.data_dir, names[0]), "rb") as f:
                    self._save(fid, f.read())

    def fdatasync(self, fd: int) -> None:
        self.inner.fdatasync(fd)
        self._synced(fd)

    def fsync(self, fd: int) -> None:
        self.inner.fsync(fd)
        self._synced(fd)

    def rename(self, src: str, dst: str) -> None:
        with self._lock:
            self.inner.rename(src, dst)
            old, new = self._name(src), self._name(dst)
            fid = self._live.pop(old, None) if old is not None else None
            if new is not None:
                if fid is None:
                    fid = self._new_id()
                self._live[new] = fid
            self._write_json("live.json", self._live)

    def unlink(self, path: str) -> None:
        with self._lock:
            self.inner.unlink(path)
            name = self._name(path)
            if name is not None and self._live.pop(name, None) is not None:
                self._write_json("live.json", self._live)

    # Writes hold the lock that a sync's copy of the file takes: the copy never sees half a
    # write (the loop appends while a periodic sync runs on a worker thread).

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> int:
        with self._lock:
            return self.inner.pwrite(fd, data, offset)

    def pwritev(self, fd: int, buffers: Sequence[bytes], offset: int) -> int:
        with self._lock:
            return self.inner.pwritev(fd, buffers, offset)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return self.inner.pread(fd, size, offset)

    def ftruncate(self, fd: int, size: int) -> None:
        with self._lock:
            self.inner.ftruncate(fd, size)

    def fstat_size(self, fd: int) -> int:
        return self.inner.fstat_size(fd)

    def scandir(self, path: str) -> list[str]:
        return self.inner.scandir(path)


TAILS: Final = ("drop", "cut", "hole", "page")
"""What :func:`power_loss` does with each file's unsynced bytes: drop them all; keep them up to
a random byte (the file's size got there, its data too); keep them all but a random run of
whole pages, which read as they were at the last fsync (zeros where the file was shorter);
keep them all but the page holding the first of them, which reads as at the last fsync (when it
also holds synced bytes: those, then zeros to its end)."""

PAGE: Final = 4096
"""The page size of the model: the kernel writes dirty pages back whole, in any order."""


def power_loss(
    data_dir: str, shadow: str, rng: random.Random, tail: str = "drop"
) -> dict[str, int]:
    """Rewrite ``data_dir`` (its server stopped, by SIGKILL say) to what a power cut would have
    left, from the shadow a :class:`PowerLossFiles` kept: the names as of the last directory
    fsync, each file's bytes as of its last fsync, and of the bytes written since (the unsynced
    tail: from the first byte that differs) what ``tail`` says (:data:`TAILS`). Files the seam
    made and the directory fsync never saw are removed. Returns counts of what it did."""
    with open(os.path.join(shadow, "durable.json")) as f:
        durable: dict[str, str] = json.load(f)
    with open(os.path.join(shadow, "live.json")) as f:
        live: dict[str, str] = json.load(f)
    done: Counter[str] = Counter()
    for name in set(live) - set(durable):
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            os.unlink(path)
            done["files_removed"] += 1
    # Unlinked or renamed away since the last directory fsync: the name comes back.
    done["names_restored"] = len(set(durable) - set(live))
    contents: dict[str, bytes] = {}
    for name, fid in durable.items():
        try:
            with open(os.path.join(shadow, fid), "rb") as f:
                synced = f.read()
        except FileNotFoundError:
            synced = b""  # created, never fsynced: the name survives, not the bytes
            done["files_never_synced"] += 1
        now = b""
        current = [n for n, i in live.items() if i == fid]  # where the file is now, if anywhere
        if current:
            with (
                contextlib.suppress(FileNotFoundError),
                open(os.path.join(data_dir, current[0]), "rb") as f,
            ):
                now = f.read()
        contents[name] = _with_tail(synced, now, rng, tail, done)
    for name in set(durable) | set(live):  # renames and unlinks since the fsync are undone
        path = os.path.join(data_dir, name)
        if name not in durable and os.path.exists(path):
            os.unlink(path)
    for name, data in contents.items():
        path = os.path.join(data_dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    done["files"] = len(contents)
    return dict(done)


def _first_difference(a: bytes, b: bytes) -> int:
    """The first index where ``a`` and ``b`` differ (the shorter length if one is a prefix)."""
    n = min(len(a), len(b))
    step = 4096
    i = 0
    while i < n and a[i : i + step] == b[i : i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return min(i, n)


def _with_tail(
    synced: bytes, now: bytes, rng: random.Random, tail: str, done: Counter[str]
) -> bytes:
    """A file's content after the cut: ``synced``, and of ``now``'s unsynced bytes (those
    from the first byte where it differs from ``synced``) what ``tail`` keeps."""
    start = _first_difference(synced, now)
    if start >= len(now) and len(now) >= len(synced):
        return synced  # nothing unsynced
    done["unsynced_bytes"] += max(len(now), len(synced)) - start
    if tail == "drop" or start >= len(now):
        done["tails_dropped"] += 1
        return synced
    if tail == "cut":
        cut = rng.randint(start, len(now))
        done["tails_cut"] += 1
        return now[:cut] + synced[cut:]
    if tail == "page":  # the page holding the first unsynced byte not written back
        a = start // PAGE * PAGE
        return _lose(synced, now, a, min(len(now), a + PAGE), start=start, done=done)
    if tail == "hole":  # whole pages not written back: they read as before (zeros if new)
        # From the page holding the first unsynced byte on: when that page also holds synced
        # bytes and is lost, it reads as synced records, then zeros to its end (journal_
        # format.md §6 cuts there).
        first = start // PAGE
        last = (len(now) - 1) // PAGE
        if first > last:
            done["tails_kept"] += 1
            return now
        a = rng.randint(first, last) * PAGE
        b = min(len(now), rng.randint(a // PAGE + 1, last + 1) * PAGE)
        return _lose(synced, now, a, b, start=start, done=done)
    raise ValueError(f"unknown tail {tail!r}")


def _lose(synced: bytes, now: bytes, a: int, b: int, *, start: int, done: Counter[str]) -> bytes:
    """``now`` with the pages from ``a`` to ``b`` as they were at the last fsync (``synced``,
    zeros past its end); ``start`` is the first unsynced byte."""
    old = synced[a:b]
    done["tails_holed"] += 1
    if a < start:
        done["holes_with_synced_bytes"] += 1  # the lost page also held synced bytes
    return now[:a] + old + bytes(b - a - len(old)) + now[b:]
