"""Defects an outside campaign found against a real server (issue 33), one test each."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

import thriftpy2

import support
from tercel.protocol.thrift import IDL_PATH
from tercel.testing import BeanstalkdProcess, ServerProcess

IDL = thriftpy2.load(IDL_PATH, module_name="campaign_kestrel_thrift")


def beanstalk(port: int) -> support.Raw:
    return support.track(support.Raw(socket.create_connection(("127.0.0.1", port), timeout=10)))


def test_kick_reads_its_bound_as_beanstalkd_does(tmp_path: Path) -> None:
    """``strtoul`` into a 32-bit ``uint``: the largest u64 is a bound, 2**32 is none."""
    with BeanstalkdProcess(tmp_path / "wal") as bsd:
        c = beanstalk(bsd.port)
        for job in (b"1", b"2"):
            c.call(b"put 0 0 10 1\r\nx\r\n", b"INSERTED %b\r\n" % job)
            c.call(b"reserve-with-timeout 0\r\n", b"RESERVED %b 1\r\nx\r\n" % job)
            c.call(b"bury %b 0\r\n" % job, b"BURIED\r\n")
        c.call(b"kick 4294967296\r\n", b"KICKED 0\r\n")
        c.call(b"kick 18446744073709551616\r\n", b"BAD_FORMAT\r\n")
        c.call(b"kick 18446744073709551615\r\n", b"KICKED 2\r\n")


def thrift_frame(body: bytes) -> bytes:
    head = struct.pack("!iI", -0x7FFEFFFF - 1 | 1, 3) + b"put" + struct.pack("!i", 7)
    return struct.pack("!i", len(head) + len(body)) + head + body


def test_a_thrift_frame_of_empty_structs_is_refused_and_others_are_served(
    tmp_path: Path,
) -> None:
    """A put whose undeclared field is a list of millions of empty structs: an exception at
    the field's header, on a connection that goes on; other front ends served meanwhile."""
    n = 4_000_000
    body = struct.pack("!bhi", 11, 1, 1) + b"q" + struct.pack("!bhbi", 15, 9, 12, n)
    frame = thrift_frame(body + b"\x00" * n + b"\x00")
    with ServerProcess(tmp_path, extra_args=("--thrift-port", "0")) as srv:
        with socket.create_connection(("127.0.0.1", srv.ports["thrift"]), timeout=30) as s:
            s.sendall(frame)
            reply = support.Raw(s)
            (length,) = struct.unpack("!i", reply.read_exact(4))
            answer = reply.read_exact(length)
            assert b"undeclared field 9 of type 15" in answer
            s.sendall(thrift_frame(struct.pack("!bhi", 11, 1, 1) + b"q" + b"\x00"))
            (length,) = struct.unpack("!i", reply.read_exact(4))
            assert b"items is required" in reply.read_exact(length)  # the same connection
        mc = support.track(support.Raw(srv.connect()))
        mc.send(b"version\r\n")
        assert mc.read_line().startswith(b"VERSION ")
        kc = support.thrift_client(IDL, srv.ports["thrift"])
        assert kc.put("q", [b"x"], 0) == 1
