"""The Thrift codec: frames -> typed calls, results -> frames, and hostile frames.

Calls are encoded by thriftpy2's own client-side protocol from the shipped IDL, replies are
decoded the same way: the codec is checked against the library, not against itself. Then the
framing limits, every malformed shape (a BadCall answered on a live connection, or a
ProtocolError that closes it), any split of a stream, and Hypothesis junk.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
import thriftpy2
from hypothesis import given, settings
from hypothesis import strategies as st
from thriftpy2.protocol.binary import TBinaryProtocol
from thriftpy2.thrift import TApplicationException, TMessageType
from thriftpy2.transport.memory import TMemoryBuffer

from codec_fuzz import Codec, fuzz_tests
from tercel.errors import ProtocolError
from tercel.protocol import thrift as t
from tercel.protocol.thrift_check import MAX_ARGUMENT_FIELDS
from tercel.protocol.thrift_framing import FrameDecoder, frame

IDL = thriftpy2.load(t.IDL_PATH, module_name="client_kestrel_thrift")
K = IDL.Kestrel


def message(method: str, args: Any, seqid: int = 9, strict: bool = True) -> bytes:
    """One framed call, written by thriftpy2's pure-Python binary protocol."""
    buf = TMemoryBuffer()
    proto = TBinaryProtocol(buf, strict_write=strict)
    proto.write_message_begin(method, TMessageType.CALL, seqid)
    args.write(proto)
    proto.write_message_end()
    return frame(buf.getvalue())


def calls(data: bytes, max_frame: int = 1 << 20) -> list[Any]:
    codec = t.ThriftServerCodec(max_frame)
    codec.receive_data(data)
    out = []
    while (call := codec.next_call()) is not t.NEED_DATA:
        out.append(call)
    assert codec.buffered == 0
    return out


def one(data: bytes) -> Any:
    (call,) = calls(data)
    return call


def read_reply(data: bytes, method: str) -> Any:
    """Decode a framed reply as a thriftpy2 client would: the result, or the exception."""
    (length,) = struct.unpack("!i", data[:4])
    assert length == len(data) - 4
    proto = TBinaryProtocol(TMemoryBuffer(data[4:]))
    name, mtype, seqid = proto.read_message_begin()
    assert (name, seqid) == (method, 9)
    if mtype == TMessageType.EXCEPTION:
        exc = TApplicationException()
        exc.read(proto)
        return exc
    assert mtype == TMessageType.REPLY
    result = getattr(K, method + "_result")()
    result.read(proto)
    return getattr(result, "success", None)  # a void method's result has no field


CALLS: list[tuple[str, Any, Any]] = [
    (
        "put",
        K.put_args(queue_name="q", items=[b"a", b"\xff\x00"], expiration_msec=250),
        t.Put(9, "q", [b"a", b"\xff\x00"], 250),
    ),
    ("put", K.put_args(queue_name="q", items=[]), t.Put(9, "q", [], 0)),
    ("get", K.get_args(queue_name="q", max_items=5), t.Get(9, "q", 5, 0, 0)),
    (
        "get",
        K.get_args(queue_name="q", max_items=100, timeout_msec=10, auto_abort_msec=3000),
        t.Get(9, "q", 100, 10, 3000),
    ),
    ("confirm", K.confirm_args(queue_name="q", ids={7}), t.Confirm(9, "q", [7])),
    ("abort", K.abort_args(queue_name="q", ids=set()), t.Abort(9, "q", [])),
    ("peek", K.peek_args(queue_name="q"), t.Peek(9, "q")),
    ("flush_queue", K.flush_queue_args(queue_name="q"), t.FlushQueue(9, "q")),
    ("flush_all_queues", K.flush_all_queues_args(), t.FlushAllQueues(9)),
    ("delete_queue", K.delete_queue_args(queue_name="q"), t.DeleteQueue(9, "q")),
    ("current_status", K.current_status_args(), t.CurrentStatus(9)),
    ("set_status", K.set_status_args(status=IDL.Status.READ_ONLY), t.SetStatus(9, 2)),
    ("get_version", K.get_version_args(), t.GetVersion(9)),
]


@pytest.mark.parametrize(("method", "args", "expected"), CALLS)
@pytest.mark.parametrize("strict", [True, False])
def test_call(method: str, args: Any, expected: Any, strict: bool) -> None:
    assert one(message(method, args, strict=strict)) == expected


def test_confirm_ids_keep_their_order_once_each() -> None:
    call = one(message("confirm", K.confirm_args(queue_name="q", ids=[3, 1, 3, 2])))
    assert call == t.Confirm(9, "q", [3, 1, 2])


BAD: list[tuple[str, Any, int, str]] = [
    ("put", K.put_args(items=[b"a"]), t.PROTOCOL_ERROR, "queue_name is required"),
    ("put", K.put_args(queue_name="q"), t.PROTOCOL_ERROR, "items is required"),
    ("put", K.put_args(queue_name="a/b", items=[]), t.PROTOCOL_ERROR, "bad queue name"),
    ("get", K.get_args(queue_name="q"), t.PROTOCOL_ERROR, "max_items is required"),
    ("get", K.get_args(queue_name="\u00e9", max_items=1), t.PROTOCOL_ERROR, "bad queue name"),
    ("confirm", K.confirm_args(queue_name="q"), t.PROTOCOL_ERROR, "ids is required"),
    ("set_status", K.set_status_args(), t.PROTOCOL_ERROR, "status is required"),
    ("nosuch", K.get_version_args(), t.UNKNOWN_METHOD, "unknown method nosuch"),
]


@pytest.mark.parametrize(("method", "args", "kind", "reason"), BAD)
def test_bad_call_is_answered_and_the_stream_goes_on(
    method: str, args: Any, kind: int, reason: str
) -> None:
    data = message(method, args) + message("get_version", K.get_version_args())
    assert calls(data) == [t.BadCall(9, method, kind, reason), t.GetVersion(9)]


def _header(method: bytes, mtype: int = 1) -> bytes:
    return struct.pack("!iI", -0x7FFEFFFF - 1 | mtype, len(method)) + method + b"\x00\x00\x00\x09"


_PUT = _header(b"put")
MALFORMED: list[tuple[str, bytes]] = [
    ("string of 2 GiB", _PUT + struct.pack("!bhi", 11, 1, 2**31 - 1)),
    ("negative string", _PUT + struct.pack("!bhi", 11, 1, -1)),
    ("list of 2**31", _PUT + struct.pack("!bhbi", 15, 2, 11, 2**31 - 1)),
    ("negative list", _PUT + struct.pack("!bhbi", 15, 2, 11, -5) + b"\x00"),
    ("list of unknown type", _PUT + struct.pack("!bhbi", 15, 2, 99, 2**31 - 1)),
    ("map of 2**31", _PUT + struct.pack("!bhbbi", 13, 9, 11, 11, 2**31 - 1)),
    ("set of 2**31 i64", _header(b"confirm") + struct.pack("!bhbi", 14, 2, 10, 2**31 - 1)),
    ("structs nested 5000 deep", _PUT + struct.pack("!bh", 12, 9) * 5000),
    ("unknown field type", _PUT + struct.pack("!bh", 99, 1)),
    ("no stop byte", _PUT + struct.pack("!bhi", 11, 1, 1) + b"q"),
    ("i64 cut short", _PUT + struct.pack("!bh", 10, 5) + b"\x00\x00"),
]


@pytest.mark.parametrize(("what", "payload"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_arguments_are_refused_before_the_library_sees_them(
    what: str, payload: bytes
) -> None:
    """thriftpy2's Cython decoder crashes on some of these (SIGSEGV) and allocates gigabytes on
    others: the codec's walk must refuse every one, quickly, with the call's seqid."""
    call = one(frame(payload))
    assert isinstance(call, t.BadCall)
    assert (call.seqid, call.method, call.kind) == (9, call.method, t.PROTOCOL_ERROR)
    assert call.reason.startswith("malformed arguments")


def _undeclared_structs(n: int, last: bytes) -> bytes:
    """A put whose undeclared field 9 is a list of ``n`` structs: ``n - 1`` empty ones, then
    ``last``."""
    head = _PUT + struct.pack("!bhi", 11, 1, 1) + b"q" + struct.pack("!bhbi", 15, 9, 12, n)
    return head + b"\x00" * (n - 1) + last + b"\x00"


def test_an_undeclared_container_of_structs_is_refused_before_its_elements_are_read() -> None:
    """Walking a list of 67M empty structs held the loop for 22 s: such a field is refused at
    its header. The last element is malformed: had the walk read the elements, the reason
    would name it."""
    call = one(frame(_undeclared_structs(100_000, b"\x63\x00\x01")))
    assert isinstance(call, t.BadCall)
    assert call.reason == (
        "malformed arguments: undeclared field 9 of type 15: only scalars, strings and "
        "containers of scalars may be skipped"
    )
    items = struct.pack("!bhbiii", 15, 2, 11, 2, 0, -1)  # the second item's length is -1
    bad_element = one(frame(_PUT + items + b"\x00"))
    assert isinstance(bad_element, t.BadCall)
    assert bad_element.reason == "malformed arguments: negative length"  # declared: walked


@pytest.mark.parametrize(
    "field",
    [
        struct.pack("!bhi", 8, 9, 5),  # i32
        struct.pack("!bhi", 11, 9, 2) + b"ab",  # string
        struct.pack("!bhbi", 15, 9, 10, 2) + b"\x00" * 16,  # list<i64>
        struct.pack("!bhbbi", 13, 9, 8, 3, 1) + b"\x00" * 5,  # map<i32, byte>
    ],
)
def test_undeclared_scalars_strings_and_containers_of_scalars_are_skipped(field: bytes) -> None:
    args = K.put_args(queue_name="q", items=[b"a"])
    declared = message("put", args)[4:]
    assert declared.endswith(b"\x00")
    assert one(frame(declared[:-1] + field + b"\x00")) == t.Put(9, "q", [b"a"], 0)


def test_at_most_max_argument_fields() -> None:
    field = struct.pack("!bhb", 3, 9, 1)
    fits = one(frame(_header(b"get_version") + field * MAX_ARGUMENT_FIELDS + b"\x00"))
    assert fits == t.GetVersion(9)
    many = one(frame(_header(b"get_version") + field * 10_000 + b"\x00"))
    assert isinstance(many, t.BadCall)
    assert many.reason == f"malformed arguments: more than {MAX_ARGUMENT_FIELDS} fields"


def test_wrong_message_type_is_answered() -> None:
    call = one(frame(_header(b"put", mtype=2) + b"\x00"))
    assert call == t.BadCall(9, "put", t.INVALID_MESSAGE_TYPE, "message type 2 is not a call")


UNREADABLE: list[tuple[bytes, str]] = [
    (b"\x80\x01", "truncated thrift message header"),
    (struct.pack("!iI", -0x7FFEFFFF - 1 | 1, 2**31 - 1) + b"abc", "bad thrift method name"),
    (
        struct.pack("!iI", -0x7FFEFFFF - 1 | 1, 2) + b"\xff\xfe\x00\x00\x00\x01",
        "bad thrift method name",
    ),
    (struct.pack("!iI", -0x7FFEFFFF - 1 | 1, 10) + b"put", "truncated thrift message header"),
    (struct.pack("!i", -0x7FFDFFFF - 1) + b"\x00" * 12, "bad thrift protocol version"),
    (b"\x00\x00\x00\x03put", "truncated thrift message header"),  # old-style, no type byte
]


@pytest.mark.parametrize(("payload", "reason"), UNREADABLE)
def test_unreadable_header_closes(payload: bytes, reason: str) -> None:
    codec = t.ThriftServerCodec(1 << 20)
    codec.receive_data(frame(payload))
    with pytest.raises(ProtocolError) as info:
        codec.next_call()
    assert info.value.close
    assert info.value.reason == reason


# ---- framing ------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [-1, 0, 1001, 2**31 - 1])
def test_frame_length_outside_the_limit_is_refused_before_buffering(length: int) -> None:
    decoder = FrameDecoder(max_frame=1000)
    decoder.receive_data(struct.pack("!i", length))
    with pytest.raises(ProtocolError) as info:
        decoder.next_frame()
    assert info.value.close


def test_frame_at_the_limit_is_read() -> None:
    decoder = FrameDecoder(max_frame=1000)
    decoder.receive_data(frame(b"x" * 1000))
    assert decoder.next_frame() == b"x" * 1000
    assert decoder.next_frame() is t.NEED_DATA


def test_frames_split_anywhere() -> None:
    stream = frame(b"abc") + frame(b"d" * 300) + frame(b"e")
    for size in (1, 2, 3, 5, 7, 64, 1000):
        decoder = FrameDecoder(max_frame=1000)
        got = []
        for i in range(0, len(stream), size):
            decoder.receive_data(stream[i : i + size])
            while (f := decoder.next_frame()) is not t.NEED_DATA:
                got.append(f)
        assert got == [b"abc", b"d" * 300, b"e"]
        assert decoder.buffered == 0


_STREAM = b"".join(message(m, a) for m, a, _ in CALLS)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(_STREAM))))
def test_any_split_of_calls_parses_as_the_whole(cuts: list[int]) -> None:
    codec = t.ThriftServerCodec(1 << 20)
    points = sorted(set(cuts))
    got = []
    for a, b in zip([0, *points], [*points, len(_STREAM)], strict=True):
        codec.receive_data(_STREAM[a:b])
        while (call := codec.next_call()) is not t.NEED_DATA:
            got.append(call)
    assert got == [expected for _, _, expected in CALLS]


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200), st.integers(min_value=0, max_value=80))
def test_junk_after_a_good_header_only_gives_bad_calls_or_protocol_errors(
    junk: bytes, cut: int
) -> None:
    good = message("put", K.put_args(queue_name="q", items=[b"ab", b"c"]))[4:]
    for payload in (good[:cut] + junk, _PUT + junk, junk):
        try:
            t.decode_call(payload)
        except ProtocolError as exc:
            assert exc.close


# ---- replies --------------------------------------------------------------------------------


def test_replies_decode_with_the_library() -> None:
    assert read_reply(t.reply_count(t.Put(9, "q", [], 0), 3), "put") == 3
    items = read_reply(t.reply_items(t.Get(9, "q", 2, 0, 0), [(b"a\x00", 0), (b"b", 7)]), "get")
    assert [(i.data, i.id) for i in items] == [(b"a\x00", 0), (b"b", 7)]
    assert read_reply(t.reply_items(t.Get(9, "q", 2, 0, 0), []), "get") == []
    info = t.QueueInfo(b"head", 2, 10, 300, 5, 1, 4)
    got = read_reply(t.reply_queue_info(t.Peek(9, "q"), info), "peek")
    assert got == IDL.QueueInfo(
        head_item=b"head",
        items=2,
        bytes=10,
        journal_bytes=300,
        age=5,
        waiters=1,
        open_transactions=4,
    )
    empty = read_reply(
        t.reply_queue_info(t.Peek(9, "q"), t.QueueInfo(None, 0, 0, 0, 0, 0, 0)), "peek"
    )
    assert empty.head_item is None
    assert read_reply(t.reply_void(t.FlushQueue(9, "q")), "flush_queue") is None
    assert read_reply(t.reply_status(t.CurrentStatus(9), t.UP), "current_status") == IDL.Status.UP
    assert read_reply(t.reply_version(t.GetVersion(9), "tercel 1"), "get_version") == "tercel 1"
    exc = read_reply(t.reply_exception(9, "put", t.INTERNAL_ERROR, "no"), "put")
    assert (exc.type, exc.message) == (t.INTERNAL_ERROR, "no")


def test_idl_ships_in_the_package() -> None:
    path = Path(t.IDL_PATH)
    assert path.name == "kestrel.thrift"
    assert path.parent == Path(t.__file__).parent
    assert "service Kestrel" in path.read_text()


# ---- the shared fuzz harness (tests/codec_fuzz.py) -------------------------------------------

TestThriftServerFuzz = fuzz_tests(
    Codec(
        name="thrift server",
        new=lambda: t.ThriftServerCodec(max_frame=512),
        feed=lambda codec, data: codec.receive_data(data),
        step=lambda codec: codec.next_call(),
        need_data=t.NEED_DATA,
        clean=(ProtocolError,),
        closes=lambda exc: exc.close,
        seeds=tuple(message(m, a) for m, a, _ in CALLS),
        tokens=(
            struct.pack("!i", 2**31 - 1),
            struct.pack("!i", -1),
            b"\x0f\x00\x02\x0b",
            b"\x0c\x00\x01",
            b"\x80\x01\x00\x01",
            b"\x00",
        ),
    )
)
