"""beanstalkd's ``put-key`` (tercel's extension, docs/protocol.md "Dedup keys") on real
servers: ``INSERTED <original id>`` for a repeat within the window, across SIGKILL, restart and
job-log compaction; bad keys and a full store answered with the rule; ``put`` unchanged."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from support import Raw
from tercel.names import KEY_RULE
from tercel.testing import BeanstalkdProcess, ServerProcess


def put_key(key: str, body: bytes, pri: int = 0, delay: int = 0) -> bytes:
    return b"put-key %s %d %d 60 %d\r\n%s\r\n" % (key.encode(), pri, delay, len(body), body)


def test_put_key_answers_the_original_id_and_put_is_unchanged(tmp_path: Path) -> None:
    with BeanstalkdProcess(tmp_path / "wal") as bsd:
        conn = Raw(bsd.connect())
        conn.call(b"put 0 0 60 1\r\na\r\n", b"INSERTED 1\r\n")
        conn.call(put_key("k1", b"b"), b"INSERTED 2\r\n")
        conn.call(put_key("k1", b"other"), b"INSERTED 2\r\n")
        conn.call(b"use t\r\n", b"USING t\r\n")
        conn.call(put_key("k1", b"other tube"), b"INSERTED 2\r\n")  # keys are per server
        conn.call(put_key("k2", b"c", delay=5), b"INSERTED 3\r\n")
        conn.call(b"put 0 0 60 1\r\nd\r\n", b"INSERTED 4\r\n")
        conn.call(b"peek 2\r\n", b"FOUND 2 1\r\nb\r\n")
        assert yaml_reply(conn, b"stats-tube default\r\n")["current-jobs-ready"] == "2"
        assert yaml_reply(conn, b"stats-tube t\r\n")["current-jobs-delayed"] == "1"
        srv_stats = stats(conn)
        assert srv_stats["dedup-keys"] == "2"
        assert srv_stats["dedup-duplicates"] == "2"
        bsd.kill()
        bsd.start()
        conn = Raw(bsd.connect())
        conn.call(put_key("k1", b"again"), b"INSERTED 2\r\n")
        conn.call(put_key("k2", b"again"), b"INSERTED 3\r\n")
        conn.call(put_key("k3", b"new"), b"INSERTED 5\r\n")
        conn.call(b"reserve-with-timeout 0\r\n", b"RESERVED 1 1\r\na\r\n")


def stats(conn: Raw) -> dict[str, str]:
    return yaml_reply(conn, b"stats\r\n")


def yaml_reply(conn: Raw, request: bytes) -> dict[str, str]:
    """The ``key: value`` lines of the ``OK <n>`` reply to ``request``."""
    conn.send(request)
    head = conn.read_line()
    body = conn.read_exact(int(head.split()[1]) + 2).decode()
    return dict(line.split(": ", 1) for line in body.splitlines() if ": " in line and line != "---")


def test_put_key_bad_input(tmp_path: Path) -> None:
    with BeanstalkdProcess(tmp_path / "wal") as bsd:
        conn = Raw(bsd.connect())
        conn.call(put_key("a#b", b"x"), b"BAD_KEY bad key 'a#b': " + KEY_RULE.encode() + b"\r\n")
        # A bad line is BAD_FORMAT and its body is read as a command, as for put.
        conn.call(b"put-key 0 0 60 1\r\nx\r\n", b"BAD_FORMAT\r\nUNKNOWN_COMMAND\r\n")
        conn.call(b"put-key k 0 0 60 1 junk\r\nx\r\n", b"BAD_FORMAT\r\nUNKNOWN_COMMAND\r\n")
        conn.call(b"put 0 0 60 1\r\nx\r\n", b"INSERTED 1\r\n")


def test_put_key_keys_survive_compaction(tmp_path: Path) -> None:
    with BeanstalkdProcess(tmp_path / "wal", extra_args=("-s", "4096")) as bsd:
        conn = Raw(bsd.connect())
        body = b"x" * 100
        for i in range(400):
            conn.call(put_key(f"k{i}", body), b"INSERTED %d\r\n" % (i + 1))
        for i in range(400):
            conn.call(b"delete %d\r\n" % (i + 1), b"DELETED\r\n")
        assert int(stats(conn)["binlog-oldest-index"]) > 1  # compacted: jobs.1 is gone
        bsd.kill()
        bsd.start()
        conn = Raw(bsd.connect())
        for i in (0, 199, 399):
            conn.call(put_key(f"k{i}", b"y"), b"INSERTED %d\r\n" % (i + 1))
        conn.call(b"reserve-with-timeout 0\r\n", b"TIMED_OUT\r\n")


def test_put_key_window_and_bound_from_the_queue_defaults(data_dir: Path) -> None:
    config = "[queues]\ndedup_window_ms = 300\nmax_dedup_keys = 2\n"
    args = ("--beanstalk-port", "0")
    with ServerProcess(data_dir, config, extra_args=args) as srv:
        conn = Raw(socket.create_connection(("127.0.0.1", srv.ports["beanstalk"]), timeout=10))
        conn.call(put_key("a", b"1"), b"INSERTED 1\r\n")
        conn.call(put_key("b", b"2"), b"INSERTED 2\r\n")
        conn.send(put_key("c", b"3"))
        assert conn.read_line().startswith(b"TOO_MANY_KEYS the beanstalkd job store holds")
        deadline = time.monotonic() + 30
        while True:  # not a timing assertion: the keys go once 300 ms have passed
            conn.send(put_key("a", b"4"))
            line = conn.read_line()
            if line != b"INSERTED 1\r\n":
                assert line == b"INSERTED 3\r\n"
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)
