"""The admin HTTP server (Kestrel's Ostrich port, 2223 by default), on the server's loop.

aiohttp does the HTTP; this module only maps paths to the server's operations:

=========================== ====== =====================================================
path                        method answer
=========================== ====== =====================================================
``/ping``                   GET    ``{"response": "pong"}``
``/stats.json`` (``/stats``) GET   Ostrich's shape: ``counters``, ``gauges``, ``labels``,
                                   ``metrics``; ``?period=N`` gives the last N s window
``/metrics``                GET    Prometheus text: ``tercel_<stat>``, ``queue`` label;
                                   per-tube ``tercel_beanstalk_tube_<stat>``, ``tube`` label
``/server_info``            GET    name, version, start time, uptime, status, ports,
                                   the modules running compiled (``make native``)
``/status``                 GET    ``{"status": "UP"}``
``/reload``                 POST   apply the config file; 400 with the reason if refused
``/shutdown``               POST   stop the server after answering
``/status/<s>``             POST   set the status; 400 for an unknown one
``/`` and its JSON          GET    the web dashboard (:mod:`tercel.server.dashboard`)
=========================== ====== =====================================================

A GET on a POST path is a 405 (aiohttp's router). Snapshots are taken on request; the
``?period=N`` windows (Ostrich's latched collectors) snapshot every N seconds once asked for.

What a web page in a browser must not do with this port (:class:`Guard`, before any handler):
read it through DNS rebinding — a request whose ``Host`` is neither the listening address (an
IP literal; any one when listening on a wildcard address), ``localhost`` on loopback, nor one of
``admin_hosts`` is refused (421); drive it cross-site — a POST with an ``Origin`` that is not
``http://`` such a host on the listening port (a page on another port of the host is another
origin), or with a "simple" content type (form or ``text/plain``, which a page may send
without a preflight) is refused (403, 415). With ``admin_token`` set, a POST without
``Authorization: Bearer <token>`` is refused (401); the token is required when ``host`` is not
a loopback address. Each refusal, and each malformed request, is one log line (no traceback).
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import ipaddress
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.metrics_core import SummaryMetricFamily
from prometheus_client.samples import Sample

from tercel import native
from tercel.config import ServerSettings
from tercel.errors import ConfigError
from tercel.logtext import quoted
from tercel.server import stats
from tercel.server.admin_rules import check_admin_settings, is_loopback, split_origin
from tercel.server.auth import Authenticator, User
from tercel.server.context import ServerContext
from tercel.server.dashboard import Dashboard
from tercel.server.http import error_response, json_response
from tercel.server.metrics import PERCENTILES, LogHistogram
from tercel.server.status import parse_status

if TYPE_CHECKING:
    from asyncio import TimerHandle


log = logging.getLogger(__name__)

MAX_PERIOD_S = 3600
"""Longest ``?period=`` window (Ostrich keeps one collector per period asked for)."""
MAX_PERIODS = 8
"""At most this many distinct windows are kept, so a client cannot make us keep thousands."""

_QUEUE_COUNTERS = (
    "total_items",
    "expired_items",
    "discarded",
    "transactions",
    "canceled_transactions",
    "total_flushes",
    "journal_rewrites",
    "journal_rotations",
)
QUEUE_PREFIX = "q/"
"""Per-queue stats are ``q/<queue>/<stat>`` (exported with a ``queue`` label)."""

_DOCS = {
    "items": "Items waiting (open reads excluded).",
    "bytes": "Payload bytes waiting.",
    "total_items": "Items added.",
    "set_latency_usec": "Time to handle a set, in microseconds.",
    "get_hit_latency_usec": "Time to answer a get that found an item, in microseconds.",
    "get_miss_latency_usec": "Time to answer a get that found none, in microseconds.",
    "delivery_latency_msec": "Time from an item's add to its removal, in milliseconds.",
    "journal_torn_tails": "Torn journal tails cut at start-up.",
    "journal_write_errors": "Failed journal writes and fsyncs.",
    "journal_fsyncs": "Group fsyncs of sync_journal = true queues.",
    "journal_fsync_waits": "Reply writes released after a group fsync.",
    "journal_fsyncs_aio": "Group fsyncs that went through native AIO.",
    "beanstalk/tube/curr_jobs_ready": "beanstalkd jobs ready in the tube.",
    "beanstalk/tube/curr_jobs_urgent": "Ready beanstalkd jobs of priority below 1024.",
    "beanstalk/tube/curr_jobs_reserved": "beanstalkd jobs of the tube reserved now.",
    "beanstalk/tube/curr_jobs_delayed": "beanstalkd jobs of the tube waiting for their delay.",
    "beanstalk/tube/curr_jobs_buried": "beanstalkd jobs of the tube buried.",
    "beanstalk/tube/total_jobs": "beanstalkd jobs put into the tube.",
    "beanstalk/tube/cmd_delete": "beanstalkd delete commands on jobs of the tube.",
    "beanstalk/tube/cmd_pause_tube": "beanstalkd pause-tube commands on the tube.",
    "journal_files_open": "Journal file descriptors held by the pool now.",
    "journal_files_limit": "The pool's bound (max_open_journals, or auto).",
    "journal_files_evictions": "Journal descriptors closed by the pool (least recently used).",
    "journal_files_reopens": "Parked journal files opened again on their next use.",
    "journal_files_emfile": "Journal file opens that failed with EMFILE or ENFILE.",
    "journal_files_refused": "Opens given up: a request refused, a rotation or compaction put off.",
    "journal_files_put_off": "Journal rotations and compactions put off for want of a descriptor.",
    "queues_replaying": "Queues on disk not replayed yet (start-up replays in the background).",
    "replaying": "1 while the queue's replay is not done (its figures: what it read so far).",
}


@dataclass
class Snapshot:
    """Every stat at one moment, in Ostrich's four groups."""

    counters: dict[str, int] = field(default_factory=dict)
    gauges: dict[str, int | float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, LogHistogram] = field(default_factory=dict)
    families: dict[str, str] = field(default_factory=lambda: {QUEUE_PREFIX: "queue"})
    """Key prefixes of per-entity stats (``<prefix><entity>/<stat>``) and the Prometheus label
    the entity goes in: ``q/`` (queues) and each front end's, as ``beanstalk/tube/``."""

    def minus(self, earlier: Snapshot) -> Snapshot:
        """Counters and distributions counted since ``earlier``; gauges and labels as now."""
        counters = {k: v - earlier.counters.get(k, 0) for k, v in self.counters.items()}
        metrics = {
            k: h.minus(earlier.metrics[k]) if k in earlier.metrics else h
            for k, h in self.metrics.items()
        }
        return Snapshot(
            counters, dict(self.gauges), dict(self.labels), metrics, dict(self.families)
        )

    def to_json(self) -> dict[str, Any]:
        """Ostrich's ``stats.json`` document."""
        return {
            "counters": dict(sorted(self.counters.items())),
            "gauges": dict(sorted(self.gauges.items())),
            "labels": dict(sorted(self.labels.items())),
            "metrics": {k: h.summary() for k, h in sorted(self.metrics.items())},
        }


def take_snapshot(server: ServerContext, copy: bool = False) -> Snapshot:
    """Every stat of ``server`` now in Ostrich's groups, from the one typed snapshot
    (``server/stats.py``); ``copy`` the histograms to keep the snapshot."""
    stat = stats.snapshot(server)
    snap = Snapshot()
    snap.counters.update({k: getattr(stat, k) for k in stats.GLOBAL_COUNTERS})
    for fe, counters in stat.front_ends.items():
        for k, v in counters.items():  # curr_* are levels, the rest counts
            (snap.gauges if k.startswith("curr_") else snap.counters)[f"{fe}/{k}"] = v
    for fe, (label, entities) in stat.labelled.items():
        prefix = f"{fe}/{label}/"
        snap.families[prefix] = label
        for entity, counters in entities.items():
            for k, v in counters.items():
                group = snap.gauges if k.startswith("curr_") else snap.counters
                group[f"{prefix}{entity}/{k}"] = v
    snap.gauges.update(
        items=stat.curr_items,
        bytes=stat.bytes,
        reserved_memory_ratio=round(stat.reserved_memory_ratio, 3),
        connections=stat.curr_connections,
        uptime=stat.uptime,
        journal_files_open=stat.journal_files_open,
        journal_files_limit=stat.journal_files_limit,
        queues_replaying=stat.queues_replaying,
    )
    snap.gauges["status/readable"] = int(stat.readable)
    snap.gauges["status/writeable"] = int(stat.writable)
    snap.labels.update(version=stat.version, status=stat.status)
    for q in stat.queues:
        p = f"q/{q.name}/"
        snap.counters.update({p + k: getattr(q, k) for k in _QUEUE_COUNTERS})
        gauges: dict[str, int | float] = {
            "items": q.items,
            "max_items": q.max_items,
            "bytes": q.bytes,
            "max_bytes": q.max_bytes,
            "journal_size": q.journal_size,
            "mem_items": q.mem_items,
            "mem_bytes": q.mem_bytes,
            "age_msec": q.age,
            "waiters": q.waiters,
            "open_transactions": q.open_transactions,
            "create_time": q.create_time // 1000,
        }
        if q.replaying:  # on disk, not replayed yet: the figures are what replay read so far
            gauges["replaying"] = 1
        snap.gauges.update({p + k: v for k, v in gauges.items()})
    for name, (items, nbytes) in stat.alias_puts.items():
        snap.counters[f"q/{name}/put_items"] = items
        snap.counters[f"q/{name}/put_bytes"] = nbytes
    metrics = server.metrics
    coll = server.collection
    metrics.prune({q.name for q in coll} | set(coll.config.aliases))
    for key, h in metrics.total.items():
        snap.metrics[key] = h.copy() if copy else h
    for name, lat in metrics.queues.items():
        for key, h in lat.items():
            if h.sum or any(h.counts):  # a queue's empty distributions are left out
                snap.metrics[f"q/{name}/{key}"] = h.copy() if copy else h
    return snap


class PeriodCollector:
    """Ostrich's latched collector: :meth:`latch` closes a window every ``period`` seconds;
    :meth:`report` gives the last closed window, or what was counted since the collector
    began while the first window is still open."""

    def __init__(self, take: Callable[[], Snapshot]) -> None:
        self._take = take
        self._start = take()
        self._last: Snapshot | None = None

    def latch(self) -> None:
        """Close the current window."""
        now = self._take()
        self._last = now.minus(self._start)
        self._start = now

    def report(self) -> Snapshot:
        """The deltas of the last closed window (or of the open first one)."""
        if self._last is not None:
            return self._last
        return self._take().minus(self._start)


def _entity_stat(key: str, families: dict[str, str]) -> tuple[str, str, str] | None:
    """For a per-entity key (``q/<queue>/<stat>``, ``beanstalk/tube/<tube>/<stat>``): the
    stat as exported (queues' bare, the others' under their prefix: ``beanstalk/tube/<stat>``),
    the label and the entity (which may contain ``/``: the stat is the last part)."""
    for prefix, label in families.items():
        if key.startswith(prefix):
            entity, stat = key[len(prefix) :].rsplit("/", 1)
            return (stat if prefix == QUEUE_PREFIX else prefix + stat), label, entity
    return None


class _PrometheusCollector:
    """Turns a snapshot into metric families: ``tercel_<stat>`` with a ``queue`` label on
    per-queue stats, ``tercel_<front end>_<label>_<stat>`` with a ``<label>`` label on a front
    end's per-entity ones (beanstalkd's ``tube``). A stat kept both server-wide and per queue
    (items, bytes, total_items, the latencies) is exported per queue only: the server total
    is their sum."""

    def __init__(self, server: ServerContext) -> None:
        self.server = server

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        snap = take_snapshot(self.server)
        labelled: dict[tuple[str, str], tuple[str, list[tuple[str, Any]]]] = {}
        plain: list[tuple[str, str, Any]] = []
        for kind, values in (("counter", snap.counters), ("gauge", snap.gauges)):
            for key, value in values.items():
                found = _entity_stat(key, snap.families)
                if found is None:
                    plain.append((kind, key, value))
                    continue
                stat, label, entity = found
                labelled.setdefault((kind, stat), (label, []))[1].append((entity, value))
        for kind, key, value in plain:
            if (kind, key) not in labelled:
                yield _family(kind, _metric_name(key), key, value)
        for (kind, stat), (label, samples) in labelled.items():
            fam = _family(kind, _metric_name(stat), stat, None, label)
            for entity, value in samples:
                fam.add_metric([entity], value)
            yield fam
        yield from self._summaries(snap)

    def _summaries(self, snap: Snapshot) -> Iterator[Metric]:
        families: dict[str, SummaryMetricFamily] = {}
        for key, hist in snap.metrics.items():
            if not key.startswith("q/"):
                continue
            name, stat = key[2:].rsplit("/", 1)
            fam = families.get(stat)
            if fam is None:
                fam = families[stat] = SummaryMetricFamily(
                    _metric_name(stat), _DOCS.get(stat, stat), labels=["queue"]
                )
            fam.add_metric([name], hist.count, hist.sum)
            for _, p in PERCENTILES:
                fam.samples.append(
                    Sample(fam.name, {"queue": name, "quantile": str(p)}, hist.percentile(p))
                )
        yield from families.values()


def _metric_name(stat: str) -> str:
    return "tercel_" + stat.replace("/", "_")


def _family(
    kind: str, name: str, stat: str, value: Any, label: str = "queue"
) -> CounterMetricFamily | GaugeMetricFamily:
    doc = _DOCS.get(stat, f"Kestrel's {stat}.")
    labels = None if value is not None else [label]
    if kind == "counter":
        return CounterMetricFamily(name, doc, value=value, labels=labels)
    return GaugeMetricFamily(name, doc, value=value, labels=labels)


SIMPLE_CONTENT_TYPES = frozenset(
    {"application/x-www-form-urlencoded", "multipart/form-data", "text/plain"}
)
"""Content types a web page may POST cross-site without a CORS preflight."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Guard:
    """The admin port's checks of Host, Origin, content type and token (module docstring)."""

    def __init__(self, settings: ServerSettings, auth: Authenticator | None = None) -> None:
        host = settings.host.strip("[]").lower()
        self.token = settings.admin_token
        self.auth = auth
        """The server's users: with some, every request must log in (:meth:`login`)."""
        check_admin_settings(settings)
        self.names = set(settings.admin_hosts)
        self.address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None
        self.wildcard = False
        try:
            self.address = ipaddress.ip_address(host)
            self.wildcard = self.address.is_unspecified
        except ValueError:
            self.names.add(host)  # listening on a name: that name
        if is_loopback(host):
            self.names.add("localhost")
        self.port = settings.admin_port
        """The port the listener is bound to (:meth:`AdminServer.start` sets it once bound)."""

    @property
    def users(self) -> bool:
        """True when the server has users (reloaded with the config)."""
        return self.auth is not None and self.auth.enabled

    def host_ok(self, value: str | None) -> bool:
        """Whether a ``Host`` (or an origin's host) names this server."""
        if value is None:
            return True  # HTTP/1.0 without Host: no browser sends that
        value = value.strip().lower()
        if value.startswith("["):
            name = value[1 : value.find("]")] if "]" in value else value
        else:
            name = value.rsplit(":", 1)[0] if value.count(":") == 1 else value
        name = name.rstrip(".")
        if name in self.names:
            return True
        try:
            ip = ipaddress.ip_address(name)
        except ValueError:
            return False
        if self.wildcard or ip == self.address:
            return True
        return self.address is not None and self.address.is_loopback and ip.is_loopback

    def origin_ok(self, origin: str) -> bool:
        """Whether an ``Origin`` is this listener's own: ``http``, a host :meth:`host_ok`
        accepts, and the listening port (:attr:`port`; a page served from another port of the
        same host is another origin)."""
        parts = split_origin(origin)
        if parts is None:
            return False
        scheme, host, port = parts
        return scheme == "http" and port == self.port and self.host_ok(f"[{host}]")

    def refusal(self, request: web.Request) -> tuple[int, str] | None:
        """``(status, reason)`` when ``request`` is refused, else None."""
        if not self.host_ok(request.headers.get("Host")):
            return 421, "unknown Host"
        if request.method in ("GET", "HEAD"):
            return None
        origin = request.headers.get("Origin")
        if origin is not None and not self.origin_ok(origin):
            return 403, "foreign Origin"
        if request.content_type in SIMPLE_CONTENT_TYPES and "Content-Type" in request.headers:
            return 415, f"content type {request.content_type} refused on a POST"
        if self.token is not None and not self.users:  # with users: :meth:`login`
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                return 401, "missing or wrong admin token"
        return None

    async def login(self, request: web.Request) -> tuple[int, str] | None:
        """With ``[users]``: every request needs ``Authorization: Bearer <admin_token>`` or
        ``Basic`` credentials of a user; any user may GET (read-only), a POST needs
        ``manage = ["*"]``. ``(status, reason)`` when refused, else None."""
        auth = self.auth
        assert auth is not None
        given = request.headers.get("Authorization", "")
        if self.token is not None and hmac.compare_digest(
            given.encode(), f"Bearer {self.token}".encode()
        ):
            return None
        scheme, _, credentials = given.partition(" ")
        if scheme.lower() != "basic":
            return 401, "credentials required (Basic, or the admin token)"
        try:
            name, colon, password = (
                base64.b64decode(credentials.strip(), validate=True).decode().partition(":")
            )
        except (ValueError, UnicodeDecodeError):
            return 401, "malformed Basic credentials"
        if not colon:
            return 401, "malformed Basic credentials"
        result: asyncio.Future[tuple[User | None, str]] = asyncio.get_running_loop().create_future()

        def done(user: User | None, reason: str) -> None:
            if not result.done():
                result.set_result((user, reason))

        auth.check(name, password.encode(), str(request.remote), done)
        user, reason = await result
        if user is None:
            return 401, reason
        if request.method not in ("GET", "HEAD") and not user.admin:
            auth.counters.denied += 1
            auth.counters.manage_denied += 1
            auth.audit(
                "user %s from %s refused POST %s on admin",
                user.name,
                request.remote,
                quoted(request.path),
            )
            return 403, 'permission denied: a POST needs manage = ["*"]'
        return None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = self.refusal(request)
        if refused is None and self.users:
            refused = await self.login(request)
        if refused is None:
            return await handler(request)
        status, reason = refused
        if status == 401 and self.users:
            response = error_response(status, reason)
            response.headers["WWW-Authenticate"] = 'Basic realm="tercel", charset="UTF-8"'
            log.warning(
                "admin: refused %s %s from %s: %s",
                quoted(request.method),
                quoted(request.path),
                request.remote,
                quoted(reason),
            )
            return response
        log.warning(
            "admin: refused %s %s from %s: %s",
            quoted(request.method),
            quoted(request.path),
            request.remote,
            quoted(reason),
        )
        return error_response(status, reason)


class _OneLineLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's server logger, but a malformed request is one line, not a traceback."""

    def exception(self, msg: object, *args: object, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        reason = exc if isinstance(exc, BaseException) else "bad request"
        text = quoted(" ".join(str(reason).split())) or type(reason).__name__
        self.logger.warning("admin: %s: %s", quoted(str(msg) % args if args else str(msg)), text)


class AdminServer:
    """The admin HTTP listener of one :class:`~tercel.server.app.Server`."""

    def __init__(self, server: ServerContext) -> None:
        self.server = server
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_PrometheusCollector(server))
        self._periods: dict[int, tuple[PeriodCollector, TimerHandle]] = {}
        self.dashboard = Dashboard(server)
        # raises ConfigError: before listening
        self.guard = Guard(server.config.server, server.auth)
        app = web.Application(middlewares=[self.guard.middleware])
        app.add_routes(
            [
                web.get("/ping", self.ping),
                web.get("/stats.json", self.stats),
                web.get("/stats", self.stats),
                web.get("/metrics", self.prometheus),
                web.get("/server_info", self.server_info),
                web.get("/server_info.json", self.server_info),
                web.get("/status", self.get_status),
                web.post("/reload", self.reload),
                web.post("/shutdown", self.shutdown),
                web.post("/status/{status}", self.set_status),
                *self.dashboard.routes(),
            ]
        )
        self._runner = web.AppRunner(
            app,
            access_log=None,
            shutdown_timeout=2.0,
            logger=_OneLineLogger(logging.getLogger("aiohttp.server"), {}),
        )

    async def start(self, host: str, port: int, sock: socket.socket | None = None) -> int:
        """Listen on ``host:port`` (0: any free port), or on ``sock`` when the command line
        bound it early; the bound port."""
        await self._runner.setup()
        site: web.BaseSite
        if sock is not None:
            site = web.SockSite(self._runner, sock, backlog=128)
        else:
            site = web.TCPSite(self._runner, host, port, backlog=128)
        await site.start()
        self.dashboard.start()
        bound: int = self._runner.addresses[0][1]
        self.guard.port = bound
        return bound

    async def stop(self) -> None:
        """Stop listening and close every admin connection."""
        self.dashboard.stop()
        for _, timer in self._periods.values():
            timer.cancel()
        self._periods.clear()
        await self._runner.cleanup()

    # ---- GET ------------------------------------------------------------------------------

    async def ping(self, request: web.Request) -> web.Response:
        return json_response({"response": "pong"})

    async def stats(self, request: web.Request) -> web.Response:
        raw = request.query.get("period")
        if raw is None:
            return json_response(take_snapshot(self.server).to_json())
        try:
            period = int(raw)
        except ValueError:
            period = 0
        if not 1 <= period <= MAX_PERIOD_S:
            return error_response(400, f"period must be 1-{MAX_PERIOD_S} seconds")
        collector = self._collector(period)
        if collector is None:
            return error_response(400, f"at most {MAX_PERIODS} different periods are kept")
        return json_response(collector.report().to_json())

    def _collector(self, period: int) -> PeriodCollector | None:
        got = self._periods.get(period)
        if got is not None:
            return got[0]
        if len(self._periods) >= MAX_PERIODS:
            return None
        collector = PeriodCollector(lambda: take_snapshot(self.server, copy=True))
        self._periods[period] = (collector, self._schedule(period, collector))
        return collector

    def _schedule(self, period: int, collector: PeriodCollector) -> TimerHandle:
        def tick() -> None:
            collector.latch()
            self._periods[period] = (collector, self._schedule(period, collector))

        return self.server.loop.call_later(period, tick)

    async def prometheus(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(
            body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        )

    async def server_info(self, request: web.Request) -> web.Response:
        srv = self.server
        started = srv.started_at
        return json_response(
            {
                "name": "tercel",
                "version": srv.version,
                "start_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started / 1000)),
                "uptime": srv.clock.now_ms() - started,
                "status": srv.status.current.name,
                "ports": srv.ports,
                "compiled_modules": native.compiled_modules(),
            }
        )

    async def get_status(self, request: web.Request) -> web.Response:
        return json_response({"status": self.server.status.current.name})

    # ---- POST -----------------------------------------------------------------------------

    async def reload(self, request: web.Request) -> web.Response:
        try:
            self.server.reload()
        except ConfigError as exc:
            log.error("reload refused, keeping the old config: %s", exc)
            return error_response(400, f"reload refused: {exc}")
        return json_response({"response": "ok"})

    async def shutdown(self, request: web.Request) -> web.Response:
        # Stop after this handler returns, so the answer is written before the listener
        # closes (the runner's cleanup waits for handlers in flight).
        self.server.loop.call_soon(self.server.request_stop)
        return json_response({"response": "ok"})

    async def set_status(self, request: web.Request) -> web.Response:
        try:
            status = parse_status(request.match_info["status"])
        except ValueError as exc:
            return error_response(400, str(exc))
        try:
            self.server.set_status(status)
        except OSError as exc:
            return error_response(500, f"cannot write the status file: {exc.strerror or exc}")
        return json_response({"response": "ok", "status": status.name})
