"""CPU seconds of a process tree over a window, split by role (Linux only).

A difference of two :func:`procstat.tree_and_kernel_seconds` readings is exact for the whole
tree but says nothing of who spent it. :class:`CpuSplit` polls ``/proc`` in a thread every
``interval`` seconds and keeps, for every process of the tree it saw, its own CPU time
(utime + stime, all threads) when first and last seen; at :meth:`CpuSplit.stop` each process's
difference goes to the role ``classify`` gives it (from its pid and command line). A process
that started in the window counts from 0; one that ended in it loses its last ``interval``
(its parent reaps it, so the exact tree total still has it: the caller reports the difference
as ``unattributed``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from procstat import process_table

_TICK = os.sysconf("SC_CLK_TCK")


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


class CpuSplit:
    """Per-role CPU seconds of ``root``'s descendants (``root`` itself is role ``"root"``)
    between construction and :meth:`stop`."""

    def __init__(
        self, root: int, classify: Callable[[int, list[str]], str], interval: float = 0.2
    ) -> None:
        self.root = root
        self.classify = classify
        self.interval = interval
        self.first: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self.role: dict[int, str] = {}
        self._done = threading.Event()
        self._poll(initial=True)
        self._thread = threading.Thread(target=self._run, name="cpu-split", daemon=True)
        self._thread.start()

    def _poll(self, initial: bool = False) -> None:
        table = process_table()
        ticks = {pid: row[1] for pid, row in table.items()}
        children: dict[int, list[int]] = {}
        for pid, row in table.items():
            children.setdefault(row[0], []).append(pid)
        todo = [self.root]
        while todo:
            pid = todo.pop()
            todo.extend(children.get(pid, ()))
            if pid not in ticks:
                continue
            if pid not in self.role:
                self.role[pid] = "root" if pid == self.root else self.classify(pid, _cmdline(pid))
                self.first[pid] = ticks[pid] if initial else 0
            self.last[pid] = ticks[pid]

    def _run(self) -> None:
        while not self._done.wait(self.interval):
            self._poll()

    def stop(self) -> dict[str, float]:
        """Stop polling; CPU seconds per role seen."""
        self._done.set()
        self._thread.join()
        self._poll()
        out: dict[str, float] = {}
        for pid, role in self.role.items():
            out[role] = out.get(role, 0.0) + (self.last[pid] - self.first[pid]) / _TICK
        return out
