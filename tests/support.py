"""Helpers the tests import: a raw memcache line client with byte-exact expectations and
small wire helpers. They live here, not in ``conftest.py``, because ``tests/spark/conftest.py``
would shadow a ``from conftest import ...`` when both directories run in one session."""

from __future__ import annotations

import socket
from typing import Any, Protocol, TypeVar


class Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closable)
open_connections: list[Closable] = []
"""What :func:`track` registered; closed by the autouse fixture in ``conftest.py``."""


def track(conn: C) -> C:
    """Close ``conn`` (any client with ``close()``) when the test ends; returns it."""
    open_connections.append(conn)
    return conn


class Raw:
    """A raw memcache connection with byte-exact expectations."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        track(self)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError(f"connection closed; had {self.buf!r}")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_line(self) -> bytes:
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError(f"connection closed; had {self.buf!r}")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line + b"\r\n"

    def expect(self, expected: bytes) -> None:
        got = self.read_exact(len(expected))
        assert got == expected

    def call(self, request: bytes, expected: bytes) -> None:
        self.send(request)
        self.expect(expected)

    def closed(self) -> bool:
        """True when the server has closed the connection (after any pending bytes)."""
        try:
            return not self.buf and self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


def set_cmd(q: str, data: bytes) -> bytes:
    """A plain memcache ``set`` of ``data`` to queue ``q``."""
    return b"set %s 0 0 %d\r\n%s\r\n" % (q.encode(), len(data), data)


def drain(conn: Raw, q: str) -> list[bytes]:
    """Every item left in ``q``, in order (plain gets)."""
    out = []
    while True:
        conn.send(b"get %s\r\n" % q.encode())
        line = conn.read_line()
        if line == b"END\r\n":
            return out
        out.append(conn.read_exact(int(line.split()[3])))
        conn.expect(b"\r\nEND\r\n")


def stats(conn: Raw) -> dict[str, str]:
    """Every line of memcache ``stats``: name -> value."""
    conn.send(b"stats\r\n")
    out: dict[str, str] = {}
    while (line := conn.read_line()) != b"END\r\n":
        _, key, value = line.decode().rstrip("\r\n").split(" ", 2)
        out[key] = value
    return out


class Text:
    """A raw Kestrel text-protocol connection: LF-terminated lines, byte-exact expectations."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def line(self) -> bytes:
        """The next reply line, without its LF."""
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError(f"connection closed; had {self.buf!r}")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def call(self, request: bytes, *replies: bytes) -> None:
        self.send(request)
        assert [self.line() for _ in replies] == list(replies)

    def closed(self) -> bool:
        return not self.buf and self.sock.recv(1) == b""

    def close(self) -> None:
        self.sock.close()


def text_connection(port: int, timeout: float = 10) -> Text:
    """A :class:`Text` connection to ``port`` on 127.0.0.1, closed when the test ends."""
    return track(Text(socket.create_connection(("127.0.0.1", port), timeout=timeout)))


def thrift_client(idl: Any, port: int, timeout_ms: int = 10_000) -> Any:
    """A thriftpy2 client of ``idl.Kestrel`` (the shipped IDL, loaded by the caller) on
    127.0.0.1 ``port``: framed transport, binary protocol, as Kestrel's; closed when the test
    ends. (thriftpy2 is imported here, not by every test that imports this module.)"""
    from thriftpy2.protocol import TBinaryProtocolFactory
    from thriftpy2.rpc import make_client
    from thriftpy2.transport import TFramedTransportFactory

    client = make_client(
        idl.Kestrel,
        "127.0.0.1",
        port,
        trans_factory=TFramedTransportFactory(),
        proto_factory=TBinaryProtocolFactory(),
        timeout=timeout_ms,
    )
    return track(client)
