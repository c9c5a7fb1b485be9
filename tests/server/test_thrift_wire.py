"""Kestrel's Thrift service over real sockets, with a thriftpy2 client built from the shipped
IDL: every method, reservations (auto-abort) confirmed or aborted from another connection,
the auto-abort timer, kill -9 and restart, status exceptions, bad frames, and hand-offs to and
from memcache and the text protocol."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import thriftpy2
from thriftpy2.thrift import TApplicationException

from support import Raw, drain, set_cmd, stats, thrift_client
from tercel.protocol.thrift import IDL_PATH
from tercel.testing import ServerProcess

IDL = thriftpy2.load(IDL_PATH, module_name="wire_kestrel_thrift")
PORTS = ("--thrift-port", "0", "--text-port", "0")


def client(srv: ServerProcess) -> Any:
    return thrift_client(IDL, srv.ports["thrift"])


@pytest.fixture(scope="module")
def tsrv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess(tmp_path_factory.mktemp("data"), extra_args=PORTS) as srv:
        yield srv


@pytest.fixture
def kc(tsrv: ServerProcess) -> Any:
    return client(tsrv)


@pytest.fixture
def mc(tsrv: ServerProcess) -> Iterator[Raw]:
    c = Raw(tsrv.connect())
    yield c
    c.close()


def data(items: list[Any]) -> list[bytes]:
    return [i.data for i in items]


def test_put_and_get_for_good(kc: Any, qname: str) -> None:
    assert kc.put(qname, [b"a", b"\x00\xff", b""], 0) == 3
    got = kc.get(qname, 2, 0, 0)
    assert data(got) == [b"a", b"\x00\xff"]
    assert [i.id for i in got] == [0, 0]
    assert data(kc.get(qname, 10, 0, 0)) == [b""]
    assert kc.get(qname, 10, 0, 0) == []
    assert kc.get(qname, 0, 0, 0) == []


def test_hand_offs_between_protocols(tsrv: ServerProcess, kc: Any, mc: Raw, qname: str) -> None:
    """An item put over any protocol is taken over any other."""
    q = qname.encode()
    mc.call(set_cmd(qname, b"from memcache"), b"STORED\r\n")
    t = socket.create_connection(("127.0.0.1", tsrv.ports["text"]), timeout=10)
    try:
        t.sendall(b"put %b:\nfrom text\n\n" % q)
        assert t.recv(100) == b"+1\n"
        assert data(kc.get(qname, 5, 0, 0)) == [b"from memcache", b"from text"]
        assert kc.put(qname, [b"to text", b"to memcache\r\n"], 0) == 2
        t.sendall(b"get %b\n" % q)
        assert t.recv(100) == b":to text\n"
        t.sendall(b"get %b\n" % q)  # confirms "to text"; the next is not a line: left alone
        assert t.recv(200).startswith(b"-Item holds a line feed")
    finally:
        t.close()
    assert drain(mc, qname) == [b"to memcache\r\n"]


def test_reservations_are_confirmed_from_another_connection(
    tsrv: ServerProcess, kc: Any, mc: Raw, qname: str
) -> None:
    assert kc.put(qname, [b"1", b"2", b"3"], 0) == 3
    got = kc.get(qname, 3, 0, 60_000)
    assert data(got) == [b"1", b"2", b"3"]
    ids = [i.id for i in got]
    assert len(set(ids)) == 3 and all(i > 0 for i in ids)
    kc.close()  # a disconnect does not end a reservation
    other = client(tsrv)
    info = other.peek(qname)
    assert (info.items, info.open_transactions, info.head_item) == (0, 3, None)
    assert other.confirm(qname, {ids[0], ids[1]}) == 2
    assert other.confirm(qname, {ids[0], 12345}) == 0  # already confirmed, unknown
    assert other.abort(qname, {ids[2]}) == 1
    assert data(other.get(qname, 5, 0, 0)) == [b"3"]
    assert drain(mc, qname) == []


def test_auto_abort_returns_items_to_the_head_in_order(kc: Any, qname: str) -> None:
    assert kc.put(qname, [b"a", b"b"], 0) == 2
    assert data(kc.get(qname, 2, 0, 50)) == [b"a", b"b"]
    assert kc.get(qname, 2, 0, 0) == []  # reserved
    # Waits until the timer returned both (together, in their order).
    assert data(kc.get(qname, 2, 5_000, 0)) == [b"a", b"b"]


def test_auto_abort_counts_from_the_reply_even_with_a_timeout(
    tsrv: ServerProcess, kc: Any, qname: str
) -> None:
    """A get with a timeout that finds its items at once still aborts them auto_abort_msec
    after the reply (not after the timeout it did not need)."""
    assert kc.put(qname, [b"a"], 0) == 1
    assert data(kc.get(qname, 1, 60_000, 50)) == [b"a"]
    other = client(tsrv)
    assert data(other.get(qname, 1, 10_000, 0)) == [b"a"]  # back after ~50 ms, not 60 s


def test_reservations_return_at_a_restart(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data", extra_args=PORTS) as srv:
        kc = client(srv)
        assert kc.put("q", [b"%d" % i for i in range(10)], 0) == 10
        assert data(kc.get("q", 3, 0, 600_000)) == [b"0", b"1", b"2"]
        srv.kill()
        srv.start()
        kc = client(srv)
        assert data(kc.get("q", 20, 0, 0)) == [b"%d" % i for i in range(10)]


def test_a_waiting_get_gathers_until_max_items(tsrv: ServerProcess, kc: Any, qname: str) -> None:
    """One item is there, the get wants two: it waits for the second (or, if the put beats
    the get to the server, finds both): the reply is the same either way."""
    other = client(tsrv)
    assert other.put(qname, [b"1"], 0) == 1
    result: list[list[bytes]] = []
    worker = threading.Thread(target=lambda: result.append(data(kc.get(qname, 2, 5_000, 0))))
    worker.start()
    assert other.put(qname, [b"2"], 0) == 1
    worker.join(10)
    assert result == [[b"1", b"2"]]


def test_a_waiting_get_times_out_with_what_it_has(kc: Any, qname: str) -> None:
    assert kc.put(qname, [b"only"], 0) == 1
    assert data(kc.get(qname, 5, 30, 0)) == [b"only"]
    assert kc.get(qname, 5, 30, 30_000) == []


def test_peek_flush_delete_version_status(kc: Any, qname: str) -> None:
    assert kc.put(qname, [b"head", b"tail"], 0) == 2
    info = kc.peek(qname)
    assert info.head_item == b"head"
    assert (info.items, info.bytes, info.open_transactions, info.waiters) == (2, 8, 0, 0)
    assert info.journal_bytes > 0
    kc.flush_queue(qname)
    assert kc.peek(qname).items == 0
    kc.put(qname, [b"x"], 0)
    kc.delete_queue(qname)
    assert kc.get(qname, 1, 0, 0) == []
    assert kc.get_version()
    assert kc.current_status() == IDL.Status.UP


def test_status_refusals_are_exceptions_on_a_live_connection(kc: Any, qname: str) -> None:
    kc.set_status(IDL.Status.READ_ONLY)
    try:
        assert kc.current_status() == IDL.Status.READ_ONLY
        with pytest.raises(TApplicationException, match="not available for operation put"):
            kc.put(qname, [b"x"], 0)
        assert kc.get(qname, 1, 0, 0) == []  # reads still work
        kc.set_status(IDL.Status.QUIESCENT)
        with pytest.raises(TApplicationException, match="not available for operation get"):
            kc.get(qname, 1, 0, 0)
        with pytest.raises(TApplicationException, match="NOT_CONFIGURED cannot be set"):
            kc.set_status(IDL.Status.NOT_CONFIGURED)
    finally:
        kc.set_status(IDL.Status.UP)
    assert kc.put(qname, [b"x"], 0) == 1


def _raw_call(srv: ServerProcess, frame: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", srv.ports["thrift"]), timeout=10) as s:
        s.sendall(frame)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
            if len(out) >= 4 and len(out) >= 4 + struct.unpack("!i", out[:4])[0]:
                break
        return out


def test_unknown_method_and_bad_arguments_get_application_exceptions(
    tsrv: ServerProcess,
) -> None:
    body = struct.pack("!iI", -0x7FFEFFFF - 1 | 1, 6) + b"nosuch" + struct.pack("!i", 7) + b"\x00"
    assert b"unknown method nosuch" in _raw_call(tsrv, struct.pack("!i", len(body)) + body)
    assert b"bad queue name" in _raw_call(tsrv, make_raw_put("a/b"))


def make_raw_put(queue: str) -> bytes:
    return _call_frame("put", IDL.Kestrel.put_args(queue_name=queue, items=[b"x"]))


def test_oversized_and_malformed_frames_close_without_harm(tsrv: ServerProcess, kc: Any) -> None:
    # A frame declaring 2 GiB is refused at its length; a 2 GiB string inside a small frame
    # gets an exception; either way the server goes on.
    assert _raw_call(tsrv, struct.pack("!i", 2**31 - 1) + b"x" * 100) == b""
    assert _raw_call(tsrv, struct.pack("!i", 5) + b"\xff" * 5) == b""
    body = struct.pack("!iI", -0x7FFEFFFF - 1 | 1, 3) + b"put" + struct.pack("!i", 1)
    body += struct.pack("!bhi", 11, 1, 2**31 - 1)
    assert b"malformed arguments" in _raw_call(tsrv, struct.pack("!i", len(body)) + body)
    assert kc.get_version()


def _call_frame(method: str, args: Any) -> bytes:
    from thriftpy2.protocol.binary import TBinaryProtocol
    from thriftpy2.thrift import TMessageType
    from thriftpy2.transport.memory import TMemoryBuffer

    buf = TMemoryBuffer()
    proto = TBinaryProtocol(buf)
    proto.write_message_begin(method, TMessageType.CALL, 1)
    args.write(proto)
    return struct.pack("!i", len(buf.getvalue())) + buf.getvalue()


def test_a_client_that_leaves_a_waiting_get_loses_nothing(
    tsrv: ServerProcess, kc: Any, qname: str
) -> None:
    """The items a waiting get gathered are open reads until its reply: a client that leaves
    before it returns them to the queue."""
    with socket.create_connection(("127.0.0.1", tsrv.ports["thrift"]), timeout=10) as s:
        s.sendall(_call_frame("get", IDL.Kestrel.get_args(qname, 5, 60_000, 0)))
        assert kc.put(qname, [b"kept"], 0) == 1
        # Until the waiting get has taken the item (a round trip or two).
        assert any(kc.peek(qname).open_transactions == 1 for _ in range(1000))
    assert data(kc.get(qname, 1, 5_000, 0)) == [b"kept"]  # back once the server saw the close


def test_a_client_that_leaves_a_waiting_reservation_get_frees_its_items(
    tsrv: ServerProcess, kc: Any, qname: str
) -> None:
    """Items reserved for a reply that never went out (the client left while its get waited)
    go back at once, not after the timeout and auto_abort_msec."""
    with socket.create_connection(("127.0.0.1", tsrv.ports["thrift"]), timeout=10) as s:
        s.sendall(_call_frame("get", IDL.Kestrel.get_args(qname, 5, 60_000, 60_000)))
        assert kc.put(qname, [b"kept"], 0) == 1
        # Until the waiting get has reserved the item (a round trip or two).
        assert any(kc.peek(qname).open_transactions == 1 for _ in range(1000))
    assert data(kc.get(qname, 1, 10_000, 0)) == [b"kept"]


def test_an_argument_of_the_wrong_type_is_an_exception_not_a_default(
    tsrv: ServerProcess, kc: Any, qname: str
) -> None:
    """thriftpy2 skips a field whose wire type is not the IDL's: a put whose items are a
    list<i32> was acknowledged as 0 stored, an i64 expiration_msec read as 0 (never)."""
    head = struct.pack("!iI", -0x7FFEFFFF - 1 | 1, 3) + b"put" + struct.pack("!i", 9)
    name = struct.pack("!bhi", 11, 1, len(qname)) + qname.encode()
    items = struct.pack("!bhbi", 15, 2, 8, 2) + struct.pack("!ii", 1, 2)
    one = struct.pack("!bhbi", 15, 2, 11, 1) + struct.pack("!i", 1) + b"x"
    expiry = struct.pack("!bhq", 10, 3, 5)  # an i64 where the IDL has an i32
    for body in (head + name + items + b"\x00", head + name + one + expiry + b"\x00"):
        reply = _raw_call(tsrv, struct.pack("!i", len(body)) + body)
        assert b"malformed arguments" in reply
    assert kc.peek(qname).items == 0
    assert kc.put(qname, [b"x"], 0) == 1


def test_calls_are_counted_per_method_in_stats(
    tsrv: ServerProcess, kc: Any, mc: Raw, qname: str
) -> None:
    """``thrift_cmd_<method>`` in memcache ``stats``; a call the codec could not build is
    ``thrift_cmd_bad_call`` (a bad queue name too; its method name is the client's, not a
    counter's)."""
    before = stats(mc)
    assert kc.put(qname, [b"a"], 0) == 1
    assert data(kc.get(qname, 1, 0, 0)) == [b"a"]
    assert kc.get_version()
    assert b"bad queue name" in _raw_call(tsrv, make_raw_put("a/b"))
    body = struct.pack("!iI", -0x7FFEFFFF - 1 | 1, 6) + b"nosuch" + struct.pack("!i", 7) + b"\x00"
    _raw_call(tsrv, struct.pack("!i", len(body)) + body)
    after = stats(mc)
    for key, n in (("put", 1), ("get", 1), ("get_version", 1), ("bad_call", 2)):
        name = f"thrift_cmd_{key}"
        assert int(after[name]) - int(before.get(name, "0")) == n, name
    assert not any("nosuch" in k for k in after)
