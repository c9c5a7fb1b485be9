"""Durable writes without the page cache (``FileJournal.write_durably``).

A journal of a ``sync_journal = true`` queue writes each small group of records with one
``O_DIRECT`` + ``RWF_DSYNC`` write of whole 4 KiB blocks: the bytes of the file since the last
block boundary are written again, unchanged, and zeros fill the last block. These tests pin
that the file always reads as the records followed by zeros (so a crash image replays exactly),
that buffered writes and direct ones can follow each other in any order, and that the
fallback (no ``O_DIRECT``, or ``TERCEL_NO_DIRECT``) writes the same file.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest
from recorder import Recorder

from tercel.errors import JournalWriteError
from tercel.journal import FileJournal
from tercel.journal import journal as jmod


def direct_supported(path: Path) -> bool:
    """True when the file system under ``path`` takes O_DIRECT writes of 4 KiB blocks."""
    if not jmod.direct_writes_enabled():
        return False
    probe = path / "probe"
    probe.write_bytes(b"")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_DIRECT)
    except OSError:
        return False
    os.close(fd)
    probe.unlink()
    return True


needs_direct = pytest.mark.usefixtures("require_direct")


@pytest.fixture
def require_direct(tmp_path: Path) -> None:
    if not direct_supported(tmp_path):
        pytest.skip("this file system refuses O_DIRECT")


def held(path: Path, name: str = "q") -> FileJournal:
    """A journal whose owner writes nothing until told (as the server's committer)."""
    j = FileJournal(str(path), name, on_dirty=lambda _: None)
    j.replay(Recorder())
    return j


def replayed(path: Path, name: str = "q") -> list[bytes]:
    j = FileJournal(str(path), name)
    sink = Recorder()
    report = j.replay(sink)
    j.close()
    assert report.truncations == []  # zeros after the records are no torn tail
    return [e[4] for e in sink.events if isinstance(e, tuple) and e[0] == "add"]


def image_of(live: Path, dst: Path) -> Path:
    """The data directory as a crash would leave it: copied while the journal is open."""
    dst.mkdir()
    shutil.copy(live / "q", dst / "q")
    return dst


@needs_direct
def test_direct_groups_of_any_size_read_back_as_records_then_zeros(tmp_path: Path) -> None:
    rng = random.Random(7)
    live = tmp_path / "live"
    live.mkdir()
    j = held(live)
    payloads: list[bytes] = []
    for group in range(60):
        for _ in range(rng.randint(1, 12)):
            data = bytes([group % 251 + 1]) * rng.choice([1, 100, 1000, 4096, 5000, 20_000])
            j.add(len(payloads) + 1, 0, 0, data)
            payloads.append(data)
        if group % 7 == 3:
            j.remove()  # a record of its own kind (replay reports it; the adds stay listed)
        assert j.write_durably() > 0
        assert j._direct_fd >= 0  # the direct path, not the fallback
        assert not j.needs_sync
        raw = (live / "q").read_bytes()
        assert len(raw) % jmod.DIRECT_BLOCK == 0 and len(raw) >= j.current_size
        assert raw[j.current_size :] == bytes(len(raw) - j.current_size)
        if group % 10 == 9:
            assert replayed(image_of(live, tmp_path / f"crash{group}")) == payloads
    size = j.current_size
    j.close()
    assert (live / "q").stat().st_size == size  # close cuts the zeros
    assert replayed(live) == payloads


@needs_direct
def test_buffered_and_direct_writes_follow_each_other(tmp_path: Path) -> None:
    j = held(tmp_path)
    expect = []
    for i in range(12):
        data = b"%d" % i * (700 * (i + 1))
        j.add(i + 1, 0, 0, data)
        expect.append(data)
        if i % 3 == 0:
            j.write_out()  # through the page cache, not synced
        elif i % 3 == 1:
            j.write_durably()  # syncs the buffered bytes first (they are not covered)
            assert not j.needs_sync
        else:
            j.write_out()
            j.sync()
    j.write_durably()
    j.add(99, 0, 0, b"last")
    expect.append(b"last")
    j.write_durably()
    assert j.rotate()  # rotation writes, cuts the zeros, and starts a file of its own
    assert (tmp_path / "q.1").stat().st_size == j.size - j.current_size
    j.add(100, 0, 0, b"next file")
    expect.append(b"next file")
    j.write_durably()
    j.close()
    assert replayed(tmp_path) == expect


@needs_direct
def test_direct_writes_keep_space_ahead(tmp_path: Path) -> None:
    j = held(tmp_path)
    j.add(1, 0, 0, b"a")
    j.write_durably()
    ahead = (tmp_path / "q").stat().st_size - j.current_size
    assert ahead >= jmod.PREALLOCATE_FIRST  # the first durable write starts the steps
    for i in range(2, 200):
        j.add(i, 0, 0, b"x" * 3000)
        j.write_durably()
    assert (tmp_path / "q").stat().st_size > j.current_size
    j.close()
    assert len(replayed(tmp_path)) == 199


def test_without_direct_writes_the_file_is_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TERCEL_NO_DIRECT", "1")
    j = held(tmp_path)
    for i in range(20):
        j.add(i + 1, 0, 0, b"y" * (i * 300))
        j.write_durably()
        assert j._direct_fd < 0 and not j.needs_sync  # write_out and fdatasync
    j.close()
    assert replayed(tmp_path) == [b"y" * (i * 300) for i in range(20)]


@needs_direct
def test_a_failed_direct_write_fails_the_journal_and_keeps_what_was_durable(
    tmp_path: Path,
) -> None:
    j = held(tmp_path)
    j.add(1, 0, 0, b"kept")
    j.write_durably()
    kept = j.current_size
    r, w = os.pipe()
    os.dup2(w, j._direct_fd)  # the next direct write goes to a pipe: ESPIPE
    os.close(w)
    os.close(r)
    j.add(2, 0, 0, b"lost")
    with pytest.raises(JournalWriteError):
        j.write_durably()
    assert j.failed
    with pytest.raises(JournalWriteError):
        j.add(3, 0, 0, b"refused")
    assert (tmp_path / "q").stat().st_size == kept  # cut back to the last complete record
    j.close()
    assert replayed(tmp_path) == [b"kept"]


@pytest.mark.parametrize("direct", [True, False])
def test_records_a_reader_wrote_out_are_synced_by_the_next_durable_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct: bool
) -> None:
    if not direct:
        monkeypatch.setenv("TERCEL_NO_DIRECT", "1")
    j = held(tmp_path)
    start = j.position()
    j.add(1, 0, 0, b"read back before the group commit")
    reader = j.reader(start)
    assert reader.next_add() == (1, 0, 0, b"read back before the group commit")
    reader.close()
    assert j.needs_sync  # the reader wrote the buffer out through the page cache
    assert j.write_durably() == 0  # nothing left to write ...
    assert not j.needs_sync  # ... and what the reader wrote is synced
    j.close()
    assert replayed(tmp_path) == [b"read back before the group commit"]
