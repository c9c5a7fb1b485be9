"""``max_partial_request_bytes``: a server-wide budget for the bytes of incomplete requests
(issue 33, defect 4). A real server with a 100 KiB budget; two connections each hold 60 KiB
of a request they have not finished. Which one crosses the budget depends on which read the
server handles first, so each test checks that exactly one was refused, with its front end's
reply and a close, while the other finishes its request, and that the server goes on serving
and frees the refused connection's share."""

from __future__ import annotations

import select
import socket
import struct
from collections.abc import Iterator

import pytest
import thriftpy2

import support
from tercel.protocol.thrift import IDL_PATH
from tercel.testing import ServerProcess

IDL = thriftpy2.load(IDL_PATH, module_name="budget_kestrel_thrift")
CONFIG = '[server]\nmax_partial_request_bytes = "100KB"\n'
HELD = 60 * 1024
MC_REFUSED = b"SERVER_ERROR out of memory storing object\r\n"
BS_REFUSED = b"OUT_OF_MEMORY\r\n"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    ports = ("--thrift-port", "0", "--beanstalk-port", "0", "--text-port", "0")
    with ServerProcess(tmp_path_factory.mktemp("budget"), CONFIG, extra_args=ports) as s:
        yield s


def connect(port: int) -> support.Raw:
    return support.Raw(socket.create_connection(("127.0.0.1", port), timeout=10))


def refused_one(a: support.Raw, b: support.Raw, reply_a: bytes, reply_b: bytes) -> support.Raw:
    """Wait until one of ``a``, ``b`` is answered; check it got its refusal (``reply_a`` or
    ``reply_b``) then a close. Returns the other one."""
    readable, _, _ = select.select([a.sock, b.sock], [], [], 10)
    assert len(readable) == 1, "exactly one connection answered"
    refused, reply, kept = (a, reply_a, b) if readable[0] is a.sock else (b, reply_b, a)
    refused.expect(reply)
    assert refused.closed()
    return kept


def test_memcache_set_beyond_the_budget_is_refused(srv: ServerProcess) -> None:
    size = 80 * 1024
    head = b"set big 0 0 %d\r\n" % size
    a, b = connect(srv.port), connect(srv.port)
    for c in (a, b):
        c.send(head + b"a" * HELD)
    kept = refused_one(a, b, MC_REFUSED, MC_REFUSED)
    other = connect(srv.port)
    other.call(b"version\r\n" + support.set_cmd("small", b"x"), b"VERSION ")
    other.read_line()
    other.expect(b"STORED\r\n")
    kept.call(b"a" * (size - HELD) + b"\r\n", b"STORED\r\n")
    # Nothing of the refused connection's is still counted: a set held as long fits.
    late = connect(srv.port)
    late.send(head + b"b" * HELD)
    late.call(b"b" * (size - HELD) + b"\r\n", b"STORED\r\n")
    assert [len(x) for x in support.drain(other, "big")] == [size] * 2


def test_beanstalk_put_beyond_the_budget_is_refused(srv: ServerProcess) -> None:
    size = 65_000
    a, b = connect(srv.ports["beanstalk"]), connect(srv.ports["beanstalk"])
    for c in (a, b):
        c.send(b"put 0 0 10 %d\r\n" % size + b"j" * HELD)
    kept = refused_one(a, b, BS_REFUSED, BS_REFUSED)
    kept.send(b"j" * (size - HELD) + b"\r\n")
    assert kept.read_line().startswith(b"INSERTED ")


def test_the_budget_is_the_servers_not_a_front_ends(srv: ServerProcess) -> None:
    """A beanstalk put holding 60 KiB next to a memcache set holding 60 KiB: the budget is
    the server's, not a front end's."""
    size = 65_000
    mc = connect(srv.port)
    bs = connect(srv.ports["beanstalk"])
    mc.send(b"set shared 0 0 %d\r\n" % size + b"m" * HELD)
    bs.send(b"put 0 0 10 %d\r\n" % size + b"j" * HELD)
    kept = refused_one(mc, bs, MC_REFUSED, BS_REFUSED)
    if kept is bs:
        kept.send(b"j" * (size - HELD) + b"\r\n")
        assert kept.read_line().startswith(b"INSERTED ")
    else:
        kept.call(b"m" * (size - HELD) + b"\r\n", b"STORED\r\n")


def test_text_put_beyond_the_budget_is_refused(srv: ServerProcess) -> None:
    """A text put's items count until its empty line comes."""
    lines = b"".join(b"%d" % i + b"t" * 10_000 + b"\n" for i in range(6))  # 60 KB of items
    a, b = connect(srv.ports["text"]), connect(srv.ports["text"])
    for c in (a, b):
        c.send(b"put budget_text:\n" + lines)
    kept = refused_one(a, b, b"-out of memory storing object\n", b"-out of memory storing object\n")
    kept.send(b"\n")
    assert kept.read_exact(3) == b"+6\n"


def thrift_head(length: int) -> bytes:
    return struct.pack("!i", length)


def test_thrift_frame_beyond_the_budget_closes_its_connection(srv: ServerProcess) -> None:
    """Thrift has no reply without a call: the refused connection is closed."""
    a, b = connect(srv.ports["thrift"]), connect(srv.ports["thrift"])
    for c in (a, b):
        c.send(thrift_head(80 * 1024) + b"\x00" * HELD)
    kept = refused_one(a, b, b"", b"")
    kept.close()
    kc = support.thrift_client(IDL, srv.ports["thrift"])
    assert kc.put("t", [b"x"], 0) == 1
    assert "Traceback" not in srv.log()
