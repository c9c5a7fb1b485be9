"""One data-dir lock honoured by every way of opening a data dir (issue 21 item 2).

A running server, an in-process ``tercel.PersistentQueue`` and ``tercel journal compact`` must
never write one journal at the same time: whichever opens the directory second is refused, and
the first one's acknowledged items are all still there afterwards.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import tercel
from support import Raw, set_cmd
from tercel.errors import ConfigError
from tercel.testing import ServerProcess, ServerStartError


def compact(data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tercel", "journal", "compact", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_server_then_embedded_queue_is_refused(data_dir: Path) -> None:
    with ServerProcess(data_dir) as srv:
        conn = Raw(srv.connect())
        conn.call(set_cmd("q", b"acked"), b"STORED\r\n")
        with pytest.raises(ConfigError, match="in use"):
            tercel.PersistentQueue(data_dir, "q")
        with pytest.raises(ConfigError, match="in use"):
            tercel.PersistentQueue(data_dir, "other")  # any queue of the directory
        conn.call(b"get q\r\n", b"VALUE q 0 5\r\nacked\r\nEND\r\n")


def test_embedded_queue_then_server_is_refused(data_dir: Path) -> None:
    with tercel.PersistentQueue(data_dir, "q") as q:
        assert q.add(b"acked")
        srv = ServerProcess(data_dir)
        with pytest.raises(ServerStartError, match="in use"):
            srv.start()
        assert q.remove().data == b"acked"  # type: ignore[union-attr]


def test_embedded_queues_of_one_process_share_the_directory(data_dir: Path) -> None:
    with tercel.PersistentQueue(data_dir, "a") as a, tercel.PersistentQueue(data_dir, "b") as b:
        assert a.add(b"1") and b.add(b"2")
        with pytest.raises(ConfigError):
            tercel.PersistentQueue(data_dir, "a")  # but not one queue twice
    with ServerProcess(data_dir) as srv:  # released with the last of them
        conn = Raw(srv.connect())
        conn.call(b"get a\r\nget b\r\n", b"VALUE a 0 1\r\n1\r\nEND\r\nVALUE b 0 1\r\n2\r\nEND\r\n")


def test_server_then_journal_compact_is_refused(data_dir: Path) -> None:
    with ServerProcess(data_dir) as srv:
        conn = Raw(srv.connect())
        conn.call(set_cmd("q", b"acked"), b"STORED\r\n")
        out = compact(data_dir)
        assert out.returncode == 2 and "in use" in out.stderr, out
        conn.call(b"get q\r\n", b"VALUE q 0 5\r\nacked\r\nEND\r\n")


def test_embedded_queue_then_journal_compact_is_refused(data_dir: Path) -> None:
    with tercel.PersistentQueue(data_dir, "q") as q:
        assert q.add(b"acked")
        out = compact(data_dir)
        assert out.returncode == 2 and "in use" in out.stderr, out
        assert q.remove().data == b"acked"  # type: ignore[union-attr]
    out = compact(data_dir)  # free again
    assert out.returncode == 0, out
