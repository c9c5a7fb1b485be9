"""Hostile input: the server answers, stays up, and never writes outside its data dir."""

from __future__ import annotations

import os
import random
from pathlib import Path

from support import Raw
from tercel.testing import ServerProcess


def test_junk_never_kills_the_server(data_dir: Path) -> None:
    rng = random.Random(1234)
    with ServerProcess(data_dir) as srv:
        for _ in range(60):
            conn = Raw(srv.connect())
            junk = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 3000)))
            try:
                conn.send(junk + b"\r\nversion\r\n")
                conn.sock.shutdown(1)
                while conn.sock.recv(65536):
                    pass
            except (ConnectionResetError, BrokenPipeError):
                pass
            conn.close()
        assert srv.running
        conn = Raw(srv.connect())
        conn.call(b"set ok 0 0 2\r\nok\r\nget ok\r\n", b"STORED\r\nVALUE ok 0 2\r\nok\r\nEND\r\n")
        # Nothing but valid queue journals and the lock file exist in the data dir.
        for name in os.listdir(data_dir):
            assert (
                name == ".lock" or name.replace("_", "").replace("-", "").isalnum() or name == "ok"
            )


def test_names_that_try_to_escape(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with ServerProcess(data_dir) as srv:
        conn = Raw(srv.connect())
        for name in [b"../x", b"..", b".", b"/etc/passwd", b"a/../../b", b"~x", b"a.1", b"x" * 201]:
            conn.send(b"set %s 0 0 1\r\nx\r\n" % name)
            assert conn.read_line() == b"CLIENT_ERROR bad queue name\r\n", name
        conn.send(b"get ..\r\n")
        assert conn.read_line() == b"CLIENT_ERROR bad queue name\r\n"
        conn.call(b"version\r\n", b"VERSION ")
    assert sorted(os.listdir(tmp_path)) == ["data"]
    assert os.listdir(data_dir) == [".lock"]


def test_huge_declared_size_is_refused_before_buffering(server: ServerProcess) -> None:
    conn = Raw(server.connect())
    conn.call(b"set q 0 0 1073741824\r\n", b"CLIENT_ERROR object too large for cache\r\n")
    assert conn.closed()


def test_stray_files_in_data_dir_are_not_queues(data_dir: Path) -> None:
    data_dir.mkdir(parents=True)
    (data_dir / "notes.txt").write_text("hello")
    (data_dir / "q~~123").write_bytes(b"temp")
    with ServerProcess(data_dir) as srv:
        conn = Raw(srv.connect())
        conn.send(b"stats\r\n")
        lines = []
        while not lines or lines[-1] != b"END\r\n":
            lines.append(conn.read_line())
        assert not any(b"queue_notes" in line for line in lines)
        assert b"STAT queue_creates 0\r\n" in lines


def test_any_exptime_that_parses_is_clamped_and_survives_a_restart(data_dir: Path) -> None:
    """An exptime whose expiry in ms overflows the journal's 64-bit field used to raise
    struct.error while the ADD was packed: no reply, the connection (and the commands
    pipelined behind) gone. Now a far expiry means "never" and a far past one "expired"."""
    with ServerProcess(data_dir) as srv:
        conn = Raw(srv.connect())
        conn.call(
            b"set q 0 9223372036854776 4\r\nfar1\r\n"
            b"set q 0 -999999999999999999 4\r\npast\r\n"
            b"set q 0 999999999999999999 4\r\nfar2\r\n"
            b"set q 0 -9223372036854776 4\r\npast\r\n"
            b"get q/peek\r\n",
            b"STORED\r\n" * 4 + b"VALUE q/peek 0 4\r\nfar1\r\nEND\r\n",
        )
        srv.kill()
        srv.start()
        conn = Raw(srv.connect())
        for item in (b"far1", b"far2"):  # the expired ones are dropped on the way
            conn.call(b"get q\r\n", b"VALUE q 0 4\r\n%s\r\nEND\r\n" % item)
        conn.call(b"get q\r\n", b"END\r\n")
