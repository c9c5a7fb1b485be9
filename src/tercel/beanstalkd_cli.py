"""``tercel beanstalkd``: a drop-in for the ``beanstalkd`` binary, with its flags and defaults.

    tercel beanstalkd [-l ADDR] [-p PORT] [-b DIR] [-f MS] [-F] [-z BYTES] [-s BYTES] [-V] [-v] [-h]

Flags as beanstalkd 1.12's (port 11300, ``-z 65535``, ``-f 50``, ``-s 10485760``), except that
the default listen address is 127.0.0.1 (beanstalkd's is 0.0.0.0). ``-l unix:/path`` listens on
a Unix socket. Without ``-b`` jobs live in memory only and nothing is written anywhere; with
``-b DIR`` every state change is journaled in DIR (``docs/journal_format.md`` §17).
``-f MS`` fsyncs at most every MS ms, ``-f0`` before every reply (grouped), ``-F`` never.
SIGTERM and SIGINT stop cleanly; SIGUSR1 turns drain mode on.

Start-up order: the flags are parsed and the socket bound and listening with nothing but
``os``, ``sys`` and ``socket`` imported, so client test suites that connect right after
starting the binary find the port accepting; asyncio, the store and any replay come after.
``--ports-file PATH`` (tercel's own, for tests) writes ``{"beanstalk": port}`` once serving.
"""

from __future__ import annotations

import os
import socket
import sys

from tercel.listening import bind_tcp

USAGE = """Use: tercel beanstalkd [OPTIONS]

Options:
 -b DIR   write-ahead log directory
 -f MS    fsync at most once every MS milliseconds (use -f0 for "always fsync")
 -F       never fsync
 -l ADDR  listen on address (default is 127.0.0.1; unix:/path for a Unix socket)
 -p PORT  listen on port (default is 11300)
 -s BYTES set the size of each write-ahead log file (default is 10485760)
 -z BYTES set the maximum job size in bytes (default is 65535; max allowed is 1073741824)
 -V       increase verbosity
 -v       show version information
 -h       show this help
"""

MAX_JOB_SIZE_CAP = 1_073_741_824
EXIT_USAGE = 5
EXIT_LOCKED = 10


class Options:
    """The parsed flags."""

    def __init__(self) -> None:
        self.addr = "127.0.0.1"
        self.port = 11300
        self.log_dir: str | None = None
        self.sync: int | None = 50
        self.max_job_size = 65535
        self.max_file_size = 10_485_760
        self.verbose = 0
        self.ports_file: str | None = None


def _int(flag: str, value: str, lo: int, hi: int) -> int:
    if not value.isdigit() or not lo <= int(value) <= hi:
        raise ValueError(f"{flag}: bad value {value!r}")
    return int(value)


def parse(argv: list[str]) -> Options | int:
    """The options, or an exit code after printing help, the version or an error."""
    opts = Options()
    i = 0
    with_value = {"-l", "-p", "-b", "-f", "-z", "-s", "--ports-file"}
    try:
        while i < len(argv):
            arg = argv[i]
            flag, value = arg, ""
            if arg.startswith("--"):
                flag, _, value = arg.partition("=")
            elif len(arg) > 2:
                flag, value = arg[:2], arg[2:]
            if flag in with_value and not value:
                i += 1
                if i == len(argv):
                    raise ValueError(f"{flag} requires an argument")
                value = argv[i]
            if flag == "-h":
                sys.stdout.write(USAGE)
                return 0
            if flag == "-v":
                from tercel import __version__

                sys.stdout.write(f"beanstalkd 1.12 (tercel {__version__})\n")
                return 0
            if flag == "-V":
                opts.verbose += 1 + value.count("V")
            elif flag == "-F":
                opts.sync = None
            elif flag == "-l":
                opts.addr = value
            elif flag == "-p":
                opts.port = _int(flag, value, 0, 65535)
            elif flag == "-b":
                opts.log_dir = value
            elif flag == "-f":
                opts.sync = _int(flag, value, 0, 2**31 - 1)
            elif flag == "-z":
                opts.max_job_size = _int(flag, value, 0, MAX_JOB_SIZE_CAP)
            elif flag == "-s":
                opts.max_file_size = _int(flag, value, 4096, 2**40)
            elif flag == "--ports-file":
                opts.ports_file = value
            else:
                raise ValueError(f"unknown flag: {arg}")
            i += 1
    except ValueError as exc:
        sys.stderr.write(f"tercel beanstalkd: {exc}\n{USAGE}")
        return EXIT_USAGE
    return opts


def bind(opts: Options) -> socket.socket:
    """The listening socket: TCP on ``-l``/``-p``, or a Unix socket for ``-l unix:/path``."""
    if opts.addr.startswith("unix:"):
        path = opts.addr[5:]
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if os.path.exists(path):
                os.unlink(path)  # a stale socket of an earlier run (beanstalkd does the same)
            sock.bind(path)
            sock.listen(1024)
        except OSError:
            sock.close()
            raise
        return sock
    return bind_tcp(opts.addr, opts.port)


def main(argv: list[str]) -> int:
    """Run ``tercel beanstalkd`` with ``argv`` (the arguments after ``beanstalkd``)."""
    parsed = parse(argv)
    if isinstance(parsed, int):
        return parsed
    try:
        sock = bind(parsed)
    except OSError as exc:
        sys.stderr.write(f"tercel beanstalkd: cannot listen on {parsed.addr}: {exc}\n")
        return 1
    from tercel.server.beanstalk.standalone import run

    return run(parsed, sock)
