"""tercel.PersistentQueue in-process: semantics, async waits, and a kill -9 of its process."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tercel
from tercel.config import QueueConfig
from tercel.errors import ConfigError, ItemTooLarge

CHILD = textwrap.dedent(
    """
    import sys
    from tercel import PersistentQueue

    q = PersistentQueue(sys.argv[1], "work")
    for i in range(1000):
        q.add(b"%d" % i)
    assert q.remove().data == b"0"          # taken for good
    held = q.remove(open=True)              # open, never confirmed: comes back
    done = q.remove(open=True)
    q.confirm(done.xid)                     # confirmed: gone
    print("ready", flush=True)
    sys.stdin.read()                        # wait here until killed
    """
)


def test_items_survive_kill_9_of_the_process(tmp_path: Path) -> None:
    folder = tmp_path / "new" / "folder"  # created if missing
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline() == b"ready\n"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    child.stdin.close()
    child.stdout.close()
    with tercel.PersistentQueue(folder, "work") as q:
        assert len(q) == 998
        first = q.peek()
        assert first is not None and first.data == b"1" and first.id == 2
        assert [q.remove().data for _ in range(3)] == [b"1", b"3", b"4"]  # type: ignore[union-attr]


def test_open_confirm_abort_and_reopen(tmp_path: Path) -> None:
    with tercel.PersistentQueue(tmp_path, "q") as q:
        assert q.remove() is None and q.peek() is None
        assert q.add(b"a") and q.add(b"b")
        item = q.remove(open=True)
        assert item is not None and item.data == b"a" and item.xid > 0
        assert q.open_reads == 1
        assert q.abort(item.xid) and not q.abort(item.xid)
        again = q.remove(open=True)
        assert again is not None and again.data == b"a" and again.id == item.id
        assert q.confirm(again.xid) and not q.confirm(again.xid)
        held = q.remove(open=True)
        assert held is not None and held.data == b"b"
    # Closing with an open read returns it, like a server restart.
    with tercel.PersistentQueue(tmp_path, "q") as q:
        got = q.remove()
        assert got is not None and got.data == b"b" and got.xid == 0
        assert len(q) == 0


def test_config_lock_and_errors(tmp_path: Path) -> None:
    config = QueueConfig(max_items=1, max_item_size=4, sync_journal=0)
    with tercel.PersistentQueue(tmp_path, "small", config) as q:
        assert q.add(b"1")
        assert not q.add(b"2")  # full
        with pytest.raises(ItemTooLarge):
            q.add(b"12345")
        with pytest.raises(ConfigError):
            tercel.PersistentQueue(tmp_path, "small")  # already open
    with pytest.raises(ConfigError):
        tercel.PersistentQueue(tmp_path, "bad/name")
    with tercel.PersistentQueue(tmp_path, "exp") as q:
        q.add(b"gone", expiry=0.001)
        q.add(b"kept", expiry=3600)
        while (head := q.peek()) is not None and head.data == b"gone":
            pass  # the first item expires within a millisecond
        assert q.remove().data == b"kept"  # type: ignore[union-attr]


def test_wait_remove(tmp_path: Path) -> None:
    async def main(q: tercel.PersistentQueue) -> None:
        assert await q.wait_remove(0.01) is None
        waiter = asyncio.create_task(q.wait_remove(30))
        await asyncio.sleep(0)  # let it register
        q.add(b"hello")
        got = await waiter
        assert got is not None and got.data == b"hello" and got.xid == 0
        opener = asyncio.create_task(q.wait_remove(None, open=True))
        await asyncio.sleep(0)
        q.add(b"open me")
        held = await opener
        assert held is not None and held.xid > 0 and q.open_reads == 1
        q.abort(held.xid)
        # A waiter that is cancelled after being served gives the item back.
        q.remove()
        cancelled = asyncio.create_task(q.wait_remove(30))
        await asyncio.sleep(0)
        q.add(b"raced")
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert q.peek() is not None and q.peek().data == b"raced"  # type: ignore[union-attr]

    with tercel.PersistentQueue(tmp_path, "w") as q:
        asyncio.run(main(q))


def test_confirm_takes_the_item_or_its_xid_never_its_id(tmp_path: Path) -> None:
    with tercel.PersistentQueue(tmp_path, "ids") as q:
        for data in (b"x", b"y", b"a", b"b", b"c", b"d"):
            q.add(data)
        q.remove(), q.remove()  # ids now run ahead of xids
        first = q.remove(open=True)
        assert first is not None and first.id != first.xid
        assert q.confirm(first) and not q.confirm(first)  # the item itself
        second = q.remove(open=True)
        assert second is not None
        with pytest.raises(ValueError, match=f"is an open item's id.*its xid \\({second.xid}\\)"):
            q.confirm(second.id)
        with pytest.raises(ValueError, match="is an open item's id"):
            q.abort(second.id)
        assert q.open_reads == 1  # the refused calls changed nothing
        assert q.abort(second) and q.confirm(q.remove(open=True).xid)  # type: ignore[union-attr]
        taken = q.remove()
        assert taken is not None and taken.xid == 0
        with pytest.raises(ValueError, match="not taken with open=True"):
            q.confirm(taken)
        assert not q.confirm(12345)  # an xid that is not open: False, as before
