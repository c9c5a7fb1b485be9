"""One beanstalkd client connection: the codec's requests, run in order against the store.

The pump: :meth:`data_received` feeds the codec and queues the requests it completes; the
pump runs them one by one until a ``reserve`` has to wait (the connection is *parked*: the
requests pipelined after it wait too, as in beanstalkd), then writes all the replies of the
pass at once — through the group committer when records are being written, so ``INSERTED``
never precedes its record's write (and, with ``-f0``, its fsync). A parked reserve ends in
:meth:`_wake`, which the store calls from another connection's command or from the timer: it
records the reply and resumes the pump with ``call_soon``, so no handler re-enters the store.

A half-close while parked answers ``TIMED_OUT`` (beanstalkd's behaviour); a close returns
every job this connection holds to ready at once (:meth:`JobStore.disconnect`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Final

from tercel.core.tubes import (
    STATE_NAMES,
    WAKE_DEADLINE_SOON,
    WAKE_JOB,
    WAKE_TIMED_OUT,
    Job,
)
from tercel.errors import JournalWriteError
from tercel.protocol import beanstalk as bp
from tercel.protocol.beanstalk import Command, Invalid, Request
from tercel.server.beanstalk.service import BeanstalkService

log = logging.getLogger("tercel.beanstalk")

MAX_PENDING: Final = 1024 * 1024
"""Stop reading from a parked client once this many bytes of requests wait behind it."""

_RESERVED: Final = b"RESERVED"
_FOUND: Final = b"FOUND"
STATE_WORDS: Final = {k: v.encode("ascii") for k, v in STATE_NAMES.items()}
_WAKE_REPLIES: Final = {WAKE_TIMED_OUT: bp.TIMED_OUT, WAKE_DEADLINE_SOON: bp.DEADLINE_SOON}


class BeanstalkConnection:
    """An asyncio protocol by duck typing (the loop only calls the protocol methods)."""

    def __init__(self, svc: BeanstalkService) -> None:
        self.svc = svc
        self.store = svc.store
        self.codec = bp.BeanstalkCodec(svc.max_job_size)
        self.worker = svc.store.connect(self._wake)
        self.pending: deque[Request] = deque()
        self.out: list[bytes] = []
        self.transport: asyncio.Transport | None = None
        self.parked = False
        self.closing = False
        self.producer = False
        """Has sent a ``put`` (``current-producers``)."""
        self.consumer = False
        """Has sent a reserve (``current-workers``)."""
        self._held = 0
        self._resume_scheduled = False
        self._handlers: dict[str, Callable[[Command], None]] = {
            "put": self._put,
            "use": self._use,
            "reserve": self._reserve,
            "reserve-with-timeout": self._reserve,
            "reserve-job": self._reserve_job,
            "delete": self._delete,
            "release": self._release,
            "bury": self._bury,
            "touch": self._touch,
            "watch": self._watch,
            "ignore": self._ignore,
            "peek": self._peek,
            "peek-ready": self._peek_state,
            "peek-delayed": self._peek_state,
            "peek-buried": self._peek_state,
            "kick": self._kick,
            "kick-job": self._kick_job,
            "stats": self._stats,
            "stats-job": self._stats_job,
            "stats-tube": self._stats_tube,
            "list-tubes": self._list_tubes,
            "list-tube-used": self._list_tube_used,
            "list-tubes-watched": self._list_tubes_watched,
            "pause-tube": self._pause_tube,
            "quit": self._quit,
        }

    # ---- asyncio callbacks ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        t: asyncio.Transport = transport  # type: ignore[assignment]
        self.transport = t
        self.svc.connections.add(self)
        self.svc.total_connections += 1

    def data_received(self, data: bytes) -> None:
        self.pending.extend(self.codec.feed(data))
        if not self.parked:
            self.process()
        elif self.codec.buffered + len(self.pending) > MAX_PENDING and self.transport:
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        """Half-close: a parked reserve answers TIMED_OUT; close once the replies are out."""
        if self.parked and self.store.cancel_wait(self.worker):
            self.parked = False
            self.out.append(bp.TIMED_OUT)
        self.process()
        self.closing = True
        self.flush()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.parked = False
        self.transport = None
        self.svc.connections.discard(self)
        self.store.disconnect(self.worker)
        self.svc.rearm()

    def pause_writing(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.parked:
            self.transport.resume_reading()

    def abort(self) -> None:
        """Server shutdown: close now (the jobs held go back to ready)."""
        if self.transport is not None:
            self.transport.close()

    # ---- the pump -------------------------------------------------------------------------

    def process(self) -> None:
        """Run queued requests until one parks or the connection closes; flush the replies."""
        pending = self.pending
        while pending and not self.parked and not self.closing:
            req = pending.popleft()
            if isinstance(req, Invalid):
                if req.op:
                    self.svc.cmd[req.op] += 1
                if req.reply == bp.EXPECTED_CRLF:
                    self.store.next_id += 1  # beanstalkd gave the rejected job an id too
                self.out.append(req.reply)
                continue
            counter = self.svc.cmd
            if req.op in counter:
                counter[req.op] += 1  # counted before the command runs, as beanstalkd
            try:
                self._handlers[req.op](req)
            except JournalWriteError:
                # The log refuses writes: nothing was acknowledged. beanstalkd answers a put
                # it cannot log with OUT_OF_MEMORY.
                self.out.append(bp.OUT_OF_MEMORY if req.op == "put" else bp.INTERNAL_ERROR)
            except Exception:
                log.exception("bug while serving %s; closing the connection", req.op)
                self.out.clear()
                self.closing = True
        self.svc.rearm()
        self.flush()
        if not self.parked and self.transport is not None and not self.closing:
            self.transport.resume_reading()

    def flush(self) -> None:
        out = self.out
        if out:
            data = b"".join(out)
            out.clear()
            committer = self.svc.committer
            if committer.holding:
                committer.hold(self, data)
                self._held += 1
                return
            self._write(data)
        elif self.closing and self.transport is not None and not self._held:
            self.transport.close()

    def release(self, data: bytes) -> None:
        """The committer wrote what these replies acknowledge."""
        self._held -= 1
        self._write(data)

    def fail(self) -> None:
        """The records these replies acknowledge could not be written: close without them."""
        self._held -= 1
        if self.transport is not None:
            self.transport.abort()

    def _write(self, data: bytes) -> None:
        t = self.transport
        if t is None:
            return
        t.write(data)
        if self.closing and not self._held:
            t.close()

    def _wake(self, job: Job | None, why: int) -> None:
        """The store ended this connection's wait (inside another command or the timer)."""
        self.parked = False
        if why == WAKE_JOB and job is not None:
            self.out.append(bp.job_reply(_RESERVED, job.id, job.body))
        else:
            self.out.append(_WAKE_REPLIES[why])
        if not self._resume_scheduled:
            self._resume_scheduled = True
            self.svc.loop.call_soon(self._resume)

    def _resume(self) -> None:
        self._resume_scheduled = False
        if self.transport is not None:
            self.process()

    # ---- handlers -------------------------------------------------------------------------

    def _put(self, c: Command) -> None:
        self.producer = True
        if self.svc.draining or not self.svc.writable:
            self.out.append(bp.DRAINING)
            return
        job = self.store.put(self.worker, c.pri, c.delay, c.ttr, c.body)
        self.out.append(bp.id_reply(b"INSERTED", job.id))

    def _use(self, c: Command) -> None:
        self.store.use(self.worker, c.tube)
        self.out.append(bp.name_reply(b"USING", c.tube))

    def _reserve(self, c: Command) -> None:
        self.consumer = True
        timeout = bp.FOREVER if c.op == "reserve" else c.timeout
        if not self.svc.readable:
            self.out.append(bp.TIMED_OUT)
            return
        job, why = self.store.reserve(self.worker, timeout)
        if job is not None:
            self.out.append(bp.job_reply(_RESERVED, job.id, job.body))
        elif why >= 0:
            self.out.append(_WAKE_REPLIES[why])
        else:
            self.parked = True

    def _reserve_job(self, c: Command) -> None:
        job = self.store.reserve_job(self.worker, c.job_id)
        if job is None:
            self.out.append(bp.NOT_FOUND)
        else:
            self.out.append(bp.job_reply(_RESERVED, job.id, job.body))

    def _answer(self, ok: bool, reply: bytes) -> None:
        self.out.append(reply if ok else bp.NOT_FOUND)

    def _delete(self, c: Command) -> None:
        self._answer(self.store.delete(self.worker, c.job_id), bp.DELETED)

    def _release(self, c: Command) -> None:
        self._answer(self.store.release(self.worker, c.job_id, c.pri, c.delay), bp.RELEASED)

    def _bury(self, c: Command) -> None:
        self._answer(self.store.bury(self.worker, c.job_id, c.pri), bp.BURIED)

    def _touch(self, c: Command) -> None:
        self._answer(self.store.touch(self.worker, c.job_id), bp.TOUCHED)

    def _watch(self, c: Command) -> None:
        self.out.append(bp.id_reply(b"WATCHING", self.store.watch(self.worker, c.tube)))

    def _ignore(self, c: Command) -> None:
        n = self.store.ignore(self.worker, c.tube)
        self.out.append(bp.NOT_IGNORED if n < 0 else bp.id_reply(b"WATCHING", n))

    def _found(self, job: Job | None) -> None:
        if job is None:
            self.out.append(bp.NOT_FOUND)
        else:
            self.out.append(bp.job_reply(_FOUND, job.id, job.body))

    def _peek(self, c: Command) -> None:
        self._found(self.store.peek(c.job_id))

    def _peek_state(self, c: Command) -> None:
        if c.op == "peek-ready":
            self._found(self.store.peek_ready(self.worker))
        elif c.op == "peek-delayed":
            self._found(self.store.peek_delayed(self.worker))
        else:
            self._found(self.store.peek_buried(self.worker))

    def _kick(self, c: Command) -> None:
        self.out.append(bp.id_reply(b"KICKED", self.store.kick(self.worker, c.count)))

    def _kick_job(self, c: Command) -> None:
        self._answer(self.store.kick_job(c.job_id), bp.KICKED)

    def _stats(self, c: Command) -> None:
        self.out.append(bp.yaml_dict(self.svc.stats()))

    def _stats_job(self, c: Command) -> None:
        store = self.store
        job = store.peek(c.job_id)
        if job is None:
            self.out.append(bp.NOT_FOUND)
            return
        self.out.append(
            bp.yaml_dict(
                [
                    ("id", job.id),
                    ("tube", job.tube.name),
                    ("state", STATE_WORDS[job.state]),
                    ("pri", job.pri),
                    ("age", store.age(job)),
                    ("delay", job.delay),
                    ("ttr", job.ttr),
                    ("time-left", store.time_left(job)),
                    ("file", 0),
                    ("reserves", job.reserves),
                    ("timeouts", job.timeouts),
                    ("releases", job.releases),
                    ("buries", job.buries),
                    ("kicks", job.kicks),
                ]
            )
        )

    def _stats_tube(self, c: Command) -> None:
        store = self.store
        tube = store.tubes.get(c.tube)
        if tube is None:
            self.out.append(bp.NOT_FOUND)
            return
        self.out.append(
            bp.yaml_dict(
                [
                    ("name", tube.name),
                    ("current-jobs-urgent", tube.urgent_count),
                    ("current-jobs-ready", tube.ready_count),
                    ("current-jobs-reserved", tube.reserved_count),
                    ("current-jobs-delayed", tube.delayed_count),
                    ("current-jobs-buried", tube.buried_count),
                    ("total-jobs", tube.total_jobs),
                    ("current-using", tube.using),
                    ("current-watching", tube.watching),
                    ("current-waiting", len(tube.waiting)),
                    ("cmd-delete", tube.cmd_delete),
                    ("cmd-pause-tube", tube.cmd_pause),
                    ("pause", tube.pause),
                    ("pause-time-left", store.pause_left(tube)),
                ]
            )
        )

    def _list_tubes(self, c: Command) -> None:
        self.out.append(bp.yaml_list(list(self.store.tubes)))

    def _list_tube_used(self, c: Command) -> None:
        assert self.worker.use is not None
        self.out.append(bp.name_reply(b"USING", self.worker.use.name))

    def _list_tubes_watched(self, c: Command) -> None:
        self.out.append(bp.yaml_list(list(self.worker.watch)))

    def _pause_tube(self, c: Command) -> None:
        self._answer(self.store.pause(c.tube, c.delay), bp.PAUSED)

    def _quit(self, c: Command) -> None:
        self.closing = True
