"""The walk that checks a Thrift call's arguments before thriftpy2 decodes them (sans-IO).

thriftpy2 0.7's Cython decoder trusts declared sizes (a 20-byte frame declaring a 2 GiB string
crashed the process with SIGSEGV; a list of 2**31 items allocated 2 GB before failing), and its
pure-Python decoder loops over a declared count even when each element reads nothing (a list
of 2**31 elements of an unknown type spins for minutes). :func:`check_args` walks the binary
protocol's arguments once and checks every length, count, type and the nesting depth against
the frame; after it, every size the decoder reads is bounded by the frame.

The walk costs no more than the decode: a field the IDL does not declare is refused unless it
is checked in constant time (a scalar, a string, a container of scalars), and the fields are
at most :data:`MAX_ARGUMENT_FIELDS`, so its one loop over a declared count is over the
elements of a declared argument (a put's items). (Walking a 64 MiB list of 67M empty structs
in an undeclared field took 22 s of pure Python against 0.03 s for the decode, and stalled the
loop.) Compiled with mypyc (``NATIVE_MODULES``): bytes are read by index on ``i64``
positions, so the item loop is plain C: a put of 1M empty items is checked in 0.036 s and
decoded in 0.057 s (64-byte items: 0.028 s against 0.53 s); pure Python takes 0.24 s.
"""

from __future__ import annotations

from typing import Any, Final

from mypy_extensions import i64

from tercel.errors import ProtocolError

MAX_DEPTH: Final = 64
"""How deeply structs and containers may nest (Apache Thrift's and thriftpy2's default)."""
MAX_ARGUMENT_FIELDS: Final = 32
"""The most fields a call's arguments may carry (the IDL declares at most 4 per method)."""

_FIXED: Final = {2: 1, 3: 1, 4: 8, 6: 2, 8: 4, 10: 8}
"""Wire types of a fixed size: bool, byte, double, i16, i32, i64."""
_STRING: Final = 11
_STRUCT: Final = 12
_MAP: Final = 13
_SET: Final = 14
_LIST: Final = 15
_SMALLEST: Final = _FIXED | {_STRING: 4, _STRUCT: 1, _MAP: 6, _SET: 5, _LIST: 5}
"""The fewest bytes a value of each wire type takes: bounds a container's declared count."""
_BINARY: Final = 18
"""thriftpy2's ``binary`` in a spec; ``string`` on the wire."""


def _past_end() -> ProtocolError:
    return ProtocolError("value past the end of the frame")


def _i8(buf: bytes, pos: i64) -> i64:
    """The signed byte at ``pos``."""
    if pos >= len(buf):
        raise _past_end()
    value: i64 = buf[pos]
    return value - 256 if value >= 128 else value


def _i16(buf: bytes, pos: i64) -> i64:
    if pos + 2 > len(buf):
        raise _past_end()
    value: i64 = (buf[pos] << 8) | buf[pos + 1]
    return value - 65536 if value >= 32768 else value


def _i32(buf: bytes, pos: i64) -> i64:
    if pos + 4 > len(buf):
        raise _past_end()
    value: i64 = (buf[pos] << 24) | (buf[pos + 1] << 16) | (buf[pos + 2] << 8) | buf[pos + 3]
    return value - 4294967296 if value >= 2147483648 else value


def check_args(buf: bytes, pos: int, spec: dict[int, tuple[Any, ...]]) -> None:
    """Check the arguments struct at ``pos`` of ``buf`` against the frame and ``spec`` (the
    thriftpy2 ``thrift_spec`` of the method's ``_args``). Raises ProtocolError.

    Each argument the spec declares must come with its declared wire type, and a list's or
    set's elements with theirs (thriftpy2 skips a field of another type, which would then read
    as absent: a put whose items it could not read acknowledged as ``0`` stored); its value is
    then walked. A field the spec does not declare (thriftpy2 skips it) may only be a scalar,
    a string, or a container of scalars. At most :data:`MAX_ARGUMENT_FIELDS` fields."""
    at: i64 = pos
    fields = 0
    while True:
        ftype = _i8(buf, at)
        if ftype == 0:
            return
        fields += 1
        if fields > MAX_ARGUMENT_FIELDS:
            raise ProtocolError(f"more than {MAX_ARGUMENT_FIELDS} fields")
        fid = _i16(buf, at + 1)
        want = spec.get(int(fid))
        if want is not None:
            declared = _STRING if want[0] == _BINARY else want[0]  # binary: a string on the wire
            if ftype != declared:
                raise ProtocolError(f"{want[1]} sent as type {ftype}, not {declared}")
            elem = want[2]
            if ftype in (_LIST, _SET) and isinstance(elem, int):
                etype = _i8(buf, at + 3)
                wire = _STRING if elem == _BINARY else elem
                if _i32(buf, at + 4) and etype != wire:
                    raise ProtocolError(f"{want[1]} holds type {etype}, not {wire}")
        elif not _skipped_cheaply(buf, at + 3, ftype):
            raise ProtocolError(
                f"undeclared field {fid} of type {ftype}: only scalars, strings and "
                "containers of scalars may be skipped"
            )
        at = _check_value(buf, at + 3, ftype, MAX_DEPTH)


def _skipped_cheaply(buf: bytes, pos: i64, ftype: i64) -> bool:
    """Whether a value of wire type ``ftype`` at ``pos`` is checked in constant time: a
    scalar, a string, or a list, set or map whose elements are scalars."""
    if ftype in _FIXED or ftype == _STRING:
        return True
    if ftype in (_LIST, _SET):
        return _i8(buf, pos) in _FIXED
    if ftype == _MAP:
        return _i8(buf, pos) in _FIXED and _i8(buf, pos + 1) in _FIXED
    return False


def _check_struct(buf: bytes, pos: i64, depth: i64) -> i64:
    """Walk one struct at ``pos``; the offset after its STOP byte."""
    if depth <= 0:
        raise ProtocolError("nested too deeply")
    while True:
        ftype = _i8(buf, pos)
        if ftype == 0:
            return pos + 1
        pos = _check_value(buf, pos + 3, ftype, depth - 1)


def _check_value(buf: bytes, pos: i64, ttype: i64, depth: i64) -> i64:
    """Walk one value of wire type ``ttype`` at ``pos``; the offset after it."""
    size = _FIXED.get(int(ttype))
    end: i64
    if size is not None:
        end = pos + size
    elif ttype == _STRING:
        n = _i32(buf, pos)
        if n < 0:
            raise ProtocolError("negative length")
        end = pos + 4 + n
    elif ttype == _STRUCT:
        return _check_struct(buf, pos, depth)
    elif ttype in (_LIST, _SET):
        return _check_elements(buf, pos + 5, _i32(buf, pos + 1), [_i8(buf, pos)], depth)
    elif ttype == _MAP:
        types = [_i8(buf, pos), _i8(buf, pos + 1)]
        return _check_elements(buf, pos + 6, _i32(buf, pos + 2), types, depth)
    else:
        raise ProtocolError(f"unknown type {ttype}")
    if end > len(buf):
        raise _past_end()
    return end


def _check_elements(buf: bytes, pos: i64, n: i64, types: list[i64], depth: i64) -> i64:
    """Walk ``n`` container elements (each one value per type in ``types``)."""
    if n == 0:
        return pos
    if depth <= 0:
        raise ProtocolError("nested too deeply")
    smallest: i64 = 0
    fixed = True
    for t in types:
        least = _SMALLEST.get(int(t))
        if least is None:
            raise ProtocolError("bad container header")
        smallest += least
        fixed = fixed and int(t) in _FIXED
    if n < 0:
        raise ProtocolError("bad container header")
    if n * smallest > len(buf) - pos:  # refused before any element is read
        raise ProtocolError("container larger than the frame")
    if fixed:  # every element has one size: no walk needed
        return pos + n * smallest
    if len(types) == 1 and types[0] == _STRING:  # a put's items: the loop a valid call needs
        return _check_strings(buf, pos, n)
    for _ in range(n):
        for t in types:
            pos = _check_value(buf, pos, t, depth - 1)
    return pos


def _check_strings(buf: bytes, pos: i64, n: i64) -> i64:
    """Walk ``n`` strings at ``pos``; the offset after the last."""
    size: i64 = len(buf)
    for _ in range(n):
        length = _i32(buf, pos)
        if length < 0:
            raise ProtocolError("negative length")
        pos += 4 + length
        if pos > size:
            raise _past_end()
    return pos
