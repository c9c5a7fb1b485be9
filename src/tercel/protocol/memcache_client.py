"""Kestrel's memcache protocol, client side: commands -> bytes, bytes -> replies.

Contract of :class:`MemcacheClientCodec`: :meth:`~MemcacheClientCodec.send` turns a command of
:mod:`tercel.protocol.commands` into the bytes to write and remembers which kind of reply it
gets; feed what the server sends to :meth:`~MemcacheClientCodec.receive_data`, then call
:meth:`~MemcacheClientCodec.next_reply` until it returns :data:`NEED_DATA`. Memcache replies
carry no request ids, so they come back in request order and pipelining is several sends before
reading. A reply that does not parse raises :class:`~tercel.errors.BadReply`: the stream is
lost and the connection must be dropped. No I/O, no clock (the client owns both).
"""

from __future__ import annotations

import sys
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from tercel.errors import BadReply, BadRequest
from tercel.names import key_problem, name_problem, valid_key_bytes, valid_name_bytes
from tercel.protocol.commands import (
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
    LeaseKey,
    LeaseSlice,
    Monitor,
    Release,
    ReleaseKey,
    Renew,
    RenewKey,
    Set,
    Simple,
    Status,
)
from tercel.protocol.memcache import NEED_DATA, NeedData


@dataclass(slots=True)
class Value:
    """``VALUE <key> <flags> <bytes> [<cas>]`` and its payload (a get hit)."""

    key: bytes
    data: bytes
    cas: int | None = None


@dataclass(slots=True)
class Line:
    """A one-line reply: ``STORED``, ``NOT_STORED``, ``DELETED``, ``END``, ``OK``,
    ``VERSION x``, ``ACKED 3``, a bare count..., without its CRLF."""

    text: str


@dataclass(slots=True)
class Listing:
    """``STAT k v`` or ``FEATURE name version`` lines up to ``END``, as ``(k, v)`` pairs."""

    pairs: list[tuple[str, str]] = field(default_factory=list)


@dataclass(slots=True)
class Blocks:
    """The reply to ``dump_stats``: ``queue '<name>' {`` / ``  k=v`` ... / ``}`` per queue."""

    blocks: dict[str, dict[str, str]] = field(default_factory=dict)


@dataclass(slots=True)
class LeasedItem:
    """One ``LEASED <lease_id> <item_id> <deliveries> <add_ms> <expiry_ms> <bytes>`` item."""

    lease_id: str
    item_id: int
    deliveries: int
    add_ms: int
    expiry_ms: int
    data: bytes


@dataclass(slots=True)
class LeaseBatch:
    """The reply to ``lease``: its items (possibly none)."""

    items: list[LeasedItem] = field(default_factory=list)


class LeaseColumns:
    """The reply to a ``lease`` sent with ``columns``: its items as flat columns, no object
    per item but the lease id (a Spark source turns these into Arrow arrays without copying
    the payloads again). Item ``k``'s payload is ``data[offsets[k]:offsets[k + 1]]``."""

    __slots__ = ("add_ms", "data", "deliveries", "expiry_ms", "item_ids", "lease_ids", "offsets")

    def __init__(self) -> None:
        self.lease_ids: list[str] = []
        self.item_ids = array("q")
        self.deliveries = array("i")
        self.add_ms = array("q")
        self.expiry_ms = array("q")
        """0: the item never expires."""
        self.data = bytearray()
        self.offsets = array("i", [0])
        """Start of each payload in :attr:`data`, and the end of the last (``len + 1``)."""

    def __len__(self) -> int:
        return len(self.lease_ids)

    def _fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LeaseColumns) and self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"LeaseColumns({len(self)} items, ids {self.lease_ids[:3]}...)"


@dataclass(slots=True)
class Values:
    """The reply to ``monitor``: every streamed VALUE up to the final ``END``."""

    values: list[Value] = field(default_factory=list)


@dataclass(slots=True)
class ErrorReply:
    """``ERROR``, ``CLIENT_ERROR <reason>`` or ``SERVER_ERROR <reason>``."""

    kind: str
    reason: str


Reply = Value | Line | Listing | Blocks | LeaseBatch | LeaseColumns | Values | ErrorReply

_ERRORS: Final = (b"ERROR", b"CLIENT_ERROR", b"SERVER_ERROR")
_LEASEDB: Final = b"LEASEDB "
_LEASEDB_ROW: Final = 4 * 8 + 4 + 4
"""Column-table bytes per item of a ``LEASEDB`` reply (four int64, deliveries, an offset)."""
_LEASEDB_TAIL: Final = b"\r\nEND\r\n"
_INT32_MAX: Final = 0x7FFFFFFF
_BIG_ENDIAN: Final = sys.byteorder == "big"
_LISTINGS: Final = {"stats": b"STAT", "features": b"FEATURE"}
_NO_REPLY: Final = frozenset(("quit", "shutdown"))


def get_key(
    queue: str,
    *,
    timeout_ms: int | None = None,
    open: bool = False,
    close: bool = False,
    abort: bool = False,
    peek: bool = False,
) -> bytes:
    """``queue[/t=ms][/close][/open][/abort][/peek]``: a Kestrel get key. BadRequest for a
    ``queue`` that is not a queue name (:func:`_name`)."""
    key = _name(queue).decode("ascii")
    if timeout_ms is not None and timeout_ms > 0:
        key += f"/t={timeout_ms}"
    for flag, word in ((close, "close"), (open, "open"), (abort, "abort"), (peek, "peek")):
        if flag:
            key += "/" + word
    return key.encode("utf-8")


def _word(text: str | bytes) -> bytes:
    """``text`` as one word of a request line; BadRequest when it would not be read as one
    (empty, or holding whitespace, a control character or a non-ASCII one)."""
    raw = text.encode("utf-8") if isinstance(text, str) else text
    if not raw or not raw.isascii() or any(c <= 32 or c == 127 for c in raw):
        raise BadRequest(f"bad queue name {raw[:80]!r}: not one printable ASCII word")
    return raw


def _key(key: str) -> bytes:
    """``key`` as a keyed set's key word; BadRequest stating the rule when the server would
    refuse it (:func:`tercel.names.key_problem`: a space or a CR would also end the word)."""
    raw = key.encode("utf-8")
    if valid_key_bytes(raw):
        return raw
    raise BadRequest(key_problem(key) or "bad key")


def _name(queue: str | bytes) -> bytes:
    """``queue`` as a request's queue name; BadRequest stating the rule when the server would
    refuse it (the server's own rule, :mod:`tercel.names`)."""
    raw = queue.encode("utf-8") if isinstance(queue, str) else queue
    if valid_name_bytes(raw):
        return raw
    raise BadRequest(name_problem(raw.decode("utf-8", "replace")) or "bad queue name")


def _key_word(key: str) -> bytes:
    """``key=<key>``; BadRequest stating the rule when the server would refuse the key."""
    problem = key_problem(key)
    if problem is not None:
        raise BadRequest(problem)
    return b"key=" + key.encode("ascii")


def _error(line: bytes) -> ErrorReply | None:
    kind, _, reason = line.partition(b" ")
    if kind in _ERRORS:
        return ErrorReply(kind.decode(), reason.decode("latin-1"))
    return None


def _ints(tokens: list[bytes], line: bytes) -> list[int]:
    try:
        return [int(t) for t in tokens]
    except ValueError:
        raise BadReply(f"bad reply line {line[:80]!r}") from None


class MemcacheClientCodec:
    """Builds requests and parses their replies (see the module docstring)."""

    __slots__ = ("_buf", "_expect", "_partial", "_pos")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._expect: deque[Callable[[], Reply | None]] = deque()
        self._partial: list[object] = []

    @property
    def pending(self) -> int:
        """Replies still expected."""
        return len(self._expect)

    # ---- requests -------------------------------------------------------------------------

    def send(self, cmd: Command) -> bytes:
        """The bytes of ``cmd``; its reply is expected after those of earlier sends."""
        data, reader = self._encode(cmd)
        if reader is not None:
            self._expect.append(reader)
        return data

    def _encode(self, cmd: Command) -> tuple[bytes, Callable[[], Reply | None] | None]:
        line = self._line_reply
        match cmd:
            case Get():
                return b"%b %b\r\n" % (b"gets" if cmd.cas else b"get", _word(cmd.key)), self._value
            case Set():
                head = b"set %b %d %d %d" % (
                    _name(cmd.queue),
                    cmd.flags,
                    cmd.exptime,
                    len(cmd.data),
                )
                return head + b"\r\n" + cmd.data + b"\r\n", line
            case KeyedSet():
                head = b"set %b %d %d %d key=%b" % (
                    _name(cmd.queue),
                    cmd.flags,
                    cmd.exptime,
                    len(cmd.data),
                    _key(cmd.key),
                )
                return head + b"\r\n" + cmd.data + b"\r\n", line
            case Delete() | Flush():
                verb = b"delete" if isinstance(cmd, Delete) else b"flush"
                return b"%b %b\r\n" % (verb, _name(cmd.queue)), line
            case FlushAll():
                return b"flush_all\r\n", line
            case FlushExpired():
                return b"flush_expired %b\r\n" % _name(cmd.queue), line
            case DumpStats():
                return b" ".join((b"dump_stats", *(_name(q) for q in cmd.queues))) + b"\r\n", (
                    self._blocks
                )
            case Simple():
                reader = self._listing if cmd.name in _LISTINGS else line
                return cmd.name.encode() + b"\r\n", None if cmd.name in _NO_REPLY else reader
            case Status():
                tail = b"" if cmd.value is None else b" " + _word(cmd.value)
                return b"status%b\r\n" % tail, line
            case Lease():
                args = (_name(cmd.queue), cmd.max_items, cmd.wait_ms, cmd.lease_ms)
                if cmd.columns:
                    return b"lease %b %d %d %d binary\r\n" % args, self._lease_columns
                return b"lease %b %d %d %d\r\n" % args, self._lease
            case Ack() | Release():
                verb = b"ack" if isinstance(cmd, Ack) else b"release"
                return b" ".join((verb, _name(cmd.queue), *_id_bytes(cmd.ids))) + b"\r\n", line
            case Renew():
                head = b"renew %b %d" % (_name(cmd.queue), cmd.lease_ms)
                return b" ".join((head, *_id_bytes(cmd.ids))) + b"\r\n", line
            case Monitor():
                tail = b"" if cmd.max_items is None else b" %d" % cmd.max_items
                return b"monitor %b %d%b\r\n" % (
                    _name(cmd.queue),
                    cmd.seconds,
                    tail,
                ), self._values
            case Confirm():
                return b"confirm %b %d\r\n" % (_name(cmd.queue), cmd.count), line
            case LeaseKey() | LeaseSlice() | AckKey() | ReleaseKey() | RenewKey():
                return self._encode_keyed(cmd)
        raise ValueError(f"the client codec cannot send {type(cmd).__name__}")

    def _encode_keyed(
        self, cmd: LeaseKey | LeaseSlice | AckKey | ReleaseKey | RenewKey
    ) -> tuple[bytes, Callable[[], Reply | None]]:
        """The ``key=`` forms (docs/protocol.md section 11, "Keyed leases"): a take answers
        ``KEYED`` (``nodata``) or its items, a slice its items (``LEASEDB`` with ``binary``),
        ack/release ``ACKED``/``RELEASED <n>``, renew ``KEYED``."""
        name, key = _name(cmd.queue), _key_word(cmd.key)
        match cmd:
            case LeaseKey():
                head = b"lease %b %d %d %d" % (name, cmd.max_items, cmd.wait_ms, cmd.lease_ms)
                if cmd.nodata:
                    return b"%b %b nodata\r\n" % (head, key), self._line_reply
                if cmd.columns:
                    return b"%b binary %b\r\n" % (head, key), self._lease_columns
                return b"%b %b\r\n" % (head, key), self._lease
            case LeaseSlice():
                head = b"lease %b slice %d %d" % (name, cmd.start, cmd.stop)
                if cmd.columns:
                    return b"%b binary %b\r\n" % (head, key), self._lease_columns
                return b"%b %b\r\n" % (head, key), self._lease
            case AckKey():
                return b"ack %b %b\r\n" % (name, key), self._line_reply
            case ReleaseKey():
                return b"release %b %b\r\n" % (name, key), self._line_reply
            case RenewKey():
                return b"renew %b %d %b\r\n" % (name, cmd.lease_ms, key), self._line_reply

    # ---- replies --------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Append bytes read from the connection."""
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def next_reply(self) -> Reply | NeedData:
        """The next complete reply, or NEED_DATA. Raises BadReply (see the module docstring)."""
        if not self._expect:
            if len(self._buf) > self._pos:
                raise BadReply("the server sent bytes nobody asked for")
            return NEED_DATA
        reply = self._expect[0]()
        if reply is None:
            return NEED_DATA
        self._expect.popleft()
        self._partial = []
        return reply

    def _peek_line(self) -> tuple[bytes, int] | None:
        end = self._buf.find(b"\r\n", self._pos)
        if end < 0:
            return None
        return bytes(self._buf[self._pos : end]), end + 2

    def _line_reply(self) -> Reply | None:
        got = self._peek_line()
        if got is None:
            return None
        line, self._pos = got
        return _error(line) or Line(line.decode("latin-1"))

    def _payload(self, start: int, size: int) -> tuple[bytes, int] | None:
        """``size`` bytes and CRLF at ``start``; None until they are all here."""
        end = start + size
        if len(self._buf) < end + 2:
            return None
        if self._buf[end : end + 2] != b"\r\n":
            raise BadReply("a payload not followed by CRLF")
        return bytes(self._buf[start:end]), end + 2

    def _one_value(self, line: bytes, after: int) -> tuple[Value, int] | None:
        tokens = line.split()
        if len(tokens) not in (4, 5):
            raise BadReply(f"bad VALUE line {line[:80]!r}")
        nums = _ints(tokens[2:], line)
        got = self._payload(after, nums[1])
        if got is None:
            return None
        return Value(tokens[1], got[0], nums[2] if len(nums) == 3 else None), got[1]

    def _value(self) -> Reply | None:
        got = self._peek_line()
        if got is None:
            return None
        line, after = got
        if not line.startswith(b"VALUE "):
            self._pos = after
            if line == b"END":
                return Line("END")
            err = _error(line)
            if err is None:
                raise BadReply(f"unexpected reply {line[:80]!r}")
            return err
        value = self._one_value(line, after)
        if value is None:
            return None
        end = value[1]
        if len(self._buf) < end + 5:
            return None
        if self._buf[end : end + 5] != b"END\r\n":
            raise BadReply("a VALUE not followed by END")
        self._pos = end + 5
        return value[0]

    def _listing(self) -> Reply | None:
        while (got := self._peek_line()) is not None:
            line, self._pos = got
            if line == b"END":
                return Listing([p for p in self._partial if isinstance(p, tuple)])
            word, _, rest = line.partition(b" ")
            if word not in (b"STAT", b"FEATURE"):
                err = _error(line)
                if err is not None and not self._partial:
                    return err
                raise BadReply(f"unexpected listing line {line[:80]!r}")
            key, _, val = rest.partition(b" ")
            self._partial.append((key.decode("latin-1"), val.decode("latin-1")))
        return None

    def _blocks(self) -> Reply | None:
        while (got := self._peek_line()) is not None:
            line, self._pos = got
            if line == b"END":
                blocks: dict[str, dict[str, str]] = {}
                for p in self._partial:
                    if isinstance(p, tuple):
                        blocks.setdefault(p[0], {}).update(p[1])
                return Blocks(blocks)
            text = line.decode("latin-1")
            if text.startswith("queue '") and text.endswith("' {"):
                self._partial.append((text[7:-3], {}))
            elif text.startswith("  ") and "=" in text and self._partial:
                key, _, val = text[2:].partition("=")
                last = self._partial[-1]
                assert isinstance(last, tuple)
                last[1][key] = val
            elif text != "}":
                err = _error(line)
                if err is not None and not self._partial:
                    return err
                raise BadReply(f"unexpected dump_stats line {line[:80]!r}")
        return None

    def _lease(self) -> Reply | None:
        while (got := self._peek_line()) is not None:
            line, after = got
            if line == b"END":
                self._pos = after
                return LeaseBatch([p for p in self._partial if isinstance(p, LeasedItem)])
            tokens = line.split()
            if tokens[:1] != [b"LEASED"] or len(tokens) != 7:
                err = _error(line)
                if err is not None and not self._partial:
                    self._pos = after
                    return err
                raise BadReply(f"unexpected lease line {line[:80]!r}")
            nums = _ints(tokens[2:], line)
            payload = self._payload(after, nums[4])
            if payload is None:
                return None
            self._pos = payload[1]
            lease_id = tokens[1].decode("latin-1")
            item_id, deliveries, add_ms, expiry_ms = nums[:4]
            self._partial.append(
                LeasedItem(lease_id, item_id, deliveries, add_ms, expiry_ms, payload[0])
            )
        return None

    def _lease_columns(self) -> Reply | None:
        """A ``LEASEDB`` reply (:meth:`_lease_binary`), or the ``LEASED`` lines of a server
        that ignored ``binary`` (:meth:`_lease_text_columns`), as one :class:`LeaseColumns`."""
        if not self._partial:
            head = bytes(self._buf[self._pos : self._pos + len(_LEASEDB)])
            if head == _LEASEDB:
                return self._lease_binary()
            if _LEASEDB.startswith(head):
                return None  # not yet known which form comes
        return self._lease_text_columns()

    def _lease_binary(self) -> Reply | None:
        """``LEASEDB <n> <prefix> <bytes>``, the column table, the payloads, ``\\r\\nEND\\r\\n``
        (docs/protocol.md section 11) into one :class:`LeaseColumns`: the columns are copied
        out of the receive buffer whole (no per-item parsing but the lease id strings)."""
        got = self._peek_line()
        if got is None:
            return None
        line, start = got
        tokens = line.split()
        if len(tokens) != 4:
            raise BadReply(f"bad LEASEDB line {line[:80]!r}")
        n, size = _ints([tokens[1], tokens[3]], line)
        if n < 0 or size < 0 or size > _INT32_MAX:
            raise BadReply(f"bad LEASEDB line {line[:80]!r}")
        table = _LEASEDB_ROW * n + 4
        end = start + table + size
        buf = self._buf
        if len(buf) < end + len(_LEASEDB_TAIL):
            return None
        if buf[end : end + len(_LEASEDB_TAIL)] != _LEASEDB_TAIL:
            raise BadReply("a LEASEDB block not followed by END")
        cols = LeaseColumns()
        numbers = array("q")
        with memoryview(buf) as view:
            at = start
            for column, width in (
                (cols.item_ids, 8 * n),
                (cols.add_ms, 8 * n),
                (cols.expiry_ms, 8 * n),
                (numbers, 8 * n),
                (cols.deliveries, 4 * n),
            ):
                column.frombytes(view[at : at + width])
                at += width
            offsets = array("i")
            offsets.frombytes(view[at : at + 4 * (n + 1)])
            cols.data = bytearray(view[at + 4 * (n + 1) : end])
        if _BIG_ENDIAN:
            for column in (cols.item_ids, cols.add_ms, cols.expiry_ms, numbers):
                column.byteswap()
            cols.deliveries.byteswap()
            offsets.byteswap()
        if offsets[0] != 0 or offsets[n] != size or offsets.tolist() != sorted(offsets):
            raise BadReply("LEASEDB payload offsets out of order")
        cols.offsets = offsets
        cols.lease_ids = list(map((tokens[2].decode("latin-1") + "-%x").__mod__, numbers))
        self._pos = end + len(_LEASEDB_TAIL)
        return cols

    def _lease_text_columns(self) -> Reply | None:
        """``_lease`` into one :class:`LeaseColumns` (kept in ``_partial`` until ``END``)."""
        if not self._partial:
            self._partial.append(LeaseColumns())
        cols = self._partial[0]
        assert isinstance(cols, LeaseColumns)
        buf = self._buf
        pos = self._pos
        have = len(buf)
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            tokens = buf[pos:eol].split()
            if len(tokens) != 7 or tokens[0] != b"LEASED":
                line = bytes(buf[pos:eol])
                self._pos = eol + 2
                if line == b"END":
                    return cols
                err = _error(line)
                if err is not None and not len(cols):
                    return err
                raise BadReply(f"unexpected lease line {line[:80]!r}")
            try:
                size = int(tokens[6])
                item_id, deliveries = int(tokens[2]), int(tokens[3])
                add_ms, expiry_ms = int(tokens[4]), int(tokens[5])
            except ValueError:
                size = -1
            if size < 0:
                raise BadReply(f"bad reply line {bytes(buf[pos:eol])[:80]!r}")
            start = eol + 2
            end = start + size
            if have < end + 2:
                break
            if buf[end : end + 2] != b"\r\n":
                raise BadReply("a payload not followed by CRLF")
            try:
                cols.item_ids.append(item_id)
                cols.deliveries.append(deliveries)
                cols.add_ms.append(add_ms)
                cols.expiry_ms.append(expiry_ms)
                cols.data += buf[start:end]
                cols.offsets.append(len(cols.data))  # int32, as Arrow's binary offsets
            except OverflowError:  # the stream is dropped: the columns need not agree
                raise BadReply(
                    f"number out of range, or payloads over 2 GiB {bytes(buf[pos:eol])[:80]!r}"
                ) from None
            cols.lease_ids.append(tokens[1].decode("latin-1"))
            pos = end + 2
        self._pos = pos
        return None

    def _values(self) -> Reply | None:
        while (got := self._peek_line()) is not None:
            line, after = got
            if not line.startswith(b"VALUE "):
                self._pos = after
                if line == b"END":
                    return Values([p for p in self._partial if isinstance(p, Value)])
                err = _error(line)
                if err is not None and not self._partial:
                    return err
                raise BadReply(f"unexpected monitor line {line[:80]!r}")
            value = self._one_value(line, after)
            if value is None or len(self._buf) < value[1] + 5:
                return None
            if self._buf[value[1] : value[1] + 5] != b"END\r\n":
                raise BadReply("a VALUE not followed by END")
            self._pos = value[1] + 5
            self._partial.append(value[0])
        return None


def _id_bytes(ids: tuple[str, ...]) -> list[bytes]:
    return [i.encode("latin-1") for i in ids]
