"""Many queues under a low open-file limit, and the limit on the number of queues.

Real servers run under ``ulimit -n`` (soft and hard, so start-up cannot raise it): every queue
used to hold its journal file open, and about the 240th queue of a 256-descriptor server
failed with EMFILE inside a command (the connection closed) and the restart exited 1. Journal
files are now opened on demand from a bounded pool (``max_open_journals``), and ``max_queues``
refuses new queues with ``SERVER_ERROR too many queues``.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from pathlib import Path

from support import Raw, drain, set_cmd, stats
from tercel.testing import FAULTS_ENV, FAULTY_LAUNCHER, ServerProcess

LIMIT = 256
QUEUES = 1100
CRLF = b"\r\n"


def _replies(sock: socket.socket, count: int) -> list[bytes]:
    """The next ``count`` reply lines."""
    sock.settimeout(30)
    buf = b""
    while buf.count(b"\r\n") < count:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {buf.count(CRLF)} replies"
        buf += chunk
    return buf.split(b"\r\n")[:count]


def test_1100_queues_under_a_256_descriptor_limit_store_and_restart(data_dir: Path) -> None:
    names = [f"fq{i:05d}" for i in range(QUEUES)]
    with ServerProcess(data_dir, open_files=LIMIT) as srv:
        sock = srv.connect()
        sock.sendall(b"".join(set_cmd(n, n.encode()) for n in names))
        assert _replies(sock, QUEUES) == [b"STORED"] * QUEUES
        sock.close()
        other = Raw(srv.connect())  # new connections are still served
        other.call(set_cmd("fq00000", b"again"), b"STORED\r\n")
        srv.kill()
        srv.start()  # the restart replays 1,100 journals under the same limit
        conn = Raw(srv.connect())
        for n in names[:: QUEUES // 50]:
            expected = [n.encode(), b"again"] if n == "fq00000" else [n.encode()]
            assert drain(conn, n) == expected
        conn.call(b"get fq01099\r\n", b"VALUE fq01099 0 7\r\nfq01099\r\nEND\r\n")


def test_queues_used_in_turn_beyond_the_pool_keep_every_item(data_dir: Path) -> None:
    """Twice as many queues as journal descriptors, written to round-robin (each write
    reopens a parked file), then read in turn: every item, in order."""
    config = "[server]\nmax_open_journals = 16\n"
    with ServerProcess(data_dir, config, open_files=LIMIT) as srv:
        conn = Raw(srv.connect())
        for rnd in range(5):
            conn.call(
                b"".join(set_cmd(f"r{q}", b"%d" % rnd) for q in range(32)), b"STORED\r\n" * 32
            )
        for q in range(0, 32, 2):
            conn.call(b"get r%d\r\n" % q, b"VALUE r%d 0 1\r\n0\r\nEND\r\n" % q)
        pool = _pool_stats(conn)  # the descriptor pool's figures, in every stats view
        assert pool["limit"] == 16 and 0 < pool["open"] <= 16
        assert pool["evictions"] >= 32 * 5 - 16 and pool["reopens"] >= 32 * 4
        assert pool["emfile"] == pool["refused"] == pool["put_off"] == 0
        doc = json.loads(urllib.request.urlopen(srv.admin_url + "/stats.json").read())
        assert doc["gauges"]["journal_files_limit"] == 16
        assert doc["counters"]["journal_files_evictions"] >= pool["evictions"]
        metrics = urllib.request.urlopen(srv.admin_url + "/metrics").read().decode()
        assert "tercel_journal_files_open " in metrics
        assert "tercel_journal_files_reopens_total " in metrics
        srv.kill()
        srv.start()
        conn = Raw(srv.connect())
        for q in range(32):
            rounds = range(1, 5) if q % 2 == 0 else range(5)
            assert drain(conn, f"r{q}") == [b"%d" % r for r in rounds]


def test_max_queues_refuses_a_new_queue_and_restart_loads_them_all(data_dir: Path) -> None:
    with ServerProcess(data_dir) as srv:
        Raw(srv.connect()).call(
            b"".join(set_cmd(f"q{i}", b"x") for i in range(4)), b"STORED\r\n" * 4
        )
    with ServerProcess(data_dir, "[server]\nmax_queues = 3\n") as srv:
        conn = Raw(srv.connect())  # the four on disk are loaded, beyond the limit
        conn.call(set_cmd("q3", b"y"), b"STORED\r\n")
        conn.call(set_cmd("new", b"z"), b"SERVER_ERROR too many queues\r\n")
        conn.call(b"get other\r\n", b"SERVER_ERROR too many queues\r\n")
        conn.call(b"delete q0\r\n", b"DELETED\r\n")
        conn.call(b"delete q1\r\n", b"DELETED\r\n")
        conn.call(set_cmd("new", b"z"), b"STORED\r\n")  # room again: 3 queues
        conn.call(b"get new\r\n", b"VALUE new 0 1\r\nz\r\nEND\r\n")


def test_connections_that_use_every_descriptor_refuse_nothing_else_for_good(
    data_dir: Path,
) -> None:
    """More connections than descriptors: the server neither crashes nor stops for good.
    Requests on accepted connections get a reply (a new queue may be refused with
    ``SERVER_ERROR too many open files``); once connections close, new ones are served again,
    and the log holds no traceback."""
    config = "[server]\nmax_open_journals = 4\nadmin_port = false\n"  # no admin listener
    with ServerProcess(data_dir, config, open_files=64, admin_port=None) as srv:
        first = Raw(srv.connect())
        first.call(set_cmd("kept", b"0"), b"STORED\r\n")
        socks = [srv.connect() for _ in range(100)]  # the kernel queues what is not accepted
        first.call(set_cmd("kept", b"1"), b"STORED\r\n")  # a file reopened from the pool
        replies = set()
        for i in range(20):
            first.send(set_cmd(f"new{i}", b"x"))
            replies.add(first.read_line())
        assert replies <= {b"STORED\r\n", b"SERVER_ERROR too many open files\r\n"}
        pool = _pool_stats(first)  # a refusal shows in the pool's stats
        # (How many opens met EMFILE depends on how many connections the loop had accepted.)
        assert pool["open"] <= 4 and pool["emfile"] >= pool["refused"]
        assert pool["refused"] >= (b"SERVER_ERROR too many open files\r\n" in replies)
        for s in socks:
            s.close()
        # Out of descriptors, the loop accepts and closes at once what waits in the backlog
        # (libuv's answer to EMFILE); once the server has seen these closes, it serves again.
        deadline = time.monotonic() + 30
        while not _served(srv):
            assert time.monotonic() < deadline, "the server never accepted again"
            time.sleep(0.05)
        first.call(set_cmd("late", b"y"), b"STORED\r\n")
        assert drain(first, "kept") == [b"0", b"1"]
        assert "Traceback" not in srv.log()


def test_a_parked_queue_out_of_descriptors_refuses_those_requests_and_works_again(
    data_dir: Path,
) -> None:
    """A queue whose journal file the pool parked, and no descriptor to reopen it (EMFILE
    through the file seam, lifted by creating the queue ``release``): its set and get are
    refused with ``SERVER_ERROR too many open files``, the connection stays, the refused item
    is not stored, and the queue takes items again once descriptors are there; a restart
    finds exactly the acknowledged ones. Before: the set was taken into memory, its write
    could not reopen the file, the connection was closed without a reply, and the journal
    refused every later write until a restart ("open failed", ``bench/soak.py --emfile``)."""
    rule = {"kind": "fail", "op": "open", "errno": "EMFILE", "path": "/victim", "skip": 1}
    rule["until"] = ["open", "/release"]  # skip: the queue's first open, as it is created
    config = "[server]\nmax_open_journals = 2\n"
    env = {FAULTS_ENV: json.dumps([rule])}
    with ServerProcess(data_dir, config, launcher=FAULTY_LAUNCHER, env=env) as srv:
        conn = Raw(srv.connect())
        conn.call(set_cmd("victim", b"first"), b"STORED\r\n")
        for other in ("other1", "other2"):  # a pool of two: victim's file is parked
            conn.call(set_cmd(other, b"x"), b"STORED\r\n")
        refused = b"SERVER_ERROR too many open files\r\n"
        conn.call(set_cmd("victim", b"refused"), refused)
        conn.call(b"get victim\r\n", refused)
        conn.call(set_cmd("other1", b"y"), b"STORED\r\n")  # other queues go on
        conn.call(set_cmd("release", b"x"), b"STORED\r\n")
        conn.call(set_cmd("victim", b"later"), b"STORED\r\n")
        assert _pool_stats(conn)["refused"] >= 2
        srv.kill()
        srv.env = {}
        srv.start()
        assert drain(Raw(srv.connect()), "victim") == [b"first", b"later"]
        assert "Traceback" not in srv.log()


def _pool_stats(conn: Raw) -> dict[str, int]:
    """The ``journal_files_*`` lines of ``stats``, without the prefix."""
    prefix = "journal_files_"
    return {k.removeprefix(prefix): int(v) for k, v in stats(conn).items() if k.startswith(prefix)}


def _served(srv: ServerProcess) -> bool:
    """One new connection gets its ``version`` answered."""
    try:
        with srv.connect() as sock:
            sock.settimeout(5)
            sock.sendall(b"version\r\n")
            return sock.recv(100).startswith(b"VERSION ")
    except OSError:
        return False
