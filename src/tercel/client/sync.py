"""The blocking client: :class:`Client` over plain sockets, one pool of connections per server.

Thread-safe: each call checks a connection out of its server's pool and puts it back when the
reply is complete, so threads never share a connection. A connection that fails is closed, its
server set aside (see :mod:`tercel.client._base`), and the operation retried on another server
where that is safe.
"""

from __future__ import annotations

import select
import socket
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import TypeVar

from tercel.client import _base as b
from tercel.client import _keyed as k
from tercel.client._base import Leased, Op, ServerState, Stored
from tercel.client.tls import Secured
from tercel.errors import ClientTimeout, NotStored, TransportError
from tercel.protocol.commands import Command
from tercel.protocol.memcache import NEED_DATA
from tercel.protocol.memcache_client import LeaseColumns, MemcacheClientCodec, Reply

T = TypeVar("T")


class _Connection:
    """One socket and its codec."""

    __slots__ = ("codec", "server", "sock")

    def __init__(
        self,
        server: ServerState,
        connect_timeout: float,
        tls: Secured,
        credentials: b.Credentials | None = None,
        timeout: float = 5.0,
    ) -> None:
        self.server = server
        try:
            sock = socket.create_connection((server.host, server.port), connect_timeout)
        except TimeoutError:
            raise ClientTimeout("connect timed out", server.address) from None
        except OSError as exc:
            raise TransportError(f"cannot connect: {exc}", server.address) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls.context is not None:  # the handshake, within the connect timeout
            try:
                sock = tls.context.wrap_socket(sock, server_hostname=tls.name_for(server.host))
            except TimeoutError:
                sock.close()
                raise ClientTimeout("TLS handshake timed out", server.address) from None
            except OSError as exc:  # ssl.SSLError: a certificate refused, not TLS at all...
                sock.close()
                raise TransportError(f"TLS handshake failed: {exc}", server.address) from None
        self.sock = sock
        self.codec = MemcacheClientCodec()
        if credentials is not None:
            try:
                login = b.login_op(credentials)
                login.finish(self.call(login.commands, timeout), server.address)
            except BaseException:
                self.sock.close()
                raise

    def dropped(self) -> bool:
        """True when this idle connection cannot be used again: the server closed it (its
        ``client_timeout``, a restart), or sent something no request asked for. A look at
        the socket that neither reads nor waits."""
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        return bool(poller.poll(0))  # readable while idle: EOF, a reset, or stray bytes

    def call(self, commands: Iterable[Command], timeout: float) -> list[Reply]:
        codec = self.codec
        data = b"".join(codec.send(c) for c in commands)
        replies: list[Reply] = []
        try:
            self.sock.settimeout(timeout)
            self.sock.sendall(data)
            while codec.pending:
                reply = codec.next_reply()
                if reply is NEED_DATA:
                    chunk = self.sock.recv(262144)
                    if not chunk:
                        raise TransportError("connection closed by the server", self.server.address)
                    codec.receive_data(chunk)
                else:
                    replies.append(reply)
        except TimeoutError:
            raise ClientTimeout(f"no reply within {timeout:.1f}s", self.server.address) from None
        except OSError as exc:
            raise TransportError(str(exc), self.server.address) from None
        return replies

    def close(self) -> None:
        self.sock.close()


class Reservation:
    """An item read with ``/open``: confirm it when done, abort to give it back.

    As a context manager it confirms on a clean exit and aborts on an exception. It holds its
    connection until then (open reads belong to a connection in Kestrel's protocol); if that
    connection breaks, the server returns the item to the queue by itself.
    """

    def __init__(self, client: Client, conn: _Connection, queue: str, data: bytes, item_id: int):
        self._client = client
        self._conn: _Connection | None = conn
        self.queue = queue
        self.data = data
        self.id = item_id

    def _end(self, abort: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            raise ValueError("this reservation was already confirmed or aborted")
        self._client._run_on(conn, b.close_op(self.queue, abort=abort))

    def confirm(self) -> None:
        """Remove the item for good."""
        self._end(abort=False)

    def abort(self) -> None:
        """Put the item back at the head of its queue."""
        self._end(abort=True)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._conn is None:
            return
        if et is None:
            self.confirm()
        else:
            self.abort()


class Client(b.ClientBase[_Connection]):
    """A blocking client for one tercel (or Kestrel) server or a list of them.

    ``servers`` is ``"host:port"`` or a list of them. Times are seconds: ``timeout`` bounds each
    reply (plus any wait asked for), ``connect_timeout`` each connect. See
    :mod:`tercel.client._base` for the cluster policy.
    """

    # ---- connections ----------------------------------------------------------------------

    def _checkout(self, server: ServerState) -> _Connection:
        while True:  # a pooled connection the server closed meanwhile is no sign of trouble
            with self._lock:
                pool = self._pools[server.address]
                conn = pool.pop() if pool else None
            if conn is None:
                break
            if not conn.dropped():
                return conn
            conn.close()
        try:
            return _Connection(
                server, self.connect_timeout, self.tls, self.credentials, self.timeout
            )
        except TransportError:
            self.cluster.failed(server)
            raise

    def _checkin(self, conn: _Connection) -> None:
        with self._lock:
            pool = self._pools[conn.server.address]
            if len(pool) < self.pool_size:
                pool.append(conn)
                return
        conn.close()

    def _run_on(self, conn: _Connection, op: Op[T], keep: bool = False) -> T:
        """Run ``op`` on a checked-out connection; check it back in unless ``keep``."""
        try:
            replies = conn.call(op.commands, self.timeout + op.wait)
        except TransportError:
            conn.close()
            self.cluster.failed(conn.server)
            raise
        except BaseException:  # interrupted, or a reply that does not parse: state unknown
            conn.close()
            raise
        self.cluster.ok(conn.server)
        if not keep:
            self._checkin(conn)
        return op.finish(replies, conn.server.address)

    def _run(self, op: Op[T], server: ServerState) -> T:
        return self._run_on(self._checkout(server), op)

    def _any(self, op: Op[T]) -> T:
        """Run ``op`` on a random healthy server, trying the next one if a connection fails.
        A timeout is not tried elsewhere: the server may have carried the request out (a
        ``put`` sent again would store its items twice)."""
        error: TransportError | None = None
        for server in self.cluster.healthy():
            try:
                conn = self._checkout(server)
            except TransportError as exc:  # nothing was sent (a connect timeout too)
                error = exc
                continue
            try:
                return self._run_on(conn, op)
            except ClientTimeout:
                raise
            except TransportError as exc:
                error = exc
        assert error is not None
        raise error

    def _each(self, op: Op[T], partial: bool = False) -> dict[str, T]:
        """Run ``op`` on every server not set aside. A server that fails is skipped when
        ``partial`` (its entry is missing), else its error is raised once all were tried."""
        out: dict[str, T] = {}
        error: TransportError | None = None
        for server in self.cluster.servers:
            if self.cluster.is_aside(server):
                continue
            try:
                out[server.address] = self._run(op, server)
            except TransportError as exc:
                error = exc
        if error is not None and (not partial or not out):
            raise error
        return out

    def _rotate(
        self, attempt: Callable[[ServerState, float], T | None], wait: float | None
    ) -> T | None:
        """A read that may wait: rotate over the healthy servers, each attempt waiting one
        slice, until a hit or the deadline. Servers that fail are set aside and skipped; the
        last TransportError is raised only when every server failed."""
        cluster = self.cluster
        servers = cluster.healthy()
        for i, part in enumerate(b.slices(wait, self.rotate_interval, len(servers))):
            server = servers[i % len(servers)]
            if cluster.is_aside(server):  # failed during this call
                continue
            try:
                got = attempt(server, part)
            except TransportError:
                if all(cluster.is_aside(s) for s in servers):
                    raise
                continue
            if got is not None:
                return got
        return None

    # ---- the API --------------------------------------------------------------------------

    def put(
        self, queue: str, data: bytes, expiry: float | None = None, *, key: str | None = None
    ) -> Stored | None:
        """Add ``data`` to ``queue`` (expiry: seconds from now). Raises NotStored when refused.

        With a dedup ``key``: the put goes to :meth:`server_for_key`'s server (no failover: a
        down server raises, retry later) and returns :class:`Stored`; a put that timed out
        can be sent again with the same key and lands once (within the queue's
        ``dedup_window_ms``). BadRequest for a key that breaks the rule."""
        if key is not None:
            server = self.cluster.servers[b.server_index(key, len(self.cluster.servers))]
            return self._run(b.keyed_put_op(queue, [(key, data)], expiry), server)[0]
        self._any(b.put_op(queue, [data], expiry))
        return None

    def server_for_key(self, key: str) -> str:
        """The server a put with dedup key ``key`` goes to (``zlib.crc32(key) % servers``)."""
        return self.cluster.servers[b.server_index(key, len(self.cluster.servers))].address

    def put_many(
        self,
        queue: str,
        items: Iterable[bytes],
        expiry: float | None = None,
        *,
        keys: Sequence[str] | None = None,
    ) -> int:
        """Add every item, pipelined on one server; the count. Raises NotStored if any was
        refused (``stored`` counts the others).

        With ``keys`` (one dedup key per item): each item goes to its key's server
        (:meth:`server_for_key`), pipelined per server; the count acknowledged (stored and
        duplicates)."""
        if keys is not None:
            return self._put_keyed(queue, list(items), list(keys), expiry)
        items = list(items)
        done = 0
        for i in range(0, len(items), b.PUT_BATCH):
            try:
                done += self._any(b.put_op(queue, items[i : i + b.PUT_BATCH], expiry))
            except NotStored as exc:
                exc.stored += done
                raise
        return done

    def _put_keyed(
        self, queue: str, items: list[bytes], keys: list[str], expiry: float | None
    ) -> int:
        done = 0
        for address, batch in b.by_server(self.cluster, items, keys).items():
            server = self.cluster.server(address)
            for i in range(0, len(batch), b.PUT_BATCH):
                try:
                    op = b.keyed_put_count_op(queue, batch[i : i + b.PUT_BATCH], expiry)
                    done += self._run(op, server)
                except NotStored as exc:
                    exc.stored += done
                    raise
        return done

    def get(self, queue: str, timeout: float | None = None) -> bytes | None:
        """Take the head item for good; None when every server stayed empty for ``timeout``
        seconds (None: do not wait)."""
        return self._rotate(lambda s, w: self._run(b.get_op(queue, w), s), timeout)

    def peek(self, queue: str) -> bytes | None:
        """The head item without taking it (the first server that has one)."""
        return self._rotate(lambda s, w: self._run(b.get_op(queue, w, peek=True), s), None)

    def reserve(self, queue: str, timeout: float | None = None) -> Reservation | None:
        """An open read: the item stays reserved until ``confirm()`` or ``abort()``."""

        return self._rotate(lambda s, w: self._reserve_on(s, queue, w), timeout)

    def _reserve_on(self, server: ServerState, queue: str, wait: float) -> Reservation | None:
        conn = self._checkout(server)
        value = self._run_on(conn, b.open_op(queue, wait), keep=True)
        if value is None:
            self._checkin(conn)
            return None
        return Reservation(self, conn, queue, value.data, value.cas or 0)

    def lease(
        self, queue: str, max_items: int, wait: float | None = None, lease_time: float | None = 30.0
    ) -> list[Leased]:
        """Lease up to ``max_items``; waits up to ``wait`` s only while the queue is empty.
        Each lease ends by :meth:`ack`, :meth:`release` or after ``lease_time`` s."""
        op = b.lease_op  # an empty batch counts as a miss, so the rotation goes on
        got = self._rotate(
            lambda s, w: self._run(op(queue, max_items, w, lease_time), s) or None, wait
        )
        return got or []

    def lease_columns(
        self, queue: str, max_items: int, wait: float | None = None, lease_time: float | None = 30.0
    ) -> tuple[str, LeaseColumns]:
        """:meth:`lease`, the items as flat columns (for bulk consumers such as the Spark
        source); (the server that answered, the items). Ack them with :meth:`ack_ids`."""
        op = b.lease_columns_op

        def attempt(server: ServerState, w: float) -> tuple[str, LeaseColumns] | None:
            got = self._run(op(queue, max_items, w, lease_time), server)
            return (server.address, got) if len(got) else None

        found = self._rotate(attempt, wait)
        return found if found is not None else ("", LeaseColumns())

    def ack_ids(self, server: str, queue: str, lease_ids: Sequence[str]) -> int:
        """Ack leases of ``queue`` on ``server`` by id (as :meth:`lease_columns` gave them);
        how many were still leased."""
        return self._run(b.lease_end_op("ack", queue, list(lease_ids)), self.cluster.server(server))

    def _lease_end(self, verb: str, items: Iterable[Leased], lease_time: float | None) -> int:
        n = 0
        for (address, queue), ids in b.group_leases(items).items():
            server = self.cluster.server(address)
            n += self._run(b.lease_end_op(verb, queue, ids, lease_time), server)
        return n

    def ack(self, items: Iterable[Leased]) -> int:
        """Confirm leased items for good; how many were still leased (acks are idempotent)."""
        return self._lease_end("ack", items, None)

    def release(self, items: Iterable[Leased]) -> int:
        """Give leased items back to the head of their queue; how many were still leased."""
        return self._lease_end("release", items, None)

    def renew(self, items: Iterable[Leased], lease_time: float | None) -> int:
        """Extend leases to ``lease_time`` s from now; how many were still leased."""
        return self._lease_end("renew", items, lease_time)

    # ---- keyed leases (docs/protocol.md section 11, "Keyed leases") ----------------------

    def lease_key(
        self,
        server: str,
        queue: str,
        key: str,
        max_items: int,
        *,
        lease_time: float | None = None,
        wait: float = 0.0,
    ) -> k.KeyedLease:
        """Take up to ``max_items`` from ``queue`` on ``server`` under ``key``, or, when the key
        was taken before (from any connection, before any restart), the same lease again:
        its count, bytes and expiry, no payload (read them with :meth:`lease_slice`).
        ``count`` 0: nothing was ready within ``wait`` s, no key was created. ``lease_time``
        None: the queue's ``key_lease_ms``. Raises ServerReplyError: a key the rules refuse,
        of another queue, taken with another ``max_items``, or ended (acked, released,
        expired: ``lease key K was acked``...)."""
        op = k.lease_key_op(queue, key, max_items, lease_time, wait)
        return self._run(op, self.cluster.server(server))

    def lease_slice(self, server: str, queue: str, key: str, start: int, stop: int) -> LeaseColumns:
        """Items ``start..stop-1`` of the keyed lease ``key`` with their payloads, as columns
        (one binary reply); takes nothing. Their lease ids are ``key-<place in hex>``: end
        them with the key (:meth:`ack_key`), never one by one. Raises ServerReplyError for a
        slice past the end, an unknown or ended key."""
        return self._run(k.lease_slice_op(queue, key, start, stop), self.cluster.server(server))

    def ack_key(self, server: str, queue: str, key: str) -> int:
        """Confirm every item of the keyed lease for good; the count (0: acked before)."""
        return self._run(k.ack_key_op(queue, key), self.cluster.server(server))

    def release_key(self, server: str, queue: str, key: str) -> int:
        """Put every item of the keyed lease back at its place in the queue; the count. The
        key is ended: a later take of it raises."""
        return self._run(k.release_key_op(queue, key), self.cluster.server(server))

    def renew_key(
        self, server: str, queue: str, key: str, lease_time: float | None = None
    ) -> float:
        """Make the keyed lease run out ``lease_time`` s from now (None: the queue's
        ``key_lease_ms``); the new ``expires_at`` (epoch seconds, 0.0: never)."""
        return self._run(k.renew_key_op(queue, key, lease_time), self.cluster.server(server))

    def delete(self, queue: str) -> None:
        """Delete ``queue`` (and its journal) on every server."""
        self._each(b.delete_op(queue))

    def flush(self, queue: str) -> None:
        """Drop every item of ``queue`` that is not reserved, on every server."""
        self._each(b.flush_op(queue))

    def status(self) -> dict[str, str]:
        """Each reachable server's status: ``UP``, ``WRITEAVOID``, ``READONLY`` or ``QUIESCENT``."""
        return self._each(b.status_op(), partial=True)

    def set_status(self, status: str) -> None:
        """Set the status (any case) on every server (docs/protocol.md, status)."""
        self._each(b.status_op(status))

    def stats(self) -> dict[str, dict[str, str]]:
        """Each reachable server's ``stats`` lines: {server: {name: value}}."""
        return self._each(b.stats_op(), partial=True)

    def queue_stats(self) -> dict[str, dict[str, dict[str, str]]]:
        """Each server's per-queue stats (``dump_stats``): {server: {queue: {name: value}}}."""
        return self._each(b.dump_stats_op(), partial=True)

    def version(self) -> dict[str, str]:
        """Each reachable server's version."""
        return self._each(b.version_op(), partial=True)

    def close(self) -> None:
        """Close every pooled connection (reservations keep theirs until they end)."""
        with self._lock:
            pools = [c for pool in self._pools.values() for c in pool]
            for pool in self._pools.values():
                pool.clear()
        for conn in pools:
            conn.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
