"""A journal that cannot be written, and connections that close while replies are held.

Real servers; a journal write is made to fail by lowering the server's file size limit
(``RLIMIT_FSIZE`` through ``prlimit``: the write gets EFBIG, as on a full disk). The rule
under test is the project's first one: a reply that acknowledges a record is sent only if the
record is in the journal, so after a restart every acknowledged item is there.
"""

from __future__ import annotations

import resource
import socket
import struct
import time
from pathlib import Path

import pytest

from support import Raw, drain, set_cmd
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


BATCH_CONFIG = '[queues]\nmax_journal_size = "1K"\nmax_journal_size_absolute = "2K"\n'


def _kept_after_restart(srv: ServerProcess, q: str) -> list[bytes]:
    srv.kill()
    srv.start()
    return drain(Raw(srv.connect()), q)


@pytest.mark.parametrize("protocol", ["text", "thrift"])
def test_a_batch_put_that_meets_a_write_failure_keeps_none_of_it_and_says_nothing(
    data_dir: Path, protocol: str
) -> None:
    """A text or Thrift ``put`` of 40 items whose journal write fails part way (the file size
    limit). No count is sent that overstates what is kept: the connection closes without a
    reply (the pass's held replies are dropped, journal_format.md §8). The batch is all or
    nothing: no rotation runs inside it (one that did would write the first items out and
    leave a prefix), so its items reach the journal in one write, which is cut
    back whole. After a restart the items stored before are there, none of the batch's
    (docs/protocol.md, "A put that meets a journal failure")."""
    items = [b"%02d" % i + b"x" * 298 for i in range(40)]
    ports = ("--text-port", "0", "--thrift-port", "0")
    with ServerProcess(data_dir, BATCH_CONFIG, extra_args=ports) as srv:
        before = [b"before %d" % i for i in range(3)]
        Raw(srv.connect()).call(b"".join(set_cmd("q", d) for d in before), b"STORED\r\n" * 3)
        limit_file_size(srv, 6000)
        sock = socket.create_connection(("127.0.0.1", srv.ports[protocol]), timeout=10)
        if protocol == "text":
            sock.sendall(b"put q:\n" + b"".join(item + b"\n" for item in items) + b"\n")
        else:
            sock.sendall(_thrift_put_frame("q", items))
        reply = read_all(sock)
        sock.close()
        kept = _kept_after_restart(srv, "q")
    assert reply == b""  # no count at all, rather than a count of what was not kept
    assert kept == before


def _thrift_put_frame(queue: str, items: list[bytes]) -> bytes:
    """A framed binary ``put(queue, items, 0)`` call (seqid 1)."""
    name = b"put"
    body = struct.pack("!iI", -0x7FFEFFFF - 1 | 1, len(name)) + name + struct.pack("!i", 1)
    q = queue.encode()
    body += b"\x0b\x00\x01" + struct.pack("!I", len(q)) + q  # 1: string queue_name
    body += b"\x0f\x00\x02\x0b" + struct.pack("!i", len(items))  # 2: list<binary> items
    body += b"".join(struct.pack("!I", len(item)) + item for item in items)
    body += b"\x08\x00\x03" + struct.pack("!i", 0) + b"\x00"  # 3: i32 expiration, stop
    return struct.pack("!i", len(body)) + body
