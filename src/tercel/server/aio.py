"""fdatasync without blocking the event loop: Linux native AIO's ``IOCB_CMD_FDSYNC``.

``io_submit`` hands the kernel an fdatasync of a file and returns at once; a kernel worker runs
it, and its completion is signalled on an eventfd the event loop watches. No Python thread
waits in the fsync, so nothing contends for the GIL when it ends (the worker-thread fsync
measured slower for that reason; docs/benchmarks.md). The kernel takes its own reference to
the file at submission: the descriptor may be closed (a rotation) while the fsync runs.

Three system calls through ``ctypes`` (x86-64 and arm64 Linux); :func:`open_aio` returns None
where they are missing or refused (another platform, a sandbox without AIO), and the committer
then fsyncs on the loop as before.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import struct
import sys
from typing import Final

log = logging.getLogger(__name__)

# System call numbers: (io_setup, io_destroy, io_getevents, io_submit).
_SYSCALLS: Final = {"x86_64": (206, 207, 208, 209), "aarch64": (0, 1, 4, 2)}
_IOCB_CMD_FDSYNC: Final = 3
_IOCB_FLAG_RESFD: Final = 1
_IOCB = struct.Struct("<QIIHhIQQqQII")  # struct iocb (64 bytes)
_EVENT = struct.Struct("<QQqq")  # struct io_event: data, obj, res, res2
MAX_IN_FLIGHT: Final = 256


class Aio:
    """One AIO context and its eventfd. Loop thread only."""

    def __init__(self, syscalls: tuple[int, int, int, int]) -> None:
        import ctypes  # here, not at start-up: only a server that syncs a group needs it

        _long = ctypes.c_long
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.syscall.restype = ctypes.c_long
        self._setup, self._destroy, self._getevents, self._submit = syscalls
        self._ctx = ctypes.c_ulong(0)
        if self._call(self._setup, _long(MAX_IN_FLIGHT), ctypes.byref(self._ctx)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"io_setup: {os.strerror(err)}")
        self.eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._iocb = ctypes.create_string_buffer(_IOCB.size)
        self._iocbs = (ctypes.c_void_p * 1)(ctypes.addressof(self._iocb))
        self._events = ctypes.create_string_buffer(_EVENT.size * MAX_IN_FLIGHT)
        self._no_wait = (ctypes.c_long * 2)(0, 0)
        self.in_flight = 0

    def _call(self, number: int, *args: object) -> int:
        """``syscall`` is variadic: every argument is passed as a C long, as the kernel
        reads it."""
        import ctypes

        return int(self._libc.syscall(ctypes.c_long(number), *args))

    def fdatasync(self, fd: int, tag: int) -> None:
        """Start an fdatasync of ``fd``; its completion comes back from :meth:`reap` with
        ``tag``. Raises OSError if the kernel refuses it."""
        _IOCB.pack_into(
            self._iocb, 0, tag, 0, 0, _IOCB_CMD_FDSYNC, 0, fd, 0, 0, 0, 0,
            _IOCB_FLAG_RESFD, self.eventfd,
        )  # fmt: skip
        import ctypes

        if self._call(self._submit, self._ctx, ctypes.c_long(1), self._iocbs) != 1:
            err = ctypes.get_errno()
            raise OSError(err, f"io_submit: {os.strerror(err)}")
        self.in_flight += 1

    def reap(self) -> list[tuple[int, int]]:
        """The ``(tag, result)`` of every finished fdatasync (result 0, or -errno); clears the
        eventfd. Never blocks."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.eventfd)
        return self._getevents_call(0, self._no_wait)

    def wait_all(self) -> list[tuple[int, int]]:
        """Block until every fdatasync in flight has completed; their ``(tag, result)``."""
        return self._getevents_call(self.in_flight, None)

    def _getevents_call(self, min_nr: int, timeout: object) -> list[tuple[int, int]]:
        """io_getevents for at least ``min_nr`` completions (``timeout`` None: wait for
        them; zero: do not wait), retried when a signal interrupts it."""
        import ctypes

        _long = ctypes.c_long
        while True:
            n = self._call(
                self._getevents, self._ctx, _long(min_nr), _long(MAX_IN_FLIGHT), self._events,
                timeout,
            )  # fmt: skip
            if n >= 0:
                break
            err = ctypes.get_errno()
            if err != errno.EINTR:
                raise OSError(err, f"io_getevents: {os.strerror(err)}")
        self.in_flight -= n
        out = []
        for i in range(n):
            tag, _obj, res, _res2 = _EVENT.unpack_from(self._events, i * _EVENT.size)
            out.append((tag, res))
        return out

    def close(self) -> None:
        self._call(self._destroy, self._ctx)
        os.close(self.eventfd)


def open_aio(kind: type[Aio] = Aio) -> Aio | None:
    """An AIO context (of ``kind``: a test's subclass may report failures), or None where
    native AIO is not available (logged at INFO)."""
    # os.uname(), not the platform module: ~2 ms of imports at start-up.
    syscalls = _SYSCALLS.get(os.uname().machine) if sys.platform == "linux" else None
    if syscalls is None or os.environ.get("TERCEL_NO_AIO"):
        return None
    try:
        return kind(syscalls)
    except OSError as exc:
        log.info("native AIO unavailable (%s): group fsyncs run on the event loop", exc)
        return None
