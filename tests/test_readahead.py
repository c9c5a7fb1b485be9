"""The read-ahead of ``tercel serve``'s modules (tercel/readahead.py): its list is what a real
start imports, and it finds each module's file as the import system does."""

from __future__ import annotations

import compileall
import subprocess
import sys
from importlib.machinery import PathFinder
from pathlib import Path

import pytest

from tercel import native, readahead
from tercel.testing import ServerProcess

CONFIG = '[queues]\nsync_journal = "50ms"\n'


def test_the_list_is_what_a_restart_imports_before_its_first_reply(tmp_path: Path) -> None:
    """A restart on a data dir with a queue and its checkpoint (the benchmark's restart after
    SIGTERM), recorded up to the import that follows the first replies."""
    data = tmp_path / "data"
    with ServerProcess(data, CONFIG) as srv:
        conn = srv.connect()
        for i in range(50):
            conn.sendall(b"set q 0 0 4\r\n%04d\r\n" % i)
            assert conn.recv(64) == b"STORED\r\n"
        conn.close()
        assert srv.stop() == 0
    out = tmp_path / "modules.txt"
    srv = ServerProcess(data, CONFIG, launcher=readahead.record_launcher(str(out)))
    with srv:
        conn = srv.connect()
        conn.sendall(b"get q\r\n")
        reply = b""
        while not reply.endswith(b"END\r\n"):
            reply += conn.recv(256)
        assert reply == b"VALUE q 0 4\r\n0000\r\nEND\r\n"
        conn.close()
        assert srv.stop() == 0
    recorded = list(dict.fromkeys(out.read_text().split()))
    assert "asyncio" in recorded and "tercel.server.app" in recorded
    # Compiled modules are loaded by the one shared library, not imported one by one; a pure
    # Python build has no shared library. The list holds both.
    either = {"tercel_native__mypyc", *native.compiled_modules()}
    missing = [m for m in recorded if m not in readahead.SERVE_MODULES]
    unused = [m for m in readahead.SERVE_MODULES if m not in recorded and m not in either]
    assert not missing and not unused, (
        f"readahead.SERVE_MODULES is stale: not listed {missing}, no longer imported {unused}; "
        f"a start imports, in this order:\n{' '.join(recorded)}"
    )


def test_files_are_found_as_imports_find_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "ra_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    names = ["ra_pkg", "ra_pkg.mod", "ra_pkg.nope", "ra_missing", "ra_missing.child", "os"]
    # Sources when there is no byte code; imported modules (os) and unknown ones left out.
    assert list(readahead.files(names)) == [str(pkg / "__init__.py"), str(pkg / "mod.py")]
    compileall.compile_dir(str(pkg), quiet=1)
    cache = sys.implementation.cache_tag
    assert list(readahead.files(names)) == [
        str(pkg / "__pycache__" / f"__init__.{cache}.pyc"),
        str(pkg / "__pycache__" / f"mod.{cache}.pyc"),
    ]
    # A submodule whose package is neither imported nor listed before it is left out.
    assert list(readahead.files(["ra_pkg.mod"])) == []
    assert "ra_pkg" not in sys.modules  # nothing was imported


def test_the_thread_never_raises() -> None:
    # files() fails on a name that is not a str: the thread ends quietly.
    readahead.read_ahead((None,), PathFinder)  # type: ignore[arg-type]
    readahead.start(["no_such_module", "no_such_module.child"])


def test_importing_the_command_line_loads_nothing_heavy() -> None:
    """``tercel.cli`` imports only the read-ahead, so ``tercel serve`` starts it before the
    imports it speeds up (logging, asyncio, the config's TOML parser...)."""
    code = (
        "import sys; before = set(sys.modules); import tercel.cli; "
        "print(' '.join(sorted(set(sys.modules) - before)))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert set(loaded) <= {
        "__future__",
        "tercel",
        "tercel.errors",
        "tercel.cli",
        "tercel.readahead",
    }, loaded
