"""The staging log and the fetcher without Spark: segments, torn tails, slices, data loss,
recovery with re-ack, and dropping redelivered items (real server, no JVM)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from tercel.client import Client
from tercel.protocol.memcache_client import LeaseColumns
from tercel.spark.fetch import AllServersDown, Fetcher, LeaseReply, to_batch
from tercel.spark.options import JournalOptions, SinkOptions, SourceOptions
from tercel.spark.staging import (
    OUTPUT_SCHEMA,
    DataLoss,
    SegmentWriter,
    StagingLog,
    read_slice,
)
from tercel.testing import ServerProcess


def items(n: int, start: int = 0, server: str = "s:1") -> LeaseReply:
    """A lease reply of ``n`` items ``v<start>``... (as the client codec builds one)."""
    cols = LeaseColumns()
    for i in range(start, start + n):
        cols.lease_ids.append(f"L-{i}")
        cols.item_ids.append(i + 1)
        cols.deliveries.append(1)
        cols.add_ms.append(1500)
        cols.expiry_ms.append(0)
        cols.data += b"v%d" % i
        cols.offsets.append(len(cols.data))
    return LeaseReply(server, "q", cols)


def stage(log: StagingLog, start: int, *rounds: int) -> int:
    writer = SegmentWriter(log.root, start)
    pos = start
    for n in rounds:
        writer.append(to_batch(items(n, pos), time.time()))
        pos += n
    writer.finish()
    return pos


def values(log: StagingLog, start: int, end: int, rows: int) -> list[list[bytes]]:
    out = []
    for pieces in log.slices(start, end, rows, fail_on_loss=True):
        got: list[bytes] = []
        for batch in read_slice(pieces):
            assert batch.schema == OUTPUT_SCHEMA
            seqs = batch.column("seq").to_pylist()
            vals = batch.column("value").to_pylist()
            assert vals == [b"v%d" % s for s in seqs]  # seq is the staging position
            got += vals
        out.append(got)
    return out


def test_segments_slice_by_rows_across_files(tmp_path: Path) -> None:
    log = StagingLog(str(tmp_path))
    log.ensure()
    assert stage(log, 0, 3, 4) == 7
    assert stage(log, 7, 5) == 12
    assert [(s.start, s.end) for s in log.segments()] == [(0, 7), (7, 12)]
    assert log.end_from(0) == 12 and log.end_from(9) == 12 and log.end_from(12) == 12
    sliced = values(log, 2, 12, rows=4)
    assert [len(s) for s in sliced] == [4, 4, 2]
    assert [v for s in sliced for v in s] == [b"v%d" % i for i in range(2, 12)]


def test_gc_keeps_segments_still_needed(tmp_path: Path) -> None:
    log = StagingLog(str(tmp_path))
    log.ensure()
    stage(log, 0, 5)
    stage(log, 5, 5)
    assert log.gc(4) == 0
    assert log.gc(5) == 1
    assert log.lowest_start() == 5
    with pytest.raises(DataLoss):
        log.slices(0, 10, 100, fail_on_loss=True)
    assert [[(p.lo, p.hi) for p in s] for s in log.slices(0, 10, 100, False)] == [[(5, 10)]]


def test_torn_tmp_segment_is_recovered_up_to_its_last_complete_round(tmp_path: Path) -> None:
    log = StagingLog(str(tmp_path))
    log.ensure()
    writer = SegmentWriter(log.root, 0)
    writer.append(to_batch(items(3), time.time()))
    writer.append(to_batch(items(2, 3), time.time()))
    before = os.path.getsize(writer.path)
    writer.append(to_batch(items(4, 5), time.time()))
    after = os.path.getsize(writer.path)
    writer.abandon()
    # a crash in the middle of the third round: only half of its bytes reached the disk
    os.truncate(writer.path, before + (after - before) // 2)
    assert log.lowest_start() == 0
    rounds: list[int] = []
    assert log.recover(lambda batches: rounds.extend(b.num_rows for b in batches)) == 5
    assert rounds == [3, 2]
    assert [(s.start, s.end) for s in log.segments()] == [(0, 5)]
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    assert values(log, 0, 5, 10) == [[b"v%d" % i for i in range(5)]]


def opts(servers: list[str], staging: Path, **kw: object) -> SourceOptions:
    base = {"servers": ",".join(servers), "stagingLocation": str(staging)}
    base.update({k: str(v) for k, v in kw.items()})
    if "queues" not in base:
        base["queue"] = "q"
    return SourceOptions.parse(base)


def test_fetch_stages_then_acks(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "d") as srv, Client(srv.address) as c:
        c.put_many("q", [b"x%d" % i for i in range(250)])
        log = StagingLog(str(tmp_path / "stage"))
        log.ensure()
        f = Fetcher(opts([srv.address], tmp_path / "stage", leaseBatch=100), log)
        end, drained = f.fetch(0, 1000, wait_first=False)
        assert (end, drained) == (250, True)
        f.close()
        srv.kill()  # leases that were not acked would come back at the restart
        srv.start()
        with Client(srv.address) as c2:
            assert c2.queue_stats()[srv.address]["q"]["items"] == "0"
        got = [v for p in log.slices(0, end, 1000, True) for b in read_slice(p) for v in b["value"]]
        assert [v.as_py() for v in got] == [b"x%d" % i for i in range(250)]


def test_crash_between_fsync_and_ack_loses_nothing_and_duplicates_nothing(
    tmp_path: Path,
) -> None:
    """The driver dies after staging a round and before acking it; its leases expire and the
    items come back. Recovery finishes the segment, and the redelivered items are dropped."""
    with ServerProcess(tmp_path / "d") as srv, Client(srv.address) as c:
        c.put_many("q", [b"x%d" % i for i in range(30)])
        log = StagingLog(str(tmp_path / "stage"))
        log.ensure()
        _, leased = c.lease_columns("q", 20, None, lease_time=0.2)
        writer = SegmentWriter(log.root, 0)
        reply = LeaseReply(srv.address, "q", leased)
        writer.append(to_batch(reply, time.time()))  # staged, fsynced ... and then the crash
        writer.abandon()
        time.sleep(0.5)  # the leases expire: the items are back at the head
        f = Fetcher(opts([srv.address], tmp_path / "stage", leaseBatch=7), log)
        assert f.recover() == 20
        end, _ = f.fetch(log.end_from(0), 1000, wait_first=False)
        assert end == 30 and f.metrics.dropped == 20
        got = [v for p in log.slices(0, end, 1000, True) for b in read_slice(p) for v in b["value"]]
        assert sorted(v.as_py() for v in got) == sorted(b"x%d" % i for i in range(30))
        f.close()


def test_leases_that_ran_out_before_the_ack_are_not_staged_twice(tmp_path: Path) -> None:
    """``ack`` answers ``ACKED n`` with n below the count when leases ran out first (a slow
    round on another server): those items come back, and must be dropped, not staged again."""
    with ServerProcess(tmp_path / "d") as srv, Client(srv.address) as c:
        c.put_many("q", [b"x%d" % i for i in range(5)])
        log = StagingLog(str(tmp_path / "stage"))
        log.ensure()
        f = Fetcher(opts([srv.address], tmp_path / "stage", leaseBatch=10), log)
        _, leased = c.lease_columns("q", 5, None, lease_time=0.2)
        writer = SegmentWriter(log.root, 0)
        writer.append(to_batch(LeaseReply(srv.address, "q", leased), time.time()))  # staged ...
        writer.finish()
        time.sleep(0.5)  # ... and the leases ran out before the ack
        # ACKED 0: no error, but nothing was acked
        assert not f.ack(srv.address, "q", leased.lease_ids, leased.item_ids)
        end, _ = f.fetch(log.end_from(0), 1000, wait_first=False)
        assert end == 5 and f.metrics.dropped == 5  # the redelivered items were not staged again
        f.close()


def test_fetch_skips_a_dead_server_and_fails_only_after_max_unavailable(
    tmp_path: Path,
) -> None:
    with ServerProcess(tmp_path / "d") as srv, Client(srv.address) as c:
        c.put_many("q", [b"x"] * 5)
        dead = "127.0.0.1:1"
        log = StagingLog(str(tmp_path / "stage"))
        log.ensure()
        o = opts([dead, srv.address], tmp_path / "stage", maxUnavailableMs=200)
        f = Fetcher(o, log)
        assert f.fetch(0, 100, wait_first=False)[0] == 5
        srv.kill()
        f.fetch(5, 100, wait_first=False)  # everything down: tolerated for now
        time.sleep(0.3)
        with pytest.raises(AllServersDown):
            f.fetch(5, 100, wait_first=False)
        f.close()


def test_a_truncated_finished_segment_is_data_loss(tmp_path: Path) -> None:
    """A finished segment was fsynced whole before its rename: reading it short is loss."""
    log = StagingLog(str(tmp_path))
    log.ensure()
    stage(log, 0, 4, 4)
    (seg,) = log.segments()
    os.truncate(seg.path, os.path.getsize(seg.path) - 20)  # the tail of the second round
    with pytest.raises(DataLoss, match="damaged"):
        values(log, 0, 8, 100)
    os.truncate(seg.path, os.path.getsize(seg.path) // 2)
    with pytest.raises(DataLoss):
        values(log, 0, 8, 100)
    (lenient,) = log.slices(0, 8, 100, fail_on_loss=False)
    got = [v for b in read_slice(lenient, fail_on_loss=False) for v in b["value"].to_pylist()]
    assert got == [b"v%d" % i for i in range(len(got))] and len(got) < 8


def test_unknown_or_misspelt_options_name_the_closest_valid_one(tmp_path: Path) -> None:
    base = {"servers": "h:1", "queue": "q", "stagingLocation": str(tmp_path)}
    with pytest.raises(ValueError, match="'maxitempertrigger'; did you mean 'maxItemsPerTrigger'"):
        SourceOptions.parse({**base, "maxItemPerTrigger": "7"})
    with pytest.raises(ValueError, match="unknown option 'colour'"):
        SinkOptions.parse({"servers": "h:1", "colour": "red"})
    with pytest.raises(ValueError, match="did you mean 'includePayload'"):
        JournalOptions.parse({"path": "/x", "includepayloads": "false"})
    with pytest.raises(ValueError, match="exactly one of"):
        SourceOptions.parse({**base, "queues": "a,b"})
    assert SourceOptions.parse({**base, "path": "ignored"}).queues == ("q",)
    o = SourceOptions.parse({"servers": "h:1", "queues": "a, b", "checkpointLocation": "/ck/"})
    assert o.queues == ("a", "b") and o.staging == "/ck/tercel-staging"
    with pytest.raises(ValueError, match="stagingLocation"):
        SourceOptions.parse({"servers": "h:1", "queue": "q"})
    assert SinkOptions.parse({"servers": "h:1"}).batch_size == 5000


def test_a_staging_directory_is_bound_to_its_query(tmp_path: Path) -> None:
    log = StagingLog(str(tmp_path))
    log.ensure()
    a = opts(["h:1"], tmp_path, queues="a,b")
    log.bind(a.identity(), None)
    log.bind(a.identity(), "/ck1")  # the checkpoint becomes known: recorded
    log.bind(opts(["h:2", "h:1"], tmp_path, queues="b,a").identity(), None)  # servers may change
    with pytest.raises(ValueError, match=r"belongs to another query.*queues"):
        log.bind(opts(["h:1"], tmp_path, queues="c").identity(), None)
    with pytest.raises(ValueError, match="checkpoint"):
        log.bind(a.identity(), "/ck2")


def test_several_queues_by_pattern_with_queue_and_expiry_columns(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "d") as srv, Client(srv.address) as c:
        c.put_many("ev_a", [b"a%d" % i for i in range(5)])
        c.put_many("ev_b", [b"b%d" % i for i in range(4)], expiry=3600)
        c.put_many("other", [b"o"])
        log = StagingLog(str(tmp_path / "stage"))
        log.ensure()
        o = SourceOptions.parse(
            {
                "servers": srv.address,
                "queuePattern": "ev_.*",
                "stagingLocation": str(log.root),
                "leaseBatch": "3",
            }
        )
        f = Fetcher(o, log)
        assert f.queue_depth() == {srv.address: {"ev_a": 5, "ev_b": 4}}
        end, drained = f.fetch(0, 100, wait_first=False)
        assert (end, drained) == (9, True)
        rows = [
            r for p in log.slices(0, end, 100, True) for b in read_slice(p) for r in b.to_pylist()
        ]
        assert sorted(r["value"] for r in rows) == sorted(
            [b"a%d" % i for i in range(5)] + [b"b%d" % i for i in range(4)]
        )
        assert {r["queue"] for r in rows} == {"ev_a", "ev_b"}
        for r in rows:
            assert (r["expiry"] is None) == (r["queue"] == "ev_a")
        assert f.queue_depth() == {srv.address: {"ev_a": 0, "ev_b": 0}}
        report = f.metrics.report(len(f.suspects))
        assert report["leased"] == report["staged"] == report["acked"] == 9
        f.close()


def test_batches_are_cut_into_spark_default_parallelism_slices(tmp_path: Path) -> None:
    from tercel.spark.source import TercelStreamReader

    log = StagingLog(str(tmp_path))
    log.ensure()
    stage(log, 0, 6000, 4000)
    reader = TercelStreamReader(opts(["127.0.0.1:1"], tmp_path), parallelism=3)
    parts = reader.partitions({"seq": 0}, {"seq": 10_000})
    assert [sum(p.hi - p.lo for p in part.pieces) for part in parts] == [3334, 3334, 3332]
    assert len(reader.partitions({"seq": 0}, {"seq": 1900})) == 2  # at least 1000 rows each
    fixed = TercelStreamReader(opts(["127.0.0.1:1"], tmp_path, itemsPerPartition=4000), 3)
    assert len(fixed.partitions({"seq": 0}, {"seq": 10_000})) == 3
    assert isinstance(reader.getDefaultReadLimit(), ReadAllAvailable)
