"""Defects an outside campaign found against a real server (issue 33), one test each."""

from __future__ import annotations

import socket
from pathlib import Path

import support
from tercel.testing import BeanstalkdProcess


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
