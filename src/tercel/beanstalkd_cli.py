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
Once serving it prints one line on stderr: where it listens and a first command to try
(:func:`ready_line`); beanstalkd prints none, and nothing else is printed without ``-V``.

Then it runs ``tercel serve``'s lifecycle (:func:`tercel.server.app.run_server`) on one row, the
beanstalkd front end with these flags as its settings, without the data dir's Kestrel queues.
Exit codes (``tercel.exit_codes``): 0, 5 for bad flags and 10 when another server holds the
``-b`` directory (beanstalkd's), 3 for a job log that cannot be replayed, 1 when it cannot
listen.
"""

from __future__ import annotations

import os
import socket
import sys

from tercel import exit_codes
from tercel.listening import bind_tcp

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: see tercel.exit_codes
if TYPE_CHECKING:
    from tercel.server.app import Server

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
        return exit_codes.BEANSTALKD_USAGE
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


def ready_line(addr: str, port: int) -> str:
    """The line printed once serving on ``addr`` (``-l``) and the bound ``port``: the address
    and a first command to try with netcat (a wildcard address is tried on loopback)."""
    if addr.startswith("unix:"):
        return f"ready: beanstalk {addr}; try: {_TRY} | nc -NU {addr[5:]}"
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(addr, addr)
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"ready: beanstalk {where}; try: {_TRY} | nc -N {host} {port}"


_TRY = r"printf 'put 0 0 60 5\r\nhello\r\nreserve\r\n'"


def main(argv: list[str]) -> int:
    """Run ``tercel beanstalkd`` with ``argv`` (the arguments after ``beanstalkd``)."""
    parsed = parse(argv)
    if isinstance(parsed, int):
        return parsed
    try:
        sock = bind(parsed)
    except OSError as exc:
        sys.stderr.write(f"tercel beanstalkd: cannot listen on {parsed.addr}: {exc}\n")
        return exit_codes.FAILED
    return run(parsed, sock)


def run(opts: Options, sock: socket.socket) -> int:
    """Serve on ``sock`` until SIGTERM/SIGINT (SIGUSR1 turns drain mode on); the exit code."""
    import asyncio
    import functools
    import logging
    import signal

    from tercel.config import ServerConfig
    from tercel.errors import JournalCorrupt
    from tercel.server.app import run_server
    from tercel.server.beanstalk.frontend import BeanstalkFrontEnd, Settings, start
    from tercel.server.frontend import FrontEnd
    from tercel.server.loop import new_loop

    logging.basicConfig(
        level=logging.DEBUG if opts.verbose > 1 else logging.INFO if opts.verbose else 30,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    log = logging.getLogger("tercel.beanstalk")
    settings = Settings(
        opts.log_dir,
        sync=opts.sync,
        max_job_size=opts.max_job_size,
        max_file_size=opts.max_file_size,
    )
    # No [server] key: the row listens on the socket bound above only.
    row = FrontEnd("beanstalk", None, lambda: functools.partial(start, settings=settings))

    def drain(server: Server) -> None:
        running = server.running.get("beanstalk")
        if isinstance(running, BeanstalkFrontEnd):
            running.drain()

    # The budget of incomplete requests holds four puts of the largest size -z allows.
    budget = max(ServerConfig().server.max_partial_request_bytes, 4 * (opts.max_job_size + 256))
    config = ServerConfig().with_server(
        memcache_port=None, admin_port=None, max_partial_request_bytes=budget
    )
    serving = run_server(
        config,
        opts.ports_file,
        reload_signal=False,
        sockets={"beanstalk": sock},
        front_ends=(row,),
        queues=False,
        signals={signal.SIGUSR1: drain},
        on_ready=lambda ports: print(ready_line(opts.addr, ports["beanstalk"]), file=sys.stderr),
    )
    try:
        with asyncio.Runner(loop_factory=new_loop) as runner:
            runner.run(serving)
    except BlockingIOError:
        log.error("%s is in use by another server", opts.log_dir)
        return exit_codes.BEANSTALKD_LOCKED
    except JournalCorrupt as exc:
        log.error("job log is corrupt, refusing to start: %s", exc)
        return exit_codes.CORRUPT
    return exit_codes.OK
