"""Kestrel's text protocol over real sockets: every command, its replies, bad input, open reads
ended by a disconnect, blocking reads, status, kill -9 and restart, and hand-offs to memcache."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support import Raw, Text, drain, set_cmd, stats, text_connection
from tercel.testing import ServerProcess

PORTS = ("--text-port", "0")


def text(srv: ServerProcess) -> Text:
    return text_connection(srv.ports["text"])


@pytest.fixture(scope="module")
def tsrv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess(tmp_path_factory.mktemp("data"), extra_args=PORTS) as srv:
        yield srv


@pytest.fixture
def conn(tsrv: ServerProcess) -> Iterator[Text]:
    c = text(tsrv)
    yield c
    c.close()


@pytest.fixture
def mc(tsrv: ServerProcess) -> Iterator[Raw]:
    c = Raw(tsrv.connect())
    yield c
    c.close()


def test_put_then_get_confirms_the_previous_read(conn: Text, qname: str) -> None:
    q = qname.encode()
    conn.call(b"put %b:\none\ntwo\r\nthree\n\n" % q, b"+3")
    conn.call(b"get %b\n" % q, b":one")
    conn.call(b"GET %b\n" % q, b":two")  # confirms one, opens two
    conn.call(b"get %b\n" % q, b":three")
    conn.call(b"get %b\n" % q, b"*")  # confirms three
    conn.call(b"confirm %b 1\n" % q, b"-Not that many transactions open.")


def test_disconnect_returns_the_open_read(tsrv: ServerProcess, mc: Raw, qname: str) -> None:
    q = qname.encode()
    c = text(tsrv)
    c.call(b"put %b:\na\n\n" % q, b"+1")
    c.call(b"get %b\n" % q, b":a")
    c.close()  # the queue is empty until the server sees the close and returns a
    mc.call(b"get %b/t=5000\r\n" % q, b"VALUE %b/t=5000 0 1\r\na\r\nEND\r\n" % q)


def test_items_are_stored_as_sent_and_none_is_dropped(conn: Text, mc: Raw, qname: str) -> None:
    """Kestrel re-encoded each line from ISO-8859-1 to UTF-8 and dropped the 1025th line."""
    q = qname.encode()
    items = [b"\xff\xfe\x80 %d:" % i for i in range(1500)]
    conn.call(b"put %b:\n%b\n\n" % (q, b"\n".join(items)), b"+1500")
    assert drain(mc, qname) == items


def test_confirm_peek_and_monitor(conn: Text, mc: Raw, qname: str) -> None:
    q = qname.encode()
    conn.call(b"put %b:\n1\n2\n3\n4\n\n" % q, b"+4")
    conn.call(b"peek %b\n" % q, b":1")
    conn.call(b"monitor %b 100 2\n" % q, b":1", b":2", b"*")
    conn.call(b"confirm %b 3\n" % q, b"-Not that many transactions open.")
    conn.call(b"confirm %b 2\n" % q, b"+2")
    conn.call(b"monitor %b 50\n" % q, b":3", b":4", b"*")  # up to max_open_reads
    conn.call(b"peek %b\n" % q, b"*")  # confirms 3 and 4 first
    assert drain(mc, qname) == []


def test_blocking_get_is_served_by_a_memcache_set(conn: Text, mc: Raw, qname: str) -> None:
    q = qname.encode()
    conn.send(b"get %b 5000\nversion\n" % q)
    mc.call(set_cmd(qname, b"late"), b"STORED\r\n")
    assert conn.line() == b":late"
    assert conn.line().startswith(b":")  # the version, answered after the blocked get


def test_blocking_reads_time_out(conn: Text, qname: str) -> None:
    q = qname.encode()
    conn.call(b"get %b 30\n" % q, b"*")
    conn.call(b"peek %b 30\n" % q, b"*")
    conn.call(b"monitor %b 30\n" % q, b"*")


def test_expiry_is_relative_ms(conn: Text, mc: Raw, qname: str) -> None:
    q = qname.encode()
    conn.call(b"put %b 1:\ngone\n\n" % q, b"+1")
    conn.call(b"put %b 600000:\nkept\n\n" % q, b"+1")
    conn.call(b"get %b_other 20\n" % q, b"*")  # 20 ms pass: "gone" is past its 1 ms
    assert drain(mc, qname) == [b"kept"]


def test_an_item_that_is_not_a_line_stays_for_memcache(conn: Text, mc: Raw, qname: str) -> None:
    q = qname.encode()
    for data in (b"two\nlines", b"ends in cr\r"):
        mc.call(set_cmd(qname, data), b"STORED\r\n")
        conn.call(
            b"get %b\n" % q,
            b"-Item holds a line feed or ends in a carriage return; take it over memcache or"
            b" Thrift.",
        )
        assert drain(mc, qname) == [data]


def test_flush_delete_status_version(conn: Text, mc: Raw, qname: str) -> None:
    q = qname.encode()
    conn.call(b"put %b:\nx\n\n" % q, b"+1")
    conn.call(b"flush %b\n" % q, b"+0")
    assert drain(mc, qname) == []
    conn.call(b"delete %b\n" % q, b"+0")
    conn.call(b"status\n", b":UP")
    conn.send(b"version\n")
    assert conn.line().startswith(b":")


def test_bad_input_gets_a_message_and_the_connection_stays(conn: Text, qname: str) -> None:
    q = qname.encode()
    conn.call(b"bogus\n", b"-Unknown command: bogus")
    conn.call(b"get\n", b"-Queue name required.")
    conn.call(b"get %b soon\n" % q, b"-Error parsing timeout.")
    conn.call(b"put %b later:\nx\n\n" % q, b"-Error parsing expiration time.")
    conn.call(b"get ../x\n", b"-Bad queue name.")
    conn.call(b"monitor %b\n" % q, b"-Queue name & timeout required.")
    conn.call(b"status sideways\n", b"-unknown status 'sideways'")
    conn.call(b"get " + b"q" * 9000 + b"\n", b"-Line too long (limit 8192 bytes).")
    conn.call(
        b"put %b:\n" % q + b"x" * (64 * 1024 * 1024 + 1) + b"\nkept?\n\n",
        b"-Item too large (limit 67108864 bytes).",
    )
    conn.call(b"get %b\n" % q, b"*")  # nothing of the refused batch was stored


def test_status_refuses_writes_with_kestrels_message(conn: Text, qname: str) -> None:
    q = qname.encode()
    conn.call(b"put %b:\nx\n\n" % q, b"+1")
    conn.call(b"status readonly\n", b"+0")
    try:
        conn.call(b"status\n", b":READONLY")
        conn.call(b"put %b:\ny\n\n" % q, b"-Server not available for operation put")
        conn.call(b"get %b\n" % q, b":x")  # reads still work
        conn.call(b"status quiescent\n", b"+0")
        conn.call(b"get %b\n" % q, b"-Server not available for operation get")
    finally:
        conn.call(b"status up\n", b"+0")


def test_quit_closes(conn: Text) -> None:
    conn.send(b"version\nquit\n")
    assert conn.line().startswith(b":")
    assert conn.closed()


def test_kill_9_keeps_what_was_acknowledged(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data", extra_args=PORTS) as srv:
        c = text(srv)
        c.call(b"put q:\n" + b"\n".join(b"%d" % i for i in range(200)) + b"\n\n", b"+200")
        c.call(b"get q\n", b":0")  # an open read at the crash returns at restart
        srv.kill()
        srv.start()
        c = text(srv)
        c.call(b"get q\n", b":0")
        c.call(b"put q:\nlast\n\n", b"+1")
        c.call(b"get q\n", b":1")  # confirms 0
        srv.kill()  # 1 was open: it returns at the restart
        srv.start()
        mc = Raw(srv.connect())
        assert drain(mc, "q") == [b"%d" % i for i in range(1, 200)] + [b"last"]


def test_shutdown_answers_then_stops(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data", extra_args=PORTS) as srv:
        c = text(srv)
        c.call(b"shutdown\n", b"+0")
        assert srv.wait() == 0


def test_commands_are_counted_per_command_in_stats(conn: Text, mc: Raw, qname: str) -> None:
    """``text_cmd_<command>`` in memcache ``stats`` (and the admin port): every command
    received, a refused one too."""
    before = stats(mc)
    q = qname.encode()
    conn.call(b"put %b:\na\nb\n\n" % q, b"+2")
    conn.call(b"get %b\n" % q, b":a")
    conn.call(b"peek %b\n" % q, b":b")
    conn.send(b"version\n")
    assert conn.line().startswith(b":")
    after = stats(mc)
    for key, n in (("put", 1), ("get", 1), ("peek", 1), ("version", 1)):
        name = f"text_cmd_{key}"
        assert int(after[name]) - int(before.get(name, "0")) == n, name
