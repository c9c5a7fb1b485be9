"""Stats of a server with many queues never hold the loop (issue 33, defect 2): memcache
``stats``/``dump_stats``, ``/stats.json`` and ``/metrics`` render ``stats.SLICE`` queues per
loop pass, and other connections are answered in between. In-process, on a server that is
built but not listening, with stand-in transports: the order of events is the assertion,
never a timer."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tercel.config import parse_config
from tercel.protocol import memcache as mc
from tercel.server import exposition, stats
from tercel.server.admin import AdminServer
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


def test_admin_documents_of_many_queues_are_made_in_slices(tmp_path: Path) -> None:
    """Reading the figures, sorting and writing ``/stats.json``, grouping and formatting
    ``/metrics``: each yields at least once per slice of queues, and the document made in
    slices is the whole one."""

    async def main() -> None:
        srv = server(tmp_path, QUEUES)
        for i in range(0, QUEUES, 3):  # some queues with a latency sample
            srv.ctx.metrics.queue(f"q{i:05d}").set.add(i)
        steps = exposition.snapshot_steps(srv.ctx)
        yields = 0
        while True:
            try:
                next(steps)
            except StopIteration as stop:
                snap: exposition.Snapshot = stop.value
                break
            yields += 1
        assert yields >= SLICES
        assert sum(k.endswith("/total_items") for k in snap.counters) == QUEUES

        chunks = list(exposition.json_chunks(snap))
        assert chunks.count(exposition.PAUSE) >= SLICES
        doc = json.loads(b"".join(c for c in chunks if c is not None))
        assert doc == snap.to_json()
        assert list(doc["gauges"]) == sorted(doc["gauges"])

        chunks = list(exposition.prometheus_chunks(snap))
        assert chunks.count(exposition.PAUSE) >= SLICES
        text = b"".join(c for c in chunks if c is not None).decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert {s.labels["queue"] for s in families["tercel_items"].samples} == {
            f"q{i:05d}" for i in range(QUEUES)
        }
        latency = families["tercel_set_latency_usec"].samples
        assert len(latency) == len(range(0, QUEUES, 3)) * 10  # count, sum, 8 quantiles
        types = [ln.split()[2] for ln in text.splitlines() if ln.startswith("# TYPE")]
        assert len(types) == len(set(types))  # a family written in parts is one family

    asyncio.run(main())


def test_admin_streams_a_big_document_while_the_loop_serves_others(tmp_path: Path) -> None:
    """The response of ``/metrics`` (and ``/stats.json``) with many queues starts before its
    body is made: its headers reach the client, which runs on the same loop, while the render
    is suspended between slices (and a memcache command is answered then, from a consistent
    server)."""

    async def main() -> None:
        srv = server(tmp_path, 4 * QUEUES)
        admin = AdminServer(srv.ctx)
        port = await admin.start("127.0.0.1", 0)
        b, tb = connect(srv)
        try:
            async with aiohttp.ClientSession() as session:
                for path in ("/metrics", "/stats.json"):
                    async with session.get(f"http://127.0.0.1:{port}{path}") as resp:
                        assert resp.status == 200
                        assert not resp.content.at_eof()  # the render goes on
                        before = tb.written
                        b.data_received(b"version\r\n")
                        assert tb.written == before + mc.version(srv.ctx.version)
                        body = await resp.read()
                    assert str(4 * QUEUES - 1).encode() in body
                    assert resp.headers["Transfer-Encoding"] == "chunked"
        finally:
            b.connection_lost(None)
            await admin.stop()

    asyncio.run(main())
