"""Where the memory of many queues goes: a breakdown per queue, in-process.

    python bench/manyqueues_mem.py [--queues 20000] [--items 3] [--restart] [--top 25]

Starts a :class:`tercel.server.app.Server` in this process (on 127.0.0.1:0, a temp data dir),
creates ``--queues`` queues of ``--items`` 16-byte items each through a real memcache client
socket (pipelined ``set``, as ``bench/manyqueues.py`` does), then reports, divided by the queue
count:

- the growth of the process's RSS (VmRSS) over the creates;
- ``tracemalloc``'s growth by allocation site (file:line), with ``--trace`` (slow: every
  allocation is traced; compiled modules' allocations are attributed to their caller's line);
- ``gc.get_objects()`` counts by type (only objects the cyclic collector tracks: dicts, lists,
  deques, native class instances; not bytes, ints or strs);
- ``sys.getsizeof`` of each part of one queue (queue object, its deque, dicts, journal, lists).

With ``--restart`` the server is stopped and a second one replays the same data dir; the
figures are then those of the replayed queues. Prints plain text.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import shutil
import socket
import sys
import tempfile
import threading
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

from tercel.config import ServerConfig
from tercel.server.app import Server

BATCH = 1000


def rss_kb() -> int:
    """This process's resident set in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def client_create(port: int, queues: int, items: int) -> None:
    """Pipelined sets of ``items`` items to ``queues`` new queues, every reply read."""
    sock = socket.create_connection(("127.0.0.1", port))
    rest = b""
    for start in range(0, queues, BATCH):
        names = [b"mq%06d" % i for i in range(start, min(queues, start + BATCH))]
        data = b"".join(
            b"set %s 0 0 16\r\n%s%s\r\n" % (n, n, b"%08d" % k) for k in range(items) for n in names
        )
        sock.sendall(data)
        want = len(names) * items
        while rest.count(b"\r\n") < want:
            rest += sock.recv(1 << 20)
        rest = rest[rest.index(b"\r\n", len(b"STORED\r\n") * (want - 1)) + 2 :]
    sock.close()


def type_counts() -> Counter[str]:
    """Objects the garbage collector tracks, by type name."""
    return Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())


def sizes_of_one(srv: Server) -> list[tuple[str, int]]:
    """``sys.getsizeof`` of the parts of one queue (the first)."""
    q = next(iter(srv.collection))
    out: list[tuple[str, int]] = [("PersistentQueue", sys.getsizeof(q))]
    for attr in ("_items", "_open", "_waiters"):
        val = getattr(q, attr, None)
        if val is not None:
            out.append((f"queue.{attr} ({type(val).__name__})", sys.getsizeof(val)))
    j: Any = q.log
    out.append((f"log ({type(j).__name__})", sys.getsizeof(j)))
    for attr in dir(j):
        if attr.startswith("__"):
            continue
        try:
            val = getattr(j, attr)
        except Exception:
            continue
        if isinstance(val, (list, dict, tuple, bytearray, set)) or hasattr(val, "__dict__"):
            if callable(val) and not isinstance(val, (list, dict)):
                continue
            out.append((f"log.{attr} ({type(val).__name__})", sys.getsizeof(val)))
    for it in list(q._items)[:1]:
        out.append(("QItem", sys.getsizeof(it)))
    return out


async def run(args: argparse.Namespace, data: Path) -> None:
    config = ServerConfig().with_server(data_dir=str(data), memcache_port=0, admin_port=None)
    srv = Server(config)
    await srv.start()
    port = srv.ports["memcache"]
    gc.collect()
    base_rss = rss_kb()
    base_types = type_counts()
    if args.trace:
        tracemalloc.start(1)
    if args.restart:
        thread = threading.Thread(target=client_create, args=(port, args.queues, args.items))
        thread.start()
        while thread.is_alive():
            await asyncio.sleep(0.05)
        await srv.stop()
        gc.collect()
        base_rss = rss_kb()  # after the first server's stop: its queues are closed
        srv = Server(config)
        await srv.start()
        while srv.collection.pending:  # the queues replay in the background
            await asyncio.sleep(0.05)
        phase = "replayed"
    else:
        thread = threading.Thread(target=client_create, args=(port, args.queues, args.items))
        thread.start()
        while thread.is_alive():
            await asyncio.sleep(0.05)
        phase = "created"
    gc.collect()
    n = len(srv.collection)
    grown = rss_kb() - base_rss
    print(f"{n} queues {phase}: RSS +{grown / 1024:.1f} MB = {grown * 1024 / n:.0f} B/queue")
    if args.trace:
        snap = tracemalloc.take_snapshot()
        stats = snap.statistics("lineno")
        total = sum(s.size for s in stats)
        print(f"tracemalloc: {total / n:.0f} B/queue traced; top sites (B/queue, objects/queue):")
        for s in stats[: args.top]:
            frame = s.traceback[0]
            where = f"{frame.filename.split('/src/')[-1]}:{frame.lineno}"
            print(f"  {s.size / n:8.1f}  {s.count / n:6.2f}  {where}")
    counts = type_counts()
    counts.subtract(base_types)
    print("gc-tracked objects per queue by type:")
    for name, count in counts.most_common(args.top):
        if count / n >= 0.01:
            print(f"  {count / n:6.2f}  {name}")
    print("sys.getsizeof of one queue's parts (B):")
    for name, size in sizes_of_one(srv):
        print(f"  {size:6d}  {name}")
    await srv.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queues", type=int, default=20_000)
    parser.add_argument("--items", type=int, default=3)
    parser.add_argument("--restart", action="store_true")
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    data = Path(tempfile.mkdtemp(prefix="tercel-manyqueues-mem-"))
    try:
        asyncio.run(run(args, data))
    finally:
        shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
