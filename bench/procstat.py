"""Reads a process's CPU time and memory from /proc (Linux only).

Contract: every function takes a live pid and raises ``OSError`` if the process is gone.
CPU time covers every thread of the process (utime + stime), in seconds, with the kernel's
clock-tick resolution (usually 10 ms).
"""

from __future__ import annotations

import os

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (all threads) in seconds."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        raw = f.read()
    # The command name is in parentheses and may contain spaces: split after the last ')'.
    fields = raw[raw.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


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


def system_busy_seconds() -> float:
    """CPU seconds all CPUs together have spent not idle since boot (from /proc/stat).

    The difference over a window, minus the server's and the load generator's own CPU time, is
    the CPU that other processes took: a noise indicator for that window.
    """
    with open("/proc/stat", "rb") as f:
        fields = f.readline().split()[1:]
    ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICK
