"""The files under examples/ and the packaging files stay true: the example config parses and
names every setting, the systemd unit and the Dockerfile run commands that work."""

from __future__ import annotations

import dataclasses
import re
import shlex
import sys
import tomllib
from pathlib import Path
from typing import Any

from tercel import native
from tercel.config import QueueConfig, ServerSettings, load_config, parse_config
from tercel.testing import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "tercel.toml"


def uncommented(text: str) -> str:
    """The example with every "#key = value" and "#[table]" line switched on (prose comments
    have a space after the "#")."""
    return re.sub(r"(?m)^#(?=[\w\[])", "", text)


def test_example_config_parses_and_names_every_setting() -> None:
    config = load_config(EXAMPLE)  # as shipped: only the [server] essentials are set
    assert config.server.data_dir == "/var/lib/tercel"
    assert config.defaults == QueueConfig()
    everything = tomllib.loads(uncommented(EXAMPLE.read_text()))
    parse_config(everything)  # every example value is valid
    assert set(everything["server"]) == {f.name for f in dataclasses.fields(ServerSettings)}
    queue_keys = {k for k, v in everything["queues"].items() if not isinstance(v, dict)}
    assert queue_keys == {f.name for f in dataclasses.fields(QueueConfig)}
    assert everything["queues"]["orders"] and everything["aliases"]


def test_commented_settings_show_the_built_in_defaults() -> None:
    """A "#key = value" line under [server] or [queues] holds the default, unless its own
    comment says it is an example."""
    section, checked = "", 0
    for line in EXAMPLE.read_text().splitlines():
        if re.match(r"^#?\[", line):
            section = line.lstrip("#").strip("[]")
        m = re.match(r"^#(\w+) = (.*)$", line)
        if m is None or section not in ("server", "queues") or "an example" in line:
            continue
        key, value = m.groups()
        parsed = parse_config(tomllib.loads(f"[{section}]\n{key} = {value}\n"))
        if section == "server":
            assert getattr(parsed.server, key) == getattr(ServerSettings(), key), key
        else:
            assert getattr(parsed.defaults, key) == getattr(QueueConfig(), key), key
        checked += 1
    assert checked >= 15


def test_systemd_unit_runs_tercel_with_the_example_config() -> None:
    unit = (ROOT / "examples" / "tercel.service").read_text()
    sections = dict(re.findall(r"(?m)^(\w+)=(.*)$", unit))
    argv = shlex.split(sections["ExecStart"])
    assert argv[0].endswith("/tercel") and argv[1] == "serve"
    assert "--config" in argv
    assert sections["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert sections["KillSignal"] == "SIGTERM"
    from tercel.cli import _build_parser

    args = _build_parser().parse_args(argv[1:])  # the flags exist
    assert args.config == "/etc/tercel/tercel.toml"


def test_build_summary_says_which_build_and_how_to_get_the_other() -> None:
    pure = native.build_summary([])
    assert pure.startswith("pure-Python build") and "0.6x" in pure and "C compiler" in pure
    compiled = native.build_summary(["tercel.clock", "tercel.session"])
    assert compiled.startswith("compiled build: 2 module(s)") and "TERCEL_NATIVE=0" in compiled
    assert sys.version_info >= (3, 11)


def test_readme_pymemcache_example_runs_and_sees_not_stored(tmp_path: Path) -> None:
    """The README's pymemcache snippet works as written, and its reason holds: with
    pymemcache's default noreply a refused set still returns True."""
    from pymemcache.client.base import Client

    readme = (ROOT / "README.md").read_text()
    snippet = re.search(r"```python\n(from pymemcache.*?)```", readme, re.S)
    assert snippet is not None
    with ServerProcess(tmp_path / "d", "[queues.full]\nmax_items = 0\n") as srv:
        code = snippet.group(1).replace('("127.0.0.1", 22133)', f'("127.0.0.1", {srv.port})')
        namespace: dict[str, Any] = {}
        exec(compile(code, "README.md", "exec"), namespace)
        namespace["c"].close()
        quiet = Client(("127.0.0.1", srv.port))
        told = Client(("127.0.0.1", srv.port), default_noreply=False)
        try:
            assert quiet.set("full", b"x") is True  # NOT_STORED, never read
            assert told.set("full", b"x") is False
            assert told.set("jobs", b"y") is True
        finally:
            quiet.close()
            told.close()
