"""Restarts from a checkpoint, with real server processes on one data dir: after a clean
SIGTERM (the checkpoint written at shutdown), after a SIGKILL (the one written every
``CHECKPOINT_EVERY`` bytes), and with a checkpoint that no longer fits (full replay)."""

from __future__ import annotations

from pathlib import Path

from support import Raw, drain, set_cmd
from tercel.journal.journal import CHECKPOINT_EVERY
from tercel.testing import ServerProcess

CONFIG = '[queues]\nmax_memory_size = "64KB"\n'  # read-behind: most items stay on disk
USED = "replay starts at the checkpoint"


def fill(conn: Raw, count: int, size: int, start: int = 0) -> None:
    for base in range(start, start + count, 100):
        n = min(100, start + count - base)
        batch = b"".join(
            set_cmd("q", b"%08d" % i + b"x" * (size - 8)) for i in range(base, base + n)
        )
        conn.call(batch, b"STORED\r\n" * n)


def take(conn: Raw, count: int) -> list[bytes]:
    out = []
    for _ in range(count):
        conn.send(b"get q\r\n")
        line = conn.read_line()
        out.append(conn.read_exact(int(line.split()[3]))[:8])
        conn.expect(b"\r\nEND\r\n")
    return out


def test_sigterm_leaves_a_checkpoint_the_next_start_replays_from(data_dir: Path) -> None:
    with ServerProcess(data_dir, CONFIG, log_level="info") as srv:
        conn = Raw(srv.connect())
        fill(conn, 2000, 1000)
        assert take(conn, 500) == [b"%08d" % i for i in range(500)]
        conn.close()
        assert srv.stop() == 0
        assert (data_dir / "q.checkpoint").exists()
        srv.start()
        assert USED in srv.log()
        conn = Raw(srv.connect())
        fill(conn, 10, 1000, start=2000)  # appended behind the replayed items
        assert [i[:8] for i in drain(conn, "q")] == [b"%08d" % i for i in range(500, 2010)]


def test_sigkill_restarts_from_the_last_periodic_checkpoint(data_dir: Path) -> None:
    size = 10_000
    count = CHECKPOINT_EVERY // size + 200  # past the first periodic checkpoint
    with ServerProcess(data_dir, CONFIG, log_level="info") as srv:
        conn = Raw(srv.connect())
        fill(conn, count, size)
        assert take(conn, 7) == [b"%08d" % i for i in range(7)]
        srv.kill()
        assert (data_dir / "q.checkpoint").exists()
        srv.start()
        assert USED in srv.log()
        conn = Raw(srv.connect())
        assert [i[:8] for i in drain(conn, "q")] == [b"%08d" % i for i in range(7, count)]


def test_a_checkpoint_that_no_longer_fits_is_ignored(data_dir: Path) -> None:
    with ServerProcess(data_dir, CONFIG, log_level="info") as srv:
        conn = Raw(srv.connect())
        fill(conn, 300, 1000)
        conn.close()
        assert srv.stop() == 0
        ck = data_dir / "q.checkpoint"
        raw = bytearray(ck.read_bytes())
        raw[9] ^= 0xFF  # the end position, its checksum no longer matching
        ck.write_bytes(raw)
        srv.start()
        log = srv.log()
        assert USED not in log
        assert "not using the checkpoint (damaged)" in log
        conn = Raw(srv.connect())
        assert [i[:8] for i in drain(conn, "q")] == [b"%08d" % i for i in range(300)]
