"""The job log's encoders (librt's BytesWriter) write exactly the bytes of the ``struct``
formats replay decodes, at every field's limits."""

from __future__ import annotations

import struct

import pytest

from tercel.journal.jobrecords import (
    OP_DELETE,
    OP_JOB,
    OP_STATE,
    LoggedJob,
    encode_delete,
    encode_job,
    encode_job_fields,
    encode_state,
)
from tercel.journal.records import crc32

_JOB = struct.Struct("<BQBIIIqqIIIIIB")
_STATE = struct.Struct("<BQBIIqIIIII")
_DELETE = struct.Struct("<BQ")
U32 = 0xFFFF_FFFF
U64 = 0xFFFF_FFFF_FFFF_FFFF
I64_MIN = -(1 << 63)
I64_MAX = (1 << 63) - 1


def _frame(body: bytes) -> bytes:
    return struct.pack("<II", len(body), crc32(body)) + body


def _clamped(counters: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(min(c, U32) for c in counters)


CASES = [
    # job_id, state, pri, delay, deadline_ms, counters, tube, ttr, created_ms, body
    (1, 1, 0, 0, 0, (0, 0, 0, 0, 0), "default", 1, 1_700_000_000_000, b""),
    (7, 2, 1024, 5, 1_700_000_005_000, (1, 2, 3, 4, 5), "a.b/c;(d)", 60, 1, b"x" * 1024),
    (U64, 3, U32, U32, I64_MAX, (U32, U32 + 9, 0, 1 << 40, 7), "t" * 200, U32, I64_MIN, b"\0"),
    ((1 << 63) - 1, 1, 1 << 31, (1 << 31) - 1, I64_MIN, (0, 0, 0, 0, 1), "-", 0, -1, b"\r\n"),
    (1 << 63, 2, 0x8000_0001, 0x7FFF_FFFF, -1, (1 << 31, 0, 0, 0, 0), "$_+", 2, 0, b"ab"),
]


@pytest.mark.parametrize("case", CASES)
def test_job_record_is_the_struct_layout(case: tuple) -> None:  # type: ignore[type-arg]
    job_id, state, pri, delay, deadline, counters, tube, ttr, created, body = case
    name = tube.encode("ascii")
    fields = (
        _JOB.pack(
            OP_JOB,
            job_id,
            state,
            pri,
            delay,
            ttr,
            created,
            deadline,
            *_clamped(counters),
            len(name),
        )
        + name
    )
    want = _frame(fields + body)
    head, tail = encode_job_fields(*case)
    assert tail is body
    assert head + tail == want
    logged = LoggedJob(job_id, state, pri, delay, deadline, counters, tube, ttr, created, body)
    assert b"".join(encode_job(logged)) == want
    if counters == (0, 0, 0, 0, 0):  # a put's: no counters given
        head, _ = encode_job_fields(
            job_id, state, pri, delay, deadline, None, tube, ttr, created, body
        )
        assert head + body == want


@pytest.mark.parametrize("case", CASES)
def test_state_and_delete_records_are_the_struct_layout(case: tuple) -> None:  # type: ignore[type-arg]
    job_id, state, pri, delay, deadline, counters, tube, ttr, created, body = case
    logged = LoggedJob(job_id, state, pri, delay, deadline, counters, tube, ttr, created, body)
    want = _STATE.pack(OP_STATE, job_id, state, pri, delay, deadline, *_clamped(counters))
    assert encode_state(logged) == _frame(want)
    assert encode_delete(job_id) == _frame(_DELETE.pack(OP_DELETE, job_id))
