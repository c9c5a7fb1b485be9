"""What a log line quotes of network input (tercel/logtext.py)."""

from __future__ import annotations

import pytest

from tercel.logtext import MAX_QUOTED_CHARS, quoted


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("/queues/orders/flush", "/queues/orders/flush"),
        ("/x\nWARNING forged", "/x\\nWARNING forged"),
        ("a\r\tb", "a\\r\\tb"),
        ("\x1b[2J", "\\x1b[2J"),
        ("line\u2028sep", "line\\u2028sep"),
        ("back\\n-slash", "back\\\\n-slash"),
        ("é ü", "é ü"),
        (b"raw\n\xff", "raw\\nÿ"),
    ],
)
def test_unprintable_characters_and_backslashes_are_escaped(value: str | bytes, shown: str) -> None:
    assert quoted(value) == shown


def test_long_values_are_cut() -> None:
    assert quoted("a" * 10_000) == "a" * MAX_QUOTED_CHARS + "..."
    assert quoted("\n" * 10_000).count("\\n") == MAX_QUOTED_CHARS
