"""Every memcache command against a real server, reply bytes checked exactly."""

from __future__ import annotations

import socket

from support import Raw
from tercel.testing import ServerProcess


def set_cmd(q: str, data: bytes, exptime: int = 0, extra: bytes = b"") -> bytes:
    return b"set %s 0 %d %d%s\r\n%s\r\n" % (q.encode(), exptime, len(data), extra, data)


def test_set_get_fifo(raw: Raw, qname: str) -> None:
    for i in range(5):
        raw.call(set_cmd(qname, b"item%d" % i), b"STORED\r\n")
    for i in range(5):
        raw.call(
            b"get %s\r\n" % qname.encode(),
            b"VALUE %s 0 5\r\nitem%d\r\nEND\r\n" % (qname.encode(), i),
        )
    raw.call(b"get %s\r\n" % qname.encode(), b"END\r\n")


def test_value_echoes_key_with_options(raw: Raw, qname: str) -> None:
    q = qname.encode()
    raw.call(set_cmd(qname, b"x"), b"STORED\r\n")
    raw.call(b"get %s/t=10/open\r\n" % q, b"VALUE %s/t=10/open 0 1\r\nx\r\nEND\r\n" % q)
    raw.call(b"get %s/close\r\n" % q, b"END\r\n")


def test_gets_carries_item_id_as_cas(raw: Raw, qname: str) -> None:
    q = qname.encode()
    raw.call(set_cmd(qname, b"a") + set_cmd(qname, b"b"), b"STORED\r\nSTORED\r\n")
    raw.call(b"gets %s\r\n" % q, b"VALUE %s 0 1 1\r\na\r\nEND\r\n" % q)
    raw.call(b"gets %s\r\n" % q, b"VALUE %s 0 1 2\r\nb\r\nEND\r\n" % q)


def test_binary_payload_round_trips(raw: Raw, qname: str) -> None:
    data = bytes(range(256)) * 4 + b"\r\nEND\r\n"
    raw.call(set_cmd(qname, data), b"STORED\r\n")
    raw.call(
        b"get %s\r\n" % qname.encode(),
        b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (qname.encode(), len(data), data),
    )


def test_empty_item(raw: Raw, qname: str) -> None:
    raw.call(set_cmd(qname, b""), b"STORED\r\n")
    raw.call(b"get %s\r\n" % qname.encode(), b"VALUE %s 0 0\r\n\r\nEND\r\n" % qname.encode())


def test_peek_does_not_remove(raw: Raw, qname: str) -> None:
    q = qname.encode()
    raw.call(set_cmd(qname, b"p"), b"STORED\r\n")
    raw.call(b"get %s/peek\r\n" % q, b"VALUE %s/peek 0 1\r\np\r\nEND\r\n" % q)
    raw.call(b"get %s\r\n" % q, b"VALUE %s 0 1\r\np\r\nEND\r\n" % q)
    raw.call(b"get %s/peek\r\n" % q, b"END\r\n")


def test_peek_never_creates_a_queue(server: ServerProcess, raw: Raw, qname: str) -> None:
    q = qname.encode()
    raw.call(b"get %s/peek\r\n" % q, b"END\r\n")
    raw.call(b"dump_stats %s\r\n" % q, b"queue '%s' {\r\n}\r\nEND\r\n" % q)
    assert not list(server.data_dir.glob(f"{qname}*"))
    raw.call(b"get ../x/peek\r\n", b"CLIENT_ERROR bad queue name\r\n")
    raw.call(b"get %s/peek/t=1\r\n" % q, b"END\r\n")  # a peek that waits needs the queue
    raw.send(b"dump_stats %s\r\n" % q)
    assert raw.read_line() == b"queue '%s' {\r\n" % q
    assert raw.read_line() == b"  items=0\r\n"
    assert list(server.data_dir.glob(f"{qname}*"))  # so the glob above would have seen one


def test_open_close_abort(raw: Raw, qname: str) -> None:
    q = qname.encode()
    raw.call(set_cmd(qname, b"1") + set_cmd(qname, b"2"), b"STORED\r\nSTORED\r\n")
    raw.call(b"get %s/open\r\n" % q, b"VALUE %s/open 0 1\r\n1\r\nEND\r\n" % q)
    # A plain get while an open read is held on this queue is Kestrel's bare ERROR.
    raw.call(b"get %s\r\n" % q, b"ERROR\r\n")
    raw.call(b"get %s/abort\r\n" % q, b"END\r\n")
    raw.call(b"get %s/open\r\n" % q, b"VALUE %s/open 0 1\r\n1\r\nEND\r\n" % q)
    raw.call(b"get %s/close/open\r\n" % q, b"VALUE %s/close/open 0 1\r\n2\r\nEND\r\n" % q)
    raw.call(b"get %s/close\r\n" % q, b"END\r\n")
    raw.call(b"get %s\r\n" % q, b"END\r\n")
    # close and abort with nothing open still answer END.
    raw.call(b"get %s/close\r\n" % q, b"END\r\n")
    raw.call(b"get %s/abort\r\n" % q, b"END\r\n")


def test_open_reads_are_per_queue(raw: Raw, qname: str) -> None:
    a, b = (qname + "_a").encode(), (qname + "_b").encode()
    raw.call(set_cmd(a.decode(), b"A") + set_cmd(b.decode(), b"B"), b"STORED\r\nSTORED\r\n")
    raw.call(b"get %s/open\r\n" % a, b"VALUE %s/open 0 1\r\nA\r\nEND\r\n" % a)
    raw.call(b"get %s/open\r\n" % b, b"VALUE %s/open 0 1\r\nB\r\nEND\r\n" % b)
    raw.call(b"get %s/close\r\nget %s/close\r\n" % (a, b), b"END\r\nEND\r\n")


def test_disconnect_returns_open_reads_in_order(server: ServerProcess, qname: str) -> None:
    q = qname.encode()
    first = Raw(server.connect())
    first.call(b"".join(set_cmd(qname, b"%d" % i) for i in range(3)), b"STORED\r\n" * 3)
    first.call(b"get %s/open\r\n" % q, b"VALUE %s/open 0 1\r\n0\r\nEND\r\n" % q)
    first.call(b"get %s/open\r\n" % q, b"VALUE %s/open 0 1\r\n1\r\nEND\r\n" % q)
    first.close()
    second = Raw(server.connect())
    # The server notices the close asynchronously; a blocking read waits for the abort.
    second.call(b"get %s/t=2000\r\n" % q, b"VALUE %s/t=2000 0 1\r\n0\r\nEND\r\n" % q)
    second.call(b"get %s\r\n" % q, b"VALUE %s 0 1\r\n1\r\nEND\r\n" % q)
    second.call(b"get %s\r\n" % q, b"VALUE %s 0 1\r\n2\r\nEND\r\n" % q)
    second.close()


def test_max_open_reads(tmp_path: object) -> None:
    import pathlib

    assert isinstance(tmp_path, pathlib.Path)
    with ServerProcess(tmp_path / "d", "[server]\nmax_open_reads = 2\n") as srv:
        raw = Raw(srv.connect())
        raw.call(b"".join(set_cmd("q", b"%d" % i) for i in range(3)), b"STORED\r\n" * 3)
        raw.call(
            b"get q/open\r\nget q/open\r\n",
            b"VALUE q/open 0 1\r\n0\r\nEND\r\nVALUE q/open 0 1\r\n1\r\nEND\r\n",
        )
        raw.call(b"get q/open\r\n", b"ERROR\r\n")
        raw.call(b"get q/close/open\r\n", b"VALUE q/close/open 0 1\r\n2\r\nEND\r\n")


def test_blocking_get_times_out(raw: Raw, qname: str) -> None:
    raw.call(b"get %s/t=50\r\n" % qname.encode(), b"END\r\n")


def test_blocking_get_is_served_by_a_set(server: ServerProcess, qname: str) -> None:
    q = qname.encode()
    waiter = Raw(server.connect())
    waiter.send(b"get %s/t=10000\r\nversion\r\n" % q)
    producer = Raw(server.connect())
    # The waiter is registered before the set arrives only if the server saw it first:
    # a stats round trip on the waiter's own queue proves it is waiting.
    _wait_for_waiters(producer, qname, 1)
    producer.call(set_cmd(qname, b"hello"), b"STORED\r\n")
    waiter.expect(b"VALUE %s/t=10000 0 5\r\nhello\r\nEND\r\n" % q)
    assert waiter.read_line().startswith(b"VERSION ")


def _wait_for_waiters(conn: Raw, qname: str, n: int) -> None:
    for _ in range(1000):
        conn.send(b"dump_stats %s\r\n" % qname.encode())
        lines = []
        while not lines or lines[-1] != b"END\r\n":
            lines.append(conn.read_line())
        if b"  waiters=%d\r\n" % n in lines:
            return
    raise AssertionError("waiters never registered")


def test_delete(raw: Raw, qname: str) -> None:
    q = qname.encode()
    raw.call(set_cmd(qname, b"x"), b"STORED\r\n")
    raw.call(b"delete %s\r\n" % q, b"DELETED\r\n")
    raw.call(b"get %s\r\n" % q, b"END\r\n")
    raw.call(b"delete never_there_%s\r\n" % q, b"DELETED\r\n")


def test_flush_and_flush_all(raw: Raw, qname: str) -> None:
    q = qname.encode()
    raw.call(set_cmd(qname, b"x") + set_cmd(qname, b"y"), b"STORED\r\nSTORED\r\n")
    raw.call(b"flush %s\r\n" % q, b"END\r\n")
    raw.call(b"get %s\r\n" % q, b"END\r\n")
    raw.call(set_cmd(qname, b"z"), b"STORED\r\n")
    raw.call(b"flush_all\r\n", b"OK\r\n")
    raw.call(b"get %s\r\n" % q, b"END\r\n")


def test_noreply(raw: Raw, qname: str) -> None:
    q = qname.encode()
    raw.send(set_cmd(qname, b"a", extra=b" noreply") + set_cmd(qname, b"b", extra=b" noreply"))
    raw.send(b"flush_all noreply\r\n" if False else b"")
    raw.call(b"get %s\r\n" % q, b"VALUE %s 0 1\r\na\r\nEND\r\n" % q)
    raw.call(b"flush %s noreply\r\ndelete %s noreply\r\nversion\r\n" % (q, q), b"VERSION ")


def test_expiry_relative_and_absolute(raw: Raw, qname: str) -> None:
    q = qname.encode()
    raw.call(set_cmd(qname, b"gone", exptime=-1), b"STORED\r\n")  # already expired
    raw.call(set_cmd(qname, b"past", exptime=1_000_000), b"STORED\r\n")  # epoch 1970: expired
    raw.call(set_cmd(qname, b"keep", exptime=3600), b"STORED\r\n")
    raw.call(b"get %s\r\n" % q, b"VALUE %s 0 4\r\nkeep\r\nEND\r\n" % q)
    raw.call(b"flush_expired %s\r\n" % q, b"0\r\n")
    raw.call(b"flush_all_expired\r\n", b"0\r\n")


def test_flush_expired_counts(raw: Raw, qname: str) -> None:
    q = qname.encode()
    raw.call(b"get %s\r\n" % q, b"END\r\n")  # create the queue
    # Expired items at the head are dropped by a flush_expired, never returned.
    raw.call(set_cmd(qname, b"a", exptime=-5) + set_cmd(qname, b"b", exptime=-5), b"STORED\r\n" * 2)
    raw.send(b"flush_expired %s\r\n" % q)
    # The second add already dropped the expired head; the sweep may have run too.
    assert raw.read_line() in (b"1\r\n", b"0\r\n")
    raw.call(b"get %s\r\n" % q, b"END\r\n")


def test_version_and_unknown(raw: Raw) -> None:
    raw.send(b"version\r\n")
    assert raw.read_line().startswith(b"VERSION ")
    raw.call(b"bogus\r\n", b"ERROR\r\n")
    raw.call(b"\r\n", b"ERROR\r\n")
    raw.call(b"VERSION\r\n", b"VERSION ")
    raw.read_line()


def test_unsupported_storage_commands_consume_payload(raw: Raw) -> None:
    raw.call(b"add q 0 0 5\r\nhello\r\nversion\r\n", b"ERROR\r\nVERSION ")
    raw.read_line()
    raw.call(b"cas q 0 0 1 99\r\nx\r\n", b"ERROR\r\n")


def test_client_errors_keep_connection(raw: Raw, qname: str) -> None:
    raw.call(b"get ../x\r\n", b"CLIENT_ERROR bad queue name\r\n")
    raw.call(b"get q.x\r\n", b"CLIENT_ERROR bad queue name\r\n")
    raw.call(b"get %s/x\r\n" % qname.encode(), b"CLIENT_ERROR unknown get option x\r\n")
    raw.call(
        b"get %s/open/peek\r\n" % qname.encode(),
        b"CLIENT_ERROR peek and abort cannot be combined with open or close\r\n",
    )
    raw.call(b"get\r\n", b"CLIENT_ERROR missing queue name\r\n")
    raw.call(b"set ../x 0 0 1\r\nx\r\n", b"CLIENT_ERROR bad queue name\r\n")
    raw.call(b"set q x 0 1\r\nx\r\n", b"CLIENT_ERROR bad flags\r\n")
    raw.call(b"get %s/t=abc\r\n" % qname.encode(), b"CLIENT_ERROR bad timeout\r\n")
    raw.call(set_cmd(qname, b"ok"), b"STORED\r\n")


def test_fatal_errors_close(server: ServerProcess) -> None:
    for request, reply in [
        (b"set q 0 0 3\r\nabcdef\r\n", b"CLIENT_ERROR bad data chunk\r\n"),
        (b"set q 0 0 99999999999\r\n", b"CLIENT_ERROR object too large for cache\r\n"),
        (b"set q 0 0 -1\r\n", b"CLIENT_ERROR bad data chunk size\r\n"),
        (b"set q 0 0\r\n", b"CLIENT_ERROR bad command line format\r\n"),
        (b"x" * 9000, b"CLIENT_ERROR line too long\r\n"),
    ]:
        conn = Raw(server.connect())
        conn.call(request, reply)
        assert conn.closed()
        conn.close()


def test_item_too_large_keeps_connection(tmp_path: object) -> None:
    import pathlib

    assert isinstance(tmp_path, pathlib.Path)
    with ServerProcess(tmp_path / "d", "[queues]\nmax_item_size = 4\n") as srv:
        raw = Raw(srv.connect())
        raw.call(set_cmd("q", b"12345"), b"CLIENT_ERROR item too large\r\n")
        raw.call(set_cmd("q", b"1234"), b"STORED\r\n")  # the cap is inclusive


def test_full_queue(tmp_path: object) -> None:
    import pathlib

    assert isinstance(tmp_path, pathlib.Path)
    config = "[queues.q]\nmax_items = 2\n[queues.d]\nmax_items = 2\ndiscard_old_when_full = true\n"
    with ServerProcess(tmp_path / "d", config) as srv:
        raw = Raw(srv.connect())
        raw.call(
            set_cmd("q", b"1") + set_cmd("q", b"2") + set_cmd("q", b"3"),
            b"STORED\r\nSTORED\r\nNOT_STORED\r\n",
        )
        raw.call(set_cmd("d", b"1") + set_cmd("d", b"2") + set_cmd("d", b"3"), b"STORED\r\n" * 3)
        raw.call(b"get d\r\n", b"VALUE d 0 1\r\n2\r\nEND\r\n")
        raw.send(b"dump_stats d\r\n")
        lines = [raw.read_line() for _ in range(19)]
        assert b"  discarded=1\r\n" in lines


def test_stats_lines(raw: Raw, qname: str) -> None:
    raw.call(set_cmd(qname, b"abc"), b"STORED\r\n")
    raw.send(b"stats\r\n")
    lines = []
    while not lines or lines[-1] != b"END\r\n":
        lines.append(raw.read_line())
    names = [line.split()[1].decode() for line in lines[:-1]]
    assert names[:19] == [
        "uptime", "time", "version", "curr_items", "total_items", "bytes",
        "reserved_memory_ratio", "curr_connections", "total_connections", "cmd_get", "cmd_set",
        "cmd_peek", "get_hits", "get_misses", "bytes_read", "bytes_written", "queue_creates",
        "queue_deletes", "queue_expires",
    ]  # fmt: skip
    per_queue = [n[len(f"queue_{qname}_") :] for n in names if n.startswith(f"queue_{qname}_")]
    assert per_queue == [
        "items", "bytes", "total_items", "logsize", "expired_items", "mem_items", "mem_bytes",
        "age", "discarded", "waiters", "open_transactions", "transactions",
        "canceled_transactions", "total_flushes", "journal_rewrites", "journal_rotations",
        "open_leases", "dead_lettered", "keyed_leases", "keyed_items", "keyed_oldest_age",
    ]  # fmt: skip
    assert f"STAT queue_{qname}_items 1\r\n".encode() in lines
    assert f"STAT queue_{qname}_bytes 3\r\n".encode() in lines


def test_dump_stats(raw: Raw, qname: str) -> None:
    q = qname.encode()
    raw.call(set_cmd(qname, b"abc"), b"STORED\r\n")
    raw.send(b"dump_stats %s\r\n" % q)
    assert raw.read_line() == b"queue '%s' {\r\n" % q
    assert raw.read_line() == b"  items=1\r\n"
    while raw.read_line() != b"}\r\n":
        pass
    raw.expect(b"END\r\n")
    raw.call(b"dump_stats nosuch_%s\r\n" % q, b"queue 'nosuch_%s' {\r\n}\r\nEND\r\n" % q)


def test_dump_config(raw: Raw, qname: str) -> None:
    raw.call(set_cmd(qname, b"abc"), b"STORED\r\n")
    raw.send(b"dump_config\r\n")
    lines = []
    while not lines or lines[-1] != b"END\r\n":
        lines.append(raw.read_line())
    i = lines.index(b"queue '%s' {\r\n" % qname.encode())
    assert lines[i + 1] == b"  max_items=9223372036854775807\r\n"
    assert b"  sync_journal=false\r\n" in lines[i:]


def test_reload_without_config_file(raw: Raw) -> None:
    raw.call(b"reload\r\n", b"Reloaded config.\r\n")


def test_quit_closes(server: ServerProcess) -> None:
    conn = Raw(server.connect())
    conn.send(b"version\r\nquit\r\nversion\r\n")
    assert conn.read_line().startswith(b"VERSION")
    assert conn.closed()


def test_pipelined_batch_replies_in_order(raw: Raw, qname: str) -> None:
    q = qname.encode()
    batch = b"".join(set_cmd(qname, b"%03d" % i) for i in range(200))
    batch += b"".join(b"get %s\r\n" % q for _ in range(200))
    raw.send(batch)
    raw.expect(b"STORED\r\n" * 200)
    for i in range(200):
        raw.expect(b"VALUE %s 0 3\r\n%03d\r\nEND\r\n" % (q, i))


def test_byte_by_byte_requests(server: ServerProcess, qname: str) -> None:
    sock = server.connect()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = Raw(sock)
    for b in set_cmd(qname, b"slow") + b"get %s\r\n" % qname.encode():
        conn.send(bytes([b]))
    conn.expect(b"STORED\r\nVALUE %s 0 4\r\nslow\r\nEND\r\n" % qname.encode())
