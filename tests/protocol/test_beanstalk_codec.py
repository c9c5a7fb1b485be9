"""The beanstalkd codec, table-driven: each case is fed whole, byte by byte, and split at
every position, and must give the same requests. Expected replies were checked against
Debian's beanstalkd 1.12."""

from __future__ import annotations

import pytest

from codec_fuzz import Codec, fuzz_tests
from tercel.protocol.beanstalk import (
    BAD_FORMAT,
    EXPECTED_CRLF,
    FOREVER,
    JOB_TOO_BIG,
    UNKNOWN_COMMAND,
    BeanstalkCodec,
    Command,
    Invalid,
    Request,
    id_reply,
    job_reply,
    valid_tube,
    yaml_dict,
    yaml_list,
)

BAD = Invalid(BAD_FORMAT)
BAD_PUT = Invalid(BAD_FORMAT, "put")
UNKNOWN = Invalid(UNKNOWN_COMMAND)

CASES: list[tuple[bytes, list[Request]]] = [
    (b"put 1 2 3 5\r\nhello\r\n", [Command("put", pri=1, delay=2, ttr=3, body=b"hello")]),
    (b"put  1  2  3  0\r\n\r\n", [Command("put", pri=1, delay=2, ttr=3, body=b"")]),
    (b"put 4294967295 0 0 1\r\nx\r\n", [Command("put", pri=4294967295, body=b"x")]),
    (b"put 4294967296 0 0 1\r\nx\r\n", [BAD_PUT, UNKNOWN]),
    (b"put 1 0 1 1 \r\nx\r\n", [BAD_PUT, UNKNOWN]),
    (
        b"put 1 0 1 65536 x\r\n" + b"a" * 65538 + b"stats\r\n",
        [Invalid(JOB_TOO_BIG, "put"), Command("stats")],
    ),
    (b"put 0 0 1 2\r\nabXYstats\r\n", [Invalid(EXPECTED_CRLF, "put"), Command("stats")]),
    (b"put 0 0 1 2\r\nab\r\r\nquit\r\n", [Invalid(EXPECTED_CRLF, "put"), UNKNOWN]),
    (b"put -1 0 1 1\r\nx\r\n", [BAD_PUT, UNKNOWN]),
    (b"put\r\n", [UNKNOWN]),
    (b"puts\r\n", [UNKNOWN]),
    (b"PUT 1\r\n", [UNKNOWN]),
    (b"\r\n", [UNKNOWN]),
    (b"use foo\r\n", [Command("use", tube="foo")]),
    (b"use a b\r\n", [BAD]),
    (b"use -a\r\n", [BAD]),
    (b"use \r\n", [BAD]),
    (b"watch A-z0+/;.$_()\r\n", [Command("watch", tube="A-z0+/;.$_()")]),
    (b"ignore x\r\n", [Command("ignore", tube="x")]),
    (b"stats-tube default \r\n", [BAD]),
    (b"stats-tube default\r\n", [Command("stats-tube", tube="default")]),
    (b"use " + b"a" * 200 + b"\r\n", [Command("use", tube="a" * 200)]),
    (b"use " + b"a" * 201 + b"\r\n", [BAD]),
    (b"reserve\r\n", [Command("reserve")]),
    (b"reserve \r\n", [BAD]),
    (b"reserve-with-timeout 5\r\n", [Command("reserve-with-timeout", timeout=5)]),
    (b"reserve-with-timeout  0 junk\r\n", [Command("reserve-with-timeout", timeout=0)]),
    (b"reserve-with-timeout abc\r\n", [Command("reserve-with-timeout", timeout=0)]),
    (b"reserve-with-timeout -1\r\n", [Command("reserve-with-timeout", timeout=FOREVER)]),
    (b"reserve-with-timeout\r\n", [BAD]),
    (b"reserve-job 7\r\n", [Command("reserve-job", job_id=7)]),
    (b"reserve-job x\r\n", [BAD]),
    (b"delete 1\r\n", [Command("delete", job_id=1)]),
    (b"delete 1 \r\n", [BAD]),
    (b"delete +1\r\n", [BAD]),
    (b"delete 18446744073709551615\r\n", [Command("delete", job_id=2**64 - 1)]),
    (b"delete 18446744073709551616\r\n", [BAD]),
    (b"release 3 10 20\r\n", [Command("release", job_id=3, pri=10, delay=20)]),
    (b"release 1 1\r\n", [BAD]),
    (b"bury 4 9\r\n", [Command("bury", job_id=4, pri=9)]),
    (b"bury 1\r\n", [BAD]),
    (b"bury 1 1 1\r\n", [BAD]),
    (b"touch 5\r\n", [Command("touch", job_id=5)]),
    (b"touch 1 \r\n", [BAD]),
    (b"peek 0\r\n", [Command("peek", job_id=0)]),
    (
        b"peek-ready\r\npeek-delayed\r\npeek-buried\r\n",
        [Command("peek-ready"), Command("peek-delayed"), Command("peek-buried")],
    ),
    (b"kick 10\r\n", [Command("kick", count=10)]),
    (b"kick  3 junk\r\n", [Command("kick", count=3)]),
    (b"kick -1\r\n", [Command("kick", count=2**32 - 1)]),
    (b"kick 18446744073709551615\r\n", [Command("kick", count=2**32 - 1)]),  # strtoul
    (b"kick 4294967296\r\n", [Command("kick", count=0)]),  # beanstalkd's uint count
    (b"kick -18446744073709551615\r\n", [Command("kick", count=1)]),
    (b"kick 18446744073709551616\r\n", [BAD]),
    (b"kick -18446744073709551616\r\n", [BAD]),
    (b"kick \t+5x\r\n", [Command("kick", count=5)]),
    (b"kick x\r\n", [BAD]),
    (b"kick\r\n", [UNKNOWN]),
    (b"kick-job 3\r\n", [Command("kick-job", job_id=3)]),
    (b"kick-job 1 x\r\n", [BAD]),
    (b"stats\r\nstats-job 2\r\n", [Command("stats"), Command("stats-job", job_id=2)]),
    (b"stats \r\n", [BAD]),
    (
        b"list-tubes\r\nlist-tube-used\r\nlist-tubes-watched\r\n",
        [Command("list-tubes"), Command("list-tube-used"), Command("list-tubes-watched")],
    ),
    (b"list-tubes \r\n", [BAD]),
    (b"pause-tube  default  1\r\n", [Command("pause-tube", tube="default", delay=1)]),
    (b"pause-tube default 0 x\r\n", [BAD]),
    (b"pause-tube default 4294967296\r\n", [BAD]),
    (b"quit\r\n", [Command("quit")]),
    (b"quit now\r\n", [Command("quit")]),
    (b"stats\x00\r\n", [BAD]),
    (b"stats\n", []),
    (b"x" * 230 + b"\r\nstats\r\n", [BAD, Command("stats")]),
    (b"u" * 222 + b"\r\n", [UNKNOWN]),
    (b"u" * 223 + b"\r\nquit\r\n", [BAD, Command("quit")]),
]


def _feed(chunks: list[bytes], max_job_size: int = 65535) -> list[Request]:
    codec = BeanstalkCodec(max_job_size)
    out: list[Request] = []
    for chunk in chunks:
        out.extend(codec.feed(chunk))
    return out


@pytest.mark.parametrize(("data", "expected"), CASES, ids=[repr(c[0][:40]) for c in CASES])
def test_requests_whatever_the_split(data: bytes, expected: list[Request]) -> None:
    assert _feed([data]) == expected
    assert _feed([data[i : i + 1] for i in range(len(data))]) == expected
    step = max(1, len(data) // 64)  # every split of the short cases, a sample of the long
    for cut in range(1, len(data), step):
        assert _feed([data[:cut], data[cut:]]) == expected, cut


def test_max_job_size_is_the_limit() -> None:
    assert _feed([b"put 0 0 1 3\r\nabc\r\n"], max_job_size=3)[0] == Command(
        "put", ttr=1, body=b"abc"
    )
    assert _feed([b"put 0 0 1 4\r\nabcd\r\n"], max_job_size=3) == [Invalid(JOB_TOO_BIG, "put")]


def test_incomplete_request_stays_buffered() -> None:
    codec = BeanstalkCodec()
    assert codec.feed(b"put 0 0 1 5\r\nhel") == []
    assert codec.buffered == 3
    assert codec.feed(b"lo\r\n") == [Command("put", ttr=1, body=b"hello")]
    assert codec.buffered == 0


def test_valid_tube() -> None:
    assert valid_tube(b"default")
    assert valid_tube(b"a/b;c.(d)$_+")
    assert not valid_tube(b"")
    assert not valid_tube(b"-x")
    assert not valid_tube(b"a b")
    assert not valid_tube(b"a" * 201)
    assert not valid_tube(b"caf\xc3\xa9")


def test_replies() -> None:
    assert job_reply(b"RESERVED", 5, b"abc") == b"RESERVED 5 3\r\nabc\r\n"
    assert id_reply(b"INSERTED", 12) == b"INSERTED 12\r\n"
    assert yaml_list(["default"]) == b"OK 14\r\n---\n- default\n\r\n"
    body = yaml_dict([("id", 3), ("tube", "t.x"), ("draining", False), ("rusage-utime", 0.5)])
    assert (
        body == b'OK 61\r\n---\nid: 3\ntube: "t.x"\ndraining: false\nrusage-utime: 0.500000\n\r\n'
    )
    assert yaml_dict([("os", '#1 "x"')]).endswith(b'os: "#1 \\"x\\""\n\r\n')


class _Pump:
    """The fuzz harness's feed/step shape over :meth:`BeanstalkCodec.feed`."""

    NEED_DATA = object()

    def __init__(self) -> None:
        self.codec = BeanstalkCodec(max_job_size=64)
        self.ready: list[Request] = []

    def feed(self, data: bytes) -> None:
        self.ready.extend(self.codec.feed(data))

    def step(self) -> object:
        return self.ready.pop(0) if self.ready else self.NEED_DATA


TestBeanstalkFuzz = fuzz_tests(
    Codec(
        name="beanstalk server",
        new=_Pump,
        feed=lambda pump, data: pump.feed(data),
        step=lambda pump: pump.step(),
        need_data=_Pump.NEED_DATA,
        clean=(),
        closes=lambda exc: False,
        seeds=(
            b"put 0 0 10 3\r\nabc\r\n",
            b"reserve-with-timeout 0\r\n",
            b"use a.b/c\r\nwatch x\r\nignore default\r\n",
            b"release 1 2 3\r\nbury 4 5\r\nkick 9\r\nkick-job 1\r\n",
            b"stats\r\nstats-job 1\r\nstats-tube default\r\npause-tube default 1\r\n",
            b"put 0 0 1 99\r\n" + b"x" * 101,
        ),
        tokens=(b"put ", b" 4294967296", b" 18446744073709551616", b"\r\n", b"\x00", b"-"),
    )
)
