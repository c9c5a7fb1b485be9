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
"""

from __future__ import annotations

import enum
from typing import Final

from tercel.errors import ProtocolError
from tercel.names import valid_name_bytes
from tercel.protocol.commands import (
    Command,
    Delete,
    DumpStats,
    Flush,
    FlushAll,
    FlushExpired,
    Get,
    Set,
    Simple,
    Unknown,
)

MAX_LINE: Final = 8 * 1024
MAX_VALUE: Final = 64 * 1024 * 1024


class NeedData(enum.Enum):
    """Returned by :meth:`MemcacheServerCodec.next_command` when a request is incomplete."""

    NEED_DATA = "NEED_DATA"


NEED_DATA: Final = NeedData.NEED_DATA

_SIMPLE = {
    b"version": "version",
    b"shutdown": "shutdown",
    b"reload": "reload",
    b"dump_config": "dump_config",
    b"stats": "stats",
    b"flush_all_expired": "flush_all_expired",
    b"quit": "quit",
}
_UNSUPPORTED_STORAGE = frozenset((b"add", b"replace", b"append", b"prepend", b"cas"))


def _queue(token: bytes) -> str:
    if not valid_name_bytes(token):
        raise ProtocolError("bad queue name")
    return token.decode("ascii")


def _int(token: bytes, what: str) -> int:
    try:
        return int(token)
    except ValueError:
        raise ProtocolError(f"bad {what}") from None


def parse_get_key(key: bytes, cas: bool = False) -> Get:
    """Split ``queue/opt/opt...`` into a :class:`Get`; reject unknown or illegal options."""
    if b"/" not in key:
        return Get(key, _queue(key), cas=cas)
    name, *opts = key.split(b"/")
    get = Get(key, _queue(name), cas=cas)
    for opt in opts:
        if opt == b"open":
            get.open = True
        elif opt == b"close":
            get.close = True
        elif opt == b"abort":
            get.abort = True
        elif opt == b"peek":
            get.peek = True
        elif opt.startswith(b"t="):
            ms = _int(opt[2:], "timeout")
            get.timeout = ms if ms > 0 else None
        else:
            raise ProtocolError("unknown get option " + opt.decode("latin-1")[:40])
    if (get.peek or get.abort) and (get.open or get.close):
        raise ProtocolError("peek and abort cannot be combined with open or close")
    if get.peek and get.abort:
        raise ProtocolError("peek and abort cannot be combined")
    return get


class MemcacheServerCodec:
    """Parses requests from a byte stream (see the module docstring for the contract)."""

    __slots__ = ("_buf", "_max_line", "_max_value", "_pending", "_pos")

    def __init__(self, max_line: int = MAX_LINE, max_value: int = MAX_VALUE) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._max_line = max_line
        self._max_value = max_value
        # A storage command waiting for its payload: (tokens, size, command or error).
        self._pending: tuple[list[bytes], int, Set | ProtocolError | None] | None = None

    def receive_data(self, data: bytes) -> None:
        """Append bytes read from the connection."""
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    @property
    def buffered(self) -> int:
        """Bytes received but not yet parsed into a command."""
        return len(self._buf) - self._pos

    def next_command(self) -> Command | NeedData:
        """The next complete command, or NEED_DATA. Raises ProtocolError (see module doc)."""
        if self._pending is not None:
            return self._payload()
        buf = self._buf
        nl = buf.find(b"\n", self._pos)
        if nl < 0:
            if len(buf) - self._pos > self._max_line:
                raise ProtocolError("line too long", close=True)
            return NEED_DATA
        if nl - self._pos > self._max_line:
            raise ProtocolError("line too long", close=True)
        line = bytes(buf[self._pos : nl])
        self._pos = nl + 1
        tokens = line.split()
        if not tokens:
            return Unknown(b"")
        return self._dispatch(tokens)

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
        simple = _SIMPLE.get(cmd)
        if simple is not None:
            return Simple(simple)
        return Unknown(cmd)

    def _get(self, tokens: list[bytes], cas: bool) -> Get:
        if len(tokens) < 2:
            raise ProtocolError("missing queue name")
        # Like Kestrel, only the first key is served: a queue get returns at most one item.
        return parse_get_key(tokens[1], cas)

    def _storage(self, tokens: list[bytes]) -> Command | NeedData:
        if len(tokens) < 5:
            raise ProtocolError("bad command line format", close=True)
        try:
            size = int(tokens[4])
        except ValueError:
            raise ProtocolError("bad data chunk size", close=True) from None
        if size < 0 or size > self._max_value:
            raise ProtocolError("object too large for cache", close=True)
        outcome: Set | ProtocolError | None
        if tokens[0] != b"set":
            outcome = None  # consumed, then answered as an unknown command
        else:
            try:
                outcome = Set(
                    _queue(tokens[1]),
                    _int(tokens[2], "flags"),
                    _int(tokens[3], "exptime"),
                    b"",
                    len(tokens) > 5 and tokens[5] == b"noreply",
                )
            except ProtocolError as exc:
                outcome = exc
        self._pending = (tokens, size, outcome)
        return self._payload()

    def _payload(self) -> Command | NeedData:
        assert self._pending is not None
        tokens, size, outcome = self._pending
        start = self._pos
        end = start + size
        if len(self._buf) < end + 2:
            return NEED_DATA
        if self._buf[end : end + 2] != b"\r\n":
            self._pending = None
            raise ProtocolError("bad data chunk", close=True)
        self._pending = None
        self._pos = end + 2
        if isinstance(outcome, Set):
            outcome.data = bytes(self._buf[start:end])
            return outcome
        if outcome is None:
            return Unknown(tokens[0])
        raise outcome


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
