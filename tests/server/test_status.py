"""The ``status`` command: what READONLY and QUIESCENT refuse, and the status file surviving
a SIGKILL. Each test has its own server: the status is server-wide."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import Raw
from tercel.testing import ServerProcess

READONLY_WRITE = b"SERVER_ERROR server is READONLY: writes are refused\r\n"
QUIESCENT_WRITE = b"SERVER_ERROR server is QUIESCENT: writes are refused\r\n"
QUIESCENT_READ = b"SERVER_ERROR server is QUIESCENT: reads are refused\r\n"


def set_cmd(q: bytes, data: bytes) -> bytes:
    return b"set %s 0 0 %d\r\n%s\r\n" % (q, len(data), data)


def read_until_end(raw: Raw) -> list[bytes]:
    lines = [raw.read_line()]
    while lines[-1] != b"END\r\n":
        lines.append(raw.read_line())
    return lines


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[ServerProcess]:
    # No background sweep, so nothing changes behind the test's back.
    with ServerProcess(tmp_path / "data", "[server]\nexpiration_timer_frequency = 0\n") as s:
        yield s


def test_status_defaults_to_up_and_any_case_sets_it(srv: ServerProcess) -> None:
    raw = Raw(srv.connect())
    raw.call(b"status\r\n", b"UP\r\n")
    raw.call(b"status readonly\r\n", b"END\r\n")
    raw.call(b"STATUS\r\n", b"READONLY\r\n")
    raw.call(b"status QuIeScEnT\r\n", b"END\r\n")
    raw.call(b"status\r\n", b"QUIESCENT\r\n")
    raw.call(b"status WriteAvoid\r\n", b"END\r\n")
    raw.call(b"status\r\n", b"WRITEAVOID\r\n")
    raw.call(b"status Up\r\n", b"END\r\n")
    raw.call(b"status\r\n", b"UP\r\n")


def test_bad_statuses_are_client_errors_and_keep_the_connection(srv: ServerProcess) -> None:
    raw = Raw(srv.connect())
    raw.call(b"status down\r\n", b"CLIENT_ERROR status DOWN cannot be set\r\n")
    raw.call(b"status sideways\r\n", b"CLIENT_ERROR unknown status 'sideways'\r\n")
    raw.call(b"status\r\n", b"UP\r\n")


def test_readonly_refuses_writes_and_serves_reads(srv: ServerProcess) -> None:
    raw = Raw(srv.connect())
    raw.call(set_cmd(b"q", b"1") + set_cmd(b"q", b"2"), b"STORED\r\n" * 2)
    raw.call(b"status readonly\r\n", b"END\r\n")
    for request in (
        set_cmd(b"q", b"3"),
        b"delete q\r\n",
        b"flush q\r\n",
        b"flush_all\r\n",
        b"flush_expired q\r\n",
        b"flush_all_expired\r\n",
    ):
        raw.call(request, READONLY_WRITE)
    raw.call(b"get q/peek\r\n", b"VALUE q/peek 0 1\r\n1\r\nEND\r\n")
    raw.call(b"get q\r\n", b"VALUE q 0 1\r\n1\r\nEND\r\n")
    raw.call(b"get q/open\r\n", b"VALUE q/open 0 1\r\n2\r\nEND\r\n")
    raw.call(b"get q/close\r\n", b"END\r\n")
    raw.call(b"get q\r\n", b"END\r\n")
    raw.call(b"status up\r\n", b"END\r\n")
    raw.call(set_cmd(b"q", b"3"), b"STORED\r\n")


def test_quiescent_refuses_reads_but_earlier_open_reads_can_end(srv: ServerProcess) -> None:
    raw = Raw(srv.connect())
    raw.call(b"".join(set_cmd(b"q", b"%d" % i) for i in range(3)), b"STORED\r\n" * 3)
    raw.call(b"get q/open\r\n", b"VALUE q/open 0 1\r\n0\r\nEND\r\n")
    other = Raw(srv.connect())
    other.call(b"get q/open\r\n", b"VALUE q/open 0 1\r\n1\r\nEND\r\n")
    admin = Raw(srv.connect())
    admin.call(b"status quiescent\r\n", b"END\r\n")
    raw.call(set_cmd(b"q", b"x"), QUIESCENT_WRITE)
    raw.call(b"get q\r\n", QUIESCENT_READ)
    raw.call(b"get q/peek\r\n", QUIESCENT_READ)
    raw.call(b"get q/t=1000\r\n", QUIESCENT_READ)
    # close confirms the earlier read; the open half of close/open is then refused.
    raw.call(b"get q/close/open\r\n", QUIESCENT_READ)
    other.call(b"get q/abort\r\n", b"END\r\n")
    raw.send(b"stats\r\n")
    lines = read_until_end(raw)  # stats is always answered
    assert b"STAT queue_q_open_transactions 0\r\n" in lines
    assert b"STAT curr_items 2\r\n" in lines
    admin.call(b"status up\r\n", b"END\r\n")
    # Item 0 was confirmed, item 1 went back to the head.
    raw.call(b"get q\r\n", b"VALUE q 0 1\r\n1\r\nEND\r\n")
    raw.call(b"get q\r\n", b"VALUE q 0 1\r\n2\r\nEND\r\n")
    raw.call(b"get q\r\n", b"END\r\n")


def test_status_survives_sigkill_and_is_never_a_queue(srv: ServerProcess) -> None:
    raw = Raw(srv.connect())
    raw.call(set_cmd(b"q", b"1"), b"STORED\r\n")
    raw.call(b"status readonly\r\n", b"END\r\n")
    status_file = srv.data_dir / ".status"
    assert status_file.read_bytes() == b"ReadOnly\n"
    assert not os.path.exists(f"{status_file}.tmp")
    raw.close()
    srv.kill()
    srv.start()
    raw = Raw(srv.connect())
    raw.call(b"status\r\n", b"READONLY\r\n")
    raw.call(set_cmd(b"q", b"2"), READONLY_WRITE)
    raw.send(b"dump_stats\r\n")
    lines = read_until_end(raw)
    assert [ln for ln in lines if ln.startswith(b"queue")] == [b"queue 'q' {\r\n"]
    assert b"  items=1\r\n" in lines
    raw.call(b"status quiescent\r\n", b"END\r\n")
    raw.close()
    srv.restart()
    raw = Raw(srv.connect())
    raw.call(b"status\r\n", b"QUIESCENT\r\n")
    raw.call(b"status up\r\n", b"END\r\n")
    assert status_file.read_bytes() == b"Up\n"


def test_an_unreadable_status_file_starts_up(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / ".status").write_text("Sideways\n")
    with ServerProcess(data, log_level="warning") as srv:
        raw = Raw(srv.connect())
        raw.call(b"status\r\n", b"UP\r\n")
        assert "unknown status 'Sideways'" in srv.log()
