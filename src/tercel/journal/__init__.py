"""Journals: append-only files of checksummed records, one set of files per queue.

This package knows bytes and files, not queue policy: it encodes the records it is told to
write, replays them into a sink in order, and reports where a file is broken. It imports
nothing of tercel but :mod:`tercel.errors` and :mod:`tercel.names`.
"""

from tercel.journal.journal import FileJournal, ReplayReport, list_queue_names
from tercel.journal.memory import MemoryJournal, NullJournal
from tercel.journal.records import RecordSink

__all__ = [
    "FileJournal",
    "MemoryJournal",
    "NullJournal",
    "RecordSink",
    "ReplayReport",
    "list_queue_names",
]
