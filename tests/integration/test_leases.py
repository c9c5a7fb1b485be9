"""Leases, features, monitor/confirm and dead-lettering against real servers, byte-exact."""

from __future__ import annotations

import re
import struct
import sys
import time
from pathlib import Path

import pytest

from support import Raw
from tercel.client import Client
from tercel.testing import ServerProcess

LEASED = re.compile(rb"LEASED (\S+) (\d+) (\d+) (\d+) (\d+) (\d+)\r\n")


def set_cmd(q: str, data: bytes) -> bytes:
    return b"set %s 0 0 %d\r\n%s\r\n" % (q.encode(), len(data), data)


def put(conn: Raw, q: str, *items: bytes) -> None:
    conn.call(b"".join(set_cmd(q, i) for i in items), b"STORED\r\n" * len(items))


def read_leases(conn: Raw) -> list[tuple[str, int, int, int, bytes]]:
    """One lease reply: (lease_id, item_id, deliveries, expiry_ms, data) per item."""
    out = []
    while True:
        line = conn.read_line()
        if line == b"END\r\n":
            return out
        m = LEASED.fullmatch(line)
        assert m, line
        data = conn.read_exact(int(m.group(6)))
        conn.expect(b"\r\n")
        out.append((m.group(1).decode(), int(m.group(2)), int(m.group(3)), int(m.group(5)), data))


def lease(conn: Raw, q: str, n: int, wait_ms: int = 0, lease_ms: int = 60_000) -> list:
    conn.send(b"lease %s %d %d %d\r\n" % (q.encode(), n, wait_ms, lease_ms))
    return read_leases(conn)


def ids(leases: list) -> bytes:
    return b" ".join(lease[0].encode() for lease in leases)


def drain(conn: Raw, q: str) -> list[bytes]:
    return [x[4] for x in lease_all(conn, q)]


def lease_all(conn: Raw, q: str) -> list:
    got = lease(conn, q, 10_000)
    if got:
        conn.call(b"ack %s %s\r\n" % (q.encode(), ids(got)), b"ACKED %d\r\n" % len(got))
    return got


def test_features(raw: Raw) -> None:
    raw.call(
        b"features\r\n",
        b"FEATURE lease 1\r\nFEATURE item-id 1\r\nFEATURE dead-letter 1\r\nFEATURE monitor 1\r\n"
        b"FEATURE lease-binary 1\r\nFEATURE dedup 1\r\nEND\r\n",
    )


def test_lease_reply_format_and_ack_from_another_connection(
    server: ServerProcess, raw: Raw, qname: str
) -> None:
    q = qname.encode()
    put(raw, qname, b"a", b"bb", b"ccc")
    raw.send(b"lease %s 2 0 0\r\n" % q)
    first = raw.read_line()
    m = LEASED.fullmatch(first)
    assert m and m.group(2, 3, 5, 6) == (b"1", b"1", b"0", b"1")  # id 1, 1st delivery, no expiry
    raw.expect(b"a\r\n")
    rest = read_leases(raw)
    assert [(x[1], x[2], x[4]) for x in rest] == [(2, 1, b"bb")]
    lease_a = m.group(1)
    other = Raw(server.connect())
    # Unknown ids and repeats are ignored; ids belong to their queue.
    other.call(b"ack %s_other %s\r\n" % (q, lease_a), b"ACKED 0\r\n")
    other.call(b"ack %s %s %s bogus\r\n" % (q, lease_a, lease_a), b"ACKED 1\r\n")
    other.call(b"ack %s %s\r\n" % (q, lease_a), b"ACKED 0\r\n")
    raw.close()  # the lease on bb outlives its connection
    other.call(b"get %s\r\n" % q, b"VALUE %s 0 3\r\nccc\r\nEND\r\n" % q)
    other.call(b"release %s %s\r\n" % (q, rest[0][0].encode()), b"RELEASED 1\r\n")
    again = lease(other, qname, 5)
    assert [(x[1], x[2], x[4]) for x in again] == [(2, 2, b"bb")]  # same id, 2nd delivery


def test_release_keeps_queue_order(raw: Raw, qname: str) -> None:
    q = qname.encode()
    put(raw, qname, b"1", b"2", b"3", b"4")
    got = lease(raw, qname, 3)
    raw.call(b"release %s %s\r\n" % (q, ids(got)), b"RELEASED 3\r\n")
    raw.call(b"release %s %s\r\n" % (q, ids(got)), b"RELEASED 0\r\n")
    assert drain(raw, qname) == [b"1", b"2", b"3", b"4"]


def test_expiry_returns_items_to_the_head(raw: Raw, qname: str) -> None:
    q = qname.encode()
    put(raw, qname, b"x", b"y")
    first = lease(raw, qname, 2, lease_ms=50)
    assert first[0][3] == 0  # the item's own expiry: none
    # Blocks while empty; the expiry hands both items back, in order, to this waiting lease.
    again = lease(raw, qname, 2, wait_ms=10_000)
    assert [(x[4], x[2]) for x in again] == [(b"x", 2), (b"y", 2)]
    raw.call(b"ack %s %s\r\n" % (q, ids(first)), b"ACKED 0\r\n")  # expired ids are stale
    raw.call(b"ack %s %s\r\n" % (q, ids(again)), b"ACKED 2\r\n")


def test_renew_keeps_a_lease(raw: Raw, qname: str) -> None:
    q = qname.encode()
    put(raw, qname, b"keep", b"lose")
    got = lease(raw, qname, 2, lease_ms=100)
    raw.call(b"renew %s 600000 %s\r\n" % (q, got[0][0].encode()), b"RENEWED 1\r\n")
    # Only the item whose lease was not renewed comes back.
    back = lease(raw, qname, 2, wait_ms=10_000)
    assert [x[4] for x in back] == [b"lose"]
    raw.call(b"ack %s %s\r\n" % (q, got[0][0].encode()), b"ACKED 1\r\n")


def test_blocked_lease_is_served_by_a_set(server: ServerProcess, raw: Raw, qname: str) -> None:
    raw.send(b"lease %s 10 10000 60000\r\nversion\r\n" % qname.encode())
    other = Raw(server.connect())
    put(other, qname, b"late")
    got = read_leases(raw)
    assert [x[4] for x in got] == [b"late"]
    assert raw.read_line().startswith(b"VERSION ")  # the pipelined command answers after


def test_lease_waits_only_while_empty_and_times_out(raw: Raw, qname: str) -> None:
    raw.call(b"lease %s 5 30 1000\r\n" % qname.encode(), b"END\r\n")
    raw.call(b"lease %s 0 30 1000\r\n" % qname.encode(), b"END\r\n")


def test_bad_lease_commands_keep_the_connection(raw: Raw, qname: str) -> None:
    q = qname.encode()
    raw.call(
        b"lease %s\r\n" % q,
        b"CLIENT_ERROR usage: lease <queue> <max_items> <wait_ms> <lease_ms> [binary]\r\n",
    )
    for tail in (b"bogus", b"binary x", b"BINARY"):
        raw.call(
            b"lease %s 1 0 0 %s\r\n" % (q, tail),
            b"CLIENT_ERROR usage: lease <queue> <max_items> <wait_ms> <lease_ms> [binary]\r\n",
        )
    raw.call(b"lease %s -1 0 0\r\n" % q, b"CLIENT_ERROR bad max_items\r\n")
    raw.call(b"renew %s x abc\r\n" % q, b"CLIENT_ERROR bad lease_ms\r\n")
    raw.call(b"ack bad/name x\r\n", b"CLIENT_ERROR bad queue name\r\n")
    raw.call(b"ack %s\r\n" % q, b"ACKED 0\r\n")


def test_long_id_lines_only_for_ack_release_renew(raw: Raw, qname: str) -> None:
    q = qname.encode()
    put(raw, qname, *[b"%d" % i for i in range(3)])
    got = lease(raw, qname, 3)
    filler = b" ".join(b"00000000-%x" % i for i in range(5000))  # ~70 KB
    raw.call(b"ack %s %s %s\r\n" % (q, filler, ids(got)), b"ACKED 3\r\n")
    raw.call(b"RELEASE %s %s\r\n" % (q, filler), b"RELEASED 0\r\n")
    raw.call(b"get %s%s\r\n" % (q, b"x" * 9000), b"CLIENT_ERROR line too long\r\n")
    assert raw.closed()


def test_monitor_and_confirm(raw: Raw, qname: str) -> None:
    q = qname.encode()
    put(raw, qname, b"1", b"2", b"3")
    raw.call(
        b"monitor %s 0 2\r\n" % q,
        b"VALUE %s 0 1\r\n1\r\nEND\r\nVALUE %s 0 1\r\n2\r\nEND\r\nEND\r\n" % (q, q),
    )
    raw.call(b"confirm %s 3\r\n" % q, b"ERROR\r\n")  # more than are open: nothing confirmed
    raw.call(b"confirm %s 1\r\n" % q, b"END\r\n")
    raw.call(b"get %s/abort\r\n" % q, b"END\r\n")  # 2 goes back
    # A monitor with time left waits for items.
    raw.call(
        b"monitor %s 5 2\r\n" % q,
        b"VALUE %s 0 1\r\n2\r\nEND\r\nVALUE %s 0 1\r\n3\r\nEND\r\nEND\r\n" % (q, q),
    )
    raw.call(b"confirm %s 2\r\n" % q, b"END\r\n")
    raw.call(b"get %s\r\n" % q, b"END\r\n")


def test_restart_returns_leases_in_order_and_old_ids_are_stale(data_dir: Path) -> None:
    with ServerProcess(data_dir) as srv:
        conn = Raw(srv.connect())
        put(conn, "q", b"a", b"b", b"c")
        got = lease(conn, "q", 2)
        srv.kill()
        srv.start()
        conn = Raw(srv.connect())
        conn.call(b"ack q %s\r\n" % ids(got), b"ACKED 0\r\n")
        again = lease(conn, "q", 3)
        # Same item ids, delivery counts survived the crash, original order.
        assert [(x[1], x[2], x[4]) for x in again] == [(1, 2, b"a"), (2, 2, b"b"), (3, 1, b"c")]
        assert not set(ids(got).split()) & set(ids(again).split())


def test_ack_is_journaled_before_its_reply(data_dir: Path) -> None:
    with ServerProcess(data_dir, "[queues]\nsync_journal = true\n") as srv:
        conn = Raw(srv.connect())
        put(conn, "q", *[b"%d" % i for i in range(100)])
        got = lease(conn, "q", 100)
        conn.call(b"ack q %s\r\n" % ids(got[:60]), b"ACKED 60\r\n")
        srv.kill()  # right after the reply: the CONFIRMs must already be in the file
        srv.start()
        assert drain(Raw(srv.connect()), "q") == [b"%d" % i for i in range(60, 100)]


def test_dead_letter_after_max_deliveries(data_dir: Path) -> None:
    config = '[queues.work]\nmax_deliveries = 2\ndead_letter_queue = "dead"\n'
    with ServerProcess(data_dir, config) as srv:
        conn = Raw(srv.connect())
        put(conn, "work", b"poison", b"fine")
        for _ in range(2):
            got = lease(conn, "work", 1)
            assert got[0][4] == b"poison"
            conn.call(b"release work %s\r\n" % ids(got), b"RELEASED 1\r\n")
        # A third delivery would exceed max_deliveries: the item moves, the next one is served.
        got = lease(conn, "work", 5)
        assert [x[4] for x in got] == [b"fine"]
        conn.call(b"ack work %s\r\n" % ids(got), b"ACKED 1\r\n")
        conn.call(b"get work/open\r\n", b"END\r\n")
        conn.call(b"get dead\r\n", b"VALUE dead 0 6\r\npoison\r\nEND\r\n")
        # Open reads count as deliveries too, and the count survives a crash.
        put(conn, "work", b"again")
        conn.call(b"get work/open\r\n", b"VALUE work/open 0 5\r\nagain\r\nEND\r\n")
        srv.kill()
        srv.start()
        conn = Raw(srv.connect())
        conn.call(b"get work/open\r\n", b"VALUE work/open 0 5\r\nagain\r\nEND\r\n")
        conn.call(b"get work/abort\r\n", b"END\r\n")
        conn.call(b"get work/open\r\n", b"END\r\n")
        conn.call(b"get dead\r\n", b"VALUE dead 0 5\r\nagain\r\nEND\r\n")


def test_max_open_leases(data_dir: Path) -> None:
    with ServerProcess(data_dir, "[queues]\nmax_open_leases = 2\n") as srv:
        conn = Raw(srv.connect())
        put(conn, "q", b"1", b"2", b"3")
        assert len(lease(conn, "q", 5)) == 2
        conn.call(b"lease q 1 0 0\r\n", b"SERVER_ERROR too many open leases\r\n")
        # Open reads are not leases: max_open_reads still applies to them.
        conn.call(b"get q/open\r\n", b"VALUE q/open 0 1\r\n3\r\nEND\r\n")


def stats(conn: Raw) -> bytes:
    conn.send(b"stats\r\n")
    lines = []
    while (line := conn.read_line()) != b"END\r\n":
        lines.append(line)
    return b"".join(lines)


def test_blocked_leases_do_not_exceed_max_open_leases(data_dir: Path) -> None:
    """Each blocked lease was admitted while the queue had room; served later, the one that
    would go past the limit gives its item back and gets the no-room answer (issue 21)."""
    with ServerProcess(data_dir, "[queues]\nmax_open_leases = 1\n") as srv:
        first, second, producer = (Raw(srv.connect()) for _ in range(3))
        first.send(b"lease q 1 10000 60000\r\n")
        second.send(b"lease q 1 10000 60000\r\n")
        while b"STAT queue_q_waiters 2\r\n" not in stats(producer):  # both are parked
            pass
        put(producer, "q", b"1", b"2")
        got = read_leases(first)
        assert [x[4] for x in got] == [b"1"]
        second.expect(b"SERVER_ERROR too many open leases\r\n")
        second.send(b"version\r\n")  # the connection goes on
        assert second.read_line().startswith(b"VERSION ")
        producer.call(b"get q\r\n", b"VALUE q 0 1\r\n2\r\nEND\r\n")  # the item went back


@pytest.mark.parametrize(
    ("line", "reply"),
    [
        (b"ack nosuchqueue abc-1", b"ACKED 0"),
        (b"release nosuchqueue abc-1", b"RELEASED 0"),
        (b"renew nosuchqueue 1000 abc-1", b"RENEWED 0"),
    ],
)
def test_lease_verbs_on_a_missing_queue(raw: Raw, line: bytes, reply: bytes) -> None:
    raw.call(line + b"\r\n", reply + b"\r\n")


def test_leased_carries_the_items_own_expiry(raw: Raw, qname: str) -> None:
    before = int(time.time() * 1000)
    raw.call(b"set %s 0 3600 1\r\nx\r\n" % qname.encode(), b"STORED\r\n")
    ((_, _, _, expiry_ms, data),) = lease(raw, qname, 1, lease_ms=50)
    assert data == b"x" and before + 3_599_000 <= expiry_ms <= int(time.time() * 1000) + 3_600_000


def read_binary_leases(conn: Raw) -> list[tuple[str, int, int, int, bytes]]:
    """One ``lease ... binary`` reply read by the byte layout of docs/protocol.md section 11
    (independently of the client codec): (lease_id, item_id, deliveries, expiry_ms, data)."""
    line = conn.read_line()
    if line == b"END\r\n":
        return []
    word, n_text, prefix, size_text = line.split()
    assert word == b"LEASEDB", line
    n, size = int(n_text), int(size_text)
    ints = struct.unpack(f"<{4 * n}q", conn.read_exact(32 * n))
    deliveries = struct.unpack(f"<{n}i", conn.read_exact(4 * n))
    offsets = struct.unpack(f"<{n + 1}i", conn.read_exact(4 * (n + 1)))
    data = conn.read_exact(size)
    conn.expect(b"\r\nEND\r\n")
    item_ids, expiry, numbers = ints[:n], ints[2 * n : 3 * n], ints[3 * n :]
    assert offsets[0] == 0 and offsets[-1] == size
    return [
        (
            f"{prefix.decode()}-{numbers[k]:x}",
            item_ids[k],
            deliveries[k],
            expiry[k],
            data[offsets[k] : offsets[k + 1]],
        )
        for k in range(n)
    ]


def test_binary_lease_reply_carries_what_the_text_one_does(
    server: ServerProcess, raw: Raw, qname: str
) -> None:
    q = qname.encode()
    items = [b"a", b"", b"\r\nEND\r\n", bytes(range(256)), b"z" * 70_000]
    put(raw, qname, *items)
    text = lease(raw, qname, 10)
    raw.call(b"release %s %s\r\n" % (q, ids(text)), b"RELEASED 5\r\n")
    raw.send(b"lease %s 10 0 0 binary\r\n" % q)
    binary = read_binary_leases(raw)
    # The same items, ids and payloads; deliveries one more; new lease ids.
    assert [x[1:] for x in binary] == [(i, d + 1, e, p) for _, i, d, e, p in text]
    assert [x[4] for x in binary] == items
    assert not {x[0] for x in binary} & {x[0] for x in text}
    raw.call(b"ack %s %s\r\n" % (q, ids(binary)), b"ACKED 5\r\n")
    raw.call(b"lease %s 10 0 0 binary\r\n" % q, b"END\r\n")
    # The client asks for it and parses it into columns.
    put(raw, qname, b"one", b"two")
    with Client(server.address) as client:
        where, cols = client.lease_columns(qname, 10, None, lease_time=30)
        assert (where, cols.lease_ids[0][:9], bytes(cols.data)) == (
            server.address,
            binary[0][0][:9],
            b"onetwo",
        )
        assert client.ack_ids(where, qname, cols.lease_ids) == 2


def test_blocked_binary_lease_is_served_by_a_set(
    server: ServerProcess, raw: Raw, qname: str
) -> None:
    raw.send(b"lease %s 10 10000 60000 binary\r\nversion\r\n" % qname.encode())
    other = Raw(server.connect())
    put(other, qname, b"late")
    got = read_binary_leases(raw)
    assert [(x[2], x[4]) for x in got] == [(1, b"late")]
    assert raw.read_line().startswith(b"VERSION ")


CAPPED = (sys.executable, str(Path(__file__).with_name("capped_serve.py")), "1000")
"""A real server whose binary lease replies carry at most 1000 payload bytes (2^31 - 1 normally:
the launcher lowers the cap, so the cut is tested without 2 GiB of items)."""


def test_binary_lease_reply_is_cut_at_its_byte_cap(data_dir: Path) -> None:
    """docs/protocol.md section 11: the payloads of one ``LEASEDB`` reply total at most the cap
    (a reply exactly at it is whole); the items past it stay at the head of the queue, in
    order, unsent and not counted as delivered, and the next lease gets them; acked ones never
    come back, even over a kill -9. (Before, the items past the cap were opened and handed
    back: each cut counted as a delivery, journaled, so ``max_deliveries`` could dead-letter
    an item no client ever saw.)"""
    items = [b"%03d" % i + b"x" * 247 for i in range(10)]  # 250 B: 4 fill the 1000-byte cap
    with ServerProcess(data_dir, launcher=CAPPED) as srv:
        conn = Raw(srv.connect())
        put(conn, "q", *items)
        conn.send(b"lease q 10 0 60000 binary\r\n")
        first = read_binary_leases(conn)
        assert [(x[1], x[2], x[4]) for x in first] == [(i + 1, 1, items[i]) for i in range(4)]
        conn.call(b"ack q %s\r\n" % ids(first), b"ACKED 4\r\n")
        # The client reads a cut reply like any other; the cut items come next, in order.
        with Client(srv.address) as client:
            _, cols = client.lease_columns("q", 10, None, lease_time=60)
            assert list(cols.item_ids) == [5, 6, 7, 8]
            assert list(cols.deliveries) == [1, 1, 1, 1]
            assert bytes(cols.data) == b"".join(items[4:8])
        srv.kill()
        srv.start()
        conn = Raw(srv.connect())
        conn.send(b"lease q 10 0 60000 binary\r\n")
        again = read_binary_leases(conn)  # leased before the crash: their second delivery
        assert [(x[1], x[2], x[4]) for x in again] == [(i + 1, 2, items[i]) for i in range(4, 8)]
        conn.send(b"lease q 10 0 60000 binary\r\n")
        rest = read_binary_leases(conn)
        assert [(x[1], x[2], x[4]) for x in rest] == [(9, 1, items[8]), (10, 1, items[9])]
        # A text reply has no int32 offsets and is not cut.
        conn.call(b"release q %s\r\n" % ids(again + rest), b"RELEASED 6\r\n")
        assert [x[4] for x in lease(conn, "q", 10)] == items[4:]


def test_blocked_binary_lease_is_cut_at_its_byte_cap(data_dir: Path) -> None:
    """A blocked binary lease takes its first item when it comes, then what else is queued by
    then, up to the cap with the first item counted: however the sets were split between the
    two, every reply stays under the cap and every item comes once, in order, first delivery."""
    items = [b"%03d" % i + b"y" * 397 for i in range(4)]  # 400 B: 2 fit under 1000
    with ServerProcess(data_dir, launcher=CAPPED) as srv:
        conn = Raw(srv.connect())
        conn.send(b"lease q 10 10000 60000 binary\r\nversion\r\n")
        put(Raw(srv.connect()), "q", *items)
        replies = [read_binary_leases(conn)]
        assert conn.read_line().startswith(b"VERSION ")
        while len(got := [x for reply in replies for x in reply]) < len(items):
            conn.send(b"lease q 10 0 60000 binary\r\n")
            replies.append(read_binary_leases(conn))
            assert replies[-1]
        assert all(sum(len(x[4]) for x in reply) <= 1000 for reply in replies)
        assert [(x[2], x[4]) for x in got] == [(1, item) for item in items]
