"""Start-up replays the queues on disk in the background (issue 24): the server serves at
once, a command on a queue not replayed yet replays that queue first, the others are
answered between two queues' replays, ``stats`` says how many are left, and a kill -9 in the
middle of it loses nothing.

The background replay is made slow through the journal's fault seam (every read of a
journal's head waits), so that it is still going on while the test talks to the server;
nothing here measures time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from support import Raw, drain, set_cmd
from tercel import __version__
from tercel.testing import ServerProcess

REPO = Path(__file__).resolve().parents[2]
QUEUES = [f"q{i:02d}" for i in range(40)]
SLOW_HEADS = [{"kind": "slow", "op": "pread", "seconds": 0.3}]
"""0.3 s per journal head read: the 40 queues take 12 s or more to replay in the
background, far longer than the test needs to ask its questions."""


def slow_server(data_dir: Path) -> ServerProcess:
    return ServerProcess(
        data_dir,
        log_level="info",
        launcher=(sys.executable, str(REPO / "bench" / "faulty_serve.py")),
        env={"TERCEL_SOAK_FAULTS": json.dumps(SLOW_HEADS)},
    )


def stats(conn: Raw) -> dict[str, str]:
    conn.send(b"stats\r\n")
    out = {}
    while (line := conn.read_line()) != b"END\r\n":
        _, key, value = line.decode().split()
        out[key] = value
    return out


def get(conn: Raw, queue: str) -> bytes | None:
    conn.send(f"get {queue}\r\n".encode())
    line = conn.read_line()
    if line == b"END\r\n":
        return None
    data = conn.read_exact(int(line.split()[3]))
    conn.expect(b"\r\nEND\r\n")
    return data


def fill(data_dir: Path) -> None:
    with ServerProcess(data_dir) as srv:
        conn = Raw(srv.connect())
        for name in QUEUES:
            conn.call(set_cmd(name, b"1") + set_cmd(name, b"2"), b"STORED\r\n" * 2)
        conn.close()


def test_the_server_answers_while_queues_replay_in_the_background(data_dir: Path) -> None:
    fill(data_dir)
    srv = slow_server(data_dir).start()
    try:
        conn = Raw(srv.connect())
        conn.call(b"version\r\n", f"VERSION {__version__}\r\n".encode())
        left = int(stats(conn)["queues_replaying"])
        assert 0 < left <= len(QUEUES)
        # The last queue in replay order is replayed first, for this get, alone.
        assert get(conn, QUEUES[-1]) == b"1"
        after = stats(conn)
        assert 0 < int(after["queues_replaying"]) < left
        assert f"queue_{QUEUES[-1]}_items" in after
        # A new queue is served meanwhile; so is a queue already replayed.
        conn.call(set_cmd("fresh", b"x"), b"STORED\r\n")
        assert get(conn, "fresh") == b"x"
        assert get(conn, QUEUES[-1]) == b"2"
        conn.close()
    finally:
        srv.kill()  # in the middle of the background replay
    with ServerProcess(data_dir, log_level="info") as srv:
        conn = Raw(srv.connect())
        for name in QUEUES[:-1]:
            assert drain(conn, name) == [b"1", b"2"], name
        assert drain(conn, QUEUES[-1]) == []
        assert drain(conn, "fresh") == []
        assert stats(conn)["queues_replaying"] == "0"
        conn.close()


def test_a_clean_stop_during_the_background_replay_keeps_every_queue(data_dir: Path) -> None:
    fill(data_dir)
    srv = slow_server(data_dir).start()
    try:
        conn = Raw(srv.connect())
        assert int(stats(conn)["queues_replaying"]) > 0
        conn.close()
    except BaseException:
        srv.kill()
        raise
    assert srv.stop() == 0  # SIGTERM: the queues not replayed stay as they are on disk
    with ServerProcess(data_dir) as srv:
        conn = Raw(srv.connect())
        for name in QUEUES:
            assert drain(conn, name) == [b"1", b"2"], name
        conn.close()
