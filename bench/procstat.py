"""Reads CPU time, memory and the machine from /proc (Linux only); every bench tool does so here.

Contract: a function that takes a pid raises ``OSError`` if the process is gone. CPU time is
utime + stime over every thread, in seconds, with the kernel's clock-tick resolution (usually
10 ms).
"""

from __future__ import annotations

import os

_TICK = os.sysconf("SC_CLK_TCK")


def _status_kb(pid: int, key: bytes) -> int:
    with open(f"/proc/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    return 0


def peak_rss_kb(pid: int) -> int:
    """VmHWM: the peak resident set size of ``pid`` so far, in KiB."""
    return _status_kb(pid, b"VmHWM:")


def rss_kb(pid: int) -> int:
    """VmRSS: the current resident set size of ``pid``, in KiB."""
    return _status_kb(pid, b"VmRSS:")


def machine() -> tuple[str, int]:
    """The CPU's model name (``/proc/cpuinfo``) and the RAM in KiB (``/proc/meminfo``)."""
    model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_kb = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
                break
    return model, mem_kb


def machine_seconds() -> tuple[float, float]:
    """CPU seconds since boot of all CPUs together, from one read of /proc/stat: the time not
    idle, and of it the *steal* (the hypervisor ran other guests while our CPU wanted to run).

    The busy difference over a window, minus the server's and the load generator's own CPU
    time and minus the kernel threads' (:func:`tree_and_kernel_seconds`), is the CPU that
    other processes (or, through steal, other guests) took: a noise indicator.
    """
    with open("/proc/stat", "rb") as f:
        fields = f.readline().split()[1:]
    ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICK, ticks[7] / _TICK


def user_system_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds of ``pid`` so far (every thread, not its children): (user, system)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        raw = f.read()
    fields = raw[raw.rindex(b")") + 2 :].split()
    return int(fields[11]) / _TICK, int(fields[12]) / _TICK


_PF_KTHREAD = 0x00200000


def _process_table() -> dict[int, tuple[int, int, int, bool]]:
    """Every process now, from one pass over /proc: pid -> (parent pid, its own CPU ticks,
    the ticks of the children it reaped, whether it is a kernel thread)."""
    table: dict[int, tuple[int, int, int, bool]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read()
        except OSError:  # gone meanwhile
            continue
        fields = raw[raw.rindex(b")") + 2 :].split()
        table[int(name)] = (
            int(fields[1]),
            int(fields[11]) + int(fields[12]),
            int(fields[13]) + int(fields[14]),
            bool(int(fields[6]) & _PF_KTHREAD),
        )
    return table


def tree_and_kernel_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds so far of ``pid``'s process tree, and of all kernel threads, from one pass
    over /proc.

    The tree is ``pid``, its live descendants, and the children each of them has reaped
    (``cutime`` + ``cstime``), so the difference of two readings counts work a server hands to
    a child process, such as Redis's AOF rewrite, which a reading of ``pid`` alone would leave
    to the noise. Kernel threads (kworker, jbd2, ksoftirqd...) work largely for the server under
    test (writing back and completing its files' pages); they live long, so the difference of
    two readings is exact.
    """
    procs: dict[int, tuple[int, int, int]] = {}  # pid -> (ppid, own ticks, reaped children's)
    kernel = 0
    for proc, (ppid, own, reaped, kthread) in _process_table().items():
        if kthread:
            kernel += own
        else:
            procs[proc] = (ppid, own, reaped)
    if pid not in procs:
        raise ProcessLookupError(pid)
    children: dict[int, list[int]] = {}
    for child, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(child)
    tree = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        _, own, reaped = procs[p]
        tree += own + reaped
        todo.extend(children.get(p, ()))
    return tree / _TICK, kernel / _TICK
