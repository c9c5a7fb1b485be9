"""Which of tercel's modules run compiled, and whether any compiled module is stale.

The hot path can be compiled by mypyc from the same sources (``setup.py``, ``make native``):
each compiled module is an extension module beside its ``.py`` file, and Python imports the
extension first. An extension older than its source would silently run old code, so
:func:`stale_modules` compares the two; the test suite refuses to run over stale ones and the
server logs them at start-up.
"""

from __future__ import annotations

import importlib.machinery
import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


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


def stale_modules(package: Path = PACKAGE) -> list[str]:
    """Compiled modules whose source changed after the extension was built (run ``make``)."""
    stale = []
    for name, ext in _extensions(package):
        source = ext.parent / (name.rsplit(".", 1)[-1] + ".py")
        if source.exists() and source.stat().st_mtime > ext.stat().st_mtime:
            stale.append(name)
    return stale
