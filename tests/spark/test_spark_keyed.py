"""The streaming source on keyed leases without a JVM: the reader's methods called the way
Spark's micro-batch engine calls them (``latestOffset``, ``partitions``, ``read`` on pickled
copies, ``commit`` one batch late), against real servers. Options, offsets, fail points."""

from __future__ import annotations

import pickle
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from tercel.client import Client
from tercel.spark import failpoints
from tercel.spark.fetch import OUTPUT_SCHEMA, LeaseEnded, Slice
from tercel.spark.offsets import OldCheckpoint, split
from tercel.spark.options import SourceOptions
from tercel.spark.source import TercelStreamReader
from tercel.testing import ServerProcess


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    with (
        ServerProcess(tmp_path_factory.mktemp("k1")) as a,
        ServerProcess(tmp_path_factory.mktemp("k2")) as b,
    ):
        yield [a, b]


_readers: list[TercelStreamReader] = []


@pytest.fixture(autouse=True)
def stop_readers() -> Iterator[None]:
    """Each driver-side reader a test made is stopped after it (its connections closed)."""
    yield
    while _readers:
        _readers.pop().stop()


def reader(addresses: list[str], parallelism: int = 2, **opts: object) -> TercelStreamReader:
    given = {"servers": ",".join(addresses), **{k: str(v) for k, v in opts.items()}}
    made = TercelStreamReader(SourceOptions.parse(given), parallelism)
    _readers.append(made)
    return made


def produce(server: ServerProcess, queue: str, n: int, size: int = 0) -> list[bytes]:
    items = [f"{queue}/{server.port}/{i}/".encode().ljust(size, b"x") for i in range(n)]
    with Client(server.address) as c:
        c.put_many(queue, items)
    return items


def read_batch(source: TercelStreamReader, start: dict[str, Any], end: dict[str, Any]) -> pa.Table:
    """``partitions`` on the driver, ``read`` on pickled copies (as executors get them)."""
    executor = pickle.loads(pickle.dumps(source))
    batches: list[pa.RecordBatch] = []
    for part in source.partitions(start, end):
        batches += executor.read(pickle.loads(pickle.dumps(part)))
    assert all(b.schema == OUTPUT_SCHEMA for b in batches)
    return pa.Table.from_batches(batches, OUTPUT_SCHEMA)


def run(
    source: TercelStreamReader, start: dict[str, Any], batches: int = 1000
) -> tuple[dict[str, Any], list[pa.Table]]:
    """Spark's loop: plan, log, (commit the previous batch), read; until nothing is new."""
    out = []
    for _ in range(batches):
        end = source.latestOffset(start, source.getDefaultReadLimit())
        if end == start:
            break
        source.commit(start)
        out.append(read_batch(source, start, end))
        start = end
    return start, out


def queued(server: ServerProcess, queue: str) -> int:
    with Client(server.address) as c:
        return int(c.queue_stats()[server.address].get(queue, {}).get("items", "0"))


def values(tables: list[pa.Table]) -> list[bytes]:
    return [v for t in tables for v in t.column("value").to_pylist()]


def test_options_name_the_closest_valid_one_and_removed_ones_say_why() -> None:
    with pytest.raises(ValueError, match="did you mean 'maxItemsPerTrigger'"):
        SourceOptions.parse({"servers": "h:1", "queue": "q", "maxItemPerTrigger": "5"})
    with pytest.raises(ValueError, match="'stagingLocation' no longer exists"):
        SourceOptions.parse({"servers": "h:1", "queue": "q", "stagingLocation": "/tmp/x"})
    with pytest.raises(ValueError, match="exactly one of"):
        SourceOptions.parse({"servers": "h:1", "queue": "q", "queuePattern": "q.*"})
    opts = SourceOptions.parse({"servers": "h:1,h:2", "queue": "q", "checkpointLocation": "/c"})
    assert opts.single_queue == "q" and opts.lease_ms is None


def test_an_old_checkpoint_is_refused_saying_how_to_proceed() -> None:
    source = reader(["127.0.0.1:1"], queue="q")
    old = {"seq": 1200}  # the staging design's offset
    for call in (
        lambda: source.latestOffset(old, ReadAllAvailable()),
        lambda: source.partitions({"seq": 1000}, old),
        lambda: source.commit(old),
    ):
        with pytest.raises(OldCheckpoint, match="drain it once with the release") as err:
            call()
        assert "new checkpointLocation" in str(err.value)


def test_the_limit_is_split_evenly_and_deterministically() -> None:
    assert split(10, 3, 0) == [4, 3, 3] and split(10, 3, 1) == [3, 4, 3]
    assert split(1, 2, 0) == [1, 0] and split(1, 2, 1) == [0, 1] and split(5, 0, 0) == []


def test_a_fail_point_armed_by_the_environment_ends_the_process_like_kill_9() -> None:
    code = (
        "from tercel.spark.failpoints import failpoint\n"
        "failpoint('source.read'); print('first', flush=True)\n"
        "failpoint('source.read'); print('second', flush=True)\n"
    )
    env = {"TERCEL_SPARK_FAILPOINT": "source.read:2", "PYTHONPATH": ":".join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True
    )
    assert done.returncode == failpoints.EXIT_CODE == 137
    assert done.stdout == "first\n"
    env["TERCEL_SPARK_FAILPOINT"] = "source.nowhere"
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True
    )
    assert done.returncode == 1 and "unknown fail point" in done.stderr
    assert set(failpoints.POINTS) >= {"source.planned", "sink.write", "sink.commit"}


def test_every_item_exactly_once_then_nothing(servers: list[ServerProcess], qname: str) -> None:
    a, b = servers
    produced = produce(a, qname, 25) + produce(b, qname, 7)
    source = reader([a.address, b.address], queue=qname, maxItemsPerTrigger=10, itemsPerPartition=3)
    start = source.initialOffset()
    assert source.initialOffset() == start  # Spark calls it twice
    source.prepareForTriggerAvailableNow()
    _, tables = run(source, start)
    got = values(tables)
    assert sorted(got) == sorted(produced) and len(got) == len(set(got))
    assert all(t.num_rows <= 10 for t in tables)
    seqs = [s for t in tables for s in t.column("seq").to_pylist()]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    rows = pa.concat_tables(tables).to_pylist()
    assert {r["server"] for r in rows} == {a.address, b.address}
    assert all(r["queue"] == qname and r["deliveries"] == 1 for r in rows)
    assert sorted(r["item_id"] for r in rows if r["server"] == b.address) == list(range(1, 8))
    assert all(r["fetched_at"] >= r["enqueued_at"] and r["expiry"] is None for r in rows)
    # the last batch is acked by the latestOffset that found nothing new
    assert queued(a, qname) == queued(b, qname) == 0
    again = reader([a.address, b.address], queue=qname)
    assert run(again, again.initialOffset())[1] == []
    with Client(a.address) as c:
        assert c.get(qname) is None
    report = source.reportLatestOffset()
    assert report["lag"] == 0 and report["metrics"]["items"] == 32
    assert report["metrics"]["unacked"] == 0


def test_a_restarted_driver_plans_the_same_batch(servers: list[ServerProcess], qname: str) -> None:
    a, b = servers
    produced = produce(a, qname, 30)
    addresses = [a.address, b.address]
    first = reader(addresses, queue=qname, maxItemsPerTrigger=20)
    start = first.initialOffset()
    planned = first.latestOffset(start, first.getDefaultReadLimit())
    produce(a, qname, 5)  # more items: the re-plan must not take them
    # the driver dies before Spark logs the offsets; the new one starts from the same start
    second = reader(addresses, queue=qname, maxItemsPerTrigger=20)
    assert second.latestOffset(start, second.getDefaultReadLimit()) == planned
    assert values([read_batch(second, start, planned)]) == produced[:10]


def test_a_logged_batch_replays_in_a_new_process_and_is_acked_after(
    servers: list[ServerProcess], qname: str
) -> None:
    a = servers[0]
    produced = produce(a, qname, 12)
    first = reader([a.address], queue=qname)
    start = first.initialOffset()
    end = first.latestOffset(start, ReadAllAvailable())
    assert values([read_batch(first, start, end)]) == produced
    # killed after Spark logged the offsets; the restarted query replays the batch
    second = reader([a.address], queue=qname)
    assert values([read_batch(second, start, end)]) == produced
    assert queued(a, qname) == 0  # still leased, not back in the queue
    assert second.latestOffset(end, ReadAllAvailable()) == end  # acks it, nothing new
    with pytest.raises(Exception, match="acked"):
        read_batch(reader([a.address], queue=qname), start, end)
    assert queued(a, qname) == 0


def test_a_lease_that_ran_out_fails_the_replay_loudly(
    servers: list[ServerProcess], qname: str
) -> None:
    a = servers[0]
    produce(a, qname, 4)
    source = reader([a.address], queue=qname, leaseMs=300)
    start = source.initialOffset()
    end = source.latestOffset(start, ReadAllAvailable())
    deadline = time.monotonic() + 30
    while queued(a, qname) < 4:  # the lease runs out: its items go back to the queue
        assert time.monotonic() < deadline, "the keyed lease never ran out"
        time.sleep(0.1)
    with pytest.raises(LeaseEnded, match="cannot be replayed"):
        reader([a.address], queue=qname).partitions(start, end)


def test_big_slices_are_read_in_chunks_of_bounded_size(
    servers: list[ServerProcess], qname: str
) -> None:
    a = servers[0]
    produced = produce(a, qname, 4000, size=10_000)
    source = reader([a.address], queue=qname, itemsPerPartition=4000)
    start = source.initialOffset()
    end = source.latestOffset(start, ReadAllAvailable())
    (part,) = source.partitions(start, end)
    assert isinstance(part, Slice) and (part.start, part.stop) == (0, 4000)
    sizes = [b.num_rows for b in pickle.loads(pickle.dumps(source)).read(part)]
    assert sizes[0] == 1000 and max(sizes) * 10_000 <= 17 << 20 and sum(sizes) == 4000
    source.commit(end)
    assert len(produced) == 4000 and queued(a, qname) == 0


def test_several_queues_by_pattern_with_queue_and_expiry_columns(
    servers: list[ServerProcess], qname: str
) -> None:
    a, b = servers
    with Client(a.address) as c:
        c.put_many(f"{qname}_x", [b"x1", b"x2"])
        c.put(f"{qname}_y", b"y1", expiry=3600)
    with Client(b.address) as c:
        c.put(f"{qname}_y", b"y2")
        c.put(f"other_{qname}", b"not read")
    source = reader([a.address, b.address], queuePattern=f"{qname}_.*")
    start = source.initialOffset()
    end = source.latestOffset(start, ReadAllAvailable())
    assert end["leases"] == {
        a.address: {f"{qname}_x": 2, f"{qname}_y": 1},
        b.address: {f"{qname}_y": 1},
    }
    rows = read_batch(source, start, end).to_pylist()
    assert {(r["queue"], r["value"]) for r in rows} == {
        (f"{qname}_x", b"x1"),
        (f"{qname}_x", b"x2"),
        (f"{qname}_y", b"y1"),
        (f"{qname}_y", b"y2"),
    }
    assert {r["value"]: r["expiry"] is not None for r in rows if r["value"][:1] == b"y"} == {
        b"y1": True,
        b"y2": False,
    }
    source.latestOffset(end, ReadAllAvailable())
    assert queued(a, f"{qname}_x") == queued(b, f"{qname}_y") == 0
    assert queued(b, f"other_{qname}") == 1


def test_batches_are_cut_into_default_parallelism_slices(
    servers: list[ServerProcess], qname: str
) -> None:
    a, b = servers
    produce(a, qname, 3000)
    produce(b, qname, 3000)
    source = reader([a.address, b.address], parallelism=4, queue=qname)
    start = source.initialOffset()
    end = source.latestOffset(start, ReadMaxRows(5000))
    parts = source.partitions(start, end)
    assert sorted((p.server, p.stop - p.start) for p in parts if isinstance(p, Slice)) == sorted(
        [(a.address, 1250), (a.address, 1250), (b.address, 1250), (b.address, 1250)]
    )
    source.latestOffset(end, ReadMaxRows(5000))


def test_available_now_stops_at_what_was_queued(servers: list[ServerProcess], qname: str) -> None:
    a = servers[0]
    produced = produce(a, qname, 25)
    source = reader([a.address], queue=qname, maxItemsPerTrigger=10)
    source.prepareForTriggerAvailableNow()
    start = source.initialOffset()
    end = source.latestOffset(start, source.getDefaultReadLimit())
    first = read_batch(source, start, end)
    produce(a, qname, 100)  # added after the start: the last two batches may take some
    _, tables = run(source, end)
    got = values([first, *tables])
    assert got[:25] == produced and len(got) <= 45


def test_an_ack_that_failed_is_retried_once_the_server_is_back(
    tmp_path_factory: pytest.TempPathFactory, qname: str
) -> None:
    with (
        ServerProcess(tmp_path_factory.mktemp("ka")) as a,
        ServerProcess(tmp_path_factory.mktemp("kb")) as b,
    ):
        produce(a, qname, 3)
        produce(b, qname, 3)
        source = reader([a.address, b.address], queue=qname, serverRetryMs=50)
        start = source.initialOffset()
        end = source.latestOffset(start, ReadAllAvailable())
        assert end["leases"] == {a.address: 3, b.address: 3}
        assert len(values([read_batch(source, start, end)])) == 6
        port = b.port
        b.kill()
        assert source.latestOffset(end, ReadAllAvailable()) == end  # b's ack failed
        assert source.reportLatestOffset()["metrics"]["unacked"] == 1
        b.extra_args = ("--memcache-port", str(port))  # the same address again
        b.start()  # the keyed lease survived the restart, still unacked
        deadline = time.monotonic() + 10
        while source.reportLatestOffset()["metrics"]["unacked"]:  # b is set aside a while
            assert time.monotonic() < deadline, "the ack was never retried"
            assert source.latestOffset(end, ReadAllAvailable()) == end
        assert queued(b, qname) == 0  # acked, not handed back
        with Client(b.address) as c:
            assert c.get(qname) is None
