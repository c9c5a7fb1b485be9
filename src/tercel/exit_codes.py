"""The exit codes of the ``tercel`` command and of ``tercel beanstalkd``: one meaning each, so
a script can tell them apart (README, "Exit codes"). Imports nothing: ``tercel beanstalkd``
reads it before it binds its port."""

from __future__ import annotations

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~9 ms at start-up
if TYPE_CHECKING:
    from typing import Final

OK: Final = 0
"""Done."""
FAILED: Final = 1
"""A client or server error (printed on stderr): no server reachable, an error reply, a
listener that cannot bind; ``journal check`` found damage."""
USAGE: Final = 2
"""Bad arguments (argparse; a bad queue name included) or a bad configuration file."""
CORRUPT: Final = 3
"""``serve`` or ``beanstalkd`` refused to start: a journal (the job log) is damaged anywhere
but its torn tail."""
EMPTY: Final = 4
"""Found nothing: ``get`` or ``peek`` found no item at all (the queue is empty, missing, or the
wait ran out), or ``flush``/``delete`` named a queue that exists on no server."""
BEANSTALKD_USAGE: Final = 5
"""``tercel beanstalkd``: bad flags (beanstalkd 1.12's own code for them)."""
BEANSTALKD_LOCKED: Final = 10
"""``tercel beanstalkd``: another server holds the ``-b`` directory (beanstalkd's code)."""
INTERRUPTED: Final = 130
"""Stopped by Ctrl-C (SIGINT), as shells report it."""
