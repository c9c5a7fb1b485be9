"""The Python client for tercel (and Kestrel) servers: :class:`Client` (blocking) and
:class:`AsyncClient` (asyncio), with the same methods over one sans-IO codec
(:mod:`tercel.protocol.memcache_client`). This package imports only the protocol and the
errors, never the server, the core or the journal, so it is light to ship (Spark executors).

Conventions: servers are ``"host:port"`` strings; times are seconds (float); ``timeout=None``
means do not wait; ``get`` returns ``bytes`` or None; ``reserve`` returns a reservation with
``.data`` and ``.id`` (a context manager: confirm on success, abort on exception) or None;
``lease`` returns :class:`Leased` items to ``ack``, ``release`` or ``renew``; ``lease_key``
takes a keyed lease (:class:`KeyedLease`: the same items for the same key, read in slices with
``lease_slice``, ended by ``ack_key`` or ``release_key``). Failures raise
the :class:`~tercel.errors.ClientError` family. ``tls=TLSOptions(...)`` (or
``TLSOptions.from_env()``) speaks TLS to every server.
"""

from tercel.client._base import Leased, Stored
from tercel.client._keyed import KeyedLease
from tercel.client.aio import AsyncClient, AsyncReservation
from tercel.client.sync import Client, Reservation
from tercel.client.tls import TLSOptions

__all__ = [
    "AsyncClient",
    "AsyncReservation",
    "Client",
    "KeyedLease",
    "Leased",
    "Reservation",
    "Stored",
    "TLSOptions",
]
