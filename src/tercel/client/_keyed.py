"""Keyed leases in the client, without I/O: the commands each method of
:class:`~tercel.client.Client` and :class:`~tercel.client.AsyncClient` sends and what the
replies mean (docs/protocol.md section 11, "Keyed leases").

A keyed lease is addressed to one server (the one that holds it), never rotated or retried
elsewhere: the key means something only there. Every operation is idempotent on its server
(a take of the same key gets the same lease, an ack of an acked key answers 0), so a caller
whose request timed out may send it again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tercel.client._base import Op, check, ms
from tercel.errors import BadReply, BadRequest
from tercel.names import key_problem
from tercel.protocol.commands import AckKey, LeaseKey, LeaseSlice, ReleaseKey, RenewKey
from tercel.protocol.memcache_client import LeaseColumns, Line, Reply


@dataclass(frozen=True)
class KeyedLease:
    """A keyed lease as its server holds it (the reply to :meth:`Client.lease_key`)."""

    server: str
    queue: str
    key: str
    count: int
    """Items under the key; 0: nothing was ready and no key was created (take again later)."""
    size: int
    """Payload bytes of those items."""
    expires_at: float
    """When the lease runs out (its items go back and the key can never be taken again),
    epoch seconds by the server's clock; 0.0: never."""


def _checked(key: str) -> str:
    """``key``, or BadRequest stating the key rule (before anything is sent)."""
    problem = key_problem(key)
    if problem is not None:
        raise BadRequest(problem)
    return key


def _lease_ms(lease_time: float | None) -> int:
    """A lease time in seconds as the wire's ``lease_ms`` (None: 0, the queue's
    ``key_lease_ms``)."""
    if lease_time is None:
        return 0
    if lease_time <= 0:
        raise ValueError("lease_time must be positive (or None for the queue's key_lease_ms)")
    return max(1, ms(lease_time))


def _summary(reply: Reply, server: str) -> tuple[int, int, int]:
    """``KEYED <count> <bytes> <expires_ms>`` as three ints."""
    reply = check(reply, server)
    if isinstance(reply, Line):
        words = reply.text.split()
        if len(words) == 4 and words[0] == "KEYED" and all(w.isdigit() for w in words[1:]):
            return int(words[1]), int(words[2]), int(words[3])
    raise BadReply(f"expected KEYED <count> <bytes> <expires_ms>, got {reply!r}", server)


def lease_key_op(
    queue: str, key: str, max_items: int, lease_time: float | None, wait: float
) -> Op[KeyedLease]:
    """``lease <queue> <max_items> <wait_ms> <lease_ms> key=<key> nodata``: take or take again,
    no payload moved."""
    if max_items < 1:
        raise ValueError("max_items must be at least 1")
    cmd = LeaseKey(queue, _checked(key), max_items, ms(wait), _lease_ms(lease_time), nodata=True)

    def finish(replies: list[Reply], server: str) -> KeyedLease:
        count, size, expires_ms = _summary(replies[0], server)
        return KeyedLease(server, queue, key, count, size, expires_ms / 1000)

    return Op([cmd], finish, wait)


def lease_slice_op(queue: str, key: str, start: int, stop: int) -> Op[LeaseColumns]:
    """``lease <queue> slice <start> <stop> binary key=<key>``: items start..stop-1 as columns;
    each item's lease id is ``key-<its place in hex>`` (ack the key, never an item)."""
    if not 0 <= start <= stop:
        raise ValueError(f"bad slice {start}..{stop}: 0 <= start <= stop")

    def finish(replies: list[Reply], server: str) -> LeaseColumns:
        reply = check(replies[0], server)
        if isinstance(reply, Line) and reply.text == "END":
            return LeaseColumns()
        if not isinstance(reply, LeaseColumns):
            raise BadReply(f"unexpected reply to a lease slice: {reply!r}", server)
        return reply

    return Op([LeaseSlice(queue, _checked(key), start, stop, True)], finish)


def _counted(word: str) -> Callable[[list[Reply], str], int]:
    def finish(replies: list[Reply], server: str) -> int:
        reply = check(replies[0], server)
        text = reply.text if isinstance(reply, Line) else ""
        head, _, count = text.partition(" ")
        if head != word or not count.isdigit():
            raise BadReply(f"expected {word} <n>, got {reply!r}", server)
        return int(count)

    return finish


def ack_key_op(queue: str, key: str) -> Op[int]:
    """``ack <queue> key=<key>`` -> the items confirmed (0: acked before)."""
    return Op([AckKey(queue, _checked(key))], _counted("ACKED"))


def release_key_op(queue: str, key: str) -> Op[int]:
    """``release <queue> key=<key>`` -> the items put back at their places."""
    return Op([ReleaseKey(queue, _checked(key))], _counted("RELEASED"))


def renew_key_op(queue: str, key: str, lease_time: float | None) -> Op[float]:
    """``renew <queue> <lease_ms> key=<key>`` -> the new ``expires_at`` (epoch seconds; 0.0:
    never)."""

    def finish(replies: list[Reply], server: str) -> float:
        return _summary(replies[0], server)[2] / 1000

    return Op([RenewKey(queue, _lease_ms(lease_time), _checked(key))], finish)
