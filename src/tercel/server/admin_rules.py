"""The admin listener's start-up rule, without the admin server's imports.

:mod:`tercel.server.admin` imports aiohttp and prometheus-client, which take longer than the
rest of the server together; the server imports it only once its other listeners serve
(docs/architecture.md, "Start-up"). What may stop a start must be known before that, so the
one rule the admin listener has about its settings lives here.
"""

from __future__ import annotations

from tercel.config import ServerSettings
from tercel.errors import ConfigError

LOOPBACK_NAMES = frozenset(("localhost", "127.0.0.1", "::1"))
"""Loopback without parsing the address (``ipaddress`` is imported for any other host only:
the default host is checked before the first command is served)."""


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals."""
    if host.lower().strip("[]") in LOOPBACK_NAMES:
        return True
    import ipaddress

    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def split_origin(origin: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` of an ``Origin`` header (the scheme's default port when it
    names none; an IPv6 host without brackets), or None when it is not an ``http``/``https``
    origin (``null``, another scheme, a path, a malformed port)."""
    scheme, sep, rest = origin.strip().lower().partition("://")
    if not sep or scheme not in ("http", "https") or not rest or "/" in rest or "@" in rest:
        return None
    if rest.startswith("["):
        end = rest.find("]")
        if end < 0:
            return None
        host, tail = rest[1:end], rest[end + 1 :]
    else:
        host, colon, port = rest.partition(":")
        tail = colon + port
    if not tail:
        return scheme, host, 443 if scheme == "https" else 80
    if not tail.startswith(":") or not tail[1:].isdigit() or not tail[1:].isascii():
        return None
    port_number = int(tail[1:])
    return (scheme, host, port_number) if 0 < port_number < 65536 else None


def check_admin_settings(settings: ServerSettings) -> None:
    """Raise ConfigError when the admin listener may not start under ``settings``: beyond
    loopback it needs ``admin_token``."""
    if settings.admin_token is None and not is_loopback(settings.host.strip("[]").lower()):
        raise ConfigError(
            f"server.admin_token is required: the admin port listens on {settings.host}, "
            "beyond loopback (or set admin_port = false)"
        )
