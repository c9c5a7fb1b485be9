"""TLS options of the clients: :class:`TLSOptions`, from arguments or the environment.

Only file paths and switches, never key material: the private key stays in its file (a
command line and a Spark query plan show their arguments). A :class:`TLSOptions` is a frozen,
picklable value (Spark ships it to its executors); :meth:`TLSOptions.context` builds the
:class:`ssl.SSLContext` where the connections are made. :mod:`ssl` is imported only then, so
a client without TLS does not load it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ssl

ENV_PREFIX = "TERCEL_TLS"
"""``TERCEL_TLS=1`` (the system's CAs), ``TERCEL_TLS_CA``, ``TERCEL_TLS_CERT``,
``TERCEL_TLS_KEY``, ``TERCEL_TLS_SERVER_NAME``, ``TERCEL_TLS_VERIFY=0``: see
:meth:`TLSOptions.from_env`."""
_OFF = ("0", "false", "no", "off")


@dataclass(frozen=True, slots=True)
class TLSOptions:
    """How a client speaks TLS to the servers (every server of its list).

    ``ca_file``: PEM CA bundle the servers' certificates are checked against (None: the
    system's). ``cert_file``/``key_file``: the client's certificate and (unencrypted) key, for
    servers that require one (mutual TLS). ``server_name``: the name checked against the
    servers' certificates and sent as SNI (None: each server's host as written in its
    address). ``verify``: False turns every check off (tests only: anyone in the middle can
    then read the traffic)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None
    verify: bool = True

    def context(self) -> ssl.SSLContext:
        """A client context for these options: TLS 1.2 at least. Raises OSError or
        ssl.SSLError when a file cannot be read or used."""
        import ssl

        ctx = ssl.create_default_context(cafile=self.ca_file)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert_file is not None:
            ctx.load_cert_chain(self.cert_file, self.key_file, password=_no_password)
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TLSOptions | None:
        """The options the environment sets (``TERCEL_TLS_*``), or None when it asks for no
        TLS (neither ``TERCEL_TLS=1`` nor any ``TERCEL_TLS_*`` file is set)."""
        env = os.environ if environ is None else environ
        files = {k: env.get(f"{ENV_PREFIX}_{k.upper()}") or None for k in ("ca", "cert", "key")}
        on = env.get(ENV_PREFIX, "").strip().lower()
        if on in _OFF or not (on or any(files.values())):
            return None
        return cls(
            ca_file=files["ca"],
            cert_file=files["cert"],
            key_file=files["key"],
            server_name=env.get(f"{ENV_PREFIX}_SERVER_NAME") or None,
            verify=env.get(f"{ENV_PREFIX}_VERIFY", "1").strip().lower() not in _OFF,
        )


def _no_password() -> bytes:
    """An encrypted key is refused rather than prompted for."""
    return b""


class Secured:
    """A client's TLS context and server name, built once (None: plaintext)."""

    __slots__ = ("context", "server_name")

    def __init__(self, tls: TLSOptions | ssl.SSLContext | None) -> None:
        self.server_name: str | None = None
        if tls is None or not isinstance(tls, TLSOptions):
            self.context = tls
            return
        self.context = tls.context()
        self.server_name = tls.server_name

    def name_for(self, host: str) -> str | None:
        """The name to check ``host``'s certificate against (None without TLS)."""
        if self.context is None:
            return None
        return self.server_name or host
