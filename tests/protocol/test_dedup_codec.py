"""The codecs' dedup-key forms (docs/protocol.md §16): memcache ``set ... key=<K>``, the text
protocol's keyed ``put``, beanstalkd's ``put-key``, and the client codec's side of them; the
forms without a key parse as before."""

from __future__ import annotations

import pytest

from tercel.client._base import Stored, keyed_put_count_op, keyed_put_op
from tercel.errors import BadReply, BadRequest, NotStored, ProtocolError
from tercel.protocol import beanstalk as bp
from tercel.protocol import kestrel_text as kt
from tercel.protocol.commands import KeyedSet, Set
from tercel.protocol.memcache import NEED_DATA, MemcacheServerCodec
from tercel.protocol.memcache_client import Line, MemcacheClientCodec


def commands(codec: MemcacheServerCodec) -> list[object]:
    out = []
    while (cmd := codec.next_command()) is not NEED_DATA:
        out.append(cmd)
    return out


def test_memcache_keyed_set_whole_and_in_pieces() -> None:
    codec = MemcacheServerCodec()
    codec.receive_data(b"set q 0 0 5 key=k1\r\nhello\r\nset q 0 0 5\r\nplain\r\n")
    assert commands(codec) == [KeyedSet("q", 0, 0, b"hello", "k1"), Set("q", 0, 0, b"plain")]
    for piece in (b"set q 7 60 5 key=a.b:c noreply\r\nhe", b"l", b"lo\r", b"\n"):
        codec.receive_data(piece)
        got = commands(codec)
    assert got == [KeyedSet("q", 7, 60, b"hello", "a.b:c", True)]
    codec.receive_data(b"set q 0 0 5 noreply\r\nhello\r\n")  # noreply alone: a plain set
    assert commands(codec) == [Set("q", 0, 0, b"hello", True)]


def test_memcache_bad_keyed_sets_consume_their_payload() -> None:
    codec = MemcacheServerCodec()
    for words in (b"key=k extra", b"key=k noreply x"):
        codec.receive_data(b"set q 0 0 1 %b\r\nx\r\n" % words)
        with pytest.raises(ProtocolError, match="usage: set") as info:
            codec.next_command()
        assert not info.value.close
    # The key's rule is the queues' (QueueCollection.add_keyed): the codec passes it on.
    codec.receive_data(b"set q 0 0 1 key=\r\nx\r\nset q 0 0 1 key=a#b\r\ny\r\n")
    assert commands(codec) == [KeyedSet("q", 0, 0, b"x", ""), KeyedSet("q", 0, 0, b"y", "a#b")]
    codec.receive_data(b"set q 0 0 1\r\ny\r\n")
    assert commands(codec) == [Set("q", 0, 0, b"y")]


def test_text_keyed_put() -> None:
    codec = kt.TextServerCodec()
    codec.receive_data(b"put q 100 key=k1:\nitem\n\nput q key=k2:\na\nb\n\nput q key=k2\n")
    first = codec.next_command()
    assert first == kt.TextPut("q", 100, [b"item"], "k1")
    for _ in range(2):
        with pytest.raises(ProtocolError, match="exactly one item"):
            codec.next_command()
    codec.receive_data(b"put q:\nplain\n\n")
    assert codec.next_command() == kt.TextPut("q", 0, [b"plain"])


def test_beanstalk_put_key_and_put_unchanged() -> None:
    codec = bp.BeanstalkCodec()
    reqs = codec.feed(b"put-key k1 5 0 60 2\r\nhi\r\nput 5 0 60 2\r\nhi\r\n")
    assert [(r.op, r.tube, r.pri, r.ttr, r.body) for r in reqs if isinstance(r, bp.Command)] == [
        ("put-key", "k1", 5, 60, b"hi"),
        ("put", "", 5, 60, b"hi"),
    ]
    assert reqs[0].code == bp.PUT_KEY and bp.OPS[bp.PUT_KEY] == "put-key"
    big = codec.feed(b"put-key k 0 0 60 70000\r\n")  # JOB_TOO_BIG as put: the body skipped
    assert big == []
    assert codec.feed(b"x" * 70000 + b"\r\n") == [bp.Invalid(bp.JOB_TOO_BIG, "put")]


def test_client_codec_keyed_set_and_its_replies() -> None:
    codec = MemcacheClientCodec()
    assert codec.send(KeyedSet("q", 0, 0, b"hi", "k1")) == b"set q 0 0 2 key=k1\r\nhi\r\n"
    with pytest.raises(BadRequest, match="bad key"):
        codec.send(KeyedSet("q", 0, 0, b"hi", "a b"))
    op = keyed_put_op("q", [("a", b"1"), ("b", b"2")], None)
    assert op.finish([Line("STORED 4"), Line("STORED 2 duplicate")], "s:1") == [
        Stored(4, False, "s:1"),
        Stored(2, True, "s:1"),
    ]
    with pytest.raises(BadReply, match="plain STORED"):
        op.finish([Line("STORED")], "s:1")  # a server without dedup keys ignored the key


def test_put_many_counts_keyed_replies() -> None:
    op = keyed_put_count_op("q", [("a", b"1"), ("b", b"2"), ("c", b"3")], None)
    assert op.finish([Line("STORED 4"), Line("STORED 2 duplicate"), Line("STORED 5")], "s") == 3
    with pytest.raises(NotStored) as info:
        op.finish([Line("STORED 4"), Line("NOT_STORED"), Line("NOT_STORED")], "s")
    assert info.value.stored == 1
    with pytest.raises(BadReply, match="plain STORED"):
        op.finish([Line("STORED")], "s")
    with pytest.raises(BadReply):
        op.finish([Line("STORED 4 twice")], "s")
