"""Unmodified memcache clients against a real server: pymemcache and python-memcached."""

from __future__ import annotations

import memcache
from pymemcache.client.base import Client as PymemcacheClient

from tercel.testing import ServerProcess


def test_pymemcache_set_get_peek_open_close(server: ServerProcess, qname: str) -> None:
    client = PymemcacheClient(("127.0.0.1", server.port), timeout=5)
    try:
        for i in range(3):
            assert client.set(qname, b"item%d" % i) is True
        assert client.get(f"{qname}/peek") == b"item0"
        assert client.get(qname) == b"item0"
        assert client.get(f"{qname}/open") == b"item1"
        assert client.get(f"{qname}/close") is None
        assert client.get(f"{qname}/open") == b"item2"
        assert client.get(f"{qname}/abort") is None
        assert client.get(f"{qname}/close/open") == b"item2"
        assert client.get(f"{qname}/close") is None
        assert client.get(qname) is None
        assert client.get(f"{qname}/t=20") is None
        result = client.gets(qname)
        assert result == (None, None)
        assert client.set(qname, b"z", noreply=True) is True
        value, cas = client.gets(qname)
        assert value == b"z" and cas == b"4"
        assert client.delete(qname, noreply=False) is True
        assert client.version().startswith(b"0.")
        stats = client.stats()
        assert stats[b"cmd_set"] >= 4
    finally:
        client.close()


def test_pymemcache_pipelined_noreply_sets(server: ServerProcess, qname: str) -> None:
    client = PymemcacheClient(("127.0.0.1", server.port), timeout=5)
    try:
        failed = client.set_many({qname: b"x"}, noreply=True)
        assert failed == []
        assert client.get(qname) == b"x"
    finally:
        client.close()


def test_python_memcached(server: ServerProcess, qname: str) -> None:
    client = memcache.Client([server.address])
    try:
        for i in range(3):
            assert client.set(qname, f"v{i}")
        assert client.get(f"{qname}/peek") == b"v0"
        assert client.get(qname) == b"v0"
        assert client.get(f"{qname}/open") == b"v1"
        assert client.get(f"{qname}/close") is None
        assert client.get(f"{qname}/t=10/open") == b"v2"
        assert client.get(f"{qname}/close") is None
        assert client.get(qname) is None
        stats = client.get_stats()
        assert stats and b"curr_items" in {
            k.encode() if isinstance(k, str) else k for k in stats[0][1]
        }
    finally:
        client.disconnect_all()
