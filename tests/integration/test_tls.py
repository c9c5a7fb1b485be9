"""TLS on every listener, for real: a ``tercel serve`` on 127.0.0.1:0 with ``[tls]``, and real
clients over TLS (pymemcache, raw ``ssl`` sockets for the text and beanstalkd protocols,
thriftpy2's TLS socket, urllib over HTTPS, tercel's own clients and CLI). Mutual TLS with good,
missing, wrong-CA, expired and self-signed client certificates; plaintext to a TLS port and
TLS to a plaintext port; a handshake that never comes; reload swapping the certificate under a
live connection; a thousand handshakes without a descriptor leak. Certificates are made in a
fixture with the ``openssl`` command line (the ``cryptography`` package is not installed)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import thriftpy2
from pymemcache.client.base import Client as MemcacheClient

from tercel.client import AsyncClient, Client, TLSOptions
from tercel.config import parse_config
from tercel.errors import ConfigError, TransportError
from tercel.protocol.thrift import IDL_PATH
from tercel.testing import ServerProcess

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")

IDL = thriftpy2.load(IDL_PATH, module_name="tls_kestrel_thrift")
PORTS = ("--text-port", "0", "--thrift-port", "0", "--beanstalk-port", "0")
SECRET = b"payload-that-must-not-be-logged"


# ---- certificates -----------------------------------------------------------------------------


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def _key_and_csr(d: Path, name: str, subject: str) -> None:
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", d / f"{name}.key", "-out", d / f"{name}.csr", "-subj", subject,
    )  # fmt: skip


def _ca(d: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", d / f"{name}.key", "-out", d / f"{name}.crt", "-days", "30",
        "-subj", f"/CN={name}",
    )  # fmt: skip


def _sign(
    d: Path, name: str, ca: str, subject: str, *, days: int = 30, server: bool = False
) -> None:
    _key_and_csr(d, name, subject)
    ext = d / f"{name}.ext"
    ext.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n" if server else "")
    _openssl(
        "x509", "-req", "-in", d / f"{name}.csr", "-CA", d / f"{ca}.crt", "-CAkey",
        d / f"{ca}.key", "-CAcreateserial", "-out", d / f"{name}.crt", "-days", str(days),
        *(("-extfile", ext) if server else ()),
    )  # fmt: skip


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ca (signs the server's and the good client's), other-ca, and the certificates:
    server, server2 (a second one for the reload test), alice (good client), mallory
    (signed by other-ca), expired (by ca, expired yesterday), selfsigned."""
    d = tmp_path_factory.mktemp("certs")
    _ca(d, "ca")
    _ca(d, "other-ca")
    _sign(d, "server", "ca", "/CN=one", server=True)
    _sign(d, "server2", "ca", "/CN=two", server=True)
    _sign(d, "alice", "ca", "/O=Example/CN=alice")
    _sign(d, "mallory", "other-ca", "/CN=mallory")
    _sign(d, "expired", "ca", "/CN=expired", days=-1)
    _ca(d, "selfsigned")
    return d


def tls_config(d: Path, extra: str = "", **tls: str) -> str:
    lines = [f'cert = "{d}/server.crt"', f'key = "{d}/server.key"', f'ca = "{d}/ca.crt"']
    lines += [f"{k} = {v}" for k, v in tls.items()]
    return f"{extra}\n[tls]\n" + "\n".join(lines) + "\n"


def client_context(d: Path, name: str | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(d / "ca.crt"))
    if name is not None:
        ctx.load_cert_chain(d / f"{name}.crt", d / f"{name}.key")
    return ctx


def tls_socket(port: int, ctx: ssl.SSLContext, timeout: float = 10) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    return ctx.wrap_socket(raw, server_hostname="localhost")


def call(sock: socket.socket, request: bytes, end: bytes = b"\r\n") -> bytes:
    sock.sendall(request)
    buf = b""
    while not buf.endswith(end):
        chunk = sock.recv(65536)
        if not chunk:
            raise EOFError(buf)
        buf += chunk
    return buf


def refused(sock_factory: Any) -> bool:
    """True when a connection is refused: in the handshake, or (TLS 1.3: the server checks
    the client's certificate after the client's side finished) at the first read."""
    try:
        sock = sock_factory()
        try:
            return call(sock, b"version\r\n") == b""  # pragma: no cover - never answered
        finally:
            sock.close()
    except (ssl.SSLError, ConnectionError, EOFError):
        return True


# ---- servers ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """TLS on every listener (memcache, text, Thrift, beanstalkd, admin), no client certs."""
    cfg = tls_config(certs, handshake_timeout='"1s"')
    srv = ServerProcess(tmp_path_factory.mktemp("data"), cfg, extra_args=PORTS, log_level="info")
    with srv:
        yield srv


@pytest.fixture(scope="module")
def mutual(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Client certificates required (signed by ca)."""
    cfg = tls_config(certs, verify_client="true")
    with ServerProcess(tmp_path_factory.mktemp("data"), cfg, extra_args=PORTS) as srv:
        yield srv


def server_pid(srv: ServerProcess) -> int:
    assert srv.proc is not None
    return srv.proc.pid


def open_fds(srv: ServerProcess) -> int:
    return len(os.listdir(f"/proc/{server_pid(srv)}/fd"))


# ---- every listener ---------------------------------------------------------------------------


def test_memcache_over_tls_with_pymemcache(server: ServerProcess, certs: Path) -> None:
    mc = MemcacheClient(("127.0.0.1", server.port), tls_context=client_context(certs))
    try:
        assert mc.set("tls_mc", SECRET, noreply=False)
        assert mc.get("tls_mc") == SECRET
        assert mc.get("tls_mc") is None
    finally:
        mc.close()


def test_text_over_tls(server: ServerProcess, certs: Path) -> None:
    with tls_socket(server.ports["text"], client_context(certs)) as s:
        assert call(s, b"put tls_text:\none\ntwo\n\n", b"\n") == b"+2\n"
        assert call(s, b"get tls_text\n", b"\n") == b":one\n"


def test_thrift_over_tls(server: ServerProcess, certs: Path) -> None:
    from thriftpy2.protocol import TBinaryProtocolFactory
    from thriftpy2.rpc import make_client
    from thriftpy2.transport import TFramedTransportFactory

    kc = make_client(
        IDL.Kestrel,
        "localhost",
        server.ports["thrift"],
        trans_factory=TFramedTransportFactory(),
        proto_factory=TBinaryProtocolFactory(),
        timeout=10_000,
        ssl_context=client_context(certs),
    )
    try:
        assert kc.put("tls_thrift", [b"a", b"b"], 0) == 2
        assert [i.data for i in kc.get("tls_thrift", 5, 0, 0)] == [b"a", b"b"]
    finally:
        kc.close()


def test_beanstalk_over_tls(server: ServerProcess, certs: Path) -> None:
    with tls_socket(server.ports["beanstalk"], client_context(certs)) as s:
        assert call(s, b"put 0 0 10 5\r\nhello\r\n").startswith(b"INSERTED ")
        assert call(s, b"reserve-with-timeout 0\r\n", b"hello\r\n").startswith(b"RESERVED ")


def test_admin_over_https(server: ServerProcess, certs: Path) -> None:
    url = f"https://localhost:{server.ports['admin']}/ping"
    with urllib.request.urlopen(url, context=client_context(certs), timeout=10) as resp:
        assert json.load(resp) == {"response": "pong"}
    with pytest.raises(Exception):  # noqa: B017 - plain HTTP to the HTTPS port: no answer
        urllib.request.urlopen(f"http://127.0.0.1:{server.ports['admin']}/ping", timeout=10)


def test_tls_1_1_is_refused(server: ServerProcess, certs: Path) -> None:
    ctx = client_context(certs)
    with warnings.catch_warnings():  # (TLS 1.1 is deprecated: that is the point)
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version = ctx.maximum_version = ssl.TLSVersion.TLSv1_1
        ctx.set_ciphers("ALL:@SECLEVEL=0")
        with pytest.raises((ssl.SSLError, ConnectionError)):
            tls_socket(server.port, ctx).close()


def test_the_server_is_checked_by_name(server: ServerProcess, certs: Path) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        client_context(certs).wrap_socket(raw, server_hostname="evil.example").close()
    with pytest.raises(ssl.SSLCertVerificationError):  # not signed by a CA we trust
        tls_socket(server.port, ssl.create_default_context()).close()


# ---- tercel's clients and CLI -----------------------------------------------------------------


def test_tercel_clients_over_tls(server: ServerProcess, certs: Path) -> None:
    tls = TLSOptions(ca_file=str(certs / "ca.crt"), server_name="localhost")
    with Client(server.address, tls=tls) as c:
        c.put("tls_client", b"x")
        assert c.get("tls_client") == b"x"
        c.put("tls_client", b"y")

    async def run() -> bytes | None:
        async with AsyncClient(server.address, tls=tls) as ac:
            return await ac.get("tls_client")

    assert asyncio.run(run()) == b"y"
    with Client(server.address, tls=TLSOptions(verify=False), retry_after=0.01) as c:
        assert c.get("tls_client") is None  # verify off: anything goes (tests only)
    plain = Client(server.address, connect_timeout=5, retry_after=0.01)
    with plain, pytest.raises(TransportError):  # plaintext to the TLS port
        plain.get("tls_client")


def test_cli_takes_tls_from_the_environment(server: ServerProcess, certs: Path) -> None:
    env = dict(os.environ, TERCEL_TLS_CA=str(certs / "ca.crt"), TERCEL_TLS_SERVER_NAME="localhost")
    where = ("--server", server.address)

    def cli(*args: str, **env: str) -> subprocess.CompletedProcess[bytes]:
        cmd = [sys.executable, "-m", "tercel", *args, *where]
        return subprocess.run(cmd, env=env or None, capture_output=True, timeout=60, check=False)

    done = cli("put", "tls_cli", "hi", **env)
    assert done.returncode == 0, done.stderr
    assert cli("get", "tls_cli", **env).stdout == b"hi\n"
    plain = cli("get", "tls_cli")
    assert plain.returncode == 1


def test_tls_options_from_env() -> None:
    assert TLSOptions.from_env({}) is None
    assert TLSOptions.from_env({"TERCEL_TLS": "1"}) == TLSOptions()
    assert TLSOptions.from_env({"TERCEL_TLS": "0", "TERCEL_TLS_CA": "x"}) is None
    got = TLSOptions.from_env(
        {"TERCEL_TLS_CERT": "c", "TERCEL_TLS_KEY": "k", "TERCEL_TLS_VERIFY": "no"}
    )
    assert got == TLSOptions(cert_file="c", key_file="k", verify=False)


def test_spark_options_pass_tls_through() -> None:
    from tercel.spark.options import SinkOptions

    opts = SinkOptions.parse({"servers": "h:1", "tlsCaFile": "/ca.pem", "tlsServerName": "q"})
    assert opts.tls == TLSOptions(ca_file="/ca.pem", server_name="q")
    assert SinkOptions.parse({"servers": "h:1"}).tls is None
    assert SinkOptions.parse({"servers": "h:1", "tls": "true"}).tls == TLSOptions()


# ---- mutual TLS -------------------------------------------------------------------------------


def test_mutual_tls_accepts_a_good_client_certificate(mutual: ServerProcess, certs: Path) -> None:
    ctx = client_context(certs, "alice")
    for name in ("memcache", "text", "beanstalk"):
        with tls_socket(mutual.ports[name], ctx) as s:
            s.sendall(b"version\r\n" if name != "text" else b"version\n")
            assert s.recv(100)
    tls = TLSOptions(
        ca_file=str(certs / "ca.crt"),
        cert_file=str(certs / "alice.crt"),
        key_file=str(certs / "alice.key"),
    )
    with Client(mutual.address.replace("127.0.0.1", "localhost"), tls=tls) as c:
        c.put("mtls", b"ok")
        assert c.get("mtls") == b"ok"
    url = f"https://localhost:{mutual.ports['admin']}/ping"
    with urllib.request.urlopen(url, context=ctx, timeout=10) as resp:
        assert resp.status == 200


@pytest.mark.parametrize("cert", [None, "mallory", "expired", "selfsigned"])
def test_mutual_tls_refuses(mutual: ServerProcess, certs: Path, cert: str | None) -> None:
    ctx = client_context(certs, cert)
    for name in ("memcache", "text", "thrift", "beanstalk", "admin"):
        assert refused(lambda n=name: tls_socket(mutual.ports[n], ctx)), name
    with tls_socket(mutual.port, client_context(certs, "alice")) as good:  # still serving
        assert call(good, b"version\r\n").startswith(b"VERSION")


def test_peer_subject_names_the_client_certificate(certs: Path) -> None:
    from tercel.config import TLSSettings
    from tercel.server.tls import make_context, peer_subject

    settings = TLSSettings(
        cert=str(certs / "server.crt"),
        key=str(certs / "server.key"),
        ca=str(certs / "ca.crt"),
        verify_client=True,
    )

    async def run() -> list[str | None]:
        seen: list[str | None] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.append(peer_subject(writer.transport))
            writer.close()

        srv = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=make_context(settings))
        port = srv.sockets[0].getsockname()[1]
        ctx = client_context(certs, "alice")
        _, w = await asyncio.open_connection(
            "127.0.0.1", port, ssl=ctx, server_hostname="localhost"
        )
        await w.wait_closed()
        seen.append(peer_subject(w.transport))  # the client's side: the server's subject
        srv.close()
        return seen

    assert asyncio.run(run()) == ["O=Example,CN=alice", "CN=one"]
    assert peer_subject(None) is None


# ---- the wrong protocol, slow handshakes, many handshakes ---------------------------------


def test_plaintext_to_a_tls_port_is_closed(server: ServerProcess, certs: Path) -> None:
    for name in ("memcache", "text", "thrift", "beanstalk"):
        with socket.create_connection(("127.0.0.1", server.ports[name]), timeout=10) as s:
            s.sendall(b"get " + SECRET + b"\r\n" * 200)
            try:
                while s.recv(65536):  # a TLS alert at most, then the end
                    pass
            except ConnectionResetError:
                pass
    with tls_socket(server.port, client_context(certs)) as s:
        assert call(s, b"version\r\n").startswith(b"VERSION")


def test_slow_handshake_blocks_no_one(server: ServerProcess, certs: Path) -> None:
    """Slowloris: connections that never say hello do not hold up others, and are closed
    after ``handshake_timeout`` (1 s here)."""
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(20)]
    try:
        with tls_socket(server.port, client_context(certs), timeout=5) as s:
            assert call(s, b"version\r\n").startswith(b"VERSION")
        for sock in idle:
            assert sock.recv(100) == b""  # closed by the server, well before 30 s
    finally:
        for sock in idle:
            sock.close()


def test_a_thousand_handshakes_leak_nothing(server: ServerProcess, certs: Path) -> None:
    ctx = client_context(certs)
    with tls_socket(server.port, ctx) as s:  # warm: the admin and lazy imports are done
        call(s, b"version\r\n")
    before = open_fds(server)
    for i in range(1000):
        with tls_socket(server.port, ctx) as s:
            if i % 100 == 0:
                assert call(s, b"version\r\n").startswith(b"VERSION")
    with tls_socket(server.port, ctx) as s:
        assert call(s, b"version\r\n").startswith(b"VERSION")
    # the last closes may still be on their way: a few descriptors of slack, not a thousand
    assert open_fds(server) <= before + 5


def test_nothing_sensitive_in_the_log(server: ServerProcess, certs: Path) -> None:
    text = server.log()
    assert SECRET.decode() not in text
    assert "PRIVATE KEY" not in text
    assert "Traceback" not in text


# ---- migration: a plaintext port beside a TLS one ------------------------------------------


def test_tls_port_beside_a_plaintext_one(certs: Path, tmp_path: Path) -> None:
    cfg = tls_config(certs, listeners='["text"]', ports="{memcache = 0}")
    with ServerProcess(tmp_path / "data", cfg, extra_args=("--text-port", "0")) as srv:
        assert set(srv.ports) == {"memcache", "memcache_tls", "text", "admin"}
        plain = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        with plain, tls_socket(srv.ports["memcache_tls"], client_context(certs)) as tls:
            assert call(plain, b"set mig 0 0 1\r\na\r\n") == b"STORED\r\n"
            assert call(tls, b"get mig\r\n", b"END\r\n") == b"VALUE mig 0 1\r\na\r\nEND\r\n"
        # TLS to the plaintext port: refused, and the port keeps serving
        with pytest.raises((ssl.SSLError, ConnectionError, TimeoutError)):
            tls_socket(srv.port, client_context(certs), timeout=5).close()
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            assert call(s, b"version\r\n").startswith(b"VERSION")
        with socket.create_connection(("127.0.0.1", srv.ports["admin"]), timeout=10) as s:
            assert call(s, b"GET /ping HTTP/1.0\r\n\r\n", b"}").startswith(b"HTTP/1.0 200")


# ---- reload -----------------------------------------------------------------------------------


def _common_name(sock: ssl.SSLSocket) -> str:
    cert = sock.getpeercert()
    assert cert
    return dict(x[0] for x in cert["subject"])["commonName"]


def test_reload_swaps_the_certificate_for_new_connections(certs: Path, tmp_path: Path) -> None:
    live = tmp_path / "live"
    live.mkdir()
    for ext in ("crt", "key"):
        shutil.copy(certs / f"server.{ext}", live / f"server.{ext}")
    cfg = f'[tls]\ncert = "{live}/server.crt"\nkey = "{live}/server.key"\n'
    ctx = client_context(certs)
    with ServerProcess(tmp_path / "data", cfg) as srv:
        old = tls_socket(srv.port, ctx)
        assert _common_name(old) == "one"
        for ext in ("crt", "key"):
            shutil.copy(certs / f"server2.{ext}", live / f"server.{ext}")
        assert call(old, b"reload\r\n") == b"Reloaded config.\r\n"
        with tls_socket(srv.port, ctx) as new:
            assert _common_name(new) == "two"
            assert call(new, b"version\r\n").startswith(b"VERSION")
        assert call(old, b"version\r\n").startswith(b"VERSION")  # not dropped
        # a bad file: the reload is refused, the certificate in use stays
        (live / "server.key").write_text("not a key\n")
        assert call(old, b"reload\r\n").startswith(b"SERVER_ERROR")
        assert srv.proc is not None
        srv.proc.send_signal(signal.SIGHUP)  # refused too, logged
        with tls_socket(srv.port, ctx) as new:
            assert _common_name(new) == "two"
        old.close()
        assert "not a key" not in srv.log()


def test_reload_swaps_the_client_ca(certs: Path, tmp_path: Path) -> None:
    ca = tmp_path / "clients-ca.crt"
    shutil.copy(certs / "ca.crt", ca)
    cfg = tls_config(certs, verify_client="true").replace(str(certs / "ca.crt"), str(ca))
    with ServerProcess(tmp_path / "data", cfg) as srv:
        live = tls_socket(srv.port, client_context(certs, "alice"))
        assert refused(lambda: tls_socket(srv.port, client_context(certs, "mallory")))
        shutil.copy(certs / "other-ca.crt", ca)
        assert call(live, b"reload\r\n") == b"Reloaded config.\r\n"
        with tls_socket(srv.port, client_context(certs, "mallory")) as s:  # other-ca's now
            assert call(s, b"version\r\n").startswith(b"VERSION")
        assert refused(lambda: tls_socket(srv.port, client_context(certs, "alice")))
        assert call(live, b"version\r\n").startswith(b"VERSION")  # kept its session
        live.close()


# ---- configuration ----------------------------------------------------------------------------


def test_tls_from_the_command_line(certs: Path, tmp_path: Path) -> None:
    flags = ("--tls-cert", str(certs / "server.crt"), "--tls-key", str(certs / "server.key"))
    flags += ("--tls-ca", str(certs / "ca.crt"))  # and client certificates required
    with ServerProcess(tmp_path / "data", extra_args=flags) as srv:
        with tls_socket(srv.port, client_context(certs, "alice")) as s:
            assert call(s, b"version\r\n").startswith(b"VERSION")
        assert refused(lambda: tls_socket(srv.port, client_context(certs)))


def test_tls_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"tls\.key: required"):
        parse_config({"tls": {"cert": "c"}})
    with pytest.raises(ConfigError, match=r"verify_client: needs tls\.ca"):
        parse_config({"tls": {"cert": "c", "key": "k", "verify_client": True}})
    with pytest.raises(ConfigError, match=r"tls\.listeners"):
        parse_config({"tls": {"cert": "c", "key": "k", "listeners": ["smtp"]}})
    with pytest.raises(ConfigError, match=r"tls\.ports\.admin"):
        parse_config({"tls": {"cert": "c", "key": "k", "ports": {"admin": 1}}})
    cfg = parse_config({"tls": {"cert": "c", "key": "k", "handshake_timeout": "2s"}})
    assert cfg.tls is not None and cfg.tls.handshake_timeout == 2000
    assert parse_config({}).tls is None


def test_a_bad_certificate_stops_the_start(tmp_path: Path) -> None:
    (tmp_path / "bad.pem").write_text("nothing\n")
    cfg = f'[tls]\ncert = "{tmp_path}/bad.pem"\nkey = "{tmp_path}/bad.pem"\n'
    srv = ServerProcess(tmp_path / "data", cfg)
    assert srv.start_refused() != 0
    assert "cannot use the certificate" in srv.log()


def test_the_ready_line_with_tls() -> None:
    from tercel.cli import ready_line

    line = ready_line("127.0.0.1", {"memcache": 1, "admin": 2}, "tercel", ("memcache", "admin"))
    assert "dashboard https://127.0.0.1:2/" in line
    assert "try:" not in line  # the command would need the TLS options
    assert "try:" in ready_line("127.0.0.1", {"memcache": 1}, "tercel", ("admin",))


def test_plaintext_beyond_loopback_is_warned_of(tmp_path: Path) -> None:
    import logging

    from tercel.config import ServerConfig
    from tercel.server.app import warn_exposed

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())  # type: ignore[method-assign]
    logging.getLogger("tercel.server.app").addHandler(handler)
    try:
        warn_exposed(ServerConfig().with_server(host="0.0.0.0"), ["memcache"])
        warn_exposed(ServerConfig(), ["memcache"])
        warn_exposed(ServerConfig().with_server(host="0.0.0.0"), [])
    finally:
        logging.getLogger("tercel.server.app").removeHandler(handler)
    assert len(records) == 1 and "without TLS on memcache" in records[0]


# ---- a client certificate logs its user in -----------------------------------------------------


def test_a_client_certificate_logs_in_its_user(certs: Path, tmp_path: Path) -> None:
    """With mutual TLS and users, a user whose ``subject`` is the client certificate's is
    logged in at the handshake, on every port; another certificate must log in by password,
    and a certificate-only user has no password to log in with."""
    from tercel.passwords import hash_password

    _sign(certs, "carol", "ca", "/CN=carol")
    users = (
        '[users.alice]\nsubject = "O=Example,CN=alice"\nput = ["jobs*"]\ntake = ["jobs*"]\n'
        f'[users.carol]\npassword = "{hash_password("carol-pw", n=1024)}"\ntake = ["*"]\n'
    )
    cfg = tls_config(certs, users, verify_client="true")
    with ServerProcess(tmp_path / "data", cfg, extra_args=PORTS) as srv:
        bs = srv.ports["beanstalk"]
        with tls_socket(bs, client_context(certs, "alice")) as alice:
            assert call(alice, b"use jobs\r\n") == b"USING jobs\r\n"
            assert call(alice, b"put 0 0 60 1\r\nx\r\n") == b"INSERTED 1\r\n"
            assert call(alice, b"use other\r\n") == b"USING other\r\n"
            assert call(alice, b"put 0 0 60 1\r\ny\r\n").startswith(b"PERMISSION_DENIED")
        with tls_socket(srv.port, client_context(certs, "alice")) as alice:
            assert call(alice, b"set jobs 0 0 1\r\nz\r\n") == b"STORED\r\n"
        with tls_socket(bs, client_context(certs, "carol")) as carol:
            assert call(carol, b"stats\r\n") == b"UNAUTHORIZED\r\n"
            assert call(carol, b"auth alice anything\r\n") == b"AUTH_FAILED\r\n"
            assert call(carol, b"auth carol carol-pw\r\n") == b"OK\r\n"
            assert call(carol, b"watch jobs\r\n") == b"WATCHING 2\r\n"
            assert call(carol, b"ignore default\r\n") == b"WATCHING 1\r\n"
            assert call(carol, b"reserve-with-timeout 0\r\n") == b"RESERVED 1 1\r\nx\r\n"
