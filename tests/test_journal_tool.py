"""``tercel journal dump|check|compact`` on real journals, run as the command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tercel.clock import SystemClock
from tercel.config import QueueConfig
from tercel.core.queue import PersistentQueue
from tercel.journal import FileJournal
from tercel.journal.joblog import JobJournal


def tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tercel", "journal", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def make(path: Path) -> None:
    q = PersistentQueue("q", QueueConfig(), FileJournal(str(path), "q"), SystemClock())
    q.replay()
    for i in range(5):
        q.add(b"item%d" % i)
    q.remove()
    xid, _ = q.remove_open()  # type: ignore[misc]
    q.confirm(xid)
    q.close()


def test_dump_lists_every_record(tmp_path: Path) -> None:
    make(tmp_path)
    out = tool("dump", str(tmp_path), "q", "--payload")
    assert out.returncode == 0
    ops = [line.split()[1] for line in out.stdout.splitlines() if not line.startswith("#")]
    assert ops == ["ADD"] * 5 + ["REMOVE", "OPEN", "CONFIRM"]
    assert "b'item0'" in out.stdout and "id=5" in out.stdout


def test_check_reports_the_first_bad_offset(tmp_path: Path) -> None:
    make(tmp_path)
    assert tool("check", str(tmp_path)).returncode == 0
    raw = bytearray((tmp_path / "q").read_bytes())
    raw[8 + 8 + 25] ^= 0x01  # a payload byte of the first record
    (tmp_path / "q").write_bytes(bytes(raw))
    out = tool("check", str(tmp_path))
    assert out.returncode == 1
    assert f"{tmp_path / 'q'}: BAD at offset 8: checksum mismatch" in out.stdout


def test_compact_keeps_the_items_and_drops_history(tmp_path: Path) -> None:
    make(tmp_path)
    out = tool("compact", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "q: 3 items" in out.stdout
    dumped = tool("dump", str(tmp_path)).stdout
    assert "REMOVE" not in dumped and "SNAPSHOT" in dumped
    q = PersistentQueue("q", QueueConfig(), FileJournal(str(tmp_path), "q"), SystemClock())
    q.replay()
    assert [q.remove().data for _ in range(3)] == [b"item2", b"item3", b"item4"]  # type: ignore[union-attr]
    q.close()


def test_check_and_dump_take_a_queue_and_refuse_a_missing_one(tmp_path: Path) -> None:
    make(tmp_path)
    out = tool("check", str(tmp_path), "q")
    assert out.returncode == 0 and out.stdout == f"{tmp_path / 'q'}: ok, 8 records\n"
    for verb in ("check", "dump", "salvage", "compact"):
        missing = tool(verb, str(tmp_path), "nosuch")
        assert missing.returncode == 2
        assert missing.stderr == f"nosuch: no such queue in {tmp_path}\n"
        assert not (tmp_path / "nosuch").exists()
    bad = tool("salvage", str(tmp_path), "../q")
    assert bad.returncode == 2 and "not a valid queue name" in bad.stderr


def test_check_covers_the_beanstalkd_job_log(tmp_path: Path) -> None:
    """``beanstalk.d`` in a data dir (``tercel serve``) is checked with the queues, a
    ``tercel beanstalkd -b`` directory with ``--jobs``; the first bad offset per file, exit 1
    (before: the job log was not looked at)."""
    make(tmp_path)
    jobs = tmp_path / "beanstalk.d"
    log = JobJournal(str(jobs), 4096)
    log.replay()
    for i in range(60):
        log.put(i + 1, 1, 0, 0, 0, "tube", 60, 0, b"x" * 100)
        log.write_out()
    log.close()
    assert sorted(os.listdir(jobs))[:3] == ["jobs.1", "jobs.2", "jobs.3"]
    out = tool("check", str(tmp_path))
    assert out.returncode == 0
    assert f"{jobs / 'jobs.1'}: ok, " in out.stdout and f"{tmp_path / 'q'}: ok, 8" in out.stdout
    raw = bytearray((jobs / "jobs.2").read_bytes())
    raw[8 + 8 + 30] ^= 0x01  # inside the first record's fields
    (jobs / "jobs.2").write_bytes(bytes(raw))
    for args in (("check", str(tmp_path)), ("check", "--jobs", str(jobs))):
        out = tool(*args)
        assert out.returncode == 1
        assert f"{jobs / 'jobs.2'}: BAD at offset 8: checksum mismatch (0 good" in out.stdout
    assert tool("check", str(tmp_path), "q").returncode == 0  # one queue: no job log


def test_dump_shows_the_keys_of_keyed_records(tmp_path: Path) -> None:
    q = PersistentQueue("q", QueueConfig(), FileJournal(str(tmp_path), "q"), SystemClock())
    q.replay()
    assert q.add_keyed("put.1", b"a") == 1
    q.add(b"b")
    lease = q.take_keyed("batch.7", 2, 0, SystemClock().now_ms())
    assert lease is not None and lease.count == 2
    assert q.ack_keyed("batch.7") == 2
    q.close()
    lines = [line.split() for line in tool("dump", str(tmp_path), "q").stdout.splitlines()]
    records = {line[1]: line[2:] for line in lines if line and not line[0].startswith("#")}
    assert "key=put.1" in records["ADD_KEYED"] and "id=1" in records["ADD_KEYED"]
    assert "key=batch.7" in records["KEY_TAKE"] and "count=2" in records["KEY_TAKE"]
    assert records["KEY_END"] == ["key=batch.7", "how=acked"]
