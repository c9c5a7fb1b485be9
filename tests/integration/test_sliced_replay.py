"""One queue's replay, however long, never holds the other commands (issue 24).

A queue with a big journal and no checkpoint (a data dir from before checkpoints) replays in
the background a step (a MiB of journal) at a time: between two steps the server answers
``stats`` and commands on other queues, ``stats`` lists the queue with ``replaying 1`` and
the items read so far, a command on that queue (memcache) waits for its replay while the
other connections are served, and a kill -9 in the middle of it loses nothing. The same
holds on the Kestrel text and Thrift front ends (a real thriftpy2 client), for a memcache
``set`` through an alias to that queue and for ``flush_all`` (they wait for it), and
``dump_stats <queue>`` answers at once with what was read so far.

The replay is made slow through the journal's fault seam (every read of that queue's files
waits), so that it is still going on while the test talks to the server; nothing here
measures time: the assertions are on what ``stats`` says when the other replies arrive.
"""

from __future__ import annotations

import json
import socket
import threading
import urllib.request
from pathlib import Path
from typing import Any

import thriftpy2

from support import Raw, set_cmd, stats, text_connection, thrift_client
from tercel.clock import SystemClock
from tercel.config import ServerConfig
from tercel.protocol.thrift import IDL_PATH
from tercel.storage import open_queue
from tercel.testing import FAULTS_ENV, FAULTY_LAUNCHER, ServerProcess

BIG = "backlog"
N = 12_000
"""Items of 1 KiB: about 12 MiB of journal, a dozen steps of replay."""
SLOW_READ_S = 0.4
"""Seconds per read of the big queue's files: its replay takes 5 s or more, far longer than
the test needs to ask its questions (more with the admin listener, which starts only once
the replay is done or a second has passed)."""
LONG = 3 * N
LONG_READ_S = 0.2
"""The tests that talk to every front end ask more questions, each answered between two steps
of the replay: three times the steps (about 36), each half as slow (the replay takes 7 s or
more)."""


def item(i: int) -> bytes:
    return b"%05d" % i + b"x" * 1019


def items(n: int) -> list[bytes]:
    """The items the big queue was filled with (:func:`fill` with ``n``)."""
    return [item(i) for i in range(n)]


IDL = thriftpy2.load(IDL_PATH, module_name="sliced_replay_kestrel_thrift")
PORTS = ("--thrift-port", "0", "--text-port", "0")


def slow_server(
    data_dir: Path, admin: bool = False, config: str = "", seconds: float = SLOW_READ_S
) -> ServerProcess:
    """The server with the big queue's reads slowed (``seconds`` each), its text and Thrift
    ports open; without ``admin`` no admin listener."""
    slow = [{"kind": "slow", "op": "pread", "seconds": seconds, "path": f"/{BIG}"}]
    return ServerProcess(
        data_dir,
        config if admin else "[server]\nadmin_port = false\n" + config,
        log_level="info",
        launcher=FAULTY_LAUNCHER,
        env={FAULTS_ENV: json.dumps(slow)},
        admin_port=0 if admin else None,
        extra_args=PORTS,
    )


def fill(data_dir: Path, n: int = N) -> None:
    """The big queue (``n`` items) and a small one, then no checkpoint: every record is
    replayed."""
    with ServerProcess(data_dir) as srv:
        conn = Raw(srv.connect())
        for start in range(0, n, 500):
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
    assert restarted(data_dir, BIG, "other", "fresh") == [items(N), [b"o2"], [b"f"]]


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
    assert restarted(data_dir, BIG) == [items(N)[1:]]


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


# ---- every front end: a command on the queue being replayed waits, the others do not ------


def read_by_server(conn: Raw, before: int, sent: int) -> None:
    """Ask ``stats`` on ``conn`` until the server has read ``sent`` bytes more from other
    connections than ``bytes_read`` was at ``before`` (each ``stats`` request counts its own 7
    bytes), checking each time that the big queue is still half replayed: whatever waits for
    it was read, and did not hold this connection's commands."""
    for asked in range(1, 100_000):
        st = stats(conn)
        assert st[f"queue_{BIG}_replaying"] == "1", "the replay ended before the test looked"
        if int(st["bytes_read"]) - before - 7 * asked >= sent:
            return
    raise AssertionError("the server never read the request")


def still_replaying(conn: Raw) -> None:
    st = stats(conn)
    assert st[f"queue_{BIG}_replaying"] == "1"  # (so what waits for it has no answer yet)
    assert 0 < int(st[f"queue_{BIG}_items"]) < LONG


def restarted(data_dir: Path, *queues: str) -> list[list[bytes]]:
    """Every item left in each of ``queues`` after a plain restart on ``data_dir``, taken."""
    with ServerProcess(data_dir) as srv:
        conn = Raw(srv.connect())
        left = [contents(conn, queue) for queue in queues]
        conn.close()
    return left


def contents(conn: Raw, queue: str) -> list[bytes]:
    """Every item left in ``queue``, in order: :func:`drain` with 500 gets per round trip."""
    out: list[bytes] = []
    while True:
        conn.send(f"get {queue}\r\n".encode() * 500)
        empty = False
        for _ in range(500):
            line = conn.read_line()
            if line == b"END\r\n":
                empty = True
                continue
            out.append(conn.read_exact(int(line.split()[3])))
            conn.expect(b"\r\nEND\r\n")
        if empty:
            return out


def thrift(srv: ServerProcess) -> Any:
    return thrift_client(IDL, srv.ports["thrift"], 60_000)


def test_a_text_command_on_the_half_replayed_queue_waits_for_it_alone(data_dir: Path) -> None:
    """Pipelined behind the waiting ``get``, a ``peek`` of another queue is answered after it,
    in order, although the client half-closed after sending them; other text connections are
    served meanwhile."""
    fill(data_dir, LONG)
    srv = slow_server(data_dir, seconds=LONG_READ_S).start()
    try:
        mc = Raw(srv.connect())
        waiting, other = (text_connection(srv.ports["text"], 60) for _ in range(2))
        before = int(half_replayed(mc)["bytes_read"])
        request = f"get {BIG}\npeek other\n".encode()
        waiting.send(request)  # the get waits for the rest of the replay, the peek behind it
        waiting.sock.shutdown(socket.SHUT_WR)
        read_by_server(mc, before, len(request))
        other.send(b"peek other\nput fresh:\nf\n\nget fresh\n")  # ... while these are served
        assert [other.line() for _ in range(3)] == [b":o1", b"+1", b":f"]
        still_replaying(mc)
        assert waiting.line() == b":" + item(0)  # an open read
        assert waiting.line() == b":o1"
        assert waiting.sock.recv(1) == b""  # then the server closed (the read comes back)
        assert f"queue_{BIG}_replaying" not in stats(mc)
    finally:
        srv.kill()  # the open read of "fresh" comes back at the restart
    assert restarted(data_dir, BIG, "other", "fresh") == [items(LONG), [b"o1"], [b"f"]]


def test_a_thrift_call_on_the_half_replayed_queue_waits_for_it_alone(data_dir: Path) -> None:
    """A kill -9 while the call waits loses nothing: it never ran."""
    fill(data_dir, LONG)
    srv = slow_server(data_dir, seconds=LONG_READ_S).start()
    answers: list[Any] = []
    failures: list[Exception] = []
    try:
        mc = Raw(srv.connect())
        waiting, other = thrift(srv), thrift(srv)
        before = int(half_replayed(mc)["bytes_read"])

        def get() -> None:
            try:
                answers.append(waiting.get(BIG, 1, 0, 0))
            except Exception as exc:  # the kill -9 below: the call is never answered
                failures.append(exc)

        call = threading.Thread(target=get)
        call.start()  # waits for the rest of the replay...
        read_by_server(mc, before, 1)
        assert [i.data for i in other.get("other", 5, 0, 0)] == [b"o1"]  # ... while these
        assert other.put("other", [b"o2", b"o3"], 0) == 2  # are served
        assert other.peek("other").items == 2
        still_replaying(mc)
    finally:
        srv.kill()  # in the middle of the big queue's replay, the get unanswered
    call.join(60)
    assert not call.is_alive() and answers == [] and len(failures) == 1
    assert restarted(data_dir, BIG, "other") == [items(LONG), [b"o2", b"o3"]]


def test_an_alias_set_and_flush_all_wait_and_dump_stats_does_not(data_dir: Path) -> None:
    """A ``set`` through an alias to the queue being replayed and a ``flush_all`` wait for
    it (in the order they came), ``dump_stats <queue>`` lists it as replaying, and other
    commands are served meanwhile."""
    fill(data_dir, LONG)
    config = f'[aliases]\nal = ["{BIG}"]\n'
    srv = slow_server(data_dir, config=config, seconds=LONG_READ_S).start()
    try:
        mc = Raw(srv.connect())
        setter, flusher, other = Raw(srv.connect(60)), Raw(srv.connect(60)), Raw(srv.connect())
        before = int(half_replayed(mc)["bytes_read"])
        request = set_cmd("al", b"A") + b"get other\r\n"
        setter.send(request)  # waits for the big queue, the get behind it
        read_by_server(mc, before, len(request))
        before = int(stats(mc)["bytes_read"])
        flusher.send(b"flush_all\r\n")
        read_by_server(mc, before, len(b"flush_all\r\n"))
        mc.send(f"dump_stats {BIG}\r\n".encode())
        assert mc.read_line() == f"queue '{BIG}' {{\r\n".encode()
        block = []
        while (line := mc.read_line()) != b"}\r\n":
            block.append(line.decode().strip())
        mc.expect(b"END\r\n")
        assert "replaying=1" in block
        other.call(set_cmd("fresh", b"f"), b"STORED\r\n")
        still_replaying(mc)
        setter.expect(b"STORED\r\n")  # the set, then the get behind it, then flush_all
        line = setter.read_line()
        assert line.startswith(b"VALUE other ")
        setter.read_exact(int(line.split()[3]))
        setter.expect(b"\r\nEND\r\n")
        flusher.expect(b"OK\r\n")
        st = stats(mc)
        assert st[f"queue_{BIG}_items"] == "0" and st["queue_fresh_items"] == "0"
    except BaseException:
        srv.kill()
        raise
    assert srv.stop() == 0
    assert restarted(data_dir, BIG, "other", "fresh") == [[], [], []]


def test_a_dashboard_flush_of_the_half_replayed_queue_waits_for_it(data_dir: Path) -> None:
    """The admin port's flush of the queue being replayed waits for its replay, which goes on
    in steps meanwhile: ``stats`` sees it near its end, not done in one go when the flush
    came (as it was when the flush replayed the rest on the loop)."""
    fill(data_dir, LONG)
    srv = slow_server(data_dir, admin=True, seconds=LONG_READ_S).start()
    try:
        mc = Raw(srv.connect())
        half_replayed(mc)
        answers: list[int] = []
        url = srv.admin_url + f"/queues/{BIG}/flush"
        post = urllib.request.Request(url, method="POST")

        def flush() -> None:
            with urllib.request.urlopen(post, timeout=60) as resp:
                answers.append(resp.status)

        call = threading.Thread(target=flush)
        call.start()
        last = 0
        while (st := stats(mc)).get(f"queue_{BIG}_replaying") == "1":
            last = int(st[f"queue_{BIG}_items"])
        assert last > LONG - 3000  # the last steps seen (a step is about 1,000 items)
        call.join(60)
        assert answers == [200]
        assert stats(mc)[f"queue_{BIG}_items"] == "0"
        mc.close()
    finally:
        srv.kill()
