"""Shared fixtures: real servers on 127.0.0.1:0 and a raw memcache line client."""

from __future__ import annotations

import itertools
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, TypeVar

import pytest

from tercel import native
from tercel.testing import ServerProcess

if native.stale_modules():  # the suite must test the sources as they are now
    pytest.exit(
        f"compiled modules are older than their sources: {native.stale_modules()}; "
        "run `make native` (or `make test`), or delete the .so files under src/",
        returncode=4,
    )

_names = itertools.count()


class Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closable)
_open: list[Closable] = []


def track(conn: C) -> C:
    """Close ``conn`` (any client with ``close()``) when the test ends; returns it."""
    _open.append(conn)
    return conn


@pytest.fixture(autouse=True)
def _close_connections() -> Iterator[None]:
    """Close every connection a test opened with :func:`track`, whatever happened in it."""
    yield
    while _open:
        _open.pop().close()


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


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One real server per test module (queues are named per test, so tests do not meet)."""
    with ServerProcess(tmp_path_factory.mktemp("data")) as srv:
        yield srv


@pytest.fixture
def qname(request: pytest.FixtureRequest) -> str:
    """A queue name unique to this test."""
    base = "".join(c if c.isalnum() else "_" for c in request.node.name)[:150]
    return f"{base}_{next(_names)}"


@pytest.fixture
def raw(server: ServerProcess) -> Iterator[Raw]:
    """A raw connection to the module's server."""
    conn = Raw(server.connect())
    yield conn
    conn.close()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"
