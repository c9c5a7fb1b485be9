"""What the Thrift codec costs per item, in-process: tercel's decode (bounds walk + thriftpy2's
Cython decoder) against thriftpy2's decoders alone, and the reply encoder.

    .venv/bin/python bench/thrift_codec_bench.py

Each figure is the best of five timings (``time.process_time``) of a call on 100 items, divided
by 100. The library's decoders run on well-formed frames only (they are not safe on others:
docs/benchmarks.md, "Front ends").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from thriftpy2.protocol import TCyBinaryProtocol
from thriftpy2.protocol.binary import TBinaryProtocol
from thriftpy2.thrift import TMessageType
from thriftpy2.transport import TCyMemoryBuffer
from thriftpy2.transport.memory import TMemoryBuffer

from tercel.protocol import thrift as t

K: Any = t.kestrel_thrift.Kestrel
_CY: Any = TCyBinaryProtocol  # untyped in thriftpy2
_PY: Any = TBinaryProtocol
_CY_BUF: Any = TCyMemoryBuffer
_PY_BUF: Any = TMemoryBuffer


def per_item(fn: Callable[[], object], calls: int = 2000) -> float:
    """Best of five: microseconds per item of ``fn`` (which handles 100 items)."""
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.process_time() - t0) / calls / 100 * 1e6)
    return best


def put_frame(size: int) -> bytes:
    buf = _PY_BUF()
    proto = _PY(buf)
    proto.write_message_begin("put", TMessageType.CALL, 1)
    K.put_args(queue_name="q", items=[b"x" * size] * 100).write(proto)
    return bytes(buf.getvalue())


def rows(size: int) -> list[tuple[str, float]]:
    payload = put_frame(size)
    args = payload[15:]  # after the strict header of "put": version, name length, name, seqid
    call = t.Get(1, "q", 100, 0, 0)
    items = [(b"x" * size, i) for i in range(100)]
    # The encoder first: measured after the pure-Python decoder has run, the 1 KiB reply cost
    # 2.4 us/item instead of 0.5 (the allocator's state after that decoder's garbage; the
    # server's own figures in docs/benchmarks.md agree with 0.5).
    return [
        ("tercel reply_items (get reply)", per_item(lambda: t.reply_items(call, items))),
        ("tercel decode_call (walk + Cython)", per_item(lambda: t.decode_call(payload))),
        (
            "thriftpy2 Cython decoder alone",
            per_item(lambda: _CY(_CY_BUF(args)).read_struct(K.put_args())),
        ),
        (
            "thriftpy2 pure-Python decoder alone",
            per_item(lambda: _PY(_PY_BUF(args)).read_struct(K.put_args()), 300),
        ),
    ]


def main() -> None:
    for size in (64, 1024):
        for name, us in rows(size):
            print(f"{size:>5} B  {name:<38} {us:6.3f} us/item")


if __name__ == "__main__":
    main()
