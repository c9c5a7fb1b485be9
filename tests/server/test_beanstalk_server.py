"""The beanstalkd front end end to end: ``tercel beanstalkd`` and ``tercel serve
--beanstalk-port`` as subprocesses, raw sockets byte for byte, real clients unmodified, kill -9
and restart, disconnects. Replies were checked against Debian's beanstalkd 1.12."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiostalk
import beanstalkc
import greenstalk
import pystalk
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

import support
import tercel
from tercel import exit_codes
from tercel.journal.joblog import HEADER
from tercel.testing import BeanstalkdProcess, ServerProcess, ServerStartError


@pytest.fixture
def bsd(tmp_path: Path) -> Iterator[BeanstalkdProcess]:
    with BeanstalkdProcess(tmp_path / "wal") as proc:
        yield proc


class Raw(support.Raw):
    """A raw beanstalkd connection that reads exactly the replies it expects (closed after
    the test by conftest's ``track``)."""

    def __init__(self, port: int) -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().__init__(sock)

    def read(self, n: int) -> bytes:
        return self.read_exact(n)

    def line(self) -> bytes:
        return self.read_line()[:-2]

    def yaml(self, cmd: bytes) -> dict[str, str]:
        self.send(cmd)
        head = self.line()
        assert head.startswith(b"OK "), head
        body = self.read(int(head[3:]) + 2)[:-2].decode()
        return dict(ln.split(": ", 1) for ln in body.splitlines()[1:])


def test_transcript_byte_for_byte(bsd: BeanstalkdProcess) -> None:
    c = Raw(bsd.port)
    script = [
        (b"use t.x/(a);b$\r\n", b"USING t.x/(a);b$\r\n"),
        (b"put 5 0 10 3\r\nabc\r\n", b"INSERTED 1\r\n"),
        (b"put 1 0 10 0\r\n\r\n", b"INSERTED 2\r\n"),
        (b"peek-ready\r\n", b"FOUND 2 0\r\n\r\n"),
        (b"watch t.x/(a);b$\r\n", b"WATCHING 2\r\n"),
        (b"ignore default\r\n", b"WATCHING 1\r\n"),
        (b"ignore t.x/(a);b$\r\n", b"NOT_IGNORED\r\n"),
        (b"reserve-with-timeout 0\r\n", b"RESERVED 2 0\r\n\r\n"),
        (b"reserve\r\n", b"RESERVED 1 3\r\nabc\r\n"),
        (b"reserve-with-timeout 0\r\n", b"TIMED_OUT\r\n"),
        (b"release 1 7 0\r\n", b"RELEASED\r\n"),
        (b"bury 2 3\r\n", b"BURIED\r\n"),
        (b"peek-buried\r\n", b"FOUND 2 0\r\n\r\n"),
        (b"kick 10\r\n", b"KICKED 1\r\n"),
        (b"kick-job 2\r\n", b"NOT_FOUND\r\n"),
        (b"reserve-job 1\r\n", b"RESERVED 1 3\r\nabc\r\n"),
        (b"touch 1\r\n", b"TOUCHED\r\n"),
        (b"touch 2\r\n", b"NOT_FOUND\r\n"),
        (b"delete 1\r\n", b"DELETED\r\n"),
        (b"delete 1\r\n", b"NOT_FOUND\r\n"),
        (b"peek 2\r\n", b"FOUND 2 0\r\n\r\n"),
        (b"list-tube-used\r\n", b"USING t.x/(a);b$\r\n"),
        (b"list-tubes-watched\r\n", b"OK 17\r\n---\n- t.x/(a);b$\n\r\n"),
        (b"list-tubes\r\n", b"OK 27\r\n---\n- default\n- t.x/(a);b$\n\r\n"),
        (b"pause-tube nope 1\r\n", b"NOT_FOUND\r\n"),
        (b"pause-tube default 1\r\n", b"PAUSED\r\n"),
        (b"stats-tube nope\r\n", b"NOT_FOUND\r\n"),
        (b"put 0 0 1 2\r\nabXY", b"EXPECTED_CRLF\r\n"),
        (b"put 0 0 1 65536\r\n" + b"a" * 65538, b"JOB_TOO_BIG\r\n"),
        (b"put 0 0 1 1 \r\nx\r\n", b"BAD_FORMAT\r\nUNKNOWN_COMMAND\r\n"),
        (b"x" * 300 + b"\r\n", b"BAD_FORMAT\r\n"),
        (b"stats\n\r\n", b"BAD_FORMAT\r\n"),
        (b"\r\n", b"UNKNOWN_COMMAND\r\n"),
        (b"put 0 0 0 1\r\nz\r\n", b"INSERTED 4\r\n"),  # the EXPECTED_CRLF put took id 3
    ]
    for request, reply in script:
        c.send(request)
        c.expect(reply)
    job = c.yaml(b"stats-job 2\r\n")
    assert list(job) == [
        "id", "tube", "state", "pri", "age", "delay", "ttr", "time-left", "file",
        "reserves", "timeouts", "releases", "buries", "kicks",
    ]  # fmt: skip
    assert (job["tube"], job["state"], job["pri"], job["buries"], job["kicks"]) == (
        '"t.x/(a);b$"',
        "ready",
        "3",
        "1",
        "1",
    )
    assert job["file"] == "1"  # its put record is in jobs.1
    tube = c.yaml(b"stats-tube t.x/(a);b$\r\n")
    assert next(iter(tube)) == "name" and len(tube) == 14
    assert tube["current-jobs-ready"] == "2" and tube["cmd-delete"] == "1"
    stats = c.yaml(b"stats\r\n")
    assert stats["cmd-stats"] == "1" and stats["cmd-put"] == "6"  # rejected puts count too
    assert stats["current-connections"] == "1" and stats["draining"] == "false"
    assert len(stats) == 52  # beanstalkd 1.12's 51, then tercel's own version
    assert stats["version"] == '"1.12"' and list(stats)[-1] == "tercel-version"
    c.send(b"quit\r\n")
    assert c.sock.recv(10) == b""


def test_pipelined_replies_keep_their_order_behind_a_blocked_reserve(
    bsd: BeanstalkdProcess,
) -> None:
    worker, producer = Raw(bsd.port), Raw(bsd.port)
    worker.send(b"reserve\r\nlist-tube-used\r\n")
    producer.send(b"put 0 0 60 2\r\nhi\r\n")
    producer.expect(b"INSERTED 1\r\n")
    worker.expect(b"RESERVED 1 2\r\nhi\r\nUSING default\r\n")


def test_waiting_reservers_are_served_oldest_first(bsd: BeanstalkdProcess) -> None:
    waiters = [Raw(bsd.port) for _ in range(3)]
    probe = Raw(bsd.port)
    for n, w in enumerate(waiters, 1):
        w.send(b"reserve\r\n")
        while probe.yaml(b"stats\r\n")["current-waiting"] != str(n):
            pass  # registered in this order before the next one asks
    producer = Raw(bsd.port)
    for i in range(3):
        producer.send(b"put 0 0 60 1\r\n%d\r\n" % i)
        producer.expect(b"INSERTED %d\r\n" % (i + 1))
    for i, w in enumerate(waiters):
        w.expect(b"RESERVED %d 1\r\n%d\r\n" % (i + 1, i))


def test_disconnect_returns_reserved_jobs_at_once(bsd: BeanstalkdProcess) -> None:
    a, b = Raw(bsd.port), Raw(bsd.port)
    a.send(b"put 0 0 3600 1\r\nx\r\nreserve\r\n")
    a.expect(b"INSERTED 1\r\nRESERVED 1 1\r\nx\r\n")
    b.send(b"delete 1\r\n")
    b.expect(b"NOT_FOUND\r\n")  # reserved by another connection
    b.send(b"reserve\r\n")
    a.close()  # ttr is an hour: only the disconnect can hand the job over
    b.expect(b"RESERVED 1 1\r\nx\r\n")
    job = b.yaml(b"stats-job 1\r\n")
    assert (job["reserves"], job["timeouts"]) == ("2", "0")


def test_half_close_while_waiting_answers_timed_out(bsd: BeanstalkdProcess) -> None:
    c = Raw(bsd.port)
    c.send(b"reserve\r\n")
    c.sock.shutdown(socket.SHUT_WR)
    c.expect(b"TIMED_OUT\r\n")


def test_deadline_soon_with_ttr_one(bsd: BeanstalkdProcess) -> None:
    c = Raw(bsd.port)
    c.send(b"put 0 0 1 1\r\nx\r\nreserve\r\nreserve\r\n")
    c.expect(b"INSERTED 1\r\nRESERVED 1 1\r\nx\r\nDEADLINE_SOON\r\n")


def test_pause_zero_unpauses_at_once(bsd: BeanstalkdProcess) -> None:
    """``pause-tube <tube> 0`` with jobs ready: the next reserve gets one at once, as from
    beanstalkd 1.12 (which pauses for 1 ns), not ``TIMED_OUT`` a second later."""
    c = Raw(bsd.port)
    c.send(b"put 0 0 60 1\r\nx\r\npause-tube default 10\r\nreserve-with-timeout 0\r\n")
    c.expect(b"INSERTED 1\r\nPAUSED\r\nTIMED_OUT\r\n")
    c.send(b"pause-tube default 0\r\nreserve-with-timeout 1\r\n")
    c.expect(b"PAUSED\r\nRESERVED 1 1\r\nx\r\n")


def test_a_delay_ending_with_a_wait_timeout_hands_the_job_over(bsd: BeanstalkdProcess) -> None:
    """Release with delay 2, then ``reserve-with-timeout 1`` twice: the second wait ends with
    the delay, and the job is handed over (beanstalkd promotes delayed jobs before it times
    out waits), every time."""
    c = Raw(bsd.port)
    c.send(b"put 0 0 60 1\r\nx\r\nreserve\r\nrelease 1 0 2\r\n")
    c.expect(b"INSERTED 1\r\nRESERVED 1 1\r\nx\r\nRELEASED\r\n")
    c.send(b"reserve-with-timeout 1\r\n")
    c.expect(b"TIMED_OUT\r\n")
    c.send(b"reserve-with-timeout 1\r\n")
    c.expect(b"RESERVED 1 1\r\nx\r\n")


def test_stats_version_is_the_protocol_version(bsd: BeanstalkdProcess) -> None:
    """Clients gate features on ``version`` and parse it as a version number (greenstalk)."""
    with greenstalk.Client(("127.0.0.1", bsd.port)) as c:
        stats = c.stats()
    assert stats["version"] == "1.12"
    assert stats["tercel-version"] == tercel.__version__


@pytest.mark.parametrize("sync", [(), ("-f0",), ("-F",)], ids=["f50", "f0", "F"])
def test_kill_9_keeps_ready_delayed_buried_and_readies_reserved(
    tmp_path: Path, sync: tuple[str, ...]
) -> None:
    proc = BeanstalkdProcess(tmp_path / "wal", extra_args=sync).start()
    try:
        c = Raw(proc.port)
        c.send(
            b"use q\r\nwatch q\r\nput 10 0 60 5\r\nready\r\nput 10 300 60 7\r\ndelayed\r\n"
            b"put 10 0 60 6\r\nburied\r\nput 10 0 60 8\r\nreserved\r\nput 10 0 60 7\r\ndeleted\r\n"
        )
        c.expect(
            b"USING q\r\nWATCHING 2\r\n" + b"".join(b"INSERTED %d\r\n" % i for i in range(1, 6))
        )
        c.send(b"reserve-job 3\r\nbury 3 4\r\nreserve-job 4\r\ndelete 5\r\n")
        c.expect(b"RESERVED 3 6\r\nburied\r\nBURIED\r\nRESERVED 4 8\r\nreserved\r\nDELETED\r\n")
        proc.kill()
        proc.start()
        c = Raw(proc.port)
        states = {i: c.yaml(b"stats-job %d\r\n" % i)["state"] for i in range(1, 5)}
        assert states == {1: "ready", 2: "delayed", 3: "buried", 4: "ready"}
        assert 290 <= int(c.yaml(b"stats-job 2\r\n")["time-left"]) <= 300
        assert c.yaml(b"stats-job 3\r\n")["pri"] == "4"
        c.send(b"peek 5\r\nuse q\r\nput 0 0 1 1\r\nn\r\n")
        c.expect(b"NOT_FOUND\r\nUSING q\r\nINSERTED 6\r\n")
        assert sorted(os.listdir(tmp_path / "wal")) == ["jobs.1", "lock"]
    finally:
        proc.kill()


def test_memory_only_writes_nothing(tmp_path: Path) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = BeanstalkdProcess(None)
    orig = os.getcwd()
    os.chdir(cwd)
    try:
        proc.start()
    finally:
        os.chdir(orig)
    try:
        c = Raw(proc.port)
        c.send(b"put 0 0 1 1\r\nx\r\n")
        c.expect(b"INSERTED 1\r\n")
        assert c.yaml(b"stats\r\n")["binlog-current-index"] == "0"
        assert c.yaml(b"stats-job 1\r\n")["file"] == "0"  # not journaled
        proc.kill()
        proc.start()
        c = Raw(proc.port)
        c.send(b"peek 1\r\n")
        c.expect(b"NOT_FOUND\r\n")
        assert list(cwd.iterdir()) == []
    finally:
        proc.kill()


def test_sigusr1_drains(bsd: BeanstalkdProcess) -> None:
    c = Raw(bsd.port)
    assert bsd.proc is not None
    bsd.proc.send_signal(signal.SIGUSR1)
    while c.yaml(b"stats\r\n")["draining"] != "true":
        pass
    c.send(b"put 0 0 1 1\r\nx\r\n")
    c.expect(b"DRAINING\r\n")


def test_unix_socket_and_second_instance_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "bs.sock")
    proc = BeanstalkdProcess(tmp_path / "wal", extra_args=("-l", f"unix:{path}"))
    proc.start()
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            s.sendall(b"list-tube-used\r\n")
            assert s.recv(100) == b"USING default\r\n"
        second = BeanstalkdProcess(tmp_path / "wal")
        with pytest.raises(ServerStartError, match=f"exited with {exit_codes.BEANSTALKD_LOCKED}"):
            second.start()
    finally:
        proc.kill()


def test_sigterm_stops_cleanly_and_a_corrupt_job_log_exits_3(tmp_path: Path) -> None:
    """``tercel beanstalkd`` runs the server's one lifecycle: SIGTERM writes the job log and
    exits 0 (the jobs are back at the next start); a job log damaged before its last file
    stops the start with exit code 3 (``exit_codes.CORRUPT``), nothing listening."""
    wal = tmp_path / "wal"
    with BeanstalkdProcess(wal) as proc:
        c = Raw(proc.port)
        c.send(b"put 0 0 60 3\r\nabc\r\n")
        c.expect(b"INSERTED 1\r\n")
        c.sock.close()
        assert proc.stop() == exit_codes.OK
    with BeanstalkdProcess(wal) as proc:
        c = Raw(proc.port)
        c.send(b"peek-ready\r\n")
        c.expect(b"FOUND 1 3\r\nabc\r\n")
        c.sock.close()
    first = wal / "jobs.1"
    damaged = bytearray(first.read_bytes())
    damaged[len(HEADER) + 20] ^= 0xFF
    first.write_bytes(bytes(damaged))
    (wal / "jobs.2").write_bytes(HEADER)
    with pytest.raises(ServerStartError, match=f"exited with {exit_codes.CORRUPT}"):
        BeanstalkdProcess(wal).start()


def test_greenstalk(bsd: BeanstalkdProcess) -> None:
    with greenstalk.Client(("127.0.0.1", bsd.port), use="g", watch=["g"]) as c:
        ids = [c.put(f"job{i}", priority=10 - i) for i in range(3)]
        job = c.reserve(timeout=1)
        assert (job.id, job.body) == (ids[2], "job2")
        assert c.stats_job(job)["state"] == "reserved"
        c.release(job, priority=1)
        job = c.reserve(timeout=1)
        assert job.id == ids[2]
        c.bury(job)
        assert c.kick(1) == 1
        c.delete(c.reserve_job(ids[2]))
        assert c.stats_tube("g")["current-jobs-ready"] == 2
        assert c.stats()["cmd-stats"] == 1
        c.pause_tube("g", 1)
        with pytest.raises(greenstalk.TimedOutError):
            c.reserve(timeout=0)
        assert c.peek_ready().id == ids[1]
        with pytest.raises(greenstalk.NotFoundError):
            c.peek(999)


def test_pystalk(bsd: BeanstalkdProcess) -> None:
    c = pystalk.BeanstalkClient("127.0.0.1", bsd.port, auto_decode=True)
    c.use("p")
    c.watch("p")
    c.put_job("hello", pri=5, delay=0, ttr=60)
    job = c.reserve_job(1)
    job_id = job.job_id
    assert (job_id, job.job_data) == (1, "hello")
    assert c.stats_job(job_id)["tube"] == "p"
    c.release_job(job_id)
    c.delete_job(c.reserve_job(1).job_id)
    stats = c.stats()
    assert stats["current-jobs-ready"] == 0 and stats["os"]
    assert "p" in c.list_tubes()
    c.close()


def test_beanstalkc3(bsd: BeanstalkdProcess) -> None:
    # beanstalkc3's default parser is yaml.load without a Loader, which PyYAML 6 refuses.
    c = beanstalkc.Connection(host="127.0.0.1", port=bsd.port, parse_yaml=yaml.safe_load)
    c.use("b")
    c.watch("b")
    c.ignore("default")
    assert c.watching() == ["b"]
    job_id = c.put("body", priority=3, delay=0, ttr=30)
    job = c.reserve(timeout=1)
    assert (job.jid, job.body) == (job_id, "body")
    assert job.stats()["state"] == "reserved"
    job.touch()
    job.bury()
    assert c.peek_buried().jid == job_id
    assert c.kick(5) == 1
    c.reserve(timeout=1).delete()
    assert c.reserve(timeout=0) is None
    assert c.stats_tube("b")["total-jobs"] == 1
    c.close()
    c._socket_file.close()  # beanstalkc3's close() leaves its reader open (a ResourceWarning)


def test_aiostalk(bsd: BeanstalkdProcess) -> None:
    async def run() -> None:
        client = aiostalk.Client(("127.0.0.1", bsd.port), use="a", watch="a")
        await client.connect()
        try:
            job_id = await client.put("async", priority=1, ttr=10)
            job = await client.reserve(timeout=1)
            assert (job.id, job.body) == (job_id, "async")
            await client.delete(job)
            with pytest.raises(aiostalk.TimedOutError):
                await client.reserve(timeout=0)
        finally:
            await client.close()

    asyncio.run(run())


def test_serve_with_beanstalk_port_survives_kill_9(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data", extra_args=("--beanstalk-port", "0")) as proc:
        c = Raw(proc.ports["beanstalk"])
        c.send(b"use t\r\nput 0 0 60 3\r\nabc\r\n")
        c.expect(b"USING t\r\nINSERTED 1\r\n")
        with proc.connect() as m:  # memcache beside it, and the beanstalk counters in its stats
            m.sendall(b"set q 0 0 1\r\nx\r\n")
            assert m.recv(100) == b"STORED\r\n"
            m.sendall(b"stats\r\n")
            stats = b""
            while not stats.endswith(b"END\r\n"):
                stats += m.recv(65536)
            assert b"STAT beanstalk_cmd_put 1\r\n" in stats
            assert b"STAT beanstalk_curr_jobs_ready 1\r\n" in stats
            assert b"STAT beanstalk_job_log_put_off 0\r\n" in stats
        proc.kill()
        proc.start()
        c = Raw(proc.ports["beanstalk"])
        c.send(b"watch t\r\nreserve-with-timeout 0\r\n")
        c.expect(b"WATCHING 2\r\nRESERVED 1 3\r\nabc\r\n")
        assert c.yaml(b"stats-job 1\r\n")["file"] == "1"  # read back from jobs.1
        assert sorted(os.listdir(tmp_path / "data" / "beanstalk.d")) == ["jobs.1", "lock"]


@pytest.mark.parametrize(
    ("status", "reserve"), [("readonly", b"RESERVED 1 1\r\nx\r\n"), ("quiescent", b"TIMED_OUT\r\n")]
)
def test_server_status_applies(tmp_path: Path, status: str, reserve: bytes) -> None:
    data = tmp_path / "data"
    with ServerProcess(data, extra_args=("--beanstalk-port", "0")) as proc:
        c = Raw(proc.ports["beanstalk"])
        c.send(b"put 0 0 60 1\r\nx\r\n")
        c.expect(b"INSERTED 1\r\n")
        proc.stop()
        (data / ".status").write_text(status + "\n")
        proc.start()
        c = Raw(proc.ports["beanstalk"])
        c.send(b"put 0 0 60 1\r\ny\r\nreserve-with-timeout 0\r\n")
        c.expect(b"DRAINING\r\n" + reserve)


def _stats_json(proc: ServerProcess) -> dict[str, Any]:
    with urllib.request.urlopen(proc.admin_url + "/stats.json", timeout=10) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    return doc


def test_connections_are_counted_by_the_shared_layer(tmp_path: Path) -> None:
    """beanstalkd connections are the shared layer's: counted per front end in /stats.json,
    in the server's totals, and in beanstalkd's own ``stats``; a parked reserve is one too."""
    with ServerProcess(tmp_path / "data", extra_args=("--beanstalk-port", "0")) as proc:
        port = proc.ports["beanstalk"]
        waiter, other = Raw(port), Raw(port)
        waiter.send(b"reserve\r\n")
        stats = other.yaml(b"stats\r\n")  # answered after the waiter's reserve was read
        assert (stats["current-connections"], stats["total-connections"]) == ("2", "2")
        assert (stats["current-workers"], stats["current-waiting"]) == ("1", "1")
        doc = _stats_json(proc)
        assert doc["gauges"]["beanstalk/curr_connections"] == 2
        assert doc["counters"]["beanstalk/total_connections"] == 2
        assert doc["gauges"]["connections"] >= 2
        waiter.sock.shutdown(socket.SHUT_WR)  # TIMED_OUT, then the server closes it
        waiter.expect(b"TIMED_OUT\r\n")
        assert waiter.sock.recv(10) == b""
        other.send(b"put 0 0 60 1\r\nx\r\n")
        other.expect(b"INSERTED 1\r\n")  # nobody waits any more: the job stays ready
        stats = other.yaml(b"stats\r\n")
        assert (stats["current-connections"], stats["total-connections"]) == ("1", "2")
        assert (stats["current-workers"], stats["current-producers"]) == ("0", "1")
        assert stats["current-jobs-ready"] == "1"
        assert _stats_json(proc)["gauges"]["beanstalk/curr_connections"] == 1


def test_per_tube_metrics_on_the_admin_port(tmp_path: Path) -> None:
    """``/metrics`` has one family per tube stat with a ``tube`` label (names with ``/``
    and ``.`` included), ``/stats.json`` the same figures; a freed tube leaves them."""
    with ServerProcess(tmp_path / "data", extra_args=("--beanstalk-port", "0")) as proc:
        c = Raw(proc.ports["beanstalk"])
        c.send(b"use a.b/c\r\nput 5 0 60 1\r\nx\r\nput 2000 0 60 1\r\ny\r\nput 0 30 60 1\r\nz\r\n")
        c.expect(b"USING a.b/c\r\nINSERTED 1\r\nINSERTED 2\r\nINSERTED 3\r\n")
        c.send(b"watch a.b/c\r\nreserve-with-timeout 0\r\nreserve-with-timeout 0\r\n")
        c.expect(b"WATCHING 2\r\nRESERVED 1 1\r\nx\r\nRESERVED 2 1\r\ny\r\n")
        c.send(b"bury 2 7\r\ndelete 1\r\npause-tube a.b/c 60\r\n")
        c.expect(b"BURIED\r\nDELETED\r\nPAUSED\r\n")
        with urllib.request.urlopen(proc.admin_url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        samples: dict[tuple[str, str], float] = {}
        kinds: dict[str, str | None] = {}
        for fam in text_string_to_metric_families(text):
            kinds[fam.name] = fam.type
            for sample in fam.samples:
                if "tube" in sample.labels:
                    samples[(sample.name, sample.labels["tube"])] = sample.value
        want = {
            "curr_jobs_ready": 0,
            "curr_jobs_urgent": 0,
            "curr_jobs_reserved": 0,
            "curr_jobs_delayed": 1,
            "curr_jobs_buried": 1,
            "total_jobs_total": 3,
            "cmd_delete_total": 1,
            "cmd_pause_tube_total": 1,
        }
        for stat, value in want.items():
            assert samples[(f"tercel_beanstalk_tube_{stat}", "a.b/c")] == value, stat
        assert samples[("tercel_beanstalk_tube_total_jobs_total", "default")] == 0
        assert kinds["tercel_beanstalk_tube_curr_jobs_ready"] == "gauge"
        assert kinds["tercel_beanstalk_tube_total_jobs"] == "counter"
        doc = _stats_json(proc)
        assert doc["gauges"]["beanstalk/tube/a.b/c/curr_jobs_buried"] == 1
        assert doc["counters"]["beanstalk/tube/a.b/c/cmd_delete"] == 1
        c.send(b"delete 2\r\ndelete 3\r\nuse default\r\nignore a.b/c\r\n")
        c.expect(b"DELETED\r\nDELETED\r\nUSING default\r\nWATCHING 1\r\n")
        doc = _stats_json(proc)
        assert not [k for k in doc["gauges"] if k.startswith("beanstalk/tube/a.b/c/")]
        assert doc["gauges"]["beanstalk/tube/default/curr_jobs_ready"] == 0


def test_server_limits_apply_to_beanstalk_connections(tmp_path: Path) -> None:
    """``max_connections`` counts beanstalkd connections (a refused one gets INTERNAL_ERROR
    and is closed) and ``client_timeout`` closes an idle one, as for every front end."""
    config = '[server]\nmax_connections = 1\nclient_timeout = "1s"\n'
    with ServerProcess(tmp_path / "data", config, extra_args=("--beanstalk-port", "0")) as proc:
        first = Raw(proc.ports["beanstalk"])
        first.send(b"reserve-with-timeout 0\r\n")
        first.expect(b"TIMED_OUT\r\n")  # accepted and served
        second = Raw(proc.ports["beanstalk"])
        second.expect(b"INTERNAL_ERROR\r\n")
        assert second.closed()
        assert first.closed()  # idle past client_timeout: the server closes it (recv waits)
