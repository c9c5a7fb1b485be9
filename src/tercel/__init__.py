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

__all__ = [
    "ConfigError",
    "JournalCorrupt",
    "JournalError",
    "JournalWriteError",
    "ProtocolError",
    "TercelError",
    "__version__",
]
