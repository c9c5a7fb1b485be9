"""Blocking reads with many concurrent waiters, and disconnects while waiting."""

from __future__ import annotations

import selectors
import socket

from support import Raw
from tercel.testing import ServerProcess


def set_cmd(q: str, data: bytes) -> bytes:
    return b"set %s 0 0 %d\r\n%s\r\n" % (q.encode(), len(data), data)


def wait_for(conn: Raw, qname: str, stat: str, value: int) -> None:
    """Poll the queue's stats over the wire until ``stat`` reaches ``value``."""
    for _ in range(5000):
        conn.send(b"dump_stats %s\r\n" % qname.encode())
        lines = []
        while not lines or lines[-1] != b"END\r\n":
            lines.append(conn.read_line())
        if f"  {stat}={value}\r\n".encode() in lines:
            return
    raise AssertionError(f"{stat} never reached {value}")


def test_many_waiters_each_get_one_item_in_fifo_order(server: ServerProcess, qname: str) -> None:
    n = 200
    q = qname.encode()
    sel = selectors.DefaultSelector()
    waiters = []
    control = Raw(server.connect())
    for i in range(n):
        sock = server.connect()
        sock.sendall(b"get %s/t=20000\r\n" % q)
        waiters.append(sock)
        # Register in a known order so FIFO service can be checked.
        wait_for(control, qname, "waiters", i + 1)
    for sock in waiters:
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ)
    control.call(b"".join(set_cmd(qname, b"%04d" % i) for i in range(n)), b"STORED\r\n" * n)
    received: dict[int, bytes] = {}
    buffers = {id(s): b"" for s in waiters}
    while len(received) < n:
        for key, _ in sel.select(timeout=10):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            buffers[id(sock)] += sock.recv(4096)
            if buffers[id(sock)].endswith(b"END\r\n"):
                received[waiters.index(sock)] = buffers[id(sock)]
                sel.unregister(sock)
    for i in range(n):
        assert received[i] == b"VALUE %s/t=20000 0 4\r\n%04d\r\nEND\r\n" % (q, i)
    for sock in waiters:
        sock.close()
    sel.close()
    wait_for(control, qname, "waiters", 0)
    wait_for(control, qname, "items", 0)


def test_disconnected_waiter_does_not_eat_an_item(server: ServerProcess, qname: str) -> None:
    q = qname.encode()
    control = Raw(server.connect())
    gone = server.connect()
    gone.sendall(b"get %s/t=20000\r\n" % q)
    wait_for(control, qname, "waiters", 1)
    gone.close()
    wait_for(control, qname, "waiters", 0)
    control.call(set_cmd(qname, b"kept"), b"STORED\r\n")
    control.call(b"get %s\r\n" % q, b"VALUE %s 0 4\r\nkept\r\nEND\r\n" % q)


def test_blocking_open_read_and_commands_behind_it(server: ServerProcess, qname: str) -> None:
    q = qname.encode()
    control = Raw(server.connect())
    waiter = Raw(server.connect())
    waiter.send(b"get %s/t=20000/open\r\nget %s/close\r\nversion\r\n" % (q, q))
    wait_for(control, qname, "waiters", 1)
    control.call(set_cmd(qname, b"x"), b"STORED\r\n")
    waiter.expect(b"VALUE %s/t=20000/open 0 1\r\nx\r\nEND\r\nEND\r\nVERSION " % q)
    wait_for(control, qname, "open_transactions", 0)


def test_blocking_peek(server: ServerProcess, qname: str) -> None:
    q = qname.encode()
    control = Raw(server.connect())
    waiter = Raw(server.connect())
    waiter.send(b"get %s/t=20000/peek\r\n" % q)
    wait_for(control, qname, "waiters", 1)
    control.call(set_cmd(qname, b"x"), b"STORED\r\n")
    waiter.expect(b"VALUE %s/t=20000/peek 0 1\r\nx\r\nEND\r\n" % q)
    control.call(b"get %s\r\n" % q, b"VALUE %s 0 1\r\nx\r\nEND\r\n" % q)
