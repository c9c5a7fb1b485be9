"""The server's status (Kestrel 2.4's ServerStatus): what clients may do right now.

========== ====== ======= ============================================================
status     reads  writes  notes
========== ====== ======= ============================================================
UP         yes    yes     the default
WRITEAVOID yes    yes     Kestrel only left the ZooKeeper write set; tercel has none
READONLY   yes    no      set, delete, flush, flush_all, flush_expired are refused
QUIESCENT  no     no      reads too; confirms and aborts of earlier open reads still work
========== ====== ======= ============================================================

Kestrel's transient DOWN cannot be set. The status is kept in ``<data_dir>/.status`` (a name
that can never be a queue's: queue names have no ``.``) as Kestrel's spelling plus a newline,
replaced atomically (tmp, fsync, rename, fsync dir), and read back at start-up.
"""

from __future__ import annotations

import enum
import logging
import os

from tercel.errors import UnavailableError

log = logging.getLogger(__name__)

STATUS_FILE = ".status"


class Status(enum.Enum):
    """A settable status; the value is Kestrel's spelling in its status file."""

    UP = "Up"
    WRITEAVOID = "WriteAvoid"
    READONLY = "ReadOnly"
    QUIESCENT = "Quiescent"

    @property
    def readable(self) -> bool:
        return self is not Status.QUIESCENT

    @property
    def writable(self) -> bool:
        return self in (Status.UP, Status.WRITEAVOID)


def parse_status(text: str) -> Status:
    """A status from its name in any case (``readonly``, ``ReadOnly``...).

    Raises ValueError naming the problem for anything else (including Kestrel's ``DOWN``,
    which is transient and cannot be set).
    """
    key = text.strip().upper().replace("_", "")
    if key == "DOWN":
        raise ValueError("status DOWN cannot be set")
    try:
        return Status[key]
    except KeyError:
        raise ValueError(f"unknown status {text.strip()[:40]!r}") from None


class StatusKeeper:
    """The current status of a server and its file in the data dir."""

    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, STATUS_FILE)
        self.current = Status.UP

    def load(self) -> Status:
        """Read the status file (missing: UP; unreadable or unknown: UP, logged)."""
        try:
            with open(self.path) as fh:
                text = fh.read()
        except FileNotFoundError:
            return self.current
        except OSError as exc:
            log.warning("cannot read %s (%s); status stays %s", self.path, exc, self.current.name)
            return self.current
        try:
            self.current = parse_status(text)
        except ValueError as exc:
            log.warning("ignoring %s: %s; status stays %s", self.path, exc, self.current.name)
        return self.current

    def set(self, status: Status) -> None:
        """Persist ``status``, then make it current. Raises OSError (status unchanged) when
        the file cannot be written."""
        if status is not self.current:
            _write_atomically(self.path, f"{status.value}\n".encode())
            log.info("status %s -> %s", self.current.name, status.name)
        self.current = status

    def check_readable(self) -> None:
        """Raise UnavailableError unless reads are allowed."""
        if not self.current.readable:
            raise UnavailableError(f"server is {self.current.name}: reads are refused")

    def check_writable(self) -> None:
        """Raise UnavailableError unless writes are allowed."""
        if not self.current.writable:
            raise UnavailableError(f"server is {self.current.name}: writes are refused")


def _write_atomically(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data``: tmp file, fsync, rename, fsync the directory."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
