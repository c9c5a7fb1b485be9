"""Keyed leases on the memcache port and in ``tercel.client``, against real servers
(docs/protocol.md section 11, "Keyed leases"): a key gives the same items in the same order from
any connection and after a SIGKILL and restart, is read in slices, is taken without payloads,
ends whole (ack, release, expiry) and is never taken again; every bad input is refused with a
reason naming the rule and changes nothing; the figures are shown on every surface."""

from __future__ import annotations

import asyncio
import json
import re
import struct
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import Raw, set_cmd, stats, track
from tercel.client import AsyncClient, Client, KeyedLease
from tercel.errors import BadRequest, ServerReplyError
from tercel.testing import ServerProcess

LEASED = re.compile(rb"LEASED (\S+) (\d+) (\d+) (\d+) (\d+) (\d+)\r\n")
KEYED = re.compile(rb"KEYED (\d+) (\d+) (\d+)\r\n")


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.address) as c:
        yield c


def put(conn: Raw, q: str, *items: bytes) -> None:
    conn.call(b"".join(set_cmd(q, i) for i in items), b"STORED\r\n" * len(items))


def read_items(conn: Raw) -> list[tuple[str, int, int, bytes]]:
    """One text reply: (lease_id, item_id, deliveries, data) per item, up to END."""
    out = []
    while (line := conn.read_line()) != b"END\r\n":
        m = LEASED.fullmatch(line)
        assert m, line
        data = conn.read_exact(int(m.group(6)))
        conn.expect(b"\r\n")
        out.append((m.group(1).decode(), int(m.group(2)), int(m.group(3)), data))
    return out


def keyed_take(conn: Raw, q: str, key: str, n: int, lease_ms: int = 600_000) -> list:
    conn.send(b"lease %b %d 0 %d key=%b\r\n" % (q.encode(), n, lease_ms, key.encode()))
    return read_items(conn)


def error(conn: Raw, request: bytes) -> str:
    """The reason of the CLIENT_ERROR ``request`` gets."""
    conn.send(request)
    line = conn.read_line()
    assert line.startswith(b"CLIENT_ERROR "), line
    return line[len(b"CLIENT_ERROR ") : -2].decode()


def items_of(conn: Raw, q: str) -> int:
    return int(stats(conn)[f"queue_{q}_items"])


def test_features_announce_lease_key(raw: Raw) -> None:
    raw.send(b"features\r\n")
    lines = []
    while (line := raw.read_line()) != b"END\r\n":
        lines.append(line)
    assert b"FEATURE lease-key 1\r\n" in lines


def test_take_again_from_another_connection_is_identical(
    server: ServerProcess, raw: Raw, qname: str
) -> None:
    put(raw, qname, b"a", b"bb", b"ccc", b"dddd")
    first = keyed_take(raw, qname, "batch-1", 3)
    assert [(x[0], x[3]) for x in first] == [("key-0", b"a"), ("key-1", b"bb"), ("key-2", b"ccc")]
    assert [x[2] for x in first] == [1, 1, 1]  # delivered once
    other = track(Raw(server.connect()))
    assert keyed_take(other, qname, "batch-1", 3) == first  # nothing new taken, same order
    assert items_of(other, qname) == 1  # "dddd" still waits
    # A plain lease gets what the key did not take.
    other.send(b"lease %b 10 0 0\r\n" % qname.encode())
    assert [x[3] for x in read_items(other)] == [b"dddd"]


def test_nodata_moves_no_payload(raw: Raw, qname: str) -> None:
    big = b"x" * 50_000
    put(raw, qname, big, big, big)
    raw.send(b"lease %b 5 0 60000 key=plan.1 nodata\r\n" % qname.encode())
    line = raw.read_line()  # the whole reply: one short line
    m = KEYED.fullmatch(line)
    assert m and int(m.group(1)) == 3 and int(m.group(2)) == 150_000, line
    assert int(m.group(3)) > time.time() * 1000  # expires_ms, in the future
    assert len(line) < 64
    # Taken again without nodata: the same three items, payloads and all.
    assert [x[3] for x in keyed_take(raw, qname, "plan.1", 5)] == [big, big, big]


def test_nothing_ready_creates_no_key(raw: Raw, qname: str) -> None:
    raw.call(b"lease %b 5 0 0 key=early nodata\r\n" % qname.encode(), b"KEYED 0 0 0\r\n")
    raw.call(b"lease %b 5 0 0 key=early\r\n" % qname.encode(), b"END\r\n")
    put(raw, qname, b"late")
    assert [x[3] for x in keyed_take(raw, qname, "early", 5)] == [b"late"]


def test_a_take_that_waits_gets_an_item_put_later(
    server: ServerProcess, raw: Raw, qname: str
) -> None:
    raw.send(b"lease %b 2 30000 0 key=waited nodata\r\n" % qname.encode())
    other = track(Raw(server.connect()))
    put(other, qname, b"one")
    m = KEYED.fullmatch(raw.read_line())
    assert m and m.group(1, 2) == (b"1", b"3")
    raw.call(b"lease %b 2 100 0 key=waited-empty nodata\r\n" % qname.encode(), b"KEYED 0 0 0\r\n")


def test_slices_text_and_binary(raw: Raw, qname: str) -> None:
    put(raw, qname, b"p0", b"p1", b"p2", b"p3")
    raw.send(b"lease %b 4 0 0 key=s nodata\r\n" % qname.encode())
    assert KEYED.fullmatch(raw.read_line())
    raw.send(b"lease %b slice 1 3 key=s\r\n" % qname.encode())
    assert [(x[0], x[3]) for x in read_items(raw)] == [("key-1", b"p1"), ("key-2", b"p2")]
    raw.call(b"lease %b slice 2 2 key=s\r\n" % qname.encode(), b"END\r\n")
    raw.send(b"lease %b slice 1 3 binary key=s\r\n" % qname.encode())
    head = raw.read_line()
    assert head == b"LEASEDB 2 key 4\r\n", head
    table = raw.read_exact(40 * 2 + 4)
    ids, add_ms, expiry, numbers = (struct.unpack_from("<2q", table, 16 * i) for i in range(4))
    assert ids == (2, 3) and numbers == (1, 2) and expiry == (0, 0) and min(add_ms) > 0
    assert struct.unpack_from("<2i3i", table, 64) == (1, 1, 0, 2, 4)  # deliveries, offsets
    raw.expect(b"p1p2\r\nEND\r\n")


def test_client_lease_key_and_slices_from_two_clients(server: ServerProcess, qname: str) -> None:
    with Client(server.address) as a, Client(server.address) as b:
        a.put_many(qname, [b"item%d" % i for i in range(10)])
        lease = a.lease_key(server.address, qname, "tercel.q.0", 8, lease_time=60)
        assert isinstance(lease, KeyedLease)
        assert (lease.server, lease.queue, lease.key) == (server.address, qname, "tercel.q.0")
        assert (lease.count, lease.size) == (8, 40)
        assert time.time() < lease.expires_at < time.time() + 61
        assert b.lease_key(server.address, qname, "tercel.q.0", 8) == lease  # the planner again
        left = a.lease_slice(server.address, qname, "tercel.q.0", 0, 5)
        right = b.lease_slice(server.address, qname, "tercel.q.0", 5, 8)
        payloads = [
            bytes(c.data[c.offsets[k] : c.offsets[k + 1]])
            for c in (left, right)
            for k in range(len(c))
        ]
        assert payloads == [b"item%d" % i for i in range(8)]
        assert list(left.item_ids) + list(right.item_ids) == list(range(1, 9))
        assert right.lease_ids == ["key-5", "key-6", "key-7"]
        assert len(a.lease_slice(server.address, qname, "tercel.q.0", 8, 8)) == 0
        expires = b.renew_key(server.address, qname, "tercel.q.0", 120)
        assert expires > lease.expires_at
        assert a.ack_key(server.address, qname, "tercel.q.0") == 8
        assert b.ack_key(server.address, qname, "tercel.q.0") == 0  # idempotent
        with pytest.raises(ServerReplyError, match="was acked"):
            a.lease_key(server.address, qname, "tercel.q.0", 8)
        assert a.get(qname) == b"item8"  # the acked items are gone for good


def test_client_validates_keys_before_sending(client: Client, server: ServerProcess) -> None:
    for bad in ("", "a b", "x" * 201, "é"):
        with pytest.raises(BadRequest, match="a key is 1-200 characters"):
            client.lease_key(server.address, "q", bad, 1)


def test_release_puts_items_back_in_order(raw: Raw, qname: str) -> None:
    put(raw, qname, b"r0", b"r1", b"r2", b"r3")
    assert len(keyed_take(raw, qname, "rel", 3)) == 3
    raw.call(b"release %b key=rel\r\n" % qname.encode(), b"RELEASED 3\r\n")
    raw.send(b"lease %b 10 0 0\r\n" % qname.encode())
    got = read_items(raw)
    assert [x[3] for x in got] == [b"r0", b"r1", b"r2", b"r3"]
    assert [x[2] for x in got] == [2, 2, 2, 1]  # the keyed take counted a delivery
    reason = error(raw, b"lease %b 3 0 0 key=rel\r\n" % qname.encode())
    assert reason == "lease key rel was released: a key is never taken again"


def test_ack_then_take_again_is_refused(raw: Raw, qname: str) -> None:
    put(raw, qname, b"k0", b"k1")
    keyed_take(raw, qname, "acked", 2)
    raw.call(b"ack %b key=acked\r\n" % qname.encode(), b"ACKED 2\r\n")
    raw.call(b"ack %b key=acked\r\n" % qname.encode(), b"ACKED 0\r\n")
    assert "was acked" in error(raw, b"lease %b 2 0 0 key=acked\r\n" % qname.encode())
    assert "was acked" in error(raw, b"lease %b slice 0 1 key=acked\r\n" % qname.encode())
    assert items_of(raw, qname) == 0


def test_expired_key_gives_items_back_and_is_never_taken_again(data_dir: Path) -> None:
    cfg = '[server]\nexpiration_timer_frequency = "50ms"\n'
    with ServerProcess(data_dir, cfg) as srv:
        conn = track(Raw(srv.connect()))
        put(conn, "exp", b"e0", b"e1")
        keyed_take(conn, "exp", "short", 2, lease_ms=100)
        for _ in range(10_000):  # the sweep's pass, polled over the wire
            if stats(conn)["queue_exp_items"] == "2":
                break
        else:
            raise AssertionError("the keyed lease never ran out")
        assert "was expired" in error(conn, b"lease exp 2 0 0 key=short\r\n")
        conn.send(b"lease exp 10 0 0\r\n")
        assert [x[3] for x in read_items(conn)] == [b"e0", b"e1"]


def test_same_key_same_items_after_sigkill(data_dir: Path) -> None:
    with ServerProcess(data_dir) as srv:
        with Client(srv.address) as c:
            c.put_many("dur", [b"d%d" % i for i in range(20)])
            lease = c.lease_key(srv.address, "dur", "k.1", 7, lease_time=600)
            before = c.lease_slice(srv.address, "dur", "k.1", 0, 7)
        srv.kill()
        srv.start()
        with Client(srv.address) as c:
            again = c.lease_key(srv.address, "dur", "k.1", 7)
            assert (again.count, again.size, again.expires_at) == (
                lease.count,
                lease.size,
                lease.expires_at,
            )
            after = c.lease_slice(srv.address, "dur", "k.1", 0, 7)
            assert list(after.item_ids) == list(before.item_ids)
            assert bytes(after.data) == bytes(before.data)
            assert list(after.offsets) == list(before.offsets)
            assert c.get("dur") == b"d7"  # nothing else was taken under the key
            assert c.ack_key(srv.address, "dur", "k.1") == 7


BAD_KEYS = [
    (b"key=", "empty key"),
    (b"key=" + b"k" * 201, "key too long (201 bytes)"),
    (b"key=a\xffb", "bad key"),
    (b"key=a,b", "bad key"),
]


@pytest.mark.parametrize(("word", "why"), BAD_KEYS)
def test_bad_keys_are_refused_naming_the_rule(raw: Raw, qname: str, word: bytes, why: str) -> None:
    put(raw, qname, b"x")
    q = qname.encode()
    for request in (
        b"lease %b 1 0 0 %b\r\n" % (q, word),
        b"lease %b slice 0 1 %b\r\n" % (q, word),
        b"ack %b %b\r\n" % (q, word),
        b"release %b %b\r\n" % (q, word),
        b"renew %b 10 %b\r\n" % (q, word),
    ):
        reason = error(raw, request)
        assert reason.startswith(why) and "a key is 1-200 characters" in reason, reason
    assert items_of(raw, qname) == 1


def test_other_bad_input_is_refused_and_changes_nothing(
    raw: Raw, qname: str, server: ServerProcess
) -> None:
    q = qname.encode()
    put(raw, qname, b"b0", b"b1", b"b2")
    keyed_take(raw, qname, f"{qname}.k", 2)
    k = f"{qname}.k".encode()
    cases = {
        b"lease other_%b 2 0 0 key=%b\r\n"
        % (q, k): f"lease key {qname}.k belongs to queue {qname}",
        b"ack other_%b key=%b\r\n" % (q, k): f"belongs to queue {qname}",
        b"lease %b 3 0 0 key=%b\r\n" % (q, k): "max_items",
        b"lease %b slice 1 3 key=%b\r\n" % (q, k): "past the end",
        b"lease %b slice 0 1 key=never-taken\r\n" % q: "never-taken",
        b"lease %b slice 2 1 key=%b\r\n" % (q, k): "stop before start",
        b"lease %b 0 0 0 key=%b\r\n" % (q, k): "at least 1 item",
        b"ack %b key-0\r\n" % q: "a keyed lease ends whole",
        b"release %b key-1\r\n" % q: "a keyed lease ends whole",
        b"ack %b key=%b key-0\r\n" % (q, k): "no lease ids",
        b"lease %b 2 0 0 key=%b key=%b\r\n" % (q, k, k): "usage: lease",
        b"lease %b 2 0 0 key=%b junk\r\n" % (q, k): "usage: lease",
    }
    for request, why in cases.items():
        assert why in error(raw, request), request
    assert items_of(raw, qname) == 1
    assert len(keyed_take(raw, qname, f"{qname}.k", 2)) == 2  # the key is as it was
    raw.call(b"ack %b key=%b\r\n" % (q, k), b"ACKED 2\r\n")


def test_forms_without_a_key_answer_as_before(raw: Raw, qname: str) -> None:
    q = qname.encode()
    raw.call(
        b"lease %b 1 0 0 junk\r\n" % q,
        b"CLIENT_ERROR usage: lease <queue> <max_items> <wait_ms> <lease_ms> [binary]\r\n",
    )
    raw.call(b"lease %b slice 0 1\r\n" % q, b"CLIENT_ERROR bad max_items\r\n")
    raw.call(b"ack %b nosuch-1\r\n" % q, b"ACKED 0\r\n")


def test_figures_on_every_surface(server: ServerProcess, raw: Raw, qname: str) -> None:
    put(raw, qname, b"f0", b"f1", b"f2")
    keyed_take(raw, qname, f"{qname}.fig", 2)
    st = stats(raw)
    assert st[f"queue_{qname}_keyed_leases"] == "1"
    assert st[f"queue_{qname}_keyed_items"] == "2"
    assert int(st[f"queue_{qname}_keyed_oldest_age"]) >= 0
    with urllib.request.urlopen(server.admin_url + "/stats.json") as r:
        gauges = json.load(r)["gauges"]
    assert gauges[f"q/{qname}/keyed_leases"] == 1
    assert gauges[f"q/{qname}/keyed_items"] == 2
    assert f"q/{qname}/keyed_oldest_age_msec" in gauges
    with urllib.request.urlopen(server.admin_url + "/metrics") as r:
        metrics = r.read().decode()
    assert f'tercel_keyed_leases{{queue="{qname}"}} 1' in metrics
    assert f'tercel_keyed_items{{queue="{qname}"}} 2' in metrics
    assert "# TYPE tercel_keyed_oldest_age_msec gauge" in metrics
    with urllib.request.urlopen(server.admin_url + f"/dashboard.json?search={qname}") as r:
        rows = json.load(r)["queues"]
    row = next(r for r in rows if r["name"] == qname)
    assert (row["keyed_leases"], row["keyed_items"]) == (1, 2)
    raw.call(b"ack %b key=%b.fig\r\n" % (qname.encode(), qname.encode()), b"ACKED 2\r\n")
    assert stats(raw)[f"queue_{qname}_keyed_leases"] == "0"


def test_a_keyed_lease_needs_the_right_to_take(data_dir: Path) -> None:
    from tercel.passwords import hash_password

    users = "".join(
        f'[users.{u}]\npassword = "{hash_password(u + "-pw", 16)}"\n'
        f'put = ["*"]\ntake = {json.dumps(take)}\n'
        for u, take in (("reader", ["ok-*"]), ("writer", []))
    )
    with ServerProcess(data_dir, users) as srv:
        with Client(srv.address, user="reader", password="reader-pw") as c:
            c.put("ok-q", b"x")
            c.put("no-q", b"y")
            assert c.lease_key(srv.address, "ok-q", "perm.1", 1).count == 1
            with pytest.raises(ServerReplyError):
                c.lease_key(srv.address, "no-q", "perm.2", 1)
        with Client(srv.address, user="writer", password="writer-pw") as w:
            for call in (
                lambda: w.lease_slice(srv.address, "ok-q", "perm.1", 0, 1),
                lambda: w.ack_key(srv.address, "ok-q", "perm.1"),
                lambda: w.release_key(srv.address, "ok-q", "perm.1"),
            ):
                with pytest.raises(ServerReplyError):
                    call()
        with Client(srv.address, user="reader", password="reader-pw") as c:
            assert c.ack_key(srv.address, "ok-q", "perm.1") == 1
            assert c.queue_stats()[srv.address]["no-q"]["items"] == "1"


def test_async_client(server: ServerProcess, qname: str) -> None:
    async def run() -> None:
        async with AsyncClient(server.address) as c:
            await c.put_many(qname, [b"a0", b"a1", b"a2"])
            lease = await c.lease_key(server.address, qname, "async.1", 2, lease_time=30)
            assert (lease.count, lease.size) == (2, 4)
            assert await c.lease_key(server.address, qname, "async.1", 2) == lease
            got = await c.lease_slice(server.address, qname, "async.1", 0, 2)
            assert bytes(got.data) == b"a0a1" and got.lease_ids == ["key-0", "key-1"]
            assert await c.renew_key(server.address, qname, "async.1", 60) > lease.expires_at
            assert await c.release_key(server.address, qname, "async.1") == 2
            with pytest.raises(ServerReplyError, match="was released"):
                await c.lease_key(server.address, qname, "async.1", 2)
            assert await c.get(qname) == b"a0"

    asyncio.run(run())


def test_too_many_keys_is_a_server_error_and_takes_nothing(data_dir: Path) -> None:
    with ServerProcess(data_dir, "[queues]\nmax_lease_keys = 2\n") as srv:
        conn = track(Raw(srv.connect()))
        put(conn, "tm", b"t0", b"t1", b"t2", b"t3")
        keyed_take(conn, "tm", "a", 1)
        keyed_take(conn, "tm", "b", 1)
        conn.call(b"lease tm 1 0 0 key=c\r\n", b"SERVER_ERROR too many lease keys\r\n")
        assert items_of(conn, "tm") == 2
        conn.call(b"ack tm key=a\r\n", b"ACKED 1\r\n")
        assert [x[3] for x in keyed_take(conn, "tm", "c", 1)] == [b"t2"]  # "a" is forgotten


def test_a_large_lease_is_taken_in_steps_and_read_back_whole(data_dir: Path) -> None:
    big = [bytes([65 + i]) * (3 << 20) for i in range(4)]  # 12 MiB: several 4 MiB steps
    with ServerProcess(data_dir) as srv, Client(srv.address, timeout=60) as c:
        c.put_many("big", big)
        lease = c.lease_key(srv.address, "big", "big.1", 10)
        assert (lease.count, lease.size) == (4, 12 << 20)
        got = c.lease_slice(srv.address, "big", "big.1", 1, 4)
        assert bytes(got.data) == b"".join(big[1:])
        assert list(got.offsets) == [0, 3 << 20, 6 << 20, 9 << 20]
        assert c.release_key(srv.address, "big", "big.1") == 4
        assert c.get("big") == big[0]


def test_client_lease_key_waits_for_an_item(server: ServerProcess, raw: Raw, qname: str) -> None:
    got: list[KeyedLease] = []

    def take() -> None:
        with Client(server.address) as c:
            got.append(c.lease_key(server.address, qname, f"{qname}.w", 3, wait=30))

    taker = threading.Thread(target=take)
    taker.start()
    for _ in range(10_000):  # until the take waits on the queue, polled over the wire
        if stats(raw).get(f"queue_{qname}_waiters") == "1":
            break
    else:
        raise AssertionError("the keyed take never waited")
    put(raw, qname, b"w0")
    taker.join(60)
    assert [(x.count, x.size) for x in got] == [(1, 2)]
