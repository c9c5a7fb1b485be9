"""Thrift's framed transport, sans-IO: a stream of bytes -> whole frames, and back.

A frame is a 4-byte big-endian signed length, then that many bytes (one Thrift message).
Contract of :class:`FrameDecoder`: feed bytes with :meth:`~FrameDecoder.receive_data`, then
call :meth:`~FrameDecoder.next_frame` until it returns :data:`NEED_DATA`. A declared length
that is negative, zero or above ``max_frame`` raises :class:`ProtocolError` (``close``): it is
refused as soon as its 4 bytes are here, before any of the frame is buffered, and the stream
has no boundary left to resynchronise on.
"""

from __future__ import annotations

from typing import Final

from tercel.errors import ProtocolError
from tercel.protocol.memcache import NEED_DATA, NeedData

_LENGTH: Final = 4


def frame(payload: bytes) -> bytes:
    """``payload`` with its length prefix."""
    return len(payload).to_bytes(_LENGTH, "big") + payload


class FrameDecoder:
    """Splits a byte stream into frames (see the module docstring for the contract)."""

    __slots__ = ("_chunks", "_have", "_max_frame", "_need")

    def __init__(self, max_frame: int) -> None:
        self._max_frame = max_frame
        self._chunks: list[bytes] = []  # received, not yet returned: joined once per frame
        self._have = 0  # bytes in _chunks
        self._need = 0  # the length of the frame being read; 0 while its prefix is not read

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned in a frame."""
        return self._have

    def receive_data(self, data: bytes) -> None:
        """Append bytes read from the connection."""
        if data:
            self._chunks.append(data)
            self._have += len(data)

    def next_frame(self) -> bytes | NeedData:
        """The next whole frame's payload, or NEED_DATA. Raises ProtocolError (module doc)."""
        if self._need == 0:
            if self._have < _LENGTH:
                return NEED_DATA
            self._read_length()
        if self._have < _LENGTH + self._need:
            return NEED_DATA
        data = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        end = _LENGTH + self._need
        payload = data[_LENGTH:end]
        rest = data[end:]
        self._chunks = [rest] if rest else []
        self._have = len(rest)
        self._need = 0
        return payload

    def _read_length(self) -> None:
        head = self._chunks[0]
        if len(head) < _LENGTH:
            head = b"".join(self._chunks)
            self._chunks = [head]
        length = int.from_bytes(head[:_LENGTH], "big", signed=True)
        if length <= 0 or length > self._max_frame:
            raise ProtocolError(f"frame length {length} outside 1..{self._max_frame}", close=True)
        self._need = length
