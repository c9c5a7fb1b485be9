"""The group committer with real journals on a real event loop: write, then fsync, then reply."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

from journal.recorder import Recorder
from tercel.journal import FileJournal
from tercel.server.commit import Committer


class Conn:
    """A connection stand-in that notes, at each release, what the journal file held."""

    def __init__(self, journal: FileJournal) -> None:
        self.journal = journal
        self.released: list[tuple[bytes, int, bool]] = []
        self.failed = False

    def release(self, data: bytes) -> None:
        size = os.path.getsize(self.journal.path)
        self.released.append((data, size, self.journal.needs_sync))

    def fail(self) -> None:
        self.failed = True


def run_passes(tmp_path: Path, modes: dict[str, int | None], body: Callable[..., None]) -> None:
    """Run ``body(committer, journals)`` on a real loop, then one more pass for the callback."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        committer = Committer(loop, modes.__getitem__)
        journals = {}
        for name in modes:
            j = FileJournal(str(tmp_path), name, on_dirty=committer.journal_dirty)
            j.replay(Recorder())
            journals[name] = j
        try:
            body(committer, journals)
            for _ in range(3):
                await asyncio.sleep(0)
        finally:
            for j in journals.values():
                j.close()
            committer.close()

    asyncio.run(main())


def test_sync_queue_reply_waits_for_write_and_fsync_of_its_pass(tmp_path: Path) -> None:
    conns: list[Conn] = []

    def body(committer: Committer, journals: dict[str, FileJournal]) -> None:
        before = os.path.getsize(journals["s"].path)
        for i in range(3):  # three connections, one pass: one group
            journals["s"].add(i + 1, 0, 0, b"x" * 100)
            conn = Conn(journals["s"])
            committer.hold(conn, b"STORED\r\n")
            conns.append(conn)
        assert os.path.getsize(journals["s"].path) == before  # buffered, nothing released
        assert all(not c.released for c in conns)

    run_passes(tmp_path, {"s": 0}, body)
    for conn in conns:
        [(data, size, unsynced)] = conn.released
        assert data == b"STORED\r\n"
        assert size > 300  # the three ADD records reached the file before the reply
        assert not unsynced  # ... and were fdatasynced
    assert not any(c.failed for c in conns)


def test_group_counters_and_unsynced_queues(tmp_path: Path) -> None:
    counters: list[tuple[int, int]] = []
    conns: list[Conn] = []

    def body(committer: Committer, journals: dict[str, FileJournal]) -> None:
        journals["plain"].add(1, 0, 0, b"p")
        conn = Conn(journals["plain"])
        committer.hold(conn, b"STORED\r\n")
        conns.append(conn)
        asyncio.get_running_loop().call_later(
            0.0, lambda: counters.append((committer.fsyncs, committer.fsync_waits))
        )

    run_passes(tmp_path, {"plain": None, "s": 0}, body)
    [(_, _, unsynced)] = conns[0].released
    assert unsynced  # written, never fsynced: sync_journal = false
    assert counters == [(0, 0)]


def test_each_pass_that_writes_a_sync_queue_is_one_fsync(tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []

    def body(committer: Committer, journals: dict[str, FileJournal]) -> None:
        loop = asyncio.get_running_loop()

        def one_pass(n: int) -> None:
            for i in range(n):
                journals["s"].add(i + 1, 0, 0, b"x")
                committer.hold(Conn(journals["s"]), b"STORED\r\n")
            loop.call_soon(lambda: seen.append((committer.fsyncs, committer.fsync_waits)))

        one_pass(4)
        loop.call_soon(one_pass, 2)

    run_passes(tmp_path, {"s": 0}, body)
    assert seen[-1] == (2, 6)


def test_failed_group_fsync_drops_the_group_and_fails_the_journal(tmp_path: Path) -> None:
    conns: list[Conn] = []
    errors: list[int] = []

    def body(committer: Committer, journals: dict[str, FileJournal]) -> None:
        j = journals["s"]
        j.add(1, 0, 0, b"x")
        r, w = os.pipe()
        os.dup2(w, j._fd)  # the write goes into the pipe; fdatasync on it fails (EINVAL)
        os.close(w)
        for _ in range(2):
            conn = Conn(j)
            committer.hold(conn, b"STORED\r\n")
            conns.append(conn)
        loop = asyncio.get_running_loop()
        loop.call_soon(lambda: errors.append(committer.write_errors))
        loop.call_soon(os.close, r)

    run_passes(tmp_path, {"s": 0}, body)
    assert all(c.failed and not c.released for c in conns)
    assert errors == [1]
