"""Shared fixtures: real servers on 127.0.0.1:0 and a raw memcache line client."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from support import Raw, drain, open_connections, set_cmd, stats, track
from tercel import native
from tercel.testing import ServerProcess

if native.stale_modules():  # the suite must test the sources as they are now
    pytest.exit(
        f"compiled modules are older than their sources: {native.stale_modules()}; "
        "run `make native` (or `make test`), or delete the .so files under src/",
        returncode=4,
    )

__all__ = ["Raw", "drain", "set_cmd", "stats", "track"]
"""Re-exported for tests that still import them from here (new tests: ``from support``)."""

# Timing never decides a test: Hypothesis's per-example deadline and its "too slow" health
# check are both wall-clock limits, and failed runs on a loaded 2-core host (test_records'
# bit-flip property once). Tests that set their own ``settings`` keep their other values.
settings.register_profile("tercel", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("tercel")

_names = itertools.count()


@pytest.fixture(autouse=True)
def _close_connections() -> Iterator[None]:
    """Close every connection a test opened with :func:`track`, whatever happened in it."""
    yield
    while open_connections:
        open_connections.pop().close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One real server per test module (queues are named per test, so tests do not meet)."""
    with ServerProcess(tmp_path_factory.mktemp("data")) as srv:
        yield srv


@pytest.fixture
def qname(request: pytest.FixtureRequest) -> str:
    """A queue name unique to this test."""
    base = "".join(c if c.isalnum() else "_" for c in request.node.name)[:150]
    return f"{base}_{next(_names)}"


@pytest.fixture
def raw(server: ServerProcess) -> Iterator[Raw]:
    """A raw connection to the module's server."""
    conn = Raw(server.connect())
    yield conn
    conn.close()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"
