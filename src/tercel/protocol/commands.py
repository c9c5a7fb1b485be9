"""The commands of Kestrel's memcache protocol, as typed values.

Plain slotted dataclasses: validated by the codec when built, cheap to make on the hot path
(``frozen=True`` costs a measurable ``object.__setattr__`` per field; nothing mutates them).
Queue names are ``str`` (ASCII, already checked by :mod:`tercel.names`); payloads are ``bytes``.
Times on the wire are kept in the wire's units: ``Get.timeout`` in ms, ``Set.exptime`` raw.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Get:
    """``get <queue>[/t=<ms>][/open][/close][/abort][/peek]`` (also ``gets``)."""

    key: bytes
    """The key exactly as the client sent it; VALUE replies echo it."""
    queue: str
    timeout: int | None = None
    """Milliseconds to wait for an item; None (or <= 0 on the wire) means do not wait."""
    open: bool = False
    close: bool = False
    abort: bool = False
    peek: bool = False
    cas: bool = False
    """True for ``gets``: the reply carries the item id as the cas field."""


@dataclass(slots=True)
class Set:
    """``set <queue> <flags> <exptime> <bytes> [noreply]`` and its payload."""

    queue: str
    flags: int
    exptime: int
    data: bytes
    noreply: bool = False


@dataclass(slots=True)
class Delete:
    """``delete <queue> [noreply]``: drop the queue and its journal."""

    queue: str
    noreply: bool = False


@dataclass(slots=True)
class Flush:
    """``flush <queue> [noreply]``: drop every item that is not open."""

    queue: str
    noreply: bool = False


@dataclass(slots=True)
class FlushAll:
    """``flush_all [delay] [noreply]``: flush every queue."""

    noreply: bool = False


@dataclass(slots=True)
class FlushExpired:
    """``flush_expired <queue>``: drop expired items now; reply the count."""

    queue: str


@dataclass(slots=True)
class Simple:
    """A command without arguments: ``version``, ``shutdown``, ``reload``, ``dump_config``,
    ``stats``, ``flush_all_expired``, ``quit``. ``name`` is the lower-cased command."""

    name: str


@dataclass(slots=True)
class DumpStats:
    """``dump_stats [queue...]``."""

    queues: tuple[str, ...]


@dataclass(slots=True)
class Unknown:
    """A command the server does not know (answered with bare ``ERROR``)."""

    name: bytes


Command = Get | Set | Delete | Flush | FlushAll | FlushExpired | Simple | DumpStats | Unknown
