"""tercel's load generator: raw sockets, memcache / beanstalkd / Redis, N conns over P processes.

Contract of :func:`run_load`:
- Opens ``spec.conns`` TCP connections (TCP_NODELAY) spread round-robin over ``spec.procs``
  forked worker processes, runs per-connection setup, then waits until every worker is ready.
- Each connection sends batches of ``spec.depth`` requests (depth 1 = no pipelining) and sends
  the next batch only after every reply of the previous one is parsed. A batch's round trip is
  the latency of each op in it.
- Nothing is counted during ``spec.warmup`` seconds; batches completing in the following
  ``spec.duration`` seconds are counted. No batch is started after the window ends.
- With ``spec.stop_on_miss`` (dequeue from a prefilled queue) the first empty reply ends the
  cell for every connection; the rate is computed up to the last counted completion and
  ``dry`` is set. A queue that runs dry during warm-up is an error.
- If ``server_pid`` is given, the server's utime+stime over the measured window is read from
  /proc. The result carries ops/s, p50/p99/p99.9 latency (µs), misses, errors and the client
  CPU seconds the workers spent in the window.

The hot loop allocates little: request batches are prebuilt ``bytes``, replies are parsed in
place from one ``bytearray`` per connection, latencies go to ``array('q')``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import multiprocessing as mp
import os
import selectors
import socket
import ssl
import sys
import time
import traceback
from array import array
from dataclasses import asdict, dataclass, field
from typing import Any

import procstat
import wire

OPS = ("enqueue", "dequeue", "mixed", "reliable")
RECV_SIZE = 1 << 18


@dataclass(frozen=True)
class LoadSpec:
    """What to run against one server. ``op`` is one of :data:`OPS`."""

    proto: str
    port: int
    op: str
    host: str = "127.0.0.1"
    queue: bytes = b"q"
    size: int = 1024
    conns: int = 1
    depth: int = 1
    procs: int = 1
    tls: bool = False
    warmup: float = 0.5
    duration: float = 3.0
    stop_on_miss: bool = False
    cpu: int | None = None


@dataclass
class LoadResult:
    """Aggregated outcome of one :func:`run_load` call (latencies in µs)."""

    ops: int = 0
    ops_per_s: float = 0.0
    elapsed_s: float = 0.0
    p50_us: float = 0.0
    p99_us: float = 0.0
    p999_us: float = 0.0
    misses: int = 0
    errors: int = 0
    dry: bool = False
    dry_in_warmup: bool = False
    client_cpu_s: float = 0.0
    server_cpu_s: float | None = None
    other_cpu_s: float | None = None
    kernel_cpu_s: float | None = None
    steal_cpu_s: float | None = None
    error_samples: list[str] = field(default_factory=list)
    lat: array[int] = field(default_factory=lambda: array("q"), repr=False)
    weight: array[int] = field(default_factory=lambda: array("l"), repr=False)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready view (without the raw latency arrays)."""
        d = asdict(self)
        del d["lat"], d["weight"]
        return d


def merge_results(parts: list[LoadResult]) -> LoadResult:
    """Combines consecutive segments of one cell: sums counts and times, pools latencies."""
    out = LoadResult()
    cpu: float | None = None
    for p in parts:
        out.ops += p.ops
        out.elapsed_s += p.elapsed_s
        out.misses += p.misses
        out.errors += p.errors
        out.dry = out.dry or p.dry
        out.client_cpu_s += p.client_cpu_s
        out.error_samples.extend(p.error_samples)
        out.lat.extend(p.lat)
        out.weight.extend(p.weight)
        if p.server_cpu_s is not None:
            cpu = (cpu or 0.0) + p.server_cpu_s
        if p.other_cpu_s is not None:
            out.other_cpu_s = (out.other_cpu_s or 0.0) + p.other_cpu_s
        if p.kernel_cpu_s is not None:
            out.kernel_cpu_s = (out.kernel_cpu_s or 0.0) + p.kernel_cpu_s
        if p.steal_cpu_s is not None:
            out.steal_cpu_s = (out.steal_cpu_s or 0.0) + p.steal_cpu_s
    out.server_cpu_s = cpu
    out.error_samples = out.error_samples[:5]
    out.ops_per_s = out.ops / out.elapsed_s if out.elapsed_s > 0 else 0.0
    out.p50_us, out.p99_us, out.p999_us = percentile(out.lat, out.weight, (0.5, 0.99, 0.999))
    return out


def payload_bytes(size: int, seed: int = 0x5EED) -> bytes:
    """A fixed pseudo-random payload of ``size`` bytes without CR/LF (incompressible enough)."""
    out = bytearray(size)
    x = seed & 0xFFFFFFFF or 1
    for i in range(size):
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        out[i] = 33 + x % 94  # printable, never \r or \n
    return bytes(out)


def connect(host: str, port: int, timeout: float = 5.0, *, tls: bool = False) -> socket.socket:
    """A blocking TCP connection with TCP_NODELAY set; over TLS with ``tls`` (the server's
    certificate is not checked: the benchmark measures the cost of the encryption)."""
    s = socket.create_connection((host, port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if tls:
        s = _tls_context().wrap_socket(s, server_hostname=host)
    s.settimeout(None)
    return s


@functools.cache
def _tls_context() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _recv_all(sock: socket.socket) -> bytes:
    """What one readable socket has: over TLS, also the records OpenSSL already decrypted
    (which the selector cannot see)."""
    data = sock.recv(RECV_SIZE)
    if data and isinstance(sock, ssl.SSLSocket):
        while sock.pending():
            data += sock.recv(RECV_SIZE)
    return data


def roundtrip(sock: socket.socket, proto: str, request: bytes, replies: int = 1) -> list[int]:
    """Sends ``request`` and blocks until ``replies`` replies are parsed; returns their codes."""
    parse = wire.PARSERS[proto]
    sock.sendall(request)
    buf = bytearray()
    pos = 0
    codes: list[int] = []
    extra = [0, 0, 0]
    while len(codes) < replies:
        p, code = parse(buf, pos, extra)
        if code == wire.INCOMPLETE:
            data = sock.recv(RECV_SIZE)
            if not data:
                raise ConnectionError("server closed the connection")
            buf += data
            continue
        pos = p
        codes.append(code)
    return codes


def setup_connection(sock: socket.socket, proto: str, queue: bytes) -> None:
    """Runs the protocol's per-connection setup (beanstalk use/watch/ignore)."""
    reqs = wire.setup_requests(proto, queue)
    if reqs:
        codes = roundtrip(sock, proto, b"".join(reqs), len(reqs))
        if any(c != wire.AUX for c in codes):
            raise ConnectionError(f"setup failed: {codes}")


def build_batches(spec: LoadSpec) -> list[bytes]:
    """Prebuilt request batches a connection cycles through (index 0 is sent first).

    mixed alternates enqueue and dequeue op by op, so an odd depth needs two batches.
    reliable is ``get q/open`` once, then ``get q/close/open``: batch 0 is the opening batch and
    is never repeated (see :class:`_Conn`).
    """
    enq = wire.enqueue_request(spec.proto, spec.queue, payload_bytes(spec.size))
    deq = wire.dequeue_request(spec.proto, spec.queue)
    d = spec.depth
    if spec.op == "enqueue":
        return [enq * d]
    if spec.op == "dequeue":
        return [deq * d]
    if spec.op == "mixed":
        seq = [enq if i % 2 == 0 else deq for i in range(2 * d)]
        return [b"".join(seq[:d]), b"".join(seq[d:])]
    if spec.op == "reliable":
        if spec.proto != "mc":
            raise ValueError("reliable reads are a memcache (Kestrel) feature")
        again = wire.reliable_open_request(spec.queue, first=False)
        return [wire.reliable_open_request(spec.queue, first=True) + again * (d - 1), again * d]
    raise ValueError(f"unknown op {spec.op!r}")


class _Conn:
    """One connection's state inside a worker process."""

    __slots__ = ("batch_i", "buf", "done", "expected", "extra", "ids", "n", "sock", "t0")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.extra = [0, 0, 0]
        self.ids: list[int] = []  # beanstalk jobs reserved in the last batch, deleted in the next
        self.expected = 0
        self.n = 0  # ops answered in the current batch (OK or MISS)
        self.t0 = 0
        self.batch_i = 0
        self.done = False


class _Worker:
    """The per-process load loop (see module docstring for the counting rules)."""

    def __init__(self, spec: LoadSpec, nconns: int, dry: Any) -> None:
        self.spec = spec
        self.parse = wire.PARSERS[spec.proto]
        self.batches = build_batches(spec)
        self.cycle_from = 1 if spec.op == "reliable" else 0
        self.dry = dry
        self.conns: list[_Conn] = []
        for _ in range(nconns):
            s = connect(spec.host, spec.port, tls=spec.tls)
            setup_connection(s, spec.proto, spec.queue)
            self.conns.append(_Conn(s))
        self.lat = array("q")
        self.weight = array("l")
        self.ops = 0
        self.misses = 0
        self.errors = 0
        self.error_samples: list[str] = []
        self.last_done = 0
        self.dry_in_warmup = False

    def _error(self, msg: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(msg)

    def _send(self, c: _Conn, now: int) -> None:
        batches = self.batches
        req = batches[c.batch_i]
        c.batch_i += 1
        if c.batch_i >= len(batches):
            c.batch_i = self.cycle_from
        expected = self.spec.depth
        if c.ids:
            req = b"".join([wire.bs_delete_request(i) for i in c.ids]) + req
            expected += len(c.ids)
            c.ids.clear()
        c.expected = expected
        c.n = 0
        c.t0 = now
        c.sock.sendall(req)

    def _consume(self, c: _Conn, data: bytes) -> int:
        """Parses what arrived; returns OK ops seen, or -1 on a MISS when stop_on_miss."""
        buf = c.buf
        buf += data
        pos = 0
        parse = self.parse
        extra = c.extra
        ok = 0
        missed = False
        while c.expected:
            pos2, code = parse(buf, pos, extra)
            if code == wire.INCOMPLETE:
                break
            pos = pos2
            c.expected -= 1
            if code == wire.OK:
                ok += 1
                if extra[0]:
                    c.ids.append(extra[0])
                    extra[0] = 0
            elif code == wire.MISS:
                self.misses += 1
                missed = True
            elif code == wire.ERR:
                self._error(bytes(buf[pos - min(pos, 60) : pos]).decode("latin-1").strip())
        if pos:
            del buf[:pos]
        c.n += ok
        return -1 if missed and self.spec.stop_on_miss else ok

    def _batch_done(self, c: _Conn, now: int, t_meas: int, t_end: int, missed: bool) -> bool:
        """Records a finished batch; returns True if the connection should send another."""
        if t_meas <= now <= t_end and c.n:
            self.ops += c.n
            self.lat.append(now - c.t0)
            self.weight.append(c.n)
            self.last_done = now
        if missed:
            if now < t_meas:
                self.dry_in_warmup = True
            if not self.dry.value:
                self.dry.value = now
            return False
        return now < t_end and not self.dry.value

    def run(self, t_meas: int, t_end: int) -> dict[str, Any]:
        """Runs the load until ``t_end`` (monotonic ns) and returns raw per-process results."""
        cpu0: float | None = None
        now = time.monotonic_ns()
        if len(self.conns) == 1:
            cpu0 = self._run_single(self.conns[0], t_meas, t_end, now)
        else:
            cpu0 = self._run_multi(t_meas, t_end, now)
        t = os.times()
        cpu = (t.user + t.system) - cpu0 if cpu0 is not None else 0.0
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.sock.close()
        return {
            "ops": self.ops,
            "misses": self.misses,
            "errors": self.errors,
            "error_samples": self.error_samples,
            "lat": self.lat,
            "weight": self.weight,
            "client_cpu_s": cpu,
            "last_done": self.last_done,
            "dry_in_warmup": self.dry_in_warmup,
        }

    def _run_single(self, c: _Conn, t_meas: int, t_end: int, now: int) -> float | None:
        cpu0: float | None = None
        sock = c.sock
        sock.settimeout(max(5.0, (t_end - now) / 1e9 + 5))
        self._send(c, now)
        while True:
            try:
                data = sock.recv(RECV_SIZE)
            except TimeoutError:
                self._error("timeout waiting for a reply")
                return cpu0
            if not data:
                self._error("server closed the connection")
                return cpu0
            r = self._consume(c, data)
            if c.expected:
                continue
            now = time.monotonic_ns()
            if cpu0 is None and now >= t_meas:
                t = os.times()
                cpu0 = t.user + t.system
            if not self._batch_done(c, now, t_meas, t_end, r < 0):
                return cpu0
            self._send(c, now)

    def _run_multi(self, t_meas: int, t_end: int, now: int) -> float | None:
        cpu0: float | None = None
        sel = selectors.DefaultSelector()
        for c in self.conns:
            c.sock.setblocking(True)
            sel.register(c.sock, selectors.EVENT_READ, c)
            self._send(c, now)
        live = len(self.conns)
        deadline = t_end + 5_000_000_000
        while live:
            events = sel.select(1.0)
            now = time.monotonic_ns()
            if cpu0 is None and now >= t_meas:
                t = os.times()
                cpu0 = t.user + t.system
            if now > deadline:
                self._error(f"{live} connection(s) still waiting for replies at the deadline")
                break
            for key, _ in events:
                c = key.data
                try:
                    data = _recv_all(c.sock)
                except OSError as e:
                    data = b""
                    self._error(f"recv: {e}")
                if not data:
                    self._error("server closed the connection")
                    sel.unregister(c.sock)
                    live -= 1
                    continue
                r = self._consume(c, data)
                if c.expected:
                    continue
                if self._batch_done(c, now, t_meas, t_end, r < 0):
                    self._send(c, now)
                else:
                    sel.unregister(c.sock)
                    live -= 1
        sel.close()
        return cpu0


def _worker_main(spec: LoadSpec, nconns: int, *, dry: Any, ready: Any, go: Any, times: Any) -> None:
    """Entry point of one forked worker: connect, report ready, wait for go, run, report."""
    try:
        if spec.cpu is not None:
            os.sched_setaffinity(0, {spec.cpu})
        w = _Worker(spec, nconns, dry)
        ready.put(("ready", None))
        go.wait()
        ready.put(("result", w.run(int(times[0]), int(times[1]))))
    except Exception:
        ready.put(("fail", traceback.format_exc(limit=3)))


def percentile(lat: array[int], weight: array[int], qs: tuple[float, ...]) -> list[float]:
    """Weighted percentiles (in µs) of batch latencies (ns), each batch weighted by its ops."""
    if not lat:
        return [0.0 for _ in qs]
    order = sorted(range(len(lat)), key=lat.__getitem__)
    total = sum(weight)
    out: list[float] = []
    targets = [q * total for q in qs]
    acc = 0
    ti = 0
    for i in order:
        acc += weight[i]
        while ti < len(targets) and acc >= targets[ti]:
            out.append(lat[i] / 1000)
            ti += 1
        if ti == len(targets):
            break
    while len(out) < len(qs):
        out.append(lat[order[-1]] / 1000)
    return out


def run_load(spec: LoadSpec, server_pid: int | None = None) -> LoadResult:
    """Runs one load cell as described in the module docstring."""
    ctx = mp.get_context("fork")
    procs = max(1, min(spec.procs, spec.conns))
    dry = ctx.Value("q", 0, lock=False)
    times = ctx.Array("d", 2, lock=False)
    go = ctx.Event()
    q: Any = ctx.Queue()
    shares = [spec.conns // procs + (1 if i < spec.conns % procs else 0) for i in range(procs)]
    workers = [
        ctx.Process(
            target=_worker_main,
            args=(spec, n),
            kwargs={"dry": dry, "ready": q, "go": go, "times": times},
            daemon=True,
        )
        for n in shares
    ]
    for w in workers:
        w.start()
    res = LoadResult()
    failures: list[str] = []
    for _ in workers:
        kind, payload = q.get(timeout=60)
        if kind != "ready":
            failures.append(str(payload))
    if failures:
        go.set()
        for w in workers:
            w.kill()
            w.join()
        res.errors = len(failures)
        res.error_samples = failures[:3]
        return res
    t_meas = time.monotonic_ns() + int(spec.warmup * 1e9)
    t_end = t_meas + int(spec.duration * 1e9)
    times[0] = t_meas
    times[1] = t_end
    go.set()
    cpu_before: float | None = None
    kernel_before = 0.0
    if server_pid is not None:
        time.sleep(max(0.0, (t_meas - time.monotonic_ns()) / 1e9))
        cpu_before, kernel_before = procstat.tree_and_kernel_seconds(server_pid)
    busy_before, steal_before = procstat.machine_seconds()
    lat = array("q")
    weight = array("l")
    last_done = 0
    for _ in workers:
        kind, payload = q.get(timeout=spec.warmup + spec.duration + 60)
        if kind != "result":
            res.errors += 1
            res.error_samples.append(str(payload))
            continue
        res.ops += payload["ops"]
        res.misses += payload["misses"]
        res.errors += payload["errors"]
        res.error_samples.extend(payload["error_samples"])
        res.client_cpu_s += payload["client_cpu_s"]
        lat.extend(payload["lat"])
        weight.extend(payload["weight"])
        last_done = max(last_done, payload["last_done"])
        if payload["dry_in_warmup"]:
            res.dry_in_warmup = True
            res.errors += 1
            res.error_samples.append("queue ran dry during warm-up: prefill more")
    busy, steal = procstat.machine_seconds()
    busy -= busy_before
    res.steal_cpu_s = steal - steal_before
    if cpu_before is not None and server_pid is not None:
        cpu_after, kernel_after = procstat.tree_and_kernel_seconds(server_pid)
        res.server_cpu_s = cpu_after - cpu_before
        res.kernel_cpu_s = kernel_after - kernel_before
        res.other_cpu_s = max(0.0, busy - res.server_cpu_s - res.client_cpu_s - res.kernel_cpu_s)
    for w in workers:
        w.join(timeout=5)
        if w.is_alive():
            w.kill()
    res.dry = bool(dry.value)
    elapsed_ns = (last_done - t_meas) if res.dry else (t_end - t_meas)
    res.elapsed_s = max(elapsed_ns, 1) / 1e9
    res.ops_per_s = res.ops / res.elapsed_s if res.ops else 0.0
    res.p50_us, res.p99_us, res.p999_us = percentile(lat, weight, (0.5, 0.99, 0.999))
    res.error_samples = res.error_samples[:5]
    res.lat = lat
    res.weight = weight
    return res


# --------------------------------------------------------------------------- bulk fill


def fill(
    proto: str,
    port: int,
    count: int,
    size: int,
    *,
    host: str = "127.0.0.1",
    queue: bytes = b"q",
    vary: bool = False,
    conns: int = 4,
    depth: int = 64,
    tls: bool = False,
) -> tuple[int, float]:
    """Enqueues exactly ``count`` items as fast as possible; returns (errors, seconds).

    With ``vary`` every payload starts with its zero-padded sequence number, so the items are
    distinct (and the first one enqueued reads ``000000000000``). Runs in the calling process.
    """
    base = payload_bytes(size)
    fixed = wire.enqueue_request(proto, queue, base)
    parse = wire.PARSERS[proto]
    socks = [connect(host, port, tls=tls) for _ in range(max(1, min(conns, count)))]
    for s in socks:
        setup_connection(s, proto, queue)
    t0 = time.monotonic()
    sent = 0
    errors = 0
    sel = selectors.DefaultSelector()
    state: dict[socket.socket, list[Any]] = {}

    def send(s: socket.socket) -> int:
        nonlocal sent
        n = min(depth, count - sent)
        if n <= 0:
            return 0
        if vary:
            w = min(12, size)
            reqs = [
                wire.enqueue_request(proto, queue, (b"%012d" % (sent + i))[-w:] + base[w:])
                for i in range(n)
            ]
            s.sendall(b"".join(reqs))
        else:
            s.sendall(fixed * n)
        sent += n
        return n

    for s in socks:
        n = send(s)
        if n:
            state[s] = [bytearray(), n]
            sel.register(s, selectors.EVENT_READ)
    extra = [0, 0, 0]
    while state:
        for key, _ in sel.select(30):
            fobj = key.fileobj
            assert isinstance(fobj, socket.socket)
            s = fobj
            st = state[s]
            data = _recv_all(s)
            if not data:
                raise ConnectionError("server closed the connection during fill")
            buf = st[0]
            buf += data
            pos = 0
            while st[1]:
                p, code = parse(buf, pos, extra)
                if code == wire.INCOMPLETE:
                    break
                pos = p
                st[1] -= 1
                if code != wire.OK:
                    errors += 1
            del buf[:pos]
            if not st[1]:
                n = send(s)
                if n:
                    st[1] = n
                else:
                    sel.unregister(s)
                    del state[s]
    sel.close()
    for s in socks:
        s.close()
    return errors, time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    """CLI: one load cell against an already running server, one JSON line on stdout."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--proto", choices=wire.PROTOCOLS, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--op", choices=OPS, default="enqueue")
    ap.add_argument("--queue", default="q")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--conns", type=int, default=1)
    ap.add_argument("--depth", type=int, default=1)
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--stop-on-miss", action="store_true")
    ap.add_argument("--cpu", type=int, default=None, help="pin the workers to this CPU")
    ap.add_argument("--server-pid", type=int, default=None, help="measure its CPU over the window")
    ap.add_argument("--prefill", type=int, default=0, help="enqueue this many items first")
    a = ap.parse_args(argv)
    if a.host not in ("127.0.0.1", "localhost", "::1"):
        print("loadgen only targets the loopback interface", file=sys.stderr)
        return 2
    queue = a.queue.encode()
    if a.prefill:
        errs, _ = fill(a.proto, a.port, a.prefill, a.size, host=a.host, queue=queue)
        if errs:
            print(f"prefill: {errs} errors", file=sys.stderr)
    spec = LoadSpec(
        proto=a.proto,
        host=a.host,
        port=a.port,
        op=a.op,
        queue=queue,
        size=a.size,
        conns=a.conns,
        depth=a.depth,
        procs=a.procs,
        warmup=a.warmup,
        duration=a.duration,
        stop_on_miss=a.stop_on_miss,
        cpu=a.cpu,
    )
    res = run_load(spec, a.server_pid)
    print(json.dumps(res.as_dict()))
    return 1 if res.errors else 0


if __name__ == "__main__":
    sys.exit(main())
