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
fires; ``armed_by=(op, path)`` keeps the rule asleep until such a call has completed. The
compaction crash windows the journals document are :data:`COMPACTION_CRASHES` (queue
journals) and :data:`JOB_COMPACTION_CRASHES` (the beanstalkd job log).

Thread-safe enough for the journal's worker threads (a lock around the rule bookkeeping).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from tercel.journal.files import FileOps, default_ops

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
    fired: int = 0

    def matches(self, op: str, path: str) -> bool:
        return op == self.op and (self.path is None or self.path in path)


class FaultyFiles:
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
    ) -> Rule:
        """Make ``op`` raise ``OSError(error)`` (without doing anything)."""
        return self._add(Rule(op, path, error=error, skip=skip, times=times, armed_by=armed_by))

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
        if rule is not None:
            os._exit(CRASH_EXIT)

    def _run(self, op: str, path: str, call: Callable[[], T]) -> T:
        rule = self._before(op, path)
        result = call()
        self._after(op, path, rule)
        return result

    def _fd_path(self, fd: int) -> str:
        return self._paths.get(fd, "")

    # ---- FileOps --------------------------------------------------------------------------

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        fd = self._run("open", path, lambda: self.inner.open(path, flags, mode))
        self._paths[fd] = path
        return fd

    def close(self, fd: int) -> None:
        path = self._paths.pop(fd, "")
        self._run("close", path, lambda: self.inner.close(fd))

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> int:
        return self._run("pwrite", self._fd_path(fd), lambda: self.inner.pwrite(fd, data, offset))

    def pwritev(self, fd: int, buffers: Sequence[bytes], offset: int) -> int:
        path = self._fd_path(fd)
        return self._run("pwritev", path, lambda: self.inner.pwritev(fd, buffers, offset))

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return self._run("pread", self._fd_path(fd), lambda: self.inner.pread(fd, size, offset))

    def fdatasync(self, fd: int) -> None:
        self._run("fdatasync", self._fd_path(fd), lambda: self.inner.fdatasync(fd))

    def fsync(self, fd: int) -> None:
        self._run("fsync", self._fd_path(fd), lambda: self.inner.fsync(fd))

    def ftruncate(self, fd: int, size: int) -> None:
        self._run("ftruncate", self._fd_path(fd), lambda: self.inner.ftruncate(fd, size))

    def fstat_size(self, fd: int) -> int:
        return self._run("fstat_size", self._fd_path(fd), lambda: self.inner.fstat_size(fd))

    def rename(self, src: str, dst: str) -> None:
        self._run("rename", src, lambda: self.inner.rename(src, dst))

    def unlink(self, path: str) -> None:
        self._run("unlink", path, lambda: self.inner.unlink(path))

    def scandir(self, path: str) -> list[str]:
        return self._run("scandir", path, lambda: self.inner.scandir(path))


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
