"""The source's two halves: planning on the driver (:class:`Planner`) and reading on the
executors (:func:`read_slice`). Nothing is staged: the servers keep each batch under a keyed
lease (docs/protocol.md) until Spark has committed it, so any batch can be read again.

- The planner takes, for batch N, a keyed lease ``tercel.<id>.<N>`` on every server and
  queue without payloads (``Client.lease_key``): only counts come back. It acks a batch's keys
  once Spark has committed it. It runs in Spark's long-lived driver-side Python process for
  the query and is never pickled.
- An executor reads its slice of one server's lease straight from that server
  (``Client.lease_slice``, the binary ``LEASEDB`` reply) in chunks of bounded size, each one
  Arrow record batch built on the reply's buffers (no Python object per item).
"""

from __future__ import annotations

import logging
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import InputPartition

from tercel.client import Client
from tercel.errors import ClientError, ServerReplyError
from tercel.protocol.memcache_client import LeaseColumns
from tercel.spark.failpoints import failpoint
from tercel.spark.offsets import Leases, Offset, lease_key, split
from tercel.spark.options import SourceOptions, login_kwargs

log = logging.getLogger(__name__)
T = TypeVar("T")

TS = pa.timestamp("us", tz="UTC")

OUTPUT_SCHEMA = pa.schema(
    [
        ("value", pa.binary()),
        ("queue", pa.string()),
        ("server", pa.string()),
        ("seq", pa.int64()),
        ("item_id", pa.int64()),
        ("deliveries", pa.int32()),
        ("enqueued_at", TS),
        ("fetched_at", TS),
        ("expiry", TS),
    ]
)
"""What :func:`read_slice` yields; must equal the Arrow mapping of the source's Spark schema
(pyspark >= 4.2 rejects any difference, e.g. ``large_binary``)."""

SEQ_BITS = 32
"""``seq`` = batch number << SEQ_BITS | the row's position in its batch."""

READ_CHUNK_BYTES = 16 << 20
"""An executor asks for about this many payload bytes per ``lease_slice`` (memory bound)."""

READ_CHUNK_ITEMS = 20_000
"""... and at most this many items."""

READ_FIRST_ITEMS = 1_000
"""The first chunk of a slice (item sizes are not known before it)."""


class AllServersDown(RuntimeError):
    """Every server has been unreachable for longer than ``maxUnavailableMs``."""


class LeaseEnded(RuntimeError):
    """A logged batch's keyed lease was acked, released or ran out before Spark finished the
    batch: the batch cannot be read again (its items went back to the queue or were
    confirmed)."""


def connect(opts: SourceOptions, address: str, pool_size: int = 1) -> Client:
    """A client for one server, with the source's timeouts, TLS and login."""
    return Client(
        address,
        timeout=opts.socket_timeout_ms / 1000,
        connect_timeout=opts.connect_timeout_ms / 1000,
        retry_after=opts.server_retry_ms / 1000,
        max_retry_after=max(opts.server_retry_ms / 1000, 10.0),
        pool_size=pool_size,
        tls=opts.tls,
        **login_kwargs(opts.user, opts.password),
    )


@dataclass(frozen=True, slots=True)
class Plan:
    """What one plan took: the counts; whether every server answered short of its share (the
    queues were drained); whether a key was left out (the batch must still be logged, even
    empty, so that the next plan uses new keys)."""

    leases: Leases
    drained: bool
    skipped: bool = False


@dataclass(slots=True)
class Took:
    """One server's part of a plan (:meth:`Planner._take_on`)."""

    got: dict[str, int] = field(default_factory=dict)
    short: bool = True
    skipped: bool = False


class Planner:
    """Keyed leases on every server, for the driver (see the module docstring)."""

    def __init__(self, opts: SourceOptions, clock: Callable[[], float] = time.monotonic) -> None:
        self.opts = opts
        self.clock = clock
        self.clients = {s: connect(opts, s) for s in opts.servers}
        self._stats: dict[str, Client] | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._down_since: float | None = None

    def _each(self, work: Callable[[str], T], servers: Sequence[str]) -> list[T]:
        """``work`` on each server at once (a thread each); results in ``servers``' order.
        ``work`` changes no state of the planner."""
        if len(servers) <= 1:
            return [work(s) for s in servers]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(len(self.clients), "tercel-plan")
        return list(self._pool.map(work, servers))

    def queues_on(self, server: str) -> list[str]:
        """The queues this source reads on ``server``, sorted: the named ones, or those
        matching ``queuePattern`` now (one ``dump_stats``). Raises ClientError."""
        if self.opts.queue_pattern is None:
            return sorted(self.opts.queues)
        names = self.clients[server].queue_stats().get(server, {})
        return sorted(q for q in names if self.opts.matches(q))

    def take(self, ident: str, seq: int, limit: int, wait: bool = False) -> Plan:
        """Take batch ``seq``'s keyed leases, ``limit`` items at most: the limit split evenly
        over the configured servers, and each server's share over its queues (deterministic,
        so a restarted driver asks each key for what it asked before, and the server answers
        with the same lease). With ``wait``, each server's first queue may wait
        ``fetchWaitMs`` for an item while it is empty. A server that fails is left out of this
        batch. Raises AllServersDown when no server has answered for ``maxUnavailableMs``."""
        servers = list(self.opts.servers)
        shares = dict(zip(servers, split(limit, len(servers), seq), strict=True))
        answers = self._each(lambda s: self._take_on(s, ident, seq, shares[s], wait), servers)
        self._health(sum(a is not None for a in answers))
        leases = {
            s: a.got for s, a in zip(servers, answers, strict=True) if a is not None and a.got
        }
        return Plan(
            leases,
            drained=all(a is not None and a.short for a in answers),
            skipped=any(a is not None and a.skipped for a in answers),
        )

    def _take_on(
        self, server: str, ident: str, seq: int, share: int, wait_first: bool
    ) -> Took | None:
        """Batch ``seq``'s leases on one server (its queues in turn, only the first may
        wait); None when the server failed. A key the server refuses (``CLIENT_ERROR``: an
        attempt Spark never logged took it with other counts, or it ran out since) is left
        out: its items go back to the queue when its lease runs out, and a later batch takes
        them."""
        lease_time = None if self.opts.lease_ms is None else self.opts.lease_ms / 1000
        took = Took()
        try:
            queues = self.queues_on(server)
            wait = self.opts.fetch_wait_ms / 1000 if wait_first else 0.0
            for queue, ask in zip(queues, split(share, len(queues), seq), strict=True):
                if ask <= 0:
                    continue
                key = lease_key(ident, seq, None if self.opts.single_queue else queue)
                try:
                    lease = self.clients[server].lease_key(
                        server, queue, key, ask, lease_time=lease_time, wait=wait
                    )
                except ServerReplyError as exc:
                    if exc.kind != "CLIENT_ERROR":
                        raise
                    log.warning(
                        "tercel source: batch %d leaves out %s on %s: %s", seq, key, server, exc
                    )
                    took.skipped = True
                    continue
                wait = 0.0
                if lease.count:
                    took.got[queue] = lease.count
                took.short = took.short and lease.count < ask
        except ClientError as exc:
            log.warning("tercel source: %s left out of batch %d: %s", server, seq, exc)
            return None
        return took

    def _health(self, answered: int) -> None:
        if answered:
            self._down_since = None
            return
        now = self.clock()
        if self._down_since is None:
            self._down_since = now
        elif (now - self._down_since) * 1000 > self.opts.max_unavailable_ms:
            raise AllServersDown(
                f"no tercel server of {', '.join(self.opts.servers)} answered for "
                f"{now - self._down_since:.1f}s (maxUnavailableMs={self.opts.max_unavailable_ms})"
            )

    def _keys(self, offset: Offset) -> dict[str, list[tuple[str, str]]]:
        """(queue, key) of each lease of ``offset``, per server still configured."""
        single = self.opts.single_queue
        out: dict[str, list[tuple[str, str]]] = {}
        for server, per_queue in offset.leases.items():
            if server not in self.clients:
                log.warning(
                    "tercel source: %s is no longer listed; batch %d's lease there "
                    "is left to run out",
                    server,
                    offset.seq,
                )
                continue
            out[server] = [
                (q, lease_key(offset.id, offset.seq, None if single else q)) for q in per_queue
            ]
        return out

    def ack(self, offset: Offset) -> bool:
        """Ack batch ``offset``'s keys (Spark has committed it); whether every server
        answered (False: try again later; an ack is idempotent). A key that ended otherwise
        (ran out, released) is logged as an error: its items were handed out again."""
        keys = self._keys(offset)

        def on(server: str) -> bool:
            ok = True
            for queue, key in keys[server]:
                try:
                    self.clients[server].ack_key(server, queue, key)
                except ServerReplyError as exc:
                    log.error(
                        "tercel source: batch %d's lease on %s (%s) could not be acked: %s; "
                        "its items were handed out again (delivered twice)",
                        offset.seq,
                        server,
                        key,
                        exc,
                    )
                except ClientError as exc:
                    log.warning(
                        "tercel source: ack of batch %d on %s failed: %s (retried)",
                        offset.seq,
                        server,
                        exc,
                    )
                    ok = False
            return ok

        return all(self._each(on, list(keys)))

    def renew(self, offset: Offset) -> None:
        """Renew batch ``offset``'s keys before Spark replays it after a restart: raises
        :class:`LeaseEnded` when one ended (the batch cannot be replayed); an unreachable
        server is left to the executors' reads."""
        keys = self._keys(offset)
        lease_time = None if self.opts.lease_ms is None else self.opts.lease_ms / 1000

        def on(server: str) -> str | None:
            for queue, key in keys[server]:
                try:
                    self.clients[server].renew_key(server, queue, key, lease_time)
                except ServerReplyError as exc:
                    return f"{server} {queue} {key}: {exc}"
                except ClientError as exc:
                    log.warning(
                        "tercel source: renewing batch %d on %s failed: %s", offset.seq, server, exc
                    )
            return None

        ended = [e for e in self._each(on, list(keys)) if e is not None]
        if ended:
            raise LeaseEnded(
                f"tercel source: batch {offset.seq} cannot be replayed, its keyed lease ended "
                f"({'; '.join(ended)}): its items went back to the queue (or were confirmed). "
                "Raise leaseMs (or the queue's key_lease_ms) above the longest stop of a "
                "query; to go on, start the query on a new checkpointLocation (that batch's "
                "items are then delivered again)"
            )

    def depth(self) -> dict[str, dict[str, int]]:
        """Items waiting in the queues read, per reachable server (``dump_stats``)."""
        if self._stats is None:
            self._stats = {s: connect(self.opts, s) for s in self.opts.servers}
        out: dict[str, dict[str, int]] = {}
        for address, client in self._stats.items():
            try:
                stats = client.queue_stats().get(address, {})
            except ClientError as exc:
                log.warning("tercel source: no stats from %s: %s", address, exc)
                continue
            out[address] = {
                q: int(v.get("items", "0"))
                for q, v in sorted(stats.items())
                if self.opts.matches(q)
            }
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        for client in [*self.clients.values(), *(self._stats or {}).values()]:
            client.close()


# ---- executors ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Slice(InputPartition):
    """One task's share of a batch: items ``start..stop-1`` of one keyed lease (picklable, no
    payloads). ``seq0`` is the ``seq`` of item ``start``; ``planned_us`` the ``fetched_at`` of
    its rows (when the driver planned the batch, epoch microseconds)."""

    server: str
    queue: str
    key: str
    start: int
    stop: int
    seq0: int
    planned_us: int


def _constant(value: str | int, n: int, typ: pa.DataType) -> pa.Array:
    return pa.repeat(pa.scalar(value, typ), n)


def _ints(values: array[int], n: int, typ: pa.DataType) -> pa.Array:
    """An ``array.array`` as an Arrow array of the same width, without a copy."""
    return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(values)])


def to_batch(
    server: str, queue: str, cols: LeaseColumns, seq0: int, fetched_us: int
) -> pa.RecordBatch:
    """Items of one lease reply as a record batch (OUTPUT_SCHEMA) built on the reply's
    buffers: no Python object per item. Row ``k``'s ``seq`` is ``seq0 + k``."""
    n = len(cols.item_ids)
    offsets = cols.offsets if cols.offsets.typecode == "i" else array("i", cols.offsets)
    expiry_ms = _ints(cols.expiry_ms, n, pa.int64())
    expiry = pc.if_else(
        pc.equal(expiry_ms, 0), pa.scalar(None, pa.int64()), pc.multiply(expiry_ms, 1000)
    )
    value = pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(cols.data)]
    )
    arrays = [
        value,
        _constant(queue, n, pa.string()),
        _constant(server, n, pa.string()),
        _ints(array("q", range(seq0, seq0 + n)), n, pa.int64()),
        _ints(cols.item_ids, n, pa.int64()),
        _ints(cols.deliveries, n, pa.int32()),
        pc.multiply(_ints(cols.add_ms, n, pa.int64()), 1000).cast(TS),
        _constant(fetched_us, n, pa.int64()).cast(TS),
        expiry.cast(TS),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=OUTPUT_SCHEMA)


_clients: dict[tuple[str, SourceOptions], Client] = {}
"""Per executor Python worker (Spark reuses workers): one client per server and options."""


def read_slice(opts: SourceOptions, part: Slice) -> Iterator[pa.RecordBatch]:
    """The rows of ``part``, read from its server in chunks of about READ_CHUNK_BYTES of
    payload (the first chunk is small; later ones are sized from the items seen), each one
    record batch. Raises (failing the task) when the server cannot be reached or answers
    with an error, e.g. the lease ended: Spark retries the task, then fails the query."""
    client = _clients.get((part.server, opts))
    if client is None:
        client = _clients[(part.server, opts)] = connect(opts, part.server)
    step = READ_FIRST_ITEMS
    lo = part.start
    while lo < part.stop:
        hi = min(part.stop, lo + step)
        cols = _slice(opts, part, client, lo, hi)
        if len(cols.item_ids) != hi - lo:
            raise LeaseEnded(
                f"tercel source: items {lo}..{hi - 1} of lease {part.key} on {part.server} "
                f"came back as {len(cols.item_ids)} item(s)"
            )
        yield to_batch(part.server, part.queue, cols, part.seq0 + lo - part.start, part.planned_us)
        if lo == part.start:
            failpoint("source.read")
        mean = max(1, len(cols.data) // max(1, hi - lo))
        step = max(1, min(READ_CHUNK_ITEMS, READ_CHUNK_BYTES // mean))
        lo = hi


def _slice(opts: SourceOptions, part: Slice, client: Client, lo: int, hi: int) -> LeaseColumns:
    """Items ``lo..hi-1`` of ``part``'s lease. A server that cannot be reached is asked again
    (it may be restarting: the lease is journaled) until ``maxUnavailableMs`` has passed; an
    error the server answers (the lease ended, ...) is raised at once."""
    deadline = time.monotonic() + opts.max_unavailable_ms / 1000
    while True:
        try:
            return client.lease_slice(part.server, part.queue, part.key, lo, hi)
        except ServerReplyError:
            raise
        except ClientError as exc:
            if time.monotonic() >= deadline:
                raise
            log.warning(
                "tercel source: reading %s on %s: %s (retrying)", part.key, part.server, exc
            )
            time.sleep(min(1.0, opts.server_retry_ms / 1000))


def slices(offset: Offset, rows: int, planned_us: int, single_queue: str | None) -> list[Slice]:
    """``offset``'s batch cut into slices of at most ``rows`` items, server by server and
    queue by queue in sorted order (a row's ``seq`` is the batch number << SEQ_BITS plus its
    position in that order: unique and increasing per query, the same on a replay)."""
    out: list[Slice] = []
    pos = offset.seq << SEQ_BITS
    for server in sorted(offset.leases):
        for queue in sorted(offset.leases[server]):
            count = offset.leases[server][queue]
            key = lease_key(offset.id, offset.seq, None if single_queue else queue)
            for lo in range(0, count, rows):
                hi = min(count, lo + rows)
                out.append(Slice(server, queue, key, lo, hi, pos + lo, planned_us))
            pos += count
    return out
