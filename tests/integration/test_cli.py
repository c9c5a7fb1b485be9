"""``tercel put|get|peek|queues|flush|delete|status`` as a shell runs them, against real servers."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from support import Raw, drain
from tercel import exit_codes, native
from tercel.cli_client import format_queues, human_bytes, human_ms, queue_rows
from tercel.testing import ServerProcess

Tercel = Callable[..., subprocess.CompletedProcess[bytes]]


def runner(*servers: ServerProcess) -> Tercel:
    """``tercel VERB --server ... ARGS`` as a subprocess, stdin from ``stdin``."""

    def tercel(verb: str, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
        where = [a for s in servers for a in ("--server", s.address)]
        cmd = [sys.executable, "-m", "tercel", verb, *where, *args]
        return subprocess.run(cmd, input=stdin, capture_output=True, timeout=60, check=False)

    return tercel


@pytest.fixture
def tercel(server: ServerProcess) -> Tercel:
    return runner(server)


def test_put_file_and_nul_separated_items_keep_their_newlines(
    tercel: Tercel, raw: Raw, qname: str, tmp_path: Path
) -> None:
    payload = b"line one\nline two\r\n\x00binary\xff"
    (tmp_path / "item").write_bytes(payload)
    assert tercel("put", qname, "--file", str(tmp_path / "item")).returncode == 0
    assert tercel("put", qname, "-0", stdin=b"a\nb\x00c\x00").returncode == 0
    assert tercel("put", qname, "--null", stdin=b"x\x00\x00y").returncode == 0  # no final NUL
    assert tercel("put", qname, "--file", "-", stdin=b"whole\nstdin").returncode == 0
    assert tercel("put", qname, stdin=b"l1\r\nl2\n").returncode == 0
    expected = [payload, b"a\nb", b"c", b"x", b"", b"y", b"whole\nstdin", b"l1", b"l2"]
    assert drain(raw, qname) == expected
    missing = tercel("put", qname, "--file", str(tmp_path / "nosuch"))
    assert missing.returncode == exit_codes.FAILED and b"nosuch" in missing.stderr


def test_get_and_peek_of_an_empty_queue_exit_with_their_own_code(
    server: ServerProcess, tercel: Tercel, raw: Raw, qname: str
) -> None:
    assert exit_codes.EMPTY not in (
        exit_codes.OK,
        exit_codes.FAILED,
        exit_codes.USAGE,
        exit_codes.CORRUPT,
        exit_codes.INTERRUPTED,
    )
    peek = tercel("peek", qname)
    assert (peek.returncode, peek.stdout) == (exit_codes.EMPTY, b"")
    # the peek created nothing: no queue in dump_stats, no journal file
    raw.call(
        b"dump_stats %s\r\n" % qname.encode(), b"queue '%s' {\r\n}\r\nEND\r\n" % qname.encode()
    )
    assert not list(server.data_dir.glob(f"{qname}*"))
    assert tercel("get", qname).returncode == exit_codes.EMPTY
    assert tercel("get", qname, "--wait", "0.1").returncode == exit_codes.EMPTY
    assert tercel("put", qname, "one").returncode == exit_codes.OK
    assert tercel("get", qname, "-n", "2").returncode == exit_codes.OK  # one of two is found
    assert tercel("get", qname, "-n", "2").returncode == exit_codes.EMPTY  # not even one
    usage = tercel("status", "sideways")
    assert usage.returncode == exit_codes.USAGE


def test_get_n_prints_what_it_found_and_raw_writes_bytes_exactly(
    tercel: Tercel, qname: str
) -> None:
    assert tercel("put", qname, "a", "b").returncode == 0
    some = tercel("get", qname, "-n", "5")
    assert (some.returncode, some.stdout) == (exit_codes.OK, b"a\nb\n")
    binary = b"\x00\xff\nend"
    for _ in range(3):
        assert tercel("put", qname, "--file", "-", stdin=binary).returncode == 0
    peeked = tercel("peek", qname, "--raw")
    assert (peeked.returncode, peeked.stdout) == (0, binary)
    assert tercel("get", qname, "--raw").stdout == binary  # no newline added
    assert tercel("get", qname, "-n", "2", "-0").stdout == binary + b"\0" + binary + b"\0"
    both = tercel("get", qname, "--raw", "-0")
    assert both.returncode == exit_codes.USAGE


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("a/b", b"'/' separates Kestrel's get options"),
        ("../x", b"A-Z a-z 0-9 _ - : $ %"),
        ("caf\u00e9", b"bad queue name"),
        ("a b", b"bad queue name 'a b'"),
    ],
)
def test_a_bad_queue_name_is_a_usage_error_that_states_the_rule(
    tercel: Tercel, name: str, says: bytes
) -> None:
    for verb in ("get", "put", "peek", "flush", "delete", "tail"):
        done = tercel(verb, name, *(["x"] if verb == "put" else []))
        assert done.returncode == exit_codes.USAGE, (verb, done.stderr)
        assert says in done.stderr and b"name b'" not in done.stderr  # no bytes repr
        assert b"Traceback" not in done.stderr


def test_flush_and_delete_of_a_missing_queue_say_so(tercel: Tercel, qname: str) -> None:
    for verb in ("flush", "delete"):
        missing = tercel(verb, qname + "_nope")
        assert missing.returncode == exit_codes.EMPTY
        assert f"no queue '{qname}_nope' on any server".encode() in missing.stderr
    assert tercel("put", qname, "x").returncode == 0
    partly = tercel("flush", qname, qname + "_nope")
    assert partly.returncode == exit_codes.EMPTY  # the one that exists is flushed all the same
    assert f"flushed {qname}\n".encode() in partly.stderr
    assert tercel("get", qname).returncode == exit_codes.EMPTY
    gone = tercel("delete", qname)
    assert gone.returncode == exit_codes.OK and f"deleted {qname}".encode() in gone.stderr


def test_queues_table_and_json(tercel: Tercel, qname: str) -> None:
    other = qname + "_b"
    assert tercel("put", qname, "a" * 100, "b").returncode == 0
    assert tercel("put", other, "c").returncode == 0
    assert tercel("get", other).returncode == 0
    out = tercel("queues", "--json", "--interval", "0.2")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    rows = {r["queue"]: r for r in doc["queues"]}
    assert rows[qname]["items"] == 2 and rows[qname]["bytes"] == 101
    assert rows[other]["items"] == 0
    assert rows[qname]["in_per_s"] >= 0 and rows[qname]["out_per_s"] >= 0
    table = tercel("queues", "--interval", "0").stdout.decode().splitlines()
    assert table[0].split()[:3] == ["queue", "items", "bytes"]
    line = next(t for t in table if t.startswith(qname + " "))
    assert line.split()[1:4] == ["2", "101", "B"]
    assert line.split()[-2:] == ["-", "-"]  # no rates without a second sample


def test_queue_rows_rates_from_two_samples() -> None:
    before = {"s1": {"q": {"items": "10", "total_items": "100"}, "gone": {"items": "5"}}}
    after = {
        "s1": {
            "q": {"items": "4", "total_items": "120", "bytes": "40", "age": "1500"},
            "new": {"items": "3", "total_items": "3", "open_transactions": "1"},
        },
        "s2": {"q": {"items": "1", "total_items": "1", "open_leases": "2", "waiters": "1"}},
    }
    rows = queue_rows(before, after, 2.0)
    got = {(r.server, r.queue): r for r in rows}
    assert [(r.server, r.queue) for r in rows] == [("s1", "new"), ("s1", "q"), ("s2", "q")]
    q = got[("s1", "q")]
    assert (q.in_per_s, q.out_per_s) == (10.0, 13.0)  # 20 added, items fell by 6: 26 left
    assert (q.bytes, q.last_taken_age_ms) == (40, 1500)
    assert (got[("s1", "new")].in_per_s, got[("s1", "new")].open) == (1.5, 1)
    assert (got[("s2", "q")].open, got[("s2", "q")].waiters) == (2, 1)
    # a queue deleted and recreated between the samples: its total fell, no negative rate
    again = queue_rows({"s": {"q": {"items": "9", "total_items": "50"}}}, {"s": {"q": {}}}, 1.0)
    assert (again[0].in_per_s, again[0].out_per_s) == (0.0, 9.0)
    assert queue_rows(None, after, 0.0)[0].in_per_s is None
    table = list(format_queues(rows))
    assert table[0].split()[0] == "server" and len(table) == 4
    assert human_bytes(100) == "100 B" and human_bytes(3 * 1024**3) == "3 GiB"
    assert human_ms(850) == "850ms" and human_ms(90_000) == "1.5m"


def test_flush_delete_and_status(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "a") as a, ServerProcess(tmp_path / "b") as b:
        both, one = runner(a, b), runner(a)
        assert both("put", "jobs", "x", "y", "z").returncode == 0  # spread over a and b
        assert both("put", "keep", "k").returncode == 0
        assert both("flush", "jobs").returncode == 0
        doc = json.loads(both("queues", "--json", "--interval", "0").stdout)
        assert sorted(doc["servers"]) == sorted([a.address, b.address])
        assert {r["queue"]: r["items"] for r in doc["queues"] if r["items"]} == {"keep": 1}
        assert both("delete", "jobs", "keep").returncode == 0
        assert json.loads(both("queues", "--json", "--interval", "0").stdout)["queues"] == []
        assert both("queues").stdout == b"(no queues)\n"

        assert one("status").stdout == b"UP\n"
        assert both("status", "readonly").returncode == 0
        lines = both("status").stdout.decode().splitlines()
        assert sorted(lines) == sorted([f"{a.address} READONLY", f"{b.address} READONLY"])
        refused = one("put", "jobs", "x")
        assert refused.returncode == exit_codes.FAILED and b"READONLY" in refused.stderr
        assert one("status", "Quiescent").returncode == 0
        assert one("get", "jobs").returncode == exit_codes.FAILED  # refused, not empty
        a.kill()  # the status survives a kill -9
        a.start()
        assert one("status").stdout == b"QUIESCENT\n"
        assert both("status", "UP").returncode == 0
        assert both("put", "jobs", "x").returncode == 0


def test_serve_says_which_build_runs_and_logs_the_replay(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "d", log_level="info") as srv:
        runner(srv)("put", "a", "1", "2")
        runner(srv)("put", "b", "3")
        srv.restart()
        log = srv.log()
    build = "compiled build: " if native.compiled_modules() else "pure-Python build: about 0.6x"
    assert build in log
    assert "replaying 2 queue(s) from" in log
    assert "replayed 2 queue(s), 3 items in" in log
    ready = f"ready: memcache {srv.address}, admin 127.0.0.1:{srv.ports['admin']}; dashboard "
    assert ready in log and f"tercel get jobs --server {srv.address}\n" in log


@pytest.mark.parametrize("address", ["127.0.0.1:abc", "[::1]:x"])
def test_a_bad_server_address_is_a_usage_error_not_a_traceback(address: str) -> None:
    for verb in ("queues", "status", "flush"):
        args = [sys.executable, "-m", "tercel", verb, "--server", address]
        done = subprocess.run(
            [*args, "q"] if verb == "flush" else args, capture_output=True, check=False
        )
        assert done.returncode == exit_codes.USAGE, done.stderr
        assert b"Traceback" not in done.stderr
        assert b"bad server address" in done.stderr
