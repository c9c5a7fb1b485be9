"""Client and AsyncClient against a real server: every method, reservations, errors."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import Raw
from tercel.client import AsyncClient, Client
from tercel.errors import (
    BadRequest,
    ClientTimeout,
    NoServerAvailable,
    NotStored,
    ServerReplyError,
    TransportError,
)
from tercel.protocol.memcache_client import LeaseColumns
from tercel.testing import ServerProcess


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.address, timeout=10) as c:
        yield c


def dead_address() -> str:
    """A local port nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_put_get_peek(client: Client, qname: str) -> None:
    client.put(qname, b"one")
    assert client.put_many(qname, [b"two", b"", b"four"]) == 3
    assert client.peek(qname) == b"one"
    assert [client.get(qname) for _ in range(4)] == [b"one", b"two", b"", b"four"]
    assert client.get(qname) is None
    assert client.peek(qname) is None


def test_put_many_pipelines_large_batches(client: Client, qname: str) -> None:
    assert client.put_many(qname, (b"%d" % i for i in range(1234))) == 1234
    assert client.queue_stats()[client.cluster.servers[0].address][qname]["items"] == "1234"


def test_blocking_get_waits(server: ServerProcess, client: Client, qname: str) -> None:
    assert client.get(qname, timeout=0.05) is None
    got: list[bytes | None] = []
    reader = threading.Thread(target=lambda: got.append(client.get(qname, timeout=20)))
    reader.start()
    with Client(server.address) as other:
        other.put(qname, b"late")  # before or after the get blocked: either way it gets it
    reader.join()
    assert got == [b"late"]


def test_expiry(client: Client, qname: str) -> None:
    client.put(qname, b"x", expiry=100)
    assert client.get(qname) == b"x"
    with pytest.raises(ValueError):
        client.put(qname, b"x", expiry=0)


def test_reserve_confirm_and_abort(client: Client, qname: str) -> None:
    client.put_many(qname, [b"a", b"b"])
    first = client.reserve(qname)
    assert first is not None and first.data == b"a" and first.id > 0
    first.abort()
    again = client.reserve(qname)
    assert again is not None and again.data == b"a" and again.id == first.id
    again.confirm()
    with pytest.raises(ValueError):
        again.confirm()
    assert client.get(qname) == b"b"
    assert client.reserve(qname) is None


def test_reserve_context_manager(client: Client, qname: str) -> None:
    client.put_many(qname, [b"ok", b"fails"])
    item = client.reserve(qname)
    assert item is not None
    with item:
        assert item.data == b"ok"
    item = client.reserve(qname)
    assert item is not None
    with pytest.raises(RuntimeError), item:
        raise RuntimeError("processing failed")
    # Confirmed on success, aborted (back at the head) on the exception.
    assert client.get(qname) == b"fails"
    assert client.get(qname) is None


def test_reservation_dies_with_its_connection(
    server: ServerProcess, client: Client, qname: str
) -> None:
    """A client process that crashes while holding a reservation: the item goes back."""
    client.put(qname, b"a")
    crash = (
        "import os, sys\n"
        "from tercel.client import Client\n"
        "item = Client(sys.argv[1]).reserve(sys.argv[2])\n"
        "assert item is not None and item.data == b'a'\n"
        "os._exit(0)  # no confirm, no abort, no close\n"
    )
    subprocess.run([sys.executable, "-c", crash, server.address, qname], check=True, timeout=60)
    assert client.get(qname, timeout=5) == b"a"


def test_lease_ack_release_renew(client: Client, qname: str) -> None:
    client.put_many(qname, [b"%d" % i for i in range(5)])
    batch = client.lease(qname, 3, lease_time=60)
    assert [x.data for x in batch] == [b"0", b"1", b"2"]
    assert all(x.deliveries == 1 and x.expiry is None for x in batch)
    assert client.renew(batch, 120) == 3
    assert client.ack(batch[:1]) == 1
    assert client.ack(batch[:1]) == 0
    assert client.release(batch[1:]) == 2
    again = client.lease(qname, 10, lease_time=None)
    assert [(x.data, x.deliveries) for x in again] == [
        (b"1", 2),
        (b"2", 2),
        (b"3", 1),
        (b"4", 1),
    ]
    client.put(qname, b"expiring", expiry=3600)
    (timed,) = client.lease(qname, 1)
    assert timed.expiry is not None and abs(timed.expiry - (time.time() + 3600)) < 60
    assert client.ack([timed]) == 1
    assert client.ack(again) == 4
    assert client.lease(qname, 10, wait=0.05) == []


def test_many_acks_are_split_into_lines(client: Client, qname: str) -> None:
    client.put_many(qname, [b"x"] * 4500)
    batch = client.lease(qname, 5000)
    assert len(batch) == 4500
    assert client.ack(batch) == 4500


def test_delete_flush_stats_version(client: Client, qname: str) -> None:
    client.put_many(qname, [b"a", b"b"])
    client.flush(qname)
    assert client.get(qname) is None
    client.put(qname, b"c")
    client.delete(qname)
    assert client.get(qname) is None
    (version,) = client.version().values()
    assert version
    (stats,) = client.stats().values()
    assert int(stats["curr_connections"]) >= 1


def test_server_errors_are_raised(client: Client, qname: str) -> None:
    """``ERROR`` (what Kestrel answers a plain get on a queue the connection holds an open
    read of, or a command it does not know) from a server that answers every line so."""
    item = client.reserve(qname + "_e")
    assert item is None
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def answer_error() -> None:
            conn, _ = listener.accept()
            with conn:
                while conn.recv(65536):
                    conn.sendall(b"ERROR\r\n")

        thread = threading.Thread(target=answer_error, daemon=True)
        thread.start()
        with Client(f"127.0.0.1:{listener.getsockname()[1]}", timeout=10) as erring:
            with pytest.raises(ServerReplyError) as info:
                erring.get(qname)
            assert info.value.kind == "ERROR"
    thread.join(10)


def test_not_stored(tmp_path: Path) -> None:
    with (
        ServerProcess(tmp_path, "[queues.small]\nmax_items = 2\n") as srv,
        Client(srv.address) as c,
    ):
        with pytest.raises(NotStored) as info:
            c.put_many("small", [b"1", b"2", b"3"])
        assert info.value.stored == 2
        with pytest.raises(NotStored):
            c.put("small", b"4")


def test_unreachable_server_is_set_aside() -> None:
    with Client(dead_address(), retry_after=60) as c:
        with pytest.raises(TransportError):
            c.put("q", b"x")
        with pytest.raises(NoServerAvailable):
            c.put("q", b"x")


def test_timeout(tmp_path: Path) -> None:
    with socket.socket() as listener:  # accepts, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        with Client(address, timeout=0.2) as c, pytest.raises(ClientTimeout):
            c.version()


def test_async_client(server: ServerProcess, qname: str) -> None:
    async def main() -> None:
        async with AsyncClient(server.address) as c:
            await c.put(qname, b"a")
            assert await c.put_many(qname, [b"b", b"c", b"d"]) == 3
            assert await c.peek(qname) == b"a"
            assert await c.get(qname) == b"a"
            item = await c.reserve(qname)
            assert item is not None
            async with item:
                assert item.data == b"b"
            item = await c.reserve(qname)
            assert item is not None
            with pytest.raises(RuntimeError):
                async with item:
                    raise RuntimeError
            batch = await c.lease(qname, 5, wait=0.05, lease_time=30)
            assert [x.data for x in batch] == [b"c", b"d"]
            assert await c.release(batch[1:]) == 1
            assert await c.renew(batch[:1], 60) == 1
            assert await c.ack(batch) == 1
            assert await c.get(qname, timeout=0.05) == b"d"
            waiter = asyncio.create_task(c.get(qname, timeout=10))
            await asyncio.sleep(0)  # let the blocked get be sent first
            await c.put(qname, b"woken")
            assert await waiter == b"woken"
            await c.flush(qname)
            await c.delete(qname)
            assert list((await c.version()).values())
            assert list((await c.stats()).values())
        async with AsyncClient(dead_address()) as dead:
            with pytest.raises(TransportError):
                await dead.get("q")

    asyncio.run(main())


def test_lease_columns_and_ack_ids_sync_and_async(server: ServerProcess, qname: str) -> None:
    """The bulk lease (binary reply, as columns) and the ack by id list, in both clients."""
    with Client(server.address) as c:
        assert c.lease_columns(qname, 5) == ("", LeaseColumns())
        c.put_many(qname, [b"a", b"", b"ccc"])
        where, cols = c.lease_columns(qname, 2, lease_time=30)
        assert (where, len(cols), bytes(cols.data), list(cols.offsets)) == (
            server.address,
            2,
            b"a",
            [0, 1, 1],
        )
        assert list(cols.deliveries) == [1, 1]
        assert c.ack_ids(where, qname, [*cols.lease_ids, "bogus-1"]) == 2

    async def main() -> None:
        async with AsyncClient(server.address) as ac:
            where, cols = await ac.lease_columns(qname, 5, lease_time=30)
            assert (where, bytes(cols.data)) == (server.address, b"ccc")
            assert await ac.ack_ids(where, qname, cols.lease_ids) == 1
            assert await ac.ack_ids(where, qname, cols.lease_ids) == 0
            waiter = asyncio.create_task(ac.lease_columns(qname, 5, wait=10, lease_time=30))
            await asyncio.sleep(0)  # let the blocked lease be sent first
            await ac.put(qname, b"woken")
            where, cols = await waiter
            assert bytes(cols.data) == b"woken"
            assert await ac.ack_ids(where, qname, cols.lease_ids) == 1
            assert await ac.lease_columns(qname, 5, wait=0.05) == ("", LeaseColumns())

    asyncio.run(main())


def test_cli_verbs(server: ServerProcess, qname: str) -> None:
    def tercel(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
        cmd = [sys.executable, "-m", "tercel", args[0], "--server", server.address, *args[1:]]
        return subprocess.run(cmd, input=stdin, capture_output=True, timeout=60, check=False)

    assert tercel("put", qname, "a", "b").returncode == 0
    assert tercel("put", qname, stdin=b"c\nd\n").returncode == 0
    assert tercel("peek", qname).stdout == b"a\n"
    assert tercel("get", qname, "-n", "2").stdout == b"a\nb\n"
    stats = tercel("stats", qname).stdout.decode()
    assert qname in stats and "items" in stats
    assert tercel("tail", qname).stdout == b"c\nd\n"
    assert tercel("get", qname).returncode == 4  # exit_codes.EMPTY
    bad = subprocess.run(
        [sys.executable, "-m", "tercel", "get", "--server", dead_address(), "q"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 1 and b"cannot connect" in bad.stderr


def test_a_pooled_connection_the_server_closed_is_not_a_failure(tmp_path: Path) -> None:
    """The server closes idle connections (``client_timeout``); the next call opens a new
    one instead of setting the healthy server aside."""
    config = '[server]\nclient_timeout = "200ms"\n'
    with ServerProcess(tmp_path / "d", config) as srv, Client(srv.address, retry_after=30) as c:
        c.put("q", b"1")
        stats = Raw(srv.connect())
        deadline = time.monotonic() + 10
        while _curr_connections(stats) > 1:  # the pooled connection was closed
            assert time.monotonic() < deadline
            time.sleep(0.05)
        c.put("q", b"2")  # no TransportError, no NoServerAvailable
        assert c.get("q") == b"1"


def test_a_put_that_timed_out_is_not_sent_to_another_server(tmp_path: Path) -> None:
    """A timeout means the server may have stored the item: sending it elsewhere would
    store it twice. The timeout is raised instead."""
    with ServerProcess(tmp_path / "a") as a, ServerProcess(tmp_path / "b") as b:
        assert a.proc is not None
        with Client([a.address, b.address], timeout=0.3) as c:
            os.kill(a.proc.pid, signal.SIGSTOP)  # a hangs: connects, never answers
            try:
                timeouts = 0
                for i in range(6):
                    try:
                        c.put("q", b"%d" % i)
                    except ClientTimeout:
                        timeouts += 1
            finally:
                os.kill(a.proc.pid, signal.SIGCONT)
            assert timeouts >= 1
            assert _items(b) == 6 - timeouts  # the ones that timed out were not sent to b
            deadline = time.monotonic() + 10
            while _items(a) < timeouts:  # ... they are stored on a, late
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert _items(a) == timeouts


def _curr_connections(conn: Raw) -> int:
    conn.send(b"stats\r\n")
    n = 0
    while (line := conn.read_line()) != b"END\r\n":
        if line.split()[1] == b"curr_connections":
            n = int(line.split()[2])
    return n


def _items(srv: ServerProcess) -> int:
    conn = Raw(srv.connect())
    conn.send(b"stats\r\n")
    n = 0
    while (line := conn.read_line()) != b"END\r\n":
        if line.split()[1] == b"queue_q_items":
            n = int(line.split()[2])
    conn.close()
    return n


def test_a_waiting_read_with_a_short_timeout_asks_every_server(tmp_path: Path) -> None:
    """The item is on one of three servers: a read whose timeout is shorter than a rotation
    slice (or zero) still asks each of them once."""
    with (
        ServerProcess(tmp_path / "a") as a,
        ServerProcess(tmp_path / "b") as b,
        ServerProcess(tmp_path / "c") as c,
        Client([a.address, b.address, c.address]) as client,
        Client(c.address) as only_c,
    ):
        for timeout in (0, 0.05, 0.2):
            for _ in range(5):
                only_c.put("q", b"x")
                assert client.get("q", timeout=timeout) == b"x"


@pytest.mark.parametrize("bad", ["a b", "a\r\nflush_all", "a\tb", "", "caf\u00e9 x"])
def test_a_queue_name_that_is_not_one_word_is_refused_not_sent(
    client: Client, qname: str, bad: str
) -> None:
    """``flush("q x")`` once sent ``flush q x``, which the server read as ``flush q``: it
    emptied another queue (``delete`` deleted it); a name with CRLF injected a command."""
    victim = qname if bad != "a\r\nflush_all" else qname + "_v"
    name = bad.replace("a", qname, 1)
    client.put(victim, b"kept")
    for call in (client.flush, client.delete, client.peek, lambda n: client.put(n, b"x")):
        with pytest.raises(BadRequest):
            call(name)
    assert client.peek(victim) == b"kept"
