"""Block requests and fsyncs per operation, counted by the kernel, for durable servers.

On this machine (a Firecracker VM) every block request costs the issuing CPU a trap to the
hypervisor (the virtio notify, ``iowrite16`` in ``perf``): with a server pinned to one CPU, a
group fsync's two or three requests take CPU time from serving, whichever thread issues them.
So the number of fsyncs and block requests per operation is a cost of its own, next to CPU per
op. For each server named, in alternation for ``--rounds``: start it pinned to CPU 1 (as the
suite does), run one load cell from CPU 0, and count with ``perf stat -a`` the tracepoints
``block:block_rq_issue`` and the ``fsync`` / ``fdatasync`` / ``io_submit`` system calls over
the load. The counts are machine-wide, so run it on an otherwise idle box.

    python bench/iocount.py --servers tercel-sync,redis-always --op mixed --depth 16

Needs ``perf`` and root (tracepoints); installs ``linux-perf`` with apt-get when missing.
Nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import loadgen
import servers

EVENTS = {
    "block:block_rq_issue": "block requests",
    "syscalls:sys_enter_fdatasync": "fdatasync",
    "syscalls:sys_enter_fsync": "fsync",
    "syscalls:sys_enter_io_submit": "io_submit",
}
SOCKET_EVENTS = {
    f"syscalls:sys_enter_{call}": call
    for call in ("read", "write", "writev", "epoll_wait", "pwritev2", "sched_yield")
}
"""With ``--syscalls``: the calls that serve sockets and the loop (uvloop reads and writes
sockets with read/write/writev; the journal writes with pwritev2)."""


def _perf() -> str:
    perf = shutil.which("perf")
    if perf is None:
        subprocess.run(["apt-get", "install", "-y", "-q", "linux-perf"], check=False)
        perf = shutil.which("perf")
    if perf is None:
        sys.exit("iocount: needs perf (apt-get install linux-perf)")
    return perf


def one(
    perf: str, sdef: servers.ServerDef, spec: loadgen.LoadSpec, work: Path, events: dict[str, str]
) -> dict[str, float]:
    """Run ``spec`` against a fresh ``sdef``; ops/s, CPU µs per op and each event per op."""
    r = servers.start(sdef, work, 1)
    out = work / "perf.txt"
    try:
        names = ",".join(events)
        stat = subprocess.Popen([perf, "stat", "-a", "-x", ",", "-e", names, "-o", str(out)])
        try:
            res = loadgen.run_load(replace(spec, port=r.port), r.pid)
        finally:
            stat.send_signal(2)
            stat.wait()
    finally:
        r.cleanup()
    counts = {}
    for line in out.read_text().splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[2] in events and re.fullmatch(r"\d+", fields[0]):
            counts[events[fields[2]]] = int(fields[0])
    ops = max(res.ops, 1)
    row = {"ops/s": res.ops_per_s, "CPU µs/op": (res.server_cpu_s or 0.0) / ops * 1e6}
    row |= {name: counts.get(name, 0) / ops for name in events.values()}
    syncs = row["fdatasync"] + row["fsync"] + row["io_submit"]
    row["ops per fsync"] = 1 / syncs if syncs else 0.0
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", default="tercel-sync,redis-always")
    ap.add_argument("--op", default="mixed", choices=("enqueue", "mixed"))
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--conns", type=int, default=32)
    ap.add_argument("--depth", type=int, default=16)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--syscalls", action="store_true", help="also count socket and loop calls")
    a = ap.parse_args()
    events = EVENTS | (SOCKET_EVENTS if a.syscalls else {})
    perf = _perf()
    spec = loadgen.LoadSpec(
        proto="mc", port=0, op=a.op, size=a.size, conns=a.conns, depth=a.depth,
        procs=1, warmup=0.3, duration=a.duration, cpu=0,
    )  # fmt: skip
    names = a.servers.split(",")
    print(f"{a.op} {a.size} B, c={a.conns} d={a.depth}; counts per operation")
    header = None
    with tempfile.TemporaryDirectory(prefix="iocount-") as tmp:
        for rnd in range(1, a.rounds + 1):
            for name in names:
                sdef = servers.SERVERS[name]
                work = Path(tmp) / f"{name}-{rnd}"
                row = one(perf, sdef, replace(spec, proto=sdef.proto), work, events)
                if header is None:
                    header = list(row)
                    print("| round | server | " + " | ".join(header) + " |")
                    print("|---" * (len(header) + 2) + "|")
                cells = [f"{row[k]:,.0f}" if row[k] >= 100 else f"{row[k]:.4g}" for k in header]
                print(f"| {rnd} | {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
