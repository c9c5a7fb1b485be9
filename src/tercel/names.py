"""Queue names: the one rule every layer shares.

A name is 1-200 bytes of ``A-Z a-z 0-9 _ - : $ %``, with ``+`` allowed only as the fanout
separator between non-empty parts (``orders+audit``). These are the characters Kestrel's own
tools (``ksniff``) accept; ``.``, ``/`` and ``~`` can never appear, so a name is always a safe
file name inside the data directory and can never be confused with a rotated journal
(``name.N``) or a temp file (``name~~N``). Pure functions, no I/O: the codecs, the config loader
and the core all call them.
"""

from __future__ import annotations

import re

MAX_NAME_BYTES = 200

_NAME_RE = re.compile(rb"[A-Za-z0-9_\-:$%]+(?:\+[A-Za-z0-9_\-:$%]+)*")


def valid_name_bytes(name: bytes) -> bool:
    """True when ``name`` is an acceptable queue name."""
    return len(name) <= MAX_NAME_BYTES and _NAME_RE.fullmatch(name) is not None


def valid_name(name: str) -> bool:
    """True when ``name`` is an acceptable queue name (str form)."""
    try:
        raw = name.encode("ascii")
    except UnicodeEncodeError:
        return False
    return valid_name_bytes(raw)


def fanout_parent(name: str) -> str | None:
    """The parent of a fanout child (``a+b`` -> ``a``), or None for a plain queue."""
    plus = name.find("+")
    return None if plus < 0 else name[:plus]
