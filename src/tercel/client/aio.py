"""The asyncio client: :class:`AsyncClient`, the same methods as :class:`~tercel.client.Client`
as coroutines, over asyncio streams with one pool of connections per server.

Use it from one event loop. Each call checks a connection out of its server's pool, so
concurrent tasks never share one; the policy (random healthy server, set-aside with back-off,
rotating blocking reads) is :mod:`tercel.client._base`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
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
    """One stream pair and its codec."""

    __slots__ = ("codec", "reader", "server", "writer")

    def __init__(
        self, server: ServerState, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self.codec = MemcacheClientCodec()

    @classmethod
    async def open(
        cls,
        server: ServerState,
        connect_timeout: float,
        tls: Secured,
        credentials: b.Credentials | None = None,
        timeout: float = 5.0,
    ) -> _Connection:
        """Connect (and shake hands, with ``tls``; log in, with ``credentials``) within
        ``connect_timeout``."""
        try:
            async with asyncio.timeout(connect_timeout):
                reader, writer = await asyncio.open_connection(
                    server.host,
                    server.port,
                    ssl=tls.context,
                    server_hostname=tls.name_for(server.host),
                )
        except TimeoutError:
            raise ClientTimeout("connect timed out", server.address) from None
        except OSError as exc:
            raise TransportError(f"cannot connect: {exc}", server.address) from None
        conn = cls(server, reader, writer)
        if credentials is not None:
            try:
                login = b.login_op(credentials)
                login.finish(await conn.call(login.commands, timeout), server.address)
            except BaseException:
                conn.close()
                raise
        return conn

    def dropped(self) -> bool:
        """True when the server closed this idle connection (its ``client_timeout``, a
        restart): the loop saw the end of the stream while it sat in the pool."""
        return self.reader.at_eof() or self.writer.is_closing()

    async def call(self, commands: Iterable[Command], timeout: float) -> list[Reply]:
        codec = self.codec
        replies: list[Reply] = []
        try:
            async with asyncio.timeout(timeout):
                self.writer.write(b"".join(codec.send(c) for c in commands))
                await self.writer.drain()
                while codec.pending:
                    reply = codec.next_reply()
                    if reply is NEED_DATA:
                        chunk = await self.reader.read(262144)
                        if not chunk:
                            raise TransportError(
                                "connection closed by the server", self.server.address
                            )
                        codec.receive_data(chunk)
                    else:
                        replies.append(reply)
        except TimeoutError:
            raise ClientTimeout(f"no reply within {timeout:.1f}s", self.server.address) from None
        except OSError as exc:
            raise TransportError(str(exc), self.server.address) from None
        return replies

    def close(self) -> None:
        self.writer.close()


class AsyncReservation:
    """An item read with ``/open`` (see :class:`tercel.client.sync.Reservation`); use
    ``async with``: confirmed on a clean exit, aborted on an exception."""

    def __init__(
        self, client: AsyncClient, conn: _Connection, queue: str, data: bytes, item_id: int
    ) -> None:
        self._client = client
        self._conn: _Connection | None = conn
        self.queue = queue
        self.data = data
        self.id = item_id

    async def _end(self, abort: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            raise ValueError("this reservation was already confirmed or aborted")
        await self._client._run_on(conn, b.close_op(self.queue, abort=abort))

    async def confirm(self) -> None:
        """Remove the item for good."""
        await self._end(abort=False)

    async def abort(self) -> None:
        """Put the item back at the head of its queue."""
        await self._end(abort=True)

    async def __aenter__(self) -> AsyncReservation:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._conn is None:
            return
        if et is None:
            await self.confirm()
        else:
            await self.abort()


class AsyncClient(b.ClientBase[_Connection]):
    """The asyncio twin of :class:`tercel.client.Client` (same arguments, same methods)."""

    # ---- connections ----------------------------------------------------------------------

    async def _checkout(self, server: ServerState) -> _Connection:
        pool = self._pools[server.address]
        while pool:  # a pooled connection the server closed meanwhile is no sign of trouble
            conn = pool.pop()
            if not conn.dropped():
                return conn
            conn.close()
        try:
            return await _Connection.open(
                server, self.connect_timeout, self.tls, self.credentials, self.timeout
            )
        except TransportError:
            self.cluster.failed(server)
            raise

    def _checkin(self, conn: _Connection) -> None:
        pool = self._pools[conn.server.address]
        if len(pool) < self.pool_size:
            pool.append(conn)
        else:
            conn.close()

    async def _run_on(self, conn: _Connection, op: Op[T], keep: bool = False) -> T:
        try:
            replies = await conn.call(op.commands, self.timeout + op.wait)
        except TransportError:
            conn.close()
            self.cluster.failed(conn.server)
            raise
        except BaseException:  # cancelled, or a reply that does not parse: state unknown
            conn.close()
            raise
        self.cluster.ok(conn.server)
        if not keep:
            self._checkin(conn)
        return op.finish(replies, conn.server.address)

    async def _run(self, op: Op[T], server: ServerState) -> T:
        return await self._run_on(await self._checkout(server), op)

    async def _any(self, op: Op[T]) -> T:
        """As :meth:`tercel.client.Client._any`: a timeout is not tried elsewhere."""
        error: TransportError | None = None
        for server in self.cluster.healthy():
            try:
                conn = await self._checkout(server)
            except TransportError as exc:  # nothing was sent (a connect timeout too)
                error = exc
                continue
            try:
                return await self._run_on(conn, op)
            except ClientTimeout:
                raise
            except TransportError as exc:
                error = exc
        assert error is not None
        raise error

    async def _each(self, op: Op[T], partial: bool = False) -> dict[str, T]:
        out: dict[str, T] = {}
        error: TransportError | None = None
        for server in self.cluster.servers:
            if self.cluster.is_aside(server):
                continue
            try:
                out[server.address] = await self._run(op, server)
            except TransportError as exc:
                error = exc
        if error is not None and (not partial or not out):
            raise error
        return out

    async def _rotate(
        self, attempt: Callable[[ServerState, float], Awaitable[T | None]], wait: float | None
    ) -> T | None:
        cluster = self.cluster
        servers = cluster.healthy()
        for i, part in enumerate(b.slices(wait, self.rotate_interval, len(servers))):
            server = servers[i % len(servers)]
            if cluster.is_aside(server):
                continue
            try:
                got = await attempt(server, part)
            except TransportError:
                if all(cluster.is_aside(s) for s in servers):
                    raise
                continue
            if got is not None:
                return got
        return None

    # ---- the API (documented on tercel.client.Client) -------------------------------------

    async def put(
        self, queue: str, data: bytes, expiry: float | None = None, *, key: str | None = None
    ) -> Stored | None:
        if key is not None:
            server = self.cluster.servers[b.server_index(key, len(self.cluster.servers))]
            return (await self._run(b.keyed_put_op(queue, [(key, data)], expiry), server))[0]
        await self._any(b.put_op(queue, [data], expiry))
        return None

    def server_for_key(self, key: str) -> str:
        return self.cluster.servers[b.server_index(key, len(self.cluster.servers))].address

    async def put_many(
        self,
        queue: str,
        items: Iterable[bytes],
        expiry: float | None = None,
        *,
        keys: Sequence[str] | None = None,
    ) -> int:
        if keys is not None:
            groups = b.by_server(self.cluster, list(items), list(keys))
            results = await asyncio.gather(
                *(self._put_keyed_on(queue, a, batch, expiry) for a, batch in groups.items()),
                return_exceptions=True,  # every server's pipeline ends before anything raises
            )
            done = sum(r for r in results if isinstance(r, int))
            for r in results:
                if isinstance(r, BaseException):
                    if isinstance(r, NotStored):
                        r.stored += done
                    raise r
            return done
        items = list(items)
        done = 0
        for i in range(0, len(items), b.PUT_BATCH):
            try:
                done += await self._any(b.put_op(queue, items[i : i + b.PUT_BATCH], expiry))
            except NotStored as exc:
                exc.stored += done
                raise
        return done

    async def _put_keyed_on(
        self, queue: str, address: str, batch: list[tuple[str, bytes]], expiry: float | None
    ) -> int:
        server = self.cluster.server(address)
        done = 0
        for i in range(0, len(batch), b.PUT_BATCH):
            try:
                op = b.keyed_put_count_op(queue, batch[i : i + b.PUT_BATCH], expiry)
                done += await self._run(op, server)
            except NotStored as exc:
                exc.stored += done
                raise
        return done

    async def get(self, queue: str, timeout: float | None = None) -> bytes | None:
        return await self._rotate(lambda s, w: self._run(b.get_op(queue, w), s), timeout)

    async def peek(self, queue: str) -> bytes | None:
        return await self._rotate(lambda s, w: self._run(b.get_op(queue, w, peek=True), s), None)

    async def reserve(self, queue: str, timeout: float | None = None) -> AsyncReservation | None:
        return await self._rotate(lambda s, w: self._reserve_on(s, queue, w), timeout)

    async def _reserve_on(
        self, server: ServerState, queue: str, wait: float
    ) -> AsyncReservation | None:
        conn = await self._checkout(server)
        value = await self._run_on(conn, b.open_op(queue, wait), keep=True)
        if value is None:
            self._checkin(conn)
            return None
        return AsyncReservation(self, conn, queue, value.data, value.cas or 0)

    async def lease(
        self, queue: str, max_items: int, wait: float | None = None, lease_time: float | None = 30.0
    ) -> list[Leased]:
        async def attempt(server: ServerState, part: float) -> list[Leased] | None:
            got = await self._run(b.lease_op(queue, max_items, part, lease_time), server)
            return got or None  # an empty batch counts as a miss, so the rotation goes on

        return await self._rotate(attempt, wait) or []

    async def lease_columns(
        self, queue: str, max_items: int, wait: float | None = None, lease_time: float | None = 30.0
    ) -> tuple[str, LeaseColumns]:
        async def attempt(server: ServerState, part: float) -> tuple[str, LeaseColumns] | None:
            got = await self._run(b.lease_columns_op(queue, max_items, part, lease_time), server)
            return (server.address, got) if len(got) else None

        found = await self._rotate(attempt, wait)
        return found if found is not None else ("", LeaseColumns())

    async def ack_ids(self, server: str, queue: str, lease_ids: Sequence[str]) -> int:
        op = b.lease_end_op("ack", queue, list(lease_ids))
        return await self._run(op, self.cluster.server(server))

    async def _lease_end(self, verb: str, items: Iterable[Leased], lease_time: float | None) -> int:
        n = 0
        for (address, queue), ids in b.group_leases(items).items():
            server = self.cluster.server(address)
            n += await self._run(b.lease_end_op(verb, queue, ids, lease_time), server)
        return n

    async def ack(self, items: Iterable[Leased]) -> int:
        return await self._lease_end("ack", items, None)

    async def release(self, items: Iterable[Leased]) -> int:
        return await self._lease_end("release", items, None)

    async def renew(self, items: Iterable[Leased], lease_time: float | None) -> int:
        return await self._lease_end("renew", items, lease_time)

    # ---- keyed leases (documented on tercel.client.Client) --------------------------------

    async def lease_key(
        self,
        server: str,
        queue: str,
        key: str,
        max_items: int,
        *,
        lease_time: float | None = None,
        wait: float = 0.0,
    ) -> k.KeyedLease:
        op = k.lease_key_op(queue, key, max_items, lease_time, wait)
        return await self._run(op, self.cluster.server(server))

    async def lease_slice(
        self, server: str, queue: str, key: str, start: int, stop: int
    ) -> LeaseColumns:
        op = k.lease_slice_op(queue, key, start, stop)
        return await self._run(op, self.cluster.server(server))

    async def ack_key(self, server: str, queue: str, key: str) -> int:
        return await self._run(k.ack_key_op(queue, key), self.cluster.server(server))

    async def release_key(self, server: str, queue: str, key: str) -> int:
        return await self._run(k.release_key_op(queue, key), self.cluster.server(server))

    async def renew_key(
        self, server: str, queue: str, key: str, lease_time: float | None = None
    ) -> float:
        op = k.renew_key_op(queue, key, lease_time)
        return await self._run(op, self.cluster.server(server))

    async def delete(self, queue: str) -> None:
        await self._each(b.delete_op(queue))

    async def flush(self, queue: str) -> None:
        await self._each(b.flush_op(queue))

    async def status(self) -> dict[str, str]:
        return await self._each(b.status_op(), partial=True)

    async def set_status(self, status: str) -> None:
        await self._each(b.status_op(status))

    async def stats(self) -> dict[str, dict[str, str]]:
        return await self._each(b.stats_op(), partial=True)

    async def queue_stats(self) -> dict[str, dict[str, dict[str, str]]]:
        return await self._each(b.dump_stats_op(), partial=True)

    async def version(self) -> dict[str, str]:
        return await self._each(b.version_op(), partial=True)

    async def close(self) -> None:
        """Close every pooled connection."""
        pools = [c for pool in self._pools.values() for c in pool]
        for pool in self._pools.values():
            pool.clear()
        for conn in pools:
            conn.close()
            with contextlib.suppress(OSError):
                await conn.writer.wait_closed()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
