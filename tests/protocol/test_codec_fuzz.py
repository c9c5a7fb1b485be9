"""Every codec under the fuzz harness of ``tests/codec_fuzz.py``: any bytes, any split, only
the codec's clean error. A new codec adds a ``fuzz_tests(Codec(...))`` line (see there)."""

from __future__ import annotations

from collections.abc import Callable

from codec_fuzz import Codec, fuzz_tests
from tercel.errors import BadReply, ProtocolError
from tercel.protocol import memcache as mc
from tercel.protocol import memcache_client as mcc
from tercel.protocol.commands import (
    Ack,
    Command,
    DumpStats,
    Get,
    Lease,
    Monitor,
    Set,
    Simple,
)

SERVER_SEEDS = (
    b"get q\r\n",
    b"get q/t=100/open\r\n",
    b"gets q/close/open\r\n",
    b"get q/abort\r\n",
    b"get q/peek\r\n",
    b"set q 0 0 3\r\nabc\r\n",
    b"set q 0 9223372036854776 2 noreply\r\nhi\r\n",
    b"delete q\r\n",
    b"flush q\r\n",
    b"flush_all\r\n",
    b"flush_expired q\r\n",
    b"dump_stats a b\r\n",
    b"stats\r\n",
    b"version\r\n",
    b"status READONLY\r\n",
    b"lease q 10 0 30000\r\n",
    b"lease q 10 0 30000 binary\r\n",
    b"ack q a1b2 c3d4\r\n",
    b"release q a1b2\r\n",
    b"renew q 5000 a1b2\r\n",
    b"monitor q 1 10\r\n",
    b"confirm q 2\r\n",
)
SERVER_TOKENS = (
    b"get ",
    b"gets ",
    b"set ",
    b"add ",
    b"cas ",
    b"lease ",
    b"ack ",
    b"renew ",
    b"monitor ",
    b"confirm ",
    b"status ",
    b"q",
    b"q+fan",
    b"/open",
    b"/close",
    b"/t=",
    b"/peek",
    b"~.",
    b"../",
)

TestMemcacheServerFuzz = fuzz_tests(
    Codec(
        name="memcache server",
        new=lambda: mc.MemcacheServerCodec(max_line=64, max_value=256),
        feed=lambda codec, data: codec.receive_data(data),
        step=lambda codec: codec.next_command(),
        need_data=mc.NEED_DATA,
        clean=(ProtocolError,),
        closes=lambda exc: exc.close,
        seeds=SERVER_SEEDS,
        tokens=SERVER_TOKENS,
    )
)


def _client(cmd: Command) -> Callable[[], mcc.MemcacheClientCodec]:
    """A client codec waiting for the replies of 64 ``cmd`` requests."""

    def new() -> mcc.MemcacheClientCodec:
        codec = mcc.MemcacheClientCodec()
        for _ in range(64):
            codec.send(cmd)
        return codec

    return new


ERRORS = (b"ERROR\r\n", b"CLIENT_ERROR bad\r\n", b"SERVER_ERROR too many queues\r\n")
CLIENT_TOKENS = (
    b"VALUE ",
    b"END",
    b"STAT ",
    b"LEASED ",
    b"LEASEDB ",
    b"queue '",
    b"' {",
    b"  k=",
    b"}",
    b"ERROR",
    b"CLIENT_ERROR ",
)
REPLIES: dict[str, tuple[Command, tuple[bytes, ...]]] = {
    "get": (
        Get(b"q", "q"),
        (b"VALUE q 0 3\r\nabc\r\nEND\r\n", b"VALUE q 0 0 42\r\n\r\nEND\r\n", b"END\r\n"),
    ),
    "set": (Set("q", 0, 0, b"x"), (b"STORED\r\n", b"NOT_STORED\r\n")),
    "stats": (Simple("stats"), (b"STAT uptime 5\r\nSTAT items 0\r\nEND\r\n", b"END\r\n")),
    "dump_stats": (
        DumpStats(()),
        (b"queue 'a' {\r\n  items=1\r\n  bytes=5\r\n}\r\nEND\r\n", b"END\r\n"),
    ),
    "lease": (
        Lease("q", 2, 0, 1000),
        (b"LEASED ab12 7 1 1700000000000 0 3\r\nabc\r\nEND\r\n", b"END\r\n"),
    ),
    "lease_columns": (
        Lease("q", 2, 0, 1000, columns=True),
        (
            b"LEASED ab12 7 1 1700000000000 0 3\r\nabc\r\nEND\r\n",
            b"".join(
                mc.leased_binary(
                    b"ab",
                    [1, 2],
                    item_ids=[7, 8],
                    deliveries=[1, 2],
                    add_ms=[5, 6],
                    expiry_ms=[0, 9],
                    payloads=[b"x", b""],
                )
            ),
            b"END\r\n",
        ),
    ),
    "ack": (Ack("q", ("ab12",)), (b"ACKED 1\r\n",)),
    "monitor": (
        Monitor("q", 1, 5),
        (b"VALUE q 0 2\r\nhi\r\nEND\r\nVALUE q 0 1\r\nx\r\nEND\r\nEND\r\n", b"END\r\n"),
    ),
}

for _kind, (_cmd, _seeds) in REPLIES.items():
    globals()[f"TestMemcacheClient_{_kind}_Fuzz"] = fuzz_tests(
        Codec(
            name=f"memcache client, {_kind} replies",
            new=_client(_cmd),
            feed=lambda codec, data: codec.receive_data(data),
            step=lambda codec: codec.next_reply(),
            need_data=mc.NEED_DATA,
            clean=(BadReply,),
            closes=lambda exc: True,
            seeds=_seeds + ERRORS,
            tokens=CLIENT_TOKENS,
        )
    )
