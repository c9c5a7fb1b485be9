"""Instructions per memcache command through the in-process server, counted by callgrind.

Wall time on a shared VM swings by tens of percent; instruction counts do not, so this is how
the hot path's changes are measured (docs/benchmarks.md, "Profile-driven changes"). One
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
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile

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
        server = Server(config)
        await server.start()
        conn = MemcacheConnection(server.ctx)
        conn.connection_made(_Transport())  # type: ignore[arg-type]
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
