"""The job store's log port: :class:`JobLog`, what the store records so that jobs survive a
restart, and the compiled base :class:`NativeJobLog` the store actually calls.

The store calls a :class:`NativeJobLog`: compiled, its calls are native with unboxed
arguments. ``NativeJobLog`` itself logs nothing (``tercel beanstalkd`` without ``-b``); the
server's adapter of its job journal subclasses it (``JournalLog`` in
``server/beanstalk/service.py``: the journal may not import the core); any other
:class:`JobLog` (a test's recorder, the journal used directly) is wrapped in
:class:`ProtocolLog`, whose calls go through Python.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from mypy_extensions import mypyc_attr

from tercel.core.tubes.model import JobRecord

KeyRecord = tuple[str, int, int]
"""A dedup key as a compaction writes it: ``(key, job id, put time in wall ms)``."""


class JobLog(Protocol):
    """Where the store records what must survive a restart (see :mod:`tercel.core.tubes`)."""

    def put(  # noqa: PLR0917 (called for every put: no record object, no keywords)
        self,
        job_id: int,
        state: int,
        pri: int,
        delay: int,
        deadline_ms: int,
        tube: str,
        ttr: int,
        created_ms: int,
        body: bytes,
    ) -> int:
        """A new job (its counters are all 0); the number of the file its record lands in
        (:attr:`current_file`). Fields, not a :class:`JobRecord`: this runs for every put,
        and the record would be built only to be taken apart."""
        ...

    def put_keyed(  # noqa: PLR0917 (as put, and the key)
        self,
        job_id: int,
        state: int,
        pri: int,
        delay: int,
        deadline_ms: int,
        tube: str,
        ttr: int,
        created_ms: int,
        body: bytes,
        key: str,
    ) -> int:
        """:meth:`put` of a ``put-key``, with its dedup key in the same record."""
        ...

    def change(self, record: JobRecord) -> None:
        """A job's new state, priority, delay or deadline (and counters)."""
        ...

    def delete(self, job_id: int) -> None: ...

    @property
    def failed(self) -> bool:
        """True once a write failed (every later append raises)."""
        ...

    @property
    def current_file(self) -> int:
        """The number of the file a record logged now lands in (0: not journaled)."""
        ...

    @property
    def size(self) -> int:
        """Bytes the log occupies."""
        ...

    @property
    def compact_floor(self) -> int:
        """Below this size the log is never compacted."""
        ...

    def compact(
        self, next_id: int, jobs: Iterable[JobRecord], keys: Sequence[KeyRecord] = ()
    ) -> int | None:
        """Replace the log's history by these jobs (the whole state now) and dedup keys
        ``(key, job id, put wall ms)``; the number of the file that holds their records now,
        or None when the log put the compaction off (nothing changed: out of descriptors)
        and is to be asked again later."""
        ...


@mypyc_attr(allow_interpreted_subclasses=True)
class NativeJobLog:
    """A :class:`JobLog` as a compiled class: what the store calls. This one logs nothing; a
    subclass logs (see the module docstring: a call through the :class:`JobLog` protocol
    would look the method up and box every field, ~1k instructions per put)."""

    def put(  # noqa: PLR0917 (called for every put: no record object, no keywords)
        self,
        job_id: int,
        state: int,
        pri: int,
        delay: int,
        deadline_ms: int,
        tube: str,
        ttr: int,
        created_ms: int,
        body: bytes,
    ) -> int:
        return 0

    def put_keyed(  # noqa: PLR0917 (as JobLog.put_keyed)
        self,
        job_id: int,
        state: int,
        pri: int,
        delay: int,
        deadline_ms: int,
        tube: str,
        ttr: int,
        created_ms: int,
        body: bytes,
        key: str,
    ) -> int:
        return 0

    def change(self, record: JobRecord) -> None:
        pass

    def delete(self, job_id: int) -> None:
        pass

    @property
    def failed(self) -> bool:
        return False

    @property
    def size(self) -> int:
        return 0

    @property
    def compact_floor(self) -> int:
        return 0

    @property
    def current_file(self) -> int:
        return 0

    def compact(
        self, next_id: int, jobs: Iterable[JobRecord], keys: Sequence[KeyRecord] = ()
    ) -> int | None:
        return 0


class ProtocolLog(NativeJobLog):
    """Any :class:`JobLog` (one not compiled: a test's recorder), called through the protocol."""

    def __init__(self, log: JobLog) -> None:
        self.log = log

    def put(  # noqa: PLR0917 (as JobLog.put)
        self,
        job_id: int,
        state: int,
        pri: int,
        delay: int,
        deadline_ms: int,
        tube: str,
        ttr: int,
        created_ms: int,
        body: bytes,
    ) -> int:
        return self.log.put(job_id, state, pri, delay, deadline_ms, tube, ttr, created_ms, body)

    def put_keyed(  # noqa: PLR0917 (as JobLog.put_keyed)
        self,
        job_id: int,
        state: int,
        pri: int,
        delay: int,
        deadline_ms: int,
        tube: str,
        ttr: int,
        created_ms: int,
        body: bytes,
        key: str,
    ) -> int:
        return self.log.put_keyed(
            job_id, state, pri, delay, deadline_ms, tube, ttr, created_ms, body, key
        )

    def change(self, record: JobRecord) -> None:
        self.log.change(record)

    def delete(self, job_id: int) -> None:
        self.log.delete(job_id)

    @property
    def failed(self) -> bool:
        return self.log.failed

    @property
    def size(self) -> int:
        return self.log.size

    @property
    def compact_floor(self) -> int:
        return self.log.compact_floor

    @property
    def current_file(self) -> int:
        return self.log.current_file

    def compact(
        self, next_id: int, jobs: Iterable[JobRecord], keys: Sequence[KeyRecord] = ()
    ) -> int | None:
        return self.log.compact(next_id, jobs, keys)


def native_log(log: JobLog | NativeJobLog | None) -> NativeJobLog:
    """The log the store calls for ``log``: itself when compiled, a :class:`ProtocolLog`
    around any other, one that logs nothing for None (jobs live in memory only)."""
    if log is None:
        return NativeJobLog()
    return log if isinstance(log, NativeJobLog) else ProtocolLog(log)
