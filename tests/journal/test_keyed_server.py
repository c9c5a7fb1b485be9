"""A real server on a data dir that holds keyed leases: its start keeps their lease files and
takes their items off the head (KEY_TAKE), a SIGKILL (and a clean stop) leaves them as they
were, and the items behind them are served as usual (docs/journal_format.md §18)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from tercel.clock import ManualClock
from tercel.config import QueueConfig
from tercel.core.queue import PersistentQueue
from tercel.journal import FileJournal
from tercel.testing import ServerProcess

T0 = 1_700_000_000_000


def open_q(data: Path) -> PersistentQueue:
    q = PersistentQueue("q", QueueConfig(), FileJournal(str(data), "q"), ManualClock(T0))
    q.replay()
    return q


def get(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(request)
        buf = b""
        while not buf.endswith((b"END\r\n", b"STORED\r\n")):
            chunk = s.recv(65536)
            assert chunk, buf
            buf += chunk
        return buf


def test_a_server_killed_with_keyed_leases_open_keeps_them(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    q = open_q(data)
    for i in range(10):
        q.add(b"item-%d" % i, now=T0)
    q.take_keyed("batch.1", 4, 0, T0)  # items 1-4
    q.take_keyed("batch.2", 2, 0, T0)  # items 5, 6
    q.ack_keyed("batch.2")
    q.close()
    srv = ServerProcess(str(data)).start()
    try:
        assert get(srv.port, b"get q\r\n") == b"VALUE q 0 6\r\nitem-6\r\nEND\r\n"
        assert get(srv.port, b"set q 0 0 5\r\nlater\r\n").endswith(b"STORED\r\n")
    finally:
        srv.kill()
    srv = ServerProcess(str(data)).start()  # a start, a stop: nothing of the keys changes
    try:
        assert get(srv.port, b"get q/peek\r\n") == b"VALUE q/peek 0 6\r\nitem-7\r\nEND\r\n"
    finally:
        assert srv.stop() == 0
    assert sorted(e for e in os.listdir(data) if ".key." in e) == ["q.key.1"]
    q = open_q(data)
    part = q.keyed_slice("batch.1", 0, 4)
    assert list(part.item_ids) == [1, 2, 3, 4] and bytes(part.data) == b"item-0item-1item-2item-3"
    assert [i.data for i in q.items_in_memory()] == [b"item-7", b"item-8", b"item-9", b"later"]
    q.close()
