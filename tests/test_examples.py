"""The files under examples/ and the packaging files stay true: the example config parses and
names every setting, the systemd unit and the Dockerfile run commands that work."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
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
    from tercel.cli import build_parser

    args = build_parser().parse_args(argv[1:])  # the flags exist
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


# ---- the README, as a new user pastes it ---------------------------------------------------

README = ROOT / "README.md"
TERCEL = ".venv/bin/tercel"


def blocks(text: str, lang: str) -> list[str]:
    """The fenced code blocks of ``text`` in language ``lang``, in order."""
    return re.findall(rf"(?ms)^```{lang}\n(.*?)^```", text)


def shell_lines(block: str) -> list[str]:
    """The commands of a sh block, their trailing comments cut."""
    return [re.sub(r"\s+#.*$", "", line) for line in block.splitlines() if line.strip()]


def test_readme_starts_with_make_serve_and_make_test() -> None:
    first = blocks(README.read_text(), "sh")[0]
    assert [line.split("#")[0].strip() for line in first.splitlines()] == [
        "make serve",
        "make test",
    ]


def test_readme_ready_line_is_the_one_the_server_logs() -> None:
    from tercel.cli import ready_line

    line = ready_line("127.0.0.1", {"memcache": 22133, "admin": 2223}, TERCEL)
    assert f"INFO tercel: {line}\n" in README.read_text()


def test_every_tercel_command_is_the_venv_one() -> None:
    """Pasted on a fresh clone after ``make serve``, a bare ``tercel`` is not on PATH."""
    for block in blocks(README.read_text(), "sh"):
        for line in shell_lines(block):
            assert not re.search(r"(^|[|;&]\s*)tercel\b", line), line


def test_readme_serve_synopsis_has_every_option() -> None:
    from tercel.cli import SERVE_OPTIONS

    flags = {f"--{flag}" for flag, _, _ in SERVE_OPTIONS} | {"--log-level"}
    for doc in (README, ROOT / "docs" / "configuration.md"):
        synopsis = re.search(r"(?m)^tercel serve \[.*\n(?: +.*\n)*", doc.read_text())
        assert synopsis is not None, doc
        assert set(re.findall(r"--[a-z-]+", synopsis.group(0))) == flags, doc


def _venv_shim(folder: Path) -> None:
    """``folder/.venv/bin/tercel``: this Python's tercel, so README lines run as written."""
    shim = folder / ".venv" / "bin" / "tercel"
    shim.parent.mkdir(parents=True)
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m tercel "$@"\n')
    shim.chmod(0o755)


def _bash(
    line: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["bash", "-c", line], cwd=cwd, env=env, capture_output=True, timeout=60, check=False
    )


def test_readme_shell_commands_run_as_pasted(tmp_path: Path) -> None:
    """Every command of the README's sh blocks, verbatim, in order, against a server in the
    role of ``make serve`` (``$TERCEL_SERVERS`` points the default at it); long-running ones
    (``serve``, ``beanstalkd``) only parse, the journal tools run once the server is stopped;
    ``make`` lines are left out."""
    from tercel import beanstalkd_cli
    from tercel.cli import build_parser

    _venv_shim(tmp_path)
    sh_blocks = blocks(README.read_text(), "sh")[1:]  # the first is make serve / make test
    with ServerProcess(tmp_path / "tercel-data") as srv:
        env = dict(os.environ, TERCEL_SERVERS=srv.address)
        later, outputs = [], []
        for line in (line for block in sh_blocks for line in shell_lines(block)):
            argv = shlex.split(line.split("|")[-1])
            if argv[:2] == [TERCEL, "serve"]:
                assert build_parser().parse_args(argv[1:]).command == "serve"
            elif argv[:2] == [TERCEL, "beanstalkd"]:
                assert not isinstance(beanstalkd_cli.parse(argv[2:]), int), line
            elif argv[:2] == [TERCEL, "journal"]:
                later.append(line)
            elif argv[0] != "make":  # make targets: the Makefile's own business
                assert TERCEL in line, line
                done = _bash(line, tmp_path, env)
                assert done.returncode == 0, (line, done.stderr)
                outputs.append(done.stdout)
    assert outputs[2:5] == [b"one\n", b"two\nthree\n", b"4\n"]  # First steps, as commented
    assert (tmp_path / "item.bin").read_bytes() == b"x"  # --raw: no newline
    assert later
    for line in later:
        done = _bash(line, tmp_path)
        assert done.returncode == 0, (line, done.stderr)


def test_readme_client_example_runs(tmp_path: Path) -> None:
    snippet = next(b for b in blocks(README.read_text(), "python") if "tercel.client" in b)
    assert '"127.0.0.1:22133"' in snippet
    with ServerProcess(tmp_path / "d") as srv:
        code = snippet.replace('"127.0.0.1:22133"', f'"{srv.address}"')
        exec(compile(code, "README.md", "exec"), {})


def test_readme_beanstalk_example_runs(tmp_path: Path) -> None:
    snippet = next(b for b in blocks(README.read_text(), "python") if "greenstalk" in b)
    with ServerProcess(tmp_path / "d", extra_args=("--beanstalk-port", "0")) as srv:
        code = snippet.replace("11300)", f"{srv.ports['beanstalk']})")
        namespace: dict[str, Any] = {}
        exec(compile(code, "README.md", "exec"), namespace)
        assert namespace["job"].body == "hello"


def test_protocol_md_shows_the_bad_name_message_the_cli_prints() -> None:
    doc = (ROOT / "docs" / "protocol.md").read_text()
    shown = re.search(r"(?m)^\$ \.venv/bin/tercel get a/b\n(.*)$", doc)
    assert shown is not None
    done = subprocess.run(
        [sys.executable, "-m", "tercel", "get", "a/b"], capture_output=True, check=False
    )
    assert done.returncode == 2
    assert done.stderr.decode().splitlines()[-1] == shown.group(1)


def test_no_doc_cites_a_folder_the_repository_does_not_have() -> None:
    for doc in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        assert "reference/" not in doc.read_text(), doc


def test_make_serve_passes_args_on_quietly() -> None:
    """``make serve ARGS=...`` (dry run, the build steps taken as done): one command, ARGS at
    its end, and ``@`` on it so make does not echo it."""
    outer = ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")  # run by `make test`: not a sub-make here
    done = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-n",
            "-o",
            ".venv/.native",
            "serve",
            "ARGS=--beanstalk-port 11300",
        ],
        cwd=ROOT,
        capture_output=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k not in outer},
    )
    assert done.stdout.decode().splitlines() == [
        ".venv/bin/tercel serve --data-dir ./tercel-data --beanstalk-port 11300"
    ]
    makefile = (ROOT / "Makefile").read_text()
    assert "\n\t@$(BIN)/tercel serve --data-dir ./tercel-data $(ARGS)\n" in makefile
