"""The record format, version 4: pure encode and decode, no files.

Every file starts with an 8-byte header (``b"TRCL"``, the format version, three zero bytes).
Every record is ``u32 length | u32 crc32 | body`` (little-endian), where ``length`` counts the
body and the crc32 (zlib's) covers the body; the body starts with a one-byte opcode. The full
table is in ``docs/journal_format.md``; changing it follows the procedure written there.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable, Iterator
from typing import Final, Protocol

try:  # the same CRC-32 as zlib's, 3-4x faster on 1 KiB (docs/benchmarks.md)
    from zlib_ng.zlib_ng import crc32 as _crc32
except ImportError:  # no wheel for this platform: the standard library's is identical
    from zlib import crc32 as _crc32

crc32: Final = _crc32
"""The records' checksum; the journal's other modules use this one."""

Bytes = bytes | bytearray | memoryview | mmap.mmap
"""Anything replay can read records from."""

MAGIC: Final = b"TRCL"
VERSION: Final = 4
"""Version 2 has version 1's records; what is new is that a file may end in zero bytes
(space written ahead of the records so an ``fdatasync`` need not commit a new file size):
a record prefix of eight zero bytes ends the records, and only zeros may follow it. Version 3
adds RETURN (an open read's item back to its place by item id; ABORT puts it at the head) and
the beanstalkd job log's opcodes (``joblog.py``). Version 4 adds the keyed leases' records
(opcodes 11-14) and their lease files (docs/journal_format.md §18), and the dedup keys'
ADD_KEYED and DEDUP_KEY (and the job log's keyed PUT)."""
VERSIONS: Final = (1, 2, 3, VERSION)
"""Versions replay reads. Files of an older version are read, never appended to."""


def file_header(version: int) -> bytes:
    """The 8 bytes that start a file of format ``version``."""
    return MAGIC + bytes([version, 0, 0, 0])


FILE_HEADER: Final = file_header(VERSION)
HEADER_SIZE: Final = len(FILE_HEADER)


def header_version(head: bytes) -> int | None:
    """The format version of a file that starts with ``head``, None if it is not a complete
    header of a version this code reads."""
    if len(head) >= HEADER_SIZE and head[:4] == MAGIC and head[5:8] == b"\0\0\0":
        return head[4] if head[4] in VERSIONS else None
    return None


OP_ADD: Final = 1
OP_REMOVE: Final = 2
OP_OPEN: Final = 3
OP_CONFIRM: Final = 4
OP_ABORT: Final = 5
OP_FLUSH: Final = 6
OP_SNAPSHOT: Final = 7
OP_RESUME: Final = 8
OP_DELIVERED: Final = 9
OP_RETURN: Final = 10
# dedup keys (docs/journal_format.md, "Dedup keys")
OP_ADD_KEYED: Final = 20
"""An ADD and its dedup key in one record: a torn write never stores an item without its key."""
OP_DEDUP_KEY: Final = 21
"""A remembered dedup key, as a compaction's snapshot writes it (its item may be gone)."""
OP_KEY_TAKE: Final = 11
OP_KEY_LIVE: Final = 12
OP_KEY_END: Final = 13
OP_KEY_RENEW: Final = 14
OP_NAMES: Final = {
    OP_ADD: "ADD",
    OP_REMOVE: "REMOVE",
    OP_OPEN: "OPEN",
    OP_CONFIRM: "CONFIRM",
    OP_ABORT: "ABORT",
    OP_RETURN: "RETURN",
    OP_FLUSH: "FLUSH",
    OP_SNAPSHOT: "SNAPSHOT",
    OP_RESUME: "RESUME",
    OP_DELIVERED: "DELIVERED",
    OP_ADD_KEYED: "ADD_KEYED",
    OP_DEDUP_KEY: "DEDUP_KEY",
    OP_KEY_TAKE: "KEY_TAKE",
    OP_KEY_LIVE: "KEY_LIVE",
    OP_KEY_END: "KEY_END",
    OP_KEY_RENEW: "KEY_RENEW",
}

KEY_ACKED: Final = 1
"""KEY_END's ``how``: every item of the keyed lease confirmed."""
KEY_RELEASED: Final = 2
"""KEY_END's ``how``: the items went back to their places (release)."""
KEY_EXPIRED: Final = 3
"""KEY_END's ``how``: the items went back to their places (the lease ran out)."""
KEY_HOW: Final = {KEY_ACKED: "acked", KEY_RELEASED: "released", KEY_EXPIRED: "expired"}
MAX_KEY: Final = 200
"""A lease key's longest form (``tercel.names.MAX_KEY_BYTES``)."""

MAX_PAYLOAD: Final = 64 * 1024 * 1024
"""No item can be larger (the codecs refuse bigger ones), so no honest record is either."""

_PREFIX = struct.Struct("<II")  # body length, crc32 of body
_ADD = struct.Struct("<BQqq")  # op, item id, add time ms, expiry ms (0 = none)
_pack_prefix: Final = _PREFIX.pack  # bound once: add_header runs for every item
_pack_add: Final = _ADD.pack
_XID = struct.Struct("<BI")  # op, xid
_SNAPSHOT = struct.Struct("<BQI")  # op, next item id, last xid
_RESUME = struct.Struct("<BQQQQ")  # op, cursor file seq, cursor offset, snapshot seq, offset
# op, lease file number, items, payload bytes, max_items, created_at, expires_at; then the key
_KEY_TAKE = struct.Struct("<BQQQQqq")
_KEY_END = struct.Struct("<BB")  # op, how; then the key
_KEY_RENEW = struct.Struct("<Bq")  # op, expires_at; then the key
KEY_LENGTHS: Final[dict[int, int]] = {
    OP_KEY_TAKE: _KEY_TAKE.size,
    OP_KEY_LIVE: _KEY_TAKE.size,
    OP_KEY_END: _KEY_END.size,
    OP_KEY_RENEW: _KEY_RENEW.size,
}
"""The fixed part of each keyed-lease record (a key of 1-200 bytes follows it)."""
PREFIX: Final[struct.Struct] = _PREFIX
ADD_FIELDS: Final[struct.Struct] = _ADD
PREFIX_SIZE: Final[int] = _PREFIX.size
ADD_FIELDS_SIZE: Final[int] = _ADD.size
ADD_HEAD_SIZE: Final[int] = PREFIX_SIZE + ADD_FIELDS_SIZE
"""Bytes of an ADD record before its payload."""
MAX_BODY: Final = ADD_FIELDS_SIZE + MAX_PAYLOAD


class RecordSink(Protocol):
    """What replay drives: one method per opcode, called in journal order."""

    def on_add(self, item_id: int, add_time: int, expiry: int, data: bytes) -> None: ...
    def on_remove(self) -> None: ...
    def on_open(self, xid: int) -> None: ...
    def on_confirm(self, xid: int) -> None: ...
    def on_abort(self, xid: int) -> None: ...
    def on_return(self, xid: int) -> None: ...
    def on_flush(self) -> None: ...
    def on_snapshot(self, next_id: int, xid: int) -> None: ...
    def on_delivered(self, count: int) -> None: ...
    def on_dedup_key(self, key: str, item_id: int, put_time: int) -> None: ...
    def on_key_take(
        self,
        key: str,
        *,
        n: int,
        count: int,
        size: int,
        max_items: int,
        created_at: int,
        expires_at: int,
        from_head: bool,
    ) -> None: ...
    def on_key_end(self, key: str, how: int) -> None: ...
    def on_key_renew(self, key: str, expires_at: int) -> None: ...


Position = tuple[int, int]
"""Where a record starts: (file sequence number, byte offset in that file)."""


_I64_MIN: Final = -(1 << 63)
_I64_MAX: Final = (1 << 63) - 1


def add_header(item_id: int, add_time: int, expiry: int, data: bytes) -> tuple[bytes, bytes]:
    """The prefix and the fields of the ADD record of ``data``; the payload follows them.

    Times outside the signed 64-bit range of the format are clamped to it (the queue already
    clamps expiries; this keeps a journal writable whatever a caller passes)."""
    try:
        fields = _pack_add(OP_ADD, item_id, add_time, expiry)
    except struct.error:  # free when nothing is out of range
        add_time = min(max(add_time, _I64_MIN), _I64_MAX)
        expiry = min(max(expiry, _I64_MIN), _I64_MAX)
        fields = _pack_add(OP_ADD, item_id, add_time, expiry)
    return _pack_prefix(ADD_FIELDS_SIZE + len(data), crc32(data, crc32(fields))), fields


def encode_add(buf: bytearray, item_id: int, add_time: int, expiry: int, data: bytes) -> None:
    """Append an ADD record to ``buf``: an item enters the tail of the queue."""
    prefix, fields = add_header(item_id, add_time, expiry, data)
    buf += prefix
    buf += fields
    buf += data


def _record(body: bytes) -> bytes:
    """The whole record of ``body``: its length and crc32, then the body."""
    return _PREFIX.pack(len(body), crc32(body)) + body


REMOVE_RECORD: Final = _record(bytes([OP_REMOVE]))
FLUSH_RECORD: Final = _record(bytes([OP_FLUSH]))


def xid_record(op: int, xid: int) -> bytes:
    """An OPEN, CONFIRM, ABORT or DELIVERED record for ``xid`` (or a count)."""
    return _record(_XID.pack(op, xid))


def encode_xid(buf: bytearray, op: int, xid: int) -> None:
    """Append an OPEN, CONFIRM, ABORT or DELIVERED record for ``xid`` to ``buf``."""
    buf += xid_record(op, xid)


def encode_snapshot(buf: bytearray, next_id: int, xid: int) -> None:
    """Append a SNAPSHOT record: replay forgets all state so far and sets the counters."""
    buf += _record(_SNAPSHOT.pack(OP_SNAPSHOT, next_id, xid))


def encode_resume(buf: bytearray, cursor: Position, taken: Position) -> None:
    """Append a RESUME record (see docs/journal_format.md: read-behind compaction)."""
    buf += _record(_RESUME.pack(OP_RESUME, cursor[0], cursor[1], taken[0], taken[1]))


def decode_resume(buf: Bytes, pos: int) -> tuple[Position, Position]:
    """The (cursor, taken) positions of the RESUME record at ``pos``."""
    _, cs, co, ts, to = _RESUME.unpack_from(buf, pos + PREFIX_SIZE)
    return (cs, co), (ts, to)


# ---- dedup keys ---------------------------------------------------------------------------

_KEYED = struct.Struct("<BQqqB")  # op, item id, add time ms, expiry ms, key length
_DEDUP_KEY = struct.Struct("<BQq")  # op, item id, put time ms; the key follows
MAX_DEDUP_KEY: Final = 255
"""The longest dedup key a record can hold (the key rule allows 200 bytes)."""


def add_keyed_header(
    item_id: int, add_time: int, expiry: int, data: bytes, key: bytes
) -> tuple[bytes, bytes]:
    """The prefix and the fields (the key included) of the ADD_KEYED record of ``data`` put
    with the dedup key ``key`` (1-255 bytes); the payload follows them. Times are clamped as
    :func:`add_header` clamps them."""
    try:
        fields = _KEYED.pack(OP_ADD_KEYED, item_id, add_time, expiry, len(key)) + key
    except struct.error:  # free when nothing is out of range
        add_time = min(max(add_time, _I64_MIN), _I64_MAX)
        expiry = min(max(expiry, _I64_MIN), _I64_MAX)
        fields = _KEYED.pack(OP_ADD_KEYED, item_id, add_time, expiry, len(key)) + key
    return _PREFIX.pack(len(fields) + len(data), crc32(data, crc32(fields))), fields


def encode_add_keyed(
    buf: bytearray, item_id: int, add_time: int, expiry: int, data: bytes, *, key: bytes
) -> None:
    """Append an ADD_KEYED record to ``buf``: an item enters the tail of the queue, put with
    the dedup key ``key``."""
    prefix, fields = add_keyed_header(item_id, add_time, expiry, data, key)
    buf += prefix
    buf += fields
    buf += data


def decode_add_keyed(buf: Bytes, pos: int, stop: int) -> tuple[int, int, int, bytes, str]:
    """``(item_id, add_time, expiry, data, key)`` of the (checked) ADD_KEYED record at
    ``pos``."""
    start = pos + PREFIX_SIZE
    _, item_id, add_time, expiry, klen = _KEYED.unpack_from(buf, start)
    kstart = start + _KEYED.size
    key = bytes(buf[kstart : kstart + klen]).decode("ascii", "replace")
    return item_id, add_time, expiry, bytes(buf[kstart + klen : stop]), key


def encode_dedup_key(buf: bytearray, key: bytes, item_id: int, put_time: int) -> None:
    """Append a DEDUP_KEY record: ``key`` stored item ``item_id`` at ``put_time``."""
    buf += _record(_DEDUP_KEY.pack(OP_DEDUP_KEY, item_id, put_time) + key)


def _dedup_key(buf: Bytes, start: int, stop: int) -> tuple[str, int, int]:
    _, item_id, put_time = _DEDUP_KEY.unpack_from(buf, start)
    key = bytes(buf[start + _DEDUP_KEY.size : stop]).decode("ascii", "replace")
    return key, item_id, put_time


def _check_keyed(buf: Bytes, start: int, length: int, op: int) -> str | None:
    """Why the ADD_KEYED or DEDUP_KEY body at ``start`` does not fit its opcode, or None."""
    if op == OP_DEDUP_KEY:
        if not _DEDUP_KEY.size < length <= _DEDUP_KEY.size + MAX_DEDUP_KEY:
            return "DEDUP_KEY record has the wrong length"
        return None
    if length < _KEYED.size or length < _KEYED.size + buf[start + _KEYED.size - 1]:
        return "ADD_KEYED record too short"
    if buf[start + _KEYED.size - 1] == 0:
        return "ADD_KEYED record has an empty key"
    return None


def encode_key_take(
    buf: bytearray,
    key: str,
    *,
    n: int,
    count: int,
    size: int,
    max_items: int,
    created_at: int,
    expires_at: int,
    live: bool = False,
) -> None:
    """Append a KEY_TAKE record (``count`` items from the head into lease file ``n`` of
    ``key``), or with ``live`` its snapshot form KEY_LIVE (the lease as it is; nothing taken)."""
    op = OP_KEY_LIVE if live else OP_KEY_TAKE
    fields = _KEY_TAKE.pack(op, n, count, size, max_items, created_at, expires_at)
    buf += _record(fields + key.encode("ascii"))


def encode_key_end(buf: bytearray, key: str, how: int) -> None:
    """Append a KEY_END record: ``key`` ended (``how``: :data:`KEY_ACKED`, ...)."""
    buf += _record(_KEY_END.pack(OP_KEY_END, how) + key.encode("ascii"))


def encode_key_renew(buf: bytearray, key: str, expires_at: int) -> None:
    """Append a KEY_RENEW record: ``key``'s lease now runs out at ``expires_at``."""
    buf += _record(_KEY_RENEW.pack(OP_KEY_RENEW, expires_at) + key.encode("ascii"))


def _key_fields(buf: Bytes, start: int, stop: int, op: int) -> tuple[tuple[int, ...], str]:
    fixed = KEY_LENGTHS[op]
    unpack = _KEY_TAKE if fixed == _KEY_TAKE.size else _KEY_END if op == OP_KEY_END else _KEY_RENEW
    return unpack.unpack_from(buf, start), bytes(buf[start + fixed : stop]).decode("ascii")


def record_op(buf: Bytes, pos: int) -> int:
    """The opcode of the (checked) record at ``pos``."""
    return buf[pos + PREFIX_SIZE]


def decode_add(buf: Bytes, pos: int, stop: int) -> tuple[int, int, int, bytes]:
    """``(item_id, add_time, expiry, data)`` of the (checked) ADD record at ``pos``."""
    start = pos + PREFIX_SIZE
    _, item_id, add_time, expiry = _ADD.unpack_from(buf, start)
    return item_id, add_time, expiry, bytes(buf[start + ADD_FIELDS_SIZE : stop])


FIXED_LENGTHS: Final[dict[int, int]] = {
    OP_OPEN: _XID.size,
    OP_CONFIRM: _XID.size,
    OP_ABORT: _XID.size,
    OP_RETURN: _XID.size,
    OP_REMOVE: 1,
    OP_FLUSH: 1,
    OP_SNAPSHOT: _SNAPSHOT.size,
    OP_RESUME: _RESUME.size,
    OP_DELIVERED: _XID.size,
}


class BadRecord(Exception):
    """Internal: the record at ``offset`` is incomplete or fails its checks."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(reason)
        self.offset = offset
        self.reason = reason


def check_record(buf: Bytes, pos: int) -> int:
    """Validate the record at ``pos``; return the offset just after it.

    Raises BadRecord when the record runs past the end of ``buf``, has an impossible length,
    a wrong checksum, an unknown opcode or fields that do not fit the opcode.
    """
    end = len(buf)
    if pos + PREFIX_SIZE > end:
        raise BadRecord(pos, "incomplete record header")
    length, crc = _PREFIX.unpack_from(buf, pos)
    if length == 0 or length > MAX_BODY:
        raise BadRecord(pos, f"impossible record length {length}")
    start = pos + PREFIX_SIZE
    stop = start + length
    if stop > end:
        raise BadRecord(pos, "record runs past the end of the file")
    # Views are released before anything is raised: a live view would pin an mmap open.
    with memoryview(buf) as view, view[start:stop] as body:
        crc_ok = crc32(body) == crc
        op = body[0]
    if not crc_ok:
        raise BadRecord(pos, "checksum mismatch")
    if op == OP_ADD:
        if length < ADD_FIELDS_SIZE:
            raise BadRecord(pos, "ADD record too short")
    elif op in FIXED_LENGTHS:
        if length != FIXED_LENGTHS[op]:
            raise BadRecord(pos, f"{OP_NAMES[op]} record has the wrong length")
    elif op in (OP_ADD_KEYED, OP_DEDUP_KEY):
        why = _check_keyed(buf, start, length, op)
        if why is not None:
            raise BadRecord(pos, why)
    elif op in KEY_LENGTHS:
        if not KEY_LENGTHS[op] < length <= KEY_LENGTHS[op] + MAX_KEY:
            raise BadRecord(pos, f"{OP_NAMES[op]} record has the wrong length")
    else:
        raise BadRecord(pos, f"unknown opcode {op}")
    return int(stop)


def apply_record(buf: Bytes, pos: int, stop: int, sink: RecordSink) -> None:
    """Call the sink method for the (already checked) record between ``pos`` and ``stop``."""
    start = pos + PREFIX_SIZE
    op = buf[start]
    if op == OP_ADD:
        _, item_id, add_time, expiry = _ADD.unpack_from(buf, start)
        sink.on_add(item_id, add_time, expiry, bytes(buf[start + ADD_FIELDS_SIZE : stop]))
    elif op == OP_REMOVE:
        sink.on_remove()
    elif op == OP_FLUSH:
        sink.on_flush()
    elif op == OP_SNAPSHOT:
        _, next_id, xid = _SNAPSHOT.unpack_from(buf, start)
        sink.on_snapshot(next_id, xid)
    elif op == OP_RESUME:
        pass  # positions only: the journal's replay acts on it, not the sink
    elif op == OP_DELIVERED:
        sink.on_delivered(_XID.unpack_from(buf, start)[1])
    elif op == OP_ADD_KEYED:
        item_id, add_time, expiry, data, key = decode_add_keyed(buf, pos, stop)
        sink.on_add(item_id, add_time, expiry, data)
        sink.on_dedup_key(key, item_id, add_time)
    elif op == OP_DEDUP_KEY:
        sink.on_dedup_key(*_dedup_key(buf, start, stop))
    elif op >= OP_KEY_TAKE:  # (a checked record: 11-14; the dedup keys' 20-21 are above)
        _apply_key(buf, start, stop, op, sink)
    else:
        xid = _XID.unpack_from(buf, start)[1]
        if op == OP_OPEN:
            sink.on_open(xid)
        elif op == OP_CONFIRM:
            sink.on_confirm(xid)
        elif op == OP_RETURN:
            sink.on_return(xid)
        else:
            sink.on_abort(xid)


def _apply_key(buf: Bytes, start: int, stop: int, op: int, sink: RecordSink) -> None:
    fields, key = _key_fields(buf, start, stop, op)
    if op == OP_KEY_END:
        sink.on_key_end(key, fields[1])
    elif op == OP_KEY_RENEW:
        sink.on_key_renew(key, fields[1])
    else:
        _, n, count, size, max_items, created_at, expires_at = fields
        sink.on_key_take(
            key,
            n=n,
            count=count,
            size=size,
            max_items=max_items,
            created_at=created_at,
            expires_at=expires_at,
            from_head=op != OP_KEY_LIVE,
        )


def scan(
    buf: bytes | bytearray,
    pos: int,
    on_add: Callable[[int, int, int, int, bytes], bool],
    on_other: Callable[[int, int], None] | None = None,
) -> int:
    """Walk the complete, valid, ordinary records of ``buf`` from ``pos``, in one tight loop.

    ``on_add(offset, item_id, add_time, expiry, data)`` is called for each ADD and returns
    False to stop after it; ``on_other(offset, stop)`` for each other fixed-size record
    (skipped when None). The walk stops, leaving the record for a careful reader, at anything
    unusual: an incomplete or bad record, or a RESUME. Returns the offset where it stopped.
    This is the hot loop of replay and of read-behind.
    """
    end = len(buf)
    prefix = _PREFIX.unpack_from
    add_fields = _ADD.unpack_from
    fixed = FIXED_LENGTHS
    # Slices of this view are checksummed without copying. No ``with`` blocks: the views die
    # with this call (mypyc, which compiles this module, cannot break out of one either).
    view = memoryview(buf)
    while pos + PREFIX_SIZE <= end:
        length, crc = prefix(buf, pos)
        stop = pos + PREFIX_SIZE + length
        if length == 0 or stop > end:
            break
        body = pos + PREFIX_SIZE
        op = buf[body]
        if op == OP_ADD and length >= ADD_FIELDS_SIZE:
            chunk = view[body:stop]
            if crc32(chunk) != crc:
                break
            _, item_id, add_time, expiry = add_fields(buf, body)
            more = on_add(pos, item_id, add_time, expiry, bytes(chunk[ADD_FIELDS_SIZE:]))
            pos = stop
            if not more:
                break
            continue
        if fixed.get(op) != length or op == OP_RESUME:
            break
        if crc32(view[body:stop]) != crc:
            break
        if on_other is not None:
            on_other(pos, stop)
        pos = stop
    return pos


def describe_record(buf: Bytes, pos: int, stop: int) -> dict[str, object]:
    """A plain description of a checked record (for tools such as ``tercel journal dump``)."""
    start = pos + PREFIX_SIZE
    op = buf[start]
    out: dict[str, object] = {"offset": pos, "op": OP_NAMES[op], "size": stop - pos}
    if op == OP_ADD:
        _, out["item_id"], out["add_time"], out["expiry"] = _ADD.unpack_from(buf, start)
        out["data"] = bytes(buf[start + ADD_FIELDS_SIZE : stop])
    elif op in (OP_OPEN, OP_CONFIRM, OP_ABORT, OP_RETURN):
        out["xid"] = _XID.unpack_from(buf, start)[1]
    elif op == OP_SNAPSHOT:
        _, out["next_id"], out["xid"] = _SNAPSHOT.unpack_from(buf, start)
    elif op == OP_RESUME:
        out["cursor"], out["taken"] = decode_resume(buf, pos)
    elif op == OP_DELIVERED:
        out["count"] = _XID.unpack_from(buf, start)[1]
    elif op == OP_ADD_KEYED:
        out["item_id"], out["add_time"], out["expiry"], out["data"], out["key"] = decode_add_keyed(
            buf, pos, stop
        )
    elif op == OP_DEDUP_KEY:
        out["key"], out["item_id"], out["put_time"] = _dedup_key(buf, start, stop)
    elif op in KEY_LENGTHS:
        fields, out["key"] = _key_fields(buf, start, stop, op)
        if op == OP_KEY_END:
            out["how"] = KEY_HOW.get(fields[1], str(fields[1]))
        elif op == OP_KEY_RENEW:
            out["expires_at"] = fields[1]
        else:
            names = ("lease_file", "count", "size", "max_items", "created_at", "expires_at")
            out.update(zip(names, fields[1:], strict=True))
    return out


def iter_records(buf: Bytes, pos: int) -> Iterator[tuple[int, int]]:
    """Yield ``(offset, end)`` of each valid record from ``pos``; raise BadRecord at the
    first bad one."""
    end = len(buf)
    while pos < end:
        stop = check_record(buf, pos)
        yield pos, stop
        pos = stop


def looks_like_record(buf: Bytes, pos: int) -> bool:
    """True when a valid record starts at ``pos`` (used to tell a torn tail from damage)."""
    try:
        check_record(buf, pos)
    except BadRecord:
        return False
    return True
