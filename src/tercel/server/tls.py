"""TLS for the listeners: the server's SSL context made from ``[tls]``, swapped at ``reload``.

Python's :mod:`ssl` (OpenSSL) does all the cryptography; this module only configures it.
Every TLS listener (each front end's, the admin HTTP one) is created with the one *base*
context of :class:`ServerTLS`. ``reload`` builds a fresh context from the same files and keeps
it as :attr:`ServerTLS.current`; the base context's SNI callback, which OpenSSL calls in every
new handshake (with or without a server name), moves that handshake onto the current context.
So a reload changes the certificate, key and CA of new connections only: a connection already
open keeps the context it shook hands with, and nothing is dropped. The client-certificate
requirement (``verify_client``) is the base context's, fixed at start-up.

Only the loop thread touches these objects (the SNI callback runs inside the handshake, on the
loop).
"""

from __future__ import annotations

import logging
import ssl
from typing import Any

from tercel.config import TLSSettings
from tercel.errors import ConfigError

log = logging.getLogger(__name__)

MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2
"""Older protocol versions are refused in the handshake (as memcached's and Redis's defaults)."""

_SUBJECT_NAMES = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "stateOrProvinceName": "ST",
    "localityName": "L",
    "domainComponent": "DC",
    "userId": "UID",
}


def _no_password() -> bytes:
    """The key's password callback: an encrypted key is refused, never prompted for (a
    server reading a terminal at start-up or in ``reload`` would stall)."""
    return b""


def make_context(settings: TLSSettings) -> ssl.SSLContext:
    """A server-side context for ``settings``: TLS 1.2 at least, the certificate chain and
    key, and the CA bundle for client certificates (required when ``verify_client``).

    Raises ConfigError naming the file that cannot be read or used (never its contents)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = MINIMUM_VERSION
    # No TLS 1.3 session tickets: resumption saves a handshake per reconnect, but tickets
    # arrive after the handshake as unsolicited bytes, which a pooled client reads as "the
    # server closed this idle connection" (tercel.client's idle check).
    ctx.num_tickets = 0
    # TLS 1.2 renegotiation asked for by a client makes the server redo the key exchange on
    # demand: CPU for the asking (TLS 1.3 has none).
    ctx.options |= ssl.OP_NO_RENEGOTIATION
    try:
        ctx.load_cert_chain(settings.cert, settings.key, password=_no_password)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"tls: cannot use the certificate {settings.cert} with the key {settings.key}: "
            f"{_reason(exc)}"
        ) from None
    if settings.ca is not None:
        try:
            ctx.load_verify_locations(cafile=settings.ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"tls.ca: cannot use {settings.ca}: {_reason(exc)}") from None
    if settings.verify_client:
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _reason(exc: OSError | ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or exc.__class__.__name__
    return exc.strerror or str(exc)


class ServerTLS:
    """The SSL contexts of one server's TLS listeners (made at start-up, before listening)."""

    def __init__(self, settings: TLSSettings) -> None:
        self.settings = settings
        self.base = make_context(settings)
        """The context every TLS listener was created with."""
        self.current = self.base
        """The context new handshakes use (a fresh one after each :meth:`reload`)."""
        self.reloads = 0
        self.base.sni_callback = self._switch

    def listens(self, name: str) -> bool:
        """Whether the listener ``name`` (``memcache``, ..., ``admin``) speaks TLS."""
        return name in self.settings.listeners

    @property
    def handshake_timeout(self) -> float:
        """Seconds a handshake may take before the connection is closed."""
        return self.settings.handshake_timeout / 1000

    def reload(self) -> None:
        """Read the certificate, key and CA files again for new connections. Raises
        ConfigError (the old context stays in use) when they cannot be used."""
        self.current = make_context(self.settings)
        self.reloads += 1
        log.info("reloaded the TLS certificate %s", self.settings.cert)

    def _switch(self, conn: Any, server_name: str | None, ctx: ssl.SSLContext) -> None:
        # Called by OpenSSL in each handshake on the base context (``conn`` is the
        # connection's SSLObject): hand it the current one.
        if self.current is not self.base:
            conn.context = self.current


def peer_subject(transport: Any) -> str | None:
    """The subject of the client certificate a TLS connection presented (checked against
    ``[tls] ca``), as ``CN=alice,O=Example`` in the certificate's order; None for a plaintext
    connection or one without a verified client certificate. ``transport``: the connection's
    (``Connection.transport``, or an aiohttp request's ``transport``)."""
    if transport is None:
        return None
    obj = transport.get_extra_info("ssl_object")
    if obj is None:
        return None
    cert = obj.getpeercert()
    if not cert:
        return None
    parts = []
    for rdn in cert.get("subject", ()):
        for name, value in rdn:
            key = _SUBJECT_NAMES.get(name, name)
            text = str(value).replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")
            parts.append(f"{key}={text}")
    return ",".join(parts) or None
