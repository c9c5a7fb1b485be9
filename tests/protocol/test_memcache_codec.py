"""MemcacheServerCodec: bytes -> commands, errors, limits, and the reply encoders.

Tables of request bytes and the command they must yield; then every error and whether it
closes the connection; then Hypothesis: any split of a stream parses the same as the whole
stream, and junk never raises anything but ProtocolError.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tercel.errors import ProtocolError
from tercel.protocol import memcache as mc
from tercel.protocol.commands import (
    Command,
    Delete,
    DumpStats,
    Flush,
    FlushAll,
    FlushExpired,
    Get,
    Set,
    Simple,
    Unknown,
)

Outcome = Command | tuple[str, str, bool]
"""A parsed command, or ``("error", reason, close)`` for a ProtocolError (a plain tuple:
``Get`` and ``Set`` are tuple subclasses, so tell them apart with ``type(o) is tuple``)."""


def parse_one(data: bytes) -> Command:
    """The single command in ``data`` (which must hold exactly one)."""
    codec = mc.MemcacheServerCodec()
    codec.receive_data(data)
    cmd = codec.next_command()
    assert cmd is not mc.NEED_DATA, f"incomplete: {data!r}"
    assert codec.next_command() is mc.NEED_DATA
    assert codec.buffered == 0
    return cmd


def parse_error(data: bytes) -> ProtocolError:
    """The ProtocolError the first command of ``data`` raises."""
    codec = mc.MemcacheServerCodec()
    codec.receive_data(data)
    with pytest.raises(ProtocolError) as info:
        codec.next_command()
    return info.value


def drain(codec: mc.MemcacheServerCodec, out: list[Outcome]) -> bool:
    """Parse every complete command into ``out``; False once a closing error was seen."""
    for _ in range(100_000):  # bound: a codec that never returns NEED_DATA is a bug
        try:
            cmd = codec.next_command()
        except ProtocolError as exc:
            out.append(("error", exc.reason, exc.close))
            if exc.close:
                return False
            continue
        if cmd is mc.NEED_DATA:
            return True
        out.append(cmd)
    raise AssertionError("codec never returned NEED_DATA")


def parse_chunks(chunks: list[bytes]) -> list[Outcome]:
    """Feed ``chunks`` one by one, draining after each; every outcome in order."""
    codec = mc.MemcacheServerCodec()
    out: list[Outcome] = []
    for chunk in chunks:
        codec.receive_data(chunk)
        if not drain(codec, out):
            break
    return out


# ---- get -----------------------------------------------------------------------------------

GETS = [
    (b"get q\r\n", Get(b"q", "q")),
    (b"get q\n", Get(b"q", "q")),
    (b"gets q\r\n", Get(b"q", "q", cas=True)),
    (b"get q/open\r\n", Get(b"q/open", "q", open=True)),
    (b"get q/close\r\n", Get(b"q/close", "q", close=True)),
    (b"get q/abort\r\n", Get(b"q/abort", "q", abort=True)),
    (b"get q/peek\r\n", Get(b"q/peek", "q", peek=True)),
    (b"get q/close/open\r\n", Get(b"q/close/open", "q", open=True, close=True)),
    (b"get q/open/close\r\n", Get(b"q/open/close", "q", open=True, close=True)),
    (b"get q/t=500\r\n", Get(b"q/t=500", "q", timeout=500)),
    (b"get q/t=0\r\n", Get(b"q/t=0", "q", timeout=None)),
    (b"get q/t=-5\r\n", Get(b"q/t=-5", "q", timeout=None)),
    (b"get q/t=1/t=2\r\n", Get(b"q/t=1/t=2", "q", timeout=2)),
    (b"get q/t=500/open\r\n", Get(b"q/t=500/open", "q", timeout=500, open=True)),
    (
        b"get q/close/open/t=10\r\n",
        Get(b"q/close/open/t=10", "q", timeout=10, open=True, close=True),
    ),
    (b"get q/peek/t=7\r\n", Get(b"q/peek/t=7", "q", timeout=7, peek=True)),
    (b"get q/abort/t=7\r\n", Get(b"q/abort/t=7", "q", timeout=7, abort=True)),
    (b"get q/open/open\r\n", Get(b"q/open/open", "q", open=True)),
    (b"gets q/peek\r\n", Get(b"q/peek", "q", peek=True, cas=True)),
    (b"get a+b\r\n", Get(b"a+b", "a+b")),
    (b"get Az09_-:$%\r\n", Get(b"Az09_-:$%", "Az09_-:$%")),
    (b"get q other ignored\r\n", Get(b"q", "q")),
    (b"get   q  \r\n", Get(b"q", "q")),
    (b"GET q\r\n", Get(b"q", "q")),
    (b"GeTs q\r\n", Get(b"q", "q", cas=True)),
    (b"get Q\r\n", Get(b"Q", "Q")),
    (b"get " + b"x" * 200 + b"\r\n", Get(b"x" * 200, "x" * 200)),
]


@pytest.mark.parametrize(("data", "expected"), GETS, ids=[repr(d) for d, _ in GETS])
def test_get(data: bytes, expected: Get) -> None:
    assert parse_one(data) == expected


# ---- every other command -------------------------------------------------------------------

COMMANDS = [
    (b"set q 0 0 5\r\nhello\r\n", Set("q", 0, 0, b"hello")),
    (b"set q 7 100 0\r\n\r\n", Set("q", 7, 100, b"")),
    (b"set q 0 -1 1\r\nx\r\n", Set("q", 0, -1, b"x")),
    (b"set q 0 0 3 noreply\r\nabc\r\n", Set("q", 0, 0, b"abc", noreply=True)),
    (b"set q 0 0 3 other\r\nabc\r\n", Set("q", 0, 0, b"abc")),
    (b"set q 0 0 4\r\na\r\nb\r\n", Set("q", 0, 0, b"a\r\nb")),
    (b"set q 0 0 2\r\n\x00\xff\r\n", Set("q", 0, 0, b"\x00\xff")),
    (b"SET q 1 2 1\r\nz\r\n", Set("q", 1, 2, b"z")),
    (b"sEt q 1 2 1\r\nz\r\n", Set("q", 1, 2, b"z")),
    (b"delete q\r\n", Delete("q")),
    (b"delete q noreply\r\n", Delete("q", noreply=True)),
    (b"DELETE q\r\n", Delete("q")),
    (b"flush q\r\n", Flush("q")),
    (b"flush q noreply\r\n", Flush("q", noreply=True)),
    (b"flush_all\r\n", FlushAll()),
    (b"flush_all 10\r\n", FlushAll()),
    (b"flush_all noreply\r\n", FlushAll(noreply=True)),
    (b"flush_all 0 noreply\r\n", FlushAll(noreply=True)),
    (b"FLUSH_ALL\r\n", FlushAll()),
    (b"flush_expired q\r\n", FlushExpired("q")),
    (b"flush_all_expired\r\n", Simple("flush_all_expired")),
    (b"version\r\n", Simple("version")),
    (b"VERSION\r\n", Simple("version")),
    (b"shutdown\r\n", Simple("shutdown")),
    (b"reload\r\n", Simple("reload")),
    (b"dump_config\r\n", Simple("dump_config")),
    (b"DUMP_CONFIG\r\n", Simple("dump_config")),
    (b"stats\r\n", Simple("stats")),
    (b"Stats\r\n", Simple("stats")),
    (b"quit\r\n", Simple("quit")),
    (b"dump_stats\r\n", DumpStats(())),
    (b"dump_stats a\r\n", DumpStats(("a",))),
    (b"dump_stats a b+c\r\n", DumpStats(("a", "b+c"))),
    (b"get_multi q\r\n", Unknown(b"get_multi")),
    (b"bogus\r\n", Unknown(b"bogus")),
    (b"BOGUS\r\n", Unknown(b"bogus")),
    (b"\r\n", Unknown(b"")),
    (b"   \r\n", Unknown(b"")),
    (b"add q 0 0 3\r\nabc\r\n", Unknown(b"add")),
    (b"replace q 0 0 3\r\nabc\r\n", Unknown(b"replace")),
    (b"append q 0 0 3\r\nabc\r\n", Unknown(b"append")),
    (b"prepend q 0 0 3\r\nabc\r\n", Unknown(b"prepend")),
    (b"cas q 0 0 3 99\r\nabc\r\n", Unknown(b"cas")),
    (b"ADD q 0 0 3\r\nabc\r\n", Unknown(b"add")),
    # Storage commands other than set do not validate the name: they are only consumed.
    (b"add ../x 0 0 1\r\nz\r\n", Unknown(b"add")),
]


@pytest.mark.parametrize(("data", "expected"), COMMANDS, ids=[repr(d) for d, _ in COMMANDS])
def test_command(data: bytes, expected: Command) -> None:
    assert parse_one(data) == expected


def test_payload_is_bytes_not_a_view() -> None:
    codec = mc.MemcacheServerCodec()
    codec.receive_data(b"set q 0 0 3\r\nabc\r\n")
    cmd = codec.next_command()
    assert isinstance(cmd, Set)
    assert type(cmd.data) is bytes
    codec.receive_data(b"get q\r\n")  # compacting the buffer must not change the payload
    assert cmd.data == b"abc"


def test_storage_payload_consumed_then_next_command_parses() -> None:
    out = parse_chunks([b"add q 0 0 5\r\nget q\r\nversion\r\n"])
    assert out == [Unknown(b"add"), Simple("version")]  # "get q" was the payload
    out = parse_chunks([b"add q 0 0 4\r\nget q\r\nversion\r\n"])
    assert out == [("error", "bad data chunk", True)]  # "q\r" where CRLF must be
    out = parse_chunks([b"prepend q 0 0 7\r\nget q\r\n\r\nversion\r\n"])
    assert out == [Unknown(b"prepend"), Simple("version")]


def test_pipelined_commands_in_one_read() -> None:
    data = b"set a 0 0 1\r\nx\r\nget a/open\r\nget a/close\r\ndelete a\r\nquit\r\n"
    assert parse_chunks([data]) == [
        Set("a", 0, 0, b"x"),
        Get(b"a/open", "a", open=True),
        Get(b"a/close", "a", close=True),
        Delete("a"),
        Simple("quit"),
    ]


def test_need_data_until_line_and_payload_complete() -> None:
    codec = mc.MemcacheServerCodec()
    for piece in (b"se", b"t q 0 0 3", b"\r"):
        codec.receive_data(piece)
        assert codec.next_command() is mc.NEED_DATA
    codec.receive_data(b"\nab")
    assert codec.next_command() is mc.NEED_DATA
    codec.receive_data(b"c\r")
    assert codec.next_command() is mc.NEED_DATA
    assert codec.buffered == 4
    codec.receive_data(b"\n")
    assert codec.next_command() == Set("q", 0, 0, b"abc")
    assert codec.buffered == 0


# ---- errors that keep the connection --------------------------------------------------------

KEEP_ERRORS = [
    (b"get ../x\r\n", "bad queue name"),
    (b"get .\r\n", "bad queue name"),
    (b"get ~\r\n", "bad queue name"),
    (b"get a~b\r\n", "bad queue name"),
    (b"get a.1\r\n", "bad queue name"),
    (b"get " + b"x" * 201 + b"\r\n", "bad queue name"),
    (b"get caf\xc3\xa9\r\n", "bad queue name"),
    (b"get \xff\r\n", "bad queue name"),
    (b"get +a\r\n", "bad queue name"),
    (b"get a+\r\n", "bad queue name"),
    (b"get a++b\r\n", "bad queue name"),
    (b"get /open\r\n", "bad queue name"),
    (b"get a/b\r\n", "unknown get option b"),
    (b"get a//open\r\n", "unknown get option "),
    (b"get a/OPEN\r\n", "unknown get option OPEN"),
    (b"get a/t=\r\n", "bad timeout"),
    (b"get a/t=x\r\n", "bad timeout"),
    (b"get a/t=1.5\r\n", "bad timeout"),
    (b"get a/open/peek\r\n", "peek and abort cannot be combined with open or close"),
    (b"get a/close/peek\r\n", "peek and abort cannot be combined with open or close"),
    (b"get a/open/abort\r\n", "peek and abort cannot be combined with open or close"),
    (b"get a/close/abort\r\n", "peek and abort cannot be combined with open or close"),
    (b"get a/peek/abort\r\n", "peek and abort cannot be combined"),
    (b"get\r\n", "missing queue name"),
    (b"gets\r\n", "missing queue name"),
    (b"delete\r\n", "missing queue name"),
    (b"flush\r\n", "missing queue name"),
    (b"flush_expired\r\n", "missing queue name"),
    (b"delete a/b\r\n", "bad queue name"),
    (b"flush .\r\n", "bad queue name"),
    (b"flush_expired ~x\r\n", "bad queue name"),
    (b"dump_stats a ../b\r\n", "bad queue name"),
]


@pytest.mark.parametrize(("data", "reason"), KEEP_ERRORS, ids=[repr(d) for d, _ in KEEP_ERRORS])
def test_error_keeps_connection(data: bytes, reason: str) -> None:
    out = parse_chunks([data + b"version\r\n"])
    assert out == [("error", reason, False), Simple("version")]


def test_unknown_get_option_text_is_bounded() -> None:
    err = parse_error(b"get a/" + b"z" * 500 + b"\r\n")
    assert err.reason == "unknown get option " + "z" * 40
    assert not err.close


BAD_SET_FIELDS = [
    (b"set q x 0 1\r\nz\r\n", "bad flags"),
    (b"set q 0 x 1\r\nz\r\n", "bad exptime"),
    (b"set q 1.5 0 1\r\nz\r\n", "bad flags"),
    (b"set ../q 0 0 1\r\nz\r\n", "bad queue name"),
    (b"set q/open 0 0 1\r\nz\r\n", "bad queue name"),
    (b"set . 0 0 3\r\nabc\r\n", "bad queue name"),
]


@pytest.mark.parametrize(
    ("data", "reason"), BAD_SET_FIELDS, ids=[repr(d) for d, _ in BAD_SET_FIELDS]
)
def test_bad_set_field_consumes_payload_and_keeps_connection(data: bytes, reason: str) -> None:
    out = parse_chunks([data + b"get q\r\n"])
    assert out == [("error", reason, False), Get(b"q", "q")]
    # The same, byte by byte: the error is only raised once the payload has arrived.
    stream = data + b"get q\r\n"
    assert parse_chunks([stream[i : i + 1] for i in range(len(stream))]) == out


# ---- errors that close the connection -------------------------------------------------------

CLOSE_ERRORS = [
    (b"set q 0 0\r\n", "bad command line format"),
    (b"set q 0\r\n", "bad command line format"),
    (b"set\r\n", "bad command line format"),
    (b"add q 0 0\r\n", "bad command line format"),
    (b"set q 0 0 x\r\n", "bad data chunk size"),
    (b"set q 0 0 1.0\r\n", "bad data chunk size"),
    (b"set q 0 0 -1\r\n", "bad data chunk size"),
    (b"set q 0 0 %d\r\n" % (mc.MAX_VALUE + 1), "object too large for cache"),
    (b"cas q 0 0 %d 1\r\n" % (mc.MAX_VALUE + 1), "object too large for cache"),
    (b"set q 0 0 3\r\nabcde\r\n", "bad data chunk"),
    (b"set q 0 0 3\r\nabc\n\r\n", "bad data chunk"),
    (b"set q 0 0 3\r\nabcXY", "bad data chunk"),
    (b"set q x 0 3\r\nabcXY", "bad data chunk"),
    (b"add q 0 0 3\r\nabcXY", "bad data chunk"),
]


@pytest.mark.parametrize(("data", "reason"), CLOSE_ERRORS, ids=[repr(d) for d, _ in CLOSE_ERRORS])
def test_error_closes_connection(data: bytes, reason: str) -> None:
    err = parse_error(data)
    assert (err.reason, err.close) == (reason, True)


def test_huge_declared_size_is_refused_before_the_payload_arrives() -> None:
    codec = mc.MemcacheServerCodec()
    codec.receive_data(b"set q 0 0 %d\r\n" % (mc.MAX_VALUE + 1))
    with pytest.raises(ProtocolError) as info:
        codec.next_command()
    assert info.value.close


def test_max_value_is_inclusive() -> None:
    codec = mc.MemcacheServerCodec(max_value=4)
    codec.receive_data(b"set q 0 0 4\r\nabcd\r\nset q 0 0 5\r\n")
    assert codec.next_command() == Set("q", 0, 0, b"abcd")
    with pytest.raises(ProtocolError) as info:
        codec.next_command()
    assert info.value.close


def test_default_limits() -> None:
    assert mc.MAX_LINE == 8 * 1024
    assert mc.MAX_VALUE == 64 * 1024 * 1024


def test_line_over_limit_without_newline_closes() -> None:
    codec = mc.MemcacheServerCodec()
    codec.receive_data(b"get " + b"x" * (mc.MAX_LINE - 4))
    assert codec.next_command() is mc.NEED_DATA  # exactly MAX_LINE bytes: still waiting
    codec.receive_data(b"x")
    with pytest.raises(ProtocolError) as info:
        codec.next_command()
    assert (info.value.reason, info.value.close) == ("line too long", True)


def test_line_over_limit_with_newline_closes() -> None:
    err = parse_error(b"x" * (mc.MAX_LINE + 1) + b"\nversion\r\n")
    assert (err.reason, err.close) == ("line too long", True)


def test_line_at_limit_parses() -> None:
    codec = mc.MemcacheServerCodec(max_line=16)
    codec.receive_data(b"dump_stats a bcd\n")  # 16 bytes before the newline
    assert codec.next_command() == DumpStats(("a", "bcd"))
    codec.receive_data(b"dump_stats a bcd\r\n")  # the CR counts: 17
    with pytest.raises(ProtocolError):
        codec.next_command()


def test_long_payload_is_not_a_long_line() -> None:
    payload = b"y" * (mc.MAX_LINE * 3)
    data = b"set q 0 0 %d\r\n%b\r\n" % (len(payload), payload)
    assert parse_chunks([data]) == [Set("q", 0, 0, payload)]
    assert parse_chunks([data[:100], data[100:]]) == [Set("q", 0, 0, payload)]


# ---- replies -------------------------------------------------------------------------------


def test_reply_constants() -> None:
    assert mc.STORED == b"STORED\r\n"
    assert mc.NOT_STORED == b"NOT_STORED\r\n"
    assert mc.DELETED == b"DELETED\r\n"
    assert mc.END == b"END\r\n"
    assert mc.OK == b"OK\r\n"
    assert mc.ERROR == b"ERROR\r\n"
    assert mc.VALUE_TAIL == b"\r\nEND\r\n"
    assert mc.RELOADED == b"Reloaded config.\r\n"


def test_value_head() -> None:
    assert mc.value_head(b"work", 5) == b"VALUE work 0 5\r\n"
    assert mc.value_head(b"work", 0) == b"VALUE work 0 0\r\n"
    assert mc.value_head(b"a+b", 12, 42) == b"VALUE a+b 0 12 42\r\n"
    whole = mc.value_head(b"q", 3) + b"abc" + mc.VALUE_TAIL
    assert whole == b"VALUE q 0 3\r\nabc\r\nEND\r\n"


def test_error_lines() -> None:
    assert mc.client_error("bad queue name") == b"CLIENT_ERROR bad queue name\r\n"
    assert mc.client_error("a\r\nb\t c") == b"CLIENT_ERROR a b c\r\n"
    assert mc.client_error("caf\u00e9") == b"CLIENT_ERROR caf?\r\n"
    assert mc.server_error("journal write failed") == b"SERVER_ERROR journal write failed\r\n"
    assert mc.server_error(" x\n") == b"SERVER_ERROR x\r\n"


def test_version_and_number() -> None:
    assert mc.version("tercel 0.1.0") == b"VERSION tercel 0.1.0\r\n"
    assert mc.number(0) == b"0\r\n"
    assert mc.number(3) == b"3\r\n"


def test_stats() -> None:
    assert mc.stats([]) == b"END\r\n"
    assert mc.stats([("uptime", 5), ("version", "0.1"), ("queue_a_items", 0)]) == (
        b"STAT uptime 5\r\nSTAT version 0.1\r\nSTAT queue_a_items 0\r\nEND\r\n"
    )


def test_blocks() -> None:
    assert mc.blocks([]) == b"END\r\n"
    assert mc.blocks([("a", [("items", 1), ("bytes", 5)]), ("b+c", [])]) == (
        b"queue 'a' {\r\n  items=1\r\n  bytes=5\r\n}\r\nqueue 'b+c' {\r\n}\r\nEND\r\n"
    )


# ---- properties ----------------------------------------------------------------------------

names = st.from_regex(r"[A-Za-z0-9_\-:$%]{1,12}(\+[A-Za-z0-9_]{1,5})?", fullmatch=True)
payloads = st.binary(max_size=64)


@st.composite
def get_requests(draw: st.DrawFn) -> bytes:
    opts = draw(
        st.sampled_from(
            [[], ["open"], ["close"], ["close", "open"], ["abort"], ["peek"], ["open", "peek"]]
        )
    )
    if draw(st.booleans()):
        opts = [*opts, f"t={draw(st.integers(-10, 10**6))}"]
    key = "/".join([draw(names), *opts]).encode()
    return b"%s %s\r\n" % (draw(st.sampled_from([b"get", b"gets", b"GET"])), key)


@st.composite
def set_requests(draw: st.DrawFn) -> bytes:
    data = draw(payloads)
    flags = draw(st.sampled_from([b"0", b"12", b"x"]))
    tail = draw(st.sampled_from([b"", b" noreply"]))
    return b"set %s %b %d %d%b\r\n%b\r\n" % (
        draw(names).encode(),
        flags,
        draw(st.integers(-100, 2 * 10**9)),
        len(data),
        tail,
        data,
    )


simple_requests = st.sampled_from(
    [
        b"version\r\n",
        b"stats\r\n",
        b"flush_all\r\n",
        b"flush_all_expired\r\n",
        b"dump_stats\r\n",
        b"dump_stats a b\r\n",
        b"delete q\r\n",
        b"flush q noreply\r\n",
        b"flush_expired q\r\n",
        b"bogus line\r\n",
        b"\r\n",
        b"get ../x\r\n",
        b"add q 0 0 2\r\nab\r\n",
        b"reload\n",
    ]
)
requests = st.one_of(get_requests(), set_requests(), simple_requests)


@settings(max_examples=200, deadline=None)
@given(st.lists(requests, min_size=1, max_size=8), st.data())
def test_any_split_parses_like_the_whole(reqs: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(reqs)
    whole = parse_chunks([stream])
    assert len(whole) == len(reqs)
    assert not any(type(o) is tuple and o[2] for o in whole)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert parse_chunks(pieces) == whole
    assert parse_chunks([stream[i : i + 1] for i in range(len(stream))]) == whole


junk_tokens = st.sampled_from(
    [
        b"get ",
        b"set ",
        b"add ",
        b"cas ",
        b"delete ",
        b"flush_expired ",
        b"dump_stats ",
        b"q",
        b"/open",
        b"/t=",
        b"/peek",
        b" 0",
        b" -1",
        b" 99999999999",
        b" 3",
        b"\r\n",
        b"\n",
        b"\r",
        b" ",
        b"\x00",
        b"\xff",
        b"~.",
    ]
)
junk = st.one_of(st.binary(max_size=300), st.lists(junk_tokens, max_size=40).map(b"".join))


@settings(max_examples=300, deadline=None)
@given(junk, st.lists(st.integers(1, 20), max_size=20))
def test_junk_only_raises_protocol_error(data: bytes, sizes: list[int]) -> None:
    codec = mc.MemcacheServerCodec(max_line=64, max_value=256)
    pos = 0
    out: list[Outcome] = []
    for size in [*sizes, len(data)]:
        codec.receive_data(data[pos : pos + size])
        pos += size
        if not drain(codec, out):  # drain bounds its iterations and lets only ProtocolError out
            break
    assert len(out) <= len(data) + 1


@pytest.mark.parametrize("token", [b"+5", b"1_0", b"0x1", b"--1", b"5a"])
def test_numbers_are_plain_decimal(token: bytes) -> None:
    """Only ASCII digits (with a leading minus where negatives mean something) are numbers."""
    assert parse_error(b"get q/t=" + token + b"\r\n").reason == "bad timeout"
    err = parse_error(b"set q 0 0 " + token + b"\r\n")
    assert (err.reason, err.close) == ("bad data chunk size", True)


def test_repeated_commands_parse_the_same_through_the_caches() -> None:
    """Plain gets of a name seen before share one Get; a size seen before skips the digit
    check but not the per-codec limit."""
    codec = mc.MemcacheServerCodec(max_value=4)
    codec.receive_data(
        b"get cq\r\nget cq\r\nget cq\r\nget cq/open\r\n"
        b"set cq 0 0 4\r\nabcd\r\nset cq 0 0 4\r\nwxyz\r\nset cq 0 0 5\r\n"
    )
    gets = [codec.next_command() for _ in range(4)]
    assert gets[:3] == [Get(b"cq", "cq")] * 3 and gets[1] is gets[2]
    assert gets[3] == Get(b"cq/open", "cq", open=True)
    assert [codec.next_command() for _ in range(2)] == [
        Set("cq", 0, 0, b"abcd"),
        Set("cq", 0, 0, b"wxyz"),
    ]
    with pytest.raises(ProtocolError) as info:
        codec.next_command()
    assert info.value.close
    big = mc.MemcacheServerCodec(max_value=5)  # the same size token, another codec's limit
    big.receive_data(b"set cq 0 0 5\r\nhello\r\n")
    assert big.next_command() == Set("cq", 0, 0, b"hello")


def test_a_repeated_line_is_recognised_only_whole() -> None:
    """The codec remembers its last get and set line; a line that merely starts like one, or
    a repeat whose payload is still on its way, parses as it would the first time."""
    assert parse_chunks(
        [
            b"get q\r\nget q\r\nget qq\r\nget q\nget q\r\n",
            b"set q 0 0 2\r\nab\r\nset q 0 0 2\r\nc",
            b"d\r\nset q 0 0 2\r\nefg\r\n",
        ]
    ) == [
        Get(b"q", "q"),
        Get(b"q", "q"),
        Get(b"qq", "qq"),
        Get(b"q", "q"),
        Get(b"q", "q"),
        Set("q", 0, 0, b"ab"),
        Set("q", 0, 0, b"cd"),
        ("error", "bad data chunk", True),
    ]


repeats = st.lists(st.sampled_from(range(4)), min_size=1, max_size=24)


@settings(max_examples=200, deadline=None)
@given(st.lists(requests, min_size=1, max_size=4), repeats, st.data())
def test_repeated_lines_parse_as_the_first_time(
    pool: list[bytes], picks: list[int], data: st.DataObject
) -> None:
    """A stream that repeats a few requests parses, in any split, to what each request gives
    alone (the first time a codec sees it)."""
    reqs = [pool[i % len(pool)] for i in picks]
    alone: list[Outcome] = []
    for req in reqs:
        one = parse_chunks([req])
        alone += one
        if any(type(o) is tuple and o[2] for o in one):
            break  # a closing error ends the stream
    stream = b"".join(reqs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert parse_chunks(pieces) == alone


def test_a_long_line_is_parsed_each_time_not_remembered() -> None:
    """Lines of 512 bytes or more (padded numbers) parse as usual and are not kept: a short
    line's repeat is its remembered command (the same object), a long line's repeat a new
    parse, and a long line between two short ones leaves the short one remembered."""
    short = b"get q/t=5\r\n"
    line = b"get q/t=" + b"0" * 600 + b"5\r\n"
    codec = mc.MemcacheServerCodec()
    codec.receive_data(short + line * 2 + short)
    cmds = [codec.next_command() for _ in range(4)]
    assert cmds[1:3] == [Get(line[4:-2], "q", timeout=5)] * 2
    assert cmds[1] is not cmds[2]  # parsed twice: not remembered
    assert cmds[3] is cmds[0]  # the short line is still the one remembered
