"""``tercel journal salvage`` on journals written by a real server and then damaged."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pymemcache.client.base import Client

from tercel.clock import SystemClock
from tercel.config import QueueConfig
from tercel.core.queue import PersistentQueue
from tercel.journal import FileJournal
from tercel.journal import records as rec
from tercel.testing import ServerProcess

READ_BEHIND = '[queues]\nmax_memory_size = "2KB"\nmax_journal_size = "4KB"\n'


def tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tercel", "journal", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def item(i: int) -> bytes:
    return b"item%05d-" % i + b"x" * 90


def offsets(path: Path) -> list[int]:
    """The offset of every record of a (healthy) file."""
    return [start for start, _ in rec.iter_records(path.read_bytes(), rec.HEADER_SIZE)]


def fill(data_dir: Path, config: str | None, produce: int, consume: int = 0) -> None:
    """Write ``produce`` items with a real server, take ``consume`` of them, kill -9."""
    with ServerProcess(data_dir, config) as srv:
        client = Client(("127.0.0.1", srv.port), default_noreply=False)
        for i in range(produce):
            assert client.set("q", item(i))
        for i in range(consume):
            assert client.get("q") == item(i)
        client.close()
        srv.kill()


def drain(data_dir: Path, config: str | None) -> list[bytes]:
    with ServerProcess(data_dir, config) as srv:
        client = Client(("127.0.0.1", srv.port), default_noreply=False)
        out = []
        while (got := client.get("q")) is not None:
            out.append(got)
        client.close()
        srv.stop()
    return out


def damage(path: Path, offset: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    path.write_bytes(bytes(raw))


def refuses_to_start(data_dir: Path, config: str | None) -> None:
    assert ServerProcess(data_dir, config).start_refused() == 3


def test_a_bad_checksum_cuts_one_record_and_keeps_the_rest(tmp_path: Path) -> None:
    data = tmp_path / "data"
    fill(data, None, 20)
    journal = data / "q"
    at = offsets(journal)
    damage(journal, at[5] + rec.ADD_HEAD_SIZE + 3, b"#")  # a payload byte of item 5
    refuses_to_start(data, None)
    before = journal.read_bytes()

    dry = tool("salvage", str(data), "q", "--dry-run")
    assert dry.returncode == 1 and journal.read_bytes() == before
    assert sorted(os.listdir(data)) == [".lock", "q"]

    out = tool("salvage", str(data), "q")
    assert out.returncode == 1, out.stderr
    size = at[6] - at[5]
    assert f"cut [{at[5]}, {at[6]}) {size} bytes: checksum mismatch" in out.stdout
    assert f"(its header says: ADD of {size} bytes)" in out.stdout
    assert f"{journal}: 19 records kept, {size} bytes cut in 1 spans" in out.stdout
    kept = [p for p in os.listdir(data) if p.startswith("q.damaged-")]
    assert len(kept) == 1 and (data / kept[0]).read_bytes() == before
    assert sorted(os.listdir(data)) == [".lock", "q", kept[0]]  # nothing else written
    assert tool("check", str(data), "q").returncode == 0
    assert drain(data, None) == [item(i) for i in range(20) if i != 5]
    again = tool("salvage", str(data), "q")
    assert again.returncode == 0 and "q: nothing to salvage" in again.stdout


def test_garbage_over_a_length_field_resyncs_on_the_next_records(tmp_path: Path) -> None:
    data = tmp_path / "data"
    fill(data, None, 20)
    journal = data / "q"
    at = offsets(journal)
    damage(journal, at[7] + 50, b"\xff" * (at[9] - at[7]))  # from item 7 into item 9's head
    refuses_to_start(data, None)
    out = tool("salvage", str(data), "q")
    assert out.returncode == 1, out.stderr
    assert f"cut [{at[7]}, {at[10]})" in out.stdout
    assert drain(data, None) == [item(i) for i in range(20) if i not in (7, 8, 9)]


def test_a_torn_header_in_the_middle_and_a_record_ending_in_zeros(tmp_path: Path) -> None:
    data = tmp_path / "data"
    fill(data, None, 6)
    journal = data / "q"
    at = offsets(journal)
    damage(journal, 0, b"XXXX")  # the file header
    damage(journal, at[2], b"\0" * 8)  # zeros where a record starts, data after
    refuses_to_start(data, None)
    out = tool("salvage", str(data), "q")
    assert out.returncode == 1, out.stderr
    assert "bad file header (replaced)" in out.stdout
    assert "zero bytes where a record starts" in out.stdout or "impossible record" in out.stdout
    assert drain(data, None) == [item(i) for i in (0, 1, 3, 4, 5)]


def test_damage_before_a_resume_position_moves_the_position(tmp_path: Path) -> None:
    """A compaction in read-behind wrote a RESUME that points into an older file; damage
    before that point (items already taken) must move the pointer and lose nothing queued.
    The queue is the server's own, in-process, so that the compaction runs when asked."""
    data = tmp_path / "data"
    data.mkdir()
    config = QueueConfig(max_memory_size=2048, max_journal_size=4096)
    q = PersistentQueue("q", config, FileJournal(str(data), "q"), SystemClock())
    q.replay()
    for i in range(300):
        q.add(item(i))
    for i in range(150):
        assert q.remove().data == item(i)  # type: ignore[union-attr]
    q.compact()
    q.close()
    dumped = tool("dump", str(data), "q").stdout
    resume = next(line for line in dumped.splitlines() if "RESUME" in line)
    seq, offset = resume.split("cursor=(")[1].split(")")[0].split(", ")
    older = data / f"q.{seq}"
    assert int(offset) > rec.HEADER_SIZE, resume
    first = offsets(older)[0]
    damage(older, first + rec.ADD_HEAD_SIZE, b"#")
    refuses_to_start(data, READ_BEHIND)
    out = tool("salvage", str(data), "q")
    assert out.returncode == 1, out.stderr
    assert offsets(older)[0] == first  # the file is healthy again
    moved = f"RESUME position ({seq}, {offset}) -> "
    assert moved in out.stdout, out.stdout
    assert drain(data, READ_BEHIND) == [item(i) for i in range(150, 300)]


def test_refuses_while_a_server_holds_the_directory(tmp_path: Path) -> None:
    with ServerProcess(tmp_path) as srv:
        client = Client(("127.0.0.1", srv.port), default_noreply=False)
        assert client.set("q", b"x")
        client.close()
        out = tool("salvage", str(tmp_path), "q")
        assert out.returncode == 2 and "in use by a running tercel" in out.stderr


def test_a_checkpoint_does_not_outlive_a_salvage_that_changed_the_files(tmp_path: Path) -> None:
    # A clean stop leaves a checkpoint: "the queue is 200 ADDs from item 0's record in q.1,
    # replay goes on at the end of the newest file". Salvage then cuts a damaged ADD out of
    # q.1: the checkpoint no longer describes the files, and must not be trusted.
    data = tmp_path / "data"
    with ServerProcess(data, READ_BEHIND) as srv:
        client = Client(("127.0.0.1", srv.port), default_noreply=False)
        for i in range(200):
            assert client.set("q", item(i))
        client.close()
        srv.stop()
    assert (data / "q.checkpoint").exists()
    first = data / "q.1"
    at = offsets(first)
    damage(first, at[5] + rec.ADD_HEAD_SIZE + 3, b"#")  # a payload byte of item 5
    out = tool("salvage", str(data), "q")
    assert out.returncode == 1, out.stderr
    assert tool("check", str(data), "q").returncode == 0
    with ServerProcess(data, READ_BEHIND) as srv:
        client = Client(("127.0.0.1", srv.port), default_noreply=False)
        got = []
        while (value := client.get("q")) is not None:
            got.append(value)
        client.set("q", b"after")
        assert client.get("q") == b"after"
        client.close()
        srv.stop()
    assert got == [item(i) for i in range(200) if i != 5]
