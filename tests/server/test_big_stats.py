"""Stats of a server with many queues never hold the loop (issue 33, defect 2): memcache
``stats``/``dump_stats``, ``/stats.json`` and ``/metrics`` render ``stats.SLICE`` queues per
loop pass, and other connections are answered in between. In-process, on a server that is
built but not listening, with stand-in transports: the order of events is the assertion,
never a timer."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tercel.config import parse_config
from tercel.protocol import memcache as mc
from tercel.server import stats
from tercel.server.app import Server
from tercel.server.memcache.connection import MemcacheConnection

SLICES = 5
QUEUES = SLICES * stats.SLICE


class Transport:
    """What a connection writes, kept (an asyncio transport by duck typing)."""

    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed


def server(tmp_path: Path, queues: int) -> Server:
    """A server with ``queues`` empty queues, not listening (call inside a running loop)."""
    config = parse_config({"server": {"data_dir": str(tmp_path)}, "queues": {"journal": False}})
    srv = Server(config)
    for i in range(queues):
        srv.ctx.collection.get_or_create(f"q{i:05d}")
    return srv


def connect(srv: Server) -> tuple[MemcacheConnection, Transport]:
    conn = MemcacheConnection(srv.ctx)
    transport = Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


async def passes_until(cond: object) -> int:
    """Loop passes until ``cond()`` holds (each ``sleep(0)`` lets the loop run once)."""
    n = 0
    while not cond():  # type: ignore[operator]
        await asyncio.sleep(0)
        n += 1
    return n


def test_memcache_stats_of_many_queues_answers_others_meanwhile(tmp_path: Path) -> None:
    async def main() -> None:
        srv = server(tmp_path, QUEUES)
        version = mc.version(srv.ctx.version)
        a, ta = connect(srv)
        b, tb = connect(srv)
        a.data_received(b"stats\r\nversion\r\n")
        b.data_received(b"version\r\n")
        # b is answered while a's stats is still being rendered; a's version waits behind it.
        assert tb.written == version
        assert ta.written == b""
        passes = await passes_until(lambda: ta.written.endswith(version))
        assert passes >= SLICES - 1
        body = ta.written[: -len(version)]
        assert body.endswith(b"\r\nEND\r\n")
        names = [ln.split(b" ")[1] for ln in body.split(b"\r\n")[:-2]]
        assert names == [k.encode() for k, _ in stats.stats_lines(srv.ctx)]
        assert sum(n.endswith(b"_total_items") and n.startswith(b"queue_") for n in names) == QUEUES
        b.data_received(b"dump_stats\r\n")
        assert tb.written == version  # parked again: dump_stats is sliced too
        await passes_until(lambda: tb.written.endswith(b"END\r\n"))
        assert tb.written.count(b"queue '") == QUEUES
        a.connection_lost(None)
        b.connection_lost(None)

    asyncio.run(main())


def test_a_few_queues_are_answered_at_once(tmp_path: Path) -> None:
    async def main() -> None:
        srv = server(tmp_path, stats.SLICE)
        a, ta = connect(srv)
        a.data_received(b"stats\r\n")
        assert ta.written.endswith(b"END\r\n")  # one slice: no loop pass needed
        a.connection_lost(None)

    asyncio.run(main())
