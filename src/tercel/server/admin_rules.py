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


def check_admin_settings(settings: ServerSettings) -> None:
    """Raise ConfigError when the admin listener may not start under ``settings``: beyond
    loopback it needs ``admin_token``."""
    if settings.admin_token is None and not is_loopback(settings.host.strip("[]").lower()):
        raise ConfigError(
            f"server.admin_token is required: the admin port listens on {settings.host}, "
            "beyond loopback (or set admin_port = false)"
        )
