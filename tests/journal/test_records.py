"""Journal records: the byte layout, encode -> check -> apply round trips, every bad record."""

from __future__ import annotations

import struct
from zlib import crc32

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from recorder import Event, Recorder

from tercel.journal import records as rec


def encode(events: list[Event]) -> bytearray:
    """The records of ``events`` (as a Recorder writes them down), without a file header."""
    buf = bytearray()
    for ev in events:
        match ev:
            case ("add", int(item_id), int(add_time), int(expiry), bytes(data)):
                rec.encode_add(buf, item_id, add_time, expiry, data)
            case ("remove",):
                buf += rec.REMOVE_RECORD
            case ("flush",):
                buf += rec.FLUSH_RECORD
            case ("open", int(xid)):
                rec.encode_xid(buf, rec.OP_OPEN, xid)
            case ("confirm", int(xid)):
                rec.encode_xid(buf, rec.OP_CONFIRM, xid)
            case ("abort", int(xid)):
                rec.encode_xid(buf, rec.OP_ABORT, xid)
            case ("return", int(xid)):
                rec.encode_xid(buf, rec.OP_RETURN, xid)
            case _:
                raise AssertionError(ev)
    return buf


def decode(buf: bytes | bytearray, pos: int = 0) -> list[Event]:
    sink = Recorder()
    for start, stop in rec.iter_records(buf, pos):
        rec.apply_record(buf, start, stop, sink)
    return sink.events


def raw(body: bytes) -> bytes:
    """A record around ``body`` with a correct length and checksum."""
    return struct.pack("<II", len(body), crc32(body)) + body


# ---- layout --------------------------------------------------------------------------------


def test_file_header() -> None:
    assert rec.FILE_HEADER == b"TRCL\x04\x00\x00\x00"
    assert rec.header_version(b"TRCL\x01\x00\x00\x00") == 1
    assert rec.header_version(b"TRCL\x03\x00\x00\x00") == 3
    assert rec.header_version(b"TRCL\x04\x00\x00\x00") == 4
    assert rec.header_version(b"TRCL\x05\x00\x00\x00") is None
    assert rec.HEADER_SIZE == 8


def test_add_layout() -> None:
    buf = bytearray()
    rec.encode_add(buf, 7, 1_700_000_000_000, 1_700_000_001_000, b"hello")
    fields = struct.pack("<BQqq", rec.OP_ADD, 7, 1_700_000_000_000, 1_700_000_001_000)
    body = fields + b"hello"
    assert bytes(buf) == struct.pack("<II", len(body), crc32(body)) + body
    assert rec.ADD_FIELDS_SIZE == 25


def test_simple_and_xid_layout() -> None:
    assert raw(b"\x02") == rec.REMOVE_RECORD
    assert raw(b"\x06") == rec.FLUSH_RECORD
    for op in (rec.OP_OPEN, rec.OP_CONFIRM, rec.OP_ABORT, rec.OP_RETURN):
        buf = bytearray()
        rec.encode_xid(buf, op, 0xDEADBEEF)
        assert bytes(buf) == raw(struct.pack("<BI", op, 0xDEADBEEF))


def test_encoders_append() -> None:
    buf = bytearray(b"prefix")
    rec.encode_xid(buf, rec.OP_OPEN, 1)
    rec.encode_add(buf, 1, 2, 3, b"")
    assert buf.startswith(b"prefix")
    assert decode(buf, 6) == [("open", 1), ("add", 1, 2, 3, b"")]


# ---- round trip ----------------------------------------------------------------------------

xids = st.integers(0, 2**32 - 1)
events = st.one_of(
    st.tuples(
        st.just("add"),
        st.integers(0, 2**64 - 1),
        st.integers(-(2**63), 2**63 - 1),
        st.integers(-(2**63), 2**63 - 1),
        st.binary(max_size=100),
    ),
    st.just(("remove",)),
    st.just(("flush",)),
    st.tuples(st.sampled_from(["open", "confirm", "abort", "return"]), xids),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(events, max_size=20))
def test_round_trip(evs: list[Event]) -> None:
    buf = encode(evs)
    assert decode(buf) == evs
    assert decode(memoryview(bytes(buf))) == evs


@settings(max_examples=200, deadline=None)
@given(st.lists(events, min_size=1, max_size=8), st.data())
def test_any_bit_flip_outside_the_length_is_detected(evs: list[Event], data: st.DataObject) -> None:
    buf = encode(evs)
    # Pick a record, then a bit in its checksum or body (CRC-32 catches every 1-bit error).
    bounds = list(rec.iter_records(buf, 0))
    start, stop = data.draw(st.sampled_from(bounds))
    byte = data.draw(st.integers(start + 4, stop - 1))
    buf[byte] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(rec.BadRecord) as info:
        decode(buf)
    assert info.value.offset == start
    assert not rec.looks_like_record(buf, start)


def test_describe_record() -> None:
    buf = encode([("add", 3, 10, 20, b"xy"), ("open", 9), ("remove",), ("flush",)])
    described = [rec.describe_record(buf, a, b) for a, b in rec.iter_records(buf, 0)]
    add_size = 8 + rec.ADD_FIELDS_SIZE + 2
    assert described == [
        {
            "offset": 0,
            "op": "ADD",
            "size": add_size,
            "item_id": 3,
            "add_time": 10,
            "expiry": 20,
            "data": b"xy",
        },
        {"offset": add_size, "op": "OPEN", "size": 13, "xid": 9},
        {"offset": add_size + 13, "op": "REMOVE", "size": 9},
        {"offset": add_size + 22, "op": "FLUSH", "size": 9},
    ]


# ---- bad records ---------------------------------------------------------------------------

GOOD = rec.REMOVE_RECORD


def _with_crc(length: int, body: bytes) -> bytes:
    return struct.pack("<II", length, crc32(body)) + body


BAD = [
    (b"\x01\x00\x00", "incomplete record header"),
    (GOOD[:7], "incomplete record header"),
    (b"\x00" * 16, "impossible record length 0"),
    (
        struct.pack("<II", rec.MAX_BODY + 1, 0) + b"\x01",
        f"impossible record length {rec.MAX_BODY + 1}",
    ),
    (GOOD[:-1], "record runs past the end of the file"),
    (_with_crc(30, b"\x01" * 10), "record runs past the end of the file"),
    (struct.pack("<II", 1, 12345) + b"\x02", "checksum mismatch"),
    (raw(b"\x01" + b"\x00" * 23), "ADD record too short"),
    (raw(b"\x03\x00\x00\x00"), "OPEN record has the wrong length"),
    (raw(b"\x04" + b"\x00" * 5), "CONFIRM record has the wrong length"),
    (raw(b"\x05"), "ABORT record has the wrong length"),
    (raw(b"\x02\x00"), "REMOVE record has the wrong length"),
    (raw(b"\x06\x00"), "FLUSH record has the wrong length"),
    (raw(b"\x00"), "unknown opcode 0"),
    (raw(bytes([max(rec.OP_NAMES) + 1])), f"unknown opcode {max(rec.OP_NAMES) + 1}"),
    (raw(b"\xff\x00\x00\x00\x00"), "unknown opcode 255"),
]


@pytest.mark.parametrize(("bad", "reason"), BAD, ids=[r for _, r in BAD])
def test_bad_record(bad: bytes, reason: str) -> None:
    truncated = "incomplete" in reason or "past the end" in reason
    buf = GOOD + bad if truncated else GOOD + bad + GOOD  # a good record after: still bad
    with pytest.raises(rec.BadRecord) as info:
        list(rec.iter_records(buf, 0))
    assert (info.value.offset, info.value.reason) == (len(GOOD), reason)
    assert not rec.looks_like_record(GOOD + bad, len(GOOD))


def test_add_of_exactly_the_fields_is_valid() -> None:
    body = struct.pack("<BQqq", rec.OP_ADD, 1, 2, 0)
    assert decode(raw(body)) == [("add", 1, 2, 0, b"")]
    assert rec.looks_like_record(raw(body), 0)
