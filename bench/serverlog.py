"""What a server log says, for the reliability runs (``bench/soak.py``, ``bench/fuzz.py``)."""

from __future__ import annotations

import re
from collections import Counter


def tracebacks(log: str) -> Counter[str]:
    """Each traceback in ``log``, as its innermost frame and its exception line, counted."""
    found: Counter[str] = Counter()
    frame = ""
    inside = False
    for line in log.splitlines():
        if line.startswith("Traceback"):
            inside, frame = True, ""
        elif inside and line.startswith("  File "):
            frame = line.strip()
        elif inside and not line.startswith(" "):
            found[f"{frame} -> {line.strip()[:200]}"] += 1
            inside = False
    return found


def compiled_modules(log: str) -> int | None:
    """How many mypyc-compiled modules the server said it runs (0: pure Python), None if it
    did not say."""
    if "pure-Python build" in log:
        return 0
    found = re.search(r"compiled build: (\d+) module|(\d+) compiled module", log)
    return int(found.group(1) or found.group(2)) if found else None
