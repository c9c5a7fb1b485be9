"""Chunked reading: ChunkReader, read_adds (the read-behind hot loop) and AddReader."""

from __future__ import annotations

import random
from pathlib import Path
from zlib import crc32

import pytest
from recorder import Recorder

from tercel.journal import FileJournal
from tercel.journal import reader as rmod
from tercel.journal import records as rec

Item = tuple[int, int, int, bytes]


def add(item_id: int, data: bytes) -> bytes:
    buf = bytearray()
    rec.encode_add(buf, item_id, 1000 + item_id, 7 * item_id, data)
    return bytes(buf)


def item(item_id: int, data: bytes) -> Item:
    return (item_id, 1000 + item_id, 7 * item_id, data)


def xid_record(op: int, xid: int) -> bytes:
    buf = bytearray()
    rec.encode_xid(buf, op, xid)
    return bytes(buf)


def test_read_adds_skips_ordinary_records_and_stops_after_the_budget() -> None:
    buf = b"".join(
        [
            add(1, b"a" * 10),
            rec.REMOVE_RECORD,
            xid_record(rec.OP_OPEN, 3),
            add(2, b"b" * 10),
            add(3, b"c" * 10),
            add(4, b""),
        ]
    )
    out: list[Item] = []
    pos, got = rmod.read_adds(buf, 0, 15, out)
    assert out == [item(1, b"a" * 10), item(2, b"b" * 10)]
    assert got == 20
    assert pos == buf.index(add(3, b"c" * 10))
    assert all(type(data) is bytes for *_, data in out)
    pos, got = rmod.read_adds(buf, pos, 0, out)  # at least one, whatever the budget
    assert out[2:] == [item(3, b"c" * 10)]
    assert (pos, got) == (len(buf) - len(add(4, b"")), 10)
    assert rmod.read_adds(buf, pos, 100, out) == (len(buf), 0)
    assert out[3:] == [item(4, b"")]


@pytest.mark.parametrize("where", ["resume", "bad crc", "cut", "bad length", "unknown op"])
def test_read_adds_leaves_anything_unusual_to_a_careful_reader(where: str) -> None:
    first = add(1, b"one")
    resume = bytearray()
    rec.encode_resume(resume, (1, 8), (2, 8))
    odd = {
        "resume": bytes(resume),
        "bad crc": add(2, b"two")[:-1] + b"X",
        "cut": add(2, b"two")[:-1],
        "bad length": rec.PREFIX.pack(2, crc32(b"\x02\x00")) + b"\x02\x00",
        "unknown op": rec.PREFIX.pack(1, crc32(b"\x63")) + b"\x63",
    }[where]
    buf = first + odd + add(3, b"three")
    out: list[Item] = []
    assert rmod.read_adds(buf, 0, 1 << 20, out) == (len(first), 3)
    assert out == [item(1, b"one")]
    assert rmod.read_adds(buf, len(first), 1 << 20, out) == (len(first), 0)


def test_chunk_reader_reads_records_cut_by_chunk_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rmod, "CHUNK", 50)
    rng = random.Random(7)
    records = [
        add(i, bytes(rng.randrange(256) for _ in range(rng.choice([0, 5, 60, 200]))))
        for i in range(1, 60)
    ]
    records.insert(10, rec.REMOVE_RECORD)
    path = tmp_path / "f"
    path.write_bytes(rec.FILE_HEADER + b"".join(records))
    reader = rmod.ChunkReader(str(path), rec.HEADER_SIZE)
    got = []
    while (span := reader.next()) is not None:
        got.append(bytes(reader.buffer[span[0] : span[1]]))
    reader.close()
    assert got == records


@pytest.mark.parametrize("chunk", [40, 333, 1 << 20])
@pytest.mark.parametrize("budget", [1, 100, 5000])
def test_add_reader_gives_every_item_once_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int, budget: int
) -> None:
    monkeypatch.setattr(rmod, "CHUNK", chunk)
    rng = random.Random(chunk + budget)
    j = FileJournal(str(tmp_path), "q")
    j.replay(Recorder())
    start = j.position()
    expected: list[Item] = []
    for i in range(1, 400):
        data = bytes([i % 256]) * rng.choice([0, 1, 30, 300, 1500])
        j.add(i, 1000 + i, 7 * i, data)
        expected.append(item(i, data))
        if i % 7 == 0:
            j.remove()
        if i % 11 == 0:
            j.open_read(i)
            j.confirm(i)
        if i % 150 == 0:
            assert j.rotate()
    reader = j.reader(start)
    got: list[Item] = []
    while batch := reader.next_adds(budget):
        assert sum(len(b[3]) for b in batch[:-1]) < budget
        got += batch
    reader.close()
    j.close()
    assert got == expected


def test_read_adds_walks_short_records_at_the_end_of_the_buffer() -> None:
    tail = rec.REMOVE_RECORD + xid_record(rec.OP_CONFIRM, 4)  # 22 bytes: shorter than an ADD
    buf = add(1, b"x") + tail
    out: list[Item] = []
    assert rmod.read_adds(buf, 0, 100, out) == (len(buf), 1)
    assert rmod.read_adds(buf[:-1], 0, 100, out) == (len(buf) - 13, 1)  # a cut CONFIRM
    assert rmod.read_adds(tail, 0, 100, out) == (len(tail), 0)
    assert out == [item(1, b"x")] * 2
