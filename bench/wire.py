"""Wire formats for the three protocols the load generator speaks.

Contract: every request builder returns ready-to-send ``bytes``; every reply parser has the
signature ``parse(buf, pos, extra) -> (new_pos, code)`` where ``buf`` is the connection's receive
``bytearray`` and ``pos`` the offset of the first unparsed byte. When the buffer holds no complete
reply the parser returns ``(pos, INCOMPLETE)`` and consumes nothing. For replies that carry an item
the parser stores ``extra[0] = job id`` (beanstalkd only, else 0), ``extra[1] = payload offset``
and ``extra[2] = payload length`` so callers can read the payload without copying it first.

Protocols:
- ``mc``: memcache text protocol (memcached, and Kestrel-style queue servers such as tercel).
- ``bs``: beanstalkd (``use``/``put``, ``watch``/``reserve-with-timeout``/``delete``).
- ``redis``: RESP2 (``RPUSH``/``LPOP``/``BLPOP``).
"""

from __future__ import annotations

from collections.abc import Callable

OK = 0
"""A request that did what it was asked (stored, or returned an item)."""
MISS = 1
"""A well-formed "nothing there" reply (``END``, ``TIMED_OUT``, ``$-1``, ``*-1``)."""
ERR = 2
"""Any error reply or a reply the parser did not expect."""
AUX = 3
"""A bookkeeping reply that is not counted as an op (``DELETED``, ``USING``, ``WATCHING``)."""
INCOMPLETE = -1
"""The buffer does not yet hold a whole reply."""

Parser = Callable[[bytearray, int, list[int]], tuple[int, int]]

PROTOCOLS = ("mc", "bs", "redis")


# --------------------------------------------------------------------------- request builders


def enqueue_request(proto: str, queue: bytes, payload: bytes) -> bytes:
    """One enqueue of ``payload`` onto ``queue`` (memcache set, beanstalk put, RPUSH)."""
    n = len(payload)
    if proto == "mc":
        return b"set %s 0 0 %d\r\n%s\r\n" % (queue, n, payload)
    if proto == "bs":
        return b"put 0 0 120 %d\r\n%s\r\n" % (n, payload)
    if proto == "redis":
        return b"*3\r\n$5\r\nRPUSH\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(queue), queue, n, payload)
    raise ValueError(f"unknown protocol {proto!r}")


def dequeue_request(proto: str, queue: bytes, timeout_ms: int = 0) -> bytes:
    """One dequeue attempt; ``timeout_ms`` > 0 asks the server to block that long.

    mc uses Kestrel's ``get q/t=N``; bs uses ``reserve-with-timeout`` (whole seconds, rounded
    up); redis uses LPOP, or BLPOP with a fractional-second timeout.
    """
    if proto == "mc":
        if timeout_ms > 0:
            return b"get %s/t=%d\r\n" % (queue, timeout_ms)
        return b"get %s\r\n" % queue
    if proto == "bs":
        secs = (timeout_ms + 999) // 1000
        return b"reserve-with-timeout %d\r\n" % secs
    if proto == "redis":
        if timeout_ms > 0:
            t = b"%.3f" % (timeout_ms / 1000)
            return b"*3\r\n$5\r\nBLPOP\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
                len(queue),
                queue,
                len(t),
                t,
            )
        return b"*2\r\n$4\r\nLPOP\r\n$%d\r\n%s\r\n" % (len(queue), queue)
    raise ValueError(f"unknown protocol {proto!r}")


def reliable_open_request(queue: bytes, first: bool) -> bytes:
    """Kestrel reliable read (memcache only): ``get q/open`` first, then ``get q/close/open``."""
    if first:
        return b"get %s/open\r\n" % queue
    return b"get %s/close/open\r\n" % queue


def bs_delete_request(job_id: int) -> bytes:
    """beanstalkd ``delete <id>`` (reply ``DELETED``, parsed as AUX)."""
    return b"delete %d\r\n" % job_id


def setup_requests(proto: str, queue: bytes) -> list[bytes]:
    """Per-connection setup commands, each answered by one AUX reply (bs: use + watch + ignore)."""
    if proto == "bs":
        return [b"use %s\r\n" % queue, b"watch %s\r\n" % queue, b"ignore default\r\n"]
    return []


# --------------------------------------------------------------------------- reply parsers


def parse_mc(buf: bytearray, pos: int, extra: list[int]) -> tuple[int, int]:
    """Parses one memcache reply: STORED / END / VALUE..END / error lines."""
    nl = buf.find(b"\r\n", pos)
    if nl < 0:
        return pos, INCOMPLETE
    c = buf[pos]
    if c == 86:  # 'V': VALUE <key> <flags> <bytes> (never a cas: no request here asks for one)
        n = int(buf[buf.rfind(b" ", pos, nl) + 1 : nl])
        start = nl + 2
        end = start + n + 7  # data \r\n END\r\n
        if len(buf) < end:
            return pos, INCOMPLETE
        if buf[end - 5] != 69 or buf[end - 1] != 10:  # not "END\r\n" after the data
            return end, ERR
        extra[0] = 0
        extra[1] = start
        extra[2] = n
        return end, OK
    if c == 83 and nl - pos == 6:  # STORED
        return nl + 2, OK
    if c == 69 and nl - pos == 3:  # END
        return nl + 2, MISS
    return nl + 2, ERR


def parse_bs(buf: bytearray, pos: int, extra: list[int]) -> tuple[int, int]:
    """Parses one beanstalkd reply: INSERTED / RESERVED+body / TIMED_OUT / DELETED / acks."""
    nl = buf.find(b"\r\n", pos)
    if nl < 0:
        return pos, INCOMPLETE
    c = buf[pos]
    if c == 82 and buf[pos + 2] == 83:  # RESERVED <id> <bytes>
        sp = buf.find(b" ", pos + 9, nl)
        n = int(buf[sp + 1 : nl])
        start = nl + 2
        end = start + n + 2
        if len(buf) < end:
            return pos, INCOMPLETE
        extra[0] = int(buf[pos + 9 : sp])
        extra[1] = start
        extra[2] = n
        return end, OK
    if c == 73:  # INSERTED <id>
        return nl + 2, OK
    if c == 84 and buf[pos + 1] == 73:  # TIMED_OUT
        return nl + 2, MISS
    if c == 68 and buf[pos + 1] == 69 and buf[pos + 2] == 76:  # DELETED
        return nl + 2, AUX
    if (c == 85 and buf[pos + 1] == 83) or c == 87:  # USING / WATCHING
        return nl + 2, AUX
    return nl + 2, ERR


def parse_redis(buf: bytearray, pos: int, extra: list[int]) -> tuple[int, int]:
    """Parses one RESP reply as the queue ops use them (integer, bulk, BLPOP pair, +OK)."""
    if pos >= len(buf):
        return pos, INCOMPLETE
    c = buf[pos]
    nl = buf.find(b"\r\n", pos)
    if nl < 0:
        return pos, INCOMPLETE
    if c == 36:  # '$' bulk (LPOP; $-1 is a miss)
        n = int(buf[pos + 1 : nl])
        if n < 0:
            return nl + 2, MISS
        start = nl + 2
        end = start + n + 2
        if len(buf) < end:
            return pos, INCOMPLETE
        extra[0] = 0
        extra[1] = start
        extra[2] = n
        return end, OK
    if c == 58:  # ':' integer (RPUSH)
        return nl + 2, OK
    if c == 42:  # '*' array (BLPOP): *2 key value, or *-1 on timeout
        if buf[pos + 1] == 45:
            return nl + 2, MISS
        p, code = parse_redis(buf, nl + 2, extra)  # the key, a bulk string
        if code == OK:
            p, code = parse_redis(buf, p, extra)  # the value
        if code == INCOMPLETE:
            return pos, INCOMPLETE
        return (p, OK) if code == OK else (p, ERR)
    if c == 43:  # '+'
        return nl + 2, AUX
    return nl + 2, ERR


PARSERS: dict[str, Parser] = {"mc": parse_mc, "bs": parse_bs, "redis": parse_redis}
