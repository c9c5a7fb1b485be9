"""The ``tercel`` command: ``tercel serve`` (and the tools that later issues add).

Flags override the config file, which overrides the built-in defaults (127.0.0.1, memcache
port 22133, data in ``./tercel-data``).

Start-up order of ``tercel serve``: this module imports nothing but :mod:`tercel.readahead`;
:func:`main` starts reading the server's modules ahead (:func:`readahead.start`), then imports
what reading the options and the config needs, binds the listening sockets
(:func:`tercel.listening.bind_tcp`: clients connect from then on), and only then imports
asyncio and the server.
"""

from __future__ import annotations

import sys

from tercel import __version__, readahead

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: see the module docstring
if TYPE_CHECKING:
    import argparse
    import logging
    from collections.abc import Mapping, Sequence

    from tercel.config import ServerConfig

LISTENERS = ("text", "thrift", "beanstalk")
"""The front ends that are off unless their ``--<name>-port`` is given (memcache and admin
have default ports)."""
SERVE_OPTIONS: tuple[tuple[str, type, str], ...] = (
    ("config", str, "TOML config file"),
    ("data-dir", str, "where journals live (default ./tercel-data)"),
    ("host", str, "address to listen on (default 127.0.0.1)"),
    ("memcache-port", int, "memcache port (default 22133; 0 = any free)"),
    ("admin-port", int, "admin HTTP port (default 2223; 0 = any free)"),
    *((f"{name}-port", int, f"{name} port (off unless given; 0 = any free)") for name in LISTENERS),
    ("ports-file", str, "write the bound ports here as JSON once listening"),
    ("tls-cert", str, "TLS on every listener: PEM certificate chain (with --tls-key)"),
    ("tls-key", str, "TLS private key, PEM, not encrypted"),
    ("tls-ca", str, "require client certificates signed by this CA (mutual TLS)"),
)
"""``tercel serve``'s options but ``--log-level``: flag, type, help (default: None)."""
LOG_LEVELS = ("debug", "info", "warning", "error")


class ServeArgs:
    """``tercel serve``'s options as :func:`parse_serve` read them (argparse's names)."""

    def __init__(self) -> None:
        self.command = "serve"
        self.log_level = "info"
        self.config: str | None = None
        self.data_dir: str | None = None
        self.host: str | None = None
        self.ports_file: str | None = None
        self.memcache_port: int | None = None
        self.admin_port: int | None = None
        self.text_port: int | None = None
        self.thrift_port: int | None = None
        self.beanstalk_port: int | None = None
        self.tls_cert: str | None = None
        self.tls_key: str | None = None
        self.tls_ca: str | None = None


def parse_serve(argv: Sequence[str]) -> ServeArgs | None:
    """``tercel serve``'s options without argparse, which costs ~20 ms of start-up (with
    gettext, locale and shutil, which it imports to build a parser). Reads well-formed
    ``--flag value`` and ``--flag=value`` pairs only; anything else (help, an abbreviation,
    an unknown flag, a missing or bad value) gives None, and argparse then parses the line
    with its usual messages."""
    kinds: dict[str, type] = {f"--{flag}": kind for flag, kind, _ in SERVE_OPTIONS}
    kinds["--log-level"] = str
    args = ServeArgs()
    i = 0
    while i < len(argv):
        flag, eq, value = argv[i].partition("=")
        kind = kinds.get(flag)
        if kind is None:
            return None
        if not eq:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                return None
            i += 1
            value = argv[i]
        i += 1
        parsed: object = value
        if kind is int:
            try:
                parsed = int(value)
            except ValueError:
                return None
        if flag == "--log-level" and value not in LOG_LEVELS:
            return None
        setattr(args, flag[2:].replace("-", "_"), parsed)
    return args


def build_parser(tools: bool = True) -> argparse.ArgumentParser:
    """The command line's parser; without ``tools`` only ``serve`` and ``beanstalkd`` (what
    ``tercel serve ...`` needs, without importing the journal and client tools)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="tercel", description="A durable Kestrel-compatible queue server."
    )
    parser.add_argument("--version", action="version", version=f"tercel {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the server")
    for flag, kind, text in SERVE_OPTIONS:
        serve.add_argument(f"--{flag}", type=kind, help=text)
    serve.add_argument("--log-level", default="info", choices=LOG_LEVELS, help="logging level")
    sub.add_parser(
        "beanstalkd",
        add_help=False,
        help="run a beanstalkd-compatible server (beanstalkd's flags; tercel beanstalkd -h)",
    )
    if not tools:
        return parser
    passwd = sub.add_parser(
        "passwd",
        help="print the scrypt hash of a password for [users] (read from the terminal or stdin)",
        description="Read a password (twice from a terminal, else the first line of stdin; "
        "never from the command line) and print its scrypt hash for [users.<name>] "
        "password = ... (docs/configuration.md).",
    )
    passwd.add_argument(
        "--cost", type=int, default=2**15, help="scrypt's n, a power of 2 (default 32768)"
    )
    from tercel import journal_tool

    journal_tool.add_parser(sub)
    from tercel import cli_client

    cli_client.add_parsers(sub)
    return parser


def _config_from(args: argparse.Namespace | ServeArgs) -> ServerConfig:
    from tercel.config import ServerConfig, load_config
    from tercel.errors import ConfigError

    config = load_config(args.config) if args.config else ServerConfig()
    overrides: dict[str, object] = {}
    if args.data_dir is not None:
        overrides["data_dir"] = args.data_dir
    if args.host is not None:
        overrides["host"] = args.host
    if args.memcache_port is not None:
        if not 0 <= args.memcache_port <= 65535:
            raise ConfigError(f"--memcache-port: {args.memcache_port} is not a port number")
        overrides["memcache_port"] = args.memcache_port
    for name in ("admin", *LISTENERS):
        port = getattr(args, f"{name}_port")
        if port is not None:
            if not 0 <= port <= 65535:
                raise ConfigError(f"--{name}-port: {port} is not a port number")
            overrides[f"{name}_port"] = port
    config = config.with_server(**overrides) if overrides else config
    tls: dict[str, object] = {}
    for name in ("cert", "key", "ca"):
        value = getattr(args, f"tls_{name}")
        if value is not None:
            tls[name] = value
    if args.tls_ca is not None:
        tls["verify_client"] = True
    return config.with_tls(**tls) if tls else config


def serve(args: argparse.Namespace | ServeArgs) -> int:
    """Run the server until SIGTERM/SIGINT/``shutdown``; the process exit code.

    The cyclic garbage collector is off until the server's modules are imported: they make
    no garbage, and ~50 collections walked their young objects (the imports' CPU time: 82
    -> 71 ms, medians of 6); what they made is then frozen (``gc.freeze``), out of every
    later collection."""
    import gc

    gc.disable()
    try:
        _set_up_logging(args.log_level)
        import signal
        import socket

        from tercel import exit_codes
        from tercel.errors import ConfigError, JournalCorrupt
        from tercel.listening import bind_tcp

        log = _log()
        try:
            config = _config_from(args)
        except ConfigError as exc:
            log.error("bad configuration: %s", exc)
            return exit_codes.USAGE
        srv = config.server
        if not config.users:
            from tercel.server.admin_rules import is_loopback

            if not is_loopback(srv.host):
                log.warning(
                    "listening on %s without [users]: anyone who can reach the ports may read, "
                    "flush or shut down the server (docs/operations.md, Running on a network)",
                    srv.host,
                )
        # A signal from here until the loop's handlers are in is noted and acted on then (a
        # stop or a reload), never a kill by the signal (the loop's handlers replace these).
        early: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda signum, _frame: early.append(signum))
        sockets: dict[str, socket.socket] = {}
        for name in ("memcache", *LISTENERS, "admin"):
            port = getattr(srv, f"{name}_port")
            if port is None:
                continue
            try:
                sockets[name] = bind_tcp(srv.host, port)
            except OSError as exc:
                log.error("cannot listen on %s:%s: %s", srv.host, port, exc)
                for sock in sockets.values():
                    sock.close()
                return exit_codes.FAILED
        import asyncio

        from tercel.server.app import run_server
        from tercel.server.loop import new_loop
    finally:
        gc.freeze()
        gc.enable()

    def ready(ports: dict[str, int]) -> None:
        tls = () if config.tls is None else config.tls.listeners
        log.info("%s", ready_line(srv.host, ports, _program(), tls))

    try:
        with asyncio.Runner(loop_factory=new_loop) as runner:
            runner.run(
                run_server(
                    config, args.ports_file, sockets=sockets, early_signals=early, on_ready=ready
                )
            )
    except JournalCorrupt as exc:
        log.error("journal is corrupt, refusing to start: %s", exc)
        log.error(
            "inspect it with `tercel journal check`; keep every valid record with "
            "`tercel journal salvage DIR QUEUE`"
        )
        return exit_codes.CORRUPT
    except ConfigError as exc:
        log.error("%s", exc)
        return exit_codes.USAGE
    except OSError as exc:
        log.error("cannot start: %s", exc)
        return exit_codes.FAILED
    return exit_codes.OK


def passwd(cost: int) -> int:
    """``tercel passwd``: print the hash of a password read from the terminal (asked twice)
    or from the first line of stdin; the exit code."""
    import getpass

    from tercel import exit_codes
    from tercel.passwords import MAX_N, hash_password

    if cost < 2 or cost & (cost - 1) or cost > MAX_N:
        print(f"tercel passwd: --cost must be a power of 2 up to {MAX_N}", file=sys.stderr)
        return exit_codes.USAGE
    if sys.stdin.isatty():
        password = getpass.getpass("Password: ")
        if getpass.getpass("Again: ") != password:
            print("tercel passwd: the passwords differ", file=sys.stderr)
            return exit_codes.USAGE
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        print("tercel passwd: empty password", file=sys.stderr)
        return exit_codes.USAGE
    if any(c.isspace() for c in password):
        print(
            "tercel passwd: warning: the text port's `auth` takes a password without spaces",
            file=sys.stderr,
        )
    print(hash_password(password, cost))
    return exit_codes.OK


def _address(host: str, port: int) -> str:
    """``host:port`` a client on this machine can connect to (a wildcard host is loopback;
    an IPv6 address in brackets)."""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def ready_line(
    host: str, ports: Mapping[str, int], program: str = "tercel", tls: Sequence[str] = ()
) -> str:
    """The line ``tercel serve`` logs once every listener serves: each listener's address,
    the dashboard's URL, and a first command to try (``program`` is how tercel was run;
    ``tls``: the listeners that speak TLS, which need the client's TLS options, so a plaintext
    memcache port only gets the command)."""
    where = ", ".join(f"{name} {_address(host, port)}" for name, port in ports.items())
    parts = [f"ready: {where}"]
    if "admin" in ports:
        scheme = "https" if "admin" in tls else "http"
        parts.append(f"dashboard {scheme}://{_address(host, ports['admin'])}/")
    if "memcache" in ports and "memcache" not in tls:
        address = _address(host, ports["memcache"])
        server = "" if address == "127.0.0.1:22133" else f" --server {address}"  # the default
        parts.append(f"try: {program} put jobs hello{server} && {program} get jobs{server}")
    return "; ".join(parts)


def _program() -> str:
    """How to run the ``tercel`` command as it was run: ``tercel`` when that is on PATH,
    else its path (``.venv/bin/tercel``), or ``<python> -m tercel``."""
    import os
    import shutil

    script = sys.argv[0]
    if os.path.basename(script) == "__main__.py":
        return f"{_path(sys.executable)} -m tercel"
    found = shutil.which(os.path.basename(script))
    if found and os.path.samefile(found, script):
        return os.path.basename(script)
    return _path(script)


def _path(path: str) -> str:
    import os

    rel = os.path.relpath(path)
    if rel.startswith(".."):
        return os.path.abspath(path)
    return rel if "/" in rel else f"./{rel}"


def _log() -> logging.Logger:
    import logging

    return logging.getLogger("tercel")


def _set_up_logging(level: str) -> None:
    import logging

    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tercel`` command."""
    rest = sys.argv[1:] if argv is None else list(argv)
    if rest[:1] == ["beanstalkd"]:  # beanstalkd's own flags; binds before anything loads
        from tercel import beanstalkd_cli

        return beanstalkd_cli.main(rest[1:])
    if rest[:1] == ["serve"]:
        readahead.start(readahead.SERVE_MODULES)
    fast = parse_serve(rest[1:]) if rest[:1] == ["serve"] else None
    if fast is not None:
        return serve(fast)
    args = build_parser(tools=rest[:1] != ["serve"]).parse_args(rest)
    if args.command == "serve":
        return serve(args)
    _set_up_logging(getattr(args, "log_level", "info"))
    from tercel import cli_client

    if args.command in cli_client.COMMANDS:
        return cli_client.run(args)
    if args.command == "passwd":
        return passwd(args.cost)
    if args.command == "journal":
        from tercel import journal_tool

        return journal_tool.run(args)
    from tercel import exit_codes

    return exit_codes.USAGE  # pragma: no cover - argparse rejects unknown commands
