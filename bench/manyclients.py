"""The "many-clients" scenario: many blocked consumers, one trickling producer.

Contract of :func:`run_many_clients`:
- ``consumers`` connections spread over ``procs`` forked processes each keep exactly one blocking
  dequeue outstanding (memcache ``get q/t=1000``, beanstalkd ``reserve-with-timeout 1`` followed by
  ``delete``, Redis ``BLPOP q 1``) and re-issue it after every reply, item or timeout.
- Once every consumer has sent its first request, one producer connection enqueues items at
  ``rate`` per second for ``duration`` seconds. Each payload carries its sequence number and the
  monotonic send time, so add→delivery latency is measured across processes (CLOCK_MONOTONIC).
- The run ends when every produced item was delivered or ``grace`` seconds after the producer
  stopped. Lost and duplicated items are counted as errors: exactly-once delivery is required.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import selectors
import socket
import time
import traceback
from array import array
from typing import Any

import loadgen
import procstat
import wire

TIMEOUT_MS = 1000


def _consumer_main(
    proto: str, port: int, n: int, *, queue: bytes, cpu: int | None, out: Any, stop: Any, count: Any
) -> None:
    """One consumer process: ``n`` connections each with one blocking dequeue in flight."""
    try:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        parse = wire.PARSERS[proto]
        req = wire.dequeue_request(proto, queue, TIMEOUT_MS)
        sel = selectors.DefaultSelector()
        bufs: dict[int, bytearray] = {}
        socks = []
        for _ in range(n):
            s = loadgen.connect("127.0.0.1", port)
            loadgen.setup_connection(s, proto, queue)
            s.sendall(req)
            sel.register(s, selectors.EVENT_READ)
            bufs[s.fileno()] = bytearray()
            socks.append(s)
        out.put(("ready", None))
        seqs = array("q")
        lat = array("q")
        errors: list[str] = []
        extra = [0, 0, 0]
        while not stop.value:
            for key, _ in sel.select(0.05):
                fobj = key.fileobj
                assert isinstance(fobj, socket.socket)
                s = fobj
                data = s.recv(1 << 16)
                now = time.monotonic_ns()
                if not data:
                    errors.append("server closed a consumer connection")
                    sel.unregister(s)
                    continue
                buf = bufs[s.fileno()]
                buf += data
                pos = 0
                again = []
                while True:
                    p, code = parse(buf, pos, extra)
                    if code == wire.INCOMPLETE:
                        break
                    pos = p
                    if code == wire.OK:
                        start, ln = extra[1], extra[2]
                        fields = bytes(buf[start : start + min(ln, 48)]).split(b" ", 2)
                        seqs.append(int(fields[0]))
                        lat.append(now - int(fields[1]))
                        with count.get_lock():
                            count.value += 1
                        if extra[0]:
                            again.append(wire.bs_delete_request(extra[0]))
                            extra[0] = 0
                        again.append(req)
                    elif code == wire.MISS:
                        again.append(req)
                    elif code == wire.ERR:
                        errors.append(bytes(buf[max(0, pos - 60) : pos]).decode("latin-1"))
                        again.append(req)
                del buf[:pos]
                if again:
                    s.sendall(b"".join(again))
        for s in socks:
            with contextlib.suppress(OSError):
                s.close()
        out.put(("result", {"seqs": seqs, "lat": lat, "errors": errors}))
    except Exception:
        out.put(("fail", traceback.format_exc(limit=3)))


def _producer(
    proto: str, port: int, *, queue: bytes, size: int, rate: float, duration: float
) -> int:
    """Enqueues paced items until ``duration`` is over; returns how many were produced."""
    s = loadgen.connect("127.0.0.1", port)
    loadgen.setup_connection(s, proto, queue)
    filler = loadgen.payload_bytes(size)
    total = max(1, int(rate * duration))
    t0 = time.monotonic()
    for i in range(total):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        head = b"%d %d " % (i, time.monotonic_ns())
        payload = head + filler[len(head) :] if size > len(head) else head
        codes = loadgen.roundtrip(s, proto, wire.enqueue_request(proto, queue, payload))
        if codes != [wire.OK]:
            s.close()
            raise RuntimeError(f"enqueue {i} failed: {codes}")
    s.close()
    return total


def run_many_clients(
    proto: str,
    port: int,
    *,
    consumers: int,
    size: int,
    rate: float,
    duration: float,
    procs: int = 4,
    cpu: int | None = None,
    server_pid: int | None = None,
    grace: float = 3.0,
    queue: bytes = b"q",
) -> dict[str, Any]:
    """Runs the scenario (see module docstring) and returns a result record."""
    ctx = mp.get_context("fork")
    procs = max(1, min(procs, consumers))
    out: Any = ctx.Queue()
    stop = ctx.Value("b", 0, lock=False)
    count = ctx.Value("q", 0)
    shares = [consumers // procs + (1 if i < consumers % procs else 0) for i in range(procs)]
    workers = [
        ctx.Process(
            target=_consumer_main,
            args=(proto, port, n),
            kwargs={"queue": queue, "cpu": cpu, "out": out, "stop": stop, "count": count},
            daemon=True,
        )
        for n in shares
    ]
    for w in workers:
        w.start()
    errors: list[str] = []
    for _ in workers:
        kind, payload = out.get(timeout=60)
        if kind != "ready":
            errors.append(str(payload))
    produced = 0
    cpu0 = procstat.tree_and_kernel_seconds(server_pid)[0] if server_pid else None
    t0 = time.monotonic()
    if not errors:
        try:
            produced = _producer(proto, port, queue=queue, size=size, rate=rate, duration=duration)
        except (OSError, RuntimeError) as e:
            errors.append(f"producer: {e}")
    t_prod = time.monotonic() - t0
    deadline = time.monotonic() + grace
    while count.value < produced and time.monotonic() < deadline:
        time.sleep(0.01)
    server_cpu = (
        procstat.tree_and_kernel_seconds(server_pid)[0] - cpu0
        if server_pid and cpu0 is not None
        else None
    )
    stop.value = 1
    seqs = array("q")
    lat = array("q")
    for _ in workers:
        try:
            kind, payload = out.get(timeout=30)
        except Exception as e:  # queue.Empty
            errors.append(f"consumer did not report: {e!r}")
            continue
        if kind != "result":
            errors.append(str(payload))
            continue
        seqs.extend(payload["seqs"])
        lat.extend(payload["lat"])
        errors.extend(payload["errors"])
    for w in workers:
        w.join(timeout=5)
        if w.is_alive():
            w.kill()
    seen = set(seqs)
    dupes = len(seqs) - len(seen)
    missing = sum(1 for i in range(produced) if i not in seen)
    if dupes:
        errors.append(f"{dupes} item(s) delivered more than once")
    if missing:
        errors.append(f"{missing} item(s) never delivered")
    p50, p99, p999 = loadgen.percentile(lat, array("l", [1]) * len(lat), (0.5, 0.99, 0.999))
    return {
        "ops": len(seqs),
        "ops_per_s": len(seqs) / t_prod if t_prod > 0 else 0.0,
        "elapsed_s": t_prod,
        "p50_us": p50,
        "p99_us": p99,
        "p999_us": p999,
        "misses": 0,
        "errors": len(errors),
        "error_samples": errors[:5],
        "server_cpu_s": server_cpu,
        "client_cpu_s": None,
        "dry": False,
        "produced": produced,
        "delivered": len(seqs),
        "duplicates": dupes,
        "missing": missing,
        "rate": rate,
    }
