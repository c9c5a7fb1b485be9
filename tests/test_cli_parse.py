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
    full = cli._build_parser(tools=False).parse_args(["serve", *argv])
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
