"""The job log's torn-tail rule (journal/joblog.py with journal/tail.py), the queue journals'
rule (docs/journal_format.md §6 and §17): a bad record in the newest ``jobs`` file is cut only
as a torn tail (nothing valid after it) or as a power-loss hole of zeros, whose bytes are kept
in ``jobs.<n>.cut-<offset>``; a bad record with valid records after it stops the start."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support import Raw, stats
from tercel.errors import JournalCorrupt
from tercel.journal.joblog import JobJournal
from tercel.journal.jobrecords import HEADER, encode_delete, encode_job_fields
from tercel.journal.records import PREFIX, crc32
from tercel.journal.tail import HOLE
from tercel.testing import BeanstalkdProcess, ServerProcess


def job(job_id: int, size: int = 10) -> bytes:
    """A whole JOB record (ready, tube ``t``) with a body of ``size`` bytes."""
    parts = encode_job_fields(job_id, 1, 0, 0, 0, (0, 0, 0, 0, 0), "t", 60, 0, b"x" * size)
    return b"".join(parts)


def replay(directory: Path) -> tuple[list[int], int]:
    """The ids of the jobs a replay of ``directory`` finds, and the torn bytes it cut."""
    journal = JobJournal(str(directory))
    try:
        found = journal.replay()
    finally:
        journal.close()
    return [j.job_id for j in found.jobs], found.torn_bytes


def kept_files(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if ".cut-" in n)


def test_a_torn_tail_is_cut_and_nothing_kept(tmp_path: Path) -> None:
    data = HEADER + job(1) + job(2)
    (tmp_path / "jobs.1").write_bytes(data[:-7])
    assert replay(tmp_path) == ([1], len(job(2)) - 7)
    assert (tmp_path / "jobs.1").read_bytes() == HEADER + job(1)
    assert kept_files(tmp_path) == []


def _flipped(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]


@pytest.mark.parametrize("damage", ["checksum", "length", "zeroed-sector"])
def test_damage_with_valid_records_after_it_stops_the_start(tmp_path: Path, damage: str) -> None:
    """A bad record with valid job records after it in the newest file is damage inside
    synced data: refused, nothing cut, nothing written."""
    first = HEADER + job(1)
    rest = job(2, 2000) + job(3) + encode_delete(1) + job(4)
    if damage == "checksum":
        data = first + _flipped(rest, 30)
    elif damage == "length":  # the length field now points anywhere
        data = first + _flipped(rest, 2)
    else:  # a 512-byte sector of zeros from a record boundary, not reaching a page end
        data = first + bytes(512) + rest[512:]
    (tmp_path / "jobs.1").write_bytes(data)
    with pytest.raises(JournalCorrupt) as info:
        replay(tmp_path)
    assert info.value.offset == len(first)
    assert (tmp_path / "jobs.1").read_bytes() == data
    assert kept_files(tmp_path) == []


def test_damage_in_the_newest_file_after_older_files_stops_the_start(tmp_path: Path) -> None:
    (tmp_path / "jobs.1").write_bytes(HEADER + job(1))
    data = HEADER + _flipped(job(2), 20) + job(3)
    (tmp_path / "jobs.2").write_bytes(data)
    with pytest.raises(JournalCorrupt):
        replay(tmp_path)
    assert (tmp_path / "jobs.2").read_bytes() == data


def test_a_lost_page_of_the_unsynced_tail_is_cut_and_kept(tmp_path: Path) -> None:
    """Shape 1: a record running into a whole page of zeros, valid records after it."""
    first = HEADER + job(1)
    data = bytearray(first + job(2, 3 * HOLE) + job(3) + job(4))
    data[HOLE : 2 * HOLE] = bytes(HOLE)  # the page after the one job 2 starts in
    path = tmp_path / "jobs.1"
    path.write_bytes(bytes(data))
    assert replay(tmp_path) == ([1], len(data) - len(first))
    assert path.read_bytes() == first
    assert kept_files(tmp_path) == [f"jobs.1.cut-{len(first)}"]
    assert (tmp_path / f"jobs.1.cut-{len(first)}").read_bytes() == data[len(first) :]


def test_the_lost_page_of_the_last_fsync_is_cut_and_kept_never_overwritten(
    tmp_path: Path,
) -> None:
    """Shape 2: the synced records, zeros to the end of their page, records after. A second
    cut at the same offset keeps its bytes under ``.1``."""
    synced = HEADER + job(1) + job(2)
    data = synced + bytes(HOLE - len(synced)) + job(3) + job(4)
    path = tmp_path / "jobs.1"
    for kept in ([f"jobs.1.cut-{len(synced)}"], [f"jobs.1.cut-{len(synced)}.1"]):
        path.write_bytes(data)
        assert replay(tmp_path) == ([1, 2], len(data) - len(synced))
        assert path.read_bytes() == synced
        assert (tmp_path / kept[0]).read_bytes() == data[len(synced) :]
    assert len(kept_files(tmp_path)) == 2


def test_a_hole_where_the_header_was_cuts_the_file_and_keeps_it(tmp_path: Path) -> None:
    """The page holding the header never written back: nothing in the file was fsynced."""
    data = bytearray(HEADER + job(1, 2 * HOLE) + job(2))
    data[:HOLE] = bytes(HOLE)
    path = tmp_path / "jobs.1"
    path.write_bytes(bytes(data))
    assert replay(tmp_path) == ([], len(data))
    assert path.read_bytes() == HEADER  # cut to nothing, the header written again
    assert (tmp_path / "jobs.1.cut-0").read_bytes() == bytes(data)


def test_the_log_appends_after_a_cut_hole(tmp_path: Path) -> None:
    synced = HEADER + job(1)
    (tmp_path / "jobs.1").write_bytes(synced + bytes(HOLE - len(synced)) + job(2))
    journal = JobJournal(str(tmp_path))
    assert [j.job_id for j in journal.replay().jobs] == [1]
    journal.delete(1)
    journal.close()
    assert replay(tmp_path) == ([], 0)


def test_the_server_refuses_damage_with_valid_records_after_it(tmp_path: Path) -> None:
    """``tercel beanstalkd -b DIR`` exits with code 3 and leaves the file as it was."""
    data = HEADER + job(1) + _flipped(job(2), 25) + job(3)
    (tmp_path / "jobs.1").write_bytes(data)
    proc = BeanstalkdProcess(tmp_path)
    assert proc.start_refused() == 3
    assert "corrupt" in proc.log()
    assert (tmp_path / "jobs.1").read_bytes() == data


def _crafted(job_id: int, tube: bytes, claimed: int) -> bytes:
    """A JOB record with a valid checksum whose tube field is ``tube`` but says it is
    ``claimed`` bytes long: written whole, and still nothing a job log ever writes."""
    head, body = encode_job_fields(job_id, 1, 0, 0, 0, (0, 0, 0, 0, 0), "t", 60, 0, b"body")
    fields = head[PREFIX.size : PREFIX.size + JOB_FIXED - 1] + bytes([claimed]) + tube
    record = fields + body
    return PREFIX.pack(len(record), crc32(record)) + record


JOB_FIXED = 59  # the JOB record's fixed fields, the tube name's length byte last


@pytest.mark.parametrize(
    ("tube", "claimed"), [(b"\xff\xfe", 2), (b"t", 200)], ids=["not-ascii", "too-long"]
)
def test_a_job_record_with_a_bad_tube_name_is_damage_not_a_crash(
    tmp_path: Path, tube: bytes, claimed: int
) -> None:
    """A whole JOB record (valid checksum) whose tube name is not ASCII or runs past the
    record: with valid records after it the server refuses to start (exit 3, file left as it
    was); as the last record it is cut by the torn-tail rule. Before: UnicodeDecodeError out
    of replay (a crash at start, not the corruption exit), or a tube name made of the body."""
    data = HEADER + job(1) + _crafted(2, tube, claimed) + job(3)
    (tmp_path / "jobs.1").write_bytes(data)
    proc = BeanstalkdProcess(tmp_path)
    assert proc.start_refused() == 3
    assert "bad JOB record" in proc.log()
    assert (tmp_path / "jobs.1").read_bytes() == data
    last = HEADER + job(1) + _crafted(2, tube, claimed)
    (tmp_path / "jobs.1").write_bytes(last)
    assert replay(tmp_path) == ([1], len(last) - len(HEADER + job(1)))


def test_a_job_log_cut_counts_in_the_torn_tails_stat(tmp_path: Path) -> None:
    """``tercel serve``: a torn tail cut from the job log counts in ``journal_torn_tails``,
    as a queue journal's does (before: logged, not counted)."""
    logs = tmp_path / "data" / "beanstalk.d"
    logs.mkdir(parents=True)
    (logs / "jobs.1").write_bytes((HEADER + job(1) + job(2))[:-7])
    with ServerProcess(tmp_path / "data", extra_args=("--beanstalk-port", "0")) as srv:
        conn = Raw(srv.connect())
        assert stats(conn)["journal_torn_tails"] == "1"
