"""Users, passwords and permissions on every port (docs/operations.md, "Users and permissions").

One :class:`Authenticator` per server holds the ``[users]`` of the config (reloaded with it) and
everything shared: the cache of verified credentials, the per-address limit on failed
attempts, the users' connection counts, the audit counters and log. Each connection of a
server with users has a :class:`Guard` (``Connection.guard``; None when no user is
configured, so an open server pays one attribute test per command and nothing else):

- before a login (``guard.user`` None) every command but the front end's login command is
  refused (memcache ``CLIENT_ERROR unauthenticated``, ...) and nothing else runs;
- the login (:meth:`Guard.login`) checks the password off the event loop
  (``loop.run_in_executor``: scrypt takes ~50 ms of a core) while the connection is parked,
  unless the same credentials were verified before (a cache keyed by a salted SHA-256 of the
  password, dropped at every reload); failures are limited per source address (a token
  bucket, :data:`FAILURE_BURST` then one per :data:`FAILURE_REFILL_S` seconds);
- after it, :meth:`Guard.allows` checks each command's right (:data:`PUT`, :data:`TAKE`,
  :data:`MANAGE`, :data:`MANAGE_ALL`) on its queue or tube against the user's patterns, with a
  per-user cache of the answers, and the user's limits on a put.

Whoever authenticates a connection another way (a client certificate's subject, mapped to a
user) calls :meth:`Guard.assume` with the user's name.

Refusals are answered through the connection's :meth:`denied` hook (each front end words
them) and counted; refusals and failed logins are logged, at most :data:`AUDIT_LINES_PER_S`
lines a second, with every client-chosen string through :func:`tercel.logtext.quoted`, and
never a password or a payload.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from fnmatch import fnmatchcase
from typing import Any, Final, Protocol

from tercel.clock import Clock
from tercel.config import UserConfig
from tercel.logtext import quoted
from tercel.names import fanout_parent

log = logging.getLogger("tercel.auth")

# ---- rights: what an operation needs (``Operation.right``) ------------------------------------

NONE: Final = 0
"""Any logged-in user (version, stats, quit, confirming what it holds...)."""
PUT: Final = 1
"""Put to the command's queue or tube."""
TAKE: Final = 2
"""Take from (get, open, lease, peek, monitor, ack, reserve...) the command's queue; a fanout
child ``p+c`` needs it on ``p`` too."""
MANAGE: Final = 3
"""Manage the command's queue (flush, delete, flush_expired, pause-tube, kick)."""
MANAGE_ALL: Final = 4
"""A server-wide command (shutdown, reload, flush_all, dump_config, setting the status):
``manage = ["*"]``."""
SET_STATUS: Final = 5
"""``status`` with a value (:data:`MANAGE_ALL`), without one (:data:`NONE`)."""
LOGIN: Final = 6
"""The front end's login command: the only one allowed before a login."""

RIGHT_WORDS: Final = {PUT: "put to", TAKE: "take from", MANAGE: "manage", MANAGE_ALL: "run"}

# ---- what a refusal is -------------------------------------------------------------------------

UNAUTHENTICATED: Final = 0
DENIED: Final = 1
LIMITED: Final = 2

FAILURE_BURST: Final = 10
"""Failed logins a source address may make at once..."""
FAILURE_REFILL_S: Final = 6.0
"""...then one per this many seconds (10 a minute)."""
MAX_TRACKED_ADDRESSES: Final = 10_000
AUDIT_LINES_PER_S: Final = 20
"""Audit lines logged per second at most; the rest are counted in one line afterwards."""
LOGIN_FAILURE: Final = "authentication failure"


class Refusable(Protocol):
    """What a guard needs of its connection (``server.connection.Connection``)."""

    ctx: Any
    front_end: str
    transport: Any
    parked: Any

    def denied(self, kind: int, message: str) -> None: ...

    def auth_reply(self, cmd: Any, failure: str | None) -> None: ...

    def park_untimed(self, command: Any, waiter: object, on_timeout: bytes) -> None: ...

    def resume(self) -> None: ...

    def held(self, user: User) -> tuple[int, int]: ...


class User:
    """A configured user, its permissions cached by name (reload builds new ones)."""

    def __init__(self, name: str, config: UserConfig) -> None:
        self.name = name
        self.config = config
        self.admin = "*" in config.manage
        self.limited = config.max_items is not None or config.max_bytes is not None
        self._cache: tuple[dict[str, bool], ...] = ({}, {}, {}, {})
        self.connections = 0

    def may(self, right: int, name: str) -> bool:
        """Whether this user's patterns give ``right`` (PUT, TAKE, MANAGE) on ``name``."""
        cache = self._cache[right]
        hit = cache.get(name)
        if hit is None:
            cfg = self.config
            patterns = cfg.put if right == PUT else cfg.take if right == TAKE else cfg.manage
            hit = any(fnmatchcase(name, p) for p in patterns)
            if len(cache) > 10_000:
                cache.clear()
            cache[name] = hit
        return hit


class _Counters:
    __slots__ = ("denied", "failures", "limited", "logins", "manage_denied", "rate_limited")

    def __init__(self) -> None:
        self.logins = 0
        self.failures = 0
        self.rate_limited = 0
        self.denied = 0
        self.manage_denied = 0
        self.limited = 0


class Authenticator:
    """The server's users and everything their connections share (module docstring)."""

    def __init__(
        self, users: Mapping[str, UserConfig], loop: asyncio.AbstractEventLoop, clock: Clock
    ) -> None:
        self.loop = loop
        self.clock = clock
        """The server's one clock (the rate limit's and the audit's seconds)."""
        self.users: dict[str, User] = {}
        self.generation = 0
        """Bumped by each reload: a guard whose user is older looks it up again."""
        self.counters = _Counters()
        self.unauthenticated = 0
        self._salt = os.urandom(16)
        self._verified: dict[tuple[str, bytes], str] = {}
        self._buckets: dict[str, list[float]] = {}
        self._audit_second = 0
        self._audit_lines = 0
        self._audit_dropped = 0
        self.reload(users)

    def user_for_subject(self, subject: str) -> str | None:
        """The user whose ``subject`` is this client certificate's, or None."""
        for name, user in self.users.items():
            if user.config.subject == subject:
                return name
        return None

    @property
    def enabled(self) -> bool:
        """True when users are configured: every connection must log in."""
        return bool(self.users)

    def reload(self, users: Mapping[str, UserConfig]) -> None:
        """Take the users of a new config; logged-in connections keep their user if it is
        still there (with its new permissions), and lose it otherwise."""
        old = self.users
        self.users = {}
        for name, cfg in users.items():
            user = User(name, cfg)
            previous = old.get(name)
            if previous is not None:
                user.connections = previous.connections
            self.users[name] = user
        self._verified.clear()
        self.generation += 1

    def stats(self) -> dict[str, int]:
        """The ``auth_*`` counters (stats, ``/metrics``, the dashboard); none on a server that
        never had users (its stats stay as they were)."""
        c = self.counters
        if not self.users and not (c.logins or c.failures or self.unauthenticated):
            return {}
        return {
            "users": len(self.users),
            "logins": c.logins,
            "login_failures": c.failures,
            "login_rate_limited": c.rate_limited,
            "unauthenticated": self.unauthenticated,
            "permission_denied": c.denied,
            "manage_denied": c.manage_denied,
            "limit_refused": c.limited,
        }

    # ---- failed attempts per address ----------------------------------------------------

    def _bucket(self, host: str) -> list[float]:
        now = self.clock.monotonic_ms() / 1000
        bucket = self._buckets.get(host)
        if bucket is None:
            if len(self._buckets) >= MAX_TRACKED_ADDRESSES:
                self._prune(now)
            bucket = self._buckets[host] = [float(FAILURE_BURST), now]
        tokens = min(FAILURE_BURST, bucket[0] + (now - bucket[1]) / FAILURE_REFILL_S)
        bucket[0], bucket[1] = tokens, now
        return bucket

    def _prune(self, now: float) -> None:
        full = [
            h
            for h, (tokens, at) in self._buckets.items()
            if tokens + (now - at) / FAILURE_REFILL_S >= FAILURE_BURST
        ]
        for h in full:
            del self._buckets[h]
        if len(self._buckets) >= MAX_TRACKED_ADDRESSES:
            self._buckets.clear()

    def rate_limited(self, host: str) -> bool:
        """True when ``host`` has no failed attempt left for now."""
        return self._bucket(host)[0] < 1.0

    def _failed(self, host: str) -> None:
        self._bucket(host)[0] -= 1.0

    # ---- verification -------------------------------------------------------------------

    def _key(self, name: str, password: bytes) -> tuple[str, bytes]:
        import hashlib  # (a server without users never logs in: its start does not import it)

        return name, hashlib.sha256(self._salt + password).digest()

    def check(
        self, name: str, password: bytes, host: str, done: Callable[[User | None, str], None]
    ) -> bool:
        """Verify ``name``'s ``password`` and call ``done(user or None, reason)`` on the loop.
        Returns True when it answered at once (a rate-limited address, verified before),
        False when the slow check runs off the loop and ``done`` comes later."""
        if self.rate_limited(host):
            self.counters.rate_limited += 1
            self.audit("login refused for %s: too many failed attempts", host)
            done(None, "too many failed attempts; retry later")
            return True
        user = self.users.get(name)
        key = self._key(name, password)
        if user is not None and user.config.password is None:
            user = None  # a certificate-only user: no password logs in as it
        if user is not None and self._verified.get(key) == user.config.password:
            self._logged_in(user, done)
            return True
        from tercel.passwords import verify_password

        stored = (
            _DUMMY_HASH if user is None or user.config.password is None else user.config.password
        )
        generation = self.generation
        fut = self.loop.run_in_executor(None, verify_password, password, stored)

        def verified(f: asyncio.Future[bool]) -> None:
            ok = not f.cancelled() and f.exception() is None and f.result()
            current = self.users.get(name)
            if ok and user is not None and current is not None:
                if generation == self.generation:
                    self._verified[key] = stored
                if current.config.password == stored:
                    self._logged_in(current, done)
                    return
            self.counters.failures += 1
            self._failed(host)
            self.audit("login failed for user %s from %s", quoted(name, 64), host)
            done(None, LOGIN_FAILURE)

        fut.add_done_callback(verified)
        return False

    def _logged_in(self, user: User, done: Callable[[User | None, str], None]) -> None:
        limit = user.config.max_connections
        if limit is not None and user.connections >= limit:
            self.counters.limited += 1
            self.audit("login refused for user %s: %d connections", user.name, limit)
            done(None, f"user has its {limit} connections (max_connections)")
            return
        self.counters.logins += 1
        done(user, "")

    # ---- audit --------------------------------------------------------------------------

    def audit(self, fmt: str, *args: object) -> None:
        """Log one audit line (WARNING), at most :data:`AUDIT_LINES_PER_S` a second."""
        second = self.clock.monotonic_ms() // 1000
        if second != self._audit_second:
            if self._audit_dropped:
                log.warning("auth: %d more audit lines not logged", self._audit_dropped)
            self._audit_second, self._audit_lines, self._audit_dropped = second, 0, 0
        if self._audit_lines >= AUDIT_LINES_PER_S:
            self._audit_dropped += 1
            return
        self._audit_lines += 1
        log.warning("auth: " + fmt, *args)


_DUMMY_HASH: Final = "scrypt$32768$8$1$AAAAAAAAAAAAAAAAAAAAAA$" + "A" * 43
"""Checked for an unknown user, so that a wrong name costs as long as a wrong password."""


class _Login:
    """The waiter of a connection parked while its password is checked."""

    __slots__ = ("cmd",)

    def __init__(self, cmd: Any) -> None:
        self.cmd = cmd


class Guard:
    """One connection's login state and checks (module docstring)."""

    __slots__ = ("auth", "generation", "host", "put_ok", "take_ok", "user")

    def __init__(self, auth: Authenticator, host: str) -> None:
        self.auth = auth
        self.host = host
        """The peer's address (rate limits and audit lines)."""
        self.user: User | None = None
        """The logged-in user; None before a login."""
        self.generation = auth.generation
        self.put_ok = ""
        """The name the last full check allowed a put to (:meth:`fast`)."""
        self.take_ok = ""
        """The name the last full check allowed a take from."""

    def fast(self, right: int, name: str) -> bool:
        """True when ``name`` is the one the last full check of ``right`` (PUT or TAKE)
        allowed and nothing changed since (no reload, no limit to check): the common case of
        a client working one queue, at the cost of a few field reads and one string compare.
        False: make the full check (:meth:`allows`)."""
        user = self.user
        if user is None or self.generation != self.auth.generation:
            return False
        if right == PUT:
            return name == self.put_ok and not user.limited
        return right == TAKE and name == self.take_ok

    # ---- logging in -------------------------------------------------------------------------

    def login(self, conn: Refusable, cmd: Any, name: str, password: bytes) -> None:
        """Check ``name``/``password`` for ``conn`` and answer with ``conn.auth_reply(cmd,
        None or the reason)``; the connection stays parked while the check runs off the loop.
        A new login replaces the connection's user."""
        self.release()
        waiter = _Login(cmd)

        def done(user: User | None, reason: str) -> None:
            if conn.transport is None:  # the client left while its password was checked
                return
            if user is not None:
                self._take(user)
            conn.auth_reply(cmd, None if user is not None else reason)
            parked = conn.parked
            if parked is not None and parked.waiter is waiter:  # answered off the loop
                conn.parked = None
                conn.resume()

        if not self.auth.check(name, password, self.host, done):
            conn.park_untimed(cmd, waiter, b"")

    def assume(self, name: str) -> bool:
        """Log the connection in as ``name`` without a password (a client certificate's
        subject mapped to a user by whoever checked it); False for an unknown user."""
        user = self.auth.users.get(name)
        if user is None:
            return False
        self.release()
        self._take(user)
        self.auth.counters.logins += 1
        return True

    def _take(self, user: User) -> None:
        user.connections += 1
        self.user = user
        self.generation = self.auth.generation
        self.put_ok = self.take_ok = ""

    def release(self) -> None:
        """The connection closes or logs in again: its user holds one connection less."""
        user = self.user
        if user is not None:
            user.connections -= 1
            self.user = None

    # ---- checks -------------------------------------------------------------------------

    def current(self) -> User | None:
        """The connection's user as the current config has it (a reload may have changed its
        permissions or removed it)."""
        user = self.user
        if user is not None and self.generation != self.auth.generation:
            fresh = self.auth.users.get(user.name)
            self.generation = self.auth.generation
            self.put_ok = self.take_ok = ""
            self.user = fresh  # connection counts were carried over by the reload
            if fresh is None:
                self.auth.audit("user %s removed: %s must log in again", user.name, self.host)
            user = fresh
        return user

    def refuse_unauthenticated(self, conn: Refusable, what: str) -> bool:
        """Answer a command sent before a login; False."""
        self.auth.unauthenticated += 1
        conn.denied(UNAUTHENTICATED, f"unauthenticated: log in before {what}")
        return False

    def allows(
        self, conn: Refusable, right: int, name: str | None, what: str, fanout: bool = True
    ) -> bool:
        """Whether the user may run ``what`` needing ``right`` on queue/tube ``name``; if
        not, the refusal is answered, counted and logged. Before a login only
        :data:`LOGIN` is allowed. ``fanout``: a Kestrel queue name (taking from a fanout
        child needs the right on its parent too); False for a beanstalkd tube."""
        user = self.current()
        if user is None:
            if right == LOGIN:
                return True
            return self.refuse_unauthenticated(conn, what)
        if right in (NONE, LOGIN):
            return True
        if right == MANAGE_ALL or (right == MANAGE and name is None):
            if user.admin:
                return True
            return self._deny(conn, user, right, what, None)
        assert name is not None
        if not user.may(right, name):
            return self._deny(conn, user, right, what, name)
        if right == TAKE:
            if fanout and "+" in name:
                parent = fanout_parent(name)
                if parent is not None and not user.may(TAKE, parent):
                    return self._deny(conn, user, right, what, parent)
            self.take_ok = name
        elif right == PUT:
            self.put_ok = name
        return True

    def _deny(self, conn: Refusable, user: User, right: int, what: str, name: str | None) -> bool:
        auth = self.auth
        auth.counters.denied += 1
        where = "" if name is None else f" {name!r}"
        if right in (MANAGE, MANAGE_ALL):
            auth.counters.manage_denied += 1
        auth.audit(
            "user %s from %s refused %s%s on %s",
            user.name,
            self.host,
            quoted(what, 40),
            quoted(where, 210),
            conn.front_end,
        )
        verb = RIGHT_WORDS.get(right, "run")
        target = f"{what}" if name is None else f"{what}: {verb} {name!r}"
        conn.denied(DENIED, f"permission denied: {target}")
        return False

    def within_limits(self, conn: Refusable) -> bool:
        """On a put by a user with ``max_items``/``max_bytes``: whether what the queues it
        may put to hold (``conn.held(user)``: items, bytes) is below its limits; if not, the
        refusal is answered and counted."""
        user = self.user
        if user is None or not user.limited:
            return True
        items, size = conn.held(user)
        cfg = user.config
        if cfg.max_items is not None and items >= cfg.max_items:
            why = f"user limit reached: {items} items held (max_items {cfg.max_items})"
        elif cfg.max_bytes is not None and size >= cfg.max_bytes:
            why = f"user limit reached: {size} bytes held (max_bytes {cfg.max_bytes})"
        else:
            return True
        self.auth.counters.limited += 1
        conn.denied(LIMITED, why)
        return False


def held_in(user: User, queues: Iterable[tuple[str, int, int]]) -> tuple[int, int]:
    """Items and bytes of the ``(name, items, bytes)`` the user may put to."""
    items = size = 0
    for name, n, b in queues:
        if user.may(PUT, name):
            items += n
            size += b
    return items, size


def peer_host(transport: Any) -> str:
    """The peer's address of a transport, as the audit lines and rate limits name it."""
    peer = transport.get_extra_info("peername") if transport is not None else None
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return "local" if peer is None else str(peer)
