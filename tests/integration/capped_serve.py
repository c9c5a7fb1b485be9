"""``tercel serve`` with a lower cap on the payload bytes of one binary lease reply.

Run as ``python tests/integration/capped_serve.py <bytes> serve ARGS...`` (a ``ServerProcess``
launcher): it sets :data:`tercel.protocol.memcache.LEASED_BINARY_MAX` (2^31 - 1 normally, the
limit of the reply's int32 offsets) to ``<bytes>``, then runs ``tercel`` with ``ARGS`` as the
command line would. The server is otherwise the real one, compiled or not: the handler reads
the cap at run time. So the cut of docs/protocol.md section 11 is tested with a few KB of
items instead of 2 GiB.
"""

from __future__ import annotations

import runpy
import sys

from tercel.protocol import memcache

if __name__ == "__main__":
    memcache.LEASED_BINARY_MAX = int(sys.argv[1])
    sys.argv = ["tercel", *sys.argv[2:]]
    runpy.run_module("tercel", run_name="__main__", alter_sys=True)
