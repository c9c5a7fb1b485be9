"""Queue names: what is allowed, str and bytes forms agree, fanout parents."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tercel.names import MAX_NAME_BYTES, fanout_parent, valid_name, valid_name_bytes

GOOD = ["a", "Q", "0", "work", "a_b-c:d$e%f", "a+b", "a+b+c", "x" * MAX_NAME_BYTES]
BAD = [
    "",
    ".",
    "..",
    "../x",
    "a/b",
    "a.1",
    "a~~1",
    "~",
    "a b",
    "a\tb",
    "a\n",
    "+",
    "+a",
    "a+",
    "a++b",
    "x" * (MAX_NAME_BYTES + 1),
    "caf\u00e9",
    "\u0661",  # a non-ASCII digit
    "a\x00",
    "a*",
    "a'",
]


@pytest.mark.parametrize("name", GOOD)
def test_good_names(name: str) -> None:
    assert valid_name(name)
    assert valid_name_bytes(name.encode())


@pytest.mark.parametrize("name", BAD)
def test_bad_names(name: str) -> None:
    assert not valid_name(name)
    assert not valid_name_bytes(name.encode("utf-8"))


def test_non_ascii_bytes() -> None:
    assert not valid_name_bytes(b"\xff")
    assert not valid_name_bytes(b"caf\xe9")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30))
def test_valid_names_are_safe_file_names(name: str) -> None:
    if valid_name(name):
        assert not set(name) & set("./~\\ \x00")
        assert name.isascii()
        assert valid_name_bytes(name.encode())
    else:
        assert not (name.isascii() and valid_name_bytes(name.encode()))


def test_fanout_parent() -> None:
    assert fanout_parent("a") is None
    assert fanout_parent("a+b") == "a"
    assert fanout_parent("a+b+c") == "a"
