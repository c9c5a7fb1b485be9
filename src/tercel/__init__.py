"""tercel: a durable, Kestrel-compatible message-queue server.

The public surface is small: the version, the exception tree and the configuration types.
The server itself is started through the ``tercel`` command (see :mod:`tercel.cli`).
"""

from tercel.errors import (
    ConfigError,
    JournalCorrupt,
    JournalError,
    JournalWriteError,
    ProtocolError,
    TercelError,
)

__version__ = "0.1.0"
TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~9 ms at start-up

if TYPE_CHECKING:
    from tercel.embedded import PersistentQueue


def __getattr__(name: str) -> object:
    # Imported on first use: ``import tercel.client`` must not load the core and the journal.
    if name == "PersistentQueue":
        from tercel.embedded import PersistentQueue

        return PersistentQueue
    raise AttributeError(f"module 'tercel' has no attribute {name!r}")


__all__ = [
    "ConfigError",
    "JournalCorrupt",
    "JournalError",
    "JournalWriteError",
    "PersistentQueue",
    "ProtocolError",
    "TercelError",
    "__version__",
]
