"""beanstalkd's text protocol (1.12), server side: bytes -> commands, replies -> bytes.

Contract of :class:`BeanstalkCodec`: :meth:`feed` takes whatever bytes arrived and returns
every request they complete, in order: a :class:`Command` for a well-formed request, an
:class:`Invalid` (carrying the exact error reply) for one beanstalkd rejects. Nothing is ever
fatal: beanstalkd never closes a connection over a protocol error, and neither does this
codec. Bytes of an incomplete request stay buffered until the next :meth:`feed`.

Parsing follows beanstalkd's ``prot.c`` rule by rule (verified against Debian 1.12):

- A command line is at most 224 bytes, CRLF included. A longer line is thrown away up to the
  next CRLF and answered ``BAD_FORMAT``. A NUL byte anywhere in the line gives ``BAD_FORMAT``.
- Commands are recognised by prefix, in beanstalkd's order (``peek `` before ``peek-ready``,
  ``reserve-with-timeout `` before ``reserve``, ``stats-job `` before ``stats``...): a line
  that starts like a command but does not parse gives ``BAD_FORMAT``, anything else
  ``UNKNOWN_COMMAND`` (so ``kick`` without a space is unknown, ``stats `` is badly formed).
- Numbers are unsigned decimal; spaces before each number are skipped; ids are u64, pri,
  delay, ttr and sizes u32. Trailing bytes after the last number give ``BAD_FORMAT`` except
  where beanstalkd uses ``strtol``/``strtoul`` (``reserve-with-timeout``, ``kick``), which
  stop at the first non-digit and take a missing number as 0 (``reserve-with-timeout``) or
  reject it (``kick``); a negative reserve timeout waits forever. The kick bound is read as
  a 64-bit unsigned number (a negative one wraps, one beyond 2**64 - 1 is ``BAD_FORMAT``) and
  kept modulo 2**32, as beanstalkd's ``uint count``: ``kick 4294967296`` kicks nothing.
- ``put``: a declared size above the limit gives ``JOB_TOO_BIG`` after exactly size + 2 bytes
  are skipped (decided before the trailing-garbage check); otherwise size + 2 bytes are read
  and must end in CRLF, else ``EXPECTED_CRLF`` and the bytes after the first size + 2 are
  parsed as the next command (no resynchronisation, as beanstalkd). After a ``BAD_FORMAT``
  put line the body is parsed as commands, as beanstalkd does.
- Tube names: 1-200 bytes of ``A-Z a-z 0-9 - + / ; . $ _ ( )``, not starting with ``-``;
  for ``use``, ``watch``, ``ignore`` and ``stats-tube`` the whole rest of the line is the name.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from mypy_extensions import i64

MAX_LINE: Final = 224
"""The longest command line, CRLF included (beanstalkd's LINE_BUF_SIZE)."""
DEFAULT_MAX_JOB_SIZE: Final = 65535
MAX_TUBE_NAME: Final = 200
U32_MAX: Final = 0xFFFF_FFFF
U64_MAX: Final = 0xFFFF_FFFF_FFFF_FFFF
LONG_MAX: Final = 0x7FFF_FFFF_FFFF_FFFF
FOREVER: Final = -1
"""The ``timeout`` of a ``reserve`` that waits without limit."""

TUBE_CHARS: Final = frozenset(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-+/;.$_()"
)
_TUBE_RE: Final = re.compile(rb"[A-Za-z0-9+/;.$_()\-]+")


OPS: Final = (
    "put",
    "peek",
    "peek-ready",
    "peek-delayed",
    "peek-buried",
    "reserve",
    "reserve-with-timeout",
    "delete",
    "release",
    "use",
    "watch",
    "ignore",
    "bury",
    "kick",
    "touch",
    "stats",
    "stats-job",
    "stats-tube",
    "list-tubes",
    "list-tube-used",
    "list-tubes-watched",
    "pause-tube",
    "reserve-job",
    "kick-job",
    "quit",
    "auth",
    "put-key",
)
"""Every command word; a request's ``code`` is its index here. The first :data:`COUNTED` have
a ``cmd-*`` counter in ``stats``, in beanstalkd 1.12's order (reserve-job, kick-job and quit
have none), so a server counts a request with a list index, not a dict lookup. ``auth`` is
tercel's login (``auth <user> <password>``: the rest of the line in ``body``); a server
without users answers it ``UNKNOWN_COMMAND``, as beanstalkd. ``put-key`` is tercel's put with a
dedup key (``put-key <key> <pri> <delay> <ttr> <bytes>``: the key in ``tube``)."""
COUNTED: Final = 22
OP_CODES: Final[dict[str, int]] = {op: i for i, op in enumerate(OPS)}
PUT: Final = 0
RESERVE: Final = 5
RESERVE_WITH_TIMEOUT: Final = 6
DELETE: Final = 7
PUT_KEY: Final = 26
NO_CODE: Final = -1


@dataclass(slots=True, init=False)
class Command:
    """One well-formed request. ``op`` is the command word (``"put"``, ``"reserve"``...).

    Only the fields of the command are meaningful: ``job_id`` for the id commands, ``pri``,
    ``delay``, ``ttr`` and ``body`` for ``put``, ``pri`` and ``delay`` for ``release``,
    ``pri`` for ``bury``, ``tube`` for the tube commands, ``delay`` for ``pause-tube``,
    ``count`` for ``kick``, ``timeout`` (seconds, :data:`FOREVER` for none) for
    ``reserve`` and ``reserve-with-timeout``; ``put-key`` has ``put``'s fields and its dedup
    key in ``tube`` (unchecked: the server checks it and answers ``BAD_KEY <rule>``). A
    ``put`` with ``ttr`` 0 is passed on as 0; the core raises it to 1 s. ``code``: the index
    of ``op`` in :data:`OPS` (looked up when not given).
    """

    op: str
    code: int
    job_id: int
    pri: int
    delay: int
    ttr: int
    tube: str
    body: bytes
    count: int
    timeout: int

    # Written out rather than generated: the dataclass-made __init__ runs interpreted even in
    # the compiled build, and this one is called for every request.
    def __init__(
        self,
        op: str,
        job_id: int = 0,
        *,
        pri: int = 0,
        delay: int = 0,
        ttr: int = 0,
        tube: str = "",
        body: bytes = b"",
        count: int = 0,
        timeout: int = FOREVER,
        code: int = NO_CODE,
    ) -> None:
        self.op = op
        self.code = code if code != NO_CODE else OP_CODES[op]
        self.job_id = job_id
        self.pri = pri
        self.delay = delay
        self.ttr = ttr
        self.tube = tube
        self.body = body
        self.count = count
        self.timeout = timeout


@dataclass(slots=True, init=False)
class Invalid:
    """A request beanstalkd rejects; ``reply`` is the exact bytes to send back. ``op`` is
    ``"put"`` for a rejected put (beanstalkd counts those in ``cmd-put``; no other rejected
    command is counted), empty otherwise; ``code`` is ``op``'s (:data:`NO_CODE` for none)."""

    reply: bytes
    op: str
    code: int

    def __init__(self, reply: bytes, op: str = "") -> None:
        self.reply = reply
        self.op = op
        self.code = OP_CODES[op] if op else NO_CODE


Request = Command | Invalid


@dataclass(slots=True, init=False)
class PutLine:
    """A ``put`` line whose body comes next; ``garbage`` when bytes follow the size."""

    pri: int
    delay: int
    ttr: int
    size: int
    garbage: bool
    key: str
    """``put-key``'s dedup key; empty for a ``put``."""

    def __init__(  # noqa: PLR0917
        self, pri: int, delay: int, ttr: int, size: int, garbage: bool, key: str = ""
    ) -> None:
        self.pri = pri
        self.delay = delay
        self.ttr = ttr
        self.size = size
        self.garbage = garbage
        self.key = key


CRLF: Final = b"\r\n"


def _reply(word: str) -> bytes:
    return word.encode("ascii") + b"\r\n"


BAD_FORMAT: Final = _reply("BAD_FORMAT")
UNKNOWN_COMMAND: Final = _reply("UNKNOWN_COMMAND")
EXPECTED_CRLF: Final = _reply("EXPECTED_CRLF")
JOB_TOO_BIG: Final = _reply("JOB_TOO_BIG")
DRAINING: Final = _reply("DRAINING")
NOT_FOUND: Final = _reply("NOT_FOUND")
NOT_IGNORED: Final = _reply("NOT_IGNORED")
DEADLINE_SOON: Final = _reply("DEADLINE_SOON")
TIMED_OUT: Final = _reply("TIMED_OUT")
OUT_OF_MEMORY: Final = _reply("OUT_OF_MEMORY")
INTERNAL_ERROR: Final = _reply("INTERNAL_ERROR")
DELETED: Final = _reply("DELETED")
RELEASED: Final = _reply("RELEASED")
BURIED: Final = _reply("BURIED")
TOUCHED: Final = _reply("TOUCHED")
KICKED: Final = _reply("KICKED")
PAUSED: Final = _reply("PAUSED")
# tercel's replies for its users (docs/protocol.md, "Users"): beanstalkd has none.
AUTH_OK: Final = _reply("OK")
AUTH_FAILED: Final = _reply("AUTH_FAILED")
UNAUTHORIZED: Final = _reply("UNAUTHORIZED")

_INVALID_BAD: Final = Invalid(BAD_FORMAT)
_INVALID_UNKNOWN: Final = Invalid(UNKNOWN_COMMAND)
_INVALID_CRLF: Final = Invalid(EXPECTED_CRLF, "put")
_INVALID_TOO_BIG: Final = Invalid(JOB_TOO_BIG, "put")
_INVALID_PUT: Final = Invalid(BAD_FORMAT, "put")

# Commands without arguments: the whole line must be the word.
_BARE: Final = (
    "peek-ready",
    "peek-delayed",
    "peek-buried",
    "reserve",
    "stats",
    "list-tubes-watched",
    "list-tube-used",
    "list-tubes",
)
# beanstalkd's which_cmd() order: the first prefix that matches decides the command.
_PREFIXES: Final[tuple[tuple[bytes, str], ...]] = (
    (b"put ", "put"),
    (b"peek ", "peek"),
    (b"peek-ready", "peek-ready"),
    (b"peek-delayed", "peek-delayed"),
    (b"peek-buried", "peek-buried"),
    (b"reserve-with-timeout ", "reserve-with-timeout"),
    (b"reserve-job ", "reserve-job"),
    (b"reserve", "reserve"),
    (b"delete ", "delete"),
    (b"release ", "release"),
    (b"bury ", "bury"),
    (b"kick ", "kick"),
    (b"kick-job ", "kick-job"),
    (b"touch ", "touch"),
    (b"stats-job ", "stats-job"),
    (b"stats-tube ", "stats-tube"),
    (b"stats", "stats"),
    (b"use ", "use"),
    (b"watch ", "watch"),
    (b"ignore ", "ignore"),
    (b"list-tubes-watched", "list-tubes-watched"),
    (b"list-tube-used", "list-tube-used"),
    (b"list-tubes", "list-tubes"),
    (b"put-key ", "put-key"),  # tercel's (no prefix of beanstalkd's commands: any order)
    (b"quit", "quit"),
    (b"pause-tube ", "pause-tube"),
    (b"auth ", "auth"),
)
_ID_ONLY: Final = frozenset(("peek", "reserve-job", "delete", "touch", "kick-job", "stats-job"))
_TUBE_ONLY: Final = frozenset(("use", "watch", "ignore", "stats-tube"))


class _BadFormat(Exception):
    """Raised inside the line parser; becomes a ``BAD_FORMAT`` reply."""


def valid_tube(name: bytes) -> bool:
    """True when ``name`` is a tube name beanstalkd accepts."""
    return (
        0 < len(name) <= MAX_TUBE_NAME
        and not name.startswith(b"-")
        and _TUBE_RE.fullmatch(name) is not None
    )


def _number(line: bytes, at: int, limit: int) -> tuple[int, int]:
    """beanstalkd's read_u32/read_u64: skip spaces, then digits; (value, position after).
    (Positions are ``i64``: compiled, the scan is plain C, without tagged-integer checks.)"""
    n: i64 = len(line)
    pos: i64 = at
    while pos < n and line[pos] == 0x20:
        pos += 1
    start = pos
    value = 0
    while pos < n:
        digit = line[pos] - 0x30
        if not 0 <= digit <= 9:
            break
        value = value * 10 + digit
        pos += 1
    if pos == start or (pos - start > 9 and value > limit):  # 9 digits fit any limit
        raise _BadFormat
    return value, pos


def _last_number(line: bytes, pos: int, limit: int) -> int:
    value, end = _number(line, pos, limit)
    if end != len(line):
        raise _BadFormat
    return value


def _strtol(line: bytes, pos: int) -> tuple[int, bool]:
    """C's strtol over ``line[pos:]``: (value, whether any digit was read). Overflow raises."""
    value, digits = _c_integer(line, pos)
    if not -LONG_MAX - 1 <= value <= LONG_MAX:
        raise _BadFormat
    return value, digits


def _strtoul(line: bytes, pos: int) -> tuple[int, bool]:
    """C's strtoul (64-bit) over ``line[pos:]``: (value, whether any digit was read); a
    negative number wraps (``-1`` is 2**64 - 1); a magnitude above 2**64 - 1 raises."""
    value, digits = _c_integer(line, pos)
    if not -U64_MAX <= value <= U64_MAX:
        raise _BadFormat
    return value & U64_MAX, digits


def _c_integer(line: bytes, pos: int) -> tuple[int, bool]:
    """What C's strtol/strtoul read of ``line[pos:]``: leading white space, a sign, decimal
    digits; (the signed value, unbounded; whether any digit was read)."""
    n = len(line)
    while pos < n and line[pos] in b" \t\n\v\f\r":
        pos += 1
    sign = 1
    if pos < n and line[pos] in b"+-":
        sign = -1 if line[pos] == 0x2D else 1
        pos += 1
    start = pos
    while pos < n and 0x30 <= line[pos] <= 0x39:
        pos += 1
    if pos == start:
        return 0, False
    return sign * int(line[start:pos]), True


def _tube(rest: bytes) -> str:
    if not valid_tube(rest):
        raise _BadFormat
    return rest.decode("ascii")


def parse_line(line: bytes) -> Request | PutLine:
    """Parse one command line (CRLF stripped).

    Returns the request, or for a ``put`` line a :class:`PutLine` whose body the caller must
    read next. Raises nothing.
    """
    fast = _parse_common(line)
    if fast is not None:
        return fast
    if b"\x00" in line:
        return _INVALID_BAD
    for prefix, op in _PREFIXES:
        if line.startswith(prefix):
            try:
                return _parse(op, line, len(prefix))
            except _BadFormat:
                return _INVALID_PUT if op == "put" else _INVALID_BAD
    return _INVALID_UNKNOWN


def _parse_common(line: bytes) -> Request | PutLine | None:
    """The requests of a put / reserve / delete loop, when the line is exactly well formed
    (then no NUL byte can be in it, and no earlier prefix of beanstalkd's order matches);
    None sends anything else through the general parser, which gives the same answer."""
    n = len(line)
    try:
        if line.startswith(b"delete "):
            job_id, pos = _number(line, 7, U64_MAX)
            if pos == n:
                return Command("delete", job_id, code=DELETE)
        elif line.startswith(b"reserve-with-timeout "):
            # Digits only, few enough to stay within strtol's range: else the general path.
            timeout, pos = _number(line, 21, LONG_MAX)
            if pos == n and n - 21 <= 18:
                return Command("reserve-with-timeout", timeout=timeout, code=RESERVE_WITH_TIMEOUT)
        elif line == b"reserve":
            return Command("reserve", code=RESERVE)
    except _BadFormat:
        pass
    return None


def _parse_put(line: bytes) -> tuple[Command | None, int]:
    """A put line that is exactly well formed: its ``put`` request, the body still empty, and
    the body's size; ``(None, 0)`` sends anything else through :func:`parse_line` (which
    gives the same answer). The codec fills the body in when it arrives: no
    :class:`PutLine` is built for the common put, and no second request object."""
    try:
        pri, pos = _number(line, 4, U32_MAX)
        delay, pos = _number(line, pos, U32_MAX)
        ttr, pos = _number(line, pos, U32_MAX)
        size, pos = _number(line, pos, U32_MAX)
        if pos == len(line):
            return Command("put", pri=pri, delay=delay, ttr=ttr, code=PUT), size
    except _BadFormat:
        pass
    return None, 0


def _parse(op: str, line: bytes, at: int) -> Request | PutLine:
    if op in _BARE:
        if len(line) != at:
            raise _BadFormat
        return Command(op)
    if op == "quit":  # beanstalkd quits on any line that starts with "quit"
        return Command(op)
    if op == "auth":
        return Command(op, body=line[at:])
    if op in _ID_ONLY:
        return Command(op, job_id=_last_number(line, at, U64_MAX))
    if op in _TUBE_ONLY:
        return Command(op, tube=_tube(line[at:]))
    if op == "put":
        pri, pos = _number(line, at, U32_MAX)
        delay, pos = _number(line, pos, U32_MAX)
        ttr, pos = _number(line, pos, U32_MAX)
        size, pos = _number(line, pos, U32_MAX)
        # JOB_TOO_BIG is decided before the trailing-garbage check (beanstalkd's order).
        return PutLine(pri, delay, ttr, size, pos != len(line))
    if op == "put-key":
        space = line.find(b" ", at)
        if space <= at:
            raise _BadFormat
        key = line[at:space].decode("latin-1")
        put = _parse("put", line, space)
        assert isinstance(put, PutLine)
        put.key = key
        return put
    if op == "reserve-with-timeout":
        value, _ = _strtol(line, at)
        return Command(op, timeout=FOREVER if value < 0 else value)
    if op == "release":
        job_id, pos = _number(line, at, U64_MAX)
        pri, pos = _number(line, pos, U32_MAX)
        return Command(op, job_id=job_id, pri=pri, delay=_last_number(line, pos, U32_MAX))
    if op == "bury":
        job_id, pos = _number(line, at, U64_MAX)
        return Command(op, job_id=job_id, pri=_last_number(line, pos, U32_MAX))
    if op == "kick":
        value, digits = _strtoul(line, at)
        if not digits:
            raise _BadFormat
        return Command(op, count=value & U32_MAX)  # beanstalkd's ``uint count``
    # pause-tube <tube> <delay>
    pos = at
    while pos < len(line) and line[pos] == 0x20:
        pos += 1
    start = pos
    while pos < len(line) and line[pos] in TUBE_CHARS:
        pos += 1
    if pos == start:
        raise _BadFormat
    name = line[start:pos]
    delay = _last_number(line, pos, U32_MAX)
    return Command(op, tube=name.decode("ascii"), delay=delay)


def _crlf(buf: bytes, start: int, end: int) -> int:
    """``buf.find(b"\\r\\n", start, end)``: a command line is short, and compiled, this loop
    (on ``i64`` positions: plain C) costs a fraction of the method call."""
    i: i64 = start
    last: i64 = end - 1
    while i < last:
        if buf[i] == 0x0D and buf[i + 1] == 0x0A:
            return i
        i += 1
    return -1


class BeanstalkCodec:
    """Incremental parser for one connection (see the module docstring for the contract)."""

    __slots__ = ("_buf", "_discarding", "_max_job_size", "_put", "_put_size", "_skip")

    def __init__(self, max_job_size: int = DEFAULT_MAX_JOB_SIZE) -> None:
        self._buf = b""
        self._max_job_size = max_job_size
        self._discarding = False  # inside an over-long line, waiting for its CRLF
        self._skip = 0  # body bytes of a JOB_TOO_BIG put still to throw away
        self._put: Command | None = None  # a put whose body is due (filled in when it comes)
        self._put_size = 0  # that body's size

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete request."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[Request]:
        """Add ``data``; return every request it completes, in order."""
        buf = self._buf + data if self._buf else data
        out: list[Request] = []
        pos = 0
        n = len(buf)
        while pos < n:
            if self._skip:
                take = min(self._skip, n - pos)
                self._skip -= take
                pos += take
                if not self._skip:
                    out.append(_INVALID_TOO_BIG)
                continue
            put = self._put
            if put is not None:
                size = self._put_size
                if n - pos < size + 2:
                    break
                end = pos + size
                self._put = None
                if buf[end] != 0x0D or buf[end + 1] != 0x0A:
                    out.append(_INVALID_CRLF)
                else:
                    put.body = buf[pos:end]
                    out.append(put)
                pos = end + 2
                continue
            eol = _crlf(buf, pos, min(n, pos + MAX_LINE))
            if self._discarding:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    # Keep a trailing CR: it may be the first half of the CRLF.
                    pos = n - 1 if buf.endswith(b"\r") else n
                    break
                self._discarding = False
                out.append(_INVALID_BAD)
                pos = eol + 2
                continue
            if eol < 0:
                if n - pos >= MAX_LINE:
                    self._discarding = True
                    continue
                break
            line = buf[pos:eol]
            pos = eol + 2
            if line.startswith(b"put "):
                put, size = _parse_put(line)
                if put is not None:
                    if size > self._max_job_size:
                        self._skip = size + 2
                    else:
                        self._put = put
                        self._put_size = size
                    continue
            parsed = parse_line(line)
            if isinstance(parsed, PutLine):
                if parsed.size > self._max_job_size:
                    self._skip = parsed.size + 2
                elif parsed.garbage:
                    out.append(_INVALID_PUT)
                elif parsed.key:
                    self._put = Command(
                        "put-key",
                        pri=parsed.pri,
                        delay=parsed.delay,
                        ttr=parsed.ttr,
                        tube=parsed.key,
                        code=PUT_KEY,
                    )
                    self._put_size = parsed.size
                else:
                    self._put = Command(
                        "put", pri=parsed.pri, delay=parsed.delay, ttr=parsed.ttr, code=PUT
                    )
                    self._put_size = parsed.size
                continue
            out.append(parsed)
        self._buf = buf[pos:] if pos < n else b""
        return out


# ---------------------------------------------------------------------------------- replies


def job_reply(word: bytes, job_id: int, body: bytes) -> bytes:
    """``<WORD> <id> <bytes>\\r\\n<data>\\r\\n`` (``RESERVED``, ``FOUND``)."""
    return b"".join(job_reply_parts(word, job_id, body))


def job_reply_parts(word: bytes, job_id: int, body: bytes) -> tuple[bytes, bytes, bytes]:
    """:func:`job_reply` as its three pieces, the body not copied: a server that joins its
    replies once per batch copies the body there and nowhere else (formatted in, it was
    copied twice, and ``%`` over a 1 KiB body costs twice the header's formatting)."""
    return b"%s %d %d\r\n" % (word, job_id, len(body)), body, CRLF


def id_reply(word: bytes, job_id: int) -> bytes:
    """``<WORD> <n>\\r\\n`` (``INSERTED``, ``BURIED``, ``KICKED``, ``WATCHING``)."""
    return b"%s %d\r\n" % (word, job_id)


def word_reply(word: bytes, text: str) -> bytes:
    """``<WORD> <text>\r\n``, the text on one line (tercel's ``BAD_KEY <rule>``,
    ``TOO_MANY_KEYS <why>``)."""
    return b"%s %s\r\n" % (word, " ".join(text.split()).encode("ascii", "replace"))


def name_reply(word: bytes, tube: str) -> bytes:
    """``USING <tube>\\r\\n``."""
    return b"%s %s\r\n" % (word, tube.encode("ascii"))


YamlValue = int | str | bool | float | bytes
"""``str`` values are quoted; ``bytes`` are written as they are (a job's state word)."""


def _yaml_value(value: YamlValue) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, bool):
        return b"true" if value else b"false"
    if isinstance(value, int):
        return b"%d" % value
    if isinstance(value, float):  # rusage seconds, beanstalkd's %d.%06d
        micros = round(value * 1_000_000)
        return b"%d.%06d" % divmod(micros, 1_000_000)
    # Every string value is quoted: an unquoted " #" would start a YAML comment.
    return b'"' + value.replace("\\", "\\\\").replace('"', '\\"').encode("utf-8") + b'"'


def yaml_ok(body: bytes) -> bytes:
    """``OK <n>\\r\\n<body>\\r\\n``, n counting the body only."""
    return b"OK %d\r\n%s\r\n" % (len(body), body)


def yaml_dict(pairs: Sequence[tuple[str, YamlValue]]) -> bytes:
    """A whole ``OK`` reply holding a YAML mapping in the order given."""
    parts = [b"---\n"]
    parts.extend(b"%s: %s\n" % (key.encode("ascii"), _yaml_value(v)) for key, v in pairs)
    return yaml_ok(b"".join(parts))


def yaml_list(names: Sequence[str]) -> bytes:
    """A whole ``OK`` reply holding a YAML list of tube names (never quoted, as beanstalkd)."""
    return yaml_ok(b"---\n" + b"".join(b"- %s\n" % n.encode("ascii") for n in names))


def random_id() -> str:
    """The 16 hex characters of ``stats``' ``id``, new for each process."""
    return os.urandom(8).hex()
