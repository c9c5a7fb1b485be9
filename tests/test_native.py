"""tercel.native: which modules are compiled, and which compiled ones are stale."""

from __future__ import annotations

import importlib.machinery
import os
from pathlib import Path

from tercel import native


def _package(tmp_path: Path) -> Path:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for rel in ("__init__.py", "a.py", "b.py", "sub/__init__.py", "sub/c.py"):
        (pkg / rel).write_text("")
    return pkg


def test_lists_extensions_and_finds_the_stale_ones(tmp_path: Path) -> None:
    pkg = _package(tmp_path)
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for rel in ("a", "sub/c"):
        (pkg / (rel + suffix)).write_bytes(b"")
    assert native.compiled_modules(pkg) == ["pkg.a", "pkg.sub.c"]
    assert native.stale_modules(pkg) == []
    later = (pkg / ("a" + suffix)).stat().st_mtime + 10
    os.utime(pkg / "sub" / "c.py", (later, later))  # edited after the build
    assert native.stale_modules(pkg) == ["pkg.sub.c"]
    # A rebuild: the shared library is new, the shims kept their old times (copied from build/).
    library = tmp_path / ("tercel_native__mypyc" + suffix)
    library.write_bytes(b"")
    os.utime(library, (later + 1, later + 1))
    assert native.stale_modules(pkg) == []


def test_pure_python_has_nothing_compiled(tmp_path: Path) -> None:
    pkg = _package(tmp_path)
    assert native.compiled_modules(pkg) == []
    assert native.stale_modules(pkg) == []


def test_hot_classes_compile_as_native_classes() -> None:
    """A compiled class with an interpreted base is non-native: every ``self.x`` a dict lookup.

    Guards the per-command objects (docs/architecture.md, "Native modules"); a no-op in the
    pure-Python run.
    """
    from tercel.server.commit import Committer
    from tercel.server.connection import Connection
    from tercel.server.context import ServerContext
    from tercel.server.kestrel.connection import KestrelConnection
    from tercel.server.memcache.connection import MemcacheConnection
    from tercel.server.text.connection import TextConnection
    from tercel.server.thrift.connection import ThriftConnection
    from tercel.session import Session

    if "tercel.server.memcache.connection" not in native.compiled_modules():
        return
    hot = (Connection, KestrelConnection, MemcacheConnection, TextConnection, ThriftConnection)
    for cls in (*hot, ServerContext, Session, Committer):
        assert cls.__dictoffset__ == 0, f"{cls.__name__} is not a native class"


def test_queued_items_are_outside_the_cyclic_gc() -> None:
    """Every full collection visits every tracked object: queued items must not be among them
    (``QItem`` is ``acyclic`` when compiled; with a million 64-byte items in memory a full
    collection took ~150 ms). In pure Python every instance is tracked, so only the compiled run
    checks."""
    import gc

    from tercel.core.queue import QItem

    item = QItem(1, 2, 0, b"payload")
    if "tercel.core.queue" not in native.compiled_modules():
        return
    assert not gc.is_tracked(item)
    assert (item.id, item.add_time, item.expiry, item.data, item.deliveries) == (
        1,
        2,
        0,
        b"payload",
        0,
    )


def test_beanstalk_jobs_are_outside_the_cyclic_gc() -> None:
    """The same for the beanstalkd front end's jobs (``Job`` is ``acyclic`` when compiled):
    beanstalkd users keep millions of jobs in memory."""
    import gc

    from tercel.clock import ManualClock
    from tercel.core.tubes import Job, JobStore

    store = JobStore(ManualClock())
    worker = store.connect(lambda job, why: None)
    job = store.put(worker, 0, 0, 60, b"body")
    assert isinstance(job, Job)
    if "tercel.core.tubes.model" not in native.compiled_modules():
        return
    assert not gc.is_tracked(job)
    assert store.reserve(worker, 0) == (job, 0)
    assert store.delete(worker, job.id)
