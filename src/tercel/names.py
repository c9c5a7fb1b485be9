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


RULE = (
    f"a queue name is 1-{MAX_NAME_BYTES} characters of A-Z a-z 0-9 _ - : $ %, "
    "with + only between two parts (a fanout child, orders+audit)"
)
"""The rule of :func:`valid_name` in words, for error messages (``docs/protocol.md`` §2)."""


def name_problem(name: str) -> str | None:
    """None for a valid name, else why it is not one, in words a user can act on: the rule,
    and for a ``/`` that it is the separator of Kestrel's get options (``jobs/t=1000/open``),
    so a name can never hold one."""
    if valid_name(name):
        return None
    why = f"bad queue name {name[:80]!r}: {RULE}"
    if "/" in name:
        why += "; '/' separates Kestrel's get options (jobs/open), it cannot be part of a name"
    return why


def fanout_parent(name: str) -> str | None:
    """The parent of a fanout child (``a+b`` -> ``a``), or None for a plain queue."""
    plus = name.find("+")
    return None if plus < 0 else name[:plus]


# ---- keys: lease keys and dedup keys ----------------------------------------------------------

MAX_KEY_BYTES = 200

KEY_RULE = (
    f"a key is 1-{MAX_KEY_BYTES} characters of A-Z a-z 0-9 _ - : . $ % @ + = /"
    " (no spaces, no control or non-ASCII characters)"
)
"""The rule of :func:`valid_key` in words, for error messages (``docs/protocol.md``)."""


_KEY_PUNCTUATION = b"_-:.$%@+=/"
_PUNCTUATION_AS_LETTER = bytes.maketrans(_KEY_PUNCTUATION, b"a" * len(_KEY_PUNCTUATION))
"""Every byte to itself but the key's punctuation, to ``a``: a valid key then ``isalnum``."""


def valid_key_bytes(key: bytes) -> bool:
    """True when ``key`` is an acceptable lease key or dedup key (both kinds share the rule:
    one word on every text protocol, printable in logs and stats). Two C loops over the key
    (a translate with a fixed table, ``isalnum``): a keyed put pays no regular expression
    (~1,600 instructions a key, callgrind)."""
    return (
        0 < len(key) <= MAX_KEY_BYTES
        and key.isascii()
        and key.translate(_PUNCTUATION_AS_LETTER).isalnum()
    )


def valid_key(key: str) -> bool:
    """:func:`valid_key_bytes` for a str."""
    return key.isascii() and valid_key_bytes(key.encode("ascii"))


def key_problem(key: str) -> str | None:
    """None for a valid key, else why it is not one, naming the rule (:data:`KEY_RULE`)."""
    if valid_key(key):
        return None
    try:
        raw = key.encode("ascii")
    except UnicodeEncodeError:
        return f"bad key {key[:80]!r}: {KEY_RULE}"
    if not raw:
        return f"empty key: {KEY_RULE}"
    if len(raw) > MAX_KEY_BYTES:
        return f"key too long ({len(raw)} bytes): {KEY_RULE}"
    return f"bad key {key[:80]!r}: {KEY_RULE}"
