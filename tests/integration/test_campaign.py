"""Defects an outside campaign found against a real server (issue 33), one test each."""

from __future__ import annotations

import json
import socket
import struct
import sys
import urllib.request
from pathlib import Path

import pytest
import thriftpy2
from thriftpy2.thrift import TApplicationException

import support
from tercel import storage
from tercel.protocol.thrift import IDL_PATH
from tercel.testing import BeanstalkdProcess, ServerProcess

IDL = thriftpy2.load(IDL_PATH, module_name="campaign_kestrel_thrift")
FAULTY = (sys.executable, str(Path(__file__).resolve().parents[2] / "bench" / "faulty_serve.py"))


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


def test_a_queue_created_on_a_full_disk_is_refused_and_earlier_replies_are_sent(
    tmp_path: Path,
) -> None:
    """Every write to a file whose name starts with ``nospace`` fails with ENOSPC (the fault
    seam), so creating such a queue fails at its journal's header. Each front end gets a clear error
    for that command, the pipelined commands around it their replies, and no empty journal
    file is left."""
    rules = [
        {"kind": "fail", "op": op, "errno": "ENOSPC", "path": "/nospace"}
        for op in ("pwrite", "pwritev")
    ]
    env = {"TERCEL_SOAK_FAULTS": json.dumps(rules)}
    ports = ("--thrift-port", "0", "--text-port", "0")
    data = tmp_path / "data"
    with ServerProcess(data, extra_args=ports, env=env, launcher=FAULTY) as srv:
        mc = support.track(support.Raw(srv.connect()))
        nospace = b"SERVER_ERROR no space left on device\r\n"
        mc.call(
            support.set_cmd("ok", b"a")
            + support.set_cmd("nospace1", b"x")
            + b"get nospace2\r\nget nospace3/t=10\r\n"
            + support.set_cmd("ok", b"b"),
            b"STORED\r\n" + nospace * 3 + b"STORED\r\n",
        )
        text = support.text_connection(srv.ports["text"])
        text.call(
            b"put nospace4:\nx\n\nput ok:\nc\n\n",
            b"-Server not available for operation put: no space left on device",
            b"+1",
        )
        kc = support.thrift_client(IDL, srv.ports["thrift"])
        thrift_nospace = r"operation (put|peek): no space left on device"
        for call in (lambda: kc.put("nospace5", [b"x"], 0), lambda: kc.peek("nospace6")):
            with pytest.raises(TApplicationException, match=thrift_nospace):
                call()
        assert kc.put("ok", [b"d"], 0) == 1
        assert support.drain(mc, "ok") == [b"a", b"b", b"c", b"d"]
        assert sorted(p.name for p in data.iterdir() if "nospace" in p.name) == []
        assert "Traceback" not in srv.log() and "bug while serving" not in srv.log()


def test_idle_connections_leave_descriptors_for_the_admin_port_and_the_journals(
    tmp_path: Path,
) -> None:
    """Under a 128-descriptor limit, 120 idle memcache connections: those beyond the cap the
    limit leaves room for are refused with the refusal line, while the admin port answers,
    new queues get their journal files, and a freed slot serves a new client."""
    limit = 128
    cap = storage.auto_max_connections(limit, storage.auto_max_open(limit))
    assert cap is not None and cap < 120
    with ServerProcess(tmp_path, open_files=limit) as srv:
        conns = [support.track(support.Raw(srv.connect())) for _ in range(120)]
        served = []
        for conn in conns:
            conn.send(b"version\r\n")
            line = conn.read_line()
            if line.startswith(b"VERSION "):
                served.append(conn)
            else:
                assert line == b"SERVER_ERROR too many connections\r\n"
                assert conn.closed()
        assert len(served) == cap
        ping = urllib.request.urlopen(srv.admin_url + "/ping", timeout=10).read()
        assert ping == b'{"response":"pong"}'
        for i in range(20):  # each a new journal file
            served[0].call(support.set_cmd(f"q{i}", b"x"), b"STORED\r\n")
        served.pop().close()
        for _ in range(1000):  # until the server has seen the close
            late = support.track(support.Raw(srv.connect()))
            late.send(b"version\r\n")
            if late.read_line().startswith(b"VERSION "):
                break
        else:
            raise AssertionError("no slot was freed")
