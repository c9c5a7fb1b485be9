"""The servers under test: how to start each one fresh, find its port, and stop it.

Contract:
- :data:`SERVERS` maps a short name to a :class:`ServerDef`. Every definition belongs to one
  durability class (``none``, ``periodic`` = ack before a periodic fsync, ``durable`` = ack after
  fsync) and speaks one protocol (``mc``, ``bs``, ``redis``).
- :func:`start` launches a server on 127.0.0.1 with a fresh data dir under ``workdir`` (or the
  ``data_dir`` given, for restarts), pinned with ``taskset`` when ``cpu`` is not None, and
  returns only once the server accepts connections. :meth:`Running.stop` ends it (SIGTERM, then
  SIGKILL after a grace period); :meth:`Running.kill` is an immediate SIGKILL.
- tercel is started as ``<tercel-cmd> serve --data-dir DIR --host 127.0.0.1 --memcache-port 0
  --ports-file PATH --admin-port 0 --config FILE --log-level warning`` and its port is read
  from the ports file (or, on a restart, ``--memcache-port`` is the port it had).

This is how the suite starts every server, peers and tercel alike (pinned, from a snapshot of
``src/tercel``). A tool that runs tercel alone (soak, fuzz, readbehind, manyqueues, spark_bench)
uses :class:`tercel.testing.ServerProcess` instead, the package's testing API; only
``instr_per_cmd.py`` starts its servers itself, under valgrind.
"""

from __future__ import annotations

import compileall
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import procstat

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class ServerDef:
    """A server configuration. ``kind`` selects the launcher; ``opts`` are its knobs."""

    name: str
    kind: str  # memcached | redis | beanstalkd | tercel | tercel-bs (tercel beanstalkd)
    proto: str  # mc | bs | redis
    durability: str  # none | periodic | durable
    opts: tuple[str, ...] = ()
    note: str = ""
    env: tuple[tuple[str, str], ...] = ()
    """Extra environment variables of the server process."""
    optional: bool = False
    """Not in the default ``--servers`` list (a variant for comparisons, named to run it)."""
    tls: bool = False
    """Clients speak TLS to it (a self-signed certificate made per cell, not verified)."""

    @property
    def is_tercel(self) -> bool:
        """True for the server this suite exists to measure."""
        return self.kind in ("tercel", "tercel-bs")


SERVERS: dict[str, ServerDef] = {
    d.name: d
    for d in (
        ServerDef("memcached", "memcached", "mc", "none", note="-t 1; no durability, ceiling"),
        ServerDef("redis-everysec", "redis", "redis", "periodic", ("everysec",)),
        ServerDef("redis-always", "redis", "redis", "durable", ("always",)),
        ServerDef("beanstalkd", "beanstalkd", "bs", "periodic", note="-b DIR (fsync <= 50 ms)"),
        ServerDef("beanstalkd-f0", "beanstalkd", "bs", "durable", ("-f0",)),
        ServerDef("tercel-nosync", "tercel", "mc", "none", ("false",)),
        ServerDef("tercel-50ms", "tercel", "mc", "periodic", ('"50ms"',)),
        ServerDef("tercel-sync", "tercel", "mc", "durable", ("true",)),
        ServerDef(
            "tercel-bs-50ms",
            "tercel-bs",
            "bs",
            "periodic",
            ("-f", "50"),
            note="tercel beanstalkd -b DIR",
        ),
        ServerDef("tercel-bs-sync", "tercel-bs", "bs", "durable", ("-f0",), note="-b DIR -f0"),
        ServerDef(
            "tercel-sync-loop",
            "tercel",
            "mc",
            "durable",
            ("true",),
            note="TERCEL_NO_AIO=1: group fsync on the event loop, not through native AIO",
            env=(("TERCEL_NO_AIO", "1"),),
            optional=True,
        ),
        ServerDef(
            "tercel-50ms-tls",
            "tercel",
            "mc",
            "periodic",
            ('"50ms"',),
            note="TLS on every listener ([tls] cert, key)",
            optional=True,
            tls=True,
        ),
        ServerDef(
            "redis-everysec-tls",
            "redis",
            "redis",
            "periodic",
            ("everysec",),
            note="--tls-port, --tls-auth-clients no",
            optional=True,
            tls=True,
        ),
    )
}

PEER_TARGETS: dict[str, tuple[str, ...]] = {
    "memcached": ("tercel-nosync", "tercel-50ms"),
    "redis-everysec": ("tercel-nosync", "tercel-50ms", "redis-everysec-tls"),
    "beanstalkd": ("tercel-nosync", "tercel-50ms", "tercel-bs-50ms"),
    "redis-always": ("tercel-sync", "tercel-sync-loop"),
    "beanstalkd-f0": ("tercel-sync", "tercel-sync-loop", "tercel-bs-sync"),
    "tercel-50ms": ("tercel-50ms-tls",),
    "redis-everysec-tls": ("tercel-50ms-tls",),
}
"""For each peer, the tercel configurations whose paired ratio against it is reported: the same
durability class, plus memcached as the protocol-speed ceiling for the Kestrel-like mode. Issue 7
states its goals for ``sync_journal = false`` (tercel-nosync: Kestrel's own default, ack after
``write()``, never fsynced) against the peers' periodic modes, so that pairing is reported too.
The TLS variants pair with their plaintext selves (what TLS costs each) and with each other."""


_snapshot: Path | None = None


def snapshot_tercel(dest: Path) -> Path | None:
    """Copies ``src/tercel`` (with its compiled modules, if built) to ``dest`` and makes every
    later tercel start import that copy.

    The tree may be edited while a long run goes on: a snapshot keeps every round on the same
    code and immune to half-saved files. Returns the directory put on PYTHONPATH, or None when
    there is nothing to snapshot (TERCEL_CMD set, or no source).
    """
    global _snapshot
    src = REPO / "src" / "tercel"
    if os.environ.get("TERCEL_CMD") or not (src / "cli.py").exists():
        return None
    root = dest / "tercel-src"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(src, root / "tercel", ignore=shutil.ignore_patterns("__pycache__"))
    for shared in src.parent.glob("*__mypyc*"):  # the compiled modules' shared library
        shutil.copy2(shared, root)
    # Byte-compiled as `pip install` leaves an installed package: a server started with
    # PYTHONDONTWRITEBYTECODE would otherwise compile every pure-Python module at each start.
    compileall.compile_dir(str(root / "tercel"), quiet=1)
    _snapshot = root
    return root


def tercel_command() -> list[str] | None:
    """The command that runs tercel, or None when the server is not installed yet.

    ``TERCEL_CMD`` (shell words) overrides; after :func:`snapshot_tercel` it is the venv's
    python running ``-m tercel`` from the snapshot; otherwise ``.venv/bin/tercel`` when
    ``src/tercel/cli.py`` exists.
    """
    env = os.environ.get("TERCEL_CMD")
    if env:
        return shlex.split(env)
    exe = REPO / ".venv" / "bin" / "tercel"
    if not exe.exists() or not (REPO / "src" / "tercel" / "cli.py").exists():
        return None
    if _snapshot is not None:
        return [str(REPO / ".venv" / "bin" / "python"), "-m", "tercel"]
    return [str(exe)]


def _env(d: ServerDef | None = None) -> dict[str, str] | None:
    """A tercel server's environment: PYTHONPATH points at the tercel snapshot when there is
    one, plus the variables of ``d``."""
    extra = dict(d.env) if d is not None else {}
    if _snapshot is None and not extra:
        return None
    env = dict(os.environ, **extra)
    if _snapshot is not None:
        env["PYTHONPATH"] = str(_snapshot) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def available(d: ServerDef) -> str | None:
    """None if ``d`` can be started here, else the reason it cannot."""
    if d.is_tercel:
        return None if tercel_command() else "tercel is not installed (.venv/bin/tercel)"
    exe = {"memcached": "memcached", "redis": "redis-server", "beanstalkd": "beanstalkd"}[d.kind]
    return None if shutil.which(exe) else f"{exe} not found"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, deadline: float, proc: subprocess.Popen[bytes]) -> None:
    """Blocks until 127.0.0.1:``port`` accepts a connection (monotonic ``deadline``)."""
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listening on {port}") from None
            time.sleep(0.01)


@dataclass
class Running:
    """A started server. ``data_dir`` survives :meth:`kill` so the server can be restarted."""

    sdef: ServerDef
    proc: subprocess.Popen[bytes]
    port: int
    data_dir: Path
    cell_dir: Path
    log_path: Path
    started_at: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        """The server's pid (taskset execs the server, so it is the Popen pid)."""
        return self.proc.pid

    def peak_rss_kb(self) -> int:
        """VmHWM of the server, 0 if it is gone."""
        try:
            return procstat.peak_rss_kb(self.pid)
        except OSError:
            return 0

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc.poll() is None

    def log_tail(self, n: int = 5) -> str:
        """The last ``n`` lines of the server's stdout/stderr."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def stop(self, grace: float = 5.0) -> int | None:
        """SIGTERM, wait up to ``grace`` s, then SIGKILL. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL now (a crash, for replay tests)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def cleanup(self) -> None:
        """Stops the server and deletes its cell directory."""
        self.stop()
        shutil.rmtree(self.cell_dir, ignore_errors=True)


def make_certificate(where: Path) -> tuple[Path, Path]:
    """A self-signed certificate and key for 127.0.0.1 in ``where`` (openssl's command line)."""
    cert, key = where / "tls.crt", where / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=bench",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


def _command(
    d: ServerDef, port: int, data: Path, cell: Path, tercel: list[str] | None
) -> tuple[list[str], Path | None]:
    """The argv for ``d`` and, for tercel, the ports file to poll."""
    host = "127.0.0.1"
    cert, key = make_certificate(cell) if d.tls else (Path(), Path())
    if d.kind == "memcached":
        return ["memcached", "-t", "1", "-l", host, "-p", str(port), "-U", "0", "-u", "root"], None
    if d.kind == "redis":
        fsync = d.opts[0]
        return [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            host,
            "--dir",
            str(data),
            "--appendonly",
            "yes",
            "--appendfsync",
            fsync,
            "--save",
            "",
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
            "--loglevel",
            "warning",
            *(
                (
                    "--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert),
                    "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert),
                    "--tls-auth-clients", "no",
                )
                if d.tls
                else ()
            ),
        ], None  # fmt: skip
    if d.kind == "beanstalkd":
        return ["beanstalkd", "-l", host, "-p", str(port), "-b", str(data), *d.opts], None
    if d.kind == "tercel-bs":  # the beanstalkd front end, with beanstalkd's own flags
        if not tercel:
            raise RuntimeError("tercel is not installed")
        ports = cell / f"ports-{time.monotonic_ns()}.json"
        argv = [*tercel, "beanstalkd", "-l", host, "-p", "0", "-b", str(data), *d.opts]
        return [*argv, "--ports-file", str(ports)], ports
    if d.kind == "tercel":
        if not tercel:
            raise RuntimeError("tercel is not installed")
        cfg = cell / "tercel.toml"
        tls = f'[tls]\ncert = "{cert}"\nkey = "{key}"\n' if d.tls else ""
        cfg.write_text(f"[queues]\nsync_journal = {d.opts[0]}\n{tls}")
        ports = cell / f"ports-{time.monotonic_ns()}.json"
        return [
            *tercel,
            "serve",
            "--data-dir",
            str(data),
            "--host",
            host,
            "--memcache-port",
            str(port),
            "--ports-file",
            str(ports),
            "--admin-port",  # any free port: a fixed one collides with other servers here
            "0",
            "--config",
            str(cfg),
            "--log-level",
            "warning",
        ], ports
    raise ValueError(d.kind)


def _read_ports(path: Path, deadline: float, proc: subprocess.Popen[bytes]) -> int:
    """Polls tercel's ports file and returns its memcache port."""
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"tercel exited with {proc.returncode} before writing its ports")
        try:
            ports = json.loads(path.read_text())
            return int(ports.get("memcache") or ports["beanstalk"])
        except (OSError, ValueError, KeyError):
            if time.monotonic() > deadline:
                raise TimeoutError(f"tercel wrote no ports file at {path}") from None
            time.sleep(0.01)


def start(
    d: ServerDef,
    workdir: Path,
    cpu: int | None,
    *,
    data_dir: Path | None = None,
    cell_dir: Path | None = None,
    timeout: float = 30.0,
    port: int | None = None,
) -> Running:
    """Starts ``d`` fresh (see module docstring); raises if it does not come up in time.

    With ``port`` the server listens there (a restart on the port it had): tercel is then
    started with ``--memcache-port PORT`` and, like the peers, counts as up once the port
    accepts connections (its ports file is not waited for)."""
    workdir.mkdir(parents=True, exist_ok=True)
    cell = cell_dir or Path(tempfile.mkdtemp(prefix=f"{d.name}-", dir=workdir))
    data = data_dir or cell / "data"
    data.mkdir(parents=True, exist_ok=True)
    fixed = port is not None
    if port is None:
        port = 0 if d.is_tercel else free_port()
    argv, ports_file = _command(d, port, data, cell, tercel_command())
    if fixed:
        ports_file = None
    if cpu is not None:
        argv = ["taskset", "-c", str(cpu), *argv]
    log = cell / "server.log"
    with open(log, "ab") as logf:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            cwd=cell,
            env=_env(d) if d.is_tercel else None,
        )
    r = Running(d, proc, port, data, cell, log)
    deadline = time.monotonic() + timeout
    try:
        if ports_file is not None:
            r.port = _read_ports(ports_file, deadline, proc)
        wait_port(r.port, deadline, proc)
    except BaseException:
        with contextlib.suppress(Exception):
            r.kill()
        tail = r.log_tail()
        raise RuntimeError(f"{d.name} did not start: {' '.join(argv)}\n{tail}") from None
    return r


def versions() -> dict[str, str]:
    """Version strings of the peer servers installed here (best effort)."""
    probes = {
        "memcached": ["memcached", "-V"],
        "redis-server": ["redis-server", "--version"],
        "beanstalkd": ["beanstalkd", "-v"],
    }
    out: dict[str, str] = {}
    for name, argv in probes.items():
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=5, check=False)
            out[name] = (p.stdout or p.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            out[name] = "not installed"
    cmd = tercel_command()
    if cmd:
        try:
            p = subprocess.run(
                [*cmd, "--version"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
                env=_env(),
            )
            out["tercel"] = (
                (p.stdout or p.stderr).strip().splitlines()[0] if p.returncode == 0 else ""
            )
        except (OSError, IndexError, subprocess.TimeoutExpired):
            out["tercel"] = ""
        if not out["tercel"]:
            out["tercel"] = "installed (no --version)"
    return out
