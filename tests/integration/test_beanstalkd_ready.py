"""``tercel beanstalkd`` prints one ready line on stderr once serving: where it listens and a
first command to try (``beanstalkd_cli.ready_line``)."""

from __future__ import annotations

import socket
import subprocess

import support
from tercel.beanstalkd_cli import ready_line
from tercel.testing import BeanstalkdProcess


def test_the_ready_line_names_the_address_and_a_first_command() -> None:
    try_it = r"try: printf 'put 0 0 60 5\r\nhello\r\nreserve\r\n' | nc -N"
    assert (
        ready_line("127.0.0.1", 11300)
        == f"ready: beanstalk 127.0.0.1:11300; {try_it} 127.0.0.1 11300"
    )
    assert ready_line("0.0.0.0", 5).endswith("nc -N 127.0.0.1 5")
    assert ready_line("::", 5).startswith("ready: beanstalk [::1]:5;")
    assert ready_line("unix:/run/b.sock", 0) == (
        r"ready: beanstalk unix:/run/b.sock; try: printf 'put 0 0 60 5\r\nhello\r\nreserve\r\n'"
        " | nc -NU /run/b.sock"
    )


def test_tercel_beanstalkd_prints_the_ready_line_and_its_command_works() -> None:
    with BeanstalkdProcess(None) as bsd:
        lines = [line for line in bsd.log().splitlines() if line.startswith("ready: ")]
        assert lines == [ready_line("127.0.0.1", bsd.port)]
        # The command it suggests, with the printf run by a shell and the socket in Python
        # (netcat need not be installed here): the job goes in and comes back.
        printf = lines[0].split("try: ", 1)[1].split(" | ")[0]
        request = subprocess.run(["sh", "-c", printf], capture_output=True, check=True).stdout
        c = support.Raw(socket.create_connection(("127.0.0.1", bsd.port), timeout=10))
        c.call(request, b"INSERTED 1\r\nRESERVED 1 5\r\nhello\r\n")
