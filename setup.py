"""Optional native build: compiles tercel's hot path with mypyc (docs/architecture.md, "Native
modules").

``pip install .`` alone installs pure Python. With ``TERCEL_NATIVE=1`` in the environment (the
Makefile sets it, see ``make native``) the modules listed in :data:`NATIVE_MODULES` are compiled
by mypyc from the same, type-checked sources; the extension modules land beside the sources
(``build_ext --inplace``) and take precedence over them on import. ``tercel.native`` reports
which modules are compiled and refuses stale ones.
"""

from __future__ import annotations

import os

from setuptools import setup

NATIVE_MODULES = [
    "tercel/clock.py",
    "tercel/config.py",
    "tercel/core/stats.py",
    "tercel/session.py",
    "tercel/protocol/commands.py",
    "tercel/protocol/memcache.py",
    "tercel/core/queue.py",
    "tercel/core/collection.py",
    "tercel/core/reservations.py",
    "tercel/journal/records.py",
    "tercel/journal/reader.py",
    "tercel/journal/journal.py",
    "tercel/server/commit.py",
    "tercel/server/context.py",
    "tercel/server/connection.py",
    "tercel/server/memcache/connection.py",
    "tercel/server/memcache/leases.py",
    "tercel/protocol/kestrel_text.py",
    "tercel/server/kestrel_ops.py",
    "tercel/server/text/connection.py",
    "tercel/server/thrift/connection.py",
]
"""The request path (codec, handlers, session, queue, journal, group commit): the modules whose
interpretation cost is most of a command's CPU (docs/benchmarks.md)."""


def _ext_modules() -> list[object]:
    if os.environ.get("TERCEL_NATIVE") != "1":
        return []
    from mypyc.build import mypycify

    paths = [os.path.join("src", m) for m in NATIVE_MODULES]
    return list(mypycify(paths, opt_level="3", group_name="tercel_native"))


setup(ext_modules=_ext_modules())
