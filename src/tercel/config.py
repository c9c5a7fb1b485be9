"""Configuration: load a TOML file, validate every key, resolve per-queue settings.

This module only parses and validates; it never opens journals or sockets. A
:class:`ServerConfig` is immutable: ``reload`` builds a new one and swaps it in whole, so a bad
file leaves the old config untouched. See ``docs/configuration.md`` for every key.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from tercel.errors import ConfigError
from tercel.names import RULE, fanout_parent, valid_name

TABLES = ("server", "queues", "aliases", "tls", "users")
"""The config file's tables."""
UNLIMITED = 2**63 - 1
"""The value of a size or count limit that is not set (Kestrel's Long.MaxValue)."""

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1024,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1024**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1024**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1024**4,
    "tib": 1024**4,
}
_DURATIONS = {
    "ms": 1,
    "s": 1000,
    "sec": 1000,
    "m": 60_000,
    "min": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
}
_NUM_UNIT = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")


def parse_size(value: object, key: str) -> int:
    """Bytes from an integer or a string such as ``"16MB"`` (K, M, G are powers of 1024)."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a size, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{key}: size must not be negative")
        return value
    if isinstance(value, str):
        m = _NUM_UNIT.fullmatch(value)
        if m and m.group(2).lower() in _UNITS:
            return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    raise ConfigError(f'{key}: expected a size like 1024 or "16MB", got {value!r}')


def parse_duration(value: object, key: str) -> int:
    """Milliseconds from an integer (ms) or a string such as ``"250ms"``, ``"1s"``, ``"5m"``."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a duration, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{key}: duration must not be negative")
        return value
    if isinstance(value, str):
        m = _NUM_UNIT.fullmatch(value)
        if m and m.group(2).lower() in _DURATIONS:
            return int(float(m.group(1)) * _DURATIONS[m.group(2).lower()])
    raise ConfigError(f'{key}: expected a duration like 250, "250ms" or "1s", got {value!r}')


def _parse_bool(value: object, key: str) -> bool:
    if isinstance(value, bool):
        return value
    raise ConfigError(f"{key}: expected true or false, got {value!r}")


def _parse_count(value: object, key: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ConfigError(f"{key}: expected a non-negative integer, got {value!r}")


def _parse_sync(value: object, key: str) -> int | None:
    """``false`` -> None (never fsync), ``true`` -> 0 (before every reply), duration -> period."""
    if value is False:
        return None
    if value is True:
        return 0
    period = parse_duration(value, key)
    if period == 0:
        return 0
    return period


def _parse_queue_ref(value: object, key: str) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, str) and valid_name(value):
        return value
    raise ConfigError(f"{key}: expected a queue name, got {value!r}")


def _optional_duration(value: object, key: str) -> int | None:
    ms = parse_duration(value, key)
    return ms or None


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """Settings of one queue (Kestrel's names in snake case). Sizes in bytes, times in ms."""

    max_items: int = UNLIMITED
    max_size: int = UNLIMITED
    max_item_size: int = UNLIMITED
    discard_old_when_full: bool = False
    journal: bool = True
    sync_journal: int | None = None
    """None: never fsync; 0: fsync before every reply (grouped); N: fsync every N ms."""
    max_journal_size: int = 16 * 1024**2
    max_journal_overflow: int = 10
    max_journal_size_absolute: int = UNLIMITED
    max_memory_size: int = 128 * 1024**2
    max_age: int | None = None
    expire_to_queue: str | None = None
    max_expire_sweep: int = UNLIMITED
    fanout_only: bool = False
    max_queue_age: int | None = None
    max_deliveries: int = 0
    """Hand an item out (lease or open read) at most this often; 0: no limit."""
    dead_letter_queue: str | None = None
    """Where an item goes instead of a delivery beyond max_deliveries; None: it is dropped."""
    max_open_leases: int = 10_000
    # ---- dedup keys (docs/configuration.md, "Dedup keys") ----
    dedup_window_ms: int = 600_000
    """How long a put's dedup key is remembered: a second put with the same key within it
    stores nothing and is answered with the first one's item id; 0: keys are not kept.
    10 minutes: twice SQS FIFO's 5 and five times NATS JetStream's 2, because tercel's
    Spark sink retries a batch after a driver restart, which takes minutes, not seconds."""
    max_dedup_keys: int = 1_000_000
    """Dedup keys a queue holds at most; a keyed put beyond them (every key still younger than
    the window) is refused with ``SERVER_ERROR``, nothing stored (~200 bytes per key)."""
    key_lease_ms: int = 86_400_000
    """A keyed lease's lifetime when the take names none (0: keyed leases never run out)."""
    max_lease_keys: int = 100_000
    """Lease keys a queue holds at once, live and remembered (docs/configuration.md)."""

    def describe(self) -> list[tuple[str, str]]:
        """``(key, value)`` pairs in declaration order, formatted the way the config file
        spells them (for ``dump_config``)."""
        out = []
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "sync_journal":
                text = "false" if v is None else "true" if v == 0 else f"{v}ms"
            elif isinstance(v, bool):
                text = "true" if v else "false"
            elif v is None:
                text = "none"
            else:
                text = str(v)
            out.append((f.name, text))
        return out


_QUEUE_PARSERS: dict[str, Any] = {
    "max_items": _parse_count,
    "max_size": parse_size,
    "max_item_size": parse_size,
    "discard_old_when_full": _parse_bool,
    "journal": _parse_bool,
    "sync_journal": _parse_sync,
    "max_journal_size": parse_size,
    "max_journal_overflow": _parse_count,
    "max_journal_size_absolute": parse_size,
    "max_memory_size": parse_size,
    "max_age": _optional_duration,
    "expire_to_queue": _parse_queue_ref,
    "max_expire_sweep": _parse_count,
    "fanout_only": _parse_bool,
    "max_queue_age": _optional_duration,
    "max_deliveries": _parse_count,
    "dead_letter_queue": _parse_queue_ref,
    "max_open_leases": _parse_count,
    # dedup keys
    "dedup_window_ms": parse_duration,
    "max_dedup_keys": _parse_count,
    "key_lease_ms": parse_duration,
    "max_lease_keys": _parse_count,
}


def _unknown_key(key: str, known: Mapping[str, object], where: str) -> str:
    """``<where>: unknown key 'k'``, with the table it belongs in when it is a key of the
    other one, else the closest known key (``difflib``)."""
    why = f"{where}: unknown key {key!r}"
    other = _SERVER_PARSERS if known is _QUEUE_PARSERS else _QUEUE_PARSERS
    if key in other:
        return f"{why} (a {'[server]' if other is _SERVER_PARSERS else 'queue'} setting)"
    import difflib  # only on a bad key: a start does not pay for the import

    close = difflib.get_close_matches(key, known, n=1)
    return f"{why} (did you mean {close[0]}?)" if close else why


def _parse_table(
    table: Mapping[str, object], parsers: Mapping[str, Any], where: str, problems: list[str]
) -> dict[str, Any]:
    """The settings of ``table`` parsed; each bad key or value is added to ``problems``."""
    out: dict[str, Any] = {}
    for key, raw in table.items():
        parser = parsers.get(key)
        if parser is None:
            problems.append(_unknown_key(key, parsers, where))
            continue
        try:
            out[key] = parser(raw, f"{where}.{key}")
        except ConfigError as exc:
            problems.append(str(exc))
    return out


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """The ``[server]`` table. Port 0 means "pick a free port"; None disables a listener."""

    host: str = "127.0.0.1"
    memcache_port: int | None = 22133
    admin_port: int | None = 2223
    """The admin HTTP server (Kestrel's Ostrich port); None disables it."""
    text_port: int | None = None
    """Kestrel's text protocol; off unless set."""
    thrift_port: int | None = None
    """Kestrel's Thrift service; off unless set."""
    beanstalk_port: int | None = None
    """The beanstalkd protocol; off unless set."""
    data_dir: str = "./tercel-data"
    max_open_reads: int = 100
    client_timeout: int | None = None
    """Idle connections are closed after this many ms; None: never."""
    expiration_timer_frequency: int = 1000
    latency_sample_every: int = 16
    """Time one command in this many for the latency distributions (1: every command)."""
    max_connections: int | None = None
    max_queues: int | None = 100_000
    """Queues that may exist at once; creating one more gets ``SERVER_ERROR too many
    queues`` (queues found on disk at start-up are always loaded). None (``0`` in the
    file): no limit. The default is the scale measured (docs/benchmarks.md: 100,000 queues
    in ~150 MB); any one client can create queues."""
    max_open_journals: int = 0
    """Journal descriptors held open at once (the pool of :mod:`tercel.journal.files`); the
    least recently used are closed and reopened on demand. 0: a quarter of the open-file
    limit, between 16 and 4096."""
    admin_token: str | None = None
    """Bearer token every admin POST must carry; required when the admin port listens beyond
    loopback."""
    admin_hosts: tuple[str, ...] = ()
    """Host names the admin port answers to besides its listening address (DNS rebinding)."""
    max_partial_request_bytes: int = 256 * 1024**2
    """Bytes of incomplete requests all connections of all front ends may hold at once; the
    connection whose read would go beyond it is refused and closed. 256 MiB: four requests of
    the largest size (64 MiB) arriving at once. 0: no limit."""


def _parse_token(value: object, key: str) -> str | None:
    if value is None or value is False:
        return None
    if isinstance(value, str) and len(value) >= 8 and value.isprintable() and " " not in value:
        return value
    raise ConfigError(f"{key}: expected a string of at least 8 characters without spaces")


def _parse_names(value: object, key: str) -> tuple[str, ...]:
    if isinstance(value, list) and all(isinstance(v, str) and v for v in value):
        return tuple(v.lower().rstrip(".") for v in value)
    raise ConfigError(f"{key}: expected a list of host names, got {value!r}")


def _parse_port(value: object, key: str) -> int | None:
    if value is False or value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 65535:
        return value
    raise ConfigError(f"{key}: expected a port number 0-65535 or false, got {value!r}")


def _parse_host(value: object, key: str) -> str:
    if isinstance(value, str) and value:
        return value
    raise ConfigError(f"{key}: expected an address, got {value!r}")


def _parse_positive(value: object, key: str) -> int:
    n = _parse_count(value, key)
    if n == 0:
        raise ConfigError(f"{key}: must be at least 1")
    return n


def _parse_positive_duration(value: object, key: str) -> int:
    ms = parse_duration(value, key)
    if ms == 0:
        raise ConfigError(f"{key}: must be more than 0")
    return ms


_SERVER_PARSERS: dict[str, Any] = {
    "host": _parse_host,
    "memcache_port": _parse_port,
    "admin_port": _parse_port,
    "text_port": _parse_port,
    "thrift_port": _parse_port,
    "beanstalk_port": _parse_port,
    "data_dir": _parse_host,
    "max_open_reads": _parse_positive,
    "client_timeout": _optional_duration,
    "expiration_timer_frequency": parse_duration,
    "latency_sample_every": _parse_positive,
    "max_connections": lambda v, k: _parse_count(v, k) or None,
    "admin_token": _parse_token,
    "admin_hosts": _parse_names,
    "max_queues": lambda v, k: _parse_count(v, k) or None,
    "max_open_journals": _parse_count,
    "max_partial_request_bytes": parse_size,
}


# ---- [tls] ----------------------------------------------------------------------------------

TLS_LISTENERS = ("memcache", "text", "thrift", "beanstalk", "admin")
"""The listeners ``[tls] listeners`` may name (``tercel serve``'s)."""


@dataclass(frozen=True, slots=True)
class TLSSettings:
    """The ``[tls]`` table: one certificate and key for the server, and which listeners use
    them. Paths are read at start-up and again at each ``reload`` (replace the files in place,
    then reload); the paths themselves and the listener choice take a restart."""

    cert: str
    """PEM certificate chain (the server's certificate first)."""
    key: str
    """PEM private key (not encrypted: the server never prompts for a password)."""
    ca: str | None = None
    """PEM CA bundle that client certificates are checked against."""
    verify_client: bool = False
    """Require a client certificate signed by ``ca`` on every TLS listener (mutual TLS)."""
    listeners: tuple[str, ...] = TLS_LISTENERS
    """The listeners that speak TLS (every one by default); the others stay plaintext."""
    ports: Mapping[str, int] = field(default_factory=dict)
    """A second, TLS-only listener per front end (``{memcache = 22143}``) beside its
    plaintext port: both serve the same queues while clients move over."""
    handshake_timeout: int = 10_000
    """ms a new connection may take to finish its handshake before it is closed."""


def _parse_listener_names(value: object, key: str) -> tuple[str, ...]:
    if isinstance(value, list) and all(v in TLS_LISTENERS for v in value):
        return tuple(value)
    raise ConfigError(f"{key}: expected a list of {', '.join(TLS_LISTENERS)}, got {value!r}")


def _parse_tls_ports(value: object, key: str) -> dict[str, int]:
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a table like {{memcache = 22143}}")
    ports: dict[str, int] = {}
    for name, port in value.items():
        if name not in TLS_LISTENERS[:4]:
            raise ConfigError(f"{key}.{name}: not a front end ({', '.join(TLS_LISTENERS[:4])})")
        parsed = _parse_port(port, f"{key}.{name}")
        if parsed is not None:
            ports[name] = parsed
    return ports


def _parse_path(value: object, key: str) -> str:
    if isinstance(value, str) and value:
        return value
    raise ConfigError(f"{key}: expected a file path, got {value!r}")


_TLS_PARSERS: dict[str, Any] = {
    "cert": _parse_path,
    "key": _parse_path,
    "ca": _parse_path,
    "verify_client": _parse_bool,
    "listeners": _parse_listener_names,
    "ports": _parse_tls_ports,
    "handshake_timeout": _parse_positive_duration,
}


def _check_tls(tls: TLSSettings, where: str) -> list[str]:
    """What is missing from a TLS configuration (each a message naming the setting)."""
    problems = [f"{where}.{k}: required" for k in ("cert", "key") if not getattr(tls, k)]
    if tls.verify_client and tls.ca is None:
        problems.append(f"{where}.verify_client: needs {where}.ca (the client certificates' CA)")
    return problems


def _parse_tls(data: Mapping[str, Any], problems: list[str]) -> TLSSettings | None:
    """The ``[tls]`` table, or None when there is none."""
    if "tls" not in data:
        return None
    kw = _parse_table(_table(data, "tls", problems), _TLS_PARSERS, "tls", problems)
    tls = TLSSettings(**{"cert": "", "key": "", **kw})
    problems.extend(_check_tls(tls, "tls"))
    return tls


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """A whole, validated configuration: server settings, queue defaults and overrides,
    aliases. Immutable; :meth:`queue_config` resolves the settings of any queue name."""

    server: ServerSettings = field(default_factory=ServerSettings)
    defaults: QueueConfig = field(default_factory=QueueConfig)
    overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    source: str | None = None
    """The file this config came from, for ``reload``; None for the embedded default."""
    tls: TLSSettings | None = None
    """The ``[tls]`` table (or ``--tls-*`` flags); None: every listener is plaintext."""
    users: Mapping[str, UserConfig] = field(default_factory=dict)
    """The ``[users]`` table (and its ``file``): empty, no one needs to authenticate."""

    def queue_config(self, name: str) -> QueueConfig:
        """Settings for ``name``: defaults, then the parent's overrides for a fanout child
        (``a+b`` inherits ``a``), then the queue's own overrides."""
        merged: dict[str, Any] = {}
        parent = fanout_parent(name)
        if parent is not None:
            merged.update(self.overrides.get(parent, {}))
        merged.update(self.overrides.get(name, {}))
        if not merged:
            return self.defaults
        return dataclasses.replace(self.defaults, **merged)

    def with_tls(self, **changes: Any) -> ServerConfig:
        """A copy with some ``[tls]`` settings replaced (``--tls-*`` flags); raises
        ConfigError when that leaves TLS without a certificate or key."""
        base = self.tls or TLSSettings(cert="", key="")
        tls = dataclasses.replace(base, **changes)
        problems = _check_tls(tls, "--tls")
        if problems:
            raise ConfigError("; ".join(problems))
        return dataclasses.replace(self, tls=tls)

    def with_server(self, **changes: Any) -> ServerConfig:
        """A copy with some ``[server]`` settings replaced (command-line flags)."""
        return dataclasses.replace(self, server=dataclasses.replace(self.server, **changes))


def _check_aliases(config: ServerConfig) -> None:
    """Refuse alias cycles (a -> b -> a)."""
    aliases = config.aliases

    def visit(name: str, path: tuple[str, ...]) -> None:
        for dest in aliases.get(name, ()):
            if dest in path:
                raise ConfigError(f"aliases: cycle {' -> '.join((*path, dest))}")
            visit(dest, (*path, dest))

    for name in aliases:
        visit(name, (name,))


def parse_config(data: Mapping[str, Any], source: str | None = None) -> ServerConfig:
    """Validate a parsed TOML document. Raises :class:`ConfigError` naming every bad key and
    value at once (one line, ``; `` between them), an unknown key with the closest known one
    ("did you mean ...?")."""
    problems: list[str] = []
    for unknown in sorted(set(data) - set(TABLES)):
        import difflib  # as in _unknown_key

        close = difflib.get_close_matches(unknown, TABLES, n=1)
        hint = f" (did you mean [{close[0]}]?)" if close else ""
        problems.append(f"unknown table [{unknown}]{hint}")
    server_table = _table(data, "server", problems)
    server_kw = _parse_table(server_table, _SERVER_PARSERS, "server", problems)

    queues_table = _table(data, "queues", problems)
    default_kw = {k: v for k, v in queues_table.items() if not isinstance(v, dict)}
    defaults = QueueConfig(**_parse_table(default_kw, _QUEUE_PARSERS, "queues", problems))
    overrides: dict[str, dict[str, Any]] = {}
    for name, table in queues_table.items():
        if isinstance(table, dict):
            if not valid_name(name):
                problems.append(f"queues: bad queue name {name!r}: {RULE}")
                continue
            overrides[name] = _parse_table(table, _QUEUE_PARSERS, f"queues.{name}", problems)

    aliases: dict[str, tuple[str, ...]] = {}
    for name, dests in _table(data, "aliases", problems).items():
        if not valid_name(name):
            problems.append(f"aliases: bad alias name {name!r}: {RULE}")
        elif not isinstance(dests, list) or not all(
            isinstance(d, str) and valid_name(d) for d in dests
        ):
            problems.append(f"aliases.{name}: expected a list of queue names")
        else:
            aliases[name] = tuple(dests)
    tls = _parse_tls(data, problems)
    users = parse_users(_table(data, "users", problems), source, problems)
    server = ServerSettings(**server_kw)
    config = ServerConfig(server, defaults, overrides, aliases, source, users=users, tls=tls)
    for check in (_check_aliases, _check_expiry_chains):
        try:
            check(config)
        except ConfigError as exc:
            problems.append(str(exc))
    if problems:
        count = f"{len(problems)} problems: " if len(problems) > 1 else ""
        raise ConfigError(count + "; ".join(problems))
    return config


def _table(data: Mapping[str, Any], name: str, problems: list[str]) -> Mapping[str, Any]:
    table = data.get(name, {})
    if isinstance(table, dict):
        return table
    problems.append(f"[{name}] must be a table")
    return {}


def _check_expiry_chains(config: ServerConfig) -> None:
    """Refuse ``expire_to_queue`` chains that come back to where they started (a -> b -> a):
    expiring one item would feed the sweep of the queue that is expiring it."""
    named = set(config.overrides)
    for start in named:
        seen = [start]
        target = config.queue_config(start).expire_to_queue
        while target is not None and target != seen[-1]:
            if target in seen:
                raise ConfigError(f"expire_to_queue: cycle {' -> '.join([*seen, target])}")
            seen.append(target)
            target = config.queue_config(target).expire_to_queue


def load_config(path: str | os.PathLike[str]) -> ServerConfig:
    """Read and validate a TOML config file (a path as ``str`` or ``pathlib.Path``; pathlib is
    not imported here: with urllib.parse it is ~5 ms of the server's start-up)."""
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:  # not TOML, or not UTF-8
        raise ConfigError(f"{path}: {exc}") from exc
    return parse_config(data, str(path))


# ---- [users] (docs/configuration.md, "Users and permissions") -------------------------------


@dataclass(frozen=True, slots=True)
class UserConfig:
    """One ``[users.<name>]`` table: the password's scrypt hash (:mod:`tercel.passwords`),
    the queue/tube name patterns (``fnmatch`` globs) the user may put to, take from and
    manage (empty: nothing; ``manage = ["*"]`` also allows the server-wide commands and the
    admin port's POSTs), and its limits (None: none)."""

    password: str | None = None
    """Its scrypt hash; None: it logs in only by its client certificate (:attr:`subject`)."""
    subject: str | None = None
    """The subject of a client certificate (mutual TLS, ``[tls] verify_client``) that logs a
    connection in as this user at once, as ``tercel.server.tls.peer_subject`` writes it
    (``O=Example,CN=alice``, the certificate's order)."""
    put: tuple[str, ...] = ()
    take: tuple[str, ...] = ()
    manage: tuple[str, ...] = ()
    max_connections: int | None = None
    """Connections this user may hold at once, over every port."""
    max_items: int | None = None
    """Items the queues this user may put to may hold when it puts (docs/configuration.md)."""
    max_bytes: int | None = None
    """Payload bytes those queues may hold when it puts."""


def _parse_patterns(value: object, key: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list) and all(isinstance(v, str) and v for v in value):
        return tuple(value)
    raise ConfigError(f"{key}: expected a list of name patterns, got {value!r}")


def _parse_hash(value: object, key: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected an scrypt hash string (`tercel passwd` prints one)")
    from tercel.passwords import parse_hash  # hashlib and friends: only with [users]

    try:
        parse_hash(value)
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}") from None
    return value


def _parse_subject(value: object, key: str) -> str:
    if isinstance(value, str) and "=" in value and value.strip() == value:
        return value
    raise ConfigError(f"{key}: expected a certificate subject such as 'O=Example,CN=alice'")


_USER_PARSERS: dict[str, Any] = {
    "password": _parse_hash,
    "subject": _parse_subject,
    "put": _parse_patterns,
    "take": _parse_patterns,
    "manage": _parse_patterns,
    "max_connections": lambda v, k: _parse_count(v, k) or None,
    "max_items": lambda v, k: _parse_count(v, k) or None,
    "max_bytes": lambda v, k: parse_size(v, k) or None,
}
_USER_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}")


def parse_users(
    table: Mapping[str, Any], source: str | None, problems: list[str]
) -> dict[str, UserConfig]:
    """The users of a ``[users]`` table: one sub-table per user, and ``file = "<path>"``, a
    TOML file whose own ``[users]`` tables are added (relative to the config file's
    directory; read again at each ``reload``). Problems are added to ``problems``."""
    tables: dict[str, Any] = {}
    for name, raw in table.items():
        if name == "file":
            tables.update(_users_file(raw, source, problems))
        else:
            tables[name] = raw
    users: dict[str, UserConfig] = {}
    for name, raw in tables.items():
        where = f"users.{name}"
        if not _USER_NAME.fullmatch(name):
            problems.append(f"{where}: a user name is 1-64 of A-Z a-z 0-9 _ . @ -")
        elif not isinstance(raw, dict):
            problems.append(f"{where}: expected a table")
        elif "password" not in raw and "subject" not in raw:
            problems.append(
                f"{where}: password (`tercel passwd` prints a hash) or subject is required"
            )
        else:
            kw = _parse_table(raw, _USER_PARSERS, where, problems)
            if "password" in kw or "subject" in kw:
                users[name] = UserConfig(**kw)
    return users


def _users_file(raw: object, source: str | None, problems: list[str]) -> dict[str, Any]:
    if not isinstance(raw, str) or not raw:
        problems.append("users.file: expected a path")
        return {}
    path = raw
    if source is not None and not os.path.isabs(path):
        path = os.path.join(os.path.dirname(source), path)
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        problems.append(f"users.file: {path}: {exc.strerror or exc}")
        return {}
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        problems.append(f"users.file: {path}: {exc}")
        return {}
    users = data.get("users", {})
    if not isinstance(users, dict) or "file" in users:
        problems.append(f"users.file: {path}: expected [users.<name>] tables only")
        return {}
    return users
