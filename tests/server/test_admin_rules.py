"""The admin listener's settings rule (server/admin_rules.py), in-process."""

from __future__ import annotations

import pytest

from tercel.server.admin_rules import is_loopback, split_origin


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("LOCALHOST", True),
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("10.0.0.1", False),
        ("::", False),
        ("example.com", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("origin", "parts"),
    [
        ("http://localhost:9", ("http", "localhost", 9)),
        ("HTTP://LocalHost:2223", ("http", "localhost", 2223)),
        ("http://127.0.0.1", ("http", "127.0.0.1", 80)),
        ("https://q.example", ("https", "q.example", 443)),
        ("http://[::1]:2223", ("http", "::1", 2223)),
        ("http://[::1]", ("http", "::1", 80)),
        ("null", None),
        ("file://", None),
        ("ftp://localhost:21", None),
        ("http://localhost:2223/x", None),
        ("http://user@localhost:2223", None),
        ("http://localhost:", None),
        ("http://localhost:0", None),
        ("http://localhost:99999", None),
        ("http://localhost:+1", None),
        ("http://[::1", None),
        ("http://[::1]x", None),
    ],
)
def test_origins_split_into_scheme_host_and_port(
    origin: str, parts: tuple[str, str, int] | None
) -> None:
    assert split_origin(origin) == parts
