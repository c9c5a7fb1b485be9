"""Helpers for testing tercel (and programs that use it) against a real server.

:class:`ServerProcess` runs ``tercel serve`` in a subprocess on ``127.0.0.1:0`` and learns the
bound port through a FIFO handed to ``--ports-file``: the read blocks until the server has
bound every listener, so there is no polling and no sleep. It can be stopped with SIGTERM,
killed with SIGKILL and restarted on the same data directory.
"""

from __future__ import annotations

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
        script that installs fault injection first (``bench/faulty_serve.py``)."""
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
