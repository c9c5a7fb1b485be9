"""Fetching on the driver: lease items from every server, stage them, and only then ack.

One round asks each available server for a lease batch, appends everything that came back as
one record batch to the open staging segment, fsyncs it, and acks the leases, server by
server. So the server holds an item leased only for the milliseconds between the lease and
the fsync, and an item is never confirmed before Spark could replay it.

Crash windows (docs/spark.md has the full matrix):

- before the fsync: nothing of the round is staged; the leases expire after ``leaseMs`` and
  the items are handed out again (no loss, no duplicate);
- after the fsync, before the ack: the round is in the ``.tmp`` segment; recovery re-acks its
  lease ids. Items whose lease ran out first (or whose server restarted) come back with
  ``deliveries > 1``; their ``(server, queue, item_id)`` is remembered as *suspect* and such
  an item is acked and dropped instead of staged twice.

Runs only in Spark's long-lived driver-side Python process for the query (the stream reader's
``latestOffset``); never pickled (the reader drops it in ``__getstate__``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import partial
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from tercel.client import Client
from tercel.errors import ClientError
from tercel.protocol.memcache_client import LeaseColumns
from tercel.spark.failpoints import failpoint
from tercel.spark.options import SourceOptions, login_kwargs
from tercel.spark.staging import (
    STAGE_SCHEMA,
    Key,
    SegmentWriter,
    StagingLog,
    load_suspects,
    save_suspects,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


class AllServersDown(RuntimeError):
    """Every server has been unreachable for longer than ``maxUnavailableMs``."""


@dataclass(slots=True)
class LeaseReply:
    """What one ``lease`` on one server and queue gave: its items as columns."""

    server: str
    queue: str
    cols: LeaseColumns


def _constant(value: str | int, n: int, typ: pa.DataType) -> pa.Array:
    return pa.repeat(pa.scalar(value, typ), n)


def _ints(values: Sequence[int], n: int, typ: pa.DataType) -> pa.Array:
    """An ``array.array`` as an Arrow array of the same width, without a copy."""
    return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(values)])


def to_batch(got: LeaseReply, fetched_at: float) -> pa.RecordBatch:
    """One lease reply as a staged record batch (STAGE_SCHEMA), built from its buffers: no
    Python object per item but the lease id."""
    cols, n = got.cols, len(got.cols)
    ts = STAGE_SCHEMA.field("enqueued_at").type
    expiry_ms = _ints(cols.expiry_ms, n, pa.int64())
    expiry = pc.if_else(
        pc.equal(expiry_ms, 0), pa.scalar(None, pa.int64()), pc.multiply(expiry_ms, 1000)
    )
    arrays = [
        pa.Array.from_buffers(
            pa.binary(), n, [None, pa.py_buffer(cols.offsets), pa.py_buffer(cols.data)]
        ),
        _constant(got.queue, n, pa.string()),
        _constant(got.server, n, pa.string()),
        _ints(cols.item_ids, n, pa.int64()),
        _ints(cols.deliveries, n, pa.int32()),
        pc.multiply(_ints(cols.add_ms, n, pa.int64()), 1000).cast(ts),
        _constant(round(fetched_at * 1_000_000), n, pa.int64()).cast(ts),
        expiry.cast(ts),
        pa.array(cols.lease_ids, pa.string()),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=STAGE_SCHEMA)


@dataclass
class FetchMetrics:
    """The fetcher's counters since its process started (reported in the query progress)."""

    fetches: int = 0
    leased: int = 0
    staged: int = 0
    acked: int = 0
    dropped: int = 0
    """Redelivered suspects acked and dropped (they were already staged)."""
    recovered: int = 0
    lease_ms: float = 0.0
    ack_ms: float = 0.0
    last_fetch_ms: float = 0.0

    def report(self, suspects: int) -> dict[str, float | int]:
        out: dict[str, float | int] = asdict(self)
        out["lease_ms"] = round(self.lease_ms, 1)
        out["ack_ms"] = round(self.ack_ms, 1)
        out["suspects"] = suspects
        return out


class Fetcher:
    """Leases from the servers into the staging log (driver only; see the module docstring)."""

    def __init__(
        self,
        opts: SourceOptions,
        staging: StagingLog,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.opts = opts
        self.staging = staging
        self.clock = clock
        self.clients = self._connect()
        self._stats_clients: dict[str, Client] | None = None
        """Separate clients for queue depths: ``reportLatestOffset`` asks on the query's
        thread while a prefetch may be using :attr:`clients`."""
        self.suspects: set[Key] = load_suspects(staging.root)
        """Items that may be handed out again although they are staged; saved in the staging
        directory whenever the set changes, so they outlive any number of crashes."""
        self._recovered = False
        self._queues: dict[str, list[str]] = {}
        self._turn = 0
        self._pool: ThreadPoolExecutor | None = None
        """The queues read on each server (:meth:`resolve_queues`)."""
        self.metrics = FetchMetrics()
        self._down_since: float | None = None
        self._paused = False

    # ---- recovery ---------------------------------------------------------------------

    def recover(self) -> int:
        """Finish the ``.tmp`` segments of a crashed run and re-ack their leases; the number of
        rows recovered. Runs before the first fetch of a process and after a failed fetch.

        The recovered items become saved suspects *before* their ``.tmp`` goes: their leases
        may have run out (or their server restarted), and then they come back. An item whose
        re-ack succeeded is confirmed and stops being a suspect."""
        rounds: list[pa.RecordBatch] = []

        def hold(batches: list[pa.RecordBatch]) -> None:
            keys: set[Key] = set()
            for batch in batches:
                cols = batch.select(["server", "queue", "item_id"]).to_pydict()
                keys.update(zip(cols["server"], cols["queue"], cols["item_id"], strict=True))
            self._suspect(keys)
            failpoint("recover.suspects")
            rounds.extend(batches)

        rows = self.staging.recover(hold)
        for batch in rounds:
            cols = batch.select(["server", "queue", "item_id", "lease_id"]).to_pydict()
            groups: dict[tuple[str, str], tuple[list[str], list[int]]] = {}
            for server, queue, item_id, lease_id in zip(
                cols["server"], cols["queue"], cols["item_id"], cols["lease_id"], strict=True
            ):
                lease_ids, item_ids = groups.setdefault((server, queue), ([], []))
                lease_ids.append(lease_id)
                item_ids.append(item_id)
            for (server, queue), (lease_ids, item_ids) in groups.items():
                if server not in self.clients:
                    log.warning("tercel source: %s is no longer listed; not re-acked", server)
                elif self.ack(server, queue, lease_ids, item_ids):
                    self._clear({(server, queue, i) for i in item_ids})
                failpoint("recover.acked")
        self._recovered = True
        self.metrics.recovered += rows
        return rows

    def _suspect(self, keys: set[Key]) -> None:
        """Make ``keys`` suspects, durably (before anything else happens)."""
        if keys - self.suspects:
            self.suspects |= keys
            save_suspects(self.staging.root, self.suspects)
            failpoint("suspects.saved")

    def _clear(self, keys: set[Key]) -> None:
        """``keys`` were acked (confirmed on their server): they cannot come back."""
        if keys & self.suspects:
            self.suspects -= keys
            save_suspects(self.staging.root, self.suspects)

    # ---- fetching ---------------------------------------------------------------------

    def fetch(
        self, pos: int, want: int, wait_first: bool, stop_at: int | None = None
    ) -> tuple[int, bool]:
        """Lease up to ``want`` items (a little more when several servers answer), stage them
        in a new segment starting at ``pos``, ack them; (the new staged end, whether a round
        found every server drained).

        Stops when ``want`` is reached, a round finds every server drained, ``stop_at`` items
        were staged, or ``maxFetchDurationMs`` has passed. Only the first round may wait
        (``fetchWaitMs``), and only if ``wait_first``. Raises AllServersDown when no server has
        answered for ``maxUnavailableMs``.
        """
        if not self._recovered:
            self.recover()
        self.resolve_queues()
        opts = self.opts
        started = self.clock()
        deadline = self.clock() + opts.max_fetch_ms / 1000
        writer = SegmentWriter(self.staging.root, pos)
        got = 0
        first = True
        drained = False
        limit = want if stop_at is None else min(want, stop_at)
        try:
            while got < limit:
                wait = opts.fetch_wait_ms / 1000 if (first and wait_first) else None
                first = False
                ask = limit - got
                leased, full = self._round(ask, wait)
                failpoint("fetch.leased")
                fetched_at = time.time()
                staged: list[pa.RecordBatch] = []
                dropped: set[Key] = set()
                for reply in leased:
                    batch, gone = self._split(reply, to_batch(reply, fetched_at))
                    staged.append(batch)
                    dropped |= gone
                if any(b.num_rows for b in staged):
                    writer.append(*staged)
                    self._maybe_pause()
                    failpoint("fetch.staged")
                by_server: dict[str, list[LeaseReply]] = {}
                for reply in leased:
                    by_server.setdefault(reply.server, []).append(reply)
                sent = self._each_server(partial(self._send_acks, by_server), list(by_server))
                for (server, replies), counts in zip(by_server.items(), sent, strict=True):
                    acked = [
                        self._acked(server, r.queue, r.cols.item_ids, n, ms)
                        for r, (n, ms) in zip(replies, counts, strict=True)
                    ]
                    if all(acked):
                        self._clear({k for k in dropped if k[0] == server})
                        if dropped:
                            failpoint("drop.acked")
                    failpoint("fetch.acked")
                got += sum(b.num_rows for b in staged)
                if not full:
                    drained = True
                    break
                if self.clock() >= deadline:
                    break
        except Exception:
            # Not finished: the staged rounds stay a .tmp, recovered (re-acked, their items
            # made suspects) before the next fetch.
            writer.abandon()
            self._recovered = False
            raise
        writer.finish()
        self.metrics.staged += got
        self.metrics.fetches += 1
        self.metrics.last_fetch_ms = round((self.clock() - started) * 1000, 1)
        return pos + got, drained

    def _round(self, ask: int, wait: float | None) -> tuple[list[LeaseReply], bool]:
        """One round: every available server at once (a thread each, so one server's reply is
        parsed while the other prepares its own), each leasing up to ``ask`` items over its
        queues, ``leaseBatch`` per lease, starting one queue further each round so that none
        is starved when ``ask`` is small; (the replies, whether any lease filled its request).
        Only a server's first lease may wait."""
        started = self.clock()
        self._turn += 1
        servers = [a for a in self.clients if self._queues.get(a)]
        replies = self._each_server(lambda a: self._lease_on(a, ask, wait), servers)
        leased = [r for got, _ in replies if got is not None for r in got]
        full = any(filled for _, filled in replies)
        self.metrics.lease_ms += (self.clock() - started) * 1000
        self.metrics.leased += sum(len(r.cols) for r in leased)
        self._health(sum(got is not None for got, _ in replies) + (not servers))
        return leased, full

    def _each_server(self, work: Callable[[str], T], servers: list[str]) -> list[T]:
        """``work`` for each server, in its order: a thread each when there are several, so
        that the servers work at the same time and one reply is parsed while the others are
        prepared. ``work`` must change no state of the fetcher (it runs off the query's
        thread); its results are applied afterwards, on the caller's thread."""
        if len(servers) <= 1:
            return [work(a) for a in servers]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(len(self.clients), "tercel-fetch")
        return list(self._pool.map(work, servers))

    def _lease_on(
        self, address: str, ask: int, wait: float | None
    ) -> tuple[list[LeaseReply] | None, bool]:
        """Leases on one server: (replies, or None when it failed; whether one filled)."""
        queues = self._queues[address]
        got: list[LeaseReply] = []
        n_got = 0
        for k in range(len(queues)):
            n = min(self.opts.lease_batch, ask - n_got)
            if n <= 0:
                return got, True
            queue = queues[(self._turn + k) % len(queues)]
            try:
                _, cols = self.clients[address].lease_columns(
                    queue, n, wait, self.opts.lease_ms / 1000
                )
            except ClientError as exc:
                log.warning("tercel source: %s skipped this round: %s", address, exc)
                return (got or None), False
            wait = None
            if len(cols):
                got.append(LeaseReply(address, queue, cols))
                n_got += len(cols)
            if len(cols) >= n:
                return got, True
        return got, False

    def resolve_queues(self) -> None:
        """The queues to read on each server: the named ones, or those matching
        ``queuePattern`` now (one ``dump_stats`` per server)."""
        if self.opts.queue_pattern is None:
            self._queues = {a: list(self.opts.queues) for a in self.clients}
            return
        for address, client in self.clients.items():
            try:
                names = client.queue_stats().get(address, {})
            except ClientError as exc:
                log.warning("tercel source: no queue list from %s: %s", address, exc)
                continue
            self._queues[address] = sorted(q for q in names if self.opts.matches(q))

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

    def _split(self, reply: LeaseReply, batch: pa.RecordBatch) -> tuple[pa.RecordBatch, set[Key]]:
        """(the rows of ``batch``, ``reply`` staged, to stage; keys of redelivered suspects
        among them, to ack and drop: they were already staged)."""
        if not self.suspects:
            return batch, set()
        cols = reply.cols
        dropped: set[Key] = set()
        keep = [True] * len(cols)
        for k, deliveries in enumerate(cols.deliveries):
            if deliveries <= 1:
                continue  # never handed out before: not a redelivery
            key = (reply.server, reply.queue, cols.item_ids[k])
            if key in self.suspects:
                dropped.add(key)
                keep[k] = False
        if not dropped:
            return batch, dropped
        self.metrics.dropped += len(dropped)
        return batch.filter(pa.array(keep)), dropped

    def ack(
        self, server: str, queue: str, lease_ids: Sequence[str], item_ids: Sequence[int]
    ) -> bool:
        """Ack staged (or dropped) items of ``queue``; whether every one was acked
        (:meth:`_send_ack`, then :meth:`_acked`)."""
        acked, ms = self._send_ack(server, queue, lease_ids)
        return self._acked(server, queue, item_ids, acked, ms)

    def _send_ack(self, server: str, queue: str, lease_ids: Sequence[str]) -> tuple[int, float]:
        """``ack`` on ``server``; (how many it acked, -1 when it could not be reached; the
        milliseconds it took). Changes nothing: safe on any thread (:meth:`_each_server`)."""
        started = self.clock()
        try:
            acked = self.clients[server].ack_ids(server, queue, lease_ids)
        except ClientError as exc:
            log.warning(
                "tercel source: ack of %d item(s) on %s failed: %s", len(lease_ids), server, exc
            )
            acked = -1
        return acked, (self.clock() - started) * 1000

    def _send_acks(
        self, by_server: dict[str, list[LeaseReply]], server: str
    ) -> list[tuple[int, float]]:
        """:meth:`_send_ack` for each reply of ``server`` (thread-safe, like it)."""
        return [self._send_ack(server, r.queue, r.cols.lease_ids) for r in by_server[server]]

    def _acked(
        self, server: str, queue: str, item_ids: Sequence[int], acked: int, ms: float
    ) -> bool:
        """Apply the outcome of :meth:`_send_ack` for ``item_ids``; whether every one was
        acked. Otherwise they may come back (the server could not be reached, or some leases
        ran out first: ``ACKED`` counts fewer, and which ones the reply does not say), so all
        become suspects."""
        if acked >= 0:
            self.metrics.acked += acked
            self.metrics.ack_ms += ms
        if acked >= len(item_ids):
            return True
        if acked >= 0:
            log.warning(
                "tercel source: %d of %d lease(s) on %s ran out before the ack",
                len(item_ids) - acked,
                len(item_ids),
                server,
            )
        self._suspect({(server, queue, i) for i in item_ids})
        return False

    def _maybe_pause(self) -> None:
        marker = self.opts.test_pause_after_stage
        if marker is None or self._paused:
            return
        self._paused = True
        with open(marker, "w") as f:
            f.write(str(os.getpid()))
        while True:  # the crash test kills this process here, between fsync and ack
            time.sleep(1)

    # ---- queue depth ------------------------------------------------------------------

    def _connect(self) -> dict[str, Client]:
        opts = self.opts
        return {
            s: Client(
                s,
                timeout=opts.socket_timeout_ms / 1000,
                connect_timeout=opts.connect_timeout_ms / 1000,
                retry_after=opts.server_retry_ms / 1000,
                max_retry_after=max(opts.server_retry_ms / 1000, 10.0),
                pool_size=2,
                tls=opts.tls,
                **login_kwargs(opts.user, opts.password),
            )
            for s in opts.servers
        }

    def queue_depth(self) -> dict[str, dict[str, int]]:
        """Items waiting in the queues read, per reachable server (``dump_stats``). Safe to
        call while a fetch runs in another thread."""
        if self._stats_clients is None:
            self._stats_clients = self._connect()
        depth: dict[str, dict[str, int]] = {}
        for address, client in self._stats_clients.items():
            try:
                stats = client.queue_stats().get(address, {})
            except ClientError as exc:
                log.warning("tercel source: no stats from %s: %s", address, exc)
                continue
            depth[address] = {
                q: int(v.get("items", "0"))
                for q, v in sorted(stats.items())
                if self.opts.matches(q)
            }
        return depth

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        for client in [*self.clients.values(), *(self._stats_clients or {}).values()]:
            client.close()
