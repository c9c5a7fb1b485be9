"""The data directory is listed once per start, and never for a queue created at run time.

Each queue's replay used to list the whole directory (twice), so a start with n queues read
n directory listings of n files: 10,000 queues took minutes to restart (issue 21, item 3).
"""

from __future__ import annotations

from pathlib import Path

from tercel.clock import ManualClock
from tercel.config import ServerConfig, ServerSettings
from tercel.core.collection import QueueCollection
from tercel.journal import FileJournal
from tercel.journal.faults import FaultyFiles
from tercel.journal.files import DataDir


def collection(tmp_path: Path, files: DataDir) -> QueueCollection:
    return QueueCollection(
        ServerConfig(ServerSettings(data_dir=str(tmp_path))),
        lambda name, _: FileJournal(str(tmp_path), name, directory=files),
        ManualClock(),
    )


def test_one_listing_per_start_and_none_for_new_queues(tmp_path: Path) -> None:
    faults = FaultyFiles()  # counts every file operation
    files = DataDir(str(tmp_path), max_open=16, ops=faults)
    coll = collection(tmp_path, files)
    for i in range(50):
        assert coll.add(f"q{i}", b"x%d" % i, None, 1)
    coll.close()
    assert faults.calls["scandir"] == 1  # the first queue's creation; none for the other 49
    (tmp_path / "q0~~7").write_bytes(b"left over from a compaction")

    faults = FaultyFiles()
    files = DataDir(str(tmp_path), max_open=16, ops=faults)
    coll = collection(tmp_path, files)
    coll.load(files.queue_names())
    assert len(coll) == 50
    for i in range(50, 60):  # created at run time: nothing listed, nothing to replay
        assert coll.add(f"q{i}", b"y", None, 1)
    assert faults.calls["scandir"] == 1
    assert not (tmp_path / "q0~~7").exists()  # the listing's temp files are removed
    assert coll.delete("q3")
    assert coll.add("q3", b"again", None, 1)  # deleted and created again: a fresh journal
    q3 = coll.queue("q3")
    assert q3 is not None and len(q3) == 1
    head = q3.peek()
    assert head is not None and head.data == b"again"
    coll.close()
    assert faults.calls["scandir"] == 1
