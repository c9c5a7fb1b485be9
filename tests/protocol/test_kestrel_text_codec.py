"""TextServerCodec (Kestrel's text protocol): bytes -> commands, errors, limits, replies.

Tables of request bytes and what they must yield (a command, or the ``-`` message of a refused
request); then limits; then Hypothesis: any split of a stream parses as the whole stream, and
junk never raises anything but ProtocolError (never ``close``: lines always resynchronise).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codec_fuzz import Codec, fuzz_tests
from tercel.errors import ProtocolError
from tercel.protocol import kestrel_text as kt
from tercel.protocol.commands import Confirm, Delete, Flush, Simple, Status

Outcome = kt.TextCommand | tuple[str, str]
"""A command, or ``("error", message)`` for a refused request."""


def drain(codec: kt.TextServerCodec, out: list[Outcome]) -> None:
    for _ in range(100_000):  # bound: a codec that never returns NEED_DATA is a bug
        try:
            cmd = codec.next_command()
        except ProtocolError as exc:
            assert not exc.close
            out.append(("error", exc.reason))
            continue
        if cmd is kt.NEED_DATA:
            return
        out.append(cmd)
    raise AssertionError("codec never returned NEED_DATA")


def parse(chunks: list[bytes], **limits: int) -> list[Outcome]:
    codec = kt.TextServerCodec(**limits)
    out: list[Outcome] = []
    for chunk in chunks:
        codec.receive_data(chunk)
        drain(codec, out)
    return out


def parse_all(data: bytes, **limits: int) -> list[Outcome]:
    """Whole, then byte by byte: both must agree."""
    whole = parse([data], **limits)
    assert parse([data[i : i + 1] for i in range(len(data))], **limits) == whole
    return whole


COMMANDS: list[tuple[bytes, Outcome]] = [
    (b"get q\n", kt.TextGet("q", None)),
    (b"get q\r\n", kt.TextGet("q", None)),
    (b"GET q 250\n", kt.TextGet("q", 250)),
    (b"Get q 0\n", kt.TextGet("q", None)),
    (b"get q -5\n", kt.TextGet("q", None)),
    (b"get  q   10 \n", kt.TextGet("q", 10)),
    (b"get Orders\n", kt.TextGet("Orders", None)),  # names keep their case
    (b"peek q\n", kt.TextPeek("q", None)),
    (b"PEEK q 7\n", kt.TextPeek("q", 7)),
    (b"monitor q 1000\n", kt.TextMonitor("q", 1000, None)),
    (b"monitor q 1000 5\n", kt.TextMonitor("q", 1000, 5)),
    (b"confirm q 3\n", Confirm("q", 3)),
    (b"confirm q 0\n", Confirm("q", 0)),
    (b"flush q\n", Flush("q")),
    (b"delete q\n", Delete("q")),
    (b"status\n", Status(None)),
    (b"status readonly\n", Status("readonly")),
    (b"version\n", Simple("version")),
    (b"SHUTDOWN\n", Simple("shutdown")),
    (b"quit\r\n", Simple("quit")),
    (b"put q\n", kt.TextPut("q", 0, [])),  # no ':': a put without items (Kestrel: +0)
    (b"put q:\n\n", kt.TextPut("q", 0, [])),
    (b"put q:\none\ntwo\n\n", kt.TextPut("q", 0, [b"one", b"two"])),
    (b"PUT q 500:\r\none\r\n\r\n", kt.TextPut("q", 500, [b"one"])),
    (b"put q 0:\na\n\n", kt.TextPut("q", 0, [b"a"])),
    # Item bytes as sent: no re-encoding, spaces and colons kept, a lone CR inside kept.
    (
        b"put q:\n\xff\xfe\x80\n a b \nx:\na\rb\n\n",
        kt.TextPut("q", 0, [b"\xff\xfe\x80", b" a b ", b"x:", b"a\rb"]),
    ),
    # An item line that looks like a command is an item.
    (b"put q:\nget q\n\n", kt.TextPut("q", 0, [b"get q"])),
]


@pytest.mark.parametrize(("data", "expected"), COMMANDS)
def test_command(data: bytes, expected: Outcome) -> None:
    assert parse_all(data) == [expected]


ERRORS: list[tuple[bytes, str]] = [
    (b"get\n", "Queue name required."),
    (b"peek\n", "Queue name required."),
    (b"flush\n", "Queue name required."),
    (b"delete\n", "Queue name required."),
    (b"put\n", "Queue name required."),
    (b"put:\na\n\n", "Queue name required."),
    (b":\na\n\n", "Queue name required."),
    (b"get q x\n", "Error parsing timeout."),
    (b"get q 1.5\n", "Error parsing timeout."),
    (b"get q +5\n", "Error parsing timeout."),
    (b"get q 1234567890123456789\n", "Error parsing timeout."),
    (b"peek q abc\n", "Error parsing timeout."),
    (b"monitor q\n", "Queue name & timeout required."),
    (b"monitor\n", "Queue name & timeout required."),
    (b"monitor q x\n", "Error parsing timeout."),
    (b"monitor q 10 -1\n", "Error parsing count."),
    (b"confirm q\n", "Queue name & count required."),
    (b"confirm q two\n", "Error parsing count."),
    (b"confirm q -1\n", "Error parsing count."),
    (b"put q soon:\na\n\n", "Error parsing expiration time."),
    (b"put q -5:\na\n\n", "Error parsing expiration time."),
    (b"get ../etc\n", "Bad queue name."),
    (b"put a/b:\nx\n\n", "Bad queue name."),
    (b"bogus\n", "Unknown command: bogus"),
    (b"\n", "Unknown command: "),
    (b"get: \n", "Unknown command: get:"),  # ends in a space: not a batch
    (b"get q :\nitem\n\n", "Unknown command: get"),  # only put takes items
    (b"get q:\nitem\n\n", "Unknown command: get"),
    (b"\x01\xffx\n", "Unknown command: ??x"),
]


@pytest.mark.parametrize(("data", "reason"), ERRORS)
def test_refused_request_keeps_the_connection(data: bytes, reason: str) -> None:
    assert parse_all(data + b"version\n") == [("error", reason), Simple("version")]


def test_pipelined_requests_in_one_read() -> None:
    data = b"put q:\na\nb\n\nget q\nconfirm q 1\nput r 5:\nc\n\nversion\n"
    assert parse_all(data) == [
        kt.TextPut("q", 0, [b"a", b"b"]),
        kt.TextGet("q", None),
        Confirm("q", 1),
        kt.TextPut("r", 5, [b"c"]),
        Simple("version"),
    ]


def test_batch_waits_for_its_empty_line() -> None:
    codec = kt.TextServerCodec()
    out: list[Outcome] = []
    for chunk in (b"put q:\n", b"a\n", b"b\n"):
        codec.receive_data(chunk)
        drain(codec, out)
        assert out == []
    codec.receive_data(b"\n")
    drain(codec, out)
    assert out == [kt.TextPut("q", 0, [b"a", b"b"])]
    assert codec.buffered == 0


def test_more_than_1024_items_are_all_kept() -> None:
    """Kestrel dropped the line that arrived when 1024 items were buffered; not here."""
    lines = [b"%d" % i for i in range(3000)]
    (put,) = parse([b"put q:\n" + b"\n".join(lines) + b"\n\nversion\n"])[:1]
    assert isinstance(put, kt.TextPut)
    assert put.items == lines


def test_too_many_items_refuse_the_whole_batch() -> None:
    data = b"put q:\na\nb\nc\n\nget q\n"
    assert parse_all(data, max_batch_items=2) == [
        ("error", "Too many items in one put (limit 2)."),
        kt.TextGet("q", None),
    ]
    assert parse_all(b"put q:\na\nb\n\n", max_batch_items=2) == [kt.TextPut("q", 0, [b"a", b"b"])]


def test_too_many_bytes_refuse_the_whole_batch() -> None:
    assert parse_all(b"put q:\naaa\nbbb\n\nversion\n", max_batch_bytes=5) == [
        ("error", "Put too large (limit 5 bytes of items)."),
        Simple("version"),
    ]
    assert parse_all(b"put q:\naa\nbbb\n\n", max_batch_bytes=5) == [
        kt.TextPut("q", 0, [b"aa", b"bbb"])
    ]


def test_item_over_the_limit_refuses_the_batch_and_is_not_buffered() -> None:
    codec = kt.TextServerCodec(max_item=10)
    out: list[Outcome] = []
    codec.receive_data(b"put q:\nok\n")
    for _ in range(100):
        codec.receive_data(b"x" * 1000)
        drain(codec, out)
        assert codec.buffered <= 12  # the skipped line is thrown away as it arrives
    codec.receive_data(b"\nmore\n\nget q\n")
    drain(codec, out)
    assert out == [("error", "Item too large (limit 10 bytes)."), kt.TextGet("q", None)]


def test_item_at_the_limit_is_kept() -> None:
    assert parse_all(b"put q:\n0123456789\r\n\n", max_item=10) == [
        kt.TextPut("q", 0, [b"0123456789"])
    ]


def test_line_over_the_limit_is_refused_and_skipped() -> None:
    assert parse_all(b"get " + b"q" * 30 + b"\nget q\n", max_line=20) == [
        ("error", "Line too long (limit 20 bytes)."),
        kt.TextGet("q", None),
    ]


def test_over_long_put_line_still_swallows_its_batch() -> None:
    """The items after a refused put line are not run as commands."""
    data = b"put " + b"q" * 40 + b":\r\nshutdown\n\nversion\n"
    assert parse_all(data, max_line=20) == [
        ("error", "Line too long (limit 20 bytes)."),
        Simple("version"),
    ]


def test_default_limits() -> None:
    codec = kt.TextServerCodec()
    codec.receive_data(b"get " + b"q" * 9000 + b"\n")
    with pytest.raises(ProtocolError, match="Line too long"):
        codec.next_command()


def test_items_are_bytes_not_views() -> None:
    (put,) = parse([b"put q:\nabc\n\n"])
    assert isinstance(put, kt.TextPut)
    assert type(put.items[0]) is bytes


# ---- any split, any junk --------------------------------------------------------------------

_STREAMS = [
    b"put q:\none\ntwo\r\n\r\nget q 10\nconfirm q 1\n",
    b"PUT q 5:\n\xff\n\npeek q\nbogus\nstatus up\nmonitor q 10 2\n",
    b"get\nput q:\n" + b"z" * 50 + b"\nok\n\nversion\n",
    b"get " + b"q" * 40 + b"\nput " + b"r" * 40 + b":\nitem\n\nquit\n",
]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(_STREAMS), st.lists(st.integers(min_value=0, max_value=200)))
def test_any_split_parses_as_the_whole(stream: bytes, cuts: list[int]) -> None:
    limits = {"max_line": 30, "max_item": 20}
    points = sorted({c % (len(stream) + 1) for c in cuts})
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    assert parse(chunks, **limits) == parse([stream], **limits)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=20))
def test_junk_only_raises_protocol_errors(chunks: list[bytes]) -> None:
    parse(chunks, max_line=16, max_item=16, max_batch_items=3, max_batch_bytes=24)


# ---- replies ----------------------------------------------------------------------------


def test_replies() -> None:
    assert kt.count(3) == b"+3\n"
    assert kt.error("Queue name required.") == b"-Queue name required.\n"
    assert kt.error("two\nlines \u00e9") == b"-two lines ?\n"
    assert kt.item(b"\xff data") == b":\xff data\n"
    assert b"".join(kt.item_parts(b"\xff data")) == kt.item(b"\xff data")
    assert kt.NO_ITEM == b"*\n"
    assert kt.string("UP") == b":UP\n"
    assert kt.fits_a_line(b"a b:c\rd")
    assert not kt.fits_a_line(b"a\nb")
    assert not kt.fits_a_line(b"ab\r")


# ---- the shared fuzz harness (tests/codec_fuzz.py) -------------------------------------------

TestTextServerFuzz = fuzz_tests(
    Codec(
        name="text server",
        new=lambda: kt.TextServerCodec(
            max_line=64, max_item=32, max_batch_items=4, max_batch_bytes=64
        ),
        feed=lambda codec, data: codec.receive_data(data),
        step=lambda codec: codec.next_command(),
        need_data=kt.NEED_DATA,
        clean=(ProtocolError,),
        closes=lambda exc: exc.close,
        seeds=(
            b"put q:\none\r\ntwo\n\n",
            b"PUT q 500:\n\xff\xfe\n\n",
            b"get q\n",
            b"get q 100\r\n",
            b"peek q 5\n",
            b"monitor q 1000 3\n",
            b"confirm q 2\n",
            b"flush q\n",
            b"delete q\n",
            b"status\n",
            b"status readonly\n",
            b"version\n",
            b"shutdown\n",
            b"quit\n",
        ),
        tokens=(b"put ", b"get ", b"monitor ", b"confirm ", b":", b"q", b"\n\n", b"~.", b"../"),
    )
)
