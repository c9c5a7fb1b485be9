"""Keyed leases survive a crash at each of their crash windows (tercel.journal.faults
.KEYED_CRASHES): a process that takes, acks or releases a keyed lease dies there (os._exit,
as kill -9), and the restart finds every item exactly once, in the queue or under the key."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tercel.clock import ManualClock
from tercel.config import QueueConfig
from tercel.core.queue import PersistentQueue
from tercel.errors import LeaseKeyEnded
from tercel.journal import FileJournal
from tercel.journal.faults import CRASH_EXIT, KEYED_CRASHES

CRASHER = textwrap.dedent(
    """
    import sys
    from tercel.clock import SystemClock
    from tercel.config import QueueConfig
    from tercel.core.queue import PersistentQueue
    from tercel.journal import FileJournal
    from tercel.journal.faults import KEYED_CRASHES, FaultyFiles
    from tercel.journal.files import set_default_ops

    faults = FaultyFiles()
    set_default_ops(faults)
    point = sys.argv[2]
    cfg = QueueConfig(sync_journal=0)
    q = PersistentQueue("q", cfg, FileJournal(sys.argv[1], "q"), SystemClock())
    q.replay()
    for i in range(20):
        q.add(b"%06d" % i)
    print("filled", flush=True)
    KEYED_CRASHES[point](faults)
    q.take_keyed("k", 5, 0, 1_700_000_000_000)
    print("taken", flush=True)
    if "ack" in point:
        q.ack_keyed("k")
        print("acked", flush=True)
        q.expire_keyed(1_700_000_000_000)
    if "release" in point:
        q.release_keyed("k")
        print("released", flush=True)
    """
)


def restart(data: Path) -> PersistentQueue:
    q = PersistentQueue("q", QueueConfig(), FileJournal(str(data), "q"), ManualClock())
    q.replay()
    return q


@pytest.mark.parametrize("point", KEYED_CRASHES)
def test_a_crash_in_each_keyed_window_loses_and_duplicates_nothing(
    tmp_path: Path, point: str
) -> None:
    script = tmp_path / "crasher.py"
    script.write_text(CRASHER)
    data = tmp_path / "data"
    data.mkdir()
    proc = subprocess.run(
        [sys.executable, str(script), str(data), point],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == CRASH_EXIT, proc.stderr
    said = proc.stdout.split()
    assert "filled" in said
    q = restart(data)
    queued = []
    while (item := q.remove()) is not None:
        queued.append(item.id)
    leased: list[int] = []
    try:
        lease = q.keyed("k")
        if lease is not None:
            leased = list(q.keyed_slice("k", 0, lease.count).item_ids)
    except LeaseKeyEnded as ended:
        assert ended.how in ("acked", "released")
        if ended.how == "acked":
            leased = [1, 2, 3, 4, 5]  # confirmed for good
    assert sorted(queued + leased) == list(range(1, 21)), (point, queued, leased)
    if "taken" in said and "release" not in point:
        assert leased == [1, 2, 3, 4, 5]
    if "acked" in said:
        with pytest.raises(LeaseKeyEnded, match="acked"):
            q.keyed("k")
    if point == "key_release_after_record":
        assert sorted(queued) == list(range(1, 21))
    q.close()
    assert sorted(p.name for p in data.iterdir() if ".key." in p.name) == (
        ["q.key.1"] if q.keyed_figures()[0] or point == "key_release_after_record" else []
    )
