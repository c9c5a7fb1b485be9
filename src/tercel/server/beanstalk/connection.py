"""One beanstalkd client connection: the shared layer's pump running beanstalkd's requests.

:class:`BeanstalkConnection` is a :class:`~tercel.server.connection.Connection` (counted under
``beanstalk``): the base reads, runs every complete request of a read in order, holds the
replies in the group committer until the records they acknowledge are written (``INSERTED``
never precedes its record's write, nor, with ``-f0``, its fsync), applies back-pressure and
idle tracking. A ``reserve`` that has to wait *parks* the connection
(:meth:`Connection.park_untimed`: the job store keeps the wait's deadlines, wait timeout and
DEADLINE_SOON, on its one timer), so the requests pipelined after it wait too, as in
beanstalkd. The wait ends in :meth:`BeanstalkConnection._wake`, which the store calls from
another connection's command or from the timer: it records the reply, unparks and resumes the
pump with ``call_soon``, so no handler re-enters the store.

A half-close while parked answers ``TIMED_OUT`` (beanstalkd's behaviour); a close returns
every job this connection holds to ready at once (:meth:`JobStore.disconnect`).
"""

from __future__ import annotations

import logging
from typing import Any, Final

from tercel.core.tubes import (
    STATE_NAMES,
    WAKE_DEADLINE_SOON,
    WAKE_JOB,
    WAKE_TIMED_OUT,
    Job,
)
from tercel.errors import JournalWriteError, TercelError, TooManyKeys
from tercel.names import key_problem
from tercel.protocol import beanstalk as bp
from tercel.protocol.beanstalk import Command, Invalid, Request
from tercel.server import auth
from tercel.server.auth import Guard, User, held_in
from tercel.server.beanstalk.service import FRONT_END, BeanstalkService
from tercel.server.connection import Connection, Operation
from tercel.server.context import ServerContext

log = logging.getLogger("tercel.beanstalk")

_RESERVED: Final = b"RESERVED"
_FOUND: Final = b"FOUND"
STATE_WORDS: Final = {k: v.encode("ascii") for k, v in STATE_NAMES.items()}
_WAKE_REPLIES: Final = {WAKE_TIMED_OUT: bp.TIMED_OUT, WAKE_DEADLINE_SOON: bp.DEADLINE_SOON}
_JOB_RIGHTS: Final = dict.fromkeys(
    ("peek", "reserve-job", "delete", "release", "bury", "touch"), auth.TAKE
) | {"kick-job": auth.MANAGE}
"""The right a user needs on a job's tube for the commands that name a job."""


class BeanstalkConnection(Connection):
    """One beanstalkd client of ``svc``'s server (see the module docstring)."""

    def __init__(self, ctx: ServerContext, svc: BeanstalkService) -> None:
        super().__init__(ctx, FRONT_END)
        self.svc = svc
        self.store = svc.store
        self.codec = bp.BeanstalkCodec(svc.max_job_size)
        self.worker = svc.store.connect(self._wake)
        self.pending: list[Request] = []
        """Requests the codec completed; those from :attr:`next` on have not run yet (they
        wait behind a parked reserve). A list and an index, not a deque: compiled, indexing
        and ``extend`` are C calls where a deque's methods are Python calls."""
        self.next = 0
        self.op = ""
        """The request running (its error reply depends on it)."""
        self.producer = False
        """Has sent a ``put`` (``current-producers``)."""
        self.consumer = False
        """Has sent a reserve (``current-workers``)."""

    # ---- the shared layer's hooks ---------------------------------------------------------

    def feed(self, data: bytes) -> None:
        requests = self.codec.feed(data)
        if self.next >= len(self.pending):
            self.pending = requests
            self.next = 0
        else:
            self.pending.extend(requests)

    def buffered(self) -> int:
        return self.codec.buffered + len(self.pending) - self.next

    def next_command(self) -> Any:
        if self.next >= len(self.pending):
            return None
        req = self.pending[self.next]
        self.next += 1
        return req

    def dispatch(self, cmd: Any) -> None:
        # Typed once here: compiled, every field of an ``Any`` is a generic attribute lookup
        # and every comparison and index of its ints a Python call (about 1,000 instructions a
        # request, measured with callgrind).
        req: Request = cmd
        counts = self.svc.cmd_counts
        guard = self.guard  # None without users: this one test (docs/operations.md)
        if guard is not None and not self.admit(guard, req):
            return
        if isinstance(req, Invalid):
            if req.code != bp.NO_CODE:
                counts[req.code] += 1
            if req.reply == bp.EXPECTED_CRLF:
                self.store.next_id += 1  # beanstalkd gave the rejected job an id too
            self.out.append(req.reply)
            return
        code = req.code
        self.op = req.op
        if code < bp.COUNTED:  # counted before the command runs, as beanstalkd
            counts[code] = counts[code] + 1  # (compiled, ``+=`` is a Python call)
        # The loop's own requests by direct (compiled) calls; the rest by the table.
        if code == bp.PUT:
            self._put(req)
        elif code == bp.RESERVE_WITH_TIMEOUT or code == bp.RESERVE:
            self._reserve(req)
        elif code == bp.DELETE:
            self._delete(req)
        else:
            self.perform(_TABLE[req.op], req)

    def run(self) -> None:
        """The base's dispatch loop with :meth:`next_command` inlined (compiled, a call per
        request saved; as memcache does), then: drop what ran, rearm the job store's timer."""
        try:
            while self.next < len(self.pending) and self.parked is None and not self.closing:
                req = self.pending[self.next]
                self.next += 1
                self.dispatch(req)
        finally:
            if self.next >= len(self.pending):  # drop what ran (bodies) now, not next read
                self.pending = []
                self.next = 0
            self.svc.rearm()

    def error_reply(self, exc: TercelError) -> None:
        """A log that refuses writes acknowledged nothing: beanstalkd answers a ``put`` it
        cannot log with ``OUT_OF_MEMORY``; anything else gets ``INTERNAL_ERROR``."""
        if isinstance(exc, JournalWriteError) and self.op in ("put", "put-key"):
            self.out.append(bp.OUT_OF_MEMORY)
        else:
            self.out.append(bp.INTERNAL_ERROR)

    def refusal(self, reason: str) -> bytes:
        return bp.INTERNAL_ERROR

    def over_budget(self) -> bytes:
        return bp.OUT_OF_MEMORY

    # ---- users (tercel's extension: docs/protocol.md, "Users") -----------------------------

    def admit(self, guard: Guard, req: Request) -> bool:
        """Whether the connection's user may run ``req`` (the refusal is answered if not):
        nothing but ``auth`` before a login; then put needs put on the used tube, reserve
        take on every watched tube, peek-ready/-delayed/-buried take on the used tube, the
        job commands take on the job's tube (stats-job: nothing), kick manage on the used
        tube, kick-job and pause-tube manage on theirs; the rest nothing."""
        if isinstance(req, Invalid):
            return guard.current() is not None or guard.refuse_unauthenticated(self, "a command")
        op = req.op
        if op == "auth":
            return True
        user = guard.current()
        if user is None:
            return guard.refuse_unauthenticated(self, op)
        use = self.worker.use
        used = "default" if use is None else use.name
        if op in ("put", "put-key"):
            if guard.fast(auth.PUT, used):
                return True
            return guard.allows(self, auth.PUT, used, op, False) and guard.within_limits(self)
        if op == "reserve" or op == "reserve-with-timeout":
            return all(
                guard.fast(auth.TAKE, name) or guard.allows(self, auth.TAKE, name, op, False)
                for name in self.worker.watch
            )
        if op in ("peek-ready", "peek-delayed", "peek-buried"):
            return guard.allows(self, auth.TAKE, used, op, False)
        if op == "kick":
            return guard.allows(self, auth.MANAGE, used, op, False)
        if op == "pause-tube":
            return guard.allows(self, auth.MANAGE, req.tube, op, False)
        right = _JOB_RIGHTS.get(op)
        if right is None:
            return True
        job = self.store.peek(req.job_id)
        return job is None or guard.allows(self, right, job.tube.name, op, False)

    def held(self, user: User) -> tuple[int, int]:
        """Jobs in the tubes ``user`` may put to (every state); bytes are not counted per
        tube, so ``max_bytes`` does not apply here."""
        return held_in(
            user,
            (
                (t.name, t.ready_count + t.delayed_count + t.buried_count + t.reserved_count, 0)
                for t in self.store.tubes.values()
            ),
        )

    def denied(self, kind: int, message: str) -> None:
        """``UNAUTHORIZED`` before a login; ``PERMISSION_DENIED <what>`` and
        ``LIMIT_EXCEEDED <what>`` after it (tercel's words: beanstalkd has none)."""
        if kind == auth.UNAUTHENTICATED:
            self.out.append(bp.UNAUTHORIZED)
            return
        word = "PERMISSION_DENIED" if kind == auth.DENIED else "LIMIT_EXCEEDED"
        detail = message.partition(": ")[2] or message
        text = " ".join(detail.split()).encode("ascii", "replace")
        self.out.append(word.encode() + b" " + text + bp.CRLF)

    def auth_reply(self, cmd: Any, failure: str | None) -> None:
        self.out.append(bp.AUTH_OK if failure is None else bp.AUTH_FAILED)

    def _auth(self, c: Command) -> None:
        guard = self.guard
        if guard is None:  # a server without users: beanstalkd's answer
            self.out.append(bp.UNKNOWN_COMMAND)
            return
        name, space, password = c.body.partition(b" ")
        if not space or not name:
            self.out.append(bp.BAD_FORMAT)
            return
        guard.login(self, c, name.decode("utf-8", "replace"), password)

    # ---- asyncio callbacks beyond the base's ----------------------------------------------

    def eof_received(self) -> bool | None:
        """Half-close: a parked reserve answers ``TIMED_OUT`` (the requests behind it still
        run); close once the replies are out."""
        while self.parked is not None and self.store.cancel_wait(self.worker):
            self.parked = None
            self.out.append(bp.TIMED_OUT)
            self.process()
        return super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.producer:
            self.svc.producers -= 1
        if self.consumer:
            self.svc.workers -= 1
        self.store.disconnect(self.worker)
        self.svc.rearm()

    def _wake(self, job: Job | None, why: int) -> None:
        """The store ended this connection's wait (inside another command or the timer)."""
        if self.parked is None:
            return
        self.parked = None
        if why == WAKE_JOB and job is not None:
            self.out.extend(bp.job_reply_parts(_RESERVED, job.id, job.body))
        else:
            self.out.append(_WAKE_REPLIES[why])
        self.resume_soon()

    # ---- handlers -------------------------------------------------------------------------

    def _put(self, c: Command) -> None:
        if not self.producer:
            self.producer = True
            self.svc.producers += 1
        if self.svc.draining or not self.ctx.writable:
            self.out.append(bp.DRAINING)
            return
        job = self.store.put(self.worker, c.pri, c.delay, c.ttr, c.body)
        self.out.append(bp.id_reply(b"INSERTED", job.id))

    def _put_key(self, c: Command) -> None:
        """``put-key <key> <pri> <delay> <ttr> <bytes>`` (tercel's, docs/protocol.md "Dedup
        keys"): ``INSERTED <id>``, the id of the job an earlier ``put-key`` with the key
        made within the window when there is one (nothing put); ``BAD_KEY <rule>`` for a
        key that breaks the rule, ``TOO_MANY_KEYS <why>`` when the store holds
        ``max_dedup_keys`` keys younger than the window (nothing put either way)."""
        if not self.producer:
            self.producer = True
            self.svc.producers += 1
        if self.svc.draining or not self.ctx.writable:
            self.out.append(bp.DRAINING)
            return
        why = key_problem(c.tube)
        if why is not None:
            self.out.append(bp.word_reply(b"BAD_KEY", why))
            return
        try:
            _, job_id = self.store.put_keyed(self.worker, c.tube, c.pri, c.delay, c.ttr, c.body)
        except TooManyKeys as exc:
            self.out.append(bp.word_reply(b"TOO_MANY_KEYS", exc.reason or str(exc)))
            return
        self.out.append(bp.id_reply(b"INSERTED", job_id))

    def _use(self, c: Command) -> None:
        self.store.use(self.worker, c.tube)
        self.out.append(bp.name_reply(b"USING", c.tube))

    def _reserve(self, c: Command) -> None:
        if not self.consumer:
            self.consumer = True
            self.svc.workers += 1
        timeout = bp.FOREVER if c.op == "reserve" else c.timeout
        if not self.ctx.readable:
            self.out.append(bp.TIMED_OUT)
            return
        job, why = self.store.reserve(self.worker, timeout)
        if job is not None:
            self.out.extend(bp.job_reply_parts(_RESERVED, job.id, job.body))
        elif why >= 0:
            self.out.append(_WAKE_REPLIES[why])
        else:
            self.park_untimed(c, self.worker, bp.TIMED_OUT)

    def _reserve_job(self, c: Command) -> None:
        job = self.store.reserve_job(self.worker, c.job_id)
        if job is None:
            self.out.append(bp.NOT_FOUND)
        else:
            self.out.extend(bp.job_reply_parts(_RESERVED, job.id, job.body))

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
            self.out.extend(bp.job_reply_parts(_FOUND, job.id, job.body))

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
                    ("file", job.file),
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
        self.out.append(bp.yaml_dict(self.svc.tube_stats(tube)))

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


_TABLE: Final[dict[str, Operation]] = {
    op: Operation(op, getattr(BeanstalkConnection, name), 0, auth.LOGIN if op == "auth" else 0)
    for op, name in (
        ("put", "_put"),
        ("put-key", "_put_key"),
        ("use", "_use"),
        ("reserve", "_reserve"),
        ("reserve-with-timeout", "_reserve"),
        ("reserve-job", "_reserve_job"),
        ("delete", "_delete"),
        ("release", "_release"),
        ("bury", "_bury"),
        ("touch", "_touch"),
        ("watch", "_watch"),
        ("ignore", "_ignore"),
        ("peek", "_peek"),
        ("peek-ready", "_peek_state"),
        ("peek-delayed", "_peek_state"),
        ("peek-buried", "_peek_state"),
        ("kick", "_kick"),
        ("kick-job", "_kick_job"),
        ("stats", "_stats"),
        ("stats-job", "_stats_job"),
        ("stats-tube", "_stats_tube"),
        ("list-tubes", "_list_tubes"),
        ("list-tube-used", "_list_tube_used"),
        ("list-tubes-watched", "_list_tubes_watched"),
        ("pause-tube", "_pause_tube"),
        ("quit", "_quit"),
        ("auth", "_auth"),
    )
}
"""Every request but the loop's own (put, reserve, delete: direct calls in :meth:`dispatch`),
by name; built once, shared by every connection. Access 0: beanstalkd has no server status.
A user's rights are checked before (:meth:`BeanstalkConnection.admit`): right 0 here, but
``auth``'s, which runs before a login."""
