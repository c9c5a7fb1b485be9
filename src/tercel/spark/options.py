"""Option parsing for the Spark formats: Spark hands every option over as a string, keys
case-insensitive. Each format turns its options into one frozen dataclass on the driver, which
is then pickled with the reader or writer; nothing here imports pyspark.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypedDict

from tercel.client.tls import TLSOptions

_TRUE = frozenset(("true", "1", "yes", "on"))
_FALSE = frozenset(("false", "0", "no", "off"))


SPARK_OPTIONS = ("path", "checkpointLocation", "queryName")
"""Options Spark itself may pass to a format (``load(path)``, ``writeStream``'s checkpoint and
``queryName``)."""


class Options:
    """Typed, case-insensitive access to a Spark options mapping; errors name the option.

    Every name asked for is remembered, so :meth:`reject_unknown` can refuse the rest (a
    misspelt option is an error naming the closest valid one, never silently ignored)."""

    def __init__(self, options: Mapping[str, str], fmt: str) -> None:
        self._opts = {str(k).lower(): str(v) for k, v in options.items()}
        self._fmt = fmt
        self.fmt = fmt
        """The format's name, as errors name it."""
        self._known: dict[str, str] = {n.lower(): n for n in SPARK_OPTIONS}

    def reject_unknown(self) -> None:
        """Raise ValueError for the first option no parser asked for, naming the closest."""
        for key in sorted(self._opts):
            if key in self._known:
                continue
            close = difflib.get_close_matches(key, list(self._known), n=1, cutoff=0.6)
            hint = f"; did you mean {self._known[close[0]]!r}?" if close else ""
            valid = ", ".join(sorted(self._known.values(), key=str.lower))
            raise ValueError(f"{self._fmt}: unknown option {key!r}{hint} (valid: {valid})")

    def _error(self, name: str, problem: str) -> ValueError:
        return ValueError(f"{self._fmt}: option {name!r} {problem}")

    def _get(self, name: str) -> str | None:
        self._known[name.lower()] = name
        return self._opts.get(name.lower())

    def has(self, name: str) -> bool:
        return self._get(name) is not None

    def text(self, name: str, default: str | None = None) -> str:
        """The option's value; a ValueError naming it when it is missing and has no default."""
        value = self._get(name)
        if value is None:
            value = default
        if value is None or value == "":
            raise self._error(name, "is required")
        return value

    def optional(self, name: str) -> str | None:
        value = self._get(name)
        return value if value else None

    def integer(self, name: str, default: int, minimum: int = 0) -> int:
        raw = self._get(name)
        if raw is None:
            return default
        try:
            value = int(raw.strip())
        except ValueError:
            raise self._error(name, f"must be an integer, got {raw!r}") from None
        if value < minimum:
            raise self._error(name, f"must be at least {minimum}, got {value}")
        return value

    def optional_integer(self, name: str, minimum: int = 0) -> int | None:
        """An integer option that may be absent (None: the caller's automatic choice)."""
        if self._get(name) is None:
            return None
        return self.integer(name, 0, minimum)

    def flag(self, name: str, default: bool) -> bool:
        raw = self._get(name)
        if raw is None:
            return default
        low = raw.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise self._error(name, f"must be true or false, got {raw!r}")

    def servers(self) -> tuple[str, ...]:
        """``servers``: a comma-separated ``host:port`` list (at least one)."""
        names = tuple(s.strip() for s in self.text("servers").split(",") if s.strip())
        if not names:
            raise self._error("servers", "must list at least one host:port")
        return names


def tls_options(o: Options) -> TLSOptions | None:
    """``tls``, ``tlsCaFile``, ``tlsCertFile``, ``tlsKeyFile``, ``tlsServerName``,
    ``tlsVerify``: TLS to every server, or None. File paths only (each executor reads the
    files), so nothing secret is in the options, which Spark shows in query plans and logs."""
    files = [o.optional(n) for n in ("tlsCaFile", "tlsCertFile", "tlsKeyFile")]
    name = o.optional("tlsServerName")
    verify = o.flag("tlsVerify", True)
    if not o.flag("tls", any(files) or name is not None or not verify):
        return None
    ca, cert, key = files
    return TLSOptions(ca_file=ca, cert_file=cert, key_file=key, server_name=name, verify=verify)


def _login(o: Options) -> tuple[str | None, str | None]:
    """``user`` with ``password`` or ``passwordFile`` (Spark redacts options named like
    ``password`` in plans and its UI; the dataclasses keep it out of their ``repr``). A
    password file is read where the client connects (executors)."""
    user = o.optional("user")
    password = o.optional("password")
    password_file = o.optional("passwordFile")
    if user is None and (password or password_file):
        raise ValueError(f"{o.fmt}: option 'password'/'passwordFile' needs 'user'")
    if password is None and password_file is not None:
        password = "file:" + password_file
    elif password is not None:
        password = "text:" + password
    return user, password


class Login(TypedDict, total=False):
    """The credential arguments of :class:`tercel.client.Client`."""

    user: str
    password: str | None
    password_file: str


def login_kwargs(user: str | None, password: str | None) -> Login:
    """The client's credential arguments from a format's ``user``/``password`` fields (none
    set: the client's own default, ``TERCEL_USER`` on the executor)."""
    if user is None:
        return {}
    kind, _, value = (password or "").partition(":")
    if kind == "file":
        return {"user": user, "password_file": value}
    return {"user": user, "password": value or None}


REMOVED_SOURCE_OPTIONS = (
    "stagingLocation",
    "leaseBatch",
    "maxFetchDurationMs",
    "prefetch",
    "failOnDataLoss",
)
"""Options of the staging design that mean nothing for keyed leases: given one, the source
says so instead of ignoring it (docs/spark.md §3)."""


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Options of the ``tercel`` streaming source (docs/spark.md has the table)."""

    servers: tuple[str, ...]
    queues: tuple[str, ...]
    """The queues named by ``queue`` or ``queues`` (empty when ``queuePattern`` is used)."""
    queue_pattern: str | None
    """``queuePattern``: every queue whose whole name matches this regular expression, on
    each server, looked up at each plan (like Kafka's ``subscribePattern``)."""
    max_items_per_trigger: int | None
    """None: no fixed size; each batch takes the backlog, up to ``maxItemsPerFetch``."""
    max_items_per_fetch: int
    fetch_wait_ms: int
    """How long a plan may wait on an empty queue (per server, its first queue)."""
    lease_ms: int | None
    """The keyed leases' lifetime; None: each queue's ``key_lease_ms``."""
    items_per_partition: int | None
    """None: each batch is cut into as many slices as Spark's default parallelism."""
    server_retry_ms: int
    max_unavailable_ms: int
    connect_timeout_ms: int
    socket_timeout_ms: int
    tls: TLSOptions | None
    """TLS to the servers (:func:`tls_options`), or None."""
    user: str | None = None
    """``user``: log in as this user (with ``password`` or ``passwordFile``)."""
    password: str | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        o = Options(options, "tercel source")
        named = [o.optional(n) for n in ("queue", "queues", "queuePattern")]
        if sum(v is not None for v in named) != 1:
            raise ValueError(
                "tercel source: set exactly one of the options 'queue', 'queues' (a comma "
                "list) and 'queuePattern' (a regular expression over queue names)"
            )
        queue, queues, pattern = named
        names = tuple(q.strip() for q in (queue or queues or "").split(",") if q.strip())
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"tercel source: option 'queuePattern': {exc}") from None
        elif not names:
            raise ValueError("tercel source: option 'queues' must name at least one queue")
        for gone in REMOVED_SOURCE_OPTIONS:
            if o.has(gone):
                raise ValueError(
                    f"tercel source: option {gone!r} no longer exists: the source stages "
                    "nothing, the servers keep each batch under a keyed lease until Spark "
                    "has committed it (docs/spark.md §3)"
                )
        parsed = cls(
            servers=o.servers(),
            queues=names,
            queue_pattern=pattern,
            max_items_per_trigger=o.optional_integer("maxItemsPerTrigger", 1),
            max_items_per_fetch=o.integer("maxItemsPerFetch", 200_000, 1),
            fetch_wait_ms=o.integer("fetchWaitMs", 100),
            lease_ms=o.optional_integer("leaseMs", 1),
            items_per_partition=o.optional_integer("itemsPerPartition", 1),
            server_retry_ms=o.integer("serverRetryMs", 1_000, 1),
            max_unavailable_ms=o.integer("maxUnavailableMs", 60_000),
            connect_timeout_ms=o.integer("connectTimeoutMs", 2_000, 1),
            socket_timeout_ms=o.integer("socketTimeoutMs", 10_000, 1),
            tls=tls_options(o),
            **dict(zip(("user", "password"), _login(o), strict=True)),
        )
        o.reject_unknown()
        return parsed

    @property
    def single_queue(self) -> str | None:
        """The queue, when the source reads exactly one named queue (its offsets then hold a
        plain count per server and its lease keys no queue name), else None."""
        return self.queues[0] if self.queue_pattern is None and len(self.queues) == 1 else None

    def matches(self, queue: str) -> bool:
        """Whether ``queue`` is one this source reads."""
        if self.queue_pattern is not None:
            return re.fullmatch(self.queue_pattern, queue) is not None
        return queue in self.queues


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """Options of the ``tercel`` sink (batch and streaming)."""

    servers: tuple[str, ...]
    queue: str | None
    """Overrides a ``queue`` column when set (as Kafka's ``topic`` option does)."""
    ignore_extra_columns: bool
    batch_size: int
    connect_timeout_ms: int
    socket_timeout_ms: int
    flush_on_overwrite: bool
    """``mode("overwrite")`` empties the target queues first (only with this set)."""
    tls: TLSOptions | None = None
    """TLS to the servers (:func:`tls_options`), or None."""
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    dedup: bool = True
    """Each row is put with a dedup key (``dedup=false``: plain puts, at-least-once)."""
    key_column: str | None = None
    """``keyColumn``: the column whose value is each row's dedup key (else one is made)."""

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        o = Options(options, "tercel sink")
        parsed = cls(
            servers=o.servers(),
            queue=o.optional("queue"),
            ignore_extra_columns=o.flag("ignoreExtraColumns", False),
            batch_size=o.integer("batchSize", 5_000, 1),
            connect_timeout_ms=o.integer("connectTimeoutMs", 2_000, 1),
            socket_timeout_ms=o.integer("socketTimeoutMs", 10_000, 1),
            flush_on_overwrite=o.flag("flushOnOverwrite", False),
            tls=tls_options(o),
            **dict(zip(("user", "password"), _login(o), strict=True)),
            dedup=o.flag("dedup", True),
            key_column=o.optional("keyColumn"),
        )
        if parsed.key_column is not None and not parsed.dedup:
            raise ValueError("tercel sink: option 'keyColumn' needs dedup (drop dedup=false)")
        o.reject_unknown()
        return parsed


@dataclass(frozen=True, slots=True)
class JournalOptions:
    """Options of the ``tercel-journal`` batch reader."""

    path: str
    queues: tuple[str, ...]
    """Empty: every queue found in ``path``."""
    include_payload: bool
    ignore_corrupt_tail: bool

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> JournalOptions:
        o = Options(options, "tercel-journal")
        queues = o.optional("queues") or ""
        parsed = cls(
            path=o.text("path"),
            queues=tuple(q.strip() for q in queues.split(",") if q.strip()),
            include_payload=o.flag("includePayload", True),
            ignore_corrupt_tail=o.flag("ignoreCorruptTail", True),
        )
        o.reject_unknown()
        return parsed
