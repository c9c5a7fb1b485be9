"""Restart replay time: fill N items, SIGKILL, restart on the same data, time the first dequeue;
then stop it cleanly (SIGTERM), restart again, time the first dequeue again.

Contract of :func:`run_replay`:
- Starts ``sdef`` fresh, enqueues ``items`` distinct payloads (each starts with its zero-padded
  sequence number), records RSS and the data dir's size, then SIGKILLs the server (a crash: only
  what reached the kernel survives).
- Optionally drops the page cache (``drop_caches``, root only) so replay reads from disk.
- Restarts the server on the same data dir and the same port and measures, from the restart's
  ``exec`` on, the seconds until the port accepts connections and until the first dequeue
  returns an item. That item must be the first one enqueued (FIFO survives the crash),
  otherwise it is an error. A server that answers "loading" or "empty" while it replays is
  polled every millisecond; one that holds the request until it can answer is simply waited for.
- Then stops that server with SIGTERM (a clean shutdown, which may leave a checkpoint), drops
  the page cache again when asked, restarts it the same way and times the first dequeue once
  more (``replay_term_first_s``), which must return an item other than item 0 (the fill's
  connections interleave, so which item is second in the queue is not known).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import loadgen
import servers
import wire


def _dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, f)).st_size
    return total


def _first_dequeue(proto: str, port: int, deadline: float) -> tuple[bytes | None, str]:
    """Polls dequeue until an item comes back; returns (payload head, error text)."""
    s = loadgen.connect("127.0.0.1", port)
    try:
        loadgen.setup_connection(s, proto, b"q")
        req = wire.dequeue_request(proto, b"q")
        parse = wire.PARSERS[proto]
        extra = [0, 0, 0]
        while time.monotonic() < deadline:
            s.sendall(req)
            buf = bytearray()
            while True:
                _, code = parse(buf, 0, extra)
                if code != wire.INCOMPLETE:
                    break
                data = s.recv(1 << 16)
                if not data:
                    return None, "server closed the connection"
                buf += data
            if code == wire.OK:
                if proto == "bs":  # a reservation: delete the job, as a get takes the item
                    job = bytes(buf).split(b" ", 2)[1]
                    s.sendall(b"delete %s\r\n" % job)
                    reply = b""
                    while not reply.endswith(b"\r\n"):
                        more = s.recv(64)
                        if not more:
                            break
                        reply += more
                    if reply != b"DELETED\r\n":
                        return None, f"delete after reserve answered {reply!r}"
                return bytes(buf[extra[1] : extra[1] + 12]), ""
            time.sleep(0.001)  # empty or still loading: poll again
        return None, "no item before the deadline"
    finally:
        s.close()


def run_replay(
    sdef: servers.ServerDef,
    workdir: Path,
    cpu: int | None,
    *,
    items: int,
    size: int,
    drop_caches: bool = False,
    timeout: float = 120.0,
) -> dict[str, Any]:
    """Runs the replay measurement for one server (see module docstring)."""
    errors: list[str] = []
    r = servers.start(sdef, workdir, cpu)
    try:
        fill_errors, fill_s = loadgen.fill(sdef.proto, r.port, items, size, vary=True)
        if fill_errors:
            errors.append(f"{fill_errors} enqueue errors during the fill")
        time.sleep(0.2)  # let periodic writers (redis everysec) hand the tail to the kernel
        rss_full_kb = r.peak_rss_kb()
        r.kill()
        disk = _dir_bytes(r.data_dir)
        firsts: list[float] = []
        listens: list[float] = []
        rss_after_kb = 0
        for n, stop in enumerate((None, "term")):
            if stop is not None and r.stop(grace=timeout) == -9:  # SIGTERM: a clean shutdown
                errors.append("the server did not stop on SIGTERM")
            if drop_caches:
                subprocess.run(["sync"], check=False)
                Path("/proc/sys/vm/drop_caches").write_text("3\n")
            t0 = time.monotonic()
            r = servers.start(
                sdef,
                workdir,
                cpu,
                data_dir=r.data_dir,
                cell_dir=r.cell_dir,
                timeout=timeout,
                port=r.port,
            )
            listens.append(time.monotonic() - t0)
            head, err = _first_dequeue(sdef.proto, r.port, t0 + timeout)
            firsts.append(time.monotonic() - t0)
            if err:
                errors.append(err)
            elif n == 0 and head != b"%012d" % 0:
                errors.append(f"first item after the crash is {head!r}, not item 0")
            elif n == 1 and head == b"%012d" % 0:  # the fill's connections interleave: which
                errors.append("item 0, taken before the SIGTERM, came back")  # item is next
                # is not known, only that item 0 is gone
            rss_after_kb = max(rss_after_kb, r.peak_rss_kb())
    finally:
        r.cleanup()
    t_first, t_listen = firsts[0] if firsts else 0.0, listens[0] if listens else 0.0
    return {
        "ops": items,
        "ops_per_s": 0.0,
        "elapsed_s": t_first,
        "replay_first_s": t_first,
        "replay_listen_s": t_listen,
        "replay_term_first_s": firsts[1] if len(firsts) > 1 else None,
        "fill_s": fill_s,
        "disk_bytes": disk,
        "rss_full_kb": rss_full_kb,
        "peak_rss_kb": rss_after_kb,
        "misses": 0,
        "errors": len(errors),
        "error_samples": errors[:5],
        "server_cpu_s": None,
        "client_cpu_s": None,
        "dry": False,
        "drop_caches": drop_caches,
    }
