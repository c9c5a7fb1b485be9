"""docs/architecture.md "How to add a front end", followed for a toy line protocol defined here:
a codec, its handlers, a connection, and one listener row. The row starts through the real
lifecycle (``Server.start``/``stop``, the same as ``tercel serve``'s and ``tercel beanstalkd``'s)
beside ``tercel serve``'s own rows, on 127.0.0.1:0, and answers over a real socket."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from tercel import native
from tercel.config import ServerConfig
from tercel.errors import ConfigError, ProtocolError, TercelError
from tercel.listening import bind_tcp
from tercel.server import figures
from tercel.server.app import FRONT_ENDS, Server, listener_table
from tercel.server.connection import Connection
from tercel.server.context import ServerContext
from tercel.server.figures import COUNTER, Figure
from tercel.server.frontend import FrontEnd, Running, StartHook

if "tercel.server.connection" in native.compiled_modules():  # pragma: no cover
    # Recipe step 5: a compiled base cannot have interpreted subclasses, and this toy is not
    # compiled (a real front end is listed in setup.py's NATIVE_MODULES). `make test` runs it
    # in its pure-Python pass (`unit-pure`).
    pytest.skip("the connection base is compiled", allow_module_level=True)


# 1. The codec: sans-IO, bytes in, typed commands out, replies built as bytes.


class Line:
    """One command: its verb and its argument."""

    def __init__(self, verb: bytes, arg: bytes) -> None:
        self.verb = verb
        self.arg = arg


NEED_DATA = None


class PingCodec:
    """``PING`` -> ``PONG``, ``ECHO <text>`` -> ``<text>``; CRLF-terminated lines."""

    def __init__(self) -> None:
        self.buf = b""

    def receive_data(self, data: bytes) -> None:
        self.buf += data

    @property
    def buffered(self) -> int:
        return len(self.buf)

    def next_command(self) -> Line | None:
        line, crlf, rest = self.buf.partition(b"\r\n")
        if not crlf:
            return NEED_DATA
        self.buf = rest
        verb, _, arg = line.partition(b" ")
        return Line(verb, arg)


# 2. The handlers: one small function per command, in a table; they reply into conn.out.


def handle_ping(conn: PingConnection, cmd: Line) -> None:
    conn.front.pings += 1
    conn.out.append(b"PONG\r\n")


def handle_echo(conn: PingConnection, cmd: Line) -> None:
    conn.out.append(cmd.arg + b"\r\n")


HANDLERS: dict[bytes, Callable[[PingConnection, Line], None]] = {
    b"PING": handle_ping,
    b"ECHO": handle_echo,
}


class PingConnection(Connection):
    """The shared pump with the toy codec and handlers."""

    def __init__(self, ctx: ServerContext, front: PingFrontEnd) -> None:
        super().__init__(ctx, "ping")
        self.front = front
        self.codec = PingCodec()

    def feed(self, data: bytes) -> None:
        self.codec.receive_data(data)

    def buffered(self) -> int:
        return self.codec.buffered

    def next_command(self) -> Line | None:
        cmd = self.codec.next_command()
        return None if cmd is NEED_DATA else cmd

    def dispatch(self, cmd: Line) -> None:
        handler = HANDLERS.get(cmd.verb)
        if handler is None:
            raise ProtocolError(f"unknown command {cmd.verb.decode(errors='replace')}")
        handler(self, cmd)

    def error_reply(self, exc: TercelError) -> None:
        self.out.append(f"ERROR {exc}\r\n".encode())

    def refusal(self, reason: str) -> bytes:
        return f"ERROR {reason}\r\n".encode()


# 3. What its start hook returns: its connections, its counters, its stop.


class PingFrontEnd(Running):
    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.pings = 0
        self.stopped = False
        self.counters = lambda: figures.read(PING_FIGURES, self)

    def connection(self) -> Connection:
        return PingConnection(self.ctx, self)

    async def stop(self) -> None:
        self.stopped = True


PING_FIGURES = (Figure("cmd_ping", COUNTER, "PING commands answered.", lambda f: f.pings),)
"""Its one figure, declared once: shown in memcache ``stats`` (``ping_cmd_ping``),
``/stats.json`` and ``/metrics`` (``tercel_ping_cmd_ping_total``)."""


def _load_ping() -> StartHook:
    return PingFrontEnd


# 4. The one listener row (no [server] key here: it listens on the socket bound for it).
PING = FrontEnd("ping", None, _load_ping)


def test_a_toy_front_end_runs_through_the_lifecycle(tmp_path: Path) -> None:
    config = ServerConfig().with_server(data_dir=str(tmp_path / "data"), admin_port=None)

    async def scenario() -> PingFrontEnd:
        sockets = {
            "memcache": bind_tcp("127.0.0.1", 0),  # tercel serve's rows run beside it
            "ping": bind_tcp("127.0.0.1", 0),
        }
        server = Server(config, sockets=sockets, front_ends=(*FRONT_ENDS, PING))
        await server.start()
        try:
            assert set(server.ports) == {"memcache", "ping"}
            reader, writer = await asyncio.open_connection("127.0.0.1", server.ports["ping"])
            writer.write(b"PING\r\nECHO hello there\r\nNOPE\r\nPI")
            writer.write(b"NG\r\n")
            want = b"PONG\r\nhello there\r\nERROR unknown command NOPE\r\nPONG\r\n"
            assert await reader.readexactly(len(want)) == want
            readings = server.ctx.front_end_counters()["ping"]
            counters = {f.name: v for f, v in readings}
            assert counters == {"curr_connections": 1, "total_connections": 1, "cmd_ping": 2}
            mc_reader, mc_writer = await asyncio.open_connection(
                "127.0.0.1", server.ports["memcache"]
            )
            mc_writer.write(b"stats\r\n")
            stats = await mc_reader.readuntil(b"END\r\n")
            assert b"STAT ping_cmd_ping 2\r\n" in stats  # the declaration, on the wire
            mc_writer.close()
            await mc_writer.wait_closed()
            front = server.running["ping"]
            assert isinstance(front, PingFrontEnd) and not front.stopped
            writer.close()
            await writer.wait_closed()
        finally:
            await server.stop()
        return front

    assert asyncio.run(scenario()).stopped  # stopped by the server's one stop sequence


def test_a_row_with_no_port_and_no_socket_does_not_start(tmp_path: Path) -> None:
    config = ServerConfig().with_server(data_dir=str(tmp_path / "data"), admin_port=None)

    async def scenario() -> dict[str, int]:
        sockets = {"memcache": bind_tcp("127.0.0.1", 0)}
        server = Server(config, sockets=sockets, front_ends=(*FRONT_ENDS, PING))
        await server.start()
        try:
            return dict(server.ports)
        finally:
            await server.stop()

    assert set(asyncio.run(scenario())) == {"memcache"}


def test_the_listener_table() -> None:
    """A row listens when its ``[server]`` key gives a port or a socket was bound for it; a
    port given to a row that is not built is a configuration error."""
    config = ServerConfig().with_server(text_port=0)
    rows = (*FRONT_ENDS, PING)
    assert [(fe.name, port) for fe, port in listener_table(config, rows)] == [
        ("memcache", 22133),
        ("text", 0),
    ]
    assert [fe.name for fe, _ in listener_table(config, rows, bound=["ping"])] == [
        "memcache",
        "text",
        "ping",
    ]
    unbuilt = FrontEnd("text", "text_port", None)
    with pytest.raises(ConfigError, match="not built"):
        listener_table(config, (unbuilt,))


def test_a_server_without_queues_touches_no_data_dir(tmp_path: Path) -> None:
    """``queues=False`` (``tercel beanstalkd``'s lifecycle): only the given rows run, and the
    data dir is neither locked, read nor made."""
    data = tmp_path / "data"
    config = ServerConfig().with_server(data_dir=str(data), memcache_port=None, admin_port=None)

    async def scenario() -> bytes:
        sockets = {"ping": bind_tcp("127.0.0.1", 0)}
        server = Server(config, sockets=sockets, front_ends=(PING,), queues=False)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.ports["ping"])
            writer.write(b"PING\r\n")
            reply = await reader.readexactly(6)
            writer.close()
            await writer.wait_closed()
        finally:
            await server.stop()
        return reply

    assert asyncio.run(scenario()) == b"PONG\r\n"
    assert not data.exists()
