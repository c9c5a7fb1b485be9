"""Where the Spark source's driver-side fetch spends its time, stage by stage, without Spark.

One server (``tercel.testing.ServerProcess``, default config) holds ``--items`` JSON events of
``--size`` bytes (``spark_bench.events``); the fetch path then runs by hand, one stage after the
other for every lease batch of ``--batch`` items, on one connection:

1. ``lease``: the request and the whole reply on a bare socket (the server's work and the
   loopback transfer; nothing parsed); the binary ``LEASEDB`` reply, or with ``--text`` the
   ``LEASED`` lines,
2. ``parse``: those reply bytes through the client codec into ``LeaseColumns``,
3. ``to_batch``: the columns as the staged Arrow record batch,
4. ``stage``: the batch appended to a staging segment, flush + fsync,
5. ``ack``: ``Client.ack_ids`` for the batch (round trip; the server writes CONFIRM records),

and, once everything is staged, 6. ``read back``: every staged row as the executors read it
(``read_slice``, Arrow IPC from the page cache). Prints one JSON object: per stage the total
seconds and microseconds per item, the server's CPU seconds (``/proc``) during the lease and
ack stages, and the load average.

    .venv/bin/python bench/spark_stages.py [--items 200000] [--size 200] [--batch 5000] [--text]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import tempfile
import time
from pathlib import Path

from spark_bench import fill_queues
from tercel.client import Client
from tercel.protocol.commands import Lease
from tercel.protocol.memcache_client import LeaseColumns, MemcacheClientCodec
from tercel.spark._fetch import LeaseReply, to_batch
from tercel.spark._staging import Piece, SegmentWriter, read_slice
from tercel.testing import ServerProcess

_TICK = os.sysconf("SC_CLK_TCK")

STAGES = ("lease", "parse", "to_batch", "stage", "ack", "read back")


def raw_lease(sock: socket.socket, queue: str, n: int, binary: bool) -> bytes:
    """One ``lease`` request (``binary``: the ``LEASEDB`` reply) and its whole reply, unparsed."""
    tail = b" binary" if binary else b""
    sock.sendall(b"lease %b %d 0 30000%b\r\n" % (queue.encode(), n, tail))
    chunks = [sock.recv(1 << 20)]
    while not chunks[-1].endswith(b"END\r\n") and chunks[-1]:  # the events never end so
        chunks.append(sock.recv(1 << 20))
    return b"".join(chunks)


def parse(reply: bytes, n: int) -> LeaseColumns:
    codec = MemcacheClientCodec()
    codec.send(Lease("q", n, 0, 30000, columns=True))
    codec.receive_data(reply)
    cols = codec.next_reply()
    assert isinstance(cols, LeaseColumns), cols
    return cols


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument(
        "--text", action="store_true", help="the LEASED text reply (before lease-binary)"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tercel-spark-stages-"))
    spent = {stage: [0.0, 0.0, 0.0] for stage in STAGES}
    """Per stage: wall seconds, this process's CPU seconds, the server's CPU seconds."""
    with ServerProcess(work / "s") as srv, Client(srv.address) as client:
        assert srv.proc is not None
        pid = srv.proc.pid
        fill_queues([srv], "events", args.items, args.size)
        host, port = srv.address.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
        (work / "stage").mkdir()
        writer = SegmentWriter(str(work / "stage"), 0)
        got = 0
        load_before = os.getloadavg()[0]
        while got < args.items:
            marks = [_now(pid)]
            reply = raw_lease(sock, "events", args.batch, not args.text)
            marks.append(_now(pid))
            cols = parse(reply, args.batch)
            marks.append(_now(pid))
            batch = to_batch(LeaseReply(srv.address, "events", cols), time.time())
            marks.append(_now(pid))
            writer.append(batch)
            marks.append(_now(pid))
            assert client.ack_ids(srv.address, "events", cols.lease_ids) == len(cols)
            marks.append(_now(pid))
            for stage, (a, b) in zip(STAGES, itertools.pairwise(marks), strict=False):
                for k in range(3):
                    spent[stage][k] += b[k] - a[k]
            got += len(cols)
            assert len(cols), "the queue ran dry early"
        segment = writer.finish()
        assert segment is not None
        t0 = time.perf_counter()
        c0 = time.process_time()
        rows = sum(b.num_rows for b in read_slice([Piece(segment.path, 0, 0, segment.end)]))
        spent["read back"][:2] = [time.perf_counter() - t0, time.process_time() - c0]
        assert rows == args.items
        sock.close()
    per_item = {k: [round(v / args.items * 1e6, 2) for v in vs] for k, vs in spent.items()}
    print(
        json.dumps(
            {
                "items": args.items,
                "size": args.size,
                "batch": args.batch,
                "reply": "text" if args.text else "binary",
                "load": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                "us_per_item [wall, client cpu, server cpu]": per_item,
                "cpu_us_per_item": round(sum(sum(v[1:]) for v in per_item.values()), 2),
                "items_per_s_all_stages": round(args.items / sum(v[0] for v in spent.values())),
            },
            indent=2,
        )
    )


def _now(pid: int) -> tuple[float, float, float]:
    """(wall clock, this process's CPU, the server's CPU) in seconds. The server's is read
    from its own ``/proc/<pid>/stat`` (a scan of the whole process table here would cost
    milliseconds of this process's CPU per stage)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        raw = f.read()
    fields = raw[raw.rindex(b")") + 2 :].split()
    server = (int(fields[11]) + int(fields[12])) / _TICK
    return time.perf_counter(), time.process_time(), server


if __name__ == "__main__":
    main()
