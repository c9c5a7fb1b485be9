"""Users, passwords and permissions on every port, against a real server (docs/operations.md,
"Users and permissions"): logins (memcached's ASCII convention on memcache, ``auth`` on the
text and beanstalk ports, the ``auth`` method on Thrift, Basic on the admin port), refusals
before a login and outside a user's permissions, limits, rate-limited failures, audit
counters, reload, the clients' credentials, and no password or payload in the log."""

from __future__ import annotations

import base64
import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import thriftpy2
from thriftpy2.thrift import TApplicationException

from support import Raw, set_cmd, stats, text_connection, thrift_client, track
from tercel.client import Client
from tercel.config import ConfigError, parse_config
from tercel.errors import ServerReplyError
from tercel.passwords import hash_password, verify_password
from tercel.protocol.thrift import IDL_PATH
from tercel.testing import ServerProcess

IDL = thriftpy2.load(IDL_PATH, module_name="auth_kestrel_thrift")
FAST = 16
"""scrypt's n for the tests' hashes: the format and the checks are the same, the cost tiny."""
PASSWORDS = {"alice": "alice-pw-7", "root": "root-pw-7", "lim": "lim-pw-7", "bob": "bob-pw-7"}
SECRET_PAYLOAD = b"payload-never-logged"


def user_table(name: str, **keys: Any) -> str:
    lines = [f"[users.{name}]", f'password = "{hash_password(PASSWORDS[name], FAST)}"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in keys.items()]
    return "\n".join(lines) + "\n"


def config(users_file: Path | None = None) -> str:
    text = "[server]\ntext_port = 0\nthrift_port = 0\nbeanstalk_port = 0\n"
    if users_file is not None:
        text += f'[users]\nfile = "{users_file}"\n'
    text += user_table("alice", put=["jobs-*"], take=["jobs-*", "*+spy"])
    text += user_table("root", put=["*"], take=["*"], manage=["*"])
    text += user_table("lim", put=["lim-*"], take=["lim-*"], max_items=2, max_connections=1)
    return text


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess(tmp_path_factory.mktemp("data"), config()) as s:
        yield s


def mc(srv: ServerProcess, user: str | None = None) -> Raw:
    conn = Raw(srv.connect())
    if user is not None:
        login(conn, user, PASSWORDS[user])
    return conn


def login(conn: Raw, user: str, password: str, reply: bytes = b"STORED\r\n") -> None:
    conn.call(set_cmd("anykey", f"{user} {password}".encode()), reply)


def line(conn: Raw, request: bytes) -> bytes:
    conn.send(request)
    return conn.read_line()


# ---- passwords and the config -------------------------------------------------------------


def test_hashes_are_salted_self_describing_and_checked() -> None:
    a, b = hash_password("pw", FAST), hash_password("pw", FAST)
    assert a != b and a.startswith(f"scrypt${FAST}$8$1$")
    assert verify_password(b"pw", a) and not verify_password(b"pw2", a)
    assert not verify_password(b"pw", "scrypt$16$8$1$bad")


def test_config_refuses_plain_passwords_and_unknown_keys() -> None:
    with pytest.raises(ConfigError, match=r"users.a.password: expected scrypt"):
        parse_config({"users": {"a": {"password": "secret"}}})
    with pytest.raises(ConfigError, match="did you mean take"):
        parse_config({"users": {"a": {"password": hash_password("x", FAST), "takes": ["q"]}}})
    cfg = parse_config({"users": {"a": {"password": hash_password("x", FAST)}}})
    assert cfg.users["a"].put == () and cfg.users["a"].manage == ()  # least privilege


def test_passwd_command_reads_stdin_never_argv(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "tercel", "passwd", "--cost", "16"],
        input=b"s3cret\n",
        capture_output=True,
        check=True,
    )
    stored = out.stdout.decode().strip()
    assert verify_password(b"s3cret", stored) and b"s3cret" not in out.stdout


# ---- memcache: memcached's ASCII authentication ---------------------------------------------


def test_memcache_nothing_before_login(srv: ServerProcess) -> None:
    c = mc(srv)
    for request in (b"get jobs-a\r\n", b"stats\r\n", b"version\r\n", b"flush_all\r\n"):
        assert line(c, request) == b"CLIENT_ERROR unauthenticated\r\n"
    assert line(c, set_cmd("k", b"no-space")) == b"CLIENT_ERROR bad authentication token format\r\n"
    login(c, "alice", "wrong", b"CLIENT_ERROR authentication failure\r\n")
    login(c, "nobody", "x", b"CLIENT_ERROR authentication failure\r\n")
    login(c, "alice", PASSWORDS["alice"])  # after other commands and failures: still works
    c.call(set_cmd("jobs-a", b"x"), b"STORED\r\n")
    c.call(b"get jobs-a\r\n", b"VALUE jobs-a 0 1\r\nx\r\nEND\r\n")


def test_memcache_permissions(srv: ServerProcess) -> None:
    c = mc(srv, "alice")
    refused = {
        set_cmd("other", b"x"): "set: put to 'other'",
        b"get other\r\n": "get: take from 'other'",
        b"get other/open\r\n": "get: take from 'other'",
        b"get other/peek\r\n": "get: take from 'other'",
        b"lease other 1 0 1000\r\n": "lease: take from 'other'",
        b"ack other 1\r\n": "ack: take from 'other'",
        b"monitor other 1\r\n": "monitor: take from 'other'",
        b"flush jobs-a\r\n": "flush: manage 'jobs-a'",
        b"delete jobs-a\r\n": "delete: manage 'jobs-a'",
        b"flush_expired jobs-a\r\n": "flush_expired: manage 'jobs-a'",
        b"flush_all\r\n": "flush_all",
        b"flush_all_expired\r\n": "flush_all_expired",
        b"status READONLY\r\n": "status",
        b"reload\r\n": "reload",
        b"dump_config\r\n": "dump_config",
        b"shutdown\r\n": "shutdown",
        # attaching a fanout child needs take on its parent
        b"get orders+spy\r\n": "get: take from 'orders'",
    }
    for request, what in refused.items():
        assert line(c, request) == f"CLIENT_ERROR permission denied: {what}\r\n".encode()
    # the connection stays open and allowed commands still run
    c.call(b"status\r\n", b"UP\r\n")
    c.call(b"get jobs-a+spy\r\n", b"END\r\n")
    assert "curr_items" in stats(c)
    root = mc(srv, "root")
    root.call(b"flush other\r\n", b"END\r\n")
    root.call(b"status UP\r\n", b"END\r\n")


def test_pymemcache_logs_in_with_a_plain_set(srv: ServerProcess) -> None:
    from pymemcache.client.base import Client as PyMemcache

    client = track(PyMemcache(("127.0.0.1", srv.port), timeout=10))
    assert client.set("auth", f"alice {PASSWORDS['alice']}".encode(), noreply=False)
    assert client.set("jobs-py", b"hello", noreply=False)
    assert client.get("jobs-py") == b"hello"


def test_limits(srv: ServerProcess) -> None:
    first = mc(srv, "lim")
    second = mc(srv)
    login(
        second,
        "lim",
        PASSWORDS["lim"],
        b"CLIENT_ERROR authentication failure: user has its 1 connections (max_connections)\r\n",
    )
    first.call(set_cmd("lim-a", b"1") + set_cmd("lim-b", b"2"), b"STORED\r\nSTORED\r\n")
    assert line(first, set_cmd("lim-a", b"3")) == (
        b"CLIENT_ERROR user limit reached: 2 items held (max_items 2)\r\n"
    )
    first.call(b"get lim-a\r\n", b"VALUE lim-a 0 1\r\n1\r\nEND\r\n")  # taken: room again
    first.call(set_cmd("lim-a", b"3"), b"STORED\r\n")
    first.send(b"quit\r\n")
    assert first.closed()  # the server closed it: its user's connection is counted out
    login(second, "lim", PASSWORDS["lim"])  # its one connection is free again


# ---- the text port ----------------------------------------------------------------------------


def test_text_auth_and_permissions(srv: ServerProcess) -> None:
    t = text_connection(srv.ports["text"])
    t.call(b"get jobs-a\n", b"-Unauthenticated: auth <user> <password> first")
    t.call(b"version\n", b"-Unauthenticated: auth <user> <password> first")
    t.call(b"auth alice nope\n", b"-Authentication failure: authentication failure")
    t.call(b"auth alice\n", b"-Usage: auth <user> <password>")
    t.call(f"auth alice {PASSWORDS['alice']}\n".encode(), b"+0")
    t.call(b"put jobs-t:\nitem\n\n", b"+1")
    t.call(b"get jobs-t\n", b":item")
    t.call(b"put other:\nitem\n\n", b"-Permission denied: put: put to 'other'")
    for request, what in (
        (b"get other\n", b"get: take from 'other'"),
        (b"peek other\n", b"peek: take from 'other'"),
        (b"monitor other 1\n", b"monitor: take from 'other'"),
        (b"confirm other 1\n", b"confirm: take from 'other'"),
        (b"flush jobs-t\n", b"flush: manage 'jobs-t'"),
        (b"delete jobs-t\n", b"delete: manage 'jobs-t'"),
        (b"status READONLY\n", b"status"),
        (b"shutdown\n", b"shutdown"),
    ):
        t.call(request, b"-Permission denied: " + what)
    t.call(b"status\n", b":UP")


# ---- Thrift -------------------------------------------------------------------------------------


def test_thrift_auth_and_permissions(srv: ServerProcess) -> None:
    k = thrift_client(IDL, srv.ports["thrift"])
    with pytest.raises(TApplicationException, match="unauthenticated"):
        k.get_version()
    with pytest.raises(TApplicationException, match="authentication failure"):
        k.auth("alice", "nope")
    k.auth("alice", PASSWORDS["alice"])
    assert k.put("jobs-th", [b"a"], 0) == 1
    assert [i.data for i in k.get("jobs-th", 1, 0, 0)] == [b"a"]
    for call, args in (
        ("put", ("other", [b"a"], 0)),
        ("get", ("other", 1, 0, 0)),
        ("peek", ("other",)),
        ("confirm", ("other", {1})),
        ("abort", ("other", {1})),
        ("flush_queue", ("jobs-th",)),
        ("delete_queue", ("jobs-th",)),
        ("flush_all_queues", ()),
        ("set_status", (IDL.Status.READ_ONLY,)),
    ):
        with pytest.raises(TApplicationException, match="permission denied"):
            getattr(k, call)(*args)
    assert k.get_version()


# ---- beanstalk ----------------------------------------------------------------------------------


def bs(srv: ServerProcess) -> Raw:
    return Raw(socket.create_connection(("127.0.0.1", srv.ports["beanstalk"]), timeout=10))


def test_beanstalk_auth_and_permissions(srv: ServerProcess) -> None:
    b = bs(srv)
    b.call(b"use jobs-b\r\n", b"UNAUTHORIZED\r\n")
    b.call(b"put 0 0 10 1\r\nx\r\n", b"UNAUTHORIZED\r\n")
    b.call(b"auth alice nope\r\n", b"AUTH_FAILED\r\n")
    b.call(f"auth alice {PASSWORDS['alice']}\r\n".encode(), b"OK\r\n")
    b.call(b"use jobs-b\r\n", b"USING jobs-b\r\n")
    b.call(b"put 0 0 10 1\r\nx\r\n", b"INSERTED 1\r\n")
    b.call(
        b"reserve-with-timeout 0\r\n",
        b"PERMISSION_DENIED reserve-with-timeout: take from 'default'\r\n",
    )
    b.call(b"peek 1\r\n", b"FOUND 1 1\r\nx\r\n")
    b.call(b"kick 1\r\n", b"PERMISSION_DENIED kick: manage 'jobs-b'\r\n")
    b.call(b"pause-tube jobs-b 1\r\n", b"PERMISSION_DENIED pause-tube: manage 'jobs-b'\r\n")
    b.call(b"kick-job 1\r\n", b"PERMISSION_DENIED kick-job: manage 'jobs-b'\r\n")
    b.call(b"use other\r\n", b"USING other\r\n")
    b.call(b"put 0 0 10 1\r\ny\r\n", b"PERMISSION_DENIED put: put to 'other'\r\n")
    b.call(b"peek-ready\r\n", b"PERMISSION_DENIED peek-ready: take from 'other'\r\n")
    b.call(b"watch jobs-b\r\n", b"WATCHING 2\r\n")
    b.call(b"ignore default\r\n", b"WATCHING 1\r\n")
    b.call(b"reserve-with-timeout 0\r\n", b"RESERVED 1 1\r\nx\r\n")
    b.call(b"delete 1\r\n", b"DELETED\r\n")


def test_greenstalk_logs_in_with_a_raw_line(srv: ServerProcess) -> None:
    import greenstalk

    client = track(greenstalk.Client(("127.0.0.1", srv.ports["beanstalk"])))
    client._send_cmd(f"auth alice {PASSWORDS['alice']}".encode(), b"OK")
    client.use("jobs-g")
    client.watch("jobs-g")
    client.ignore("default")
    job_id = client.put("hello")
    job = client.reserve(timeout=0)
    assert (job.id, job.body) == (job_id, "hello")
    client.delete(job)


def test_beanstalk_auth_is_unknown_without_users(tmp_path: Path) -> None:
    with ServerProcess(tmp_path, "[server]\nbeanstalk_port = 0\n") as s:
        b = bs(s)
        b.call(b"auth alice pw\r\n", b"UNKNOWN_COMMAND\r\n")
        b.call(b"use jobs\r\n", b"USING jobs\r\n")
        Raw(s.connect()).call(b"get jobs\r\n", b"END\r\n")  # no login asked for


# ---- the admin port -----------------------------------------------------------------------------


def http(srv: ServerProcess, path: str, user: str | None, method: str = "GET") -> tuple[int, Any]:
    req = urllib.request.Request(srv.admin_url + path, method=method)
    if user is not None:
        token = base64.b64encode(f"{user}:{PASSWORDS[user]}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.headers


def test_admin_basic(srv: ServerProcess) -> None:
    status, headers = http(srv, "/stats.json", None)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
    assert http(srv, "/stats.json", "alice")[0] == 200
    assert http(srv, "/metrics", "alice")[0] == 200
    assert http(srv, "/reload", "alice", "POST")[0] == 403  # read-only: not manage *
    assert http(srv, "/reload", "root", "POST")[0] == 200


# ---- audit, log hygiene -------------------------------------------------------------------------


def test_counters_and_log(srv: ServerProcess) -> None:
    c = mc(srv)
    login(c, "alice", "wrong-password-x", b"CLIENT_ERROR authentication failure\r\n")
    login(c, "alice", PASSWORDS["alice"])
    c.call(set_cmd("jobs-secret", SECRET_PAYLOAD), b"STORED\r\n")
    assert line(c, b"flush_all\r\n").startswith(b"CLIENT_ERROR permission denied")
    figures = stats(c)
    assert int(figures["auth_login_failures"]) >= 1
    assert int(figures["auth_manage_denied"]) >= 1
    assert int(figures["auth_logins"]) >= 1
    assert int(figures["auth_users"]) == 3
    metrics = urllib.request.Request(srv.admin_url + "/metrics")
    metrics.add_header(
        "Authorization", "Basic " + base64.b64encode(b"root:" + PASSWORDS["root"].encode()).decode()
    )
    with urllib.request.urlopen(metrics, timeout=10) as resp:
        assert b"tercel_auth_login_failures" in resp.read()
    dashboard = urllib.request.Request(srv.admin_url + "/dashboard.json")
    dashboard.add_header(
        "Authorization",
        "Basic " + base64.b64encode(b"alice:" + PASSWORDS["alice"].encode()).decode(),
    )
    with urllib.request.urlopen(dashboard, timeout=10) as resp:
        assert json.load(resp)["server"]["auth"]["login_failures"] >= 1
    log = srv.log()
    assert "login failed for user alice" in log and "refused flush_all" in log
    for secret in (*PASSWORDS.values(), "wrong-password-x", SECRET_PAYLOAD.decode()):
        assert secret not in log


# ---- rate limit, reload, the clients --------------------------------------------------------


def test_failed_logins_are_rate_limited(tmp_path: Path) -> None:
    with ServerProcess(tmp_path, config()) as s:
        root = mc(s, "root")  # logged in before the flood
        c = mc(s)
        c.send(set_cmd("k", b"alice wrong") * 10)  # pipelined: each waits for the one before
        for _ in range(10):
            assert c.read_line() == b"CLIENT_ERROR authentication failure\r\n"
        limited = b"CLIENT_ERROR authentication failure: too many failed attempts; retry later\r\n"
        login(c, "alice", PASSWORDS["alice"], limited)
        assert "too many failed attempts" in s.log()
        root.call(set_cmd("still", b"served"), b"STORED\r\n")  # the others keep working
        assert int(stats(root)["auth_login_rate_limited"]) == 1


def test_reload_adds_and_removes_users(tmp_path: Path) -> None:
    users = tmp_path / "users.toml"
    users.write_text(user_table("bob", put=["*"]))
    with ServerProcess(tmp_path / "data", config(users)) as s:
        bob = mc(s, "bob")
        bob.call(set_cmd("anything", b"x"), b"STORED\r\n")
        users.write_text("")
        root = mc(s, "root")
        root.call(b"reload\r\n", b"Reloaded config.\r\n")
        assert line(bob, b"get anything\r\n") == b"CLIENT_ERROR unauthenticated\r\n"
        login(mc(s), "bob", PASSWORDS["bob"], b"CLIENT_ERROR authentication failure\r\n")
        users.write_text(user_table("bob", take=["anything"]))
        root.call(b"reload\r\n", b"Reloaded config.\r\n")
        login(bob, "bob", PASSWORDS["bob"])
        bob.call(b"get anything\r\n", b"VALUE anything 0 1\r\nx\r\nEND\r\n")
        assert line(bob, set_cmd("anything", b"z")).startswith(b"CLIENT_ERROR permission denied")


def test_client_credentials(srv: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    with Client(srv.address, user="alice", password=PASSWORDS["alice"]) as client:
        client.put("jobs-client", b"v")
        assert client.get("jobs-client") == b"v"
        with pytest.raises(ServerReplyError, match="permission denied"):
            client.put("other", b"v")
    monkeypatch.setenv("TERCEL_USER", "alice")
    monkeypatch.setenv("TERCEL_PASSWORD", "wrong")
    with Client(srv.address) as client, pytest.raises(ServerReplyError, match="authentication"):
        client.put("jobs-client", b"v")
    assert "alice-pw" not in repr(
        Client(srv.address, user="alice", password="alice-pw").credentials
    )


def test_reload_turns_users_on_and_off_for_open_connections(tmp_path: Path) -> None:
    users = tmp_path / "users.toml"
    users.write_text("")
    text = f'[server]\ntext_port = 0\n[users]\nfile = "{users}"\n'
    with ServerProcess(tmp_path / "data", text) as s:
        c = mc(s)  # an open server: no login
        c.call(set_cmd("q", b"x"), b"STORED\r\n")
        users.write_text(user_table("root", put=["*"], take=["*"], manage=["*"]))
        c.call(b"reload\r\n", b"Reloaded config.\r\n")
        assert line(c, b"get q\r\n") == b"CLIENT_ERROR unauthenticated\r\n"
        text_conn = text_connection(s.ports["text"])
        text_conn.call(b"version\n", b"-Unauthenticated: auth <user> <password> first")
        login(c, "root", PASSWORDS["root"])
        users.write_text("")
        c.call(b"reload\r\n", b"Reloaded config.\r\n")
        text_conn.call(b"auth root x\n", b"-No users are configured")
        c.call(b"get q\r\n", b"VALUE q 0 1\r\nx\r\nEND\r\n")


def test_spark_options_pass_credentials_and_hide_the_password() -> None:
    from tercel.spark.options import SinkOptions, login_kwargs

    opts = SinkOptions.parse({"servers": "h:1", "user": "alice", "password": "p-secret"})
    assert "p-secret" not in repr(opts)
    assert login_kwargs(opts.user, opts.password) == {"user": "alice", "password": "p-secret"}
    opts = SinkOptions.parse({"servers": "h:1", "user": "alice", "passwordFile": "/run/pw"})
    assert login_kwargs(opts.user, opts.password) == {"user": "alice", "password_file": "/run/pw"}
    assert login_kwargs(None, None) == {}
    with pytest.raises(ValueError, match="needs 'user'"):
        SinkOptions.parse({"servers": "h:1", "password": "p"})


def test_async_client_and_cli_log_in(srv: ServerProcess, tmp_path: Path) -> None:
    import asyncio
    import os
    import subprocess
    import sys

    from tercel.client import AsyncClient

    async def roundtrip() -> bytes | None:
        async with AsyncClient(srv.address, user="alice", password=PASSWORDS["alice"]) as c:
            await c.put("jobs-async", b"a")
            return await c.get("jobs-async")

    assert asyncio.run(roundtrip()) == b"a"
    secret = tmp_path / "pw"
    secret.write_text(PASSWORDS["alice"] + "\n")
    env = dict(os.environ, TERCEL_USER="alice", TERCEL_PASSWORD_FILE=str(secret))
    cli = [sys.executable, "-m", "tercel"]
    where = ["--server", srv.address]
    subprocess.run([*cli, "put", *where, "jobs-cli", "x"], env=env, check=True)
    got = subprocess.run(
        [*cli, "get", *where, "jobs-cli"], env=env, capture_output=True, check=True
    )
    assert got.stdout == b"x\n"
    refused = subprocess.run(
        [*cli, "put", *where, "other", "x"], env=env, capture_output=True, check=False
    )
    assert refused.returncode != 0 and b"permission denied" in refused.stderr
