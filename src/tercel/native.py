"""Which of tercel's modules run compiled, and whether any compiled module is stale.

The hot path can be compiled by mypyc from the same sources (``setup.py``, ``make native``):
each compiled module is an extension module beside its ``.py`` file, and Python imports the
extension first. An extension older than its source would silently run old code, so
:func:`stale_modules` compares the two; the test suite refuses to run over stale ones and the
server logs them at start-up (an installed wheel is exempt: its files are written together, in
no particular order). :func:`build_summary` is the start-up line that says which build runs.
"""

from __future__ import annotations

import importlib.machinery
import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
PURE_SPEED = "0.6x"
"""Pure Python's speed relative to the compiled build on the request path: callgrind
instructions per command 44.0k -> 27.5k (set) and 32.0k -> 18.2k (get), server CPU per 1 KiB
command 14.2 -> 9.3 us (enqueue) and 10.8 -> 5.9 us (dequeue) (measured at commit 1f1f505:
``git show 1f1f505:docs/benchmarks.md``, "Profile-driven changes")."""


def _extensions(package: Path) -> list[tuple[str, Path]]:
    """(dotted module name, extension path) for every extension module inside ``package``."""
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    found = []
    for root, _dirs, files in os.walk(package):
        for name in files:
            for suffix in suffixes:
                if name.endswith(suffix):
                    rel = Path(root, name[: -len(suffix)]).relative_to(package.parent)
                    found.append((".".join(rel.parts), Path(root, name)))
                    break
    return sorted(found)


def compiled_modules(package: Path = PACKAGE) -> list[str]:
    """Dotted names of the modules that have a compiled extension beside their source."""
    return [name for name, _ in _extensions(package)]


def _from_wheel(package: Path) -> bool:
    """True when ``package`` was installed from a wheel (``pip install .``), not a checkout."""
    return any(package.parent.glob(package.name + "-*.dist-info"))


def stale_modules(package: Path = PACKAGE) -> list[str]:
    """Compiled modules whose source changed after the extension was built (run ``make``)."""
    if _from_wheel(package):
        return []
    # The code is in the one shared library mypyc builds for the group (setup.py's
    # group_name); a rebuild may copy the small per-module shims from build/ with their old
    # times, so the library's time counts as the build's.
    library = max(
        (lib.stat().st_mtime for lib in package.parent.glob("tercel_native__mypyc*.so")),
        default=0.0,
    )
    stale = []
    for name, ext in _extensions(package):
        source = ext.parent / (name.rsplit(".", 1)[-1] + ".py")
        if source.exists() and source.stat().st_mtime > max(ext.stat().st_mtime, library):
            stale.append(name)
    return stale


def build_summary(compiled: list[str]) -> str:
    """One plain sentence for the start-up log: which build runs and how to get the other."""
    if compiled:
        return (
            f"compiled build: {len(compiled)} module(s) of the request path compiled by mypyc "
            "(TERCEL_NATIVE=0 at install time, or `find src -name '*.so' -delete` in a "
            "checkout, gives pure Python)"
        )
    return (
        f"pure-Python build: about {PURE_SPEED} the speed of the compiled one "
        "(docs/benchmarks.md); to compile, install a C compiler and the Python headers "
        "(apt-get install gcc python3-dev) and reinstall (pip install . ; in a checkout: "
        "make native)"
    )
