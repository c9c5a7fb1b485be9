"""Kestrel's Thrift service, server side, sans-IO: frames -> typed calls, results -> frames.

Wire-compatible with Kestrel 2.4: framed transport (:mod:`tercel.protocol.thrift_framing`),
binary protocol, the service of the IDL shipped beside this module (``kestrel.thrift``, also
:data:`IDL_PATH`). thriftpy2 decodes the arguments and encodes the results.

Contract of :class:`ThriftServerCodec`: feed bytes with :meth:`~ThriftServerCodec.receive_data`,
then call :meth:`~ThriftServerCodec.next_call` until it returns :data:`NEED_DATA`. Each frame
gives one typed call; a call that cannot be served (unknown method, wrong message type,
malformed or missing arguments) gives a :class:`BadCall`, to be answered with
:func:`reply_exception` while the connection goes on. A frame whose header cannot be read, or
a frame length outside ``1..max_frame``, raises :class:`ProtocolError` (``close``): there is
no sequence id to answer. Any other exception is a bug.

Untrusted frames never reach thriftpy2 unchecked: :func:`~tercel.protocol.thrift_check.check_args`
first walks the arguments once and checks every length, count, type and the nesting depth
against the frame, at no more cost than the decode (its module docstring). After the walk,
every size is bounded by the frame, and the Cython decoder is used: 0.05 us per 64-byte item of
a put against 0.8 us for the pure-Python one (``git show 1f1f505:docs/benchmarks.md``,
"Thrift"; the codec today: docs/benchmarks.md, "Investigations").
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final

import thriftpy2
from thriftpy2.protocol import TCyBinaryProtocol as _CyProtocol
from thriftpy2.thrift import TApplicationException
from thriftpy2.transport import TCyMemoryBuffer

from tercel.errors import ProtocolError
from tercel.names import key_problem, valid_name
from tercel.protocol.memcache import NEED_DATA, NeedData
from tercel.protocol.thrift_check import check_args
from tercel.protocol.thrift_framing import FrameDecoder, frame

IDL_PATH: Final = str(Path(__file__).with_name("kestrel.thrift"))
"""The service's IDL, shipped in the package: generate clients from it."""

kestrel_thrift: Any = thriftpy2.load(IDL_PATH, module_name="tercel_kestrel_thrift")
"""The IDL loaded by thriftpy2: ``kestrel_thrift.Kestrel``, ``.Item``, ``.QueueInfo``,
``.Status``."""
_SERVICE: Final[Any] = kestrel_thrift.Kestrel
TCyBinaryProtocol: Final[Any] = _CyProtocol  # untyped in thriftpy2: called through Any

# Message types and TApplicationException kinds (the Thrift specification's numbers).
CALL: Final = 1
REPLY: Final = 2
EXCEPTION: Final = 3
ONEWAY: Final = 4
UNKNOWN_METHOD: Final = 1
INVALID_MESSAGE_TYPE: Final = 2
INTERNAL_ERROR: Final = 6
PROTOCOL_ERROR: Final = 7

NOT_CONFIGURED: Final = 0
QUIESCENT: Final = 1
READ_ONLY: Final = 2
UP: Final = 3
STATUS_NAMES: Final = {NOT_CONFIGURED: "NOT_CONFIGURED", QUIESCENT: "QUIESCENT"} | {
    READ_ONLY: "READ_ONLY",
    UP: "UP",
}

MAX_NAME: Final = 64
"""The longest method name a header may carry (the longest real one has 16 bytes)."""

# ---- calls ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Put:
    """``i32 put(queue_name, items, expiration_msec)``: add in order, stop at the first refusal."""

    METHOD: ClassVar[str] = "put"
    seqid: int
    queue: str
    items: list[bytes]
    expiration_msec: int
    """Relative ms; 0 (or less) means never."""


@dataclass(slots=True)
class PutKeyed:
    """``PutResult put_keyed(queue_name, item, key, expiration_msec)``: one item with a dedup
    key (docs/protocol.md, "Dedup keys")."""

    METHOD: ClassVar[str] = "put_keyed"
    seqid: int
    queue: str
    item: bytes
    key: str
    expiration_msec: int
    """Relative ms; 0 (or less) means never."""


@dataclass(slots=True)
class Get:
    """``list<Item> get(queue_name, max_items, timeout_msec, auto_abort_msec)``."""

    METHOD: ClassVar[str] = "get"
    seqid: int
    queue: str
    max_items: int
    timeout_msec: int
    auto_abort_msec: int


@dataclass(slots=True)
class Confirm:
    """``i32 confirm(queue_name, ids)``: confirm reserved items; count the ids found."""

    METHOD: ClassVar[str] = "confirm"
    seqid: int
    queue: str
    ids: list[int]
    """Distinct ids, in the order they came."""


@dataclass(slots=True)
class Abort:
    """``i32 abort(queue_name, ids)``: return reserved items to their queue's head."""

    METHOD: ClassVar[str] = "abort"
    seqid: int
    queue: str
    ids: list[int]


@dataclass(slots=True)
class Peek:
    """``QueueInfo peek(queue_name)``."""

    METHOD: ClassVar[str] = "peek"
    seqid: int
    queue: str


@dataclass(slots=True)
class FlushQueue:
    """``void flush_queue(queue_name)``."""

    METHOD: ClassVar[str] = "flush_queue"
    seqid: int
    queue: str


@dataclass(slots=True)
class FlushAllQueues:
    """``void flush_all_queues()``."""

    METHOD: ClassVar[str] = "flush_all_queues"
    seqid: int


@dataclass(slots=True)
class DeleteQueue:
    """``void delete_queue(queue_name)``."""

    METHOD: ClassVar[str] = "delete_queue"
    seqid: int
    queue: str


@dataclass(slots=True)
class CurrentStatus:
    """``Status current_status()``."""

    METHOD: ClassVar[str] = "current_status"
    seqid: int


@dataclass(slots=True)
class SetStatus:
    """``void set_status(status)``; ``status`` is the enum's number (not checked here)."""

    METHOD: ClassVar[str] = "set_status"
    seqid: int
    status: int


@dataclass(slots=True)
class GetVersion:
    """``string get_version()``."""

    METHOD: ClassVar[str] = "get_version"
    seqid: int


@dataclass(slots=True)
class Auth:
    """``void auth(user, password)`` (tercel's login)."""

    METHOD: ClassVar[str] = "auth"
    seqid: int
    user: str
    password: bytes = field(repr=False)


@dataclass(slots=True)
class BadCall:
    """A call that cannot be served; answer it with :func:`reply_exception` (``kind``,
    ``reason``) and go on."""

    seqid: int
    method: str
    kind: int
    reason: str


ThriftCall = (
    Put
    | PutKeyed
    | Get
    | Confirm
    | Abort
    | Peek
    | FlushQueue
    | FlushAllQueues
    | DeleteQueue
    | CurrentStatus
    | SetStatus
    | GetVersion
    | Auth
    | BadCall
)


class _Refused(Exception):
    """Raised while building a call from decoded arguments: a BadCall's reason."""


def _queue(args: Any) -> str:
    name = args.queue_name
    if name is None:
        raise _Refused("queue_name is required")
    if not isinstance(name, str) or not valid_name(name):
        raise _Refused("bad queue name")
    return name


def _required(value: Any, what: str) -> Any:
    if value is None:
        raise _Refused(f"{what} is required")
    return value


def _int(value: Any) -> int:
    """An optional i32 argument: absent reads as 0 (the IDL's defaults are 0)."""
    return 0 if value is None else int(value)


def _key(args: Any) -> str:
    key = _required(args.key, "key")
    why = key_problem(key) if isinstance(key, str) else "key must be a string"
    if why is not None:
        raise _Refused(why)
    return str(key)


def _ids(args: Any) -> list[int]:
    return list(dict.fromkeys(_required(args.ids, "ids")))


_BUILDERS: Final[dict[str, Any]] = {
    "put": lambda s, a: Put(s, _queue(a), _required(a.items, "items"), _int(a.expiration_msec)),
    "put_keyed": lambda s, a: PutKeyed(
        s, _queue(a), _required(a.item, "item"), _key(a), _int(a.expiration_msec)
    ),
    "get": lambda s, a: Get(
        s,
        _queue(a),
        _required(a.max_items, "max_items"),
        _int(a.timeout_msec),
        _int(a.auto_abort_msec),
    ),
    "confirm": lambda s, a: Confirm(s, _queue(a), _ids(a)),
    "abort": lambda s, a: Abort(s, _queue(a), _ids(a)),
    "peek": lambda s, a: Peek(s, _queue(a)),
    "flush_queue": lambda s, a: FlushQueue(s, _queue(a)),
    "flush_all_queues": lambda s, a: FlushAllQueues(s),
    "delete_queue": lambda s, a: DeleteQueue(s, _queue(a)),
    "current_status": lambda s, a: CurrentStatus(s),
    "set_status": lambda s, a: SetStatus(s, _required(a.status, "status")),
    "get_version": lambda s, a: GetVersion(s),
    "auth": lambda s, a: Auth(
        s, _required(a.user, "user"), str(_required(a.password, "password")).encode()
    ),
}
"""method name -> build(seqid, decoded args) -> call; raises _Refused."""


# ---- the codec --------------------------------------------------------------------------------


class ThriftServerCodec:
    """Framed binary-protocol calls from a byte stream (see the module docstring)."""

    __slots__ = ("_frames",)

    def __init__(self, max_frame: int) -> None:
        self._frames = FrameDecoder(max_frame)

    def receive_data(self, data: bytes) -> None:
        """Append bytes read from the connection."""
        self._frames.receive_data(data)

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned in a call."""
        return self._frames.buffered

    def next_call(self) -> ThriftCall | NeedData:
        """The next call, or NEED_DATA. Raises ProtocolError (close; see the module doc)."""
        payload = self._frames.next_frame()
        if payload is NEED_DATA:
            return NEED_DATA
        assert isinstance(payload, bytes)
        return decode_call(payload)


_I8: Final = struct.Struct("!b")
_I32: Final = struct.Struct("!i")
_VERSION_1: Final = 0x80010000
_VERSION_MASK: Final = 0xFFFF0000


def _header(payload: bytes) -> tuple[str, int, int, int]:
    """``(method, message type, seqid, offset of the arguments)`` of a message, strict
    (versioned) or old-style. Raises ProtocolError (close) when it cannot be read."""
    try:
        (first,) = _I32.unpack_from(payload, 0)
        if first < 0:
            if first & _VERSION_MASK != _VERSION_1:
                raise ProtocolError("bad thrift protocol version", close=True)
            mtype = first & 0xFF
            (size,) = _I32.unpack_from(payload, 4)
            start = 8
        else:
            size, start = first, 4
        if not 0 <= size <= MAX_NAME:
            raise ProtocolError("bad thrift method name", close=True)
        name = payload[start : start + size]
        pos = start + size
        if first >= 0:
            (mtype,) = _I8.unpack_from(payload, pos)
            pos += 1
        (seqid,) = _I32.unpack_from(payload, pos)
    except struct.error:
        raise ProtocolError("truncated thrift message header", close=True) from None
    if len(name) < size or not name.isascii():
        raise ProtocolError("bad thrift method name", close=True)
    return name.decode("ascii"), mtype, seqid, pos + 4


def decode_call(payload: bytes) -> ThriftCall:
    """The call in one frame's payload (see the module docstring)."""
    method, mtype, seqid, start = _header(payload)
    if mtype != CALL:  # the service has no oneway method
        return BadCall(seqid, method, INVALID_MESSAGE_TYPE, f"message type {mtype} is not a call")
    build = _BUILDERS.get(method)
    if build is None:
        return BadCall(seqid, method, UNKNOWN_METHOD, f"unknown method {method}")
    args = getattr(_SERVICE, method + "_args")()
    try:
        check_args(payload, start, args.thrift_spec)
    except ProtocolError as exc:
        return BadCall(seqid, method, PROTOCOL_ERROR, f"malformed arguments: {exc.reason}")
    try:
        proto = TCyBinaryProtocol(TCyMemoryBuffer(payload[start:]), decode_response=True)
        proto.read_struct(args)
    except Exception as exc:  # the library's errors are not one documented family
        return BadCall(seqid, method, PROTOCOL_ERROR, f"malformed arguments: {exc}")
    try:
        call: ThriftCall = build(seqid, args)
    except (_Refused, TypeError, ValueError) as exc:
        return BadCall(seqid, method, PROTOCOL_ERROR, str(exc) or "bad arguments")
    return call


# ---- replies ----------------------------------------------------------------------------------


@dataclass(slots=True)
class QueueInfo:
    """What :class:`Peek` answers (the IDL's ``QueueInfo``)."""

    head_item: bytes | None
    items: int
    bytes: int
    journal_bytes: int
    age: int
    waiters: int
    open_transactions: int


def _message(method: str, mtype: int, seqid: int, body: Any) -> bytes:
    buf = TCyMemoryBuffer()
    proto = TCyBinaryProtocol(buf)
    proto.write_message_begin(method, mtype, seqid)
    proto.write_struct(body)
    proto.write_message_end()
    return frame(buf.getvalue())


def _result(call: Any, success: Any) -> bytes:
    method: str = call.METHOD
    result = getattr(_SERVICE, method + "_result")()
    if success is not None:
        result.success = success
    return _message(method, REPLY, call.seqid, result)


def reply_count(call: Put | Confirm | Abort, n: int) -> bytes:
    """The i32 result of ``put``, ``confirm`` or ``abort``."""
    return _result(call, n)


def reply_put_keyed(call: PutKeyed, item_id: int, duplicate: bool) -> bytes:
    """The ``PutResult`` of ``put_keyed``."""
    return _result(call, kestrel_thrift.PutResult(item_id=item_id, duplicate=duplicate))


def reply_items(call: Get, items: Sequence[tuple[bytes, int]]) -> bytes:
    """The ``list<Item>`` result of ``get``: ``(data, id)`` pairs (id 0: taken for good)."""
    item = kestrel_thrift.Item
    return _result(call, [item(data=d, id=i) for d, i in items])


def reply_queue_info(call: Peek, info: QueueInfo) -> bytes:
    """The ``QueueInfo`` result of ``peek``."""
    value = kestrel_thrift.QueueInfo(
        head_item=info.head_item,
        items=info.items,
        bytes=info.bytes,
        journal_bytes=info.journal_bytes,
        age=info.age,
        waiters=info.waiters,
        open_transactions=info.open_transactions,
    )
    return _result(call, value)


def reply_void(call: FlushQueue | FlushAllQueues | DeleteQueue | SetStatus | Auth) -> bytes:
    """The empty result of a ``void`` method."""
    return _result(call, None)


def reply_status(call: CurrentStatus, status: int) -> bytes:
    """The ``Status`` result of ``current_status``."""
    return _result(call, status)


def reply_version(call: GetVersion, version: str) -> bytes:
    """The string result of ``get_version``."""
    return _result(call, version)


def reply_exception(seqid: int, method: str, kind: int, message: str) -> bytes:
    """A ``TApplicationException`` of ``kind`` answering call ``seqid`` of ``method``."""
    return _message(method, EXCEPTION, seqid, TApplicationException(type=kind, message=message))
