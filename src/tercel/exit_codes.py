"""The ``tercel`` command's exit codes: one meaning each, so a script can tell them apart
(README, "Exit codes")."""

from __future__ import annotations

from typing import Final

OK: Final = 0
"""Done."""
FAILED: Final = 1
"""A client or server error (printed on stderr): no server reachable, an error reply, a
listener that cannot bind; ``journal check`` found damage."""
USAGE: Final = 2
"""Bad arguments (argparse; a bad queue name included) or a bad configuration file."""
CORRUPT: Final = 3
"""``serve`` refused to start: a journal is damaged anywhere but its torn tail."""
EMPTY: Final = 4
"""Found nothing: ``get`` or ``peek`` found no item at all (the queue is empty, missing, or the
wait ran out), or ``flush``/``delete`` named a queue that exists on no server."""
INTERRUPTED: Final = 130
"""Stopped by Ctrl-C (SIGINT), as shells report it."""
