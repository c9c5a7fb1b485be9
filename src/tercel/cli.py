"""The ``tercel`` command: ``tercel serve`` (and the tools that later issues add).

Flags override the config file, which overrides the built-in defaults (127.0.0.1, memcache
port 22133, data in ``./tercel-data``).
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Any

from tercel import __version__, exit_codes
from tercel.config import ServerConfig, load_config
from tercel.errors import ConfigError, JournalCorrupt

log = logging.getLogger("tercel")

LISTENERS = ("text", "thrift", "beanstalk")
"""The front ends that are off unless their ``--<name>-port`` is given (memcache and admin
have default ports)."""
EARLY_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _build_parser(tools: bool = True) -> argparse.ArgumentParser:
    """The command line's parser; without ``tools`` only ``serve`` and ``beanstalkd`` (what
    ``tercel serve ...`` needs, without importing the journal and client tools)."""
    parser = argparse.ArgumentParser(
        prog="tercel", description="A durable Kestrel-compatible queue server."
    )
    parser.add_argument("--version", action="version", version=f"tercel {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the server")
    serve.add_argument("--config", help="TOML config file")
    serve.add_argument("--data-dir", help="where journals live (default ./tercel-data)")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument(
        "--memcache-port", type=int, help="memcache port (default 22133; 0 = any free)"
    )
    serve.add_argument(
        "--admin-port", type=int, help="admin HTTP port (default 2223; 0 = any free)"
    )
    for name in LISTENERS:
        serve.add_argument(
            f"--{name}-port", type=int, help=f"{name} port (off unless given; 0 = any free)"
        )
    serve.add_argument("--ports-file", help="write the bound ports here as JSON once listening")
    serve.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="logging level",
    )
    sub.add_parser(
        "beanstalkd",
        add_help=False,
        help="run a beanstalkd-compatible server (beanstalkd's flags; tercel beanstalkd -h)",
    )
    if not tools:
        return parser
    from tercel import journal_tool

    journal_tool.add_parser(sub)
    from tercel import cli_client

    cli_client.add_parsers(sub)
    return parser


def _config_from(args: argparse.Namespace) -> ServerConfig:
    config = load_config(args.config) if args.config else ServerConfig()
    overrides: dict[str, Any] = {}
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
    return config.with_server(**overrides) if overrides else config


def _bind_early(host: str, port: int) -> socket.socket:
    """A listening socket for a front end's port, made before the server's modules load.

    The kernel accepts connections into the backlog from here on, so clients can connect about
    70 ms after ``exec`` instead of after every import (and any replay): their commands are
    served once the server is up (socket activation does the same).
    """
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


def serve(args: argparse.Namespace) -> int:
    """Run the server until SIGTERM/SIGINT/``shutdown``; the process exit code."""
    try:
        config = _config_from(args)
    except ConfigError as exc:
        log.error("bad configuration: %s", exc)
        return exit_codes.USAGE
    srv = config.server
    # A signal from here until the loop's handlers are in is noted and acted on then (a stop
    # or a reload), never a kill by the signal (the loop's handlers replace these).
    early: list[int] = []
    for sig in EARLY_SIGNALS:
        signal.signal(sig, lambda signum, _frame: early.append(signum))
    sockets: dict[str, socket.socket] = {}
    for name in ("memcache", *LISTENERS, "admin"):
        port = getattr(srv, f"{name}_port")
        if port is None:
            continue
        try:
            sockets[name] = _bind_early(srv.host, port)
        except OSError as exc:
            log.error("cannot listen on %s:%s: %s", srv.host, port, exc)
            for sock in sockets.values():
                sock.close()
            return exit_codes.FAILED
    import asyncio

    from tercel.server.app import run_server
    from tercel.server.loop import new_loop

    try:
        with asyncio.Runner(loop_factory=new_loop) as runner:
            runner.run(run_server(config, args.ports_file, sockets=sockets, early_signals=early))
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tercel`` command."""
    rest = sys.argv[1:] if argv is None else list(argv)
    if rest[:1] == ["beanstalkd"]:  # beanstalkd's own flags; binds before anything loads
        from tercel import beanstalkd_cli

        return beanstalkd_cli.main(rest[1:])
    args = _build_parser(tools=rest[:1] != ["serve"]).parse_args(rest)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper(), logging.INFO)
        if hasattr(args, "log_level")
        else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.command == "serve":
        return serve(args)
    from tercel import cli_client

    if args.command in cli_client.COMMANDS:
        return cli_client.run(args)
    if args.command == "journal":
        from tercel import journal_tool

        return journal_tool.run(args)
    return exit_codes.USAGE  # pragma: no cover - argparse rejects unknown commands
