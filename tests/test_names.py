"""Queue names: what is allowed, str and bytes forms agree, fanout parents."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tercel.names import (
    MAX_NAME_BYTES,
    RULE,
    fanout_parent,
    name_problem,
    valid_name,
    valid_name_bytes,
)

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


def test_name_problem_states_the_rule_and_the_slash() -> None:
    assert name_problem("orders+audit") is None
    why = name_problem("a.b")
    assert why is not None and RULE in why and "'a.b'" in why
    slash = name_problem("jobs/open")
    assert slash is not None and "'/' separates Kestrel's get options" in slash
    for name in BAD:
        assert name_problem(name) is not None


@pytest.mark.parametrize("name", [n for n in BAD if n])
def test_the_client_refuses_what_the_server_would_with_the_same_words(name: str) -> None:
    """The client codec checks names with the server's rule, before anything is sent; the
    server's memcache codec refuses the same names."""
    from tercel.errors import BadRequest, ProtocolError
    from tercel.protocol.commands import Flush, Set
    from tercel.protocol.memcache import MemcacheServerCodec
    from tercel.protocol.memcache_client import MemcacheClientCodec, get_key

    client = MemcacheClientCodec()
    for build in (lambda: client.send(Flush(name)), lambda: get_key(name, open=True)):
        with pytest.raises(BadRequest, match="bad queue name") as refused:
            build()
        assert RULE in str(refused.value)
    for good in GOOD:
        assert client.send(Set(good, 0, 0, b"x")).startswith(b"set " + good.encode())
    if " " not in name and "\n" not in name and "\t" not in name and "\x00" not in name:
        server = MemcacheServerCodec()
        server.receive_data(b"flush " + name.encode() + b"\r\n")
        with pytest.raises(ProtocolError, match="bad queue name"):
            server.next_command()
