"""The one exception tree of tercel.

Every error tercel raises on purpose is one of these::

    TercelError
    ├── ProtocolError         a request the codec cannot accept; ``close`` says whether the
    │                         connection can still find the next command boundary
    ├── QueueError            a request the queue layer refuses
    │   ├── BadQueueName      the name is empty, too long or has a forbidden byte
    │   ├── ItemTooLarge      the item exceeds the queue's max_item_size
    │   └── OpenReadError     Kestrel's open-read violations (answered with bare ``ERROR``)
    ├── UnavailableError      the server's status (or shutdown) forbids the operation
    │   ├── TooManyLeases     the queue's ``max_open_leases`` leases are all open
    │   ├── TooManyQueues     ``max_queues`` queues exist: no new one is created
    │   ├── TooManyOpenFiles  the process is out of file descriptors (EMFILE, ENFILE)
    │   │   └── JournalOutOfDescriptors  ... for a journal file (also a JournalError)
    │   └── NoSpaceLeft       the file system has no room for a new queue's journal file
    ├── ConfigError           a configuration file or value is invalid
    ├── JournalError          something is wrong with a journal file (carries path and offset)
    │   ├── JournalCorrupt    a bad record that is not a torn tail: start-up must stop
    │   ├── JournalOutOfDescriptors  (see above): nothing was written, the journal goes on
    │   └── JournalWriteError the OS refused a journal write or fsync
    └── ClientError           what the client library (:mod:`tercel.client`) reports
        ├── TransportError    connecting, sending or receiving failed; the connection is dropped
        │   └── ClientTimeout the server did not answer in time
        ├── BadReply          a reply that does not parse; the connection is dropped
        ├── ServerReplyError  the server answered ERROR, CLIENT_ERROR or SERVER_ERROR
        ├── NotStored         the server refused an item (queue full, item too large)
        └── NoServerAvailable every server of the list is set aside after failures

Protocol handlers translate these into wire replies at one place; any other exception that
reaches a connection is a bug: it is logged and the connection is closed.
"""

from __future__ import annotations


class TercelError(Exception):
    """Base class of every error tercel raises on purpose."""


class ProtocolError(TercelError):
    """A request that cannot be accepted.

    ``reason`` is the short text sent to the client after ``CLIENT_ERROR``. ``close`` is true
    when the codec lost the command boundary (an over-long line, a payload not followed by
    CRLF, an absurd size) and the connection must be closed after the reply.
    """

    def __init__(self, reason: str, *, close: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.close = close


class QueueError(TercelError):
    """A request the queue layer refuses; ``reason`` goes to the client."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class BadQueueName(QueueError):
    """The queue name is empty, longer than 200 bytes, or has a byte outside the allowed set."""

    def __init__(self, name: str = "") -> None:
        super().__init__("bad queue name")
        self.name = name


class ItemTooLarge(QueueError):
    """The item is larger than the queue's ``max_item_size``."""

    def __init__(self) -> None:
        super().__init__("item too large")


class OpenReadError(QueueError):
    """A Kestrel open-read violation: a plain get while holding an open read, or too many."""


class UnavailableError(TercelError):
    """The server's status (READONLY, QUIESCENT, shutting down) forbids the operation."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TooManyLeases(UnavailableError):
    """The queue already has ``max_open_leases`` open leases (``SERVER_ERROR``)."""

    def __init__(self) -> None:
        super().__init__("too many open leases")


class TooManyQueues(UnavailableError):
    """``max_queues`` queues exist already: the request would create one more."""

    def __init__(self) -> None:
        super().__init__("too many queues")


class TooManyOpenFiles(UnavailableError):
    """The process (EMFILE) or the system (ENFILE) has no file descriptor left for this
    request; the request is refused, nothing else is affected."""

    def __init__(self) -> None:
        super().__init__("too many open files")


class NoSpaceLeft(UnavailableError):
    """The file system has no room (ENOSPC, EDQUOT) for the journal file of the queue this
    request would create: the request is refused and the queue is not created (no file is
    left behind); nothing else is affected."""

    def __init__(self) -> None:
        super().__init__("no space left on device")


class ConfigError(TercelError):
    """An invalid configuration file or value; the message names the key."""


class JournalError(TercelError):
    """A problem with a journal file, located by ``path`` and byte ``offset``."""

    def __init__(self, message: str, path: str, offset: int) -> None:
        super().__init__(f"{path} at offset {offset}: {message}")
        self.path = path
        self.offset = offset


class JournalCorrupt(JournalError):
    """A bad record that is not a torn tail. Start-up stops; nothing is truncated."""


class JournalWriteError(JournalError):
    """The OS refused a write or fsync; the journal refuses further writes."""


class JournalOutOfDescriptors(TooManyOpenFiles, JournalError):
    """A journal file could not be (re)opened for the record this request would append: no
    descriptor left (EMFILE, ENFILE), even after the descriptor pool closed every file it
    could. Nothing was buffered and the journal is not failed: this one request is refused
    (``SERVER_ERROR too many open files``, as a :class:`TooManyOpenFiles`), and code that
    goes on past a journal that cannot be written (an expiry sweep, a lease over several
    queues) catches it as the :class:`JournalError` it also is."""

    def __init__(self, path: str, offset: int) -> None:
        JournalError.__init__(self, "too many open files", path, offset)
        self.reason = "too many open files"


# ---- the client library ---------------------------------------------------------------------


class ClientError(TercelError):
    """Base class of the failures :mod:`tercel.client` reports; ``server`` is ``host:port``
    (empty when no single server is to blame)."""

    def __init__(self, message: str, server: str = "") -> None:
        super().__init__(f"{server}: {message}" if server else message)
        self.server = server


class TransportError(ClientError):
    """Connecting, sending or receiving failed (refused, reset, closed mid-reply). The
    connection is dropped; the server is set aside for a while."""


class ClientTimeout(TransportError):
    """The server did not accept the connection or answer within the client's timeout."""


class BadRequest(ClientError):
    """A request the client refuses to send: a queue name (or other word of a request line)
    that is empty or holds whitespace, a control character or a non-ASCII one would not be
    read as one word (``flush a b`` is the server's ``flush a``)."""


class BadReply(ClientError):
    """A reply that does not parse: client and server disagree about the protocol."""


class ServerReplyError(ClientError):
    """The server answered ``ERROR``, ``CLIENT_ERROR <reason>`` or ``SERVER_ERROR <reason>``.

    ``kind`` is the first word, ``reason`` the rest (often empty for ``ERROR``).
    """

    def __init__(self, kind: str, reason: str, server: str = "") -> None:
        super().__init__(f"{kind} {reason}".strip(), server)
        self.kind = kind
        self.reason = reason


class NotStored(ClientError):
    """The server answered ``NOT_STORED``: the queue is full or the item too large.
    ``stored`` counts the items of a batch that were stored before (in order)."""

    def __init__(self, message: str, server: str = "", stored: int = 0) -> None:
        super().__init__(message, server)
        self.stored = stored


class NoServerAvailable(ClientError):
    """Every server of the client's list failed recently and is set aside."""


# ---- keys (keyed leases, dedup keys) ------------------------------------------------------------


class BadKey(QueueError):
    """A request with a lease key or dedup key that breaks a rule; ``reason`` names the rule
    (sent after ``CLIENT_ERROR``). Nothing was changed."""


class LeaseKeyEnded(QueueError):
    """The keyed lease was acked, released or ran out: its key cannot be taken again (it
    would hand out other items). ``how`` is ``acked``, ``released`` or ``expired``."""

    def __init__(self, key: str, how: str) -> None:
        super().__init__(f"lease key {key} was {how}: a key is never taken again")
        self.key = key
        self.how = how


class TooManyKeys(UnavailableError):
    """The queue holds ``max_dedup_keys`` dedup keys (or ``max_lease_keys`` keyed leases)
    younger than their window: the request is refused, nothing is stored (``SERVER_ERROR``)."""

    def __init__(self, what: str = "too many dedup keys") -> None:
        super().__init__(what)
