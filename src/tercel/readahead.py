"""Read-ahead of the modules ``tercel serve`` imports before it answers its first command.

After a reboot, or whenever the page cache no longer holds Python's files, a start is mostly
waiting for the disk: the interpreter imports about 150 modules one after another (asyncio,
uvloop, logging, the compiled hot path...), and each import waits for its own small read.
:func:`start` asks the kernel, from a thread started first thing, to read all their files
ahead (``posix_fadvise(WILLNEED)``), so the reads overlap each other and the imports' CPU work
(``git show 1f1f505:docs/benchmarks.md``, "Restart: reading ahead"). With the files cached it
costs a few ms of one thread's CPU; it never changes what is imported, and a module it cannot
find is simply imported as usual.

:data:`SERVE_MODULES` is the list of those modules, in the order a start imports them (as
:func:`record_launcher` records them); ``tests/test_readahead.py`` fails when a start imports
other modules, and prints the new list. Imports nothing a start does not import anyway, and
nothing on the thread (an import there would race the main thread's).
"""

from __future__ import annotations

import _thread
import os
import sys

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: typing is one of the modules read ahead
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from importlib.machinery import PathFinder

_SERVE = """
tercel tercel.errors __future__ tercel.cli tercel.readahead gc logging re enum re._compiler
_sre re._parser re._constants re._casefix copyreg traceback collections.abc linecache tokenize
token textwrap weakref _weakrefset string _string threading atexit signal socket _socket
selectors math select errno array tercel.exit_codes typing _typing tercel.listening
tercel.config tercel_native__mypyc dataclasses copy inspect ast _ast dis opcode _opcode tomllib
tomllib._parser tomllib._re datetime _datetime tomllib._types tercel.names asyncio
asyncio.base_events concurrent concurrent.futures concurrent.futures._base heapq _heapq
subprocess locale _locale fcntl _posixsubprocess ssl _ssl base64 struct _struct binascii
asyncio.constants asyncio.coroutines asyncio.events contextvars _contextvars
asyncio.format_helpers _asyncio asyncio.base_futures asyncio.exceptions asyncio.base_tasks
asyncio.futures asyncio.protocols asyncio.sslproto asyncio.transports asyncio.log
asyncio.staggered asyncio.locks asyncio.mixins asyncio.tasks asyncio.trsock asyncio.runners
asyncio.queues asyncio.streams asyncio.subprocess asyncio.taskgroups asyncio.timeouts
asyncio.threads asyncio.unix_events asyncio.base_subprocess asyncio.selector_events
tercel.server tercel.server.app tercel.storage tercel.clock librt librt.time tercel.core
tercel.core.log
tercel.steps tercel.core.queue tercel.core.queue_paging tercel.core.items tercel.core.queue_state
tercel.core.dedup tercel.core.queue_replay tercel.core.queue_upkeep tercel.core.keyed
tercel.core.keyed_state array mypy_extensions tercel.core.source tercel.journal
tercel.journal.journal tercel.journal.records mmap zlib_ng zlib_ng._version zlib_ng.zlib_ng
gzip zlib _compression tercel.journal.base tercel.journal.checkpoint tercel.journal.append
tercel.journal.files resource tercel.journal.checkpointing tercel.journal.reader
tercel.journal.readbehind tercel.journal.replay tercel.journal.rotation tercel.journal.snapshot
tercel.journal.tail tercel.journal.memory tercel.journal.leases
tercel.core.collection tercel.core.stats tercel.server.admin_rules tercel.server.commit
concurrent.futures.thread queue _queue tercel.server.aio tercel.server.metrics
tercel.server.context tercel.server.auth fnmatch tercel.logtext tercel.server.deadlines
tercel.core.reservations tercel.server.status
tercel.server.frontend tercel.server.connection tercel.server.tls tercel.server.loop uvloop
uvloop.includes
uvloop.loop uvloop._noop uvloop._version tercel.server.memcache tercel.server.memcache.connection
tercel.protocol tercel.protocol.memcache tercel.protocol.commands tercel.protocol.dedup
tercel.protocol.memcache_keyed tercel.server.stats
tercel.server.kestrel tercel.server.kestrel.ops tercel.server.kestrel.connection tercel.session
tercel.server.memcache.leases tercel.server.figures tercel.server.kestrel_figures
"""
SERVE_MODULES: tuple[str, ...] = tuple(_SERVE.split())
"""The modules ``tercel serve`` imports before its first reply, in import order (memcache and
admin ports, a config file, a data dir with one queue and a checkpoint)."""

CUT = "tercel.native"
"""The first module a start imports once the first commands are served (the build line,
after the background replay): :func:`record_launcher` records the imports before it."""


def start(modules: Iterable[str] = SERVE_MODULES) -> None:
    """Start reading ``modules``' files ahead on a thread (a hint; never raises)."""
    if not hasattr(os, "posix_fadvise"):  # (not on macOS)
        return
    from importlib.machinery import PathFinder  # (here: no import on the thread)

    try:
        _thread.start_new_thread(read_ahead, (tuple(modules), PathFinder))
    except RuntimeError:  # no thread to spare: the imports read as usual
        return


def read_ahead(modules: tuple[str, ...], finder: type[PathFinder]) -> None:
    """The thread's body (:func:`start`): ask the kernel to read each of :func:`files` ahead.
    Never raises: errors end it quietly (it is only a hint)."""
    try:
        for path in files(modules, finder):
            _advise(path)
    except BaseException:  # nothing may escape from a bare thread
        return


def files(modules: Iterable[str], finder: type[PathFinder] | None = None) -> Iterator[str]:
    """The file each of ``modules`` not imported yet would be loaded from, found as the import
    system finds it (the ``.pyc`` when it exists, else the source or the extension module),
    in order; a module that is not found, or whose package is neither imported nor found
    earlier in ``modules``, is left out. Lists directories as imports do, nothing else.
    ``finder``: ``importlib.machinery.PathFinder`` (imported here when not given)."""
    if finder is None:
        from importlib.machinery import PathFinder

        finder = PathFinder

    search: dict[str, list[str] | None] = {}
    """Each package's ``__path__`` as found so far (None: not found, or not a package)."""
    for name in modules:
        parent = name.rpartition(".")[0]
        path = None
        if parent:
            if parent not in search:
                pkg = sys.modules.get(parent)
                search[parent] = getattr(pkg, "__path__", None)
            path = search[parent]
            if path is None:
                continue
        mod = sys.modules.get(name)
        if mod is not None:  # imported already (or being imported): nothing to gain
            search[name] = getattr(mod, "__path__", None)
            continue
        spec = finder.find_spec(name, path)
        if spec is None:
            continue
        search[name] = spec.submodule_search_locations
        for file in (spec.cached, spec.origin):
            if file and os.path.isfile(file):
                yield file
                break


def _advise(path: str) -> None:
    """Ask the kernel to read all of ``path`` ahead (into the page cache, asynchronously)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except OSError:
        return
    finally:
        os.close(fd)


RECORDER = """\
import os, runpy, sys
class _Recorder:
    seen = []
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == {cut!r} and cls.seen is not None:
            with open({out!r}, "w") as fh:
                fh.write("\\n".join(n for n in cls.seen if n in sys.modules))
            cls.seen = None
        elif cls.seen is not None:
            cls.seen.append(name)
        return None
sys.meta_path.insert(0, _Recorder)
sys.argv[0] = "tercel"
runpy.run_module("tercel", run_name="__main__", alter_sys=True)
"""


def record_launcher(out: str) -> tuple[str, ...]:
    """A command line that runs ``python -m tercel`` (append ``serve ...``) and writes to
    ``out``, one a line and in import order, the modules it imported before :data:`CUT`."""
    return (sys.executable, "-c", RECORDER.format(cut=CUT, out=out))
