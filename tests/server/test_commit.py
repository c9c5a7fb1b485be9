"""The group committer with real journals on a real event loop: write, then fsync, then reply."""

from __future__ import annotations

import asyncio
import errno
import os
import select
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from journal.recorder import Recorder
from tercel.errors import JournalWriteError
from tercel.journal import FileJournal
from tercel.journal.faults import FaultyFiles
from tercel.journal.files import DataDir
from tercel.server.aio import Aio, open_aio
from tercel.server.commit import AIO_MIN_GROUP, Committer, Holder


class Conn(Holder):
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


@pytest.fixture
def fsync_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Group fsyncs through native AIO, or on the loop (the path taken without AIO, forced
    here by ``TERCEL_NO_AIO``)."""
    if request.param == "inline":
        monkeypatch.setenv("TERCEL_NO_AIO", "1")
    return str(request.param)


def needs_aio() -> None:
    """Skip where native AIO is missing (the committer then always syncs on the loop)."""
    aio = open_aio()
    if aio is None:
        pytest.skip("no native AIO on this system")
    aio.close()


both_paths = pytest.mark.parametrize("fsync_path", ["aio", "inline"], indirect=True)


async def settle(committer: Committer) -> None:
    """Run the loop until nothing is buffered, held or being synced (an AIO fsync ends on a
    kernel worker: its eventfd wakes the loop)."""
    deadline = time.monotonic() + 10
    while committer.busy:
        assert time.monotonic() < deadline, "the committer never settled"
        await asyncio.sleep(0.001)
    await asyncio.sleep(0)


class FailingAio(Aio):
    """Native AIO whose fdatasyncs run but complete with EIO: a disk failing under a group
    fsync (the AIO half of the fault seam; ``FaultyFiles`` is the rest)."""

    def reap(self) -> list[tuple[int, int]]:
        return [(tag, -errno.EIO) for tag, _ in super().reap()]

    def wait_all(self) -> list[tuple[int, int]]:
        return [(tag, -errno.EIO) for tag, _ in super().wait_all()]


def failing_aio() -> Aio | None:
    return open_aio(FailingAio)


def fail_writes(faults: FaultyFiles) -> None:
    """From now on every journal write fails (EIO), as a failing disk's."""
    for op in ("pwrite", "pwritev"):
        faults.fail(op, errno.EIO)


def run_passes(
    tmp_path: Path,
    modes: dict[str, int | None],
    body: Callable[..., None],
    aio_min_group: int = 0,
    *,
    faults: FaultyFiles | None = None,
    aio: Callable[[], Aio | None] = open_aio,
) -> Committer:
    """Run ``body(committer, journals)`` on a real loop, then the loop until it settles. Every
    group fsync goes through AIO (when there is AIO) unless ``aio_min_group`` says otherwise.
    ``faults``: the journals' file operations (the fault seam); ``aio``: how the committer
    opens its AIO context."""

    async def main() -> Committer:
        loop = asyncio.get_running_loop()
        committer = Committer(loop, modes.__getitem__, aio_min_group, aio)
        files = DataDir(str(tmp_path), ops=faults) if faults is not None else None
        journals = {}
        for name in modes:
            j = FileJournal(str(tmp_path), name, on_dirty=committer.journal_dirty, directory=files)
            j.replay(Recorder())
            journals[name] = j
        try:
            body(committer, journals)
            await asyncio.sleep(0)
            await settle(committer)
        finally:
            for j in journals.values():
                j.close()
            committer.close()
        return committer

    return asyncio.run(main())


@both_paths
def test_sync_queue_reply_waits_for_write_and_fsync_of_its_pass(
    tmp_path: Path, fsync_path: str
) -> None:
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


@both_paths
def test_group_counters_and_unsynced_queues(tmp_path: Path, fsync_path: str) -> None:
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


@both_paths
def test_each_pass_that_writes_a_sync_queue_is_one_fsync(tmp_path: Path, fsync_path: str) -> None:
    def body(committer: Committer, journals: dict[str, FileJournal]) -> None:
        loop = asyncio.get_running_loop()

        def one_pass(n: int) -> None:
            for i in range(n):
                journals["s"].add(i + 1, 0, 0, b"x")
                committer.hold(Conn(journals["s"]), b"STORED\r\n")

        one_pass(4)
        loop.call_soon(one_pass, 2)

    committer = run_passes(tmp_path, {"s": 0}, body)
    assert (committer.fsyncs, committer.fsync_waits) == (2, 6)


@both_paths
def test_failed_group_fsync_drops_the_group_and_fails_the_journal(
    tmp_path: Path, fsync_path: str
) -> None:
    """The group's fdatasync fails (on the loop through the file seam, or an AIO completion
    with EIO): its replies are dropped, their connections failed, the journal refuses more."""
    conns: list[Conn] = []
    errors: list[int] = []
    faults = FaultyFiles()
    faults.fail("fdatasync", errno.EIO)

    def body(committer: Committer, journals: dict[str, FileJournal]) -> None:
        j = journals["s"]
        j.add(1, 0, 0, b"x")
        for _ in range(2):
            conn = Conn(j)
            committer.hold(conn, b"STORED\r\n")
            conns.append(conn)
        loop = asyncio.get_running_loop()
        loop.call_soon(lambda: errors.append(committer.write_errors))

    committer = run_passes(tmp_path, {"s": 0}, body, faults=faults, aio=failing_aio)
    assert all(c.failed and not c.released for c in conns)
    assert conns[0].journal.failed
    assert committer.write_errors == 1
    if fsync_path == "inline":
        assert errors == [1]  # counted in the pass itself (through AIO, when it completes)


@both_paths
def test_replies_held_during_a_group_fsync_follow_it_in_order(
    tmp_path: Path, fsync_path: str
) -> None:
    released: list[tuple[bytes, int]] = []  # reply, group fsyncs done when it went out
    seen_syncing: list[bool] = []

    def body(committer: Committer, journals: dict[str, FileJournal]) -> None:
        class Counting(Conn):
            def release(self, data: bytes) -> None:
                released.append((data, committer.fsyncs))

        conn = Counting(journals["s"])
        journals["s"].add(1, 0, 0, b"x" * 100)
        committer.hold(conn, b"1")  # queues the committer's pass

        def next_pass() -> None:  # runs after the committer's pass
            seen_syncing.append(committer.syncing)
            journals["s"].add(2, 0, 0, b"y")
            committer.hold(conn, b"2")
            committer.hold(conn, b"3")  # a reply with no record of its own: waits all the same

        asyncio.get_running_loop().call_soon(next_pass)

    committer = run_passes(tmp_path, {"s": 0}, body)
    assert released == [(b"1", 1), (b"2", 2), (b"3", 2)]
    assert committer.fsyncs == 2
    # Through AIO the loop went on while the kernel synced group 1; inline it waited.
    assert seen_syncing == [fsync_path == "aio"]


def small_then_big(probe: Callable[[Committer], object], seen: list[object]) -> Callable[..., None]:
    """A ``run_passes`` body: a pass with a group under AIO_MIN_GROUP (fsynced on the loop, at
    once), then a pass with a big one (through AIO); ``probe(committer)`` goes into ``seen``
    after each group has started."""

    def body(committer: Committer, journals: dict[str, FileJournal]) -> None:
        loop = asyncio.get_running_loop()

        def one_pass(payload: bytes) -> None:
            journals["s"].add(1, 0, 0, payload)
            committer.hold(Conn(journals["s"]), b"STORED\r\n")
            loop.call_soon(lambda: seen.append(probe(committer)))

        one_pass(b"x" * 1000)
        loop.call_soon(one_pass, b"x" * AIO_MIN_GROUP)

    return body


def test_small_groups_sync_on_the_loop_and_big_ones_through_aio(tmp_path: Path) -> None:
    needs_aio()
    syncing: list[object] = []
    body = small_then_big(lambda committer: committer.syncing, syncing)
    committer = run_passes(tmp_path, {"s": 0}, body, aio_min_group=AIO_MIN_GROUP)
    assert syncing == [False, True]
    assert (committer.fsyncs, committer.fsync_waits) == (2, 2)


def _eventfds() -> int:
    """How many eventfds this process has open (an AIO context brings one)."""
    fds = os.listdir("/proc/self/fd")
    return sum(_readlink(f"/proc/self/fd/{fd}") == "anon_inode:[eventfd]" for fd in fds)


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:  # closed since listed
        return ""


def test_the_aio_context_opens_with_the_first_big_group(tmp_path: Path) -> None:
    needs_aio()
    counts: list[object] = []
    passes = small_then_big(lambda _: _eventfds(), counts)

    def body(committer: Committer, journals: dict[str, FileJournal]) -> None:
        counts.append(_eventfds())  # the loop's own, before any group
        passes(committer, journals)

    run_passes(tmp_path, {"s": 0}, body, aio_min_group=AIO_MIN_GROUP)
    before = counts[0]
    assert isinstance(before, int)
    assert counts[1:] == [before, before + 1]  # none for the small group, one for the big


def test_flush_now_waits_for_the_aio_group_and_syncs_what_came_after(tmp_path: Path) -> None:
    needs_aio()
    released: list[bytes] = []
    after: list[tuple[bool, bool]] = []

    def body(committer: Committer, journals: dict[str, FileJournal]) -> None:
        class Noting(Conn):
            def release(self, data: bytes) -> None:
                released.append(data)

        conn = Noting(journals["s"])
        journals["s"].add(1, 0, 0, b"x")
        committer.hold(conn, b"1")

        def shutdown_pass() -> None:  # while group 1 syncs through AIO (threshold 0)
            journals["s"].add(2, 0, 0, b"y")
            committer.hold(conn, b"2")
            syncing = committer.syncing
            committer.flush_now()  # as Server.stop does
            after.append((syncing, committer.busy))

        asyncio.get_running_loop().call_soon(shutdown_pass)

    committer = run_passes(tmp_path, {"s": 0}, body)
    assert after == [(True, False)]  # flush_now returned with nothing left in flight
    assert released == [b"1", b"2"]
    assert committer.fsyncs == 2


def test_a_failed_aio_fsync_fails_its_group_and_the_journal(tmp_path: Path) -> None:
    needs_aio()
    conns: list[Conn] = []
    syncing: list[bool] = []

    def body(committer: Committer, journals: dict[str, FileJournal]) -> None:
        journals["s"].add(1, 0, 0, b"x")
        for _ in range(2):
            conns.append(Conn(journals["s"]))
            committer.hold(conns[-1], b"STORED\r\n")

        def in_flight() -> None:
            syncing.append(committer.syncing)

        asyncio.get_running_loop().call_soon(in_flight)

    committer = run_passes(tmp_path, {"s": 0}, body, aio=failing_aio)
    assert syncing == [True]  # the group went through AIO
    assert all(c.failed and not c.released for c in conns)
    assert committer.write_errors == 1
    assert conns[0].journal.failed


def test_a_write_failing_after_an_aio_group_fails_the_replies_that_waited(
    tmp_path: Path,
) -> None:
    needs_aio()
    conns: list[Conn] = []
    seen_syncing: list[bool] = []
    faults = FaultyFiles()

    def body(committer: Committer, journals: dict[str, FileJournal]) -> None:
        j = journals["s"]
        j.add(1, 0, 0, b"x" * 100)
        conns.append(Conn(j))
        committer.hold(conns[0], b"STORED\r\n")  # group 1, synced through AIO

        def next_pass() -> None:  # runs while group 1 is in flight
            seen_syncing.append(committer.syncing)
            j.add(2, 0, 0, b"y")
            conns.append(Conn(j))
            committer.hold(conns[1], b"STORED\r\n")  # waits behind group 1
            fail_writes(faults)  # ... and its record's write, after group 1, will fail

        asyncio.get_running_loop().call_soon(next_pass)

    committer = run_passes(tmp_path, {"s": 0}, body, faults=faults)
    assert seen_syncing == [True]
    assert conns[0].released and not conns[0].failed  # group 1 was written and synced
    assert conns[1].failed and not conns[1].released
    assert committer.write_errors == 1


def test_a_write_that_failed_earlier_in_the_pass_fails_its_held_replies(tmp_path: Path) -> None:
    conns: list[Conn] = []
    faults = FaultyFiles()

    def body(committer: Committer, journals: dict[str, FileJournal]) -> None:
        j = journals["s"]
        j.add(1, 0, 0, b"x")
        conns.append(Conn(j))
        committer.hold(conns[0], b"STORED\r\n")
        fail_writes(faults)
        with pytest.raises(JournalWriteError):  # as a rotation or a read-behind reader does
            j.write_out()

    committer = run_passes(tmp_path, {"s": None}, body, faults=faults)
    assert conns[0].failed and not conns[0].released
    assert committer.write_errors == 1


def test_aio_fdatasync_completes_on_the_eventfd(tmp_path: Path) -> None:
    aio = open_aio()
    if aio is None:
        pytest.skip("no native AIO on this system")
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    r, w = os.pipe()
    try:
        os.write(fd, b"data")
        aio.fdatasync(fd, 7)
        os.close(fd)  # the kernel holds its own reference to the file
        fd = -1
        ready, _, _ = select.select([aio.eventfd], [], [], 10)
        assert ready
        results = aio.reap()
        while aio.in_flight:  # pragma: no cover - the event came in pieces
            select.select([aio.eventfd], [], [], 10)
            results += aio.reap()
        assert results == [(7, 0)]
        with pytest.raises(OSError) as info:
            aio.fdatasync(r, 8)  # a pipe has no fsync: refused at submission
        assert info.value.errno == errno.EINVAL
        assert aio.in_flight == 0
    finally:
        for x in (fd, r, w):
            if x >= 0:
                os.close(x)
        aio.close()


def test_a_period_that_ends_during_another_sync_of_the_journal_syncs_one_period_later(
    tmp_path: Path,
) -> None:
    """A periodic queue whose timer fires while a sync of its file is already running (a
    rotation's, on the worker) is still synced afterwards, with no further write to arm a
    timer: the period bounds how long an acknowledged item stays unsynced."""

    async def main() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        committer = Committer(loop, {"p": 1}.__getitem__, 0)
        journal = FileJournal(str(tmp_path), "p", on_dirty=committer.journal_dirty)
        journal.replay(Recorder())
        try:
            journal.add(1, 0, 0, b"x")
            journal.syncing = True  # another owner's sync of this file is running
            committer.hold(Conn(journal), b"STORED\r\n")
            while committer.periodic_timer(journal) is None:  # the pass armed the period
                await asyncio.sleep(0)
            first = committer.periodic_timer(journal)
            while committer.periodic_timer(journal) is first:  # it ends during that sync
                await asyncio.sleep(0.001)
            journal.sync_done()  # the other sync ends without covering this record
            unsynced_after_other = journal.needs_sync
            deadline = time.monotonic() + 10
            while journal.needs_sync and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            return unsynced_after_other, journal.needs_sync
        finally:
            journal.close()
            committer.close()

    unsynced_after_other, still_unsynced = asyncio.run(main())
    assert unsynced_after_other
    assert not still_unsynced, "the record stayed unsynced with no further write"


@pytest.mark.parametrize(("solo", "mode"), [(True, None), (False, None), (True, 0)])
def test_a_lone_connections_pass_runs_at_the_end_of_its_batch(
    tmp_path: Path, solo: bool, mode: int | None
) -> None:
    """A batch (``Connection.data_received``) that asks for a pass: with ``solo`` (one
    connection, its read drained the socket) and no group fsync to run, the pass runs when
    the batch ends, the record written before the reply is released; otherwise (another
    connection, or a ``sync_journal = true`` queue) it is queued for the next loop pass, as
    every pass was before, so that other connections' batches of the pass join it."""
    conns: list[Conn] = []
    inline = solo and mode is None

    def body(committer: Committer, journals: dict[str, FileJournal]) -> None:
        before = os.path.getsize(journals["q"].path)
        committer.begin_batch()
        journals["q"].add(1, 0, 0, b"x" * 100)
        conn = Conn(journals["q"])
        committer.hold(conn, b"STORED\r\n")
        conns.append(conn)
        committer.end_batch(solo)
        if inline:  # done already: written, then released, no loop callback
            assert conn.released and conn.released[0][1] > before and not committer.busy
        else:
            assert not conn.released and committer.busy
        committer.begin_batch()  # a batch that asks for nothing leaves nothing behind
        committer.end_batch(solo)

    committer = run_passes(tmp_path, {"q": mode}, body, aio_min_group=1 << 30)
    assert [c.released[0][0] for c in conns] == [b"STORED\r\n"]
    assert committer.fsyncs == (mode == 0)
