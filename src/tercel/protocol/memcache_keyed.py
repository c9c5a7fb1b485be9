"""Keyed leases on the memcache port, server side: the ``key=<key>`` forms of ``lease``, ``ack``,
``release`` and ``renew`` and the ``KEYED`` reply (docs/protocol.md section 11, "Keyed leases").

:mod:`tercel.protocol.memcache` hands a request line here only when it names a key, so the
forms without a key are parsed (and refused) exactly as before. Sans-IO like its caller; a
bad request raises :class:`~tercel.errors.ProtocolError` (``CLIENT_ERROR <reason>``, the
connection stays) whose reason names the rule broken.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable, Sequence
from typing import Final, Protocol

from tercel.errors import ProtocolError
from tercel.names import key_problem
from tercel.protocol.commands import LeaseKey, LeaseSlice

KEY_WORD: Final = b"key="
"""The word that names a key: ``key=<key>``."""
KEYED_LEASE_USAGE: Final = (
    "lease <queue> <max_items> <wait_ms> <lease_ms> [binary] key=<key> [nodata]"
    " or lease <queue> slice <start> <stop> [binary] key=<key>"
)
_BIG_ENDIAN: Final = sys.byteorder == "big"
KEYED_PREFIX: Final = b"key"
"""The lease-id prefix of a keyed lease's items: item ``k`` of the lease is ``key-<k in hex>``
(its place in the keyed lease, from 0). A server's own prefix is 8 hex digits, never ``key``."""


def key(token: bytes) -> str:
    """The key of a ``key=<key>`` word, checked against the key rule (:mod:`tercel.names`)."""
    text = token[len(KEY_WORD) :].decode("latin-1")
    problem = key_problem(text)
    if problem is not None:
        raise ProtocolError(problem)
    return text


def key_only(tokens: list[bytes], at: int, usage: str) -> str:
    """The key of ``tokens[at]``, which must be the request's last word (no lease id beside a
    key)."""
    if len(tokens) != at + 1:
        raise ProtocolError(f"usage: {usage} (a key, no lease ids)")
    return key(tokens[at])


def keyed_lease(
    tokens: list[bytes], queue: Callable[[bytes], str], count: Callable[[bytes, str], int]
) -> LeaseKey | LeaseSlice:
    """A ``lease`` line with a ``key=`` word: the take (numbers where a lease has them) or the
    slice form (``slice <start> <stop>``); after them the words ``binary``, ``nodata`` (not
    for a slice) and ``key=<key>`` in any order, once each. ``queue`` and ``count`` are the
    codec's parsers of a queue name and of a number that may not be negative."""
    if len(tokens) < 5:
        raise ProtocolError(f"usage: {KEYED_LEASE_USAGE}")
    is_slice = tokens[2] == b"slice"
    found: str | None = None
    binary = nodata = False
    for word in tokens[5:]:
        if word.startswith(KEY_WORD) and found is None:
            found = key(word)
        elif word == b"binary" and not binary:
            binary = True
        elif word == b"nodata" and not nodata and not is_slice:
            nodata = True
        else:
            raise ProtocolError(f"usage: {KEYED_LEASE_USAGE}")
    if found is None:  # "key=" where a number belongs
        raise ProtocolError(f"usage: {KEYED_LEASE_USAGE}")
    name = queue(tokens[1])
    if is_slice:
        start, stop = count(tokens[3], "start"), count(tokens[4], "stop")
        if stop < start:
            raise ProtocolError(f"bad slice {start}..{stop}: stop before start")
        return LeaseSlice(name, found, start, stop, binary)
    max_items = count(tokens[2], "max_items")
    if max_items == 0:
        raise ProtocolError("bad max_items: a keyed lease takes at least 1 item")
    wait_ms = count(tokens[3], "wait_ms")
    return LeaseKey(name, found, max_items, wait_ms, count(tokens[4], "lease_ms"), binary, nodata)


def keyed(count: int, size: int, expires_ms: int) -> bytes:
    """``KEYED <count> <bytes> <expires_ms>``: a keyed lease's summary (the reply to ``nodata``
    and to ``renew``); ``KEYED 0 0 0`` when nothing was ready (no key was created)."""
    return b"KEYED %d %d %d\r\n" % (count, size, expires_ms)


class Columns(Protocol):
    """Items of a keyed lease as columns (the core's ``KeyedSlice``): item ``k``'s payload is
    ``data[offsets[k]:offsets[k + 1]]``."""

    @property
    def item_ids(self) -> Sequence[int]: ...
    @property
    def deliveries(self) -> Sequence[int]: ...
    @property
    def add_ms(self) -> Sequence[int]: ...
    @property
    def expiry_ms(self) -> Sequence[int]: ...
    @property
    def data(self) -> bytes | bytearray | memoryview: ...
    @property
    def offsets(self) -> Sequence[int]: ...


def payload_bytes(items: Columns) -> int:
    """The payload bytes of ``items``."""
    offsets = items.offsets
    return offsets[len(offsets) - 1] - offsets[0]


def keyed_items(start: int, items: Columns) -> list[bytes]:
    """Items ``start..`` of a keyed lease as ``LEASED`` lines, each with its payload, then
    ``END``: the lease id of item ``k`` is ``key-<start + k in hex>``."""
    out: list[bytes] = []
    view = memoryview(items.data)
    offsets, item_ids, deliveries = items.offsets, items.item_ids, items.deliveries
    add_ms, expiry_ms = items.add_ms, items.expiry_ms
    for k in range(len(item_ids)):
        a, b = offsets[k], offsets[k + 1]
        out.append(
            b"LEASED %b-%x %d %d %d %d %d\r\n"
            % (KEYED_PREFIX, start + k, item_ids[k], deliveries[k], add_ms[k], expiry_ms[k], b - a)
        )
        out += (bytes(view[a:b]), b"\r\n")
    out.append(b"END\r\n")
    return out


def _typed(code: str, values: Sequence[int]) -> array[int]:
    """``values`` as an array of type ``code``: itself when it is one already (no copy)."""
    if isinstance(values, array) and values.typecode == code:
        return values
    return array(code, values)


def keyed_binary(start: int, items: Columns) -> list[bytes]:
    """Items ``start..`` of a keyed lease as one ``LEASEDB`` block (the layout of
    :func:`tercel.protocol.memcache.leased_binary`, prefix ``key``, lease numbers ``start +
    k``), built from the columns whole; a bare ``END`` for no item. The caller keeps the
    payloads within one reply's limit (int32 offsets)."""
    n = len(items.item_ids)
    if n == 0:
        return [b"END\r\n"]
    offsets = items.offsets
    base, end = offsets[0], offsets[n]
    columns = [
        _typed("q", items.item_ids),
        _typed("q", items.add_ms),
        _typed("q", items.expiry_ms),
        array("q", range(start, start + n)),
        _typed("i", items.deliveries),
        _typed("i", offsets) if base == 0 else array("i", [o - base for o in offsets]),
    ]
    if _BIG_ENDIAN:
        columns = [array(c.typecode, c) for c in columns]  # copies: the caller's stay as they are
        for column in columns:
            column.byteswap()
    head = b"LEASEDB %d %b %d\r\n" % (n, KEYED_PREFIX, end - base)
    table = b"".join(c.tobytes() for c in columns)
    return [head, table, bytes(memoryview(items.data)[base:end]), b"\r\nEND\r\n"]
