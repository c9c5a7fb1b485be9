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
import urllib.request
from pathlib import Path

from support import Raw, drain, set_cmd, stats
from tercel.clock import SystemClock
from tercel.config import ServerConfig
from tercel.storage import open_queue
from tercel.testing import ServerProcess

REPO = Path(__file__).resolve().parents[2]
BIG = "backlog"
N = 12_000
"""Items of 1 KiB: about 12 MiB of journal, a dozen steps of replay."""
SLOW_READ_S = 0.4
"""Seconds per read of the big queue's files: its replay takes 5 s or more, far longer than
the test needs to ask its questions (more with the admin listener, which starts only once
the replay is done or a second has passed)."""


def item(i: int) -> bytes:
    return b"%05d" % i + b"x" * 1019


def slow_server(data_dir: Path, admin: bool = False) -> ServerProcess:
    """The server with the big queue's reads slowed; without ``admin`` no admin listener."""
    slow = [{"kind": "slow", "op": "pread", "seconds": SLOW_READ_S, "path": f"/{BIG}"}]
    return ServerProcess(
        data_dir,
        None if admin else "[server]\nadmin_port = false\n",
        log_level="info",
        launcher=(sys.executable, str(REPO / "bench" / "faulty_serve.py")),
        env={"TERCEL_SOAK_FAULTS": json.dumps(slow)},
        admin_port=0 if admin else None,
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


def test_the_admin_port_lists_the_queue_being_replayed(data_dir: Path) -> None:
    """The admin listener and each HTTP request take several loop passes, each after a step
    of the replay: a bigger journal (written in-process) keeps it going long enough."""
    items = 8 * N
    data_dir.mkdir(parents=True, exist_ok=True)
    q = open_queue(str(data_dir), BIG, ServerConfig().queue_config(BIG), SystemClock())
    q.replay()
    for i in range(items):
        q.add(item(i))
    q.close()
    (data_dir / f"{BIG}.checkpoint").unlink()
    srv = slow_server(data_dir, admin=True).start()
    try:
        conn = Raw(srv.connect())
        half_replayed(conn)
        with urllib.request.urlopen(srv.admin_url + "/stats.json", timeout=60) as resp:
            gauges = json.load(resp)["gauges"]
        with urllib.request.urlopen(srv.admin_url + "/metrics", timeout=60) as resp:
            metrics = resp.read().decode()
        assert stats(conn)[f"queue_{BIG}_replaying"] == "1"  # still, after both answers
        assert gauges[f"q/{BIG}/replaying"] == 1
        assert 0 < gauges[f"q/{BIG}/items"] < items
        assert f'tercel_replaying{{queue="{BIG}"}} 1.0' in metrics
        conn.close()
    finally:
        srv.kill()
