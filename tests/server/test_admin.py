"""The admin HTTP server, through a real HTTP client (urllib) against a real server, plus the
pure parts (histogram buckets, latched ``?period=`` windows) in-process."""

from __future__ import annotations

import json
import random
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from support import Raw
from tercel import native
from tercel.config import ServerSettings
from tercel.errors import ConfigError
from tercel.server import figures
from tercel.server import kestrel_figures as kf
from tercel.server.admin import Guard
from tercel.server.beanstalk import service as bsvc
from tercel.server.exposition import PeriodCollector, Snapshot
from tercel.server.figures import COUNTER, GAUGE, LABEL
from tercel.server.metrics import BUCKETS, LogHistogram, bucket_bounds, bucket_index
from tercel.testing import ServerProcess


def http(srv: ServerProcess, path: str, method: str = "GET") -> tuple[int, bytes, str]:
    """``(status, body, content type)``; 4xx and 5xx are answers, not exceptions."""
    req = urllib.request.Request(srv.admin_url + path, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read(), resp.headers["Content-Type"]
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.read(), err.headers["Content-Type"]


def get_json(srv: ServerProcess, path: str, method: str = "GET") -> Any:
    status, body, ctype = http(srv, path, method)
    assert (status, ctype) == (200, "application/json; charset=utf-8"), body
    return json.loads(body)


def set_cmd(q: str, data: bytes) -> bytes:
    return b"set %s 0 0 %d\r\n%s\r\n" % (q.encode(), len(data), data)


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    config = (
        "[server]\nexpiration_timer_frequency = 0\nlatency_sample_every = 1\n"
        '[aliases]\nal = ["aa", "ab"]\n'
    )
    with ServerProcess(tmp_path_factory.mktemp("data"), config) as s:
        yield s


def test_ports_file_names_the_admin_port(srv: ServerProcess) -> None:
    assert set(srv.ports) >= {"memcache", "admin"}
    assert srv.ports["admin"] not in (0, 2223, srv.port)


def test_ping(srv: ServerProcess) -> None:
    assert http(srv, "/ping")[:2] == (200, b'{"response":"pong"}')


def test_unknown_path_is_404(srv: ServerProcess) -> None:
    assert http(srv, "/nope")[0] == 404


@pytest.mark.parametrize("path", ["/reload", "/shutdown", "/status/up"])
def test_mutating_endpoints_refuse_get(srv: ServerProcess, path: str) -> None:
    assert http(srv, path)[0] == 405
    assert get_json(srv, "/ping") == {"response": "pong"}  # still up


def test_stats_json_has_ostrichs_shape(srv: ServerProcess, qname: str) -> None:
    raw = Raw(srv.connect())
    raw.call(set_cmd(qname, b"abc") + set_cmd(qname, b"de"), b"STORED\r\n" * 2)
    raw.call(b"get %s\r\n" % qname.encode(), b"VALUE %s 0 3\r\nabc\r\nEND\r\n" % qname.encode())
    raw.call(b"get %s_empty\r\n" % qname.encode(), b"END\r\n")
    raw.call(set_cmd("al", b"xyz"), b"STORED\r\n")
    doc = get_json(srv, "/stats.json")
    assert set(doc) == {"counters", "gauges", "labels", "metrics"}
    counters, gauges, metrics = doc["counters"], doc["gauges"], doc["metrics"]
    p = f"q/{qname}/"
    assert counters[p + "total_items"] == 2
    assert counters["cmd_set"] >= 3 and counters["get_hits"] >= 1
    assert (gauges[p + "items"], gauges[p + "bytes"], gauges[p + "open_transactions"]) == (1, 2, 0)
    assert gauges[p + "max_items"] == 2**63 - 1
    assert gauges["status/readable"] == gauges["status/writeable"] == 1
    assert (counters["q/al/put_items"], counters["q/al/put_bytes"]) == (1, 3)
    assert doc["labels"] == {"status": "UP", "version": doc["labels"]["version"]}
    hist = metrics[p + "set_latency_usec"]
    assert hist["count"] == 2
    assert set(hist) == {
        "count",
        "sum",
        "minimum",
        "maximum",
        "average",
        "p25",
        "p50",
        "p75",
        "p90",
        "p95",
        "p99",
        "p999",
        "p9999",
    }
    assert hist["minimum"] <= hist["p50"] <= hist["p99"] <= hist["maximum"]
    assert metrics[p + "get_hit_latency_usec"]["count"] == 1
    assert metrics[p + "delivery_latency_msec"]["count"] == 1
    assert metrics[f"q/{qname}_empty/get_miss_latency_usec"]["count"] == 1
    assert metrics["set_latency_usec"]["count"] >= 3
    assert set(get_json(srv, "/stats")) == {"counters", "gauges", "labels", "metrics"}


def test_deleted_queues_leave_stats(srv: ServerProcess, qname: str) -> None:
    raw = Raw(srv.connect())
    raw.call(set_cmd(qname, b"x"), b"STORED\r\n")
    before = get_json(srv, "/stats.json")["metrics"]
    assert before[f"q/{qname}/set_latency_usec"]["count"] == 1
    raw.call(b"delete %s\r\n" % qname.encode(), b"DELETED\r\n")
    doc = get_json(srv, "/stats.json")
    assert not any(k.startswith(f"q/{qname}/") for part in doc.values() for k in part)
    # What the deleted queue counted stays in the server-wide distribution.
    assert doc["metrics"]["set_latency_usec"]["count"] == before["set_latency_usec"]["count"]


def test_period_gives_deltas_since_the_window_began(srv: ServerProcess, qname: str) -> None:
    raw = Raw(srv.connect())
    before = get_json(srv, "/stats.json?period=600")["counters"]["cmd_set"]
    raw.call(b"".join(set_cmd(qname, b"%d" % i) for i in range(3)), b"STORED\r\n" * 3)
    doc = get_json(srv, "/stats.json?period=600")
    assert doc["counters"]["cmd_set"] - before == 3
    assert doc["metrics"][f"q/{qname}/set_latency_usec"]["count"] == 3
    assert doc["gauges"][f"q/{qname}/items"] == 3  # gauges are values, not deltas
    assert get_json(srv, "/stats.json")["counters"]["cmd_set"] > doc["counters"]["cmd_set"]
    for bad in ("0", "-5", "x", "100000"):
        status, body, _ = http(srv, f"/stats.json?period={bad}")
        assert (status, json.loads(body)) == (400, {"error": "period must be 1-3600 seconds"})


def test_prometheus_metrics_parse(srv: ServerProcess, qname: str) -> None:
    raw = Raw(srv.connect())
    raw.call(set_cmd(qname, b"hello"), b"STORED\r\n")
    status, body, ctype = http(srv, "/metrics")
    assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert all(name.startswith("tercel_") for name in families)
    cmd_set = families["tercel_cmd_set"]
    assert cmd_set.type == "counter" and cmd_set.samples[0].value >= 1
    items = {s.labels["queue"]: s.value for s in families["tercel_items"].samples}
    assert items[qname] == 1
    assert families["tercel_items"].type == "gauge"
    latency = families["tercel_set_latency_usec"]
    assert latency.type == "summary"
    mine = [s for s in latency.samples if s.labels.get("queue") == qname]
    by_name = {(s.name, s.labels.get("quantile")): s.value for s in mine}
    assert by_name[("tercel_set_latency_usec_count", None)] == 1
    assert {q for (_, q) in by_name if q} == {
        "0.25",
        "0.5",
        "0.75",
        "0.9",
        "0.95",
        "0.99",
        "0.999",
        "0.9999",
    }
    assert families["tercel_status_writeable"].samples[0].value == 1
    # One family per stat: no family appears twice.
    names = [ln.split()[2] for ln in body.decode().splitlines() if ln.startswith("# TYPE")]
    assert len(names) == len(set(names))


def test_server_info(srv: ServerProcess) -> None:
    info = get_json(srv, "/server_info")
    assert info["name"] == "tercel" and info["status"] == "UP"
    assert info["ports"] == srv.ports
    assert info["uptime"] >= 0 and info["start_time"].endswith("Z")
    assert info["compiled_modules"] == native.compiled_modules()  # the same tree as the server


# ---- mutating endpoints (their own servers) ------------------------------------------------


def test_status_endpoint(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data") as srv:
        raw = Raw(srv.connect())
        assert get_json(srv, "/status/ReadOnly", "POST") == {"response": "ok", "status": "READONLY"}
        assert get_json(srv, "/status") == {"status": "READONLY"}
        raw.call(b"status\r\n", b"READONLY\r\n")
        raw.call(set_cmd("q", b"x"), b"SERVER_ERROR server is READONLY: writes are refused\r\n")
        doc = get_json(srv, "/stats.json")
        assert (doc["gauges"]["status/writeable"], doc["labels"]["status"]) == (0, "READONLY")
        status, body, _ = http(srv, "/status/down", "POST")
        assert (status, json.loads(body)) == (400, {"error": "status DOWN cannot be set"})
        assert get_json(srv, "/status/up", "POST")["status"] == "UP"
        raw.call(set_cmd("q", b"x"), b"STORED\r\n")
        assert (srv.data_dir / ".status").read_text() == "Up\n"


def test_reload_endpoint_good_and_bad(tmp_path: Path) -> None:
    path = tmp_path / "tercel.toml"
    path.write_text("[queues.q]\nmax_items = 1\n")
    with ServerProcess(tmp_path / "data", extra_args=("--config", str(path))) as srv:
        raw = Raw(srv.connect())
        raw.call(set_cmd("q", b"1") + set_cmd("q", b"2"), b"STORED\r\nNOT_STORED\r\n")
        path.write_text("[queues.q]\nmax_items = 2\n")
        assert get_json(srv, "/reload", "POST") == {"response": "ok"}
        raw.call(set_cmd("q", b"2"), b"STORED\r\n")
        path.write_text("[queues.q]\nmax_items = 3\nbogus = 1\n")
        status, body, _ = http(srv, "/reload", "POST")
        assert status == 400
        assert json.loads(body) == {"error": "reload refused: queues.q: unknown key 'bogus'"}
        raw.call(set_cmd("q", b"3"), b"NOT_STORED\r\n")  # the old limit stays


def test_shutdown_endpoint_answers_then_stops(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "data").start()
    try:
        raw = Raw(srv.connect())
        raw.call(set_cmd("q", b"kept"), b"STORED\r\n")
        assert get_json(srv, "/shutdown", "POST") == {"response": "ok"}
        assert srv.wait() == 0
        srv.start()
        raw = Raw(srv.connect())
        raw.call(b"get q\r\n", b"VALUE q 0 4\r\nkept\r\nEND\r\n")
    finally:
        srv.kill()


def test_admin_can_be_turned_off(tmp_path: Path) -> None:
    config = "[server]\nadmin_port = false\n"
    with ServerProcess(tmp_path / "data", config, admin_port=None) as srv:
        assert "admin" not in srv.ports


# ---- in-process: histograms and windows ----------------------------------------------------


def test_buckets_cover_every_value_once_and_stay_narrow() -> None:
    previous_high = -1
    for idx in range(BUCKETS - 1):
        low, high = bucket_bounds(idx)
        assert low == previous_high + 1
        assert bucket_index(low) == bucket_index(high) == idx
        assert high - low + 1 <= max(1, low // 8)  # at most 12.5% wide
        previous_high = high
    assert bucket_index(-3) == 0
    assert bucket_index(2**40) == BUCKETS - 1


def test_percentiles_are_within_the_bucket_error() -> None:
    rng = random.Random(4)
    values = sorted(int(rng.lognormvariate(6, 1.5)) for _ in range(20_000))
    h = LogHistogram()
    for v in values:
        h.add(v)
    assert (h.count, h.sum) == (len(values), sum(values))
    for p in (0.25, 0.5, 0.9, 0.99, 0.999):
        exact = values[round(p * len(values)) - 1]
        assert abs(h.percentile(p) - exact) <= max(1, exact * 0.07), p
    assert LogHistogram().summary()["p99"] == 0


def test_histogram_deltas() -> None:
    h = LogHistogram()
    h.add(5)
    before = h.copy()
    h.add(1000)
    h.add(1000)
    delta = h.minus(before)
    assert (delta.count, delta.sum) == (2, 2000)
    assert 990 <= delta.percentile(0.5) <= 1010


def test_histograms_hold_buckets_only_up_to_their_highest_sample() -> None:
    """A histogram's counts stop at its highest bucket with a sample (a few hundred bytes
    for a queue with a few µs-latency samples, not every bucket); merges and deltas of
    histograms of different lengths count like full ones."""
    small, large = LogHistogram(), LogHistogram()
    small.add(3)
    small.add(40)
    assert len(small.counts) == bucket_index(40) + 1
    large.add(2**40)
    assert len(large.counts) == BUCKETS
    total = LogHistogram()
    total.merge(small)
    total.merge(large)
    total.merge(small)
    assert (total.count, total.sum) == (5, 2 * 43 + 2**40)
    assert total.summary()["maximum"] == bucket_bounds(BUCKETS - 1)[1]
    assert total.summary()["minimum"] == 3
    before = small.copy()
    small.add(2**20)
    delta = small.minus(before)
    assert (delta.count, delta.sum) == (1, 2**20)
    assert len(delta.counts) == len(small.counts) == bucket_index(2**20) + 1


def test_period_collector_latches_windows() -> None:
    state = {"n": 0}

    def take() -> Snapshot:
        snap = Snapshot()
        snap.counters["cmd_set"] = state["n"]
        snap.gauges["items"] = state["n"] * 10
        return snap

    collector = PeriodCollector(take)
    state["n"] = 3
    assert collector.report().counters == {"cmd_set": 3}  # the first window, still open
    collector.latch()  # window 1 closed: 3 sets
    state["n"] = 10
    assert collector.report().counters == {"cmd_set": 3}
    assert collector.report().gauges == {"items": 30}
    collector.latch()  # window 2 closed: 7 sets
    assert (collector.report().counters, collector.report().gauges) == (
        {"cmd_set": 7},
        {"items": 100},
    )


# ---- what a web page must not do with the admin port (issue 21 item 6) ----------------------


def raw_http(srv: ServerProcess, request: bytes) -> bytes:
    """The status line of the answer to a hand-written request."""
    with socket.create_connection(("127.0.0.1", srv.ports["admin"]), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer.split(b"\r\n", 1)[0]


def post(path: str, *headers: bytes) -> bytes:
    return b"POST %s HTTP/1.1\r\n%sContent-Length: 0\r\n\r\n" % (
        path.encode(),
        b"".join(h + b"\r\n" for h in headers),
    )


def test_foreign_host_origin_and_simple_content_types_are_refused(tmp_path: Path) -> None:
    with ServerProcess(tmp_path) as srv:
        port = srv.ports["admin"]
        own = b"Host: 127.0.0.1:%d" % port
        ping = b"GET /ping HTTP/1.1\r\n%s\r\n\r\n"
        assert raw_http(srv, ping % b"Host: evil.example") == b"HTTP/1.1 421 Misdirected Request"
        assert raw_http(srv, ping % own) == b"HTTP/1.1 200 OK"
        assert raw_http(srv, ping % b"Host: localhost:%d" % port) == b"HTTP/1.1 200 OK"
        shutdown = post("/shutdown", own, b"Origin: http://evil.example")
        assert raw_http(srv, shutdown) == b"HTTP/1.1 403 Forbidden"
        shutdown = post("/shutdown", own, b"Content-Type: text/plain")
        assert raw_http(srv, shutdown) == b"HTTP/1.1 415 Unsupported Media Type"
        shutdown = post("/shutdown", own, b"Content-Type: application/x-www-form-urlencoded")
        assert raw_http(srv, shutdown) == b"HTTP/1.1 415 Unsupported Media Type"
        assert srv.running
        for foreign in (b"http://localhost:9", b"http://127.0.0.1", b"https://127.0.0.1:%d"):
            shutdown = post("/shutdown", own, b"Origin: " + foreign.replace(b"%d", b"%d" % port))
            assert raw_http(srv, shutdown) == b"HTTP/1.1 403 Forbidden", foreign
        assert srv.running
        same_origin = post("/status/up", own, b"Origin: http://127.0.0.1:%d" % port)
        assert raw_http(srv, same_origin) == b"HTTP/1.1 200 OK"
        same_origin = post("/status/up", own, b"Origin: http://localhost:%d" % port)
        assert raw_http(srv, same_origin) == b"HTTP/1.1 200 OK"
        log = srv.log()
        assert log.count("admin: refused") == 7 and "Traceback" not in log


def test_a_refused_path_cannot_forge_a_log_line(tmp_path: Path) -> None:
    """The refusal line quotes the decoded path: ``%0a`` cannot start a line of its own."""
    with ServerProcess(tmp_path) as srv:
        forged = "/x%0a%0dWARNING%20tercel:%20forged%1b[2J"
        request = post(forged, b"Host: 127.0.0.1", b"Origin: http://evil.example")
        assert raw_http(srv, request) == b"HTTP/1.1 403 Forbidden"
        log = srv.log()
        assert "admin: refused POST /x\\n\\rWARNING tercel: forged\\x1b[2J" in log
        assert not any(line.startswith("WARNING tercel: forged") for line in log.splitlines())
        assert "\x1b" not in log


def test_malformed_requests_get_a_status_and_no_traceback(tmp_path: Path) -> None:
    with ServerProcess(tmp_path) as srv:
        for request in (
            b"GARBAGE\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: abc\r\n\r\n",
            b"\x00\x01\x02\r\n\r\n",
            b"GET /stats.json?period=%ff HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        ):
            assert raw_http(srv, request).split(b" ")[1] == b"400", request
        assert "Traceback" not in srv.log()
        assert srv.running


def test_admin_token_guards_every_post(tmp_path: Path) -> None:
    config = '[server]\nadmin_token = "s3cret-token"\n'
    with ServerProcess(tmp_path, config) as srv:
        own = b"Host: 127.0.0.1"
        assert raw_http(srv, post("/status/up", own)) == b"HTTP/1.1 401 Unauthorized"
        wrong = b"Authorization: Bearer nope"
        assert raw_http(srv, post("/status/up", own, wrong)) == b"HTTP/1.1 401 Unauthorized"
        right = b"Authorization: Bearer s3cret-token"
        assert raw_http(srv, post("/status/up", own, right)) == b"HTTP/1.1 200 OK"
        assert get_json(srv, "/ping") == {"response": "pong"}  # reads need no token


def test_the_token_is_required_beyond_loopback_and_names_can_be_added() -> None:
    with pytest.raises(ConfigError, match="admin_token"):
        Guard(ServerSettings(host="0.0.0.0"))
    guard = Guard(
        ServerSettings(host="0.0.0.0", admin_token="abcdefgh", admin_hosts=("q.example",))
    )
    assert guard.host_ok("10.1.2.3:2223") and guard.host_ok("[::1]:2223")  # any IP literal
    assert guard.host_ok("Q.example:2223") and not guard.host_ok("evil.example")
    loopback = Guard(ServerSettings())
    assert loopback.host_ok("localhost") and loopback.host_ok("127.0.0.1:1")
    assert not loopback.host_ok("10.1.2.3") and not loopback.host_ok("rebind.example:2223")


def test_memcache_stats_json_and_metrics_render_one_snapshot(tmp_path: Path) -> None:
    """``mem_items``/``mem_bytes`` are the in-memory part (not the queue totals) everywhere, and
    each front end's counters appear under its name."""
    config = '[queues]\nmax_memory_size = "1KB"\n'
    with ServerProcess(tmp_path, config) as srv:
        raw = Raw(srv.connect())
        raw.call(b"".join(set_cmd("rb", b"x" * 100) for _ in range(30)), b"STORED\r\n" * 30)
        raw.send(b"stats\r\n")
        lines = {}
        while (line := raw.read_line()) != b"END\r\n":
            _, key, value = line.decode().split(" ", 2)
            lines[key] = value.strip()
        mem_items, mem_bytes = int(lines["queue_rb_mem_items"]), int(lines["queue_rb_mem_bytes"])
        assert int(lines["queue_rb_items"]) == 30 and 0 < mem_items < 30  # read-behind
        assert mem_bytes == 100 * mem_items
        assert lines["memcache_curr_connections"] == "1"
        doc = get_json(srv, "/stats.json")
        assert doc["gauges"]["q/rb/items"] == 30
        assert (doc["gauges"]["q/rb/mem_items"], doc["gauges"]["q/rb/mem_bytes"]) == (
            mem_items,
            mem_bytes,
        )
        assert doc["counters"]["memcache/total_connections"] >= 1
        text = http(srv, "/metrics")[1].decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        sample = [s for s in families["tercel_mem_items"].samples if s.labels["queue"] == "rb"]
        assert [s.value for s in sample] == [mem_items]


# ---- every figure where its one declaration says (issue 31 §5) -----------------------------


def bs_call(sock: socket.socket, request: bytes) -> list[str]:
    """A beanstalkd ``stats``-like answer's ``key: value`` lines, or the reply line."""
    sock.sendall(request)
    data = b""
    while b"\r\n" not in data:
        data += sock.recv(65536)
    head, rest = data.split(b"\r\n", 1)
    if not head.startswith(b"OK "):
        return [head.decode()]
    size = int(head.split()[1])
    while len(rest) < size + 2:
        rest += sock.recv(65536)
    return rest[:size].decode().splitlines()[1:]  # (after "---")


def test_every_figure_is_shown_where_its_declaration_says(tmp_path: Path) -> None:
    """The declarations (``server/stats.py``, ``server/beanstalk/service.py``) are the only
    lists: each figure is on memcache ``stats``, beanstalkd ``stats``/``stats-tube``,
    ``/stats.json`` (in its kind's group), ``/metrics`` (with its kind's type and its help)
    and ``/dashboard.json`` exactly where it says, and nothing else is."""
    with ServerProcess(tmp_path, extra_args=("--beanstalk-port", "0")) as srv:
        raw = Raw(srv.connect())
        raw.call(set_cmd("fq", b"abc"), b"STORED\r\n")
        with socket.create_connection(("127.0.0.1", srv.ports["beanstalk"]), timeout=10) as b:
            assert bs_call(b, b"use ft\r\n") == ["USING ft"]
            assert bs_call(b, b"put 1 0 60 2\r\nhi\r\n") == ["INSERTED 1"]
            bs_keys = [ln.split(": ", 1)[0] for ln in bs_call(b, b"stats\r\n")]
            tube_keys = [ln.split(": ", 1)[0] for ln in bs_call(b, b"stats-tube ft\r\n")]
        assert bs_keys == [f.name for f in bsvc.SERVER_FIGURES if f.wire and not f.omit_zero]
        assert tube_keys == [f.name for f in bsvc.TUBE_FIGURES if f.wire]

        lines = list(support_stats(raw))
        wire_server = [f.name for f in kf.SERVER if f.wire]
        assert lines[: len(wire_server)] == wire_server
        queue_lines = [k.removeprefix("queue_fq_") for k in lines if k.startswith("queue_fq_")]
        assert queue_lines == [f.name for f in kf.QUEUE if f.wire and not f.omit_zero]
        fe_lines = {k.removeprefix("beanstalk_") for k in lines if k.startswith("beanstalk_")}
        declared_fe = {
            f.admin_name for f in (*bsvc.SERVER_FIGURES, *figures.CONNECTIONS) if not f.omit_zero
        }
        assert fe_lines == declared_fe - {None}

        doc = get_json(srv, "/stats.json")
        group = {COUNTER: "counters", GAUGE: "gauges", LABEL: "labels"}
        expected: dict[str, set[str]] = {"counters": set(), "gauges": set(), "labels": set()}
        for f in kf.SERVER:
            if f.admin_name is not None:
                expected[group[f.kind]].add(f.admin_name)
        for f in kf.QUEUE:
            if f.admin_name is not None and not f.omit_zero:
                expected[group[f.kind]].add(f"q/fq/{f.admin_name}")
        for f in (*bsvc.SERVER_FIGURES, *figures.CONNECTIONS):
            if f.admin_name is not None and not f.omit_zero:
                expected[group[f.kind]].add(f"beanstalk/{f.admin_name}")
        for f in bsvc.TUBE_FIGURES:
            if f.admin_name is not None:
                expected[group[f.kind]].add(f"beanstalk/tube/ft/{f.admin_name}")
        for name in ("memcache/curr_connections", "memcache/total_connections"):
            expected[group[GAUGE if "curr" in name else COUNTER]].add(name)
        for g, keys in expected.items():
            mine = {k for k in doc[g] if "/default/" not in k}  # (beanstalkd's default tube)
            assert mine == keys, g

        text = http(srv, "/metrics")[1].decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        for f in (*kf.SERVER, *kf.QUEUE):
            if f.admin_name is None or f.kind is LABEL or f.omit_zero:
                continue
            fam = families["tercel_" + f.admin_name.replace("/", "_")]
            assert fam.type == f.kind.value, f.name
            if f in kf.QUEUE or f.admin_name not in {q.admin_name for q in kf.QUEUE}:
                assert fam.documentation == f.help, f.name

        dash = get_json(srv, "/dashboard.json")
        server_keys = {f.dashboard for f in kf.SERVER if f.dashboard is not None}
        assert set(dash["server"]) == server_keys | {"in_per_s", "out_per_s", "auth"}
        (row,) = [r for r in dash["queues"] if r["name"] == "fq"]
        queue_keys = {f.dashboard for f in kf.QUEUE if f.dashboard is not None}
        assert set(row) == queue_keys | {"name", "in_per_s", "out_per_s", "history"}


def support_stats(raw: Raw) -> Iterator[str]:
    """The names of memcache ``stats``' lines, in order."""
    raw.send(b"stats\r\n")
    while (line := raw.read_line()) != b"END\r\n":
        yield line.decode().split(" ", 2)[1]
