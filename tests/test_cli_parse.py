"""``tercel serve``'s own option reader (no argparse at start-up) reads what argparse reads,
and hands anything else to argparse."""

from __future__ import annotations

import pytest

from tercel import cli

AGREES = [
    [],
    ["--data-dir", "/tmp/d", "--memcache-port", "0", "--admin-port=0"],
    ["--host", "::1", "--thrift-port", "9", "--text-port=8", "--beanstalk-port", "7"],
    ["--config", "a.toml", "--ports-file", "p.json", "--log-level", "warning"],
    ["--memcache-port", "-1", "--host=127.0.0.1", "--host", "localhost"],  # last one wins
]


@pytest.mark.parametrize("argv", AGREES)
def test_the_fast_reader_agrees_with_argparse(argv: list[str]) -> None:
    fast = cli.parse_serve(argv)
    assert fast is not None
    full = cli.build_parser(tools=False).parse_args(["serve", *argv])
    assert vars(fast) == vars(full)


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--data", "/tmp/d"],  # argparse's abbreviations are argparse's business
        ["--memcache-port", "x"],
        ["--memcache-port"],
        ["--host", "--data-dir", "d"],
        ["--log-level", "loud"],
        ["extra"],
    ],
)
def test_anything_else_goes_to_argparse(argv: list[str]) -> None:
    assert cli.parse_serve(argv) is None


def test_the_ready_line_names_every_listener_the_dashboard_and_a_first_command() -> None:
    line = cli.ready_line("127.0.0.1", {"memcache": 22133, "admin": 2223}, ".venv/bin/tercel")
    assert line == (
        "ready: memcache 127.0.0.1:22133, admin 127.0.0.1:2223; "
        "dashboard http://127.0.0.1:2223/; "
        "try: .venv/bin/tercel put jobs hello && .venv/bin/tercel get jobs"
    )
    other = cli.ready_line("0.0.0.0", {"memcache": 5, "beanstalk": 11300}, "tercel")
    assert "beanstalk 127.0.0.1:11300" in other and "dashboard" not in other
    assert other.endswith("tercel get jobs --server 127.0.0.1:5")
    v6 = cli.ready_line("::1", {"memcache": 22133, "admin": 7})
    assert "dashboard http://[::1]:7/" in v6 and "--server [::1]:22133" in v6
    assert "try:" not in cli.ready_line("127.0.0.1", {"admin": 7})
