"""What an ``fdatasync`` costs when the write grows the file, and when it lands in zeros
written ahead (the journal's ``PREALLOCATE``, docs/journal_format.md §7a).

Each group is one ``pwrite`` of ``--group`` bytes (a loop pass's journal records) and one
``fdatasync``, as the server's group commit does. Modes, alternated ``--rounds`` times:

- ``append``: every write grows the file (journal format version 1);
- ``ahead``: the journal's scheme, 1 MiB of zeros written past the end whenever the records
  reach it, their cost included;
- ``fallocate``: ``posix_fallocate`` instead of written zeros (shown for the record: ext4
  marks such blocks unwritten, and converting them is a metadata commit again);
- ``aio``: as ``ahead``, with the ``fdatasync`` submitted through Linux native AIO and its
  completion awaited on the eventfd, as the server's big groups are (``tercel.server.aio``;
  the kernel worker's CPU is not counted in the CPU column). Skipped without AIO;
- ``aio-busy``: as ``aio``, but the process stays busy while the fsync runs, as the server's
  loop does under load: passes of 100 µs of work, each ending with a look at the eventfd;
- ``aio-yield``: as ``aio-busy``, each pass ending with ``sched_yield()`` as the committer's do
  while a group is in flight. The kernel worker that runs an AIO fsync is bound to the CPU
  that submitted it; a busy process on that CPU delays it by up to a scheduler slice. Run
  pinned to one CPU (``taskset -c 1``) to see it as the pinned benchmark server does.

Run in the data directory's file system: ``python bench/fsync_ahead.py --dir tercel-data``.
Prints wall and CPU time per group and the slowest group; nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import os
import select
import tempfile
import time

from tercel.server.aio import Aio, open_aio

AHEAD = 1 << 20


PASS = 100e-6


def _aio_fdatasync(aio: Aio, fd: int, mode: str) -> None:
    aio.fdatasync(fd, 0)
    done: list[tuple[int, int]] = []
    while not done:
        if mode == "aio":
            select.select([aio.eventfd], [], [])
        else:  # a loop pass of work, then a look at the eventfd
            end = time.perf_counter() + PASS
            while time.perf_counter() < end:
                pass
            if mode == "aio-yield":
                os.sched_yield()
            if not select.select([aio.eventfd], [], [], 0)[0]:
                continue
        done = aio.reap()
    if done[0][1] < 0:
        raise OSError(-done[0][1], os.strerror(-done[0][1]))


def run(
    path: str, mode: str, groups: int, group: int, aio: Aio | None
) -> tuple[float, float, float]:
    """(wall µs per group, CPU µs per group, slowest group in ms)."""
    chunk = b"x" * group
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        allocated = 0
        if mode == "fallocate":
            os.posix_fallocate(fd, 0, groups * group)
            os.fsync(fd)
        pos = 0
        worst = 0.0
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(groups):
            t0 = time.perf_counter()
            os.pwrite(fd, chunk, pos)
            pos += group
            if mode not in ("append", "fallocate") and pos > allocated:
                allocated = pos
                os.pwrite(fd, bytes(AHEAD), allocated)
                allocated += AHEAD
            if aio is not None and mode.startswith("aio"):
                _aio_fdatasync(aio, fd, mode)
            else:
                os.fdatasync(fd)
            worst = max(worst, time.perf_counter() - t0)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        os.close(fd)
        os.unlink(path)
    return wall / groups * 1e6, cpu / groups * 1e6, worst * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=".", help="a directory on the file system to measure")
    ap.add_argument("--groups", type=int, default=4000, help="write + fdatasync pairs per run")
    ap.add_argument("--group", type=int, default=10 * 1024, help="bytes written per group")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    path = tempfile.mktemp(prefix="fsync-ahead-", dir=args.dir)
    print(f"{args.groups} groups of {args.group} B per run, in {os.path.abspath(args.dir)}")
    aio = open_aio()
    modes: tuple[str, ...] = ("append", "ahead", "fallocate")
    if aio is not None:
        modes += ("aio", "aio-busy", "aio-yield")
    for r in range(1, args.rounds + 1):
        for mode in modes:
            wall, cpu, worst = run(path, mode, args.groups, args.group, aio)
            print(
                f"r{r} {mode:9s} {wall:7.1f} µs/group wall {cpu:6.1f} µs CPU"
                f"  slowest {worst:5.1f} ms"
            )


if __name__ == "__main__":
    main()
