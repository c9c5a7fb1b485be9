"""One queue's replay, however long, never holds the other commands (issue 24).

A queue with a big journal and no checkpoint (a data dir from before checkpoints) replays in
the background a step (a MiB of journal) at a time: between two steps the server answers
``stats`` and commands on other queues, ``stats`` lists the queue with ``replaying 1`` and
the items read so far, a command on that queue (memcache) waits for its replay while the
other connections are served, and a kill -9 in the middle of it loses nothing.

The replay is made slow through the journal's fault seam (every read of that queue's files
waits), so that it is still going on while the test talks to the server; nothing here
measures time: the assertions are on what ``stats`` says when the other replies arrive.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from support import Raw, drain, set_cmd, stats
from tercel.testing import ServerProcess

REPO = Path(__file__).resolve().parents[2]
BIG = "backlog"
N = 12_000
"""Items of 1 KiB: about 12 MiB of journal, a dozen steps of replay."""
SLOW = [{"kind": "slow", "op": "pread", "seconds": 0.4, "path": f"/{BIG}"}]
"""0.4 s per read of the big queue's files: its replay takes 5 s or more, far longer than
the test needs to ask its questions."""


def item(i: int) -> bytes:
    return b"%05d" % i + b"x" * 1019


def slow_server(data_dir: Path) -> ServerProcess:
    return ServerProcess(
        data_dir,
        "[server]\nadmin_port = false\n",  # it would listen only after about a second
        log_level="info",
        launcher=(sys.executable, str(REPO / "bench" / "faulty_serve.py")),
        env={"TERCEL_SOAK_FAULTS": json.dumps(SLOW)},
        admin_port=None,
    )


def fill(data_dir: Path) -> None:
    """The big queue and a small one, then no checkpoint: every record is replayed."""
    with ServerProcess(data_dir) as srv:
        conn = Raw(srv.connect())
        for start in range(0, N, 500):
            batch = b"".join(set_cmd(BIG, item(i)) for i in range(start, start + 500))
            conn.call(batch, b"STORED\r\n" * 500)
        conn.call(set_cmd("other", b"o1"), b"STORED\r\n")
        conn.close()
    for path in data_dir.glob("*.checkpoint"):
        path.unlink()


def get(conn: Raw, queue: str) -> bytes | None:
    conn.send(f"get {queue}\r\n".encode())
    line = conn.read_line()
    if line == b"END\r\n":
        return None
    data = conn.read_exact(int(line.split()[3]))
    conn.expect(b"\r\nEND\r\n")
    return data


def half_replayed(conn: Raw) -> dict[str, str]:
    """``stats`` once the big queue's replay has read some of its items and not all: each
    ``stats`` is answered between two steps of that replay."""
    for _ in range(100_000):
        st = stats(conn)
        assert st[f"queue_{BIG}_replaying"] == "1", "the replay ended before the test looked"
        if int(st[f"queue_{BIG}_items"]) > 0:
            return st
    raise AssertionError("the big queue's replay never began")


def test_other_queues_are_served_in_the_middle_of_a_long_replay(data_dir: Path) -> None:
    fill(data_dir)
    srv = slow_server(data_dir).start()
    try:
        conn = Raw(srv.connect())
        st = half_replayed(conn)
        assert 0 < int(st[f"queue_{BIG}_items"]) < N
        assert int(st["queues_replaying"]) >= 1
        # Another queue: replayed at its first reference, read and written...
        assert get(conn, "other") == b"o1"
        conn.call(set_cmd("other", b"o2"), b"STORED\r\n")
        conn.call(set_cmd("fresh", b"f"), b"STORED\r\n")
        # ... while the big one is still half replayed.
        st = stats(conn)
        assert st[f"queue_{BIG}_replaying"] == "1"
        assert 0 < int(st[f"queue_{BIG}_items"]) < N
        assert st["queue_other_items"] == "1" and "queue_other_replaying" not in st
        assert st["queues_replaying"] == "1"
        conn.close()
    finally:
        srv.kill()  # in the middle of the big queue's replay
    with ServerProcess(data_dir) as srv:
        conn = Raw(srv.connect())
        assert drain(conn, BIG) == [item(i) for i in range(N)]
        assert drain(conn, "other") == [b"o2"]
        assert drain(conn, "fresh") == [b"f"]
        conn.close()


def test_a_command_on_the_half_replayed_queue_waits_for_it_alone(data_dir: Path) -> None:
    fill(data_dir)
    srv = slow_server(data_dir).start()
    try:
        waiting, other = Raw(srv.connect()), Raw(srv.connect())
        half_replayed(other)
        waiting.send(f"get {BIG}\r\n".encode())  # waits for the rest of the replay...
        assert get(other, "other") == b"o1"  # ... while other connections are served
        st = stats(other)
        assert st[f"queue_{BIG}_replaying"] == "1"  # (so the get above has no answer yet)
        line = waiting.read_line()
        assert line.startswith(f"VALUE {BIG} ".encode())
        assert waiting.read_exact(int(line.split()[3])) == item(0)
        waiting.expect(b"\r\nEND\r\n")
        st = stats(other)
        assert st[f"queue_{BIG}_items"] == str(N - 1)
        assert f"queue_{BIG}_replaying" not in st
        waiting.close()
        other.close()
    except BaseException:
        srv.kill()
        raise
    assert srv.stop() == 0
    with ServerProcess(data_dir) as srv:
        conn = Raw(srv.connect())
        assert drain(conn, BIG) == [item(i) for i in range(1, N)]
        conn.close()
