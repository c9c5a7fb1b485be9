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
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from tercel import native
from tercel.config import ServerSettings
from tercel.errors import ConfigError
from tercel.logtext import quoted
from tercel.server.admin_rules import check_admin_settings, is_loopback, split_origin
from tercel.server.auth import Authenticator, User
from tercel.server.context import ServerContext
from tercel.server.dashboard import Dashboard
from tercel.server.exposition import (
    PAUSE,
    Chunks,
    PeriodCollector,
    Snapshot,
    json_chunks,
    prometheus_chunks,
    snapshot_steps,
)
from tercel.server.http import error_response, json_response
from tercel.server.stats import drive
from tercel.server.status import parse_status

if TYPE_CHECKING:
    from asyncio import TimerHandle


log = logging.getLogger(__name__)

MAX_PERIOD_S = 3600
"""Longest ``?period=`` window (Ostrich keeps one collector per period asked for)."""
MAX_PERIODS = 8
"""At most this many distinct windows are kept, so a client cannot make us keep thousands."""

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
        self.scheme = "http"
        """``https`` when the listener speaks TLS (set by :meth:`AdminServer.start`)."""

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
        """Whether an ``Origin`` is this listener's own: its scheme, a host :meth:`host_ok`
        accepts, and the listening port (:attr:`port`; a page served from another port of the
        same host is another origin)."""
        parts = split_origin(origin)
        if parts is None:
            return False
        scheme, host, port = parts
        return scheme == self.scheme and port == self.port and self.host_ok(f"[{host}]")

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
        log.warning(
            "admin: refused %s %s from %s: %s",
            quoted(request.method),
            quoted(request.path),
            request.remote,
            quoted(reason),
        )
        response = error_response(status, reason)
        if status == 401 and self.users:
            response.headers["WWW-Authenticate"] = 'Basic realm="tercel", charset="UTF-8"'
        return response


class _OneLineLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's server logger, but a malformed request is one line, not a traceback."""

    def exception(self, msg: object, *args: object, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        reason = exc if isinstance(exc, BaseException) else "bad request"
        text = quoted(" ".join(str(reason).split())) or type(reason).__name__
        self.logger.warning("admin: %s: %s", quoted(str(msg) % args if args else str(msg)), text)


JSON = "application/json"
PROMETHEUS = "text/plain; version=0.0.4"


async def _send(request: web.Request, chunks: Chunks, content_type: str) -> web.StreamResponse:
    """The document of ``chunks``: one response when it is made in one pass, else streamed
    (chunked), letting the loop run at each :data:`~tercel.server.exposition.PAUSE`."""
    head: list[bytes] = []
    for chunk in chunks:
        if chunk is PAUSE:
            break
        head.append(chunk)
    else:
        return web.Response(
            body=b"".join(head),
            headers={"Content-Type": f"{content_type}; charset=utf-8", "Cache-Control": "no-store"},
        )
    resp = web.StreamResponse(
        headers={"Content-Type": f"{content_type}; charset=utf-8", "Cache-Control": "no-store"}
    )
    await resp.prepare(request)
    await resp.write(b"".join(head))
    for chunk in chunks:
        if chunk is PAUSE:
            await asyncio.sleep(0)
        else:
            await resp.write(chunk)
    await resp.write_eof()
    return resp


class AdminServer:
    """The admin HTTP listener of one :class:`~tercel.server.app.Server`."""

    def __init__(self, server: ServerContext) -> None:
        self.server = server
        self._periods: dict[int, tuple[PeriodCollector, TimerHandle]] = {}
        self._latching: dict[asyncio.Task[None], PeriodCollector] = {}
        """The windows being closed (their snapshots take several loop passes)."""
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

    async def start(
        self,
        host: str,
        port: int,
        sock: socket.socket | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> int:
        """Listen on ``host:port`` (0: any free port), or on ``sock`` when the command line
        bound it early, over HTTPS with ``ssl_context``; the bound port."""
        await self._runner.setup()
        site: web.BaseSite
        if sock is not None:
            site = web.SockSite(self._runner, sock, backlog=128, ssl_context=ssl_context)
        else:
            site = web.TCPSite(self._runner, host, port, backlog=128, ssl_context=ssl_context)
        await site.start()
        self.dashboard.start()
        bound: int = self._runner.addresses[0][1]
        self.guard.port = bound
        self.guard.scheme = "http" if ssl_context is None else "https"
        return bound

    async def stop(self) -> None:
        """Stop listening and close every admin connection."""
        self.dashboard.stop()
        for _, timer in self._periods.values():
            timer.cancel()
        self._periods.clear()
        for task in list(self._latching):
            task.cancel()
        await self._runner.cleanup()

    # ---- GET ------------------------------------------------------------------------------

    async def ping(self, request: web.Request) -> web.Response:
        return json_response({"response": "pong"})

    async def stats(self, request: web.Request) -> web.StreamResponse:
        raw = request.query.get("period")
        if raw is None:
            snap = await drive(snapshot_steps(self.server))
            return await _send(request, json_chunks(snap), JSON)
        try:
            period = int(raw)
        except ValueError:
            period = 0
        if not 1 <= period <= MAX_PERIOD_S:
            return error_response(400, f"period must be 1-{MAX_PERIOD_S} seconds")
        collector = await self._collector(period)
        if collector is None:
            return error_response(400, f"at most {MAX_PERIODS} different periods are kept")
        report = collector.last
        if report is None:  # the first window is still open: what it counted so far
            now = await drive(snapshot_steps(self.server, copy=True))
            report = await drive(now.minus_steps(collector.start))
        return await _send(request, json_chunks(report), JSON)

    async def _collector(self, period: int) -> PeriodCollector | None:
        got = self._periods.get(period)
        if got is not None:
            return got[0]
        if len(self._periods) >= MAX_PERIODS:
            return None
        start = await drive(snapshot_steps(self.server, copy=True))
        got = self._periods.get(period)  # (another request may have made it meanwhile)
        if got is not None:
            return got[0]
        if len(self._periods) >= MAX_PERIODS:
            return None
        collector = PeriodCollector(self._take, start)
        self._periods[period] = (collector, self._schedule(period, collector))
        return collector

    def _take(self) -> Snapshot:
        raise AssertionError("the admin server takes its snapshots in slices")  # pragma: no cover

    def _schedule(self, period: int, collector: PeriodCollector) -> TimerHandle:
        def tick() -> None:
            # A window closes every ``period`` s; a latch still taking its snapshot (a server
            # with many queues, a short period) lets this one pass: the window is longer.
            if not any(busy is collector for busy in self._latching.values()):
                task = self.server.loop.create_task(self._latch(collector))
                self._latching[task] = collector
                task.add_done_callback(self._latched)
            self._periods[period] = (collector, self._schedule(period, collector))

        return self.server.loop.call_later(period, tick)

    def _latched(self, task: asyncio.Task[None]) -> None:
        self._latching.pop(task, None)

    async def _latch(self, collector: PeriodCollector) -> None:
        """Close ``collector``'s window: its snapshot and deltas taken in slices."""
        now = await drive(snapshot_steps(self.server, copy=True))
        collector.close(now, await drive(now.minus_steps(collector.start)))

    async def prometheus(self, request: web.Request) -> web.StreamResponse:
        snap = await drive(snapshot_steps(self.server))
        return await _send(request, prometheus_chunks(snap), PROMETHEUS)

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
