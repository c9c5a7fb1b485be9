"""The cluster client against three real servers, one of them SIGKILLed mid-run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tercel.client import Client
from tercel.testing import ServerProcess


@pytest.fixture
def three(tmp_path: Path) -> Iterator[list[ServerProcess]]:
    servers = [ServerProcess(tmp_path / f"s{i}") for i in range(3)]
    try:
        for s in servers:
            s.start()
        yield servers
    finally:
        for s in servers:
            if s.proc is not None:
                s.kill()


def drain(address: str, queue: str) -> list[int]:
    with Client(address) as c:
        out = []
        while batch := c.lease(queue, 500):
            out += [int(x.data) for x in batch]
            c.ack(batch)
        return out


def test_puts_and_leases_survive_a_killed_server(three: list[ServerProcess]) -> None:
    addresses = [s.address for s in three]
    acked: list[int] = []
    consumed: list[int] = []
    with Client(addresses, retry_after=60, timeout=5) as c:
        for i in range(3000):
            if i == 1000:
                three[1].kill()  # mid-run: its connections die, its port refuses
            c.put("q", b"%d" % i)  # never raises: a failed server is set aside, another used
            acked.append(i)
            if i % 250 == 0:
                while batch := c.lease("q", 100, lease_time=60):
                    consumed += [int(x.data) for x in batch]
                    assert c.ack(batch) == len(batch)
        assert c.cluster.is_aside(c.cluster.server(addresses[1]))
        while batch := c.lease("q", 100, lease_time=60):
            consumed += [int(x.data) for x in batch]
            c.ack(batch)
        per_server = {a: int(s["curr_items"]) for a, s in c.stats().items() if a != addresses[1]}
        assert set(per_server.values()) == {0}
    # The killed server kept what it had acknowledged; nothing is lost or duplicated.
    three[1].start()
    stranded = drain(three[1].address, "q")
    assert stranded, "the killed server held some items when it died"
    assert sorted(consumed + stranded) == acked


def test_blocking_get_rotates_across_servers(three: list[ServerProcess]) -> None:
    with Client(three[2].address) as one:
        one.put("r", b"only-on-the-third")
    with Client([s.address for s in three], rotate_interval=0.05) as c:
        assert c.get("r", timeout=30) == b"only-on-the-third"
        assert c.get("r") is None
        # Without a timeout, one pass over every server finds an item wherever it is.
        with Client(three[0].address) as one:
            one.put("r", b"first")
        assert c.get("r") == b"first"
        item = c.reserve("r")
        assert item is None


def test_async_client_survives_a_killed_server(three: list[ServerProcess]) -> None:
    import asyncio

    from tercel.client import AsyncClient

    addresses = [s.address for s in three]

    async def main() -> list[int]:
        consumed: list[int] = []
        async with AsyncClient(addresses, retry_after=60, timeout=5) as c:
            for i in range(600):
                if i == 200:
                    three[0].kill()
                await c.put("aq", b"%d" % i)  # a failed server is set aside, another used
            while batch := await c.lease("aq", 100, lease_time=60):
                consumed += [int(x.data) for x in batch]
                await c.ack(batch)
        return consumed

    consumed = asyncio.run(main())
    three[0].start()
    stranded = drain(three[0].address, "aq")
    assert sorted(consumed + stranded) == list(range(600))


def test_tail_follow_prints_and_acks_as_items_arrive(three: list[ServerProcess]) -> None:
    import os
    import select
    import subprocess
    import sys

    srv = three[0]
    cmd = [sys.executable, "-m", "tercel", "tail", "-f", "--server", srv.address, "tq"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    out = b""

    def read_until(n_lines: int) -> None:
        nonlocal out
        while out.count(b"\n") < n_lines:
            ready, _, _ = select.select([fd], [], [], 30)
            assert ready, f"tail -f printed only {out!r}"
            out += os.read(fd, 4096)

    try:
        with Client(srv.address) as c:
            c.put_many("tq", [b"one", b"two", b"three"])
            read_until(3)
            c.put("tq", b"four")  # arrives while tail is waiting
            read_until(4)
            # tail acks after printing a batch: wait for that ack to land before killing it.
            for _ in range(10_000):
                stats = c.stats()[srv.address]
                if stats.get("queue_tq_open_leases") == "0":
                    break
            else:
                raise AssertionError("tail never acked what it printed")
        assert out == b"one\ntwo\nthree\nfour\n"
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    # What tail printed was acked: a restart gives nothing back.
    srv.kill()
    srv.start()
    with Client(srv.address) as c:
        assert c.get("tq") is None
