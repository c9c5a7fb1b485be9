"""The start-up window (issue 21 item 4): a SIGTERM or SIGHUP sent as soon as the server says it
listens is a clean stop or a reload, never a kill by the signal.

The server is started by hand (not through ``ServerProcess``) so that the signal can be sent the
moment the log says ``memcache listening``, before the ports file would be written.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

LISTENING = re.compile(rb"memcache listening on [\d.]+:(\d+)")


@pytest.fixture
def started(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, list[bytes]]]:
    """A server whose log was read up to its ``memcache listening`` line (and its port)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tercel",
            "serve",
            "--data-dir",
            str(tmp_path / "data"),
            "--memcache-port",
            "0",
            "--admin-port",
            "0",
            "--log-level",
            "info",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    lines: list[bytes] = []
    port = 0
    for line in proc.stderr:
        lines.append(line)
        match = LISTENING.search(line)
        if match:
            port = int(match.group(1))
            break
    assert port, b"".join(lines)
    try:
        yield proc, port, lines
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        proc.stderr.close()


def _rest_of_log(proc: subprocess.Popen[bytes], lines: list[bytes]) -> bytes:
    assert proc.stderr is not None
    return b"".join(lines) + proc.stderr.read()


def test_sigterm_right_after_listening_stops_cleanly(
    started: tuple[subprocess.Popen[bytes], int, list[bytes]],
) -> None:
    proc, _port, lines = started
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(30)
    log = _rest_of_log(proc, lines)
    assert code == 0, log
    assert b"shutting down" in log
    assert b"Traceback" not in log


def test_sighup_right_after_listening_reloads_and_keeps_serving(
    started: tuple[subprocess.Popen[bytes], int, list[bytes]],
) -> None:
    proc, port, lines = started
    proc.send_signal(signal.SIGHUP)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"version\r\n")
        assert sock.recv(100).startswith(b"VERSION ")
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(30)
    assert code == 0, _rest_of_log(proc, lines)


def test_a_front_end_that_cannot_be_imported_stops_the_start_before_listening(
    tmp_path: Path,
) -> None:
    """Issue 21 item 4: thriftpy2 missing (an import of the Thrift front end that fails) is a
    failed start, not a server that listens and then fails at its first Thrift connection."""
    flags = ("--memcache-port", "0", "--thrift-port", "0", "--log-level", "info")
    script = (
        "import sys, runpy; sys.modules['thriftpy2'] = None; "
        "sys.argv[0] = 'tercel'; runpy.run_module('tercel', run_name='__main__')"
    )
    with subprocess.Popen(
        [sys.executable, "-c", script, "serve", "--data-dir", str(tmp_path / "data"), *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    ) as server:
        assert server.stderr is not None
        log = b""
        for line in server.stderr:
            log += line
            if b"listening" in line:  # before the fix: it listens, and stays up
                server.kill()
                break
        code = server.wait(30)
    assert b"listening" not in log, log
    assert code == 1, log
    assert b"thriftpy2" in log, log
