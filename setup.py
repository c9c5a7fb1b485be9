"""The native build: compiles tercel's hot path with mypyc (docs/architecture.md, "Native
modules").

``TERCEL_NATIVE`` in the environment chooses the build:

- unset (``pip install .``): compiled when a C compiler and the Python headers are there, else
  pure Python, and a C compiler that fails falls back to pure Python too. Either way the build
  says which one it made, and the server says it again at start-up.
- ``1`` (``make native``): compiled, or the build fails.
- ``0``: pure Python (``make``'s editable install: ``make native`` compiles in place after it).

The modules in :data:`NATIVE_MODULES` are compiled by mypyc from the same, type-checked
sources into extension modules that take precedence over the ``.py`` files on import.
``tercel.native`` reports which modules run compiled and refuses stale ones. mypyc runs only
for commands that build (not for ``egg_info``/``dist_info``, which pip runs first), and the
build prints progress: the C compile of the hot path takes 1-2 minutes of CPU.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import threading
import time
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

NATIVE_MODULES = [
    "tercel/clock.py",
    "tercel/config.py",
    "tercel/core/stats.py",
    "tercel/session.py",
    "tercel/names.py",
    "tercel/protocol/commands.py",
    "tercel/protocol/memcache.py",
    "tercel/protocol/memcache_keyed.py",
    "tercel/protocol/dedup.py",
    "tercel/core/items.py",
    "tercel/core/keyed_state.py",
    "tercel/core/queue_state.py",
    "tercel/core/dedup.py",
    "tercel/core/queue_paging.py",
    "tercel/core/keyed.py",
    "tercel/core/queue_upkeep.py",
    "tercel/core/queue_replay.py",
    "tercel/core/queue.py",
    "tercel/core/collection.py",
    "tercel/core/reservations.py",
    "tercel/core/source.py",
    "tercel/journal/records.py",
    "tercel/journal/reader.py",
    "tercel/journal/files.py",
    "tercel/journal/append.py",
    "tercel/journal/base.py",
    "tercel/journal/checkpointing.py",
    "tercel/journal/snapshot.py",
    "tercel/journal/leases.py",
    "tercel/journal/rotation.py",
    "tercel/journal/replay.py",
    "tercel/journal/readbehind.py",
    "tercel/journal/journal.py",
    "tercel/server/commit.py",
    "tercel/server/auth.py",
    "tercel/server/context.py",
    "tercel/server/deadlines.py",
    "tercel/server/connection.py",
    "tercel/server/kestrel/connection.py",
    "tercel/server/kestrel/ops.py",
    "tercel/server/memcache/connection.py",
    "tercel/server/memcache/leases.py",
    "tercel/protocol/kestrel_text.py",
    "tercel/server/text/connection.py",
    "tercel/server/thrift/connection.py",
    "tercel/protocol/thrift_check.py",
    "tercel/protocol/beanstalk.py",
    "tercel/core/tubes/model.py",
    "tercel/core/tubes/log.py",
    "tercel/core/tubes/state.py",
    "tercel/core/tubes/timers.py",
    "tercel/core/tubes/store.py",
    "tercel/journal/jobrecords.py",
    "tercel/journal/joblog.py",
    "tercel/server/beanstalk/service.py",
    "tercel/server/beanstalk/connection.py",
]
"""The request path (codec, handlers, session, queue, journal, group commit): the modules whose
interpretation cost is most of a command's CPU (docs/benchmarks.md)."""

BUILDING = frozenset(("build", "build_ext", "bdist_wheel", "install", "develop", "editable_wheel"))
"""setup.py commands that compile; the others (metadata, sdist) never run mypyc."""
HEARTBEAT_S = 15.0
"""While the C compiler runs, a line every this many seconds says it still does."""
PURE_HINT = (
    "pure Python runs about 0.6x the speed of the compiled build (docs/benchmarks.md); to "
    "compile, install a C compiler and the Python headers (apt-get install gcc python3-dev) "
    "and reinstall"
)


def say(message: str) -> None:
    """A progress line on stderr (pip shows it with ``-v``; ``make`` always)."""
    print(f"tercel build: {message}", file=sys.stderr, flush=True)


def missing_toolchain() -> str | None:
    """Why no C extension can be built here, or None when a compiler and headers exist."""
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        return f"no C compiler ({cc} not found)"
    if not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
        return "no Python headers (Python.h)"
    return None


def native_mode() -> str:
    """``"1"``, ``"0"`` or ``"auto"`` from ``TERCEL_NATIVE``."""
    mode = os.environ.get("TERCEL_NATIVE", "auto").strip().lower() or "auto"
    return mode if mode in ("0", "1") else "auto"


class BuildExt(build_ext):
    """build_ext that shows progress and, unless ``TERCEL_NATIVE=1``, falls back to pure
    Python when compiling fails (every extension or none: the per-module shims import the
    shared group module)."""

    def build_extensions(self) -> None:
        start = time.monotonic()
        stop = threading.Event()
        cc = getattr(self.compiler, "compiler", ["the C compiler"])[0]

        def heartbeat() -> None:
            while not stop.wait(HEARTBEAT_S):
                say(f"still compiling ({time.monotonic() - start:.0f} s)")

        say(f"compiling {len(self.extensions)} extension modules with {cc}")
        beat = threading.Thread(target=heartbeat, daemon=True)
        beat.start()
        try:
            super().build_extensions()
        except Exception as exc:
            if native_mode() == "1":
                raise
            for ext in self.extensions:
                path = self.get_ext_fullpath(ext.name)
                if os.path.exists(path):
                    os.unlink(path)
            self.extensions = []
            reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            say(f"compiling failed ({reason}); installing pure Python: {PURE_HINT}")
            return
        finally:
            stop.set()
            beat.join()
        say(f"compiled build done in {time.monotonic() - start:.0f} s")


def ext_modules() -> list[Any]:
    """mypyc's extension modules when this command builds and the mode allows, else none."""
    mode = native_mode()
    if mode == "0" or not BUILDING.intersection(sys.argv[1:]):
        return []
    why = missing_toolchain()
    if why is not None:
        if mode == "1":
            raise SystemExit(f"tercel build: TERCEL_NATIVE=1 but {why}")
        say(f"{why}: installing pure Python; {PURE_HINT}")
        return []
    from mypyc.build import mypycify

    start = time.monotonic()
    say(f"mypyc: type-checking {len(NATIVE_MODULES)} modules and generating C")
    paths = [os.path.join("src", m) for m in NATIVE_MODULES]
    exts = list(mypycify(paths, opt_level="3", group_name="tercel_native"))
    say(f"mypyc: C generated in {time.monotonic() - start:.0f} s")
    return exts


setup(ext_modules=ext_modules(), cmdclass={"build_ext": BuildExt})
