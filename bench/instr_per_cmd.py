"""Instructions per memcache command through the in-process server, counted by callgrind.

Wall time on a shared VM swings by tens of percent; instruction counts do not, so this is how
the hot path's changes are measured (docs/benchmarks.md, "Instructions per command"). One
``MemcacheConnection`` of a real :class:`~tercel.server.app.Server` (journal on, no sockets:
a transport that drops replies) is fed 1 KiB ``set`` or ``get`` commands, 32 per event-loop
pass, ``--per-read`` of them per ``data_received`` (1: one command per read, as at pipeline
depth 1; 16: a pipelined client's read). Each figure is the difference of two run lengths
divided by the extra commands, which cancels start-up and imports; the get figure has the
cost of the sets that filled the queue taken out. With ``--vary`` the sets alternate between a
1024- and a 1023-byte payload, so that no set line repeats the one before it (the codec
recognises a repeated line without parsing it again: this is the cost when it cannot).

    python bench/instr_per_cmd.py --per-read 16     # installs valgrind with apt-get if missing
    python bench/instr_per_cmd.py --per-read 16 --vary

Runs on whatever ``tercel`` imports: the compiled build after ``make native``.

``--protocol beanstalk`` counts the beanstalkd front end against beanstalkd itself, both the
same way: the real server process (``tercel beanstalkd -b DIR -F`` and ``beanstalkd -b DIR
-F``: a job log, no fsync, so no timer runs in proportion to wall time) under callgrind,
driven over loopback by a client outside valgrind that sends ``--per-read`` requests at a time
and waits for their replies: 1 KiB ``put``, and ``reserve-with-timeout 0`` + ``delete`` of a
prefilled tube (the put that filled it taken out). The count is the server's user-space
instructions, the event loop and socket reads and writes included (not the kernel's):

    python bench/instr_per_cmd.py --protocol beanstalk --per-read 1
    python bench/instr_per_cmd.py --protocol beanstalk --per-read 16 --keep /tmp/cg

``--keep DIR`` leaves each run's callgrind file there for ``callgrind_annotate``.

``TERCEL_BENCH_USER=1`` in the environment runs the memcache count on a server with one user
(put and take ``*``) that the connection is logged in as: the cost of the permission checks
after the login (docs/architecture.md, "Users and permissions").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

PASS = 32
PAYLOAD = b"x" * 1024
SET = b"set q 0 0 1024\r\n" + PAYLOAD + b"\r\n"
SET_PAIR = SET + b"set q 0 0 1023\r\n" + PAYLOAD[:-1] + b"\r\n"
"""Two sets whose lines differ (``--vary``)."""
GET = b"get q\r\n"


class _Transport:
    """Just enough of an asyncio transport for the connection: replies are dropped."""

    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, *_: object, **__: object) -> None:
        return None


async def _drive(which: str, passes: int, per_read: int, vary: bool) -> None:
    from tercel.config import ServerConfig
    from tercel.server.app import Server
    from tercel.server.memcache.connection import MemcacheConnection

    data_dir = tempfile.mkdtemp()
    try:
        config = ServerConfig().with_server(data_dir=data_dir, memcache_port=None, admin_port=None)
        user = os.environ.get("TERCEL_BENCH_USER") == "1"
        if user:
            import dataclasses

            from tercel.config import UserConfig
            from tercel.passwords import hash_password

            bench = UserConfig(hash_password("x", 16), put=("*",), take=("*",))
            config = dataclasses.replace(config, users={"bench": bench})
        server = Server(config)
        await server.start()
        conn = MemcacheConnection(server.ctx)
        conn.connection_made(_Transport())  # type: ignore[arg-type]
        if user:
            assert conn.guard is not None and conn.guard.assume("bench")
        # A second, idle connection: the 32 commands of a pass stand for the requests of
        # several connections, which share the pass (a lone connection's pass runs inline
        # at the end of each read's batch: Committer.end_batch).
        MemcacheConnection(server.ctx).connection_made(_Transport())  # type: ignore[arg-type]
        conn.data_received(SET)  # create the queue
        await asyncio.sleep(0)

        async def feed(command: bytes, per_command: int = 1) -> None:
            for _ in range(passes):
                for _ in range(PASS // per_read):
                    conn.data_received(command * (per_read // per_command))
                await asyncio.sleep(0)

        sets = (SET_PAIR, 2) if vary else (SET, 1)
        if which == "get":
            await feed(*sets)  # the items the gets take
        await (feed(*sets) if which == "set" else feed(GET))
        await server.stop()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def _count(which: str, passes: int, per_read: int, vary: bool) -> int:
    """Instructions of one whole run under callgrind."""
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        __file__,
        "--child",
        which,
        str(passes),
        "--per-read",
        str(per_read),
        *(["--vary"] if vary else []),
    ]
    env = dict(os.environ, PYTHONHASHSEED="0")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stderr
    match = re.search(r"Collected : (\d+)", out)
    if match is None:
        raise SystemExit(f"no callgrind total in:\n{out}")
    return int(match.group(1))


# ------------------------------------------------------------------------------- beanstalk

BS_BODY = b"x" * 1024
BS_PUT = b"put 0 0 60 1024\r\n" + BS_BODY + b"\r\n"
BS_RESERVE = b"reserve-with-timeout 0\r\n"
BS_SHORT, BS_LONG = 1024, 4096
"""Requests of the short and the long run (multiples of 16)."""


class _Replies:
    """Reads beanstalkd replies off a socket: one line, plus a body after RESERVED/FOUND."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _more(self) -> None:
        data = self.sock.recv(1 << 20)
        if not data:
            raise SystemExit("instr_per_cmd: the server closed the connection")
        self.buf += data

    def line(self) -> bytes:
        while (eol := self.buf.find(b"\r\n")) < 0:
            self._more()
        line, self.buf = self.buf[:eol], self.buf[eol + 2 :]
        return line

    def reserved(self) -> int:
        """A RESERVED reply; the job id (the body is read and dropped)."""
        line = self.line()
        word, job_id, size = line.split()
        if word != b"RESERVED":
            raise SystemExit(f"instr_per_cmd: expected RESERVED, got {line!r}")
        while len(self.buf) < int(size) + 2:
            self._more()
        self.buf = self.buf[int(size) + 2 :]
        return int(job_id)


def _bs_puts(sock: socket.socket, replies: _Replies, count: int, per_read: int) -> None:
    for _ in range(count // per_read):
        sock.sendall(BS_PUT * per_read)
        for _ in range(per_read):
            if not replies.line().startswith(b"INSERTED "):
                raise SystemExit("instr_per_cmd: a put was not INSERTED")


def _bs_client(port: int, which: str, count: int, per_read: int) -> None:
    """The load: ``count`` puts, or ``count`` puts then ``count`` reserve + delete pairs
    (``per_read`` reserves in one write, then their deletes in one write)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        replies = _Replies(sock)
        _bs_puts(sock, replies, count, per_read)
        if which == "put":
            return
        for _ in range(count // per_read):
            sock.sendall(BS_RESERVE * per_read)
            ids = [replies.reserved() for _ in range(per_read)]
            sock.sendall(b"".join(b"delete %d\r\n" % i for i in ids))
            for _ in range(per_read):
                if replies.line() != b"DELETED":
                    raise SystemExit("instr_per_cmd: a delete was not DELETED")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bs_count(server: str, which: str, count: int, per_read: int, keep: str | None) -> int:
    """Instructions of one whole server run under callgrind (start-up, load, SIGTERM)."""
    work = tempfile.mkdtemp(prefix="instr-bs-")
    try:
        logdir = os.path.join(work, "binlog")
        os.mkdir(logdir)
        out = "/dev/null"
        if keep:
            os.makedirs(keep, exist_ok=True)
            out = os.path.join(keep, f"callgrind.{server}.{which}.{per_read}.{count}")
        ports = os.path.join(work, "ports.json")
        port = _free_port()
        if server == "tercel":
            argv = [sys.executable, "-m", "tercel", "beanstalkd", "-l", "127.0.0.1", "-p", "0"]
            argv += ["-b", logdir, "-F", "--ports-file", ports]
        else:
            argv = ["beanstalkd", "-l", "127.0.0.1", "-p", str(port), "-b", logdir, "-F"]
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *argv]
        env = dict(os.environ, PYTHONHASHSEED="0")
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, env=env, text=True)
        try:
            deadline = time.monotonic() + 300
            while True:  # a benchmark, not a test: poll until the server answers
                if proc.poll() is not None:
                    raise SystemExit(f"instr_per_cmd: {server} exited: {proc.stderr.read()}")  # type: ignore[union-attr]
                try:
                    if server == "tercel":
                        with open(ports) as fh:
                            port = int(json.load(fh)["beanstalk"])
                    socket.create_connection(("127.0.0.1", port)).close()
                    break
                except (OSError, ValueError, KeyError):
                    if time.monotonic() > deadline:
                        raise SystemExit(f"instr_per_cmd: {server} did not start") from None
                    time.sleep(0.2)
            _bs_client(port, which, count, per_read)
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=300)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    match = re.search(r"Collected : (\d+)", err)
    if match is None:
        raise SystemExit(f"no callgrind total in:\n{err}")
    return int(match.group(1))


def _beanstalk(per_read: int, servers: list[str], keep: str | None) -> None:
    extra = BS_LONG - BS_SHORT
    for server in servers:

        def count(which: str, n: int, server: str = server) -> int:
            return _bs_count(server, which, n, per_read, keep)

        per_put = (count("put", BS_LONG) - count("put", BS_SHORT)) // extra
        per_pair = (count("rd", BS_LONG) - count("rd", BS_SHORT)) // extra - per_put
        print(
            f"{server}, {per_read} per read: put {per_put} instr/cmd, "
            f"reserve+delete {per_pair} instr/pair",
            flush=True,
        )


def _ensure_valgrind() -> None:
    """Install Debian's valgrind when it is missing (as bench/run installs the peers)."""
    if shutil.which("valgrind") is not None:
        return
    print("instr_per_cmd: installing valgrind", file=sys.stderr)
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    subprocess.run([*sudo, "apt-get", "update", "-qq"], check=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", "valgrind"], check=True, env=env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-read", type=int, default=1, choices=(1, 2, 4, 8, 16, 32))
    ap.add_argument("--protocol", choices=("memcache", "beanstalk"), default="memcache")
    ap.add_argument(
        "--servers",
        default="tercel,beanstalkd",
        help="beanstalk: which servers to count, comma-separated (tercel, beanstalkd)",
    )
    ap.add_argument("--keep", metavar="DIR", help="beanstalk: keep the callgrind files here")
    ap.add_argument("--vary", action="store_true", help="no set line repeats the one before")
    ap.add_argument("--child", nargs=2, metavar=("OP", "PASSES"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.vary and args.per_read < 2:
        ap.error("--vary feeds sets in pairs: --per-read 2 or more")
    if args.child:
        import uvloop

        uvloop.run(_drive(args.child[0], int(args.child[1]), args.per_read, args.vary))
        return
    _ensure_valgrind()
    if args.protocol == "beanstalk":
        _beanstalk(args.per_read, args.servers.split(","), args.keep)
        return
    short, long = 100, 400
    extra = (long - short) * PASS

    def count(which: str, passes: int) -> int:
        return _count(which, passes, args.per_read, args.vary)

    per_set = (count("set", long) - count("set", short)) // extra
    per_get = (count("get", long) - count("get", short)) // extra - per_set
    vary = ", set lines varied" if args.vary else ""
    print(f"{args.per_read} per read{vary}: set {per_set} instr/cmd, get {per_get} instr/cmd")


if __name__ == "__main__":
    main()
