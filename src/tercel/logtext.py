"""What a log line may quote of what came from the network.

A string a client chose (a request path, a header, a name, a command) goes through
:func:`quoted` before it reaches a log line, so it can never start a line of its own (a
``%0a`` in a path would otherwise forge one), move a terminal's cursor, or fill the log.
Pure, no imports: every layer may call it.
"""

from __future__ import annotations

MAX_QUOTED_CHARS = 200
"""How much of one network string a log line shows; the rest is cut to ``...``."""


def quoted(value: str | bytes, limit: int = MAX_QUOTED_CHARS) -> str:
    """``value`` with every character that is not printable (line breaks, tabs, escapes,
    other control and format characters) and every backslash written as a Python escape
    (``\\n``, ``\\x1b``, ``\\u2028``, ``\\\\``), cut to ``limit`` characters; bytes are read as
    Latin-1 first. Printable text without a backslash comes back unchanged."""
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    if len(text) > limit:
        text = text[:limit] + "..."
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(
        ch if ch.isprintable() and ch != "\\" else ch.encode("unicode_escape").decode("ascii")
        for ch in text
    )
