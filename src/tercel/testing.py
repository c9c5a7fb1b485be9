"""tercel's testing API: run a real server in a test, and break its files on purpose.

This module and :mod:`tercel.journal.faults` are public and documented (docs/testing.md):
tercel's own tests, the soak (``bench/soak.py``) and users' tests use the same helpers. What
is public is in ``__all__``.

- :class:`ServerProcess` runs ``tercel serve`` in a subprocess on ``127.0.0.1:0`` and learns the
  bound port through a FIFO handed to ``--ports-file``: the read blocks until the server has
  bound every listener, so there is no polling and no sleep. It can be stopped with SIGTERM,
  killed with SIGKILL and restarted on the same data directory. :class:`BeanstalkdProcess`
  does the same for ``tercel beanstalkd``.
- **Faults in a server process.** Hand ``launcher=FAULTY_LAUNCHER`` to a
  :class:`ServerProcess` and put rules in its environment under :data:`FAULTS_ENV` (a JSON
  list, :func:`faults_from_rules`): the server then runs with a
  :class:`~tercel.journal.faults.FaultyFiles` as the file seam of every data dir (a disk that
  fills up, an fsync that fails, descriptors that run out, a slow disk, a crash at a chosen
  call). With :data:`POWER_LOSS_ENV` set to a directory, the seam also records what a power
  cut would leave (:class:`~tercel.journal.faults.PowerLossFiles`; after a SIGKILL,
  :func:`~tercel.journal.faults.power_loss` rewrites the data dir to that state).
- **Faults in-process**: :class:`~tercel.journal.faults.FaultyFiles` (re-exported here) handed
  to a :class:`~tercel.journal.files.DataDir` (``ops=``). The file seam
  (:class:`~tercel.journal.files.FileOps`) is the one way to break files: production code never
  tests for a fault.

Run as ``python -m tercel.testing serve ARGS...`` (what :data:`FAULTY_LAUNCHER` does), this
module installs the rules of :data:`FAULTS_ENV` and runs ``tercel`` with ``ARGS``.
"""

from __future__ import annotations

import errno
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from tercel.journal import files
from tercel.journal.faults import (
    COMPACTION_CRASHES,
    CRASH_EXIT,
    JOB_COMPACTION_CRASHES,
    FaultyFiles,
    PowerLossFiles,
    Rule,
    power_loss,
)

__all__ = [
    "COMPACTION_CRASHES",
    "CRASH_EXIT",
    "FAULTS_ENV",
    "FAULTY_LAUNCHER",
    "JOB_COMPACTION_CRASHES",
    "POWER_LOSS_ENV",
    "BeanstalkdProcess",
    "FaultyFiles",
    "PowerLossFiles",
    "Rule",
    "ServerProcess",
    "ServerStartError",
    "faults_from_rules",
    "power_loss",
    "run_with_faults",
]

FAULTS_ENV = "TERCEL_SOAK_FAULTS"
"""The environment variable that carries a server's fault rules (a JSON list, see
:func:`faults_from_rules`) to :data:`FAULTY_LAUNCHER`."""
POWER_LOSS_ENV = "TERCEL_POWER_LOSS_SHADOW"
"""When set, a directory: the file seam also records there what a power cut would leave of the
data dir (:class:`~tercel.journal.faults.PowerLossFiles`; the test then calls
:func:`~tercel.journal.faults.power_loss` after a SIGKILL)."""
FAULTY_LAUNCHER: tuple[str, ...] = (sys.executable, "-m", "tercel.testing")
"""A :class:`ServerProcess` ``launcher``: ``tercel`` with the rules of :data:`FAULTS_ENV` (and
:data:`POWER_LOSS_ENV`) installed in its file seam before it opens its data dir."""


class ServerStartError(RuntimeError):
    """The server process exited, or did not bind its ports in time."""


_LIMITED = (
    "import resource, runpy, sys; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, ({n}, {n})); "
    "sys.argv[0] = 'tercel'; "
    "runpy.run_module('tercel', run_name='__main__', alter_sys=True)"
)


class ServerProcess:
    """A ``tercel serve`` subprocess (context manager: started on enter, stopped on exit)."""

    def __init__(
        self,
        data_dir: str | Path,
        config: str | None = None,
        *,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        log_level: str = "warning",
        admin_port: int | None = 0,
        open_files: int | None = None,
        launcher: tuple[str, ...] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.config_text = config
        self.extra_args = extra_args
        self.env = env
        self.log_level = log_level
        self.admin_port = admin_port
        """Passed as ``--admin-port`` (0: any free port, in ``ports["admin"]``); None: the
        config file's setting or the default, 2223."""
        self.open_files = open_files
        """When set, the server runs under ``ulimit -n`` of this (soft and hard limit)."""
        self.launcher = launcher
        """The command line before ``serve`` (default: this Python, ``-m tercel``): say, a
        launcher that installs fault injection first (:data:`FAULTY_LAUNCHER`)."""
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = ""
        self.ports: dict[str, int] = {}
        self._tmp = tempfile.mkdtemp(prefix="tercel-test-")

    @property
    def port(self) -> int:
        """The memcache port."""
        return self.ports["memcache"]

    @property
    def address(self) -> str:
        """``127.0.0.1:<memcache port>``."""
        return f"127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        """``http://127.0.0.1:<admin port>`` (KeyError when the admin server is off)."""
        return f"http://127.0.0.1:{self.ports['admin']}"

    def start(self, timeout: float = 30.0) -> ServerProcess:
        """Start the server and wait until it listens. Raises ServerStartError."""
        fifo = os.path.join(self._tmp, "ports")
        if os.path.exists(fifo):
            os.unlink(fifo)
        os.mkfifo(fifo)
        args = self._command(fifo)
        env = dict(os.environ, **(self.env or {}))
        self.log_path = os.path.join(self._tmp, "server.log")
        with open(self.log_path, "ab") as log_file:
            # stdout is never written by the server: its pipe closing tells us it died.
            self.proc = subprocess.Popen(
                args,
                env=env,
                stdout=subprocess.PIPE,
                stderr=log_file,
            )
        self.ports = self._read_ports(fifo, timeout)
        return self

    def _command(self, fifo: str) -> list[str]:
        """The server's command line; it writes its ports to ``fifo``."""
        launch = list(self.launcher or (sys.executable, "-m", "tercel"))
        if self.open_files:  # ulimit -n N, soft and hard, then run tercel as -m would
            launch = [sys.executable, "-c", _LIMITED.format(n=self.open_files)]
        args = [
            *launch,
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--host",
            "127.0.0.1",
            "--memcache-port",
            "0",
            "--ports-file",
            fifo,
            "--log-level",
            self.log_level,
            *(() if self.admin_port is None else ("--admin-port", str(self.admin_port))),
            *self.extra_args,
        ]
        if self.config_text is not None:
            cfg = os.path.join(self._tmp, "tercel.toml")
            Path(cfg).write_text(self.config_text)
            args += ["--config", cfg]
        return args

    def _read_ports(self, fifo: str, timeout: float) -> dict[str, int]:
        assert self.proc is not None
        # Opening the read end non-blocking never waits; select then wakes on the write or
        # on the process's stderr closing (it died), whichever comes first.
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        out = self.proc.stdout
        assert out is not None
        deadline = time.monotonic() + timeout
        chunks = []
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.kill()
                    raise ServerStartError("server did not bind its ports in time")
                ready, _, _ = select.select([fd, out.fileno()], [], [], left)
                if fd in ready:
                    data = os.read(fd, 4096)
                    if data:
                        chunks.append(data)
                        try:
                            return dict(json.loads(b"".join(chunks)))
                        except ValueError:
                            continue
                if out.fileno() in ready and not os.read(out.fileno(), 4096):
                    code = self._wait(30.0)
                    raise ServerStartError(f"server exited with {code}: {self.log()[-2000:]}")
        finally:
            os.close(fd)

    def log(self) -> str:
        """Everything the server has logged so far."""
        return Path(self.log_path).read_text(errors="replace")

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; the exit code."""
        if self.proc is None:
            return 0
        self.proc.send_signal(signal.SIGTERM)
        return self._wait(timeout)

    def wait(self, timeout: float = 30.0) -> int:
        """Wait for the server to exit by itself (``shutdown``); the exit code."""
        return self._wait(timeout)

    def kill(self) -> None:
        """SIGKILL and wait (nothing is flushed, nothing cleaned up)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        self._wait(30.0)

    def _wait(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        self.proc = None
        return code

    def start_refused(self, timeout: float = 30.0) -> int:
        """Start a server that must stop by itself (a corrupt journal: the background replay
        finds it before or just after the server listens); its exit code. Its log says why."""
        try:
            self.start(timeout)
        except ServerStartError as exc:
            code = re.search(r"exited with (-?\d+)", str(exc))
            if code is None:
                raise
            return int(code.group(1))
        return self._wait(timeout)

    @property
    def running(self) -> bool:
        """True while the process is alive."""
        return self.proc is not None and self.proc.poll() is None

    def restart(self) -> ServerProcess:
        """Stop (SIGTERM) if running, then start again on the same data directory."""
        if self.proc is not None:
            self.stop()
        return self.start()

    def connect(self, timeout: float = 10.0) -> socket.socket:
        """A new raw TCP connection to the memcache port."""
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc is not None:
            self.kill()


class BeanstalkdProcess(ServerProcess):
    """A ``tercel beanstalkd`` subprocess on ``127.0.0.1:0`` (``-b data_dir`` unless
    ``data_dir`` is None: memory only). ``extra_args`` are beanstalkd flags (``-f0``, ``-z``)."""

    def __init__(
        self,
        data_dir: str | Path | None,
        *,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(data_dir or "", extra_args=extra_args, env=env, admin_port=None)
        self.memory_only = data_dir is None

    def _command(self, fifo: str) -> list[str]:
        args = [sys.executable, "-m", "tercel", "beanstalkd", "-l", "127.0.0.1", "-p", "0"]
        if not self.memory_only:
            args += ["-b", str(self.data_dir)]
        return [*args, "--ports-file", fifo, *self.extra_args]

    @property
    def port(self) -> int:
        """The beanstalkd port."""
        return self.ports["beanstalk"]


# ---- the fault launcher -------------------------------------------------------------------------


def faults_from_rules(rules: list[dict[str, object]]) -> FaultyFiles:
    """The rules, as :data:`FAULTS_ENV` carries them, as a :class:`FaultyFiles`. A rule is an
    object:

    - ``{"kind": "crash", "op": "pwritev", "after": true, "skip": 300}``: the process exits
      with status 99 (:data:`CRASH_EXIT`) just after (or before) that call, once;
    - ``{"kind": "fail", "op": "fdatasync", "errno": "EIO", "skip": 20, "times": 1}``: the
      call raises that ``OSError``; ``"until": ["open", "/release"]`` ends the rule once such a
      call has completed (a client lifts the fault by creating the queue ``release``);
    - ``{"kind": "slow", "op": "fdatasync", "seconds": 0.02}``: the call waits first.

    ``path`` (a substring of the file's path) may narrow any rule; ``op`` is a
    :class:`~tercel.journal.files.FileOps` method. Raises ValueError for an unknown kind."""
    faults = FaultyFiles()
    for rule in rules:
        op = str(rule["op"])
        path = str(rule["path"]) if "path" in rule else None
        skip = int(str(rule.get("skip", 0)))
        if rule["kind"] == "crash":
            faults.crash(op, path=path, after=bool(rule.get("after")), skip=skip)
        elif rule["kind"] == "fail":
            times = int(str(rule["times"])) if "times" in rule else None
            code = getattr(errno, str(rule["errno"]))
            until = rule.get("until")
            off = (str(until[0]), str(until[1])) if isinstance(until, list) else None
            faults.fail(op, code, path=path, skip=skip, times=times, disarmed_by=off)
        elif rule["kind"] == "slow":
            faults.slow(op, float(str(rule["seconds"])), path=path)
        else:
            raise ValueError(f"unknown fault kind in {rule}")
    return faults


def _with_power_loss(ops: files.FileOps, argv: list[str]) -> files.FileOps:
    """``ops`` under a :class:`PowerLossFiles` of the ``--data-dir`` in ``argv``, when the
    environment asks for one (:data:`POWER_LOSS_ENV`)."""
    shadow = os.environ.get(POWER_LOSS_ENV)
    if not shadow:
        return ops
    data_dir = argv[argv.index("--data-dir") + 1]
    os.makedirs(data_dir, exist_ok=True)
    return PowerLossFiles(data_dir, shadow, inner=ops)


def run_with_faults(argv: list[str]) -> int:
    """``tercel ARGV`` with the faults of the environment in its file seam (the launcher)."""
    faults = faults_from_rules(json.loads(os.environ.get(FAULTS_ENV, "[]")))
    files.set_default_ops(_with_power_loss(faults, argv))
    from tercel.cli import main

    return main(argv)


if __name__ == "__main__":
    sys.exit(run_with_faults(sys.argv[1:]))
