"""The keyed leases' records (format 4: KEY_TAKE, KEY_LIVE, KEY_END, KEY_RENEW) byte for byte,
their checks, a round trip through MemoryJournal and FileJournal, and a version-3 data dir
opened by this version (docs/journal_format.md §15, §18)."""

from __future__ import annotations

from pathlib import Path

import pytest
from recorder import Recorder

from tercel.clock import ManualClock
from tercel.config import QueueConfig
from tercel.core.queue import PersistentQueue
from tercel.journal import FileJournal, MemoryJournal
from tercel.journal import records as rec

T0 = 1_700_000_000_000


def take(buf: bytearray, *, live: bool = False) -> None:
    rec.encode_key_take(
        buf,
        "b.1",
        n=1,
        count=2,
        size=16,
        max_items=2,
        created_at=T0,
        expires_at=T0 + 86_400_000,
        live=live,
    )


def test_the_records_byte_for_byte_as_documented() -> None:
    buf = bytearray()
    take(buf)
    assert buf.hex(" ") == (
        "34 00 00 00 5b 65 73 89 0b 01 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00 "
        "10 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00 00 68 e5 cf 8b 01 00 00 "
        "00 c4 0b d5 8b 01 00 00 62 2e 31"
    )
    buf = bytearray()
    rec.encode_key_end(buf, "b.1", rec.KEY_ACKED)
    assert buf.hex(" ") == "05 00 00 00 91 42 84 97 0d 01 62 2e 31"
    buf = bytearray()
    rec.encode_key_renew(buf, "b.1", 1_700_090_000_000)
    assert buf.hex(" ") == "0c 00 00 00 e6 53 58 81 0e 80 b2 42 d5 8b 01 00 00 62 2e 31"


def test_every_record_replays_into_its_sink_call() -> None:
    buf = bytearray(rec.FILE_HEADER)
    take(buf)
    take(buf, live=True)
    rec.encode_key_end(buf, "b.1", rec.KEY_RELEASED)
    rec.encode_key_renew(buf, "b.1", 5)
    sink = Recorder()
    for pos, stop in rec.iter_records(buf, rec.HEADER_SIZE):
        rec.apply_record(buf, pos, stop, sink)
        assert rec.describe_record(buf, pos, stop)["key"] == "b.1"
    fields = ("b.1", 1, 2, 16, 2, T0, T0 + 86_400_000)
    assert sink.events == [
        ("key_take", *fields, True),
        ("key_take", *fields, False),
        ("key_end", "b.1", rec.KEY_RELEASED),
        ("key_renew", "b.1", 5),
    ]


@pytest.mark.parametrize("key_bytes", [0, 201])
def test_a_key_record_of_the_wrong_length_is_bad(key_bytes: int) -> None:
    body = bytes([rec.OP_KEY_END, 1]) + b"k" * key_bytes
    buf = rec.PREFIX.pack(len(body), rec.crc32(body)) + body
    with pytest.raises(rec.BadRecord, match="wrong length"):
        rec.check_record(buf, 0)


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_round_trip_through_both_journals(kind: str, tmp_path: Path) -> None:
    memory = MemoryJournal()

    def build() -> PersistentQueue:
        log = memory if kind == "memory" else FileJournal(str(tmp_path), "q")
        q = PersistentQueue("q", QueueConfig(), log, ManualClock(T0))
        q.replay()
        return q

    q = build()
    for i in range(6):
        q.add(b"%d" % i, now=T0)
    q.take_keyed("a", 2, 0, T0)
    q.take_keyed("b", 2, 0, T0)
    q.renew_keyed("a", 10, T0)
    q.release_keyed("b")
    q.close()
    sink = Recorder()
    log = memory if kind == "memory" else FileJournal(str(tmp_path), "q")
    log.replay(sink)
    log.close()
    keyed = [e for e in sink.events if str(e[0]).startswith("key_")]
    assert keyed == [
        ("key_take", "a", 1, 2, 2, 2, T0, T0 + 86_400_000, True),
        ("key_take", "b", 2, 2, 2, 2, T0, T0 + 86_400_000, True),
        ("key_renew", "a", T0 + 10),
        ("key_end", "b", rec.KEY_RELEASED),
    ]
    q = build()
    assert q.keyed("a") is not None and q.keyed_figures() == (1, 2, T0)
    q.close()


def test_a_version_3_data_dir_opens_and_takes_keyed_leases(tmp_path: Path) -> None:
    old = bytearray(rec.file_header(3))
    for i in range(1, 5):
        rec.encode_add(old, i, T0, 0, b"v3-%d" % i)
    rec.encode_xid(old, rec.OP_OPEN, 1)
    rec.encode_xid(old, rec.OP_RETURN, 1)
    (tmp_path / "q").write_bytes(bytes(old))
    q = PersistentQueue("q", QueueConfig(), FileJournal(str(tmp_path), "q"), ManualClock(T0))
    q.replay()
    assert (tmp_path / "q.1").read_bytes() == bytes(old)  # read, never appended to
    assert (tmp_path / "q").read_bytes()[:8] == rec.FILE_HEADER
    lease = q.take_keyed("k", 3, 0, T0)
    assert lease is not None and lease.count == 3
    q.close()
    q = PersistentQueue("q", QueueConfig(), FileJournal(str(tmp_path), "q"), ManualClock(T0))
    q.replay()
    part = q.keyed_slice("k", 0, 3)
    assert list(part.item_ids) == [1, 2, 3] and list(part.deliveries) == [2, 1, 1]
    assert bytes(part.data) == b"v3-1v3-2v3-3"
    q.close()
