"""Kestrel's memcache text protocol, server side: bytes -> commands, replies -> bytes.

Contract of :class:`MemcacheServerCodec`: feed bytes with :meth:`receive_data`, then call
:meth:`next_command` until it returns :data:`NEED_DATA`. It raises :class:`ProtocolError` for a
request it cannot accept; when ``close`` is false the bytes of that request were consumed and
the next call continues with the next request, when ``close`` is true the command boundary is
lost and the caller must reply and close. Any other exception is a bug.

Limits, with their precedents: a command line may be 8 KiB (memcached's own limit is 2 KiB for
keys plus numbers; Kestrel had none, which let a client exhaust memory with one line); a
payload may be 64 MiB (memcached's ``-I`` maximum is 1 GiB, its default 1 MiB; Kestrel
buffered whatever the client declared). Larger declarations are refused before buffering.
Only ``ack``, ``release`` and ``renew`` lines may be longer, up to 1 MiB: they carry lease ids,
thousands per line (reference spark.md §2.6 asks for at least 64 KiB).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from typing import Final, TypeVar, cast

from tercel.errors import ProtocolError
from tercel.names import valid_name_bytes
from tercel.protocol.commands import (
    GET_CLASS,
    SET_CLASS,
    Ack,
    AckKey,
    Command,
    Confirm,
    Delete,
    DumpStats,
    Flush,
    FlushAll,
    FlushExpired,
    Get,
    KeyedSet,
    Lease,
    Monitor,
    Release,
    ReleaseKey,
    Renew,
    RenewKey,
    Set,
    Simple,
    Status,
    Unknown,
)
from tercel.protocol.dedup import keyed_set
from tercel.protocol.memcache_keyed import KEY_WORD, key_only, keyed_lease

MAX_LINE: Final = 8 * 1024
MAX_VALUE: Final = 64 * 1024 * 1024
MAX_ID_LINE: Final = 1024 * 1024
"""The line limit of ``ack``, ``release`` and ``renew``, whose lines list lease ids."""
MAX_LEASE_ID: Final = 64
_ID_COMMANDS: Final = (b"ack ", b"release ", b"renew ")


class NeedData(enum.Enum):
    """Returned by :meth:`MemcacheServerCodec.next_command` when a request is incomplete."""

    NEED_DATA = "NEED_DATA"


NEED_DATA: Final = NeedData.NEED_DATA

_SIMPLE: Final = {
    b"version": "version",
    b"shutdown": "shutdown",
    b"reload": "reload",
    b"dump_config": "dump_config",
    b"stats": "stats",
    b"flush_all_expired": "flush_all_expired",
    b"quit": "quit",
    b"features": "features",
}
_UNSUPPORTED_STORAGE: Final = frozenset((b"add", b"replace", b"append", b"prepend", b"cas"))


# Module-level names are Final so that compiled code holds them in C statics; any other
# global is a dict lookup in the module's namespace at every use (~130 instructions).
_NAMES: Final[dict[bytes, str]] = {}
_NAMES_MAX: Final = 65536
_PLAIN_GETS: Final[dict[bytes, Get]] = {}
"""The ``get <name>`` commands (no options) of names seen before."""
_SIZES: Final[dict[bytes, int]] = {}
"""Payload sizes seen before (clients repeat a few): one dict hit instead of two calls."""
_SIZES_MAX: Final = 4096

_T = TypeVar("_T")


def _remember(cache: dict[bytes, _T], key: bytes, value: _T, limit: int) -> _T:
    """Store ``value`` under ``key`` in one of the caches above, emptied whenever it reaches
    ``limit`` entries (clients use a few names and sizes; a client inventing new ones cannot
    grow it without bound); return ``value``."""
    if len(cache) >= limit:
        cache.clear()
    cache[key] = value
    return value


_MEMO_LINE: Final = 512
"""The longest line a codec remembers for repeats (a name is at most 200 bytes: a longer line
is padded numbers, not worth keeping per connection)."""

_SetFields = tuple[str, int, int, bool]
"""A set's queue, flags, exptime and noreply, parsed before its payload is there."""

_Outcome = _SetFields | KeyedSet | ProtocolError | None
"""What a storage line parsed to: a set's fields, a keyed set (its payload still empty), why
the set is refused, or None (another storage command, answered as unknown)."""

_new_get: Final = cast(Callable[[type[Get], tuple[object, ...]], Get], tuple.__new__)
_new_set: Final = cast(Callable[[type[Set], tuple[object, ...]], Set], tuple.__new__)
"""Build a :class:`Get` or :class:`Set` from a tuple of its fields without the named tuple's
Python-level ``__new__`` (see :mod:`tercel.protocol.commands`)."""


def _crlf_at(buf: bytes, i: int) -> bool:
    """True when ``buf`` holds ``\\r\\n`` at ``i`` (compiled, two indexings: no 2-byte slice
    object per set)."""
    return i + 1 < len(buf) and buf[i] == 13 and buf[i + 1] == 10


def _queue(token: bytes) -> str:
    """The queue name in ``token``, checked; names seen before skip the regex and decode."""
    name = _NAMES.get(token)
    if name is None:
        if not valid_name_bytes(token):
            raise ProtocolError("bad queue name")
        name = _remember(_NAMES, token, token.decode("ascii"), _NAMES_MAX)
    return name


MAX_DIGITS: Final = 18
"""The most significant digits a number on the wire may have (leading zeros are free): every
value then fits in 63 bits (below 10**18), so a timeout or an expiry can never overflow a
float or a timer (Kestrel reads these as 32- or 64-bit integers and refuses longer ones too)."""


def _int(token: bytes, what: str) -> int:
    """A decimal integer below 10**18 (:data:`MAX_DIGITS`), with an optional leading minus:
    ``int()`` alone would also take ``+5``, ``1_000`` and surrounding whitespace, which
    memcached does not."""
    digits = token[1:] if token[:1] == b"-" else token
    if not digits.isdigit() or len(digits.lstrip(b"0")) > MAX_DIGITS:
        raise ProtocolError(f"bad {what}")
    return int(token)


def parse_get_key(key: bytes, cas: bool = False) -> Get:
    """Split ``queue/opt/opt...`` into a :class:`Get`; reject unknown or illegal options."""
    if b"/" not in key:
        return _new_get(GET_CLASS, (key, _queue(key), None, False, False, False, False, cas))
    head, *opts = key.split(b"/")
    name = _queue(head)
    timeout: int | None = None
    open_ = close = abort = peek = False
    for opt in opts:
        if opt == b"open":
            open_ = True
        elif opt == b"close":
            close = True
        elif opt == b"abort":
            abort = True
        elif opt == b"peek":
            peek = True
        elif opt.startswith(b"t="):
            ms = _int(opt[2:], "timeout")
            timeout = ms if ms > 0 else None
        else:
            raise ProtocolError("unknown get option " + opt.decode("latin-1")[:40])
    if (peek or abort) and (open_ or close):
        raise ProtocolError("peek and abort cannot be combined with open or close")
    if peek and abort:
        raise ProtocolError("peek and abort cannot be combined")
    return _new_get(GET_CLASS, (key, name, timeout, open_, close, abort, peek, cas))


class MemcacheServerCodec:
    """Parses requests from a byte stream (see the module docstring for the contract)."""

    __slots__ = (
        "_buf",
        "_extra",
        "_get_cmd",
        "_get_line",
        "_later",
        "_max_line",
        "_max_value",
        "_pending",
        "_pos",
        "_set_fields",
        "_set_line",
        "_set_size",
    )

    def __init__(self, max_line: int = MAX_LINE, max_value: int = MAX_VALUE) -> None:
        # Buffering, measured (docs/architecture.md): the bytes of one read are parsed in
        # place, without copying them into a bytearray first; what arrives while a command is
        # incomplete waits in ``_later`` and is joined once, when enough is there (so a 64 MiB
        # payload in 64 KiB reads is joined once, not a thousand times).
        self._buf = b""
        self._pos = 0
        self._later: list[bytes] = []
        self._extra = 0  # bytes in _later
        self._max_line = max_line
        self._max_value = max_value
        # A storage command waiting for its payload: (command word, size, fields or error).
        self._pending: tuple[bytes, int, _Outcome] | None = None
        # The last ``get`` line and the last ``set`` line parsed, with what they parsed to. A
        # client sends the same line again and again (a consumer's get, a producer's set of
        # one size); a repeat is recognised by comparing bytes, with no search for the line's
        # end, no split, no lookups. b"\n" never matches: a line there starts with g or s.
        self._get_line = b"\n"
        self._get_cmd: Get = _new_get(GET_CLASS, (b"", "", None, False, False, False, False, False))
        self._set_line = b"\n"
        self._set_size = 0
        self._set_fields: _SetFields = ("", 0, 0, False)

    def receive_data(self, data: bytes) -> None:
        """Append bytes read from the connection."""
        if self._pos >= len(self._buf) and not self._later:
            self._buf = data
            self._pos = 0
        else:
            self._later.append(data)
            self._extra += len(data)

    def _join(self) -> None:
        """Move everything waiting in ``_later`` behind the unparsed bytes."""
        self._buf = b"".join([self._buf[self._pos :], *self._later])
        self._pos = 0
        self._later.clear()
        self._extra = 0

    @property
    def buffered(self) -> int:
        """Bytes received but not yet parsed into a command."""
        return len(self._buf) - self._pos + self._extra

    def next_command(self) -> Command | NeedData:
        """The next complete command, or NEED_DATA. Raises ProtocolError (see module doc)."""
        if self._pending is not None:
            return self._payload()
        buf = self._buf
        pos = self._pos
        if pos >= len(buf):
            if not self._later:
                return NEED_DATA  # the common end of a batch: everything read was parsed
        else:
            first = buf[pos]
            if first == 103 and self._repeats(self._get_line):  # g
                return self._get_cmd
            if first == 115 and self._repeats(self._set_line):  # s
                return self._storage_body(b"set", self._set_size, self._set_fields)
        nl = buf.find(b"\n", pos)
        if nl < 0:
            if self._later:
                self._join()
                return self.next_command()
            if len(buf) - pos > self._max_line and not self._long_line_ok(len(buf)):
                raise ProtocolError("line too long", close=True)
            return NEED_DATA
        if nl - pos > self._max_line and not self._long_line_ok(nl):
            raise ProtocolError("line too long", close=True)
        tokens = buf[pos:nl].split()
        self._pos = nl + 1
        if not tokens:
            return Unknown(b"")
        cmd = tokens[0]
        if cmd == b"set":
            size, fields = self._storage_line(tokens)
            if isinstance(fields, tuple) and nl - pos < _MEMO_LINE:
                self._set_line = buf[pos : nl + 1]
                self._set_size = size
                self._set_fields = fields
            return self._storage_body(cmd, size, fields)
        if cmd == b"get" and len(tokens) == 2:
            get = self._plain_get(tokens[1])
            if nl - pos < _MEMO_LINE:
                self._get_line = buf[pos : nl + 1]
                self._get_cmd = get  # commands are immutable: one object serves every repeat
            return get
        return self._dispatch(tokens)

    def _repeats(self, line: bytes) -> bool:
        """True, with ``line`` consumed, when the unparsed bytes start with ``line``."""
        pos = self._pos
        end = pos + len(line)
        if self._buf[pos:end] != line:
            return False
        self._pos = end
        return True

    @staticmethod
    def _plain_get(key: bytes) -> Get:
        """The command of ``get <key>``: a known name without options is one dict hit
        (parse_get_key instead measured +2.2k instructions per get, compiled)."""
        get = _PLAIN_GETS.get(key)  # one object per queue name
        if get is not None:
            return get
        name = _NAMES.get(key)
        if name is None:
            return parse_get_key(key)
        get = _new_get(GET_CLASS, (key, name, None, False, False, False, False, False))
        return _remember(_PLAIN_GETS, key, get, _NAMES_MAX)

    def _long_line_ok(self, end: int) -> bool:
        """True when the over-long line being read is an id-list command within 1 MiB."""
        if end - self._pos > MAX_ID_LINE:
            return False
        head = self._buf[self._pos : self._pos + 8].lower()
        return head.startswith(_ID_COMMANDS)

    def _dispatch(self, tokens: list[bytes]) -> Command | NeedData:
        cmd = tokens[0]
        if cmd == b"get" or cmd == b"gets":
            return self._get(tokens, cmd == b"gets")
        if cmd == b"set":
            return self._storage(tokens)
        low = cmd.lower()
        if low != cmd:
            tokens[0] = low
            return self._dispatch(tokens)
        if cmd in _UNSUPPORTED_STORAGE:
            return self._storage(tokens)
        nargs = len(tokens) - 1
        noreply = tokens[-1] == b"noreply"
        if cmd == b"delete" or cmd == b"flush":
            if nargs < 1:
                raise ProtocolError("missing queue name")
            kind = Delete if cmd == b"delete" else Flush
            return kind(_queue(tokens[1]), noreply)
        if cmd == b"flush_all":
            return FlushAll(noreply)
        if cmd == b"flush_expired":
            if nargs < 1:
                raise ProtocolError("missing queue name")
            return FlushExpired(_queue(tokens[1]))
        if cmd == b"dump_stats":
            return DumpStats(tuple(_queue(t) for t in tokens[1:]))
        if cmd == b"status":
            return Status(tokens[1].decode("latin-1") if nargs >= 1 else None)
        simple = _SIMPLE.get(cmd)
        if simple is not None:
            return Simple(simple)
        ext = _EXTENSIONS.get(cmd)
        if ext is not None:
            return ext(tokens)
        return Unknown(cmd)

    def _get(self, tokens: list[bytes], cas: bool) -> Get:
        if len(tokens) < 2:
            raise ProtocolError("missing queue name")
        # Like Kestrel, only the first key is served: a queue get returns at most one item.
        return parse_get_key(tokens[1], cas)

    def _storage(self, tokens: list[bytes]) -> Command | NeedData:
        size, fields = self._storage_line(tokens)
        return self._storage_body(tokens[0], size, fields)

    def _storage_line(self, tokens: list[bytes]) -> tuple[int, _Outcome]:
        """The payload size of a storage command line, and for a ``set`` its fields or why
        they are refused (None: another storage command, answered as unknown). Raises
        ProtocolError (close) when the size is unusable: the payload cannot be skipped."""
        if len(tokens) < 5:
            raise ProtocolError("bad command line format", close=True)
        size_token = tokens[4]
        known = _SIZES.get(size_token)
        if known is not None:
            size = known
        elif not size_token.isdigit():
            raise ProtocolError("bad data chunk size", close=True)
        else:
            size = _remember(_SIZES, size_token, int(size_token), _SIZES_MAX)
        if size > self._max_value:
            raise ProtocolError("object too large for cache", close=True)
        if tokens[0] != b"set":
            return size, None
        flags, exptime = tokens[2], tokens[3]
        try:
            fields = (
                _queue(tokens[1]),
                0 if flags == b"0" else _int(flags, "flags"),
                0 if exptime == b"0" else _int(exptime, "exptime"),
                len(tokens) > 5 and tokens[5] == b"noreply",
            )
            if len(tokens) > 5 and tokens[5][:4] == KEY_WORD:  # only lines with more words
                return size, keyed_set(fields[0], fields[1], fields[2], tokens)
            return size, fields
        except ProtocolError as exc:
            return size, exc

    def _storage_body(self, word: bytes, size: int, outcome: _Outcome) -> Command | NeedData:
        """The command whose line was just consumed, once its payload is there."""
        if isinstance(outcome, tuple):
            start = self._pos
            end = start + size
            buf = self._buf
            if _crlf_at(buf, end):  # the whole payload is here: the common case
                self._pos = end + 2
                name, flag, expiry, noreply = outcome
                return _new_set(SET_CLASS, (name, flag, expiry, buf[start:end], noreply))
        elif isinstance(outcome, KeyedSet):  # (a set's tuple never comes here)
            start = self._pos
            end = start + size
            if _crlf_at(self._buf, end):
                self._pos = end + 2
                outcome.data = self._buf[start:end]
                return outcome
        self._pending = (word, size, outcome)
        return self._payload()

    def _payload(self) -> Command | NeedData:
        assert self._pending is not None
        word, size, outcome = self._pending
        start = self._pos
        end = start + size
        if len(self._buf) < end + 2:
            if len(self._buf) - start + self._extra < size + 2:
                return NEED_DATA
            self._join()
            start, end = 0, size
        if self._buf[end : end + 2] != b"\r\n":
            self._pending = None
            raise ProtocolError("bad data chunk", close=True)
        self._pending = None
        self._pos = end + 2
        if isinstance(outcome, tuple):
            name, flag, expiry, noreply = outcome
            return _new_set(SET_CLASS, (name, flag, expiry, self._buf[start:end], noreply))
        if outcome is None:
            return Unknown(word)
        if isinstance(outcome, KeyedSet):
            outcome.data = self._buf[start:end]
            return outcome
        raise outcome


# ---- extension commands (docs/protocol.md, "Leases and extensions") -------------------------


def _count(token: bytes, what: str) -> int:
    n = _int(token, what)
    if n < 0:
        raise ProtocolError(f"bad {what}")
    return n


def _args(tokens: list[bytes], n: int, usage: str) -> None:
    if len(tokens) - 1 < n:
        raise ProtocolError(f"usage: {usage}")


def _ids(tokens: list[bytes]) -> tuple[str, ...]:
    for t in tokens:
        if len(t) > MAX_LEASE_ID:
            raise ProtocolError("bad lease id")
    return tuple(t.decode("latin-1") for t in tokens)


_LEASE_USAGE: Final = "lease <queue> <max_items> <wait_ms> <lease_ms> [binary]"


def _lease(tokens: list[bytes]) -> Command:
    for word in tokens[2:]:  # a lease line has a few words: a keyed one names its key
        if word.startswith(KEY_WORD):
            return keyed_lease(tokens, _queue, _count)
    _args(tokens, 4, _LEASE_USAGE)
    binary = len(tokens) == 6 and tokens[5] == b"binary"
    if len(tokens) > 5 and not binary:
        raise ProtocolError(f"usage: {_LEASE_USAGE}")
    return Lease(
        _queue(tokens[1]),
        _count(tokens[2], "max_items"),
        _count(tokens[3], "wait_ms"),
        _count(tokens[4], "lease_ms"),
        binary,
    )


def _ack(tokens: list[bytes]) -> Command:
    _args(tokens, 1, "ack <queue> <lease_id>...")
    if len(tokens) > 2 and tokens[2].startswith(KEY_WORD):
        return AckKey(_queue(tokens[1]), key_only(tokens, 2, "ack <queue> key=<key>"))
    return Ack(_queue(tokens[1]), _ids(tokens[2:]))


def _release(tokens: list[bytes]) -> Command:
    _args(tokens, 1, "release <queue> <lease_id>...")
    if len(tokens) > 2 and tokens[2].startswith(KEY_WORD):
        return ReleaseKey(_queue(tokens[1]), key_only(tokens, 2, "release <queue> key=<key>"))
    return Release(_queue(tokens[1]), _ids(tokens[2:]))


def _renew(tokens: list[bytes]) -> Command:
    _args(tokens, 2, "renew <queue> <lease_ms> <lease_id>...")
    if len(tokens) > 3 and tokens[3].startswith(KEY_WORD):
        key = key_only(tokens, 3, "renew <queue> <lease_ms> key=<key>")
        return RenewKey(_queue(tokens[1]), _count(tokens[2], "lease_ms"), key)
    return Renew(_queue(tokens[1]), _count(tokens[2], "lease_ms"), _ids(tokens[3:]))


def _monitor(tokens: list[bytes]) -> Monitor:
    _args(tokens, 2, "monitor <queue> <seconds> [max_items]")
    limit = _count(tokens[3], "max_items") if len(tokens) > 3 else None
    return Monitor(_queue(tokens[1]), _int(tokens[2], "seconds"), limit)


def _confirm(tokens: list[bytes]) -> Confirm:
    _args(tokens, 2, "confirm <queue> <count>")
    return Confirm(_queue(tokens[1]), _count(tokens[2], "count"))


_EXTENSIONS: Final[dict[bytes, Callable[[list[bytes]], Command]]] = {
    b"lease": _lease,
    b"ack": _ack,
    b"release": _release,
    b"renew": _renew,
    b"monitor": _monitor,
    b"confirm": _confirm,
}


# ---- replies ----------------------------------------------------------------------------

STORED: Final = b"STORED\r\n"
NOT_STORED: Final = b"NOT_STORED\r\n"
DELETED: Final = b"DELETED\r\n"
END: Final = b"END\r\n"
OK: Final = b"OK\r\n"
ERROR: Final = b"ERROR\r\n"
VALUE_TAIL: Final = b"\r\nEND\r\n"
RELOADED: Final = b"Reloaded config.\r\n"


def value_head(key: bytes, size: int, cas: int | None = None) -> bytes:
    """``VALUE <key> 0 <size>[ <cas>]\\r\\n``; the payload and :data:`VALUE_TAIL` follow."""
    if cas is None:
        return b"VALUE %b 0 %d\r\n" % (key, size)
    return b"VALUE %b 0 %d %d\r\n" % (key, size, cas)


def _one_line(text: str) -> bytes:
    return " ".join(text.split()).encode("ascii", "replace")


def client_error(reason: str) -> bytes:
    """``CLIENT_ERROR <reason>``: the request was bad."""
    return b"CLIENT_ERROR %b\r\n" % _one_line(reason)


def server_error(reason: str) -> bytes:
    """``SERVER_ERROR <reason>``: the server could not do what was asked."""
    return b"SERVER_ERROR %b\r\n" % _one_line(reason)


def version(text: str) -> bytes:
    """``VERSION <text>``."""
    return b"VERSION %b\r\n" % text.encode("ascii")


def leased(
    prefix: bytes,
    number: int,
    *,
    item_id: int,
    deliveries: int,
    add_ms: int,
    expiry_ms: int,
    size: int,
) -> bytes:
    """``LEASED <prefix>-<number in hex> <item_id> <deliveries> <add_ms> <expiry_ms> <size>``
    and CRLF: the head of one item of a lease batch (``expiry_ms``: the item's own expiry, 0 =
    none); ``<data>\\r\\n`` follows, and ``END`` ends the batch."""
    return b"LEASED %b-%x %d %d %d %d %d\r\n" % (
        prefix,
        number,
        item_id,
        deliveries,
        add_ms,
        expiry_ms,
        size,
    )


LEASED_BINARY_MAX: int = 0x7FFFFFFF
"""The most payload bytes one ``LEASEDB`` reply carries (its offsets are int32, as Arrow's).
Not ``Final``, so that compiled code reads it at run time (one module lookup per lease reply)
and a test's server launcher can lower it before the server starts
(``tests/integration/capped_serve.py``): the cut is then tested without 2 GiB of items."""
_LEASEDB_TAIL: Final = b"\r\nEND\r\n"


def leased_binary(
    prefix: bytes,
    numbers: list[int],
    *,
    item_ids: list[int],
    deliveries: list[int],
    add_ms: list[int],
    expiry_ms: list[int],
    payloads: list[bytes],
) -> list[bytes]:
    """A lease batch as one ``LEASEDB`` reply (docs/protocol.md section 11), its parts in order:

    ``LEASEDB <n> <prefix> <payload bytes>\\r\\n``, then the column table, little-endian:
    ``item_id``, ``add_ms``, ``expiry_ms``, lease ``number`` (n int64 each), ``deliveries`` (n
    int32), payload offsets (n + 1 int32, from 0), then the payloads back to back and
    ``\\r\\nEND\\r\\n``. Item ``k``'s lease id is ``<prefix>-<number in hex>``, as in a ``LEASED``
    line. The payloads must total at most :data:`LEASED_BINARY_MAX` bytes; no items at all is
    a bare ``END``."""
    n = len(numbers)
    if n == 0:
        return [END]
    offsets = [0] * (n + 1)
    total = 0
    for k in range(n):
        total += len(payloads[k])
        offsets[k + 1] = total
    head = b"LEASEDB %d %b %d\r\n" % (n, prefix, total)
    q = f"<{n}q"
    table = b"".join(
        (
            _pack(q, item_ids),
            _pack(q, add_ms),
            _pack(q, expiry_ms),
            _pack(q, numbers),
            _pack(f"<{n}i", deliveries),
            _pack(f"<{n + 1}i", offsets),
        )
    )
    return [head, table, b"".join(payloads), _LEASEDB_TAIL]


def _pack(fmt: str, values: list[int]) -> bytes:
    return struct.pack(fmt, *values)


def counted(word: bytes, n: int) -> bytes:
    """``ACKED <n>``, ``RELEASED <n>``, ``RENEWED <n>``."""
    return b"%b %d\r\n" % (word, n)


def features(pairs: list[tuple[str, int]]) -> bytes:
    """``FEATURE <name> <version>`` lines, then ``END``."""
    return b"".join(b"FEATURE %b %d\r\n" % (n.encode("ascii"), v) for n, v in pairs) + END


def number(n: int) -> bytes:
    """A bare count line (``flush_expired``)."""
    return b"%d\r\n" % n


def stats(lines: list[tuple[str, object]]) -> bytes:
    """``STAT <name> <value>`` lines, then ``END``."""
    body = "".join(f"STAT {k} {v}\r\n" for k, v in lines)
    return body.encode("ascii", "replace") + END


def blocks(blocks: list[tuple[str, list[tuple[str, object]]]]) -> bytes:
    """``queue '<name>' {`` / ``  k=v`` ... / ``}`` per block, then ``END`` (``dump_stats``,
    ``dump_config``). No blocks at all gives a bare ``END``."""
    parts = []
    for name, lines in blocks:
        parts.append(f"queue '{name}' {{\r\n")
        parts.extend(f"  {k}={v}\r\n" for k, v in lines)
        parts.append("}\r\n")
    return "".join(parts).encode("ascii", "replace") + END
