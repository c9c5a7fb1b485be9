"""How many commands a durable tercel answers per fsync (group-commit batching), per load cell.

Starts ``tercel-sync`` as the suite does (``bench/servers.py``), runs one load cell
(``bench/loadgen.py``) per ``--ops`` x ``--cells``, and prints one JSON line each: ops/s, the
commands (``cmd_set`` + ``cmd_get``) and group fsyncs (``journal_fsyncs``) counted by the
server's ``stats`` over the cell, their ratio, and the server's CPU µs per operation.

Usage: ``TERCEL_CMD=... .venv/bin/python bench/fsyncs_per_op.py [--ops mixed,enqueue]
[--cells 32x1,1x1]`` (connections x depth).
"""

from __future__ import annotations

import argparse
import json
import socket
import tempfile
from pathlib import Path

import loadgen
import servers


def server_stats(port: int) -> dict[str, str]:
    """memcache ``stats`` of the server on ``port``."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"stats\r\n")
        buf = b""
        while not buf.endswith(b"END\r\n"):
            buf += s.recv(65536)
    return {
        parts[1].decode(): parts[2].decode()
        for line in buf.splitlines()
        if (parts := line.split()) and parts[0] == b"STAT"
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", default="mixed,enqueue")
    ap.add_argument("--cells", default="32x1,1x1", help="connections x depth, comma-separated")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--server-cpu", type=int, default=1)
    ap.add_argument("--client-cpu", type=int, default=0)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tercel-fsyncs-", dir=".")).resolve()
    for op in a.ops.split(","):
        for cell in a.cells.split(","):
            conns, depth = (int(x) for x in cell.split("x"))
            srv = servers.start(servers.SERVERS["tercel-sync"], work, a.server_cpu)
            try:
                before = server_stats(srv.port)
                spec = loadgen.LoadSpec(
                    proto="mc",
                    port=srv.port,
                    op=op,
                    size=a.size,
                    conns=conns,
                    depth=depth,
                    duration=a.duration,
                    cpu=a.client_cpu,
                )
                res = loadgen.run_load(spec, srv.pid)
                after = server_stats(srv.port)
            finally:
                srv.cleanup()

            grew = {k: int(after[k]) - int(before[k]) for k in ("cmd_set", "cmd_get")}
            cmds = grew["cmd_set"] + grew["cmd_get"]
            fsyncs = int(after["journal_fsyncs"]) - int(before["journal_fsyncs"])
            cpu = 1e6 * (res.server_cpu_s or 0.0) / max(1, res.ops)
            row = {
                "op": op,
                "conns": conns,
                "depth": depth,
                "ops_per_s": round(res.ops_per_s),
                "commands": cmds,
                "fsyncs": fsyncs,
                "commands_per_fsync": round(cmds / max(1, fsyncs), 2),
                "server_cpu_us_per_op": round(cpu, 1),
            }
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
