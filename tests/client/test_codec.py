"""The client-role codec: commands -> bytes, bytes -> replies, fed whole and byte by byte."""

from __future__ import annotations

import struct

import pytest

from tercel.errors import BadReply
from tercel.protocol import memcache as mc
from tercel.protocol.commands import (
    Ack,
    Command,
    Confirm,
    Delete,
    DumpStats,
    Flush,
    Get,
    Lease,
    Monitor,
    Release,
    Renew,
    Set,
    Simple,
)
from tercel.protocol.memcache import NEED_DATA
from tercel.protocol.memcache_client import (
    Blocks,
    ErrorReply,
    LeaseBatch,
    LeaseColumns,
    LeasedItem,
    Line,
    Listing,
    MemcacheClientCodec,
    Reply,
    Value,
    Values,
    get_key,
)

REQUESTS: list[tuple[Command, bytes]] = [
    (Get(b"q/t=5/open", "q"), b"get q/t=5/open\r\n"),
    (Get(b"q/open", "q", cas=True), b"gets q/open\r\n"),
    (Set("q", 0, 10, b"ab\r\n"), b"set q 0 10 4\r\nab\r\n\r\n"),
    (Delete("q"), b"delete q\r\n"),
    (Flush("q"), b"flush q\r\n"),
    (Simple("stats"), b"stats\r\n"),
    (DumpStats(("a", "b")), b"dump_stats a b\r\n"),
    (Lease("q", 100, 0, 30000), b"lease q 100 0 30000\r\n"),
    (Ack("q", ("a-1", "a-2")), b"ack q a-1 a-2\r\n"),
    (Release("q", ("a-1",)), b"release q a-1\r\n"),
    (Renew("q", 500, ("a-1",)), b"renew q 500 a-1\r\n"),
    (Monitor("q", 2, 10), b"monitor q 2 10\r\n"),
    (Confirm("q", 3), b"confirm q 3\r\n"),
]


@pytest.mark.parametrize(("cmd", "wire"), REQUESTS)
def test_requests(cmd: Command, wire: bytes) -> None:
    assert MemcacheClientCodec().send(cmd) == wire


def test_get_key() -> None:
    assert get_key("q") == b"q"
    assert get_key("q", timeout_ms=250, close=True, open=True) == b"q/t=250/close/open"
    assert get_key("q", timeout_ms=0, peek=True) == b"q/peek"


REPLIES: list[tuple[Command, bytes, Reply]] = [
    (Get(b"q", "q"), b"END\r\n", Line("END")),
    (Get(b"q", "q"), b"VALUE q 0 4\r\nab\r\n\r\nEND\r\n", Value(b"q", b"ab\r\n")),
    (Get(b"q", "q", cas=True), b"VALUE q 0 1 7\r\nx\r\nEND\r\n", Value(b"q", b"x", 7)),
    (Get(b"q", "q"), b"ERROR\r\n", ErrorReply("ERROR", "")),
    (Set("q", 0, 0, b"x"), b"NOT_STORED\r\n", Line("NOT_STORED")),
    (
        Set("q", 0, 0, b"x"),
        b"SERVER_ERROR shutting down\r\n",
        ErrorReply("SERVER_ERROR", "shutting down"),
    ),
    (
        Simple("stats"),
        b"STAT a 1\r\nSTAT b two words\r\nEND\r\n",
        Listing([("a", "1"), ("b", "two words")]),
    ),
    (Simple("features"), b"FEATURE lease 1\r\nEND\r\n", Listing([("lease", "1")])),
    (
        DumpStats(()),
        b"queue 'a' {\r\n  items=1\r\n  age=0\r\n}\r\nqueue 'b' {\r\n}\r\nEND\r\n",
        Blocks({"a": {"items": "1", "age": "0"}, "b": {}}),
    ),
    (Lease("q", 2, 0, 0), b"END\r\n", LeaseBatch([])),
    (
        Lease("q", 2, 0, 0),
        b"LEASED p-1 1 1 100 0 2\r\nhi\r\nLEASED p-2 2 3 101 900 0\r\n\r\nEND\r\n",
        LeaseBatch(
            [LeasedItem("p-1", 1, 1, 100, 0, b"hi"), LeasedItem("p-2", 2, 3, 101, 900, b"")]
        ),
    ),
    (
        Lease("q", 2, 0, 0),
        b"SERVER_ERROR too many open leases\r\n",
        ErrorReply("SERVER_ERROR", "too many open leases"),
    ),
    (Ack("q", ("x",)), b"ACKED 1\r\n", Line("ACKED 1")),
    (
        Monitor("q", 1),
        b"VALUE q 0 1\r\na\r\nEND\r\nVALUE q 0 1\r\nb\r\nEND\r\nEND\r\n",
        Values([Value(b"q", b"a"), Value(b"q", b"b")]),
    ),
]


@pytest.mark.parametrize(("cmd", "wire", "reply"), REPLIES)
def test_replies_whole_and_byte_by_byte(cmd: Command, wire: bytes, reply: Reply) -> None:
    whole = MemcacheClientCodec()
    whole.send(cmd)
    whole.receive_data(wire)
    assert whole.next_reply() == reply
    assert whole.next_reply() is NEED_DATA
    split = MemcacheClientCodec()
    split.send(cmd)
    got: list[Reply] = []
    for i in range(len(wire)):
        split.receive_data(wire[i : i + 1])
        r = split.next_reply()
        if r is not NEED_DATA:
            got.append(r)
    assert got == [reply]


def _columns(cols: Reply | object) -> tuple[object, ...]:
    assert isinstance(cols, LeaseColumns)
    return (
        cols.lease_ids,
        list(cols.item_ids),
        list(cols.deliveries),
        list(cols.add_ms),
        list(cols.expiry_ms),
        bytes(cols.data),
        list(cols.offsets),
    )


TWO_LEASES = (["p-1", "p-1f"], [1, 2], [1, 3], [100, 101], [0, 900], b"hi", [0, 2, 2])
"""Two leased items as columns: what both wire forms below carry."""
TEXT_LEASES = b"LEASED p-1 1 1 100 0 2\r\nhi\r\nLEASED p-1f 2 3 101 900 0\r\n\r\nEND\r\n"
BINARY_LEASES = b"".join(
    mc.leased_binary(
        b"p",
        [1, 0x1F],
        item_ids=[1, 2],
        deliveries=[1, 3],
        add_ms=[100, 101],
        expiry_ms=[0, 900],
        payloads=[b"hi", b""],
    )
)


def test_the_binary_lease_reply_byte_by_byte() -> None:
    """The ``LEASEDB`` layout of docs/protocol.md section 11, spelt out."""
    table = struct.pack("<8q", 1, 2, 100, 101, 0, 900, 1, 0x1F) + struct.pack("<5i", 1, 3, 0, 2, 2)
    want = b"LEASEDB 2 p 2\r\n" + table + b"hi\r\nEND\r\n"
    assert want == BINARY_LEASES
    none: list[int] = []
    empty = mc.leased_binary(
        b"p", [], item_ids=none, deliveries=none, add_ms=none, expiry_ms=none, payloads=[]
    )
    assert empty == [b"END\r\n"]


@pytest.mark.parametrize("wire", [TEXT_LEASES, BINARY_LEASES], ids=["text", "binary"])
def test_a_lease_reply_as_columns_whole_and_byte_by_byte(wire: bytes) -> None:
    """``Lease(..., columns=True)`` asks for the binary reply; a server that ignores the word
    (an old one) answers in text: both come out as the same flat columns and one buffer."""
    want = TWO_LEASES
    cmd = Lease("q", 2, 0, 0, columns=True)
    whole = MemcacheClientCodec()
    assert whole.send(cmd) == b"lease q 2 0 0 binary\r\n"
    whole.receive_data(wire + b"LEASED p-3 3 1 1 0 1\r\n")  # the next reply, pipelined
    whole.send(cmd)
    assert _columns(whole.next_reply()) == want
    assert whole.next_reply() is NEED_DATA
    split = MemcacheClientCodec()
    split.send(cmd)
    got: list[Reply] = []
    for i in range(len(wire)):
        split.receive_data(wire[i : i + 1])
        if (r := split.next_reply()) is not NEED_DATA:
            got.append(r)
    assert [_columns(r) for r in got] == [want]
    for other, reply in [
        (b"END\r\n", ([], [], [], [], [], b"", [0])),
        (b"SERVER_ERROR too many open leases\r\n", None),
    ]:
        codec = MemcacheClientCodec()
        codec.send(cmd)
        codec.receive_data(other)
        r = codec.next_reply()
        if reply is None:
            assert r == ErrorReply("SERVER_ERROR", "too many open leases")
        else:
            assert _columns(r) == reply


@pytest.mark.parametrize(
    "wire",
    [
        b"LEASED p-1 x 1 1 1 1\r\na\r\nEND\r\n",
        b"LEASED p-1 1 1 1 1 -4\r\na\r\nEND\r\n",
        b"LEASED p-1 1 1 1 1 1\r\nab\r\nEND\r\n",
        b"LEASED p-1 1 1 1 1 1\r\na\r\nHELLO\r\n",
        b"LEASEDB 1 p\r\n",
        b"LEASEDB x p 1\r\n",
        b"LEASEDB -1 p 0\r\n",
        b"LEASEDB 1 p 4294967296\r\n",
        BINARY_LEASES.replace(b"\r\nEND\r\n", b"\r\nEND!\r\n"),
        BINARY_LEASES[:-9] + b"!" + BINARY_LEASES[-9:],  # a payload byte too many
        BINARY_LEASES.replace(struct.pack("<3i", 0, 2, 2), struct.pack("<3i", 0, 3, 2)),
        BINARY_LEASES.replace(struct.pack("<3i", 0, 2, 2), struct.pack("<3i", 1, 2, 2)),
    ],
)
def test_bad_lease_replies_as_columns_raise(wire: bytes) -> None:
    codec = MemcacheClientCodec()
    codec.send(Lease("q", 1, 0, 0, columns=True))
    codec.receive_data(wire)
    with pytest.raises(BadReply):
        codec.next_reply()


def test_pipelined_replies_in_order() -> None:
    codec = MemcacheClientCodec()
    codec.send(Set("q", 0, 0, b"a"))
    codec.send(Get(b"q", "q"))
    codec.send(Simple("version"))
    assert codec.pending == 3
    codec.receive_data(b"STORED\r\nVALUE q 0 1\r\na\r\nEND\r\nVERSION 1.0\r\n")
    assert [codec.next_reply() for _ in range(3)] == [
        Line("STORED"),
        Value(b"q", b"a"),
        Line("VERSION 1.0"),
    ]
    assert codec.pending == 0


@pytest.mark.parametrize(
    ("cmd", "wire"),
    [
        (Get(b"q", "q"), b"VALUE q 0 1\r\nxx\r\nEND\r\n"),  # payload longer than declared
        (Get(b"q", "q"), b"VALUE q 0 1\r\nx\r\nNOPE\r\n"),
        (Get(b"q", "q"), b"HELLO\r\n"),
        (Lease("q", 1, 0, 0), b"LEASED p-1 x 1 1 1 1\r\na\r\nEND\r\n"),
        (Simple("stats"), b"STAT a 1\r\nJUNK\r\n"),
    ],
)
def test_bad_replies_raise(cmd: Command, wire: bytes) -> None:
    codec = MemcacheClientCodec()
    codec.send(cmd)
    codec.receive_data(wire)
    with pytest.raises(BadReply):
        codec.next_reply()


def test_unsolicited_bytes_raise() -> None:
    codec = MemcacheClientCodec()
    codec.receive_data(b"STORED\r\n")
    with pytest.raises(BadReply):
        codec.next_reply()


def test_quit_expects_no_reply() -> None:
    codec = MemcacheClientCodec()
    assert codec.send(Simple("quit")) == b"quit\r\n"
    assert codec.pending == 0
