"""The keyed-lease forms of the memcache codecs (docs/protocol.md section 11, "Keyed leases"):
request lines -> commands (server side), commands -> request lines and the replies (client
side), and the reply builders, byte for byte. The forms without a key are tested in
test_memcache_codec.py and tests/client/test_codec.py and must not change."""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass

import pytest

from tercel.errors import BadRequest, ProtocolError
from tercel.protocol import memcache_keyed as mk
from tercel.protocol.commands import (
    Ack,
    AckKey,
    Lease,
    LeaseKey,
    LeaseSlice,
    Release,
    ReleaseKey,
    Renew,
    RenewKey,
)
from tercel.protocol.memcache import NEED_DATA, MemcacheServerCodec
from tercel.protocol.memcache_client import LeaseColumns, Line, MemcacheClientCodec


def parse(line: bytes) -> object:
    codec = MemcacheServerCodec()
    codec.receive_data(line)
    cmd = codec.next_command()
    assert codec.next_command() is NEED_DATA
    return cmd


@pytest.mark.parametrize(
    ("line", "cmd"),
    [
        (b"lease q 3 10 500 key=abc\r\n", LeaseKey("q", "abc", 3, 10, 500)),
        (b"lease q 3 0 0 binary key=a.b\r\n", LeaseKey("q", "a.b", 3, 0, 0, columns=True)),
        (b"lease q 3 0 0 key=k nodata\r\n", LeaseKey("q", "k", 3, 0, 0, nodata=True)),
        (b"lease q 3 0 0 nodata key=k\r\n", LeaseKey("q", "k", 3, 0, 0, nodata=True)),
        (b"lease q 1 0 0 key=a=b/c\r\n", LeaseKey("q", "a=b/c", 1, 0, 0)),
        (b"lease q slice 0 5 key=k\r\n", LeaseSlice("q", "k", 0, 5)),
        (b"lease q slice 2 2 binary key=k\r\n", LeaseSlice("q", "k", 2, 2, True)),
        (b"ack q key=k\r\n", AckKey("q", "k")),
        (b"release q key=k\r\n", ReleaseKey("q", "k")),
        (b"renew q 5000 key=k\r\n", RenewKey("q", 5000, "k")),
        # without a key: as before
        (b"lease q 1 0 0\r\n", Lease("q", 1, 0, 0)),
        (b"ack q a-1 b-2\r\n", Ack("q", ("a-1", "b-2"))),
        (b"ack q a-1 key=x\r\n", Ack("q", ("a-1", "key=x"))),  # a key only first
        (b"release q\r\n", Release("q", ())),
        (b"renew q 5 a-1\r\n", Renew("q", 5, ("a-1",))),
    ],
)
def test_requests(line: bytes, cmd: object) -> None:
    assert parse(line) == cmd


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"lease q 1 0 0 key=\r\n", "empty key: a key is 1-200 characters"),
        (b"lease q 1 0 0 key=" + b"k" * 201 + b"\r\n", "key too long (201 bytes)"),
        (b"lease q 1 0 0 key=a\xffb\r\n", "bad key"),
        (b"lease q 1 0 0 key=a,b\r\n", "bad key"),
        (b"lease q 0 0 0 key=a\r\n", "bad max_items: a keyed lease takes at least 1 item"),
        (b"lease q 1 0 0 key=a key=b\r\n", "usage: lease <queue> <max_items>"),
        (b"lease q 1 0 0 key=a junk\r\n", "usage: lease"),
        (b"lease q 1 0 key=a\r\n", "usage: lease"),
        (b"lease q key=a 0 0 0\r\n", "usage: lease"),
        (b"lease q slice 0 1 nodata key=a\r\n", "usage: lease"),
        (b"lease q slice 3 1 key=a\r\n", "bad slice 3..1: stop before start"),
        (b"lease q slice -1 1 key=a\r\n", "bad start"),
        (b"lease q 1 -5 0 key=a\r\n", "bad wait_ms"),
        (b"ack q key=a b-1\r\n", "usage: ack <queue> key=<key> (a key, no lease ids)"),
        (b"release q key=a key=b\r\n", "usage: release <queue> key=<key>"),
        (b"renew q x key=a\r\n", "bad lease_ms"),
        (b"ack q key=\r\n", "empty key"),
    ],
)
def test_bad_requests_name_the_rule_and_keep_the_connection(line: bytes, reason: str) -> None:
    codec = MemcacheServerCodec()
    codec.receive_data(line + b"ack q key=next\r\n")
    with pytest.raises(ProtocolError) as info:
        codec.next_command()
    assert str(info.value).startswith(reason) and not info.value.close
    assert codec.next_command() == AckKey("q", "next")


@pytest.mark.parametrize(
    ("cmd", "line"),
    [
        (LeaseKey("q", "k", 3, 0, 500, nodata=True), b"lease q 3 0 500 key=k nodata\r\n"),
        (LeaseKey("q", "k", 3, 10, 0), b"lease q 3 10 0 key=k\r\n"),
        (LeaseKey("q", "k", 3, 0, 0, columns=True), b"lease q 3 0 0 binary key=k\r\n"),
        (LeaseSlice("q", "k", 1, 4, True), b"lease q slice 1 4 binary key=k\r\n"),
        (LeaseSlice("q", "k", 1, 4), b"lease q slice 1 4 key=k\r\n"),
        (AckKey("q", "k"), b"ack q key=k\r\n"),
        (ReleaseKey("q", "k"), b"release q key=k\r\n"),
        (RenewKey("q", 7, "k"), b"renew q 7 key=k\r\n"),
    ],
)
def test_client_requests_round_trip(cmd: object, line: bytes) -> None:
    assert MemcacheClientCodec().send(cmd) == line  # type: ignore[arg-type]
    assert parse(line) == cmd


def test_client_refuses_a_bad_key() -> None:
    with pytest.raises(BadRequest, match="a key is 1-200 characters"):
        MemcacheClientCodec().send(AckKey("q", "a b"))


@dataclass
class Cols:
    item_ids: array[int]
    deliveries: array[int]
    add_ms: array[int]
    expiry_ms: array[int]
    data: bytes
    offsets: array[int]


ITEMS = Cols(
    array("q", [7, 9]),
    array("i", [1, 3]),
    array("q", [100, 101]),
    array("q", [0, 900]),
    b"__hi__",
    array("q", [2, 4, 4]),  # offsets into data, not from 0
)


def test_keyed_replies_text_and_binary() -> None:
    text = b"".join(mk.keyed_items(5, ITEMS))
    assert text == (b"LEASED key-5 7 1 100 0 2\r\nhi\r\nLEASED key-6 9 3 101 900 0\r\n\r\nEND\r\n")
    block = b"".join(mk.keyed_binary(5, ITEMS))
    head = b"LEASEDB 2 key 2\r\n"
    table = struct.pack("<2q2q2q2q2i3i", 7, 9, 100, 101, 0, 900, 5, 6, 1, 3, 0, 2, 2)
    assert block == head + table + b"hi\r\nEND\r\n"
    assert (
        b"".join(mk.keyed_binary(0, Cols(*(array("q") for _ in range(4)), b"", array("q", [0]))))
        == b"END\r\n"
    )  # type: ignore[misc]
    assert mk.keyed(3, 10, 1234) == b"KEYED 3 10 1234\r\n"
    assert mk.payload_bytes(ITEMS) == 2


def test_client_reads_keyed_replies() -> None:
    codec = MemcacheClientCodec()
    codec.send(LeaseSlice("q", "k", 5, 7, True))
    codec.send(LeaseKey("q", "k", 2, 0, 0, nodata=True))
    codec.receive_data(b"".join(mk.keyed_binary(5, ITEMS)) + mk.keyed(2, 2, 99))
    cols = codec.next_reply()
    assert isinstance(cols, LeaseColumns)
    assert cols.lease_ids == ["key-5", "key-6"] and list(cols.item_ids) == [7, 9]
    assert bytes(cols.data) == b"hi" and list(cols.offsets) == [0, 2, 2]
    assert codec.next_reply() == Line("KEYED 2 2 99")
