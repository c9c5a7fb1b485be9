"""Restarts, SIGKILL and damaged journals, with real server processes on one data dir."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from support import Raw, drain, set_cmd
from tercel.journal.append import PREALLOCATE, PREALLOCATE_FIRST
from tercel.testing import ServerProcess, ServerStartError


def test_restart_keeps_items_and_order(data_dir: Path) -> None:
    with ServerProcess(data_dir) as srv:
        conn = Raw(srv.connect())
        conn.call(b"".join(set_cmd("q", b"%d" % i) for i in range(100)), b"STORED\r\n" * 100)
        conn.call(
            b"get q\r\nget q/open\r\n",
            b"VALUE q 0 1\r\n0\r\nEND\r\nVALUE q/open 0 1\r\n1\r\nEND\r\n",
        )
        conn.close()
        assert srv.stop() == 0  # a clean SIGTERM exits 0
        srv.start()
        conn = Raw(srv.connect())
        # The open read was returned to the head at disconnect, so 1 comes first again.
        assert drain(conn, "q") == [b"%d" % i for i in range(1, 100)]


def test_open_reads_pending_at_a_crash_return_in_order(data_dir: Path) -> None:
    with ServerProcess(data_dir) as srv:
        conn = Raw(srv.connect())
        conn.call(b"".join(set_cmd("q", b"%d" % i) for i in range(5)), b"STORED\r\n" * 5)
        for i in range(3):
            conn.call(b"get q/open\r\n", b"VALUE q/open 0 1\r\n%d\r\nEND\r\n" % i)
        srv.kill()
        srv.start()
        assert drain(Raw(srv.connect()), "q") == [b"%d" % i for i in range(5)]


def test_confirmed_reads_stay_gone_after_restart(data_dir: Path) -> None:
    with ServerProcess(data_dir) as srv:
        conn = Raw(srv.connect())
        conn.call(set_cmd("q", b"a") + set_cmd("q", b"b"), b"STORED\r\nSTORED\r\n")
        conn.call(b"get q/open\r\nget q/close\r\n", b"VALUE q/open 0 1\r\na\r\nEND\r\nEND\r\n")
        conn.call(b"flush q\r\n", b"END\r\n")
        conn.call(set_cmd("q", b"c"), b"STORED\r\n")
        conn.call(set_cmd("gone", b"x") + b"delete gone\r\n", b"STORED\r\nDELETED\r\n")
        srv.kill()
        # The delete renamed the files to temporaries (`gone~~gone.<seq>`) that a worker
        # unlinks; a kill may come first. No journal file of the queue is left either way.
        left = [p for p in os.listdir(data_dir) if p.startswith("gone")]
        assert all("~~" in p for p in left), left
        srv.start()  # and the start removes what the worker did not
        assert not any(p.startswith("gone") for p in os.listdir(data_dir))
        conn = Raw(srv.connect())
        assert drain(conn, "q") == [b"c"]
        assert drain(conn, "gone") == []


def _producer(port: int, acked: list[int], stop: threading.Event) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    conn = Raw(sock)
    i = 0
    try:
        while not stop.is_set():
            batch = b"".join(set_cmd("stream", b"%08d" % (i + k)) for k in range(10))
            conn.send(batch)
            for k in range(10):
                conn.expect(b"STORED\r\n")
                acked.append(i + k)
            i += 10
    except (OSError, EOFError, AssertionError):
        pass  # the server was killed under us
    finally:
        sock.close()


def test_kill_9_during_acknowledged_sets_loses_nothing(data_dir: Path) -> None:
    with ServerProcess(data_dir) as srv:
        acked: list[int] = []
        stop = threading.Event()
        producers = [
            threading.Thread(target=_producer, args=(srv.port, acked, stop)) for _ in range(1)
        ]
        for t in producers:
            t.start()
        # Kill once a good number of sets were acknowledged (no sleep: poll the count).
        while len(acked) < 5000:
            if not any(t.is_alive() for t in producers):
                break
        srv.kill()
        stop.set()
        for t in producers:
            t.join()
        assert len(acked) >= 5000
        srv.start()
        items = drain(Raw(srv.connect()), "stream")
        got = [int(x) for x in items]
        # Every acknowledged item survived, in order; at most the unacknowledged tail differs.
        assert got[: len(acked)] == acked
        assert got == list(range(len(got)))


def test_torn_tail_is_cut_and_counted(data_dir: Path) -> None:
    with ServerProcess(data_dir) as srv:
        Raw(srv.connect()).call(
            set_cmd("q", b"one") + set_cmd("q", b"two"), b"STORED\r\nSTORED\r\n"
        )
        assert srv.stop() == 0
        journal = data_dir / "q"
        size = journal.stat().st_size
        with open(journal, "ab") as fh:
            fh.write(b"\x30\x00\x00\x00\x12\x34")  # a record header cut short by a crash
        srv.start()
        conn = Raw(srv.connect())
        assert stat_lines(conn)[b"journal_torn_tails"] == b"1"
        assert drain(conn, "q") == [b"one", b"two"]
        assert srv.stop() == 0
        assert journal.stat().st_size >= size  # cut back, then appended to again
        assert "torn tail" in srv.log()


def test_bad_record_in_the_middle_stops_startup(data_dir: Path) -> None:
    with ServerProcess(data_dir) as srv:
        Raw(srv.connect()).call(
            b"".join(set_cmd("q", b"item-%d" % i) for i in range(3)), b"STORED\r\n" * 3
        )
        assert srv.stop() == 0
    journal = data_dir / "q"
    raw = bytearray(journal.read_bytes())
    raw[8 + 8 + 25 + 2] ^= 0xFF  # flip a payload byte of the first record
    journal.write_bytes(bytes(raw))
    srv = ServerProcess(data_dir)  # it may listen first: the queues replay in the background
    assert srv.start_refused() == 3
    assert f"{journal} at offset 8" in srv.log()
    assert journal.read_bytes() == bytes(raw)  # nothing was truncated


def test_second_server_on_same_data_dir_is_refused(data_dir: Path) -> None:
    with ServerProcess(data_dir):
        other = ServerProcess(data_dir)
        try:
            other.start()
        except ServerStartError as exc:
            assert "in use by another tercel" in str(exc)
        else:
            other.kill()
            raise AssertionError("two servers shared one data dir")


def stat_lines(conn: Raw) -> dict[bytes, bytes]:
    conn.send(b"stats\r\n")
    out = {}
    while (line := conn.read_line()) != b"END\r\n":
        _, name, value = line.split()
        out[name] = value
    return out


def test_sync_journal_true_survives_kill(data_dir: Path) -> None:
    config = "[queues]\nsync_journal = true\n[queues.plain]\nsync_journal = false\n"
    with ServerProcess(data_dir, config) as srv:
        conn = Raw(srv.connect())
        conn.call(set_cmd("plain", b"p"), b"STORED\r\n")
        assert stat_lines(conn)[b"journal_fsyncs"] == b"0"
        conn.call(b"".join(set_cmd("q", b"%d" % i) for i in range(50)), b"STORED\r\n" * 50)
        stats = stat_lines(conn)
        assert 1 <= int(stats[b"journal_fsyncs"]) == int(stats[b"journal_fsync_waits"]) <= 50
        conn.call(set_cmd("q", b"50"), b"STORED\r\n")  # a write after a sync writes ahead
        srv.kill()
        assert (data_dir / "q").stat().st_size > PREALLOCATE_FIRST  # zeros written ahead
        assert (data_dir / "plain").stat().st_size < 100  # a queue that never syncs: none
        srv.start()
        assert drain(Raw(srv.connect()), "q") == [b"%d" % i for i in range(51)]


@pytest.mark.parametrize("fsync", ["aio", "inline"])
def test_pipelined_sync_batches_survive_kill(data_dir: Path, fsync: str) -> None:
    """Groups big enough (64 KiB and more) to be fsynced through AIO, and the same with AIO
    turned off: both group-fsync paths."""
    env = {"TERCEL_NO_AIO": "1"} if fsync == "inline" else None
    items = [(b"%d-" % i).ljust(1024, b"x") for i in range(400)]
    with ServerProcess(data_dir, "[queues]\nsync_journal = true\n", env=env) as srv:
        conns = [Raw(srv.connect()) for _ in range(4)]
        for batch in range(4):  # four connections, each pipelining 25 sets per batch
            for c, conn in enumerate(conns):
                start = batch * 100 + c * 25
                conn.send(b"".join(set_cmd("q", item) for item in items[start : start + 25]))
            for conn in conns:
                conn.expect(b"STORED\r\n" * 25)
        stats = stat_lines(conns[0])
        aio_groups = int(stats[b"journal_fsyncs_aio"])
        assert int(stats[b"journal_fsyncs"]) >= max(aio_groups, 1)
        assert aio_groups >= 1 if fsync == "aio" else aio_groups == 0
        srv.kill()
        srv.start()
        assert sorted(drain(Raw(srv.connect()), "q")) == sorted(items)


def test_periodic_sync_and_no_journal(data_dir: Path) -> None:
    config = '[queues]\nsync_journal = "5ms"\n[queues.mem]\njournal = false\n'
    with ServerProcess(data_dir, config) as srv:
        conn = Raw(srv.connect())
        conn.call(set_cmd("q", b"kept") + set_cmd("mem", b"lost"), b"STORED\r\nSTORED\r\n")
        srv.kill()
        srv.start()
        conn = Raw(srv.connect())
        assert drain(conn, "q") == [b"kept"]
        assert drain(conn, "mem") == []


@pytest.mark.parametrize("sync", ["false", "true"])
def test_server_compacts_in_the_background_and_restarts_exactly(data_dir: Path, sync: str) -> None:
    config = (
        f'[queues]\nmax_memory_size = "4KB"\nmax_journal_size = "16KB"\nsync_journal = {sync}\n'
    )
    with ServerProcess(data_dir, config) as srv:
        conn = Raw(srv.connect())
        body = b"x" * 200
        for i in range(40):
            conn.call(
                b"".join(set_cmd("q", b"%04d" % (i * 50 + k) + body) for k in range(50)),
                b"STORED\r\n" * 50,
            )
        for i in range(1500):
            conn.send(b"get q\r\n")
            assert conn.read_line() == b"VALUE q 0 204\r\n"
            assert conn.read_exact(204)[:4] == b"%04d" % i
            conn.expect(b"\r\nEND\r\n")
        ahead = PREALLOCATE if sync == "true" else 0  # zeros written ahead in the current file
        limit = 2 * 500 * 237 + 4 * 16 * 1024 + ahead  # live data, not all 2000 items
        # Compaction runs in the background; on a busy host the last one may still run when
        # the gets are answered, and the next check is the server's once-a-second sweep.
        deadline = time.monotonic() + 30
        while (on_disk := _queue_bytes(data_dir, "q")) >= limit and time.monotonic() < deadline:
            time.sleep(0.05)
        assert on_disk < limit
        srv.kill()
        srv.start()
        assert [x[:4] for x in drain(Raw(srv.connect()), "q")] == [
            b"%04d" % i for i in range(1500, 2000)
        ]


def _queue_bytes(data_dir: Path, queue: str) -> int:
    """Bytes of the queue's journal files on disk (a file may vanish while it is listed)."""
    total = 0
    for p in data_dir.iterdir():
        if p.name.startswith(queue):
            with contextlib.suppress(FileNotFoundError):
                total += p.stat().st_size
    return total
