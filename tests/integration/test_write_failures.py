"""A journal that cannot be written, and connections that close while replies are held.

Real servers; a journal write is made to fail by lowering the server's file size limit
(``RLIMIT_FSIZE`` through ``prlimit``: the write gets EFBIG, as on a full disk). The rule
under test is the project's first one: a reply that acknowledges a record is sent only if the
record is in the journal, so after a restart every acknowledged item is there.
"""

from __future__ import annotations

import resource
import socket
import time
from pathlib import Path

import pytest

from conftest import Raw, drain, set_cmd
from tercel.testing import ServerProcess


def limit_file_size(srv: ServerProcess, size: int) -> None:
    """From now on the server cannot grow any file past ``size`` bytes."""
    assert srv.proc is not None
    resource.prlimit(srv.proc.pid, resource.RLIMIT_FSIZE, (size, size))


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    sock.settimeout(10)
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def stat(conn: Raw, name: bytes) -> int:
    conn.send(b"stats\r\n")
    value = None
    while (line := conn.read_line()) != b"END\r\n":
        if line.split()[1] == name:
            value = int(line.split()[2])
    assert value is not None
    return value


def test_a_write_failing_inside_a_rotation_acknowledges_nothing_it_lost(data_dir: Path) -> None:
    # Tiny journals: the 16th set makes the queue compact, which rotates the file and writes
    # the buffered records out itself, in the middle of the loop pass that holds their replies.
    config = '[queues]\nmax_journal_size = "1K"\nmax_journal_size_absolute = "2K"\n'
    items = [b"%02d" % i + b"x" * 298 for i in range(16)]
    with ServerProcess(data_dir, config) as srv:
        limit_file_size(srv, 4096)
        sock = srv.connect()
        sock.sendall(b"".join(set_cmd("q", item) for item in items))
        replies = read_all(sock)  # the server drops the connection
        sock.close()
        stored = replies.count(b"STORED\r\n")
        assert stored < len(items)
        srv.kill()
        srv.start()
        kept = drain(Raw(srv.connect()), "q")
        assert kept[:stored] == items[:stored]  # every acknowledged item survived


@pytest.mark.parametrize("fsync", ["aio", "inline"])
def test_a_half_close_gets_every_reply_it_is_owed(data_dir: Path, fsync: str) -> None:
    """The client sends 300 sets of 1 KiB to a queue that fsyncs, then shuts its side: the
    replies held for the group fsync (through AIO, or on the loop) still all arrive."""
    env = {"TERCEL_NO_AIO": "1"} if fsync == "inline" else None
    with ServerProcess(data_dir, "[queues]\nsync_journal = true\n", env=env) as srv:
        for _ in range(3):
            sock = srv.connect()
            sock.sendall(b"".join(set_cmd("q", b"z" * 1024) for _ in range(300)))
            sock.shutdown(socket.SHUT_WR)
            assert read_all(sock) == b"STORED\r\n" * 300
            sock.close()


def test_quit_after_pipelined_sets_gets_their_replies_first(data_dir: Path) -> None:
    with ServerProcess(data_dir, "[queues]\nsync_journal = true\n") as srv:
        for _ in range(3):
            sock = srv.connect()
            sock.sendall(b"".join(set_cmd("q", b"z" * 1024) for _ in range(300)))
            sock.sendall(b"quit\r\n")
            assert read_all(sock) == b"STORED\r\n" * 300
            sock.close()


def test_a_failed_journal_does_not_stop_open_reads_of_other_queues_from_returning(
    data_dir: Path,
) -> None:
    with ServerProcess(data_dir) as srv:
        setup = Raw(srv.connect())
        setup.call(set_cmd("a", b"a") + set_cmd("b", b"b"), b"STORED\r\n" * 2)
        reader = Raw(srv.connect())
        reader.call(b"get a/open\r\n", b"VALUE a/open 0 1\r\na\r\nEND\r\n")
        reader.call(b"get b/open\r\n", b"VALUE b/open 0 1\r\nb\r\nEND\r\n")
        limit_file_size(srv, 4096)
        writer = srv.connect()
        writer.sendall(set_cmd("a", b"z" * 5000))
        assert read_all(writer) == b""  # a's journal failed: no reply, the connection closes
        writer.close()
        reader.close()  # its open reads go back: b's can, a's journal refuses
        deadline = time.monotonic() + 10
        while stat(setup, b"curr_connections") != 1:
            assert time.monotonic() < deadline, "the closed connection was never let go"
            time.sleep(0.01)
        assert drain(setup, "b") == [b"b"]


def test_huge_numbers_get_a_client_error_not_a_closed_connection(data_dir: Path) -> None:
    with ServerProcess(data_dir) as srv:
        conn = Raw(srv.connect())
        conn.call(b"get q/t=" + b"9" * 400 + b"\r\n", b"CLIENT_ERROR bad timeout\r\n")
        conn.call(b"get q/t=" + b"0" * 400 + b"1\r\n", b"END\r\n")  # leading zeros are free
        conn.call(b"lease q 1 " + b"9" * 30 + b" 1000\r\n", b"CLIENT_ERROR bad wait_ms\r\n")
        conn.call(set_cmd("q", b"still here"), b"STORED\r\n")
