"""Kestrel's text protocol, server side: bytes -> commands, replies -> bytes.

One request per line; a line ends in LF, and a CR before the LF is dropped (CRLF accepted).
The command word is case-insensitive; queue names are not. A line ending in ``:`` opens a
batch: every following line is one item, up to an empty line. Replies are one line each:
``+<n>`` a count, ``-<message>`` an error (the connection stays open), ``:<item>`` an item or
a string, ``*`` no item (docs/protocol.md, "Text protocol").

Contract of :class:`TextServerCodec`: feed bytes with :meth:`~TextServerCodec.receive_data`,
then call :meth:`~TextServerCodec.next_command` until it returns :data:`NEED_DATA`. A request
it refuses raises :class:`ProtocolError` whose ``reason`` is the reply's message; the
request's bytes were consumed (a refused batch up to its empty line) and the next call goes
on with the next request: a line-framed protocol never loses its place, so ``close`` is always
false. Any other exception is a bug.

Where Kestrel loses data, this codec does not: Kestrel stored each item line re-encoded from
ISO-8859-1 to UTF-8, and consumed and dropped the line that arrived when a batch already held
1024 items. Here an item is the line's bytes as sent (its CR aside), and a batch over the
limits below is refused whole, with a ``-`` reply, instead of being cut.

Limits, with their precedents: a command line may be 8 KiB (the memcache codec's limit; Kestrel
had none); an item line 64 MiB (the memcache payload limit); a batch 100,000 items and 64 MiB
of items. A line over its limit is skipped as it arrives, never buffered whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from tercel.errors import ProtocolError
from tercel.names import valid_name_bytes
from tercel.protocol.commands import Confirm, Delete, Flush, Simple, Status
from tercel.protocol.dedup import KEY_WORD, key_word
from tercel.protocol.memcache import MAX_DIGITS, MAX_LINE, MAX_VALUE, NEED_DATA, NeedData

__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_BATCH_ITEMS",
    "NEED_DATA",
    "NO_ITEM",
    "TextAuth",
    "TextCommand",
    "TextGet",
    "TextMonitor",
    "TextPeek",
    "TextPut",
    "TextServerCodec",
    "count",
    "error",
    "item",
    "item_parts",
    "string",
]

MAX_BATCH_ITEMS: Final = 100_000
MAX_BATCH_BYTES: Final = MAX_VALUE


@dataclass(slots=True)
class TextPut:
    """``put <queue> [expiry_ms]:`` and its item lines: reply ``+<stored>``. With a dedup key,
    ``put <queue> [expiry_ms] key=<K>:`` and one item line: reply ``:<item_id>`` or
    ``:<item_id> duplicate`` (``+0`` when the queue is full; docs/protocol.md, "Dedup keys")."""

    queue: str
    expiry_ms: int
    """Relative milliseconds; 0 means the items never expire."""
    items: list[bytes]
    key: str | None = None
    """The dedup key of a keyed put (checked: :func:`tercel.names.key_problem`)."""


@dataclass(slots=True)
class TextGet:
    """``get <queue> [timeout_ms]``: confirm this connection's open reads on the queue, then
    open one read."""

    queue: str
    timeout_ms: int | None
    """Milliseconds to wait; None (absent or <= 0 on the wire) means do not wait."""


@dataclass(slots=True)
class TextPeek:
    """``peek <queue> [timeout_ms]``: the head item, not taken."""

    queue: str
    timeout_ms: int | None


@dataclass(slots=True)
class TextMonitor:
    """``monitor <queue> <timeout_ms> [max_items]``: stream open reads, then ``*``."""

    queue: str
    timeout_ms: int
    max_items: int | None


@dataclass(slots=True)
class TextAuth:
    """``auth <user> <password>`` (tercel's): log in (``+0``, or ``-<reason>``). The
    password is one word: it may not hold white space."""

    user: str
    password: bytes

    def __repr__(self) -> str:  # never show a password in a log or a traceback
        return f"TextAuth(user={self.user!r})"


TextCommand = (
    TextPut
    | TextGet
    | TextPeek
    | TextMonitor
    | Confirm
    | Flush
    | Delete
    | Status
    | Simple
    | TextAuth
)
"""What :meth:`TextServerCodec.next_command` returns. ``Simple`` names ``version``,
``shutdown`` or ``quit``; an unknown word is a ProtocolError (``Unknown command: <word>``)."""

_SIMPLE: Final = frozenset((b"version", b"shutdown", b"quit"))


def _number(token: bytes, message: str) -> int:
    """A decimal integer of at most :data:`MAX_DIGITS` significant digits, optionally
    negative; anything else raises ProtocolError(message)."""
    digits = token[1:] if token[:1] == b"-" else token
    if not digits.isdigit() or not digits.isascii() or len(digits.lstrip(b"0")) > MAX_DIGITS:
        raise ProtocolError(message)
    return int(token)


def _queue(tokens: list[bytes], required: str) -> str:
    if len(tokens) < 2:
        raise ProtocolError(required)
    if not valid_name_bytes(tokens[1]):
        raise ProtocolError("Bad queue name.")
    return tokens[1].decode("ascii")


def _timeout(tokens: list[bytes]) -> int | None:
    if len(tokens) < 3:
        return None
    ms = _number(tokens[2], "Error parsing timeout.")
    return ms if ms > 0 else None


def _printable(word: bytes) -> str:
    """``word`` as ASCII fit for a reply line (echoed in ``Unknown command: <word>``)."""
    text = word[:40].decode("latin-1")
    return "".join(c if " " < c < "\x7f" else "?" for c in text)


def parse_line(tokens: list[bytes]) -> TextCommand:
    """The command of one request line (no batch), split into ``tokens``, its word
    lower-cased. Raises ProtocolError with Kestrel's message for a malformed request."""
    word = tokens[0]
    if word == b"get":
        return TextGet(_queue(tokens, "Queue name required."), _timeout(tokens))
    if word == b"peek":
        return TextPeek(_queue(tokens, "Queue name required."), _timeout(tokens))
    if word == b"monitor":
        queue = _queue(tokens, "Queue name & timeout required.")
        if len(tokens) < 3:
            raise ProtocolError("Queue name & timeout required.")
        timeout = _number(tokens[2], "Error parsing timeout.")
        limit = None
        if len(tokens) > 3:
            limit = _number(tokens[3], "Error parsing count.")
            if limit < 0:
                raise ProtocolError("Error parsing count.")
        return TextMonitor(queue, timeout, limit)
    if word == b"confirm":
        queue = _queue(tokens, "Queue name & count required.")
        if len(tokens) < 3:
            raise ProtocolError("Queue name & count required.")
        n = _number(tokens[2], "Error parsing count.")
        if n < 0:
            raise ProtocolError("Error parsing count.")
        return Confirm(queue, n)
    if word == b"flush":
        return Flush(_queue(tokens, "Queue name required."))
    if word == b"delete":
        return Delete(_queue(tokens, "Queue name required."))
    if word == b"status":
        return Status(tokens[1].decode("latin-1") if len(tokens) > 1 else None)
    if word == b"put":  # a put line without ':' has no items (Kestrel answers +0)
        put = _put_head(tokens)
        if put.key is not None:
            raise ProtocolError("A put with a key carries exactly one item.")
        return put
    if word in _SIMPLE:
        return Simple(word.decode("ascii"))
    if word == b"auth":
        if len(tokens) != 3:
            raise ProtocolError("Usage: auth <user> <password>")
        return TextAuth(tokens[1].decode("utf-8", "replace"), tokens[2])
    raise ProtocolError(f"Unknown command: {_printable(word)}")


def _put_head(tokens: list[bytes]) -> TextPut:
    """The put command of a ``put <queue> [expiry_ms] [key=<K>]`` line, with no items yet."""
    key = None
    if len(tokens) > 2 and tokens[-1][:4] == KEY_WORD:
        key = key_word(tokens.pop())
    queue = _queue(tokens, "Queue name required.")
    expiry = 0
    if len(tokens) > 2:
        expiry = _number(tokens[2], "Error parsing expiration time.")
        if expiry < 0:
            raise ProtocolError("Error parsing expiration time.")
    return TextPut(queue, expiry, [], key)


@dataclass(slots=True)
class _Batch:
    """The batch being read: the put it will be (or why it is refused), its size so far."""

    put: TextPut | None
    refusal: str | None
    size: int = 0


class TextServerCodec:
    """Parses requests from a byte stream (see the module docstring for the contract)."""

    __slots__ = (
        "_batch",
        "_buf",
        "_max_batch_bytes",
        "_max_batch_items",
        "_max_item",
        "_max_line",
        "_pos",
        "_scanned",
        "_skipping",
    )

    def __init__(
        self,
        max_line: int = MAX_LINE,
        max_item: int = MAX_VALUE,
        max_batch_items: int = MAX_BATCH_ITEMS,
        max_batch_bytes: int = MAX_BATCH_BYTES,
    ) -> None:
        self._buf = bytearray()
        self._pos = 0
        # No LF before this offset (from _pos on): a line arriving in many reads (an item of
        # megabytes) is searched once, not once per read from its start.
        self._scanned = 0
        self._max_line = max_line
        self._max_item = max_item
        self._max_batch_items = max_batch_items
        self._max_batch_bytes = max_batch_bytes
        self._batch: _Batch | None = None
        # Set while the rest of an over-long line is thrown away: the reply it will get.
        self._skipping: str | None = None

    def receive_data(self, data: bytes) -> None:
        """Append bytes read from the connection."""
        if self._pos:  # drop what was parsed before growing the buffer: one move per read
            del self._buf[: self._pos]
            self._scanned = max(0, self._scanned - self._pos)
            self._pos = 0
        self._buf += data

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a command: not yet parsed, and the items of a
        batch whose empty line has not come (an over-long line being skipped holds none)."""
        held = len(self._buf) - self._pos
        batch = self._batch
        if batch is not None:
            held += batch.size
        return held

    def next_command(self) -> TextCommand | NeedData:
        """The next complete command, or NEED_DATA. Raises ProtocolError (module doc)."""
        while True:
            line = self._line()
            if line is None:
                return NEED_DATA
            if self._batch is not None:
                done = self._batch_line(line, self._batch)
                if done is not None:
                    return done
                continue
            cmd = self._request(line)
            if cmd is not None:
                return cmd

    def _limit(self) -> int:
        return self._max_line if self._batch is None else self._max_item

    def _line(self) -> bytes | None:
        """The next whole line without its LF (and CR), or None when it is not all here. A
        line over the limit is thrown away as it arrives (only its last two bytes are kept,
        to see whether it ends in ``:``); once its LF came, :meth:`_refuse` answers it."""
        buf = self._buf
        while True:
            nl = buf.find(b"\n", max(self._pos, self._scanned))
            if nl < 0:
                self._scanned = len(buf)
            if self._skipping is not None:
                if nl < 0:
                    del buf[self._pos : len(buf) - 2]
                    self._scanned = len(buf)
                    return None
                reason, self._skipping = self._skipping, None
                self._refuse(reason, nl)
                continue
            limit = self._limit()
            if nl < 0:
                if len(buf) - self._pos > limit + 1:  # + 1: room for the CR of a CRLF
                    self._skipping = self._too_long()
                    continue
                return None
            end = nl - 1 if nl > self._pos and buf[nl - 1] == 13 else nl
            if end - self._pos > limit:
                self._refuse(self._too_long(), nl)
                continue
            line = bytes(buf[self._pos : end])
            self._pos = nl + 1
            return line

    def _too_long(self) -> str:
        if self._batch is None:
            return f"Line too long (limit {self._max_line} bytes)."
        return f"Item too large (limit {self._max_item} bytes)."

    def _refuse(self, reason: str, nl: int) -> None:
        """Consume the over-long line that ends at ``nl``. Inside a batch it refuses the
        batch, answered at the batch's empty line; a request line ending in ``:`` opens a
        refused batch; any other request line is refused now (raises ProtocolError)."""
        buf = self._buf
        opens_batch = buf[nl - 1 : nl] == b":" or buf[nl - 2 : nl] == b":\r"
        self._pos = nl + 1
        if self._batch is not None:
            self._batch.put = None
            if self._batch.refusal is None:
                self._batch.refusal = reason
        elif opens_batch:
            self._batch = _Batch(None, reason)
        else:
            raise ProtocolError(reason)

    def _request(self, line: bytes) -> TextCommand | None:
        """The command of a request line; None when the line opened a batch (its command,
        or its refusal, comes with the batch's empty line)."""
        opens_batch = line.endswith(b":")
        tokens = (line[:-1] if opens_batch else line).split()
        if not tokens:
            if not opens_batch:
                raise ProtocolError("Unknown command: ")
            self._batch = _Batch(None, "Queue name required.")  # ":" alone
            return None
        tokens[0] = tokens[0].lower()
        if not opens_batch:
            return parse_line(tokens)
        if tokens[0] != b"put":  # Kestrel would run it and ignore the items: refuse instead
            self._batch = _Batch(None, f"Unknown command: {_printable(tokens[0])}")
            return None
        try:
            self._batch = _Batch(_put_head(tokens), None)
        except ProtocolError as exc:
            self._batch = _Batch(None, exc.reason)
        return None

    def _batch_line(self, line: bytes, batch: _Batch) -> TextCommand | None:
        """Take one line of the open batch; the batch's command once its empty line came."""
        if not line:
            self._batch = None
            if batch.put is None:
                raise ProtocolError(batch.refusal or "Bad request.")
            if batch.put.key is not None and len(batch.put.items) != 1:
                raise ProtocolError("A put with a key carries exactly one item.")
            return batch.put
        if batch.put is None:
            return None
        items = batch.put.items
        if len(items) >= self._max_batch_items:
            batch.refusal = f"Too many items in one put (limit {self._max_batch_items})."
            batch.put = None
        elif batch.size + len(line) > self._max_batch_bytes:
            batch.refusal = f"Put too large (limit {self._max_batch_bytes} bytes of items)."
            batch.put = None
        else:
            items.append(line)
            batch.size += len(line)
        return None


# ---- replies ----------------------------------------------------------------------------

NO_ITEM: Final = b"*\n"


def count(n: int) -> bytes:
    """``+<n>``: a count."""
    return b"+%d\n" % n


def error(message: str) -> bytes:
    """``-<message>``: an error; the connection stays open."""
    text = " ".join(message.split())
    return b"-%b\n" % text.encode("ascii", "replace")


def item(data: bytes) -> bytes:
    """``:<item>``: an item. The caller checks first that it holds no LF (see
    :func:`fits_a_line`)."""
    return b":%b\n" % data


def item_parts(data: bytes) -> tuple[bytes, bytes, bytes]:
    """:func:`item` as three pieces for a list of replies joined once: the item is not
    copied into a reply of its own first (an item may be 64 MiB)."""
    return (b":", data, b"\n")


def fits_a_line(data: bytes) -> bool:
    """True when ``data`` can travel as one ``:<item>`` line: no LF in it, and no CR at its
    end (a reader accepting CRLF would take that CR for the line's end)."""
    return b"\n" not in data and not data.endswith(b"\r")


def string(text: str) -> bytes:
    """``:<text>``: a string reply (``version``, ``status``)."""
    return b":%b\n" % " ".join(text.split()).encode("ascii", "replace")
