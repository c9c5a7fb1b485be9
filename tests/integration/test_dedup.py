"""Dedup keys on real servers: a second put with a key is answered with the first one's item
id and stores nothing, across SIGKILL and restart, compaction and rotation, until the window
passes (docs/protocol.md, "Dedup keys")."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
import thriftpy2
from thriftpy2.thrift import TApplicationException

from support import Raw, drain, set_cmd, stats, text_connection, thrift_client
from tercel import exit_codes
from tercel.client import AsyncClient, Client, Stored
from tercel.errors import BadRequest, NotStored
from tercel.names import KEY_RULE
from tercel.protocol.thrift import IDL_PATH
from tercel.testing import ServerProcess


def keyed(q: str, key: str, data: bytes, tail: bytes = b"") -> bytes:
    """A memcache ``set`` of ``data`` to ``q`` with the dedup key ``key``."""
    return b"set %s 0 0 %d key=%s%s\r\n%s\r\n" % (q.encode(), len(data), key.encode(), tail, data)


def test_memcache_duplicate_answered_with_the_original_id(data_dir: Path) -> None:
    with ServerProcess(data_dir) as srv:
        conn = Raw(srv.connect())
        conn.call(set_cmd("q", b"plain"), b"STORED\r\n")
        conn.call(keyed("q", "k1", b"one"), b"STORED 2\r\n")
        conn.call(keyed("q", "k1", b"again"), b"STORED 2 duplicate\r\n")
        conn.call(keyed("q", "k2", b"two"), b"STORED 3\r\n")
        conn.call(keyed("q", "k2", b"x", b" noreply") + b"version\r\n", b"VERSION ")
        conn.read_line()
        assert drain(conn, "q") == [b"plain", b"one", b"two"]
        # Consumed items keep their keys for the window: a retry still stores nothing.
        conn.call(keyed("q", "k1", b"late"), b"STORED 2 duplicate\r\n")
        assert drain(conn, "q") == []


def test_keys_survive_sigkill_and_restart(data_dir: Path) -> None:
    with ServerProcess(data_dir) as srv:
        conn = Raw(srv.connect())
        for i in range(20):
            conn.call(keyed("q", f"key.{i}", b"%d" % i), b"STORED %d\r\n" % (i + 1))
        conn.call(b"get q\r\n", b"VALUE q 0 1\r\n0\r\nEND\r\n")
        srv.kill()
        srv.start()
        conn = Raw(srv.connect())
        for i in range(20):
            conn.call(keyed("q", f"key.{i}", b"x"), b"STORED %d duplicate\r\n" % (i + 1))
        conn.call(keyed("q", "new", b"n"), b"STORED 21\r\n")
        assert drain(conn, "q") == [b"%d" % i for i in range(1, 20)] + [b"n"]
        srv.kill()
        srv.start()
        conn = Raw(srv.connect())
        conn.call(keyed("q", "key.0", b"x"), b"STORED 1 duplicate\r\n")
        conn.call(keyed("q", "new", b"x"), b"STORED 21 duplicate\r\n")


def test_bad_keys_store_nothing(data_dir: Path) -> None:
    with ServerProcess(data_dir) as srv:
        conn = Raw(srv.connect())
        for bad in ("", "a b" * 0 + "é", "k" * 201, "a\x01b"):
            raw = bad.encode("utf-8")
            conn.send(b"set q 0 0 1 key=%s\r\nx\r\n" % raw)
            line = conn.read_line()
            assert line.startswith(b"CLIENT_ERROR "), line
            assert KEY_RULE.encode() in line
        conn.call(
            keyed("q", "k", b"x", b" extra"),
            b"CLIENT_ERROR usage: set <queue> <flags> <exptime> <bytes> key=<key> [noreply]\r\n",
        )
        assert drain(conn, "q") == []


def test_client_put_and_put_many_with_keys_over_two_servers(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "a") as a, ServerProcess(tmp_path / "b") as b:
        servers = [a.address, b.address]
        with Client(servers) as client:
            assert client.put("q", b"plain") is None
            first = client.put("q", b"one", key="job-1")
            assert first is not None
            assert first.server == client.server_for_key("job-1")
            assert not first.duplicate
            again = client.put("q", b"one again", key="job-1")
            assert again == Stored(first.item_id, True, first.server)
            keys = [f"row.{i}" for i in range(200)]
            items = [b"%d" % i for i in range(200)]
            assert client.put_many("q", items, keys=keys) == 200
            assert {client.server_for_key(k) for k in keys} == set(servers)
            assert client.put_many("q", items, keys=keys) == 200  # all duplicates
            with pytest.raises(ValueError, match="one key per item"):
                client.put_many("q", items, keys=keys[:3])
            with pytest.raises(BadRequest, match="key"):
                client.put("q", b"x", key="a b")
        got: list[bytes] = []
        for srv in (a, b):
            got += drain(Raw(srv.connect()), "q")
        assert sorted(got) == sorted([b"plain", b"one", *items])


def test_async_client_keys(tmp_path: Path) -> None:
    async def main(servers: list[str]) -> None:
        async with AsyncClient(servers) as client:
            stored = await client.put("q", b"x", key="k")
            assert stored is not None
            assert stored.server == client.server_for_key("k")
            dup = await client.put("q", b"y", key="k")
            assert dup == Stored(stored.item_id, True, stored.server)
            keys = [f"r{i}" for i in range(50)]
            assert await client.put_many("q", [b"i"] * 50, keys=keys) == 50
            assert await client.put_many("q", [b"i"] * 50, keys=keys) == 50

    with ServerProcess(tmp_path / "a") as a, ServerProcess(tmp_path / "b") as b:
        asyncio.run(main([a.address, b.address]))
        total = sum(len(drain(Raw(srv.connect()), "q")) for srv in (a, b))
        assert total == 51


def test_client_against_a_server_with_the_queue_full(data_dir: Path) -> None:
    config = "[queues.q]\nmax_items = 1\n"
    with ServerProcess(data_dir, config) as srv, Client([srv.address]) as client:
        assert client.put("q", b"a", key="k1") == Stored(1, False, srv.address)
        with pytest.raises(NotStored):
            client.put("q", b"b", key="k2")
        assert client.put("q", b"a", key="k1") == Stored(1, True, srv.address)


def test_text_and_thrift_front_ends(data_dir: Path) -> None:
    idl = thriftpy2.load(IDL_PATH, module_name="dedup_kestrel_thrift")
    args = ("--text-port", "0", "--thrift-port", "0")
    with ServerProcess(data_dir, extra_args=args) as srv:
        text = text_connection(srv.ports["text"])
        text.call(b"put q key=t1:\nfirst\n\n", b":1")
        text.call(b"put q 60000 key=t1:\nsecond\n\n", b":1 duplicate")
        text.call(b"put q key=t2:\na\nb\n\n", b"-A put with a key carries exactly one item.")
        text.call(b"put q key=t2\n", b"-A put with a key carries exactly one item.")
        text.call(b"put q key=a#b:\nx\n\n", f"-bad key 'a#b': {KEY_RULE}".encode())
        text.call(b"put q:\nplain\n\n", b"+1")
        kc = thrift_client(idl, srv.ports["thrift"])
        got = kc.put_keyed("q", b"third", "t1", 0)
        assert (got.item_id, got.duplicate) == (1, True)
        got = kc.put_keyed("q", b"fourth", "t3", 0)
        assert (got.item_id, got.duplicate) == (3, False)
        with pytest.raises(TApplicationException, match="empty key"):
            kc.put_keyed("q", b"x", "", 0)
        conn = Raw(srv.connect())
        conn.call(keyed("q", "t3", b"x"), b"STORED 3 duplicate\r\n")
        assert drain(conn, "q") == [b"first", b"plain", b"fourth"]


def test_keys_survive_compaction_and_rotation(data_dir: Path) -> None:
    # Small journal files: the puts rotate and the drained queue compacts many times over.
    config = '[queues]\nmax_journal_size = "4KB"\nmax_memory_size = "8KB"\n'
    with ServerProcess(data_dir, config) as srv:
        conn = Raw(srv.connect())
        body = b"x" * 200
        for i in range(200):
            conn.call(keyed("q", f"k{i}", body), b"STORED %d\r\n" % (i + 1))
        assert len(drain(conn, "q")) == 200
        i = 200
        deadline = time.monotonic() + 60
        # Writes after the drain: the empty queue compacts (on a worker thread) once its
        # journal is over 4 KB; go on until a compaction finished (not a timing assertion).
        while i < 260 or not int(stats(conn)["queue_q_journal_rewrites"]):
            conn.call(keyed("q", f"k{i}", body), b"STORED %d\r\n" % (i + 1))
            conn.call(b"get q\r\n", b"VALUE q 0 200\r\n" + body + b"\r\nEND\r\n")
            i += 1
            assert time.monotonic() < deadline
        assert int(stats(conn)["queue_q_dedup_keys"]) == i
        last = i - 1
        srv.kill()
        srv.start()
        conn = Raw(srv.connect())
        for k in (0, 57, 199, 200, last):
            conn.call(keyed("q", f"k{k}", b"y"), b"STORED %d duplicate\r\n" % (k + 1))
        assert drain(conn, "q") == []
        info = stats(conn)
        assert int(info["queue_q_dedup_duplicates"]) == 5


def test_keys_are_forgotten_after_the_window(data_dir: Path) -> None:
    config = "[queues]\ndedup_window_ms = 300\n"
    with ServerProcess(data_dir, config) as srv:
        conn = Raw(srv.connect())
        conn.call(keyed("q", "k", b"a"), b"STORED 1\r\n")
        deadline = time.monotonic() + 30
        while True:  # not a timing assertion: the key goes once 300 ms have passed
            conn.send(keyed("q", "k", b"b"))
            line = conn.read_line()
            if line == b"STORED 2\r\n":
                break
            assert line == b"STORED 1 duplicate\r\n"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        srv.kill()
        srv.start()  # replay drops the keys older than the window
        conn = Raw(srv.connect())
        time.sleep(0.35)
        conn.call(keyed("q", "k", b"c"), b"STORED 3\r\n")
        assert drain(conn, "q") == [b"a", b"b", b"c"]


def test_max_dedup_keys_full_refuses_and_stores_nothing(data_dir: Path) -> None:
    config = "[queues.q]\nmax_dedup_keys = 3\n"
    with ServerProcess(data_dir, config) as srv:
        conn = Raw(srv.connect())
        for i in range(3):
            conn.call(keyed("q", f"k{i}", b"x"), b"STORED %d\r\n" % (i + 1))
        conn.send(keyed("q", "k3", b"x"))
        line = conn.read_line()
        assert line.startswith(b"SERVER_ERROR queue q holds max_dedup_keys=3 dedup keys")
        conn.call(keyed("q", "k1", b"x"), b"STORED 2 duplicate\r\n")  # known keys still answer
        conn.call(set_cmd("q", b"plain"), b"STORED\r\n")  # puts without a key go on
        assert drain(conn, "q") == [b"x", b"x", b"x", b"plain"]


def test_cli_put_with_keys(data_dir: Path) -> None:
    with ServerProcess(data_dir) as srv:

        def tercel(*args: str) -> subprocess.CompletedProcess[bytes]:
            cmd = [sys.executable, "-m", "tercel", "put", "--server", srv.address, *args]
            return subprocess.run(cmd, capture_output=True, timeout=60, check=False)

        done = tercel("q", "a", "b", "--key", "k1", "--key", "k2")
        assert (done.returncode, done.stdout) == (0, b"1\n2\n")
        done = tercel("q", "again", "--key", "k2")
        assert (done.returncode, done.stdout) == (0, b"2 duplicate\n")
        done = tercel("q", "a", "b", "--key", "k3")
        assert done.returncode == exit_codes.USAGE
        assert b"one key per item" in done.stderr
        done = tercel("q", "a", "--key", "a b")
        assert done.returncode == exit_codes.USAGE
        assert KEY_RULE.encode() in done.stderr
        assert drain(Raw(srv.connect()), "q") == [b"a", b"b"]


def test_fanout_children_get_the_item_and_aliases_refuse_keys(data_dir: Path) -> None:
    config = '[aliases]\nboth = ["a", "b"]\n'
    with ServerProcess(data_dir, config) as srv:
        conn = Raw(srv.connect())
        conn.call(set_cmd("p+c", b"first"), b"STORED\r\n")  # registers the child
        conn.call(keyed("p", "k", b"x"), b"STORED 1\r\n")
        conn.call(keyed("p", "k", b"x"), b"STORED 1 duplicate\r\n")
        assert drain(conn, "p+c") == [b"first", b"x"]  # the child got it once
        conn.send(keyed("both", "k", b"x"))
        assert conn.read_line().startswith(b"CLIENT_ERROR alias both keeps no dedup keys")
        assert drain(conn, "a") == drain(conn, "b") == []
